"""Mixed sizes under one memory limit: thumbnails and large pages through
one PP-OCR det session from many threads, runs admitted by what they need.
Samples the pool's admission every 10 ms and writes the concurrency over
time as an SVG plot and a JSON summary: how many runs were in flight while
a large page ran, and while only thumbnails did.

    python mixed.py [--limit 1G] [--threads 8] [--workers 4] [--large 12]
                    [--small 48] [--out target/mixed]

Needs the wheel, numpy and onnxruntime (for the library); the det model
from tools/fetch-ort-assets.sh (TENSOR_ARENA_ORT_ASSETS, default
target/ort-assets).
"""

import argparse
import json
import os
import random
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ASSETS = Path(os.environ.get("TENSOR_ARENA_ORT_ASSETS", HERE.parents[2] / "target" / "ort-assets"))
SMALL = (1, 3, 96, 128)  # a thumbnail
LARGE = (1, 3, 1536, 2048)  # a page as det sees it


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", default="1G")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--large", type=int, default=12)
    ap.add_argument("--small", type=int, default=48)
    ap.add_argument("--out", default=str(HERE.parents[2] / "target" / "mixed"))
    args = ap.parse_args()
    import tensor_arena.onnxruntime as ta

    ta.configure(workers=args.workers, budget=ta.Budget(args.limit))
    sess = ta.InferenceSession(str(ASSETS / "ppocr_det.onnx"))
    name = sess.get_inputs()[0].name
    rng = random.Random(5)
    jobs = ["large"] * args.large + ["small"] * args.small
    rng.shuffle(jobs)
    inputs = {k: np.random.default_rng(1).random(s, dtype=np.float32) for k, s in (("small", SMALL), ("large", LARGE))}
    # One of each first: the plans (and so the needs) are known.
    for k in ("small", "large"):
        sess.run(None, {name: inputs[k]})
    lock = threading.Lock()
    it = iter(jobs)
    samples, done = [], threading.Event()

    def sampler():
        t0 = time.perf_counter()
        while not done.is_set():
            s = ta.stats()
            samples.append((time.perf_counter() - t0, s["runs_in_flight"], s["admitted_current"], s["queued"]))
            time.sleep(0.01)

    def client():
        while True:
            with lock:
                k = next(it, None)
            if k is None:
                return
            sess.run(None, {name: inputs[k]})

    sp = threading.Thread(target=sampler)
    sp.start()
    ts = [threading.Thread(target=client) for _ in range(args.threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    elapsed = time.perf_counter() - t0
    done.set()
    sp.join()
    st = ta.stats()
    large_need = max(x[2] for x in samples) / max(1, max(x[1] for x in samples))
    # A large page is in flight where what is promised passes what every
    # worker's thumbnail together could need.
    small_cap = 4 * args.workers * (SMALL[2] * SMALL[3] * 3 * 4 * 40)
    with_large = [x[1] for x in samples if x[2] > small_cap and x[1] > 0]
    only_small = [x[1] for x in samples if x[2] <= small_cap and x[1] > 0]
    summary = {
        "limit": args.limit, "threads": args.threads, "workers": args.workers,
        "large": args.large, "small": args.small, "seconds": round(elapsed, 2),
        "in_flight_with_a_large_page_mean": round(sum(with_large) / max(1, len(with_large)), 2),
        "in_flight_with_a_large_page_max": max(with_large, default=0),
        "in_flight_thumbnails_only_mean": round(sum(only_small) / max(1, len(only_small)), 2),
        "in_flight_thumbnails_only_max": max(only_small, default=0),
        "admitted_peak_mib": round(st["admitted_peak"] / 2**20, 1),
        "reserved_peak_mib": round(st["reserved_peak"] / 2**20, 1),
        "admission_waits": st["admission_waits"], "admission_passes": st["admission_passes"],
        "refused": st["refused"], "retried_alone": st["retried_alone"], "ooms": st["ooms"],
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "mixed.json").write_text(json.dumps({"summary": summary, "samples": samples}))
    (out / "mixed.svg").write_text(svg(samples, args, large_need))
    print(json.dumps(summary))


def svg(samples, args, large_need):
    """Runs in flight (steps) and MiB promised (line) over time."""
    w, h, pad = 900, 300, 40
    tmax = max(x[0] for x in samples) or 1
    rmax = max(args.workers, 1)
    mmax = max(x[2] for x in samples) or 1
    X = lambda t: pad + (w - 2 * pad) * t / tmax  # noqa: E731
    Yr = lambda r: h - pad - (h - 2 * pad) * r / rmax  # noqa: E731
    Ym = lambda m: h - pad - (h - 2 * pad) * m / mmax  # noqa: E731
    runs = " ".join(f"{X(t):.1f},{Yr(r):.1f}" for t, r, _, _ in samples)
    mib = " ".join(f"{X(t):.1f},{Ym(m):.1f}" for t, _, m, _ in samples)
    ticks = "".join(f'<text x="{pad - 8}" y="{Yr(r) + 4:.1f}" text-anchor="end" font-size="11">{r}</text>'
                    for r in range(rmax + 1))
    return f"""<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif">
<rect width="{w}" height="{h}" fill="white"/>
<text x="{pad}" y="18" font-size="13">det runs in flight (black) and MiB promised (blue, top {mmax / 2**20:.0f} MiB) under a {args.limit} budget, {args.threads} threads, {args.large} pages {LARGE[2]}x{LARGE[3]} and {args.small} thumbnails {SMALL[2]}x{SMALL[3]}</text>
<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#888"/>
<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="#888"/>
{ticks}
<text x="{w - pad}" y="{h - 10}" text-anchor="end" font-size="11">{tmax:.1f} s</text>
<polyline points="{mib}" fill="none" stroke="#3366cc" stroke-width="1"/>
<polyline points="{runs}" fill="none" stroke="black" stroke-width="1.2"/>
</svg>
"""


if __name__ == "__main__":
    main()
