"""`InferenceSession.run` releases the GIL while ONNX Runtime runs: runs of
several Python threads on a pool of workers overlap in time.

How overlap is seen without timing anything: a run takes a worker of the
process's pool inside the part that runs without the GIL and gives it back
before it takes the GIL again, and the pool counts every checkout that found
all its workers busy (`stats()["waits"]`). With one more thread than
workers, a checkout waits only if that many runs were in flight at once.
A run that held the GIL throughout would hold its worker only while no other
thread can run Python, so no checkout could ever find every worker busy:
the count would stay 0 however long the test tried. Rounds are repeated
until a wait is seen (a loaded machine may let one run end before the next
thread reaches its own), within a generous limit."""

import threading
import time

import numpy as np
import pytest

from conftest import same
from tensor_arena import onnxruntime as ta

# Rounds of `workers + 1` concurrent runs tried before giving up, and the
# time allowed for them (either limit ends the test).
MAX_ROUNDS = 100
DEADLINE_S = 300


@pytest.mark.parametrize("workers", [1, 2])
def test_runs_of_more_threads_than_workers_overlap(assets, workers):
    before = ta.config()
    ta.configure(workers=workers)
    try:
        sess = ta.InferenceSession(str(assets / "ppocr_det.onnx"))
        # Large enough that a run takes a while (most of it without the GIL).
        x = np.random.default_rng(0).standard_normal((1, 3, 480, 480)).astype(np.float32)
        expected = sess.run(None, {"x": x})
        threads = workers + 1
        waits0 = ta.stats()["waits"]
        errors = []
        deadline = time.monotonic() + DEADLINE_S
        rounds = 0
        while ta.stats()["waits"] == waits0:
            assert rounds < MAX_ROUNDS and time.monotonic() < deadline, (
                f"{rounds} rounds of {threads} threads on {workers} worker(s): "
                "no run ever found every worker busy (does run hold the GIL?)"
            )
            rounds += 1
            start = threading.Barrier(threads)

            def client():
                try:
                    start.wait()
                    same(expected, sess.run(None, {"x": x}))
                except BaseException as e:  # reported below, in the test's thread
                    errors.append(e)

            pool = [threading.Thread(target=client) for _ in range(threads)]
            for t in pool:
                t.start()
            for t in pool:
                t.join(timeout=600)
            assert not any(t.is_alive() for t in pool), "a run hung"
            assert not errors, errors[0]
        st = ta.stats()
        assert st["workers"] == workers
        assert st["waits"] > waits0
    finally:
        ta.configure(workers=before["workers"])
