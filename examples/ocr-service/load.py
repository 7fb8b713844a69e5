#!/usr/bin/env python3
"""A load test for the OCR service (app.py): CLIENTS threads post rendered
text images (pages, receipts, screenshots, signs; PIL, DejaVu fonts where
present) until REQUESTS were sent, while the server's RSS is read from its
/memory endpoint; then it waits IDLE seconds and reads it again.

    python load.py --url http://127.0.0.1:8000 --clients 32 --requests 256 --idle 10

Prints one JSON line: status counts, the server's RSS with its sessions made
(before the load), its peak (VmHWM, which counts mapped files too), the
largest RssAnon sampled every 0.25 s (what a memory cgroup charges, less
page cache), its RSS after the idle wait, in MiB, and the arena's limit. Exit status 1 if any answer was not 200, 413 or 503,
or a connection failed (a 413 is the service refusing a request that
cannot fit in its memory limit even alone: expected under a tight limit).
"""

from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import threading
import time
import urllib.error
import urllib.request
from collections import Counter

from PIL import Image, ImageDraw, ImageFont

WORDS = (
    "tensor arena memory budget invoice total amount due date receipt item qty price "
    "tax subtotal cash change thank you welcome order number table server model batch "
    "2026 11 24 15:30 $12.50 #4471 42 7 100% 3.14 ACME Corp. Ltd. Inc. No. Tel. Fax"
).split()
FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
# (width range, height range, font size range)
KINDS = [((600, 1000), (800, 1280), (14, 26)), ((320, 480), (700, 1280), (14, 20)),
         ((900, 1280), (500, 800), (16, 30)), ((200, 640), (80, 240), (24, 48))]


def render(rng: random.Random, kind: int) -> bytes:
    """A PNG of random words."""
    (w0, w1), (h0, h1), (f0, f1) = KINDS[kind % len(KINDS)]
    w, h = rng.randint(w0, w1), rng.randint(h0, h1)
    img = Image.new("RGB", (w, h), (250, 250, 245))
    draw = ImageDraw.Draw(img)
    y = rng.randint(4, 30)
    while True:
        size = rng.randint(f0, f1)
        if y > h - 2 * size:
            break
        try:
            font = ImageFont.truetype(FONT, size)
        except OSError:
            font = ImageFont.load_default()
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8)))
        draw.text((rng.randint(4, max(5, w // 6)), y), text, fill=(20, 20, 20), font=font)
        y += int(size * rng.uniform(1.3, 2.2))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.load(r)


def post(url: str, body: bytes) -> tuple:
    """The response's status and, for an error, its body's text."""
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            r.read()
            return r.status, None
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")[:400]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--images", type=int, default=16, help="distinct images rendered")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds to wait after the load")
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()

    rng = random.Random(a.seed)
    images = [render(rng, i) for i in range(a.images)]
    before = get(a.url + "/memory")
    counts: Counter = Counter()
    errors: list = []  # the first distinct error bodies (413's reasons)
    latencies: list = []  # seconds of each answered request
    lock = threading.Lock()
    next_i = [0]
    rss_max = [before["rss_kib"]["VmRSS"]]
    anon_max = [before["rss_kib"]["RssAnon"]]
    done = threading.Event()

    def client() -> None:
        while True:
            with lock:
                i = next_i[0]
                if i >= a.requests:
                    return
                next_i[0] += 1
            message = None
            t = time.monotonic()
            try:
                code, message = post(a.url + "/ocr", images[i % len(images)])
            except OSError as e:
                code = f"error: {type(e).__name__}"
            with lock:
                counts[code] += 1
                if code == 200:
                    latencies.append(time.monotonic() - t)
                if message is not None and len(errors) < 3 and message not in errors:
                    errors.append(message)

    def sampler() -> None:
        while not done.wait(0.25):
            try:
                rss = get(a.url + "/memory")["rss_kib"]
            except OSError:
                continue
            rss_max[0] = max(rss_max[0], rss["VmRSS"])
            anon_max[0] = max(anon_max[0], rss["RssAnon"])

    s = threading.Thread(target=sampler, daemon=True)
    s.start()
    t0 = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.monotonic() - t0
    done.set()
    s.join()
    after_load = get(a.url + "/memory")
    time.sleep(a.idle)
    idle = get(a.url + "/memory")
    mib = lambda kib: round(kib / 1024, 1)  # noqa: E731
    print(json.dumps({
        "clients": a.clients, "requests": a.requests, "seconds": round(seconds, 1),
        "status": {str(k): v for k, v in sorted(counts.items(), key=str)},
        "answered_per_s": round(counts[200] / seconds, 3),
        "latency_p50_s": round(statistics.median(latencies), 2) if latencies else None,
        "latency_p99_s": round(sorted(latencies)[int(0.99 * (len(latencies) - 1))], 2) if latencies else None,
        "errors": errors,
        "rss_sessions_mib": mib(before["rss_kib"]["VmRSS"]),
        "rss_peak_mib": mib(idle["rss_kib"]["VmHWM"]),
        "rss_sampled_max_mib": mib(rss_max[0]),
        "anon_sampled_max_mib": mib(anon_max[0]), "file_idle_mib": mib(idle["rss_kib"]["RssFile"]),
        "rss_after_load_mib": mib(after_load["rss_kib"]["VmRSS"]),
        "rss_idle_mib": mib(idle["rss_kib"]["VmRSS"]), "idle_s": a.idle,
        "arena_reserved_peak_mib": mib(idle["arena"]["reserved_peak"] / 1024),
        "limit": idle["limit"], "arena_ooms": idle["arena"]["ooms"],
        "admission": {k: idle["arena"].get(k) for k in (
            "admission_room", "admitted_peak", "runs_in_flight_peak", "admission_waits",
            "retried_alone", "refused", "processes_sharing_limit")},
    }))
    bad = [k for k in counts if k not in (200, 413, 503)]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
