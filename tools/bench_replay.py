#!/usr/bin/env python3
"""Replay benchmark: each strategy in its own process, best of N, side by side.

For each trace and strategy, runs
    BINARY replay --trace TRACE --strategy S --shrink never --json
N times (a fresh process each time; the binary itself may run the strategy
in a child of its own), and reports per strategy the best (lowest) of:
  - time of the whole replay and of the runs after the first,
  - peak RSS growth of the process that ran the strategy (ru_maxrss of the
    process tree, minus the RSS before the first allocation) over the
    trace's largest lower bound,
  - minor page faults over the whole replay.

Usage:
    tools/bench_replay.py [--binary PATH] [--label NAME] [--repeat N]
                          [--strategies arena,planned,mimalloc,system]
                          [--extra '--huge-pages never'] [--out FILE] TRACE...

Prints a Markdown table (ratios of time to mimalloc's), and writes the raw
figures as JSON to --out when given. Progress goes to stderr.
"""

import argparse
import json
import os
import subprocess
import sys


def run_once(binary, trace, strategy, extra):
    """One replay in a fresh process; returns the parsed figures."""
    proc = subprocess.Popen(
        [binary, "replay", "--trace", trace, "--strategy", strategy,
         "--shrink", "never", "--json"] + extra,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{binary} failed on {trace} ({strategy}): exit {proc.returncode}")
    doc = json.loads(out)
    s = doc["strategies"][0]
    runs = s["runs"]
    nanos = [r["nanos"] for r in runs]
    faults = sum(r["minor_faults"] for r in runs)
    # Peak RSS of the process that ran the strategy: the binary's own report
    # when it has one (it runs each strategy in a child), else this
    # process's ru_maxrss from wait4 (KiB on Linux).
    peak = s.get("peak_rss_bytes")
    if peak is None:
        peak = usage.ru_maxrss * 1024
    baseline = s.get("baseline_rss_bytes")
    lb = max(r["lower_bound"] for r in runs)
    return {
        "total_ns": sum(nanos),
        "after_first_ns": sum(nanos[1:]),
        "faults": faults,
        "peak_rss": peak,
        "baseline_rss": baseline,
        "max_lower_bound": lb,
        "max_reserved": s["summary"]["max_reserved"],
        "backing_calls": s["summary"]["backing_calls"],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="target/release/tensor-arena")
    ap.add_argument("--label", default="")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--strategies", default="arena,planned,mimalloc,system")
    ap.add_argument("--baseline-rss", type=int, default=None,
                    help="RSS before the first allocation, for binaries that do not report it")
    ap.add_argument("--out", default=None, help="write the raw figures here as JSON")
    ap.add_argument("--extra", default="", help="more replay arguments, e.g. '--huge-pages never'")
    ap.add_argument("traces", nargs="+")
    args = ap.parse_args()
    strategies = args.strategies.split(",")
    results = {}
    for trace in args.traces:
        name = os.path.basename(trace).removesuffix(".trace")
        results[name] = {}
        for strategy in strategies:
            best = None
            for _ in range(args.repeat):
                r = run_once(args.binary, trace, strategy, args.extra.split())
                if best is None:
                    best = r
                else:
                    for k in ("total_ns", "after_first_ns", "faults", "peak_rss"):
                        best[k] = min(best[k], r[k])
            if best["baseline_rss"] is None:
                best["baseline_rss"] = args.baseline_rss or 0
            results[name][strategy] = best
            print(f"{args.label} {name} {strategy}: {best}", file=sys.stderr)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    print(f"| trace | strategy | whole replay | after the first run | vs mimalloc (whole / after first) "
          f"| peak RSS growth / largest lower bound | minor faults | memory-layer calls |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, by in results.items():
        mi = by.get("mimalloc")
        for strategy, r in by.items():
            ratio = ""
            if mi:
                ratio = (f"{r['total_ns'] / mi['total_ns']:.2f} / "
                         f"{r['after_first_ns'] / max(mi['after_first_ns'], 1):.2f}")
            growth = (r["peak_rss"] - r["baseline_rss"]) / r["max_lower_bound"]
            print(f"| {name} | {strategy} | {r['total_ns'] / 1e6:.1f} ms | {r['after_first_ns'] / 1e6:.2f} ms "
                  f"| {ratio} | {growth:.2f} | {r['faults']:,} | {r['backing_calls']:,} |")


if __name__ == "__main__":
    main()
