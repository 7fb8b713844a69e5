"""tensor-arena as PyTorch's CUDA allocator.

Point it at the built library (``cargo build --release -p tensor-arena-cuda``
gives ``target/release/libtensor_arena_cuda.so``); nothing else to build::

    import tensor_arena_cuda
    arena = tensor_arena_cuda.install("target/release/libtensor_arena_cuda.so")
    model = ...  # tensors are allocated by the arena from here on
    with arena.run(("batch", x.shape[0])):
        out = model(x).cpu()   # drop device outputs inside the run
    print(arena.stats()["arena"]["reserved"])
    arena.shrink()

``install`` must run before PyTorch allocates any CUDA memory (PyTorch
refuses to change its allocator after that). ``Arena`` without ``install``
drives the library directly through ctypes (the tests do this against the
simulated driver: ``Arena(path, driver="simulated")``).
"""

import contextlib
import ctypes
import json
import os
import sys

__all__ = ["Arena", "install"]


class Arena:
    """The library at ``path``, loaded with ctypes."""

    def __init__(self, path, driver=None):
        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"tensor-arena-cuda library not found: {self.path}")
        lib = ctypes.CDLL(self.path)
        c_int, c_size, c_ssize = ctypes.c_int, ctypes.c_size_t, ctypes.c_ssize_t
        # `alloc_fn` throws std::bad_alloc where PyTorch's C++ runtime is
        # loaded; from ctypes, `tensor_arena_alloc` (null on failure).
        lib.tensor_arena_alloc.argtypes = [c_ssize, c_int, ctypes.c_void_p]
        lib.tensor_arena_alloc.restype = ctypes.c_void_p
        lib.free_fn.argtypes = [ctypes.c_void_p, c_ssize, c_int, ctypes.c_void_p]
        lib.free_fn.restype = None
        lib.tensor_arena_init.argtypes = [ctypes.c_char_p]
        lib.tensor_arena_init.restype = c_int
        lib.tensor_arena_run_begin.argtypes = [c_int, ctypes.c_char_p, c_size]
        lib.tensor_arena_run_begin.restype = c_int
        lib.tensor_arena_run_end.argtypes = [c_int]
        lib.tensor_arena_run_end.restype = c_int
        lib.tensor_arena_shrink.argtypes = [c_int]
        lib.tensor_arena_shrink.restype = ctypes.c_int64
        lib.tensor_arena_shrink_to.argtypes = [c_int, ctypes.c_uint64]
        lib.tensor_arena_shrink_to.restype = ctypes.c_int64
        lib.tensor_arena_stats_json.argtypes = [c_int, ctypes.c_char_p, c_size]
        lib.tensor_arena_stats_json.restype = c_ssize
        lib.tensor_arena_last_error.argtypes = [ctypes.c_char_p, c_size]
        lib.tensor_arena_last_error.restype = c_ssize
        self.lib = lib
        self._torch_allocator = None
        if driver is not None:
            if lib.tensor_arena_init(driver.encode()) != 0:
                raise RuntimeError(self.last_error())

    def install(self):
        """Makes this library PyTorch's CUDA allocator."""
        import torch

        alloc = torch.cuda.memory.CUDAPluggableAllocator(self.path, "alloc_fn", "free_fn")
        torch.cuda.memory.change_current_allocator(alloc)
        self._torch_allocator = alloc
        return self

    def _device(self, device):
        if device is not None:
            return int(device)
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            return torch.cuda.current_device()
        return 0

    def last_error(self):
        """The library's last error message ('' if none)."""
        return self._string(lambda buf, cap: self.lib.tensor_arena_last_error(buf, cap))

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

    @contextlib.contextmanager
    def run(self, key, device=None):
        """One inference call keyed by input shape: ``key`` (bytes, str or
        anything with a stable ``str``) names the shape; a key seen before
        is served from its plan. Device tensors made inside should be
        dropped inside (copy results out), or the run cannot be planned."""
        dev = self._device(device)
        if not isinstance(key, bytes):
            key = str(key).encode()
        if self.lib.tensor_arena_run_begin(dev, key, len(key)) != 0:
            raise RuntimeError(self.last_error())
        try:
            yield self
        finally:
            if self.lib.tensor_arena_run_end(dev) != 0:
                raise RuntimeError(self.last_error())

    def stats(self, device=None):
        """The arena's counters as a dict (see the crate's README)."""
        dev = self._device(device)
        text = self._string(lambda buf, cap: self.lib.tensor_arena_stats_json(dev, buf, cap))
        return json.loads(text)

    def shrink(self, device=None):
        """Gives device memory back down to the watermark; returns bytes released."""
        n = self.lib.tensor_arena_shrink(self._device(device))
        if n < 0:
            raise RuntimeError(self.last_error())
        return n

    def shrink_to(self, nbytes, device=None):
        """Gives device memory back towards ``nbytes``; returns bytes released."""
        n = self.lib.tensor_arena_shrink_to(self._device(device), int(nbytes))
        if n < 0:
            raise RuntimeError(self.last_error())
        return n

    def alloc(self, size, device=0, stream=0):
        """A raw device allocation (PyTorch calls ``alloc_fn``, which throws
        std::bad_alloc on failure; this never throws); 0 on failure."""
        return self.lib.tensor_arena_alloc(size, device, stream) or 0

    def free(self, ptr, size=0, device=0, stream=0):
        """Gives a raw allocation back."""
        self.lib.free_fn(ptr, size, device, stream)


def install(path, driver=None):
    """Loads the library at ``path`` and makes it PyTorch's CUDA allocator."""
    return Arena(path, driver).install()
