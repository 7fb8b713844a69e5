# A stand-in for torch, only enough to drive gpu_check.py's control flow,
# the Python module's install path and its MemPool route (torch.cuda.MemPool,
# use_mem_pool: a private pool caching 2 MiB-rounded segments of the
# allocator's) against the simulated driver in tests without a GPU. Not
# PyTorch; its "native" figures are constants.
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
        self.batch, self.ptr, self._seg = batch, None, None
        if on_dev:
            size = batch * 600_000
            if _pools:
                # Inside torch.cuda.use_mem_pool: a segment of the pool's.
                self._seg = _pools[-1]._take(size)
            elif _alloc:
                self.ptr = _alloc.alloc(size, 0, None)
                assert self.ptr, "alloc failed"
            else:
                _native[0] += size
                self._native = size
    def to(self, dev): return Tensor(self.batch, True)
    def cpu(self): return Tensor(self.batch)
    def __del__(self):
        if self._seg is not None:
            self._seg[0].give(self._seg)
        elif self.ptr and _alloc:
            _alloc.free(self.ptr, 0, 0, None)
        elif getattr(self, "_native", 0):
            _native[0] -= self._native
    def __eq__(self, o): return self.batch == o.batch
# Bytes PyTorch's own allocator would hold (no arena involved).
_native = [0]
# Pools made current by use_mem_pool, innermost last.
_pools = []
_SEGMENT = 2 << 20
class _PoolState:
    """What a pool's tensors hold: not the MemPool, which dies with its
    scope while they may live on (as in PyTorch)."""
    def __init__(self, allocator):
        self.a, self.cached, self.dead = allocator, [], False
    def take(self, size):
        size = -(-size // _SEGMENT) * _SEGMENT
        for i, seg in enumerate(self.cached):
            if seg[2] >= size:
                return self.cached.pop(i)
        ptr = self.a._alloc(size, 0, None)
        if not ptr:
            raise RuntimeError("CUDA out of memory (stand-in)")
        return (self, ptr, size)
    def give(self, seg):
        if self.dead:
            self.a._free(seg[1], seg[2], 0, None)
        else:
            self.cached.append(seg)
class MemPool:
    """Like torch.cuda.MemPool with an allocator: a private pool whose
    segments (requests rounded up to 2 MiB) come from the allocator's
    raw alloc, are cached for reuse inside the pool, and go back through
    its raw free when the pool is destroyed (cached ones) or later when
    their tensor dies (held ones)."""
    def __init__(self, allocator=None, use_on_oom=False):
        assert allocator is not None, "the stand-in only models pools with an allocator"
        self._state = _PoolState(allocator)
    def _take(self, size):
        return self._state.take(size)
    def __del__(self):
        st = self._state
        st.dead = True
        cached, st.cached = st.cached, []
        for seg in cached:
            st.a._free(seg[1], seg[2], 0, None)
def randn(b, *shape, generator=None): return Tensor(b)
class _Square:
    """ones(n, n) for the MemPool child's first use of CUDA: (a @ a)[0, 0] == n."""
    def __init__(self, n): self.n = n
    def __matmul__(self, o): return self
    def __getitem__(self, ij): return float(self.n)
def ones(n, m=None, device=None): return _Square(n)
def addmm(bias, a, b): return _Square(a.n + 1)
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
                # PyTorch (C++) calls `tensor_arena_cuda_alloc`, which may throw
                # std::bad_alloc; ctypes cannot catch it: the C entry.
                alloc_c = lib.tensor_arena_cuda_try_alloc
                alloc_c.restype = ctypes.c_void_p
                alloc_c.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
                lib.tensor_arena_cuda_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
                self.alloc, self.free = alloc_c, lib.tensor_arena_cuda_free
            def allocator(self):
                # The _cuda_CUDAAllocator MemPool takes.
                class _Raw:
                    _alloc, _free = self.alloc, self.free
                return _Raw()
        @staticmethod
        def change_current_allocator(a):
            global _alloc
            if _native[0] or _pools_made[0]:
                raise RuntimeError("Can't swap an already initialized allocator")
            _alloc = a
    MemPool = MemPool
    @staticmethod
    @contextlib.contextmanager
    def use_mem_pool(pool, device=None):
        _pools_made[0] += 1
        _pools.append(pool)
        try:
            yield
        finally:
            _pools.pop()
    is_available = staticmethod(lambda: True)
    current_device = staticmethod(lambda: 0)
    synchronize = staticmethod(lambda: None)
    reset_peak_memory_stats = staticmethod(lambda: None)
    max_memory_allocated = staticmethod(lambda: 100 << 20)
    max_memory_reserved = staticmethod(lambda: 125 << 20)
    memory_reserved = staticmethod(lambda: 110 << 20)
    memory_allocated = staticmethod(lambda: _native[0])
    empty_cache = staticmethod(lambda: None)
    get_device_name = staticmethod(lambda: "fake")
_pools_made = [0]
cuda = _Cuda()
