"""16 Python threads sharing one session: outputs identical to onnxruntime's,
and the arenas bounded by the pool whatever the number of threads."""

import threading

import numpy as np
import onnxruntime as ort
import pytest

from conftest import same
from tensor_arena import onnxruntime as ta

ROUNDS = 3
SHAPES = {
    "ppocr_det.onnx": [(1, 3, 320, 320), (1, 3, 480, 352), (1, 3, 256, 384)],
    "ppocr_rec.onnx": [(6, 3, 48, 320), (6, 3, 48, 480), (1, 3, 48, 320), (6, 3, 48, 160)],
}


@pytest.mark.parametrize("model", sorted(SHAPES))
@pytest.mark.parametrize("workers", [2, 3])
def test_sixteen_threads_one_session(assets, model, workers):
    path = str(assets / model)
    before = ta.config()
    ta.configure(workers=workers)
    try:
        ref = ort.InferenceSession(path)
        sess = ta.InferenceSession(path)
        feeds = [
            {"x": np.random.default_rng(i).standard_normal(s).astype(np.float32)}
            for i, s in enumerate(SHAPES[model])
        ]
        expected = [ref.run(None, f) for f in feeds]
        errors = []
        seen_arenas = []
        start = threading.Barrier(16)

        def client(t):
            try:
                start.wait()
                for k in range(ROUNDS):
                    i = (t + k) % len(feeds)
                    same(expected[i], sess.run(None, feeds[i]))
                    seen_arenas.append(ta.stats()["arenas"])
            except BaseException as e:  # reported below, in the test's thread
                errors.append(e)

        ta.reset_peak_stats()
        threads = [threading.Thread(target=client, args=(t,)) for t in range(16)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=600)
        assert not any(th.is_alive() for th in threads), "a run hung"
        assert not errors, errors[0]
        st = ta.stats()
        assert st["workers"] == workers
        # Arenas alive at any point: this pool's workers and the one their
        # large blocks share (the previous pool's went with it: no run held
        # them, outputs are copied out).
        assert max(seen_arenas) <= workers + 1, (max(seen_arenas), workers)
        assert st["arenas"] <= workers + 1
        # Runs that started beside others took their large blocks (every
        # model here has blocks of 1 MiB or more) from the shared arena.
        assert st["large_blocks_allocations"] > 0, st
        assert st["checkouts"] >= 16 * ROUNDS
        # Both peaks counted as they happen: what the arenas committed
        # together covered what they held live together at every moment.
        assert st["reserved_peak"] >= st["allocated_peak"] > 0, st
    finally:
        ta.configure(workers=before["workers"])
