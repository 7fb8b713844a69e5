"""The MemPool route (tensor_arena_cuda.pool) against a stand-in for torch
(tools/gpu-check/fake: torch.cuda.MemPool and use_mem_pool over a private
pool that caches segments, as PyTorch's does) and the library's simulated
driver. Run with the stand-in first on PYTHONPATH:

    PYTHONPATH=tools/gpu-check/fake python3 test_mempool.py [LIBRARY]

(LIBRARY defaults to the installed package's.)"""

import gc
import os
import sys

import torch

if torch.__version__ != "fake":
    raise SystemExit("test_mempool.py runs against the stand-in torch (tools/gpu-check/fake)")

# From the source tree this imports the package next to this file; the
# wheel check (tools/wheel-check.sh) runs a copy elsewhere, so that the
# installed package is the one imported.
import tensor_arena_cuda  # noqa: E402

MIB = 1 << 20


def main(path=None):
    if path is not None:
        os.environ[tensor_arena_cuda.LIBRARY_ENV] = path
    arena = tensor_arena_cuda.default_arena(driver="simulated")
    dev = torch.device("cuda")

    # The process used CUDA with PyTorch's own allocator first.
    before = torch.randn(4).to(dev)
    assert torch.cuda.memory_allocated() > 0
    assert arena.memory_allocated(0) == 0, "a native tensor reached the arena"
    assert arena.stats(0)["calls"]["total"] == 0

    # Weights made in a scope with no key outlive it, in the arena.
    with tensor_arena_cuda.pool():
        weights = torch.randn(10).to(dev)
    held = arena.memory_allocated(0)
    assert held >= 10 * 600_000, held
    assert arena.stats(0)["in_run"] is False

    # Allocations outside any scope stay with PyTorch.
    native = torch.cuda.memory_allocated()
    outside = torch.randn(8).to(dev)
    assert torch.cuda.memory_allocated() > native
    assert arena.memory_allocated(0) == held, "an allocation outside the pool reached the arena"
    del outside

    # Keyed scopes are runs of the arena: the third sight of a key is
    # served from its plan with no driver call; everything the scope made
    # goes back to the arena when it ends.
    def batch(n):
        with tensor_arena_cuda.pool(("batch", n)):
            x = torch.randn(n).to(dev)
            h = torch.randn(2 * n).to(dev)
            del x
            y = torch.randn(n).to(dev)
            out = y.cpu()
            del h, y
        return out

    for n in (16, 1, 16):
        batch(n)
        assert arena.memory_allocated(0) == held, "the scope's segments outlived it"
    calls = arena.stats(0)["calls"]["total"]
    batch(16)
    s = arena.stats(0)
    assert s["last_run"]["planned"] and not s["last_run"]["deviated"], s["last_run"]
    assert s["calls"]["total"] == calls, "a planned scope made driver calls"
    assert s["arena"]["planned_runs"] >= 1

    # Stats through PyTorch's names, and the peak reset.
    m = arena.memory_stats(0)
    assert m["allocated_bytes.all.current"] == held, m
    assert m["allocated_bytes.all.peak"] > held, m
    assert m["reserved_bytes.all.current"] == s["mapped"], m
    assert m["reserved_bytes.all.peak"] >= m["reserved_bytes.all.current"], m
    assert m["allocation.all.current"] == 1, m
    assert m["num_device_alloc"] > 0 and m["num_ooms"] == 0, m
    # Segments made and given back, the weights' still live.
    assert m["allocation.all.allocated"] > m["allocation.all.freed"] > 0, m
    assert m["allocation.all.allocated"] - m["allocation.all.freed"] == 1, m
    arena.reset_peak_memory_stats()
    assert arena.max_memory_allocated() == held
    assert arena.max_memory_reserved() == arena.memory_reserved()

    # Shrink after a small batch: down to its need plus the weights.
    batch(1)
    arena.shrink()
    s = arena.stats(0)
    need = s["arena"]["watermark"] + s["arena"]["in_use"]
    assert s["mapped"] <= need + 2 * MIB, s

    # A tensor kept past its scope keeps its segment; the run says so
    # (not planned) and the segment comes back when the tensor dies.
    with tensor_arena_cuda.pool(("batch", 4)):
        kept = torch.randn(4).to(dev)
    assert arena.stats(0)["last_run"]["leaked_blocks"] == 1
    assert arena.memory_allocated(0) > held
    del kept
    gc.collect()
    assert arena.memory_allocated(0) == held

    # Misuse: a clear exception, nothing lost.
    try:
        with tensor_arena_cuda.pool("a"):
            with tensor_arena_cuda.pool("b"):
                pass
        raise AssertionError("nested keyed scopes must raise")
    except RuntimeError as e:
        assert "run" in str(e), e
    assert arena.stats(0)["in_run"] is False
    mempool = torch.cuda.MemPool
    del torch.cuda.__class__.MemPool
    try:
        with tensor_arena_cuda.pool():
            pass
        raise AssertionError("a torch without MemPool must raise")
    except RuntimeError as e:
        assert "2.5" in str(e), e
    finally:
        torch.cuda.__class__.MemPool = mempool
    try:
        tensor_arena_cuda.install()
        raise AssertionError("install after CUDA was used must raise")
    except RuntimeError as e:
        assert "allocator" in str(e), e
    del weights, before
    assert arena.memory_allocated(0) == 0
    print("tensor_arena_cuda MemPool route: ok")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
