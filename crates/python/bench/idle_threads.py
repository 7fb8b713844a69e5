#!/usr/bin/env python3
"""What N threads that ran a model leave resident once idle.

    python idle_threads.py {ta,ort} THREADS [MODEL]

THREADS threads each run MODEL (default $TENSOR_ARENA_ORT_ASSETS/ppocr_rec.onnx,
input (batch, 3, 48, 192)) 25 times at batches 1 to 8, then the process idles
6 s (past the arenas' decay). Prints RSS (MiB) with the session made, after
the runs and after the idle time, with the resident MiB of each anonymous
4 MiB mapping (large blocks glibc mapped on their own), one JSON line."""

import json
import os
import sys
import threading
import time

import numpy as np

ASSETS = os.environ.get("TENSOR_ARENA_ORT_ASSETS", "target/ort-assets")


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return round(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


def four_mib_maps() -> list:
    out, current = [], False
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and ":" not in parts[0]:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                current = (hi - lo) >> 20 == 4 and len(parts) <= 5
            elif line.startswith("Rss:") and current:
                out.append(round(int(parts[1]) / 1024, 1))
    return out


def main() -> None:
    mode, threads = sys.argv[1], int(sys.argv[2])
    model = sys.argv[3] if len(sys.argv) > 3 else os.path.join(ASSETS, "ppocr_rec.onnx")
    if mode == "ta":
        import tensor_arena.onnxruntime as rt
        sess = rt.InferenceSession(model)
    else:
        import onnxruntime as rt
        sess = rt.InferenceSession(model, providers=["CPUExecutionProvider"])
    made = rss_mib()

    def work(t: int) -> None:
        for i in range(25):
            x = np.random.default_rng(i).random((1 + (i + t) % 8, 3, 48, 192), dtype=np.float32)
            sess.run(None, {"x": x})

    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    after = rss_mib()
    time.sleep(6)
    print(json.dumps(dict(mode=mode, threads=threads, session_mib=made, after_runs_mib=after,
                          idle_mib=rss_mib(), four_mib_maps=four_mib_maps())))


if __name__ == "__main__":
    main()
