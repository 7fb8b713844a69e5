"""The Python module's ctypes layer against the library with the simulated
driver (no GPU, no torch). Run: python3 test_ctypes.py PATH_TO_LIBRARY."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tensor_arena_cuda  # noqa: E402


def main(path):
    try:
        tensor_arena_cuda.Arena(path + ".missing")
        raise AssertionError("a missing library must raise")
    except FileNotFoundError as e:
        assert "not found" in str(e)
    try:
        tensor_arena_cuda.Arena(path, driver="no-such-driver")
        raise AssertionError("an unknown driver must raise")
    except RuntimeError as e:
        assert "unknown driver" in str(e), e
    arena = tensor_arena_cuda.Arena(path, driver="simulated")
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

    sizes = [3 << 20, 1 << 20, 5 << 20, 4096, 2 << 20]
    one_run(("batch", 16), [n * 4 for n in sizes])
    one_run(("batch", 1), sizes)
    big = arena.stats(0)
    assert big["arena"]["reserved"] >= 20 << 20, big
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
    assert shrunk["arena"]["reserved"] <= need + (2 << 20), shrunk["arena"]
    assert shrunk["mapped"] == shrunk["arena"]["reserved"]
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
    assert arena.shrink_to(0, 0) >= 0
    assert arena.stats(0)["arena"]["in_use"] == 0
    print("python ctypes layer: ok")


if __name__ == "__main__":
    main(sys.argv[1])
