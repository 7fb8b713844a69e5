"""Summarises `tensor-arena ort --json` documents of the same sequence
(one per repetition): per strategy, the RSS after session creation, the
largest RSS after a run, its ratio to (session RSS + the largest run's lower
bound), the peak RSS, and the median time per run after warm-up (the first
two runs of each shape left out: the first is recorded, the second is the
first planned one, and ONNX Runtime's memory pattern is also made on its
second run), with its ratio to ort-arena's. Medians over
repetitions. Usage: python3 ort-bench-summary.py REPORT.json...
"""
import json
import statistics as st
import sys

MIB = 1024 * 1024
docs = [json.load(open(p)) for p in sys.argv[1:]]
names = [s["strategy"] for s in docs[0]["strategies"]]
# The largest run's lower bound: the most bytes live at once through the
# allocator (tensor-arena strategies measure it; the same tensors for all).
lb = max(
    (r["peak_in_use"] or 0)
    for d in docs
    for s in d["strategies"]
    for r in s["runs"]
)


def per_strategy(name):
    sess, maxrss, peak, times = [], [], [], {}
    for d in docs:
        s = next(x for x in d["strategies"] if x["strategy"] == name)
        runs = s["runs"]
        sess.append(s["session_rss_bytes"])
        maxrss.append(max(r["rss_bytes"] for r in runs[2:]))
        peak.append(s.get("process_peak_rss_bytes", runs[-1]["peak_rss_bytes"]))
        labels = []
        for r in runs:
            if r["label"] not in labels:
                labels.append(r["label"])
        for label in labels:
            ts = [r["nanos"] for r in runs if r["label"] == label][2:]
            times.setdefault(label, []).extend(ts)
    return (
        st.median(sess),
        st.median(maxrss),
        st.median(peak),
        {k: st.median(v) / 1e6 for k, v in times.items()},
    )


rows = {n: per_strategy(n) for n in names}
ref = rows.get("ort-arena", rows[names[0]])[3]
print(f"largest run's lower bound: {lb / MIB:.1f} MiB; {len(docs)} repetitions")
labels = list(ref)
head = " | ".join(f"ms {l} (vs ort-arena)" for l in labels)
print(f"| strategy | session RSS MiB | RSS after runs MiB (max, steady state) | / (session + lower bound) | peak RSS MiB | {head} |")
print("|" + "---|" * (5 + len(labels)))
for n, (sess, maxrss, peak, times) in rows.items():
    cells = " | ".join(f"{times[l]:.1f} ({times[l] / ref[l]:.2f}x)" for l in labels)
    print(
        f"| {n} | {sess / MIB:.1f} | {maxrss / MIB:.1f} | {maxrss / (sess + lb):.3f} | {peak / MIB:.1f} | {cells} |"
    )
