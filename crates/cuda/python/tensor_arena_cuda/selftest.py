"""The package's self-test against the library's simulated driver (no GPU,
no torch): ``python -m tensor_arena_cuda.selftest [LIBRARY]`` prints
``tensor_arena_cuda selftest: ok`` and exits 0, or fails with the reason.
Run it in a fresh process: it picks the simulated driver, which must
happen before the library's first allocation."""

import os
import sys

import tensor_arena_cuda

MIB = 1 << 20


def main(path=None):
    lib = path if path is not None else tensor_arena_cuda.library_path()
    try:
        tensor_arena_cuda.Arena(lib + ".missing")
        raise AssertionError("a missing library must raise")
    except FileNotFoundError as e:
        assert "not found" in str(e)
    try:
        tensor_arena_cuda.Arena(lib, driver="no-such-driver")
        raise AssertionError("an unknown driver must raise")
    except RuntimeError as e:
        assert "unknown driver" in str(e), e
    arena = tensor_arena_cuda.Arena(lib, driver="simulated")
    s = arena.stats(0)
    assert s["driver"] == "simulated", s
    assert s["arena"]["reserved"] == 0 and s["calls"]["total"] == 0, s

    def one_run(key, sizes):
        with arena.run(key, device=0):
            live = []
            for i, size in enumerate(sizes):
                p = arena.alloc(size, 0, 0)
                assert p and p % 512 == 0, (p, size)
                live.append((p, size))
                if i % 2 == 1:
                    q, n = live.pop(0)
                    arena.free(q, n, 0, 0)
            for p, n in live:
                arena.free(p, n, 0, 0)

    sizes = [3 * MIB, 1 * MIB, 5 * MIB, 4096, 2 * MIB]
    one_run(("batch", 16), [n * 4 for n in sizes])
    one_run(("batch", 1), sizes)
    big = arena.stats(0)
    assert big["arena"]["reserved"] >= 20 * MIB, big
    calls = big["calls"]["total"]
    one_run(("batch", 16), [n * 4 for n in sizes])
    after = arena.stats(0)
    assert after["last_run"]["planned"] and not after["last_run"]["deviated"], after["last_run"]
    assert after["calls"]["total"] == calls, "a planned run made driver calls"
    one_run(("batch", 1), sizes)
    released = arena.shrink(0)
    shrunk = arena.stats(0)
    assert released > 0 and shrunk["arena"]["reserved"] == big["arena"]["reserved"] - released
    need = shrunk["arena"]["watermark"]
    assert shrunk["arena"]["reserved"] <= need + 2 * MIB, shrunk["arena"]
    assert shrunk["mapped"] == shrunk["arena"]["reserved"]

    # Stats under PyTorch's names, and a peak reset.
    m = arena.memory_stats(0)
    assert m["allocated_bytes.all.current"] == 0, m
    assert m["allocated_bytes.all.peak"] >= 4 * 5 * MIB, m
    assert m["reserved_bytes.all.current"] == shrunk["mapped"], m
    assert m["reserved_bytes.all.peak"] >= big["arena"]["reserved"], m
    assert m["num_device_alloc"] > 0 and m["num_device_free"] > 0, m
    assert m["tensor_arena.driver_calls"] == shrunk["calls"]["total"], m
    assert 0.0 <= m["tensor_arena.fragmentation"] <= 1.0, m
    held = arena.alloc(3 * MIB, 0, 0)
    assert arena.memory_allocated(0) == 3 * MIB
    arena.reset_peak_memory_stats(0)
    assert arena.max_memory_allocated(0) == 3 * MIB
    assert arena.max_memory_reserved(0) == arena.memory_reserved(0)
    arena.free(held, 3 * MIB, 0, 0)
    assert arena.max_memory_allocated(0) == 3 * MIB, "a free does not lower the peak"

    # Counters that differ from one another, so that a key reading the
    # wrong counter (blocks made as blocks freed, ooms as 0) is caught.
    arena.shrink_to(0, 0)
    before = arena.memory_stats(0)
    made, freed = before["allocation.all.allocated"], before["allocation.all.freed"]
    assert made == freed == 4 * len(sizes) + 1, before  # the four runs and `held`
    blocks = [arena.alloc(MIB, 0, 0) for _ in range(3)]
    arena.free(blocks[0], MIB, 0, 0)
    m = arena.memory_stats(0)
    assert m["allocation.all.allocated"] == made + 3, m
    assert m["allocation.all.freed"] == freed + 1, m
    assert m["allocation.all.current"] == 2, m
    # Two blocks live at 1..3 MiB of 4 MiB mapped: 2 MiB free in two 1 MiB spans.
    assert m["reserved_bytes.all.current"] == 4 * MIB, m
    assert m["tensor_arena.free_bytes"] == 2 * MIB, m
    assert m["tensor_arena.largest_free_block"] == MIB, m
    assert abs(m["tensor_arena.fragmentation"] - 0.5) < 1e-9, m
    # More than the simulated device's 1 GiB (inside the address range
    # reserved): refused after the cache is given back, counted.
    assert m["num_ooms"] == 0, m
    for n in (1, 2):
        assert arena.alloc(1536 * MIB, 0, 0) == 0
        assert "device memory" in arena.last_error(), arena.last_error()
        assert arena.memory_stats(0)["num_ooms"] == n
    for p in blocks[1:]:
        arena.free(p, MIB, 0, 0)

    # ONNX Runtime's CUDA provider options: the library's entry points,
    # called here through the addresses as ONNX Runtime calls them.
    import ctypes

    opts = arena.ort_cuda_provider_options(0, cudnn_conv_algo_search="DEFAULT")
    assert opts["device_id"] == "0" and opts["cudnn_conv_algo_search"] == "DEFAULT", opts
    assert "user_compute_stream" not in opts, opts
    ort_alloc = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t)(int(opts["gpu_external_alloc"]))
    ort_free = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(int(opts["gpu_external_free"]))
    ort_empty = ctypes.CFUNCTYPE(None)(int(opts["gpu_external_empty_cache"]))
    # This arena served blocks on streams (the calls above): ONNX Runtime
    # with its stream unknown would share it unordered, and is refused.
    assert not ort_alloc(5 * MIB)
    assert "ONNX Runtime" in arena.last_error() and "stream" in arena.last_error(), arena.last_error()
    # With its compute stream given, its blocks are tagged with it.
    opts = arena.ort_cuda_provider_options(0, stream=0x5EED)
    assert opts["user_compute_stream"] == str(0x5EED), opts
    p = ort_alloc(5 * MIB)
    assert p and arena.memory_allocated(0) == 5 * MIB, arena.last_error()
    ort_free(p)
    ort_empty()
    assert arena.memory_allocated(0) == 0
    try:
        arena.ort_cuda_provider_options(64)
        raise AssertionError("a device out of range must raise")
    except RuntimeError as e:
        assert "64" in str(e), e

    # Errors come back as exceptions, never crashes.
    try:
        with arena.run("a"):
            with arena.run("b"):
                pass
        raise AssertionError("nested runs must raise")
    except RuntimeError as e:
        assert "run" in str(e), e
    assert arena.alloc(0) == 0
    assert arena.alloc(-1) == 0 and "negative" in arena.last_error()
    arena.free(12345)
    assert "not a live block" in arena.last_error(), arena.last_error()
    kept = arena.alloc(MIB, 0, 0)
    arena.free(arena.alloc(5 * MIB, 0, 0), 5 * MIB, 0, 0)
    mapped = arena.memory_reserved(0)
    assert mapped >= 6 * MIB, mapped
    released = arena.shrink_to(0, 0)
    assert released == mapped - 2 * MIB, (released, mapped)
    assert arena.memory_reserved(0) == 2 * MIB, "the granule of the live block stays"
    assert arena.shrink_to(0, 0) == 0, "nothing left to release"
    arena.free(kept, MIB, 0, 0)
    assert arena.shrink_to(0, 0) == 2 * MIB
    assert arena.stats(0)["arena"]["in_use"] == 0
    assert arena.memory_reserved(0) == 0
    try:
        arena.stats(99)
        raise AssertionError("a device out of range must raise")
    except RuntimeError as e:
        assert "99" in str(e), e

    # Plans outlive the process: device 0's saved, loaded by device 3 (as
    # the next process would), which is planned from its first run.
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        assert arena.load_plans(d, "batch-model", device=3) == 0, "no file yet: nothing, no error"
        assert arena.save_plans(d, "batch-model", device=0) > 0
        assert arena.load_plans(d, "batch-model", device=3) >= 2
        one_run3 = [n * 4 for n in sizes]
        with arena.run(("batch", 16), device=3):
            live = [arena.alloc(n, 3, 0) for n in one_run3]
            for p, n in zip(live, one_run3):
                arena.free(p, n, 3, 0)
        s3 = arena.stats(3)
        assert s3["last_plan"] == "Exact" and s3["last_run"]["planned"], s3["last_run"]
        try:
            arena.load_plans(os.path.join(d, "missing"), "batch-model", options="torch=other", device=4)
            raise AssertionError("an unusable store must raise")
        except RuntimeError as e:
            assert "does not exist" in str(e), e
        # Another setting's store is a file of its own: nothing to load.
        assert arena.load_plans(d, "batch-model", options="torch=other", device=4) == 0
        assert arena.stats(4)["plans"]["plans"] == 0
    print("tensor_arena_cuda selftest: ok")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
