#!/usr/bin/env python3
"""Checks that a plan never costs more than no plan, on real traces.

For each trace given (default: traces/*.trace and traces/ort/*.trace), in
three orders -- as recorded, ascending by lower bound (every shape larger
than the ones before: each prediction extrapolates), and as recorded with
labels that explain nothing (run1, run2, ...: keys made of request
counters) -- runs `tensor-arena replay --strategy arena,planned --json`
(each strategy in its own child process) and prints, per trace and order:

- peak RSS growth of the process, planned and arena (MiB), and planned's
  against the largest lower bound;
- the worst hw/lb of a predicted run that kept its plan;
- the worst high-water of a run that fell back (a prediction left, or its
  own shape's exact plan left: "left"), against the dynamic arena's
  high-water on the same run (in bytes over it);
- the plan counts (exact/predicted/fell back/left/dynamic).

Usage: tools/plan_goals.py [--bin target/release/tensor-arena] [--shrink never] [TRACE...]
Exit status 0; the table is the result (goals are judged by the reader and
quoted in BENCHMARKS.md with this command).
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

MIB = 1 << 20
GRANULE = 2 * MIB  # the largest commit step (a huge page)


def parse(path):
    header, runs = [], []
    with open(path) as f:
        for line in f:
            if line.startswith("run "):
                runs.append([line.split(" ", 1)[1].strip(), []])
            elif line.startswith("#"):
                if not runs:
                    header.append(line.rstrip("\n"))
            elif line.strip() and runs:
                runs[-1][1].append(line.rstrip("\n"))
    return header, runs


def lower_bound(ops):
    sizes, live, peak = {}, 0, 0
    for op in ops:
        parts = op.split()
        if parts[0] == "alloc":
            sizes[parts[1]] = int(parts[2])
            live += int(parts[2])
            peak = max(peak, live)
        elif parts[0] == "free":
            live -= sizes.pop(parts[1], 0)
    return peak


def write(header, runs, path, relabel=False):
    with open(path, "w") as f:
        first = header[0] if header else "# trace v1 model=x"
        fields = [p for p in first.split() if not p.startswith("input=")]
        f.write(" ".join(fields) + "\n")
        for line in header[1:]:
            f.write(line + "\n")
        for i, (label, ops) in enumerate(runs):
            f.write("run %s\n" % (("run%d" % (i + 1)) if relabel else label))
            for op in ops:
                f.write(op + "\n")


def replay(binary, path, shrink):
    out = subprocess.run(
        [binary, "replay", "--trace", path, "--strategy", "arena,planned", "--json",
         "--shrink", shrink],
        check=True, capture_output=True, text=True).stdout
    return {s["name"]: s for s in json.loads(out)["strategies"]}


def judge(name, order, res):
    arena, planned = res["arena"], res["planned"]
    grow = lambda s: (s["peak_rss_bytes"] - s["baseline_rss_bytes"]) / MIB
    lb = max(r["lower_bound"] for r in planned["runs"]) / MIB
    worst_kept, worst_fell, counts = 0.0, None, {}
    for p, a in zip(planned["runs"], arena["runs"]):
        served = p.get("plan") or ""
        kind = served.split(" ")[0].rstrip(",") if served else "?"
        # A run that left its own shape's plan ("exact, left (...)") is
        # judged as one that fell back: it, too, must cost no more than
        # the dynamic run.
        if served.startswith("exact, left"):
            kind = "left"
        counts[kind] = counts.get(kind, 0) + 1
        if kind == "predicted":
            worst_kept = max(worst_kept, p["high_water"] / p["lower_bound"])
        if kind in ("fell", "left"):
            over = p["high_water"] - a["high_water"]
            worst_fell = over if worst_fell is None else max(worst_fell, over)
    print("%-28s %-9s %9.1f %9.1f %7.3f %7.3f %10s %s" % (
        name, order, grow(planned), grow(arena), grow(planned) / max(lb, 1e-9),
        worst_kept,
        "-" if worst_fell is None else "%+.2f" % (worst_fell / MIB),
        "/".join("%s %d" % kv for kv in sorted(counts.items()))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/tensor-arena")
    ap.add_argument("--shrink", default="never")
    ap.add_argument("traces", nargs="*")
    a = ap.parse_args()
    traces = a.traces or sorted(glob.glob("traces/*.trace") + glob.glob("traces/ort/*.trace"))
    print("%-28s %-9s %9s %9s %7s %7s %10s %s" % (
        "trace", "order", "planned", "arena", "pl/lb", "kept", "fell MiB", "plans"))
    print("%-28s %-9s %9s %9s %7s %7s %10s" % (
        "", "", "peak MiB", "peak MiB", "", "hw/lb", "over dyn"))
    with tempfile.TemporaryDirectory() as tmp:
        for path in traces:
            header, runs = parse(path)
            name = os.path.basename(path)
            orders = {
                "recorded": (runs, False),
                "ascending": (sorted(runs, key=lambda r: lower_bound(r[1])), False),
                "labels": (runs, True),
            }
            for order, (rs, relabel) in orders.items():
                if len(rs) < 2 and order != "recorded":
                    continue
                out = os.path.join(tmp, "%s-%s.trace" % (name, order))
                write(header, rs, out, relabel)
                try:
                    judge(name, order, replay(a.bin, out, a.shrink))
                except subprocess.CalledProcessError as e:
                    print("%s %s: replay failed: %s" % (name, order, e.stderr.strip()[:200]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
