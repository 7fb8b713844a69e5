#!/usr/bin/env python3
"""Plans that outlive the process (BENCHMARKS.md, "Plans that outlive the
process"): replays det, rec and DenseNet traces with the `planned` strategy
in fresh processes, without a plan store and with one an earlier process
saved, and prints each run's plan and high water / lower bound and the
process's peak RSS growth.

For each model: (1) the whole trace, fresh; (2) the whole trace, fresh,
after an earlier process replayed it into the store; (3) the trace's later
runs (other shapes), fresh; (4) those runs, fresh, from a store an earlier
process filled with the trace's first runs only.

    cargo build --release -p tensor-arena-cli
    python3 tools/plan-store-bench.py [target/release/tensor-arena]
"""
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "target/release/tensor-arena")
TRACES = {
    "det": ("traces/ort/ppocr-det-sizes.trace", 3),
    "rec": ("traces/ort/ppocr-rec-widths.trace", 4),
    "densenet": ("traces/ort/densenet121-batches.trace", 3),
}


def split(src: Path, k: int, a: Path, b: Path) -> None:
    """Writes the first `k` runs of trace `src` to `a`, the rest to `b`."""
    lines = src.read_text().splitlines()
    header, comments, runs = lines[0], [], []
    for line in lines[1:]:
        if line.startswith("#"):
            comments.append(line)
        elif line.startswith("run "):
            runs.append([line])
        elif runs:
            runs[-1].append(line)
    m = re.search(r"input=(\S+)", header)
    inputs = m.group(1).split(",")
    for path, part, ins in ((a, runs[:k], inputs[:k]), (b, runs[k:], inputs[k:])):
        h = header.replace(m.group(0), "input=" + ",".join(ins))
        path.write_text("\n".join([h] + comments + [x for r in part for x in r]) + "\n")


def replay(trace, store=None):
    args = [BIN, "replay", "--json", "--strategy", "planned", "--trace", str(trace)]
    if store:
        args += ["--plans", str(store)]
    p = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        sys.exit(p.stderr)
    s = json.loads(p.stdout)["strategies"][0]
    runs = [(r["label"], r["plan"], r["high_water"] / r["lower_bound"]) for r in s["runs"]]
    sm = s["summary"]
    peak = (s["peak_rss_bytes"] - s["baseline_rss_bytes"]) / 2**20
    lb = sm["max_lower_bound"] / 2**20
    warn = [line for line in p.stderr.splitlines() if "plan store" in line]
    return runs, peak, lb, sm["plans"], warn


def show(name, result):
    runs, peak, lb, plans, warn = result
    counts = "/".join(str(plans[k]) for k in ("exact", "predicted", "fell_back", "dynamic"))
    print(f"{name:38} peak RSS growth {peak:7.1f} MiB = {peak / lb:.3f}x the largest lower bound "
          f"({lb:.1f} MiB); max hw/lb {max(r[2] for r in runs):.3f}; ex/pred/fell/dyn {counts}"
          + (f"; {warn}" if warn else ""))
    print("    " + "  ".join(f"{label} {plan.split(' ')[0]} {hw:.3f}" for label, plan, hw in runs))


with tempfile.TemporaryDirectory() as tmp:
    tmp = Path(tmp)
    store = tmp / "store"
    for model, (trace, k) in TRACES.items():
        a, b = tmp / f"{model}-a.trace", tmp / f"{model}-b.trace"
        split(ROOT / trace, k, a, b)
        shutil.rmtree(store, ignore_errors=True)
        show(f"{model}: fresh, no store", replay(ROOT / trace))
        replay(ROOT / trace, store)
        show(f"{model}: fresh, store of the same runs", replay(ROOT / trace, store))
        shutil.rmtree(store, ignore_errors=True)
        show(f"{model} later runs: fresh, no store", replay(b))
        replay(a, store)
        show(f"{model} later runs: store of first runs", replay(b, store))
