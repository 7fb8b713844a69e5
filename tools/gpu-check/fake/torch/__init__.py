# A stand-in for torch, only enough to drive gpu_check.py's control flow
# (and the Python module's install path) against the simulated driver in
# tests without a GPU. Not PyTorch; its "native" figures are constants.
import contextlib, ctypes, pickle
__version__ = "fake"
_alloc = None
class _Backends: pass
backends = _Backends(); backends.cudnn = _Backends()
def manual_seed(s): pass
def device(d): return d
class Generator:
    def manual_seed(self, s): self.s = s; return self
class Tensor:
    def __init__(self, batch, on_dev=False):
        self.batch, self.ptr = batch, None
        if on_dev and _alloc:
            self.ptr = _alloc.alloc(batch * 600_000, 0, None)
            assert self.ptr, "alloc failed"
    def to(self, dev): return Tensor(self.batch, True)
    def cpu(self): return Tensor(self.batch)
    def __del__(self):
        if self.ptr and _alloc: _alloc.free(self.ptr, 0, 0, None)
    def __eq__(self, o): return self.batch == o.batch
def randn(b, *shape, generator=None): return Tensor(b)
# (batch, sequence length) token ids: a "batch" that grows with the length.
def randint(lo, hi, shape, generator=None): return Tensor(shape[0] * shape[1] // 128)
def equal(a, b): return a == b
def save(obj, path): pickle.dump([t.batch for t in obj], open(path, "wb"))
def load(path): return [Tensor(b) for b in pickle.load(open(path, "rb"))]
@contextlib.contextmanager
def inference_mode(): yield
class _Cuda:
    class memory:
        class CUDAPluggableAllocator:
            def __init__(self, path, a, f):
                lib = ctypes.CDLL(path)
                # PyTorch (C++) calls `alloc_fn`, which may throw
                # std::bad_alloc; ctypes cannot catch it: the C entry.
                alloc_c = lib.tensor_arena_alloc
                alloc_c.restype = ctypes.c_void_p
                alloc_c.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
                lib.free_fn.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
                self.alloc, self.free = alloc_c, lib.free_fn
        @staticmethod
        def change_current_allocator(a):
            global _alloc; _alloc = a
    is_available = staticmethod(lambda: True)
    current_device = staticmethod(lambda: 0)
    synchronize = staticmethod(lambda: None)
    reset_peak_memory_stats = staticmethod(lambda: None)
    max_memory_allocated = staticmethod(lambda: 100 << 20)
    max_memory_reserved = staticmethod(lambda: 125 << 20)
    memory_reserved = staticmethod(lambda: 110 << 20)
    empty_cache = staticmethod(lambda: None)
    get_device_name = staticmethod(lambda: "fake")
cuda = _Cuda()
