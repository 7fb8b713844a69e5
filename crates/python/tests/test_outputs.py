"""Outputs outlive the run. Copied (the default): NumPy owns them. As views
(configure(outputs="view")): the array's base holds the tensor, so its
arena block lives as long as the array, through shrinks, a new pool and the
session's end. Stats, plans and shrink from Python."""

import gc
import threading
import time

import numpy as np
import onnxruntime as ort
import pytest

from conftest import same
from tensor_arena import onnxruntime as ta


@pytest.fixture
def view_mode():
    before = ta.config()
    ta.configure(outputs="view")
    yield
    ta.configure(outputs=before["outputs"])


def test_views_keep_their_block_alive(assets, view_mode):
    path = str(assets / "ppocr_rec.onnx")
    ref = ort.InferenceSession(path)
    sess = ta.InferenceSession(path)
    feeds = [{"x": np.random.default_rng(i).standard_normal((2, 3, 48, w)).astype(np.float32)}
             for i, w in enumerate((320, 160, 640))]
    kept = [sess.run(None, f) for f in feeds]
    for out in kept:
        assert type(out[0].base).__name__ == "OutputTensor"
        assert not out[0].flags.owndata and out[0].flags.writeable
    assert ta.stats()["allocated_current"] > 0, "the views' blocks are live"
    ta.shrink(everything=True)
    ta.configure(workers=ta.config()["workers"])  # a new pool: the old workers go
    del sess
    gc.collect()
    for f, out in zip(feeds, kept):
        same(ref.run(None, f), out)
    sub = kept[0][0][0]  # a view of the view keeps it alive too
    del kept
    gc.collect()
    assert sub.shape == (80, 6625) or sub.ndim == 2
    float(sub.sum())


def test_copies_free_their_block_at_once(assets):
    sess = ta.InferenceSession(str(assets / "ppocr_cls.onnx"))
    x = np.zeros((6, 3, 48, 192), np.float32)
    out = sess.run(None, {"x": x})
    assert out[0].flags.owndata
    assert ta.stats()["allocated_current"] == 0


def test_stats_plans_and_shrink(assets):
    sess = ta.InferenceSession(str(assets / "ppocr_det.onnx"))
    ta.reset_peak_stats()
    big = np.zeros((1, 3, 640, 640), np.float32)
    small = np.zeros((1, 3, 160, 160), np.float32)
    sess.run(None, {"x": big})
    first = sess.last_run()
    assert first["plan"] in ("dynamic", "predicted") and first["allocations"] > 0
    sess.run(None, {"x": big})
    assert sess.last_run()["plan"] == "exact" and not sess.last_run()["fell_back"]
    st = ta.stats()
    for k in ("allocated_current", "allocated_peak", "reserved_current", "reserved_peak",
              "allocations_current", "allocations", "frees", "ooms", "arenas", "workers"):
        assert k in st, k
    assert st["allocated_peak"] >= first["peak_in_use"] > 0
    assert st["reserved_peak"] >= st["reserved_current"]
    peak = st["reserved_peak"]
    sess.run(None, {"x": small})
    ta.shrink(everything=True)
    after = ta.stats()
    assert after["reserved_current"] < peak
    ta.reset_peak_stats()
    assert ta.stats()["reserved_peak"] == ta.stats()["reserved_current"]
    assert sess.plan_stats()["plans"] >= 1


def test_configure_round_trips(assets):
    before = ta.config()
    try:
        ta.configure(workers=3, decay=0.5, shrink="follow", huge_pages=False, budget=ta.Budget(1 << 30))
        c = ta.config()
        assert (c["workers"], c["decay"], c["shrink"], c["huge_pages"]) == (3, 0.5, "follow", False)
        assert c["budget"].limit == 1 << 30
        sess = ta.InferenceSession(str(assets / "ppocr_cls.onnx"))
        x = np.zeros((1, 3, 48, 192), np.float32)
        ref = ort.InferenceSession(str(assets / "ppocr_cls.onnx"))
        same(ref.run(None, {"x": x}), sess.run(None, {"x": x}))
        ta.configure(decay=False, budget=False)
        assert ta.config()["decay"] is None and ta.config()["budget"] is None
    finally:
        ta.configure(workers=before["workers"], decay=before["decay"] or False, shrink=before["shrink"],
                     huge_pages=before["huge_pages"], budget=False)


def test_share_large_blocks_round_trips_and_bad_values_are_refused():
    before = ta.config()["share_large_blocks"]
    assert before == 1 << 20
    try:
        ta.configure(share_large_blocks=False)
        assert ta.config()["share_large_blocks"] is None
        ta.configure(share_large_blocks=4 << 20)
        assert ta.config()["share_large_blocks"] == 4 << 20
        for bad in (0, -1, True, "1M", 1.5):
            with pytest.raises((ta.InvalidArgument, TypeError)):
                ta.configure(share_large_blocks=bad)
        assert ta.config()["share_large_blocks"] == 4 << 20
    finally:
        ta.configure(share_large_blocks=before)


def test_huge_pages_default_follows_the_system(assets):
    # The default is "auto": huge pages only where the system's THP defrag
    # setting keeps direct compaction off the run's thread.
    before = ta.config()["huge_pages"]
    assert before == "auto"
    try:
        for value in (True, False, "auto"):
            ta.configure(huge_pages=value)
            assert ta.config()["huge_pages"] == value
        for bad in ("always", 1, None.__class__):
            with pytest.raises((ta.InvalidArgument, TypeError)):
                ta.configure(huge_pages=bad)
    finally:
        ta.configure(huge_pages=before)


def test_reserved_current_counts_a_run_in_flight(assets):
    """`reserved_current` is what the arenas hold now, a run in flight
    included: never less than what is allocated in them (counted at every
    alloc and free), not what they held at a run's end."""
    sess = ta.InferenceSession(str(assets / "ppocr_det.onnx"))
    ta.shrink(everything=True)
    before = ta.stats()["reserved_current"]
    x = np.random.default_rng(1).random((1, 3, 1280, 1280), dtype=np.float32)
    done = threading.Event()

    def run():
        try:
            sess.run(None, {"x": x})
        finally:
            done.set()

    t = threading.Thread(target=run)
    t.start()
    during = []
    while not done.is_set():
        st = ta.stats()
        if not done.is_set():  # read while the run was still in flight
            during.append((st["reserved_current"], st["allocated_current"]))
        time.sleep(0.002)
    t.join(timeout=120)
    assert during, "sampled during the run"
    short = [(r, a) for r, a in during if a > r]
    assert not short, f"reserved below allocated in {len(short)} of {len(during)} samples: {short[:3]}"
    assert max(r for r, _ in during) - before >= 64 << 20, (before, during[-3:])
    assert ta.stats()["reserved_peak"] >= max(r for r, _ in during)
