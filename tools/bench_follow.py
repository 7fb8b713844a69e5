#!/usr/bin/env python3
"""Memory following the input down, measured side by side.

Runs crates/ort's `follow` example once per (sequence, strategy, repetition),
each in a process of its own, strategies interleaved within a repetition,
and prints a Markdown table:
  - RSS after each small run, and its ratio to (RSS after session creation
    + that run's peak in use + its input), for the tensor-arena strategies;
    the same ratio with RSS less LazyFree (memory given back with MADV_FREE,
    `follow1-lazy`, which the kernel takes first when it needs memory);
  - the median time of the large runs after the first (each process's
    median, then the median over repetitions), and its ratio to ort-arena's.

Usage: tools/bench_follow.py [--repeat N] [--pairs N] [--only TEXT] [--binary PATH] [--assets DIR]
"""
import argparse, os, statistics, subprocess, sys

SEQUENCES = [
    ("PP-OCR det 1280/320", "ppocr_det.onnx", "1x3x1280x1280", "1x3x320x320"),
    ("PP-OCR rec 1600/160", "ppocr_rec.onnx", "1x3x48x1600", "1x3x48x160"),
    ("DenseNet-121 8/1", "densenet121_batch.onnx", "8x3x224x224", "1x3x224x224"),
]
STRATEGIES = ["ort-arena", "ort-shrink", "keep", "follow1", "follow2", "follow1-lazy"]


def one(binary, assets, strategy, model, large, small, pairs):
    out = subprocess.run(
        [binary, os.path.join(assets, "libonnxruntime.so"), os.path.join(assets, model),
         strategy, large, small, str(pairs)],
        check=True, capture_output=True, text=True).stdout
    lines = out.split("\n")
    session = int(lines[0].split()[1])
    runs = []
    for l in lines[1:]:
        if not l.strip():
            continue
        f = l.split()
        i, label, ms, rss, peak, inp = f[:6]
        lazy = int(f[9]) if len(f) > 9 else 0
        # RSS less what the kernel may take back at once (MADV_FREE'd).
        runs.append((int(i), label, float(ms), int(rss), int(peak), int(inp), int(rss) - lazy))
    return session, runs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--only", default="", help="only the sequences whose name contains this text")
    ap.add_argument("--binary", default="target/release/examples/follow")
    ap.add_argument("--assets", default=os.environ.get("TENSOR_ARENA_ORT_ASSETS", "target/ort-assets"))
    a = ap.parse_args()
    print("| sequence | strategy | RSS after small runs (MiB, median) | RSS after small / (session + peak in use + input), worst | same, RSS less LazyFree | large run ms (median) | large run vs ort-arena |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, model, large, small in SEQUENCES:
        if a.only not in name:
            continue
        res = {s: [] for s in STRATEGIES}
        for r in range(a.repeat):
            order = STRATEGIES[r % len(STRATEGIES):] + STRATEGIES[:r % len(STRATEGIES)]
            for s in order:
                print(f"{name}: {s} repetition {r + 1}", file=sys.stderr)
                res[s].append(one(a.binary, a.assets, s, model, large, small, a.pairs))
        base = None
        for s in STRATEGIES:
            small_rss, ratios, used_ratios, large_ms = [], [], [], []
            for session, runs in res[s]:
                larges = [ms for (i, lab, ms, rss, pk, inp, used) in runs if i % 2 == 0][1:]
                large_ms.append(statistics.median(larges))
                for (i, lab, ms, rss, pk, inp, used) in runs:
                    if i % 2 == 1:
                        small_rss.append(rss)
                        if pk:
                            ratios.append(rss / (session + pk + inp))
                            used_ratios.append(used / (session + pk + inp))
            ms = statistics.median(large_ms)
            if s == "ort-arena":
                base = ms
            worst = f"{max(ratios):.3f}" if ratios else "-"
            used = f"{max(used_ratios):.3f}" if used_ratios else "-"
            print(f"| {name} | {s} | {statistics.median(small_rss) / 2**20:.1f} | {worst} | {used} | {ms:.1f} | {ms / base:.3f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
