#!/usr/bin/env python3
"""Summarises run.sh's JSON lines: per measurement and mode, the median of
the rounds (and every round), with ratios to onnxruntime's defaults."""

import json
import statistics
import sys
from collections import defaultdict

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
by = defaultdict(list)
for r in rows:
    key = (r["what"], r["mode"], r.get("keep", ""))
    by[key].append(r)

FIELDS = {
    "overhead": ["median_us", "p90_us", "peak_mib"],
    "magika": ["time_s", "cpu_s", "peak_mib", "digest"],
    "threads": ["rps", "time_s", "cpu_s", "peak_mib", "digest"],
    "ocr": ["time_s", "cpu_s", "peak_mib", "sessions_mib", "idle_mib", "digest"],
    "outputs": ["time_s", "peak_mib", "end_mib", "kept_mib"],
    "paired": ["ort_median_us", "median_us", "ratio"],
}
for what, fields in FIELDS.items():
    keys = [k for k in by if k[0] == what]
    if not keys:
        continue
    print(f"\n{what}")
    base = {}
    order = ["ort", "ort-arena-off", "ta", "ta-copy", "ta-view"]
    for k in sorted(keys, key=lambda k: (k[2], order.index(k[1]) if k[1] in order else 99, k[1])):
        rs = by[k]
        cells = []
        for f in fields:
            vals = [r[f] for r in rs if f in r]
            if not vals:
                continue
            if isinstance(vals[0], str):
                cells.append(f"{f}={'/'.join(sorted(set(vals)))}")
                continue
            med = statistics.median(vals)
            if k[1] == "ort":
                base[(f, k[2])] = med
            ratio = ""
            if (f, k[2]) in base and base[(f, k[2])]:
                ratio = f" ({med / base[(f, k[2])]:.2f}x)"
            cells.append(f"{f}={med:g}{ratio} [{', '.join(f'{v:g}' for v in vals)}]")
        print(f"  {k[1]:14} {k[2]:5} " + "  ".join(cells))
