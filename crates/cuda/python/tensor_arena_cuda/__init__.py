"""tensor-arena as PyTorch's CUDA memory.

Installed from the wheel (``pip install tensor_arena_cuda-*.whl``), the
library is inside the package: nothing to build or point at. Two ways in:

1. **The process's allocator** (``install``): every CUDA tensor of the
   process comes from the arena, with no cache of PyTorch's in between.
   Must run before anything touches CUDA (PyTorch refuses to change its
   allocator after that)::

       import tensor_arena_cuda
       arena = tensor_arena_cuda.install()
       with arena.run(("batch", x.shape[0])):
           out = model(x.cuda()).cpu()   # drop device outputs inside the run
       print(arena.memory_stats()["reserved_bytes.all.current"])
       arena.shrink()

2. **A scope in a running process** (``pool``): PyTorch keeps its own
   allocator; the tensors made inside ``with tensor_arena_cuda.pool(key):``
   come from the arena through ``torch.cuda.MemPool`` (PyTorch 2.5 or
   later), in a process that already used CUDA::

       with tensor_arena_cuda.pool(("batch", x.shape[0])):
           out = model(x.cuda()).cpu()

   PyTorch's caching allocator stays between the scope and the arena: it
   asks the arena for whole segments (2 MiB for requests up to 1 MiB,
   20 MiB up to 10 MiB, the request rounded to 2 MiB above) and caches
   blocks inside them for the scope. Each scope has a pool of its own,
   destroyed when the scope ends, which gives its segments back to the
   arena; so a scope is one run of the arena, planned by its key.

``Arena(path, driver="simulated")`` drives the library through ctypes with
the simulated driver (no GPU, no torch): the tests and ``python -m
tensor_arena_cuda.selftest`` do this.
"""

import contextlib
import ctypes
import glob
import json
import os
import sys

__all__ = ["Arena", "install", "pool", "library_path", "default_arena", "LIBRARY_ENV"]

#: Environment variable naming a library file to load instead of the one in
#: the package (a build of your own, say).
LIBRARY_ENV = "TENSOR_ARENA_CUDA_LIB"

_HERE = os.path.dirname(os.path.abspath(__file__))


def library_path():
    """The shared library this package loads: ``$TENSOR_ARENA_CUDA_LIB`` if
    set, else the one installed inside the package."""
    env = os.environ.get(LIBRARY_ENV)
    if env:
        return env
    found = sorted(glob.glob(os.path.join(_HERE, "libtensor_arena_cuda*.so")))
    if not found:
        raise FileNotFoundError(
            "tensor-arena-cuda library not found in the package "
            f"({_HERE}): install the wheel (pip install tensor_arena_cuda-*.whl), "
            f"or set {LIBRARY_ENV} to a built libtensor_arena_cuda.so"
        )
    return found[0]


class Arena:
    """The library at ``path`` (default: the package's), loaded with ctypes.
    One arena per device lives in the library; every ``Arena`` of one
    library file reaches the same ones."""

    def __init__(self, path=None, driver=None):
        self.path = os.fspath(path) if path is not None else library_path()
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"tensor-arena-cuda library not found: {self.path}")
        lib = ctypes.CDLL(self.path)
        c_int, c_size, c_ssize = ctypes.c_int, ctypes.c_size_t, ctypes.c_ssize_t
        # `tensor_arena_cuda_alloc` throws std::bad_alloc where PyTorch's C++ runtime is
        # loaded; from ctypes, `tensor_arena_cuda_try_alloc` (null on failure).
        lib.tensor_arena_cuda_try_alloc.argtypes = [c_ssize, c_int, ctypes.c_void_p]
        lib.tensor_arena_cuda_try_alloc.restype = ctypes.c_void_p
        lib.tensor_arena_cuda_free.argtypes = [ctypes.c_void_p, c_ssize, c_int, ctypes.c_void_p]
        lib.tensor_arena_cuda_free.restype = None
        lib.tensor_arena_cuda_init.argtypes = [ctypes.c_char_p]
        lib.tensor_arena_cuda_init.restype = c_int
        lib.tensor_arena_cuda_run_begin.argtypes = [c_int, ctypes.c_char_p, c_size]
        lib.tensor_arena_cuda_run_begin.restype = c_int
        lib.tensor_arena_cuda_run_end.argtypes = [c_int]
        lib.tensor_arena_cuda_run_end.restype = c_int
        lib.tensor_arena_cuda_shrink.argtypes = [c_int]
        lib.tensor_arena_cuda_shrink.restype = ctypes.c_int64
        lib.tensor_arena_cuda_shrink_to.argtypes = [c_int, ctypes.c_uint64]
        lib.tensor_arena_cuda_shrink_to.restype = ctypes.c_int64
        lib.tensor_arena_cuda_reset_peaks.argtypes = [c_int]
        lib.tensor_arena_cuda_reset_peaks.restype = c_int
        lib.tensor_arena_cuda_stats_json.argtypes = [c_int, ctypes.c_char_p, c_size]
        lib.tensor_arena_cuda_stats_json.restype = c_ssize
        lib.tensor_arena_cuda_last_error.argtypes = [ctypes.c_char_p, c_size]
        lib.tensor_arena_cuda_last_error.restype = c_ssize
        store_args = [c_int, ctypes.c_char_p, c_size, ctypes.c_char_p, c_size, ctypes.c_char_p, c_size]
        lib.tensor_arena_cuda_plans_load.argtypes = store_args
        lib.tensor_arena_cuda_plans_load.restype = ctypes.c_int64
        lib.tensor_arena_cuda_plans_save.argtypes = store_args
        lib.tensor_arena_cuda_plans_save.restype = ctypes.c_int64
        lib.tensor_arena_cuda_ort_set_device.argtypes = [c_int]
        lib.tensor_arena_cuda_ort_set_device.restype = c_int
        lib.tensor_arena_cuda_ort_set_stream.argtypes = [ctypes.c_void_p]
        lib.tensor_arena_cuda_ort_set_stream.restype = c_int
        self.lib = lib
        self._torch_allocators = {}
        self._installed = False
        if driver is not None:
            if lib.tensor_arena_cuda_init(driver.encode()) != 0:
                raise RuntimeError(self.last_error())

    # -- PyTorch ---------------------------------------------------------

    def _pluggable(self, alloc="tensor_arena_cuda_alloc"):
        """PyTorch's handle on this library with ``alloc`` as its allocation
        function (made once per entry; PyTorch keeps the library loaded).

        ``tensor_arena_cuda_alloc`` throws std::bad_alloc when it cannot serve a request:
        the process's allocator needs that, because PyTorch uses its
        pointer unchecked. Under a MemPool, PyTorch's caching allocator
        calls the allocator for segments and checks the pointer (a null is
        cudaErrorMemoryAllocation: it gives its cached blocks back, retries,
        then raises torch.OutOfMemoryError), so ``pool()`` uses
        ``tensor_arena_cuda_try_alloc``, which returns null instead of throwing."""
        if alloc not in self._torch_allocators:
            import torch

            self._torch_allocators[alloc] = torch.cuda.memory.CUDAPluggableAllocator(
                self.path, alloc, "tensor_arena_cuda_free"
            )
        return self._torch_allocators[alloc]

    def install(self):
        """Makes this library PyTorch's CUDA allocator for the whole process.
        Must come before anything allocates CUDA memory."""
        import torch

        torch.cuda.memory.change_current_allocator(self._pluggable())
        self._installed = True
        return self

    @contextlib.contextmanager
    def pool(self, key=None, device=None):
        """The CUDA tensors made inside come from the arena, through a
        ``torch.cuda.MemPool`` of this scope; PyTorch's own allocator serves
        the rest of the process. With ``key`` (the input shape, as for
        ``run``) the scope is one run of the arena: planned from its second
        sight on. Tensors that must outlive the scope (weights) are made in a
        scope with no key; they keep their memory after it ends.

        Needs PyTorch 2.5 or later (``torch.cuda.MemPool``)."""
        import torch

        if self._installed:
            raise RuntimeError(
                "tensor-arena is already PyTorch's allocator (install()): use run(), not pool()"
            )
        if not hasattr(torch.cuda, "MemPool") or not hasattr(torch.cuda, "use_mem_pool"):
            raise RuntimeError(
                f"torch.cuda.MemPool needs PyTorch 2.5 or later (this is {torch.__version__}): "
                "use tensor_arena_cuda.install() before CUDA is first used"
            )
        dev = self._device(device)
        mempool = torch.cuda.MemPool(self._pluggable("tensor_arena_cuda_try_alloc").allocator())
        if key is not None:
            self._run_begin(dev, key)
        try:
            with torch.cuda.use_mem_pool(mempool, device=dev):
                yield self
        finally:
            # Destroying the pool gives its cached segments back to the
            # arena (PyTorch's MemPool destructor empties the pool's cache);
            # segments holding tensors still alive stay until they die.
            del mempool
            if key is not None:
                self._run_end(dev)

    def _device(self, device):
        if device is not None:
            return int(device)
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            return torch.cuda.current_device()
        return 0

    # -- errors and strings ----------------------------------------------

    def last_error(self):
        """The library's last error message ('' if none)."""
        return self._string(lambda buf, cap: self.lib.tensor_arena_cuda_last_error(buf, cap))

    def _string(self, call):
        cap = 4096
        while True:
            buf = ctypes.create_string_buffer(cap)
            n = call(buf, cap)
            if n < 0:
                raise RuntimeError(self.last_error())
            if n < cap:
                return buf.value.decode()
            cap = n + 1

    # -- runs, shrink ----------------------------------------------------

    @staticmethod
    def _key(key):
        return key if isinstance(key, bytes) else str(key).encode()

    def _run_begin(self, dev, key):
        key = self._key(key)
        if self.lib.tensor_arena_cuda_run_begin(dev, key, len(key)) != 0:
            raise RuntimeError(self.last_error())

    def _run_end(self, dev):
        if self.lib.tensor_arena_cuda_run_end(dev) != 0:
            raise RuntimeError(self.last_error())

    @contextlib.contextmanager
    def run(self, key, device=None):
        """One inference call keyed by input shape: ``key`` (bytes, str or
        anything with a stable ``str``) names the shape; a key seen before
        is served from its plan. Device tensors made inside should be
        dropped inside (copy results out), or the run cannot be planned."""
        dev = self._device(device)
        self._run_begin(dev, key)
        try:
            yield self
        finally:
            self._run_end(dev)

    def shrink(self, device=None):
        """Gives device memory back down to the watermark; returns bytes released."""
        n = self.lib.tensor_arena_cuda_shrink(self._device(device))
        if n < 0:
            raise RuntimeError(self.last_error())
        return n

    def shrink_to(self, nbytes, device=None):
        """Gives device memory back towards ``nbytes``; returns bytes released."""
        n = self.lib.tensor_arena_cuda_shrink_to(self._device(device), int(nbytes))
        if n < 0:
            raise RuntimeError(self.last_error())
        return n

    # -- plan store ------------------------------------------------------

    @staticmethod
    def default_plan_options():
        """The options a plan store is keyed by when none are given:
        PyTorch's version where torch is imported ('' otherwise). The store's
        key also holds the arena's granule, alignment and driver."""
        torch = sys.modules.get("torch")
        return f"torch={torch.__version__}" if torch is not None else ""

    def _store_call(self, fn, directory, model, options, device):
        d = os.fsencode(os.fspath(directory))
        m = str(model).encode()
        o = (self.default_plan_options() if options is None else str(options)).encode()
        n = fn(self._device(device), d, len(d), m, len(m), o, len(o))
        if n < 0:
            raise RuntimeError(self.last_error())
        return n

    def load_plans(self, directory, model, options=None, device=None):
        """Loads ``model``'s plans from the plan store in ``directory`` (saved
        by an earlier process with ``save_plans``): a key among them is
        served from its plan at its first run, and a shape never seen is
        predicted from its family. Returns the number of plans loaded (0 when
        the directory has no file for the model yet).

        ``options`` (text) names what changes the model's allocations
        (default: PyTorch's version, ``default_plan_options()``); pass the same
        to ``save_plans``. Raises ``RuntimeError`` with one line saying why
        when the directory does not exist or the file is refused (corrupt,
        another format, another model's or setting's); nothing is loaded
        then."""
        return self._store_call(self.lib.tensor_arena_cuda_plans_load, directory, model, options, device)

    def save_plans(self, directory, model, options=None, device=None):
        """Saves the device's plans as ``model``'s to the plan store in
        ``directory`` (made if missing; merged with what the file holds,
        written atomically). Returns the bytes of the file. Call it outside
        runs (it reads and writes the whole file). Raises ``RuntimeError``
        when it cannot be written."""
        return self._store_call(self.lib.tensor_arena_cuda_plans_save, directory, model, options, device)

    # -- stats -----------------------------------------------------------

    def stats(self, device=None):
        """The arena's counters as a dict (see the crate's README)."""
        dev = self._device(device)
        text = self._string(lambda buf, cap: self.lib.tensor_arena_cuda_stats_json(dev, buf, cap))
        return json.loads(text)

    def memory_stats(self, device=None):
        """The arena's counters under ``torch.cuda.memory_stats()``'s names
        where they mean the same thing (``allocated_bytes.all.current``,
        ``reserved_bytes.all.peak``, ``num_device_alloc``, ``num_ooms``, ...),
        and its own under ``tensor_arena.*`` (driver calls, fragmentation).
        PyTorch's functions cannot see a pluggable allocator; these can."""
        return self.stats(device)["memory_stats"]

    def memory_allocated(self, device=None):
        """Bytes in live blocks (``torch.cuda.memory_allocated``)."""
        return self.memory_stats(device)["allocated_bytes.all.current"]

    def max_memory_allocated(self, device=None):
        """Most bytes live at once since the peaks were reset."""
        return self.memory_stats(device)["allocated_bytes.all.peak"]

    def memory_reserved(self, device=None):
        """Bytes of device memory mapped (``torch.cuda.memory_reserved``)."""
        return self.memory_stats(device)["reserved_bytes.all.current"]

    def max_memory_reserved(self, device=None):
        """Most bytes mapped at once since the peaks were reset."""
        return self.memory_stats(device)["reserved_bytes.all.peak"]

    def reset_peak_memory_stats(self, device=None):
        """Lowers both peaks to what is held now."""
        if self.lib.tensor_arena_cuda_reset_peaks(self._device(device)) != 0:
            raise RuntimeError(self.last_error())

    # -- ONNX Runtime ----------------------------------------------------

    def ort_cuda_provider_options(self, device=0, stream=None, **options):
        """Options for ONNX Runtime's ``CUDAExecutionProvider`` that make a
        session take its device memory from the arena of ``device``:
        ``device_id`` and ``gpu_external_alloc`` / ``_free`` /
        ``_empty_cache`` (the library's functions, as decimal addresses),
        plus any ``options`` given (``cudnn_conv_algo_search``, ...)::

            sess = onnxruntime.InferenceSession(model, providers=[
                ("CUDAExecutionProvider", arena.ort_cuda_provider_options(0))])
            with arena.run(("model", x.shape), device=0):
                out = sess.run(None, {"input": x})

        ``stream`` (a ``cudaStream_t`` as an int, e.g.
        ``torch.cuda.current_stream().cuda_stream``) is the stream ONNX
        Runtime computes on (``user_compute_stream``); the arena tags ONNX
        Runtime's blocks with it. It is needed when PyTorch takes memory
        from the same arena (``install()``, ``pool()``): without it the
        second of the two to allocate is refused with an error, since a
        block one frees could reach the other with nothing ordering their
        kernels.

        Needs onnxruntime-gpu. One device per process is served."""
        if self.lib.tensor_arena_cuda_ort_set_device(int(device)) != 0:
            raise RuntimeError(self.last_error())
        if stream is not None:
            if self.lib.tensor_arena_cuda_ort_set_stream(int(stream)) != 0:
                raise RuntimeError(self.last_error())

        def addr(fn):
            return str(ctypes.cast(fn, ctypes.c_void_p).value)

        opts = {str(k): str(v) for k, v in options.items()}
        opts.update(
            device_id=str(int(device)),
            gpu_external_alloc=addr(self.lib.tensor_arena_cuda_ort_alloc),
            gpu_external_free=addr(self.lib.tensor_arena_cuda_ort_free),
            gpu_external_empty_cache=addr(self.lib.tensor_arena_cuda_ort_empty_cache),
        )
        if stream is not None:
            opts["user_compute_stream"] = str(int(stream))
        return opts

    # -- raw blocks (ctypes callers) -------------------------------------

    def alloc(self, size, device=0, stream=0):
        """A raw device allocation (PyTorch calls ``tensor_arena_cuda_alloc``, which throws
        std::bad_alloc on failure; this never throws); 0 on failure."""
        return self.lib.tensor_arena_cuda_try_alloc(size, device, stream) or 0

    def free(self, ptr, size=0, device=0, stream=0):
        """Gives a raw allocation back."""
        self.lib.tensor_arena_cuda_free(ptr, size, device, stream)


_DEFAULT = None


def default_arena(driver=None):
    """The process's ``Arena`` of the package's library (made on first use)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Arena(driver=driver)
    elif driver is not None:
        if _DEFAULT.lib.tensor_arena_cuda_init(driver.encode()) != 0:
            raise RuntimeError(_DEFAULT.last_error())
    return _DEFAULT


def install(path=None, driver=None):
    """Makes the library (default: the package's) PyTorch's CUDA allocator
    for the whole process, before anything touches CUDA."""
    global _DEFAULT
    arena = Arena(path, driver).install() if path is not None else default_arena(driver).install()
    if path is None:
        _DEFAULT = arena
    return arena


def pool(key=None, device=None):
    """``default_arena().pool(key, device)``: the CUDA tensors made inside
    come from the arena, in a process that already uses PyTorch's allocator."""
    return default_arena().pool(key, device)
