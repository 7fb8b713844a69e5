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

``patch()`` makes ``onnxruntime.InferenceSession`` this class (its
``PatchedInferenceSession``, which leaves sessions asking for another
provider to onnxruntime), for libraries that create their sessions
themselves (rapidocr, magika). Sessions here are the CPU's: a list with
the CPU and accelerators this ONNX Runtime lacks makes a CPU session with
onnxruntime's warning; asking only for an accelerator, or for one the
library has, raises ``InvalidArgument``.

Forking (gunicorn --preload, multiprocessing with fork) is safe: the
child gets a pool and idle decay of its own (``os.register_at_fork``).
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

# Fork safety (gunicorn --preload, multiprocessing with fork): the hooks
# take the package's own locks around os.fork() and give the child a pool
# and an idle-decay thread of its own (crates/ort's `fork` module). They
# touch nothing but this package's state; nothing else in the process
# changes (no pthread_atfork, no signal, no thread).
if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_native._fork_prepare,
        after_in_parent=_native._fork_parent,
        after_in_child=_native._fork_child,
    )

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
reserve = _native.reserve
Reservation = _native.Reservation
system_heap = _native.system_heap

__all__ = [
    "InferenceSession", "SessionOptions", "NodeArg", "ModelMetadata", "patch", "load",
    "library", "configure", "config", "save_plans", "stats", "reset_peak_stats", "shrink",
    "Budget",
    "Error", "InvalidArgument", "NoSuchFile", "InvalidProtobuf", "Fail", "OutOfMemory",
    "LibraryError", "get_available_providers", "memory_limit", "set_memory_limit", "reserve", "Reservation", "system_heap",
    "out_of_memory", "PatchedInferenceSession", "ProviderNotice",
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
        self._config: Dict[str, str] = {}

    def add_session_config_entry(self, key: str, value: str) -> None:
        """Sets a session configuration entry, as onnxruntime's does. Of
        these, sessions here pass on the thread pools' spinning:
        ``session.intra_op.allow_spinning``,
        ``session.inter_op.allow_spinning`` and
        ``session.force_spinning_stop`` ("0" or "1"),
        ``session.intra_op.spin_duration_us`` and
        ``session.inter_op.spin_duration_us`` (microseconds),
        ``session.intra_op.spin_backoff_max`` and
        ``session.inter_op.spin_backoff_max`` (1 to 64); any other key, or
        another value, raises ``InvalidArgument`` when a session is made
        with them."""
        self._config[str(key)] = str(value)

    def get_session_config_entry(self, key: str) -> str:
        """The entry set for ``key``; ``RuntimeError`` if none was, as
        onnxruntime's."""
        try:
            return self._config[key]
        except KeyError:
            raise RuntimeError(f"SessionOptions does not have configuration with key: {key}") from None


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
    # Configuration entries: ours are all passed on (and checked there);
    # of onnxruntime's, which cannot be listed, the ones passed on.
    entries = dict(getattr(so, "_config", {}) or {})
    get = getattr(so, "get_session_config_entry", None)
    if not entries and get is not None:
        for key in _CONFIG_ENTRIES:
            try:
                entries[key] = str(get(key))
            except Exception:
                continue
    if entries:
        out["config_entries"] = sorted(entries.items())
    return out


# The session configuration entries passed on to ONNX Runtime.
_CONFIG_ENTRIES = tuple(_native.CONFIG_ENTRIES)


def _provider_names(providers: Any) -> List[str]:
    """The provider names in ``providers`` (names, or (name, options)
    pairs, as onnxruntime takes them); None is the CPU's."""
    if providers is None:
        return [_CPU]
    if isinstance(providers, (str, bytes)):
        raise InvalidArgument(f"providers must be a list of names, not {providers!r}")
    names = []
    for p in providers:
        name = p[0] if isinstance(p, (tuple, list)) and p else p
        if not isinstance(name, str):
            raise InvalidArgument(f"providers: {p!r} is not a provider name")
        names.append(name)
    return names


def _accelerators(providers: Any) -> List[str]:
    """The providers asked for that are not the CPU's."""
    return [n for n in _provider_names(providers) if n != _CPU]


def _library_providers() -> List[str]:
    """The providers the loaded ONNX Runtime library was built with."""
    return list(_native.library_providers())


def _check_providers(providers: Any) -> List[str]:
    """CPU is the only provider here. A list that names the CPU and
    accelerators this ONNX Runtime was not built with (the common
    ``["CUDAExecutionProvider", "CPUExecutionProvider"]`` on a machine
    with the CPU wheel) gets what onnxruntime gives it: a CPU session, and
    onnxruntime's warning for each provider it does not have. A session
    that asks only for accelerators, or for one the library does have
    (onnxruntime would run it there), is refused with ``InvalidArgument``:
    running it on the CPU instead would make a GPU service many times
    slower without an error. (``patch()`` hands such sessions to
    onnxruntime instead.)"""
    names = _provider_names(providers)
    others = [n for n in names if n != _CPU]
    if not others:
        return [_CPU]
    if _CPU in names:
        available = _library_providers()
        if not any(n in available for n in others):
            for n in others:
                # onnxruntime's own words (onnxruntime_inference_collection.py).
                warnings.warn(
                    f"Specified provider '{n}' is not in available provider names."
                    f"Available providers: '{', '.join(available)}'",
                    UserWarning,
                    stacklevel=3,
                )
            return [_CPU]
    raise InvalidArgument(
        f"tensor_arena.onnxruntime.InferenceSession runs on the CPU only, and "
        f"{', '.join(others)} was asked for"
        + ("" if _CPU in names else " without the CPU as a fallback")
        + ": make this session with onnxruntime.InferenceSession (under patch(), "
        "sessions asking for another provider are left to onnxruntime by themselves)"
    )


class ProviderNotice(UserWarning):
    """Warned (once per call site, as warnings are) when a session made
    under ``patch()`` asks for a provider other than the CPU's and is left
    to onnxruntime. Silence it with
    ``warnings.filterwarnings("ignore", category=ProviderNotice)``."""


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
    optimization level, execution mode, log severity and the thread pools'
    spinning (``SessionOptions.add_session_config_entry`` lists the
    entries) are read off it (ONNX Runtime's CPU arena and memory pattern
    settings are not: the arena is tensor-arena's). Where it sets no
    intra-op spinning entry, idle intra-op threads spin 50 us before they
    sleep (``session.intra_op.spin_duration_us``; ONNX Runtime's default
    spins far longer, which costs the other runs in flight their cores:
    docs/python-deploy.md). ``providers``: the CPU's. A list with the CPU
    and accelerators this ONNX Runtime lacks (``["CUDAExecutionProvider",
    "CPUExecutionProvider"]`` with the CPU wheel) makes a CPU session with
    onnxruntime's warning, as onnxruntime does; asking only for an
    accelerator, or for one the library has, raises ``InvalidArgument``
    rather than run on the CPU (``patch()`` leaves such sessions to
    onnxruntime). Errors are this module's exceptions (``NoSuchFile``,
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
        """Only the CPU's, as the constructor takes them: an accelerator
        this library lacks beside the CPU warns and stays on the CPU;
        another raises ``InvalidArgument`` (this session cannot move to
        it; make an ``onnxruntime.InferenceSession``)."""
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


class PatchedInferenceSession(InferenceSession):
    """What ``patch()`` puts in place of ``onnxruntime.InferenceSession``:
    this module's ``InferenceSession`` for CPU sessions; a session asking
    for another provider (``providers=["CUDAExecutionProvider", ...]``) is
    made by onnxruntime's own class, untouched, with a ``ProviderNotice``
    warning. Its own class (not ``InferenceSession`` itself) so that
    undoing the patch finds every name that took it, and a direct
    ``InferenceSession(..., providers=["CUDAExecutionProvider"])`` still
    raises."""

    def __new__(cls, path_or_bytes: Any = None, sess_options: Any = None,
                providers: Optional[Sequence[Any]] = None, *args: Any, **kwargs: Any) -> Any:
        others = _accelerators(providers)
        if others and _ORT_CLASS is not None:
            warnings.warn(
                f"tensor_arena.onnxruntime.patch(): a session asking for {', '.join(others)} "
                "is left to onnxruntime (tensor-arena manages CPU sessions)",
                ProviderNotice,
                stacklevel=2,
            )
            if cls is PatchedInferenceSession:
                return _ORT_CLASS(path_or_bytes, sess_options, providers, *args, **kwargs)
            # A subclass the application defined under the patch: an
            # instance of it (its methods, isinstance), on onnxruntime's
            # session; Python then calls its __init__.
            return object.__new__(_on_onnxruntime(cls))
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if getattr(type(self), "_ta_on_onnxruntime", False):
            # A subclass's session left to onnxruntime (its __init__ may
            # have come here through super()).
            _ORT_CLASS.__init__(self, *args, **kwargs)
        else:
            super().__init__(*args, **kwargs)


# The classes made by _on_onnxruntime, by subclass.
_ON_ORT: Dict[type, type] = {}


def _on_onnxruntime(cls: type) -> type:
    """A class of ``cls`` (a subclass of ``PatchedInferenceSession``) and
    onnxruntime's own class, where every name this module's classes define
    and the subclass does not resolves to onnxruntime's: the subclass's own
    methods first, then onnxruntime's session. Made once per subclass."""
    made = _ON_ORT.get(cls)
    if made is not None:
        return made
    own = set()
    for klass in cls.__mro__:
        if klass is PatchedInferenceSession:
            break
        own.update(vars(klass))
    ns: Dict[str, Any] = {"_ta_on_onnxruntime": True, "__module__": cls.__module__}
    skip = {"__dict__", "__weakref__", "__module__", "__doc__", "__qualname__", "__new__"}
    for klass in (PatchedInferenceSession, InferenceSession):
        for name in vars(klass):
            if name in own or name in skip or name in ns:
                continue
            if hasattr(_ORT_CLASS, name):
                ns[name] = getattr(_ORT_CLASS, name)
    if "__init__" not in own:
        ns["__init__"] = _ORT_CLASS.__init__
    ns["__new__"] = lambda k, *a, **kw: object.__new__(k)
    made = type(cls.__name__, (cls, _ORT_CLASS), ns)
    _ON_ORT[cls] = made
    return made


# onnxruntime's own class, noted by the first patch().
_ORT_CLASS: Any = None


def _module_bindings(value: Any, skip: Sequence[str]) -> List[tuple]:
    """Every (module, name) of ``sys.modules`` whose global ``name`` is
    ``value`` (modules named in ``skip``, and their submodules, left out)."""
    found = []
    for mname, mod in list(sys.modules.items()):
        if mod is None or any(mname == s or mname.startswith(s + ".") for s in skip):
            continue
        try:
            names = [k for k, v in list(vars(mod).items()) if v is value]
        except Exception:  # a lazy or odd module: leave it
            continue
        found.extend((mod, k) for k in names)
    return found


class _Patch:
    """What ``patch()`` returns: undone by ``undo()`` or on leaving a
    ``with`` block."""

    def __init__(self) -> None:
        global _ORT_CLASS
        import onnxruntime  # the user's application uses it: patching it is the point

        original = onnxruntime.InferenceSession
        # A patch inside a patch: the outer one undoes.
        self._active = not (isinstance(original, type) and issubclass(original, InferenceSession))
        if not self._active:
            return
        _ORT_CLASS = original
        self._original = original
        # Its defining module keeps it (its own code may name it).
        self._skip = ("tensor_arena", getattr(original, "__module__", ""))
        for mod, name in _module_bindings(original, self._skip):
            try:
                setattr(mod, name, PatchedInferenceSession)
            except Exception:
                continue

    def undo(self) -> None:
        """Puts onnxruntime's class back under every module global that
        holds the patched class: those the patch replaced and those bound
        while it was in place (a library imported inside the block)."""
        if not self._active:
            return
        self._active = False
        for mod, name in _module_bindings(PatchedInferenceSession, self._skip):
            try:
                setattr(mod, name, self._original)
            except Exception:
                continue

    def __enter__(self) -> "_Patch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.undo()


def patch() -> _Patch:
    """Makes ``onnxruntime.InferenceSession``, and every module global bound
    to it (``from onnxruntime import InferenceSession``, under any name),
    ``PatchedInferenceSession``: CPU sessions are this module's, sessions
    asking for another provider are left to onnxruntime with a
    ``ProviderNotice``. Works as a call (undo with ``.undo()``) or as a
    context manager::

        with tensor_arena.onnxruntime.patch():
            engine = RapidOCR()

    Undoing puts onnxruntime's class back under every module global that
    holds the patched class, including those bound inside the block (a
    library first imported there). Not undone: sessions made meanwhile
    (they stay tensor-arena's, which is the point), and the class where it
    was kept elsewhere than in a module global (a class attribute, a
    default argument, a closure, a container). A ``patch()`` inside
    another does nothing; the outer one undoes.
    """
    return _Patch()
