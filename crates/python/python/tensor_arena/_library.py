"""Finding ONNX Runtime's shared library without importing onnxruntime.

The ``onnxruntime`` wheel's Python module links ONNX Runtime statically and
exports no C API, but the same wheel ships ``onnxruntime/capi/
libonnxruntime.so.<version>`` with the full C API. It is found here from the
installed package's location (``importlib.util.find_spec``, which does not
run the package), or from its installed-files record
(``importlib.metadata``). ``TENSOR_ARENA_ORT_LIB`` (or a path given to
``tensor_arena.onnxruntime.load``) overrides both.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from pathlib import Path
from typing import List, Optional

#: The environment variable naming the library to use.
ENV = "TENSOR_ARENA_ORT_LIB"

#: The oldest ONNX Runtime release supported (pyproject.toml's
#: ``onnxruntime`` extra says the same: ``onnxruntime>=1.31``).
MIN_ORT = "1.31"

_NAMES = ("libonnxruntime.so.*", "libonnxruntime.so", "libonnxruntime.*.dylib", "libonnxruntime.dylib")


def _in_dir(capi: Path) -> Optional[str]:
    for pattern in _NAMES:
        found = sorted(p for p in capi.glob(pattern) if p.is_file())
        if found:
            # The versioned file itself (not a providers library).
            return str(found[-1])
    return None


def candidates() -> List[str]:
    """Where the installed onnxruntime package's library is, best first."""
    out: List[str] = []
    try:
        spec = importlib.util.find_spec("onnxruntime")
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        for loc in spec.submodule_search_locations or []:
            hit = _in_dir(Path(loc) / "capi")
            if hit:
                out.append(hit)
    if not out:
        try:
            files = importlib.metadata.files("onnxruntime") or []
        except importlib.metadata.PackageNotFoundError:
            files = []
        for f in files:
            name = f.name
            if f.parent.name == "capi" and name.startswith("libonnxruntime.") and "providers" not in name:
                out.append(str(f.locate()))
    return out


def find(path: Optional[str] = None) -> str:
    """The library to load: ``path``, else ``$TENSOR_ARENA_ORT_LIB``, else
    the installed onnxruntime package's. Raises ImportError when there is
    none."""
    if path:
        return os.fspath(path)
    env = os.environ.get(ENV)
    if env:
        return env
    found = candidates()
    if found:
        return found[0]
    raise ImportError(
        "tensor_arena.onnxruntime needs ONNX Runtime's shared library, which the "
        f"onnxruntime package ships: pip install 'onnxruntime>={MIN_ORT}' "
        "(the tests cover 1.31; keep a pinned one), "
        f"or set {ENV} to a libonnxruntime.so of version {MIN_ORT} or later. "
        "tensor-arena itself is not on PyPI: install the wheel tools/dist.sh builds "
        "(pip install dist/tensor_arena-*.whl) or from source "
        "(pip install ./crates/python; needs Rust): crates/python/README.md"
    )
