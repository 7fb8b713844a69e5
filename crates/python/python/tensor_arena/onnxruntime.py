"""A drop-in ``onnxruntime.InferenceSession`` whose CPU memory is tensor-arena's.

::

    from tensor_arena.onnxruntime import InferenceSession
    sess = InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
    outputs = sess.run(None, {"x": x})

Every intermediate tensor and output of a run is a block of an arena of the
process's bounded worker pool (crates/ort's ``WorkerPool``): memory follows
the input (it is given back when inputs get smaller, and after 2 s idle),
runs are planned by their input shapes, and one ``Budget`` can cap every
arena of the process. ``run`` releases the GIL; any number of threads may
run one session, and at most ``configure(workers=N)`` arenas exist.

ONNX Runtime itself is the ``libonnxruntime.so`` of the installed
``onnxruntime`` package (found without importing it; ``$TENSOR_ARENA_ORT_LIB``
or ``load(path)`` overrides), so outputs are bitwise those of
``onnxruntime.InferenceSession`` with the same options.

``patch()`` makes ``onnxruntime.InferenceSession`` this class, for
libraries that create their sessions themselves (rapidocr, magika).
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from typing import Any, Dict, List, Optional, Sequence

from . import _library

# Importing this module needs a library to load: the onnxruntime package's
# (the `onnxruntime` extra) or one named by $TENSOR_ARENA_ORT_LIB.
_LIBRARY = _library.find()

from . import _native  # noqa: E402

Error = _native.Error
InvalidArgument = _native.InvalidArgument
NoSuchFile = _native.NoSuchFile
InvalidProtobuf = _native.InvalidProtobuf
Fail = _native.Fail
OutOfMemory = _native.OutOfMemory
LibraryError = _native.LibraryError
Budget = _native.Budget
configure = _native.configure
config = _native.config
save_plans = _native.save_plans
stats = _native.stats
reset_peak_stats = _native.reset_peak_stats
shrink = _native.shrink
memory_limit = _native.memory_limit
set_memory_limit = _native.set_memory_limit

__all__ = [
    "InferenceSession", "SessionOptions", "NodeArg", "ModelMetadata", "patch", "load",
    "library", "configure", "config", "save_plans", "stats", "reset_peak_stats", "shrink",
    "Budget",
    "Error", "InvalidArgument", "NoSuchFile", "InvalidProtobuf", "Fail", "OutOfMemory",
    "LibraryError", "get_available_providers", "memory_limit", "set_memory_limit",
    "out_of_memory",
]

_CPU = "CPUExecutionProvider"
_load_lock = threading.Lock()


def load(path: Optional[str] = None) -> str:
    """Loads ONNX Runtime's library (once per process): ``path``, else
    ``$TENSOR_ARENA_ORT_LIB``, else the onnxruntime package's. Returns its
    version. Raises ``LibraryError`` (an ImportError) for a missing file,
    a file that is not ONNX Runtime, a version older than 1.31, or a second
    library in one process."""
    with _load_lock:
        return _native.load(_library.find(path))


def library() -> Optional[tuple]:
    """(path, version) of the library loaded, or None before the first
    session."""
    got = _native.loaded()
    if got is None:
        return None
    path, version = got
    if version == "unknown" and ".so." in os.path.basename(path):
        # The PyPI build's info string names no release branch; its file
        # name carries the version (libonnxruntime.so.1.31.1).
        version = os.path.basename(path).split(".so.", 1)[1]
    return path, version


def out_of_memory(exc: BaseException) -> Optional[BaseException]:
    """The ``OutOfMemory`` behind ``exc``: ``exc`` itself, or the first one
    in its ``__cause__`` / ``__context__`` chain, else None. A library that
    wraps every error of a run (rapidocr raises its own ``ONNXRuntimeError``
    ``from`` ours) keeps ours there; a server maps it to a 503
    (docs/python-deploy.md)."""
    seen = set()
    e: Optional[BaseException] = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, OutOfMemory):
            return e
        seen.add(id(e))
        e = e.__cause__ if e.__cause__ is not None else e.__context__
    return None


def get_available_providers() -> List[str]:
    """The execution providers sessions here use: the CPU's."""
    return [_CPU]


class SessionOptions:
    """The options read off an ``onnxruntime.SessionOptions`` (either class
    may be passed to ``InferenceSession``), with onnxruntime's defaults."""

    def __init__(self) -> None:
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.graph_optimization_level = 99
        self.execution_mode = 0
        self.log_severity_level = 2
        self.enable_cpu_mem_arena = True
        self.enable_mem_pattern = True


def _read_options(so: Any) -> Dict[str, int]:
    """The options the session uses, read off ``so`` by name (an
    ``onnxruntime.SessionOptions`` or ours). Enum values are turned into
    their integers (``GraphOptimizationLevel.ORT_ENABLE_ALL`` is 99)."""
    if so is None:
        return {}

    def num(name: str, default: int) -> int:
        v = getattr(so, name, default)
        if v is None:
            return default
        v = getattr(v, "value", v)
        try:
            return int(v)
        except (TypeError, ValueError):
            raise InvalidArgument(f"sess_options.{name} = {v!r} is not a number") from None

    out = {
        "intra_op_num_threads": num("intra_op_num_threads", 0),
        "inter_op_num_threads": num("inter_op_num_threads", 0),
        "graph_optimization_level": num("graph_optimization_level", 99),
        "execution_mode": num("execution_mode", 0),
    }
    # onnxruntime's default severity is 2 (warning), the environment's.
    sev = num("log_severity_level", 2)
    if sev != 2:
        out["log_severity_level"] = sev
    return out


def _check_providers(providers: Any) -> List[str]:
    """CPU is the only provider here. Others are dropped with a warning (as
    onnxruntime drops a provider its build lacks), so applications that ask
    for CUDA-then-CPU run on the CPU."""
    if providers is None:
        return [_CPU]
    names = []
    for p in providers:
        name = p[0] if isinstance(p, (tuple, list)) else p
        if not isinstance(name, str):
            raise InvalidArgument(f"providers: {p!r} is not a provider name")
        names.append(name)
    others = [n for n in names if n != _CPU]
    if others:
        warnings.warn(
            f"tensor_arena.onnxruntime runs on the CPU only; ignoring {', '.join(others)}",
            RuntimeWarning,
            stacklevel=3,
        )
    return [_CPU]


class NodeArg:
    """A model input or output, as onnxruntime's ``NodeArg``: ``name``,
    ``shape`` (ints; symbolic dimensions as their names; None for a free
    dimension with no name) and ``type`` (``'tensor(float)'``)."""

    __slots__ = ("name", "shape", "type")

    def __init__(self, name: str, shape: list, type: str) -> None:
        self.name = name
        self.shape = shape
        self.type = type

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


class ModelMetadata:
    """The model's metadata, as onnxruntime's ``ModelMetadata``."""

    def __init__(self, d: Dict[str, Any]) -> None:
        self.producer_name = d["producer_name"]
        self.graph_name = d["graph_name"]
        self.domain = d["domain"]
        self.description = d["description"]
        self.graph_description = d["graph_description"]
        self.version = d["version"]
        self.custom_metadata_map = d["custom_metadata_map"]


class InferenceSession:
    """``onnxruntime.InferenceSession`` over tensor-arena memory.

    ``path_or_bytes``: the model file or its bytes. ``sess_options``: an
    ``onnxruntime.SessionOptions`` (or ours); intra/inter-op threads, graph
    optimization level, execution mode and log severity are read off it
    (ONNX Runtime's CPU arena and memory pattern settings are not: the
    arena is tensor-arena's). ``providers``: CPU; others are ignored with a
    warning. Errors are this module's exceptions (``NoSuchFile``,
    ``InvalidProtobuf``, ``InvalidArgument``, ``Fail``, ``OutOfMemory``).
    """

    def __init__(
        self,
        path_or_bytes: Any,
        sess_options: Any = None,
        providers: Optional[Sequence[Any]] = None,
        provider_options: Optional[Sequence[Dict[Any, Any]]] = None,
        **kwargs: Any,
    ) -> None:
        if _native.loaded() is None:
            load()
        self._providers = _check_providers(providers)
        opts = _read_options(sess_options)
        if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
            model: Any = bytes(path_or_bytes)
            self._model_path = None
            self._model_bytes = model
        elif isinstance(path_or_bytes, (str, os.PathLike)):
            model = os.fspath(path_or_bytes)
            self._model_path = model
            self._model_bytes = None
        else:
            raise TypeError(f"Unable to load from type '{type(path_or_bytes)}'")
        self._sess = _native.Session(model, **opts)
        self._sess_options = sess_options if sess_options is not None else SessionOptions()
        self._inputs = [NodeArg(*m) for m in self._sess.inputs()]
        self._outputs = [NodeArg(*m) for m in self._sess.outputs()]

    def run(self, output_names: Optional[Sequence[str]], input_feed: Dict[str, Any], run_options: Any = None) -> List[Any]:
        """Runs the model: ``output_names`` (None: all), ``input_feed`` a
        dict of input name to array. Returns a list of NumPy arrays.
        ``run_options`` is accepted and not used."""
        if not isinstance(input_feed, dict):
            input_feed = dict(input_feed)
        if output_names is not None:
            output_names = list(output_names)
            if not output_names:
                output_names = None
        return self._sess.run(output_names, input_feed)

    def get_inputs(self) -> List[NodeArg]:
        """The model's inputs."""
        return list(self._inputs)

    def get_outputs(self) -> List[NodeArg]:
        """The model's outputs."""
        return list(self._outputs)

    def get_overridable_initializers(self) -> List[NodeArg]:
        """None here: initializers cannot be overridden."""
        return []

    def get_modelmeta(self) -> ModelMetadata:
        """The model's metadata."""
        return ModelMetadata(self._sess.metadata())

    def get_providers(self) -> List[str]:
        """The providers the session uses: CPU."""
        return list(self._providers)

    def get_provider_options(self) -> Dict[str, Dict[str, str]]:
        """Provider options: none."""
        return {_CPU: {}}

    def get_session_options(self) -> Any:
        """The options the session was made with."""
        return self._sess_options

    def set_providers(self, providers: Optional[Sequence[Any]] = None, provider_options: Any = None) -> None:
        """Only CPU; other providers are ignored with a warning."""
        self._providers = _check_providers(providers)

    # tensor-arena's own.

    def last_run(self) -> Optional[Dict[str, Any]]:
        """What this session's last run did: ``plan`` ("exact", "predicted"
        or "dynamic", with ``dynamic_reason``; "not served" where ONNX
        Runtime allocated elsewhere), ``fell_back``, ``learned``,
        and its memory figures."""
        return self._sess.last_run()

    def plan_stats(self) -> Dict[str, Any]:
        """The model's plans (held, hits, misses, runs by how served)."""
        return self._sess.plan_stats()

    def shrink(self, everything: bool = False) -> int:
        """Idle workers of the process give cached memory back (the
        workers are shared by every session); returns the bytes."""
        return shrink(everything)


class _Patch:
    """What ``patch()`` returns: undone by ``undo()`` or on leaving a
    ``with`` block."""

    def __init__(self) -> None:
        import onnxruntime  # the user's application uses it: patching it is the point

        self._original = onnxruntime.InferenceSession
        self._replaced: List[tuple] = []
        if self._original is InferenceSession:
            return
        # onnxruntime's own attribute, and every module that did
        # `from onnxruntime import InferenceSession` before the patch.
        for mod in list(sys.modules.values()):
            try:
                if getattr(mod, "InferenceSession", None) is self._original:
                    setattr(mod, "InferenceSession", InferenceSession)
                    self._replaced.append((mod, self._original))
            except Exception:  # a lazy or odd module: leave it
                continue

    def undo(self) -> None:
        """Puts the original class back where it was replaced."""
        for mod, original in self._replaced:
            if getattr(mod, "InferenceSession", None) is InferenceSession:
                setattr(mod, "InferenceSession", original)
        self._replaced = []

    def __enter__(self) -> "_Patch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.undo()


def patch() -> _Patch:
    """Makes ``onnxruntime.InferenceSession`` (and the name in every module
    already imported that took it with ``from onnxruntime import
    InferenceSession``) resolve to this module's ``InferenceSession``.
    Works as a call (undo with ``.undo()``) or as a context manager::

        with tensor_arena.onnxruntime.patch():
            engine = RapidOCR()
    """
    return _Patch()
