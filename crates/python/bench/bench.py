#!/usr/bin/env python3
"""Measurements of tensor_arena.onnxruntime against onnxruntime, one
configuration per process (run.sh runs them all). Prints one JSON line.

    python bench.py ocr      --mode {ort,ort-arena-off,ta} [--images 64]
    python bench.py magika   --mode {ort,ort-arena-off,ta} [--files 300]
    python bench.py threads  --mode {ort,ort-arena-off,ort-nospin,ta,ta-nospin,ta-sd50,...} [--threads 16]
    python bench.py ocr_threads --mode {ort,ta} [--images 32] [--threads 8] [--timeline]   (one RapidOCR engine shared by the threads)
    python bench.py overhead --mode {ort,ort-arena-off,ta} [--runs 1000]
    python bench.py paired   --mode ta [--runs 2000]   (both in one process, alternating)
    python bench.py outputs  --mode {ort,ta-copy,ta-view} --keep {drop,all}

Modes: `ort` is onnxruntime with its defaults (CPU arena on), `ort-arena-off`
the same with `enable_cpu_mem_arena = False`, `ta` tensor_arena.onnxruntime
(through patch() where a library makes the sessions) with its defaults, and
`ta-` with options: `-view` (outputs as views), `-wN` (a pool of N workers),
`-nothp` (no transparent huge pages). Session options (`ort-` and `ta-`
alike): `-nospin` (intra-op spinning off), `-sdN` (intra-op threads spin
N us), `-boN` (their spin backoff cap N), `-fss` / `-nofss`
(`session.force_spinning_stop` 1 / 0). Memory: peak RSS of
the process (getrusage), RSS now (/proc/self/status).
"""

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
ASSETS = Path(os.environ.get("TENSOR_ARENA_ORT_ASSETS", HERE.parents[2] / "target" / "ort-assets"))


def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_s():
    """CPU seconds of the process so far (user + system): on a shared
    machine, the cost that other processes' load does not change."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def configure_ta(mode):
    """`ta` with options: `-view` (outputs as views), `-wN` (N workers),
    `-nothp` (no transparent huge pages), `-copy` (the default),
    `-noshare` (each worker serves all its blocks), `-shareN` (blocks of
    N bytes or more from the arena the workers share)."""
    from tensor_arena import onnxruntime as ta
    kw = {}
    for part in mode.split("-")[1:]:
        if part == "view":
            kw["outputs"] = "view"
        elif part == "nothp":
            kw["huge_pages"] = False
        elif part == "thp":
            kw["huge_pages"] = True
        elif part in ("nospin", "fss", "nofss") or part.startswith("sd") or part.startswith("bo"):
            pass  # a session option (`session_kw`)
        elif part == "heap":
            ta.system_heap(mmap_threshold=131072, arena_max=2)
        elif part in ("follow", "window", "never"):
            kw["shrink"] = part
        elif part == "noshare":
            kw["share_large_blocks"] = False
        elif part.startswith("share"):
            kw["share_large_blocks"] = int(part[5:])
        elif part.startswith("w"):
            kw["workers"] = int(part[1:])
    if kw:
        ta.configure(**kw)


def session_class(mode):
    """The class and options maker of a mode."""
    if mode.startswith("ta"):
        configure_ta(mode)
        from tensor_arena import onnxruntime as ta
        return ta.InferenceSession
    import onnxruntime as ort
    return ort.InferenceSession


def options(mode):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.enable_cpu_mem_arena = mode != "ort-arena-off"
    if "-nospin" in mode:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if "-fss" in mode:
        so.add_session_config_entry("session.force_spinning_stop", "1")
    if "-nofss" in mode:
        so.add_session_config_entry("session.force_spinning_stop", "0")
    for part in mode.split("-")[1:]:
        if part.startswith("sd"):
            so.add_session_config_entry("session.intra_op.spin_duration_us", part[2:])
        elif part.startswith("bo"):
            so.add_session_config_entry("session.intra_op.spin_backoff_max", part[2:])
    return so


def session_kw(mode):
    """The options a mode's sessions are made with: onnxruntime's own for
    `ort` modes; for `ta` modes none, or the intra-op pool's spinning off
    (`-nospin`)."""
    if not mode.startswith("ta"):
        return {"sess_options": options(mode)}
    if any(p in ("nospin", "fss", "nofss") or p[:2] in ("sd", "bo") for p in mode.split("-")[1:]):
        return {"sess_options": options(mode)}
    return {}


def set_ort_arena(mode):
    """onnxruntime's arena as the mode says, for sessions a library makes
    (rapidocr turns it off itself; `ort` turns it back on)."""
    import onnxruntime as ort
    if mode.startswith("ta"):
        configure_ta(mode)
        from tensor_arena import onnxruntime as ta
        return ta.patch()
    original = ort.SessionOptions

    class Options(original):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.enable_cpu_mem_arena = mode != "ort-arena-off"

        def __setattr__(self, name, value):
            if name == "enable_cpu_mem_arena":
                value = mode != "ort-arena-off"
            super().__setattr__(name, value)

    for mod in list(sys.modules.values()):
        if getattr(mod, "SessionOptions", None) is original:
            mod.SessionOptions = Options
    ort.SessionOptions = Options
    return None


def digest(obj):
    return hashlib.sha256(repr(obj).encode()).hexdigest()[:16]


def ocr(args):
    from render import images
    imgs = images(args.images, seed=7)
    import rapidocr_onnxruntime  # noqa: F401  (binds onnxruntime's names)
    patch = set_ort_arena(args.mode)
    from rapidocr_onnxruntime import RapidOCR
    base = rss_mib()
    engine = RapidOCR()
    sessions = rss_mib()
    t0 = time.perf_counter()
    results = []
    for img in imgs:
        r, _ = engine(img)
        results.append(r)
    total = time.perf_counter() - t0
    end = rss_mib()
    time.sleep(args.idle)
    idle = rss_mib()
    if patch:
        patch.undo()
    return dict(images=len(imgs), pixels=sum(i.shape[0] * i.shape[1] for i in imgs),
                time_s=round(total, 3), peak_mib=round(peak_mib(), 1), before_sessions_mib=round(base, 1),
                sessions_mib=round(sessions, 1), end_mib=round(end, 1), idle_mib=round(idle, 1),
                idle_s=args.idle, lines=sum(len(r or []) for r in results), digest=digest(results))


def magika(args):
    root = HERE.parents[2]
    files = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True).stdout.split()
    files = sorted(p for p in files if (root / p).is_file())[: args.files]
    import onnxruntime  # noqa: F401
    patch = set_ort_arena(args.mode)
    from magika import Magika
    m = Magika()
    sessions = rss_mib()
    t0 = time.perf_counter()
    res = m.identify_paths([root / p for p in files])
    total = time.perf_counter() - t0
    out = [(r.output.label, round(float(r.score), 6)) for r in res]
    if patch:
        patch.undo()
    return dict(files=len(files), time_s=round(total, 3), peak_mib=round(peak_mib(), 1),
                sessions_mib=round(sessions, 1), digest=digest(out))


def ocr_threads(args):
    """One RapidOCR engine shared by `--threads` threads over `--images`
    rendered pages; with tensor-arena, the arenas' live and reserved peaks
    from `stats()` too (what admission and the pool's trimming decide)."""
    from render import images
    imgs = images(args.images, seed=7)
    import rapidocr_onnxruntime  # noqa: F401  (binds onnxruntime's names)
    patch = set_ort_arena(args.mode)
    from rapidocr_onnxruntime import RapidOCR
    engine = RapidOCR()
    sessions = rss_mib()
    results = [None] * len(imgs)
    next_i = iter(range(len(imgs)))
    lock = threading.Lock()
    errors = []

    def client():
        try:
            while True:
                with lock:
                    i = next(next_i, None)
                if i is None:
                    return
                results[i], _ = engine(imgs[i])
        except BaseException as e:
            errors.append(repr(e))

    # --timeline: the arenas' reserved and allocated bytes, the runs in
    # flight and the process's RSS, sampled every 2 ms, their maxima per
    # half second.
    samples, sampling = [], [args.timeline and args.mode.startswith("ta")]

    def sampler():
        import tensor_arena.onnxruntime as ta
        while sampling[0]:
            st = ta.stats()
            samples.append((time.perf_counter(), st["reserved_current"], st["allocated_current"],
                            st["runs_in_flight"], rss_mib()))
            time.sleep(0.002)

    t0 = time.perf_counter()
    watch = threading.Thread(target=sampler)
    if sampling[0]:
        watch.start()
    ts = [threading.Thread(target=client) for _ in range(args.threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    total = time.perf_counter() - t0
    if sampling[0]:
        sampling[0] = False
        watch.join()
    end = rss_mib()
    time.sleep(min(args.idle, 5.0))
    after = rss_mib()
    arenas = {}
    if args.mode.startswith("ta"):
        import tensor_arena.onnxruntime as ta
        st = ta.stats()
        arenas = {k: round(st[k] / 2**20, 1) for k in ("allocated_peak", "reserved_peak")}
        arenas.update({k: st.get(k) for k in ("runs_in_flight_peak", "admission_waits", "retried_alone", "admitted_peak")})
    if samples:
        mib = 2**20
        windows = {}
        for t, r, a, n, rss in samples:
            w = windows.setdefault(int((t - t0) / 0.5), [0, 0, 0, 0])
            w[0], w[1], w[2] = max(w[0], round(r / mib)), max(w[1], round(a / mib)), max(w[2], n)
            w[3] = max(w[3], round(rss))
        arenas["timeline"] = [[k / 2 + 0.5, *windows[k]] for k in sorted(windows)]
        at = max(samples, key=lambda x: x[1])
        arenas["reserved_peak_sampled"] = dict(at_s=round(at[0] - t0, 2), reserved=round(at[1] / mib),
                                               allocated=round(at[2] / mib), in_flight=at[3])
    if patch:
        patch.undo()
    return dict(images=len(imgs), threads=args.threads, time_s=round(total, 3), peak_mib=round(peak_mib(), 1),
                sessions_mib=round(sessions, 1), end_mib=round(end, 1), after_5s_mib=round(after, 1),
                errors=errors[:3], lines=sum(len(r or []) for r in results), digest=digest(results), **arenas)


def det_rec_requests(n):
    rng = np.random.default_rng(11)
    reqs = []
    for i in range(n):
        if i % 3 == 0:
            h, w = rng.integers(10, 31, 2) * 32
            reqs.append(("det", (1, 3, int(h), int(w))))
        else:
            b = int(rng.integers(1, 7))
            reqs.append(("rec", (b, 3, 48, int(rng.integers(4, 25)) * 32)))
    return reqs


def threads(args):
    cls = session_class(args.mode)
    kw = session_kw(args.mode)
    sess = {k: cls(str(ASSETS / f"ppocr_{k}.onnx"), **kw) for k in ("det", "rec")}
    reqs = det_rec_requests(args.requests)
    inputs = {}
    hashes = [None] * len(reqs)
    next_i = iter(range(len(reqs)))
    lock = threading.Lock()
    errors = []

    def client():
        try:
            while True:
                with lock:
                    i = next(next_i, None)
                if i is None:
                    return
                kind, shape = reqs[i]
                x = np.random.default_rng(i).standard_normal(shape).astype(np.float32)
                out = sess[kind].run(None, {"x": x})
                hashes[i] = hashlib.sha256(out[0].tobytes()).hexdigest()[:16]
        except BaseException as e:
            errors.append(repr(e))

    sessions = rss_mib()
    t0 = time.perf_counter()
    ts = [threading.Thread(target=client) for _ in range(args.threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    total = time.perf_counter() - t0
    del inputs
    return dict(threads=args.threads, requests=len(reqs), time_s=round(total, 3), rps=round(len(reqs) / total, 2),
                peak_mib=round(peak_mib(), 1), sessions_mib=round(sessions, 1), errors=errors[:3],
                digest=digest(hashes))


def overhead(args):
    cls = session_class(args.mode)
    kw = session_kw(args.mode)
    sess = cls(str(ASSETS / "ppocr_cls.onnx"), **kw)
    x = np.random.default_rng(0).standard_normal((1, 3, 48, 192)).astype(np.float32)
    feed = {"x": x}
    for _ in range(100):
        sess.run(None, feed)
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter_ns()
        sess.run(None, feed)
        times.append(time.perf_counter_ns() - t0)
    return dict(runs=args.runs, median_us=round(statistics.median(times) / 1000, 1),
                p10_us=round(sorted(times)[len(times) // 10] / 1000, 1),
                p90_us=round(sorted(times)[len(times) * 9 // 10] / 1000, 1), peak_mib=round(peak_mib(), 1))


def paired(args):
    """Per-run overhead with the machine's load cancelled: onnxruntime's
    session and the mode's in one process, runs alternating, each side's
    median."""
    import onnxruntime as ort
    cls = session_class(args.mode)
    path = str(ASSETS / "ppocr_cls.onnx")
    a = ort.InferenceSession(path)
    b = cls(path)
    feed = {"x": np.random.default_rng(0).standard_normal((1, 3, 48, 192)).astype(np.float32)}
    for _ in range(100):
        a.run(None, feed)
        b.run(None, feed)
    ta_, tb = [], []
    for _ in range(args.runs):
        t0 = time.perf_counter_ns()
        a.run(None, feed)
        t1 = time.perf_counter_ns()
        b.run(None, feed)
        t2 = time.perf_counter_ns()
        ta_.append(t1 - t0)
        tb.append(t2 - t1)
    ma, mb = statistics.median(ta_), statistics.median(tb)
    return dict(runs=args.runs, ort_median_us=round(ma / 1000, 1), median_us=round(mb / 1000, 1),
                ratio=round(mb / ma, 3))


def outputs(args):
    cls = session_class(args.mode)
    sess = cls(str(ASSETS / "ppocr_det.onnx"))
    rng = np.random.default_rng(5)
    kept = []
    t0 = time.perf_counter()
    for i in range(args.images):
        h, w = rng.integers(10, 41, 2) * 32
        x = rng.standard_normal((1, 3, int(h), int(w))).astype(np.float32)
        out = sess.run(None, {"x": x})
        if args.keep == "all":
            kept.append(out)
        del out
    total = time.perf_counter() - t0
    return dict(images=args.images, keep=args.keep, kept_mib=round(sum(o[0].nbytes for o in kept) / 2**20, 1),
                time_s=round(total, 3), peak_mib=round(peak_mib(), 1), end_mib=round(rss_mib(), 1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["ocr", "ocr_threads", "magika", "threads", "overhead", "paired", "outputs"])
    p.add_argument("--mode", required=True)
    p.add_argument("--images", type=int, default=64)
    p.add_argument("--files", type=int, default=300)
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--requests", type=int, default=96)
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--idle", type=float, default=15.0)
    p.add_argument("--timeline", action="store_true",
                   help="ocr_threads: the arenas' reserved and allocated MiB, runs in flight, RSS MiB: maxima per half second")
    p.add_argument("--keep", choices=["drop", "all"], default="drop")
    args = p.parse_args()
    c0 = cpu_s()
    r = globals()[args.what](args)
    r = dict(what=args.what, mode=args.mode, cpu_s=round(cpu_s() - c0, 2), **r)
    print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
