#!/usr/bin/env python3
"""Times the planned path against the dynamic arena on real traces, and
against an older build of the planned path, in one sitting.

For each trace (default: traces/ort/*.trace and traces/*-mixed.trace), as
recorded and in ascending order of lower bound (every shape new and larger
than the ones before), runs `tensor-arena replay --strategy S --shrink never
--json` for S in arena and planned with this build, and planned with the
`--base` build if given, each in its own process, interleaved, `--reps`
times; prints the median total time of the runs (lookup to learned, page
faults included) and the ratios. The planned strategy's refits are made
between runs, off the runs' clock (as tensor-arena-ort's background thread
makes them); "+learning" adds their time back, for the whole CPU cost.

Usage: tools/plan_time.py [--bin target/release/tensor-arena] [--base OLD_BIN] [--reps 5] [TRACE...]
"""

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from plan_goals import lower_bound, parse, write  # noqa: E402


def total(binary, path, strategy):
    """The runs' total time and the refits' time between them, in ms."""
    out = subprocess.run(
        [binary, "replay", "--trace", path, "--strategy", strategy, "--json", "--shrink", "never"],
        check=True, capture_output=True, text=True).stdout
    summary = json.loads(out)["strategies"][0]["summary"]
    return summary["total_nanos"] / 1e6, summary.get("learn_nanos", 0) / 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/tensor-arena")
    ap.add_argument("--base")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("traces", nargs="*")
    a = ap.parse_args()
    traces = a.traces or sorted(glob.glob("traces/ort/*.trace") + glob.glob("traces/*-mixed.trace"))
    configs = [("arena", a.bin, "arena"), ("planned", a.bin, "planned")]
    if a.base:
        configs.append(("base planned", a.base, "planned"))
    print("%-28s %-9s %s %12s %s %22s" % (
        "trace", "order", " ".join("%14s" % c[0] for c in configs),
        "planned/arena", "planned/base" if a.base else "", "planned+learning/arena"))
    with tempfile.TemporaryDirectory() as tmp:
        for path in traces:
            header, runs = parse(path)
            name = os.path.basename(path)
            orders = {"recorded": runs, "ascending": sorted(runs, key=lambda r: lower_bound(r[1]))}
            for order, rs in orders.items():
                if len(rs) < 2 and order != "recorded":
                    continue
                out = os.path.join(tmp, "%s-%s.trace" % (name, order))
                write(header, rs, out)
                times = {c[0]: [] for c in configs}
                whole = []
                for _ in range(a.reps):
                    for label, binary, strategy in configs:
                        runs, learn = total(binary, out, strategy)
                        times[label].append(runs)
                        if label == "planned":
                            whole.append(runs + learn)
                med = {k: statistics.median(v) for k, v in times.items()}
                print("%-28s %-9s %s %12.3f %s %22.3f" % (
                    name, order, " ".join("%11.1f ms" % med[c[0]] for c in configs),
                    med["planned"] / med["arena"],
                    ("%12.3f" % (med["planned"] / med["base planned"])) if a.base else "",
                    statistics.median(whole) / med["arena"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
