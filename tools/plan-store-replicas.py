#!/usr/bin/env python3
"""Two replicas of an OCR service sharing one plan store (BENCHMARKS.md,
"Plans that outlive the process"): replica one, a process, serves the
first requests of crates/cli/data/ocr-stream.txt (RapidOCR's det, cls and
rec runs per image) through tensor_arena.onnxruntime with
TENSOR_ARENA_PLANS=DIR and exits (its plans saved at exit); replica two, a
fresh process, serves the next requests (other images, other shapes).
Prints, for replica two, how its runs were served (exact, predicted, fell
back, dynamic), and whether every output equals onnxruntime's, with the
store and, for comparison, with an empty one.

    python3 tools/plan-store-replicas.py [FIRST [NEXT]]   (default 44 20)

Needs the wheel (or the module) and onnxruntime installed, and the models
in target/ort-assets (tools/fetch-ort-assets.sh).
"""
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ASSETS = Path(os.environ.get("TENSOR_ARENA_ORT_ASSETS", ROOT / "target" / "ort-assets"))

REPLICA = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import onnxruntime as ort
    from tensor_arena import onnxruntime as ta
    assets, stream, lo, hi = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    models = {m: f"{assets}/ppocr_{m}.onnx" for m in ("det", "cls", "rec")}
    ours = {m: ta.InferenceSession(p) for m, p in models.items()}
    ref = {m: ort.InferenceSession(p, providers=["CPUExecutionProvider"]) for m, p in models.items()}
    lines = [l.split() for l in open(stream) if l.strip() and not l.startswith("#")]
    counts, same, rng = {}, True, np.random.default_rng(lo)
    for words in lines[lo:hi]:
        model = None
        for w in words:
            if w in models:
                model = w
                continue
            shape = [int(d) for d in w.split("x")]
            x = rng.random(shape, dtype=np.float32)
            name = ours[model].get_inputs()[0].name
            got = ours[model].run(None, {name: x})
            want = ref[model].run(None, {name: x})
            same &= all(a.tobytes() == b.tobytes() for a, b in zip(got, want))
            last = ours[model].last_run()
            how = "fell back" if last["fell_back"] else last["plan"]
            counts[how] = counts.get(how, 0) + 1
    print(json.dumps({"runs": counts, "outputs_identical": bool(same)}))
    """
)


def replica(store, lo, hi):
    env = dict(os.environ, TENSOR_ARENA_PLANS=str(store))
    r = subprocess.run(
        [sys.executable, "-c", REPLICA, str(ASSETS), str(ROOT / "crates/cli/data/ocr-stream.txt"),
         str(lo), str(hi)], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def show(name, result):
    runs = result["runs"]
    total = sum(runs.values())
    planned = runs.get("exact", 0) + runs.get("predicted", 0)
    print(f"{name}: {total} runs, {planned / total:.1%} on a plan to their end "
          f"(exact {runs.get('exact', 0)}, predicted {runs.get('predicted', 0)}), "
          f"fell back {runs.get('fell back', 0)}, dynamic {runs.get('dynamic', 0)}; "
          f"outputs identical to onnxruntime's: {result['outputs_identical']}")


first = int(sys.argv[1]) if len(sys.argv) > 1 else 44
nxt = int(sys.argv[2]) if len(sys.argv) > 2 else 20
with tempfile.TemporaryDirectory() as shared, tempfile.TemporaryDirectory() as empty:
    show(f"replica one, requests 0-{first - 1}", replica(shared, 0, first))
    show(f"replica two, requests {first}-{first + nxt - 1}, shared store",
         replica(shared, first, first + nxt))
    show(f"replica two, requests {first}-{first + nxt - 1}, empty store",
         replica(empty, first, first + nxt))
