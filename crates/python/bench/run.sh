#!/usr/bin/env bash
# Runs bench.py's measurements, each configuration in its own process,
# modes interleaved round by round (the machine is shared: medians of the
# rounds are reported). Results: one JSON line per process in OUT (default
# target/python-bench.jsonl), then a summary (bench/summary.py).
# Needs: the wheel, onnxruntime==1.31.1, rapidocr-onnxruntime==1.4.4,
# magika, pillow in the Python running it (PY, default python3).
# Usage: crates/python/bench/run.sh [ROUNDS] [OUT]
set -euo pipefail
cd "$(dirname "$0")"
py="${PY:-python3}"
rounds="${1:-2}"
out="${2:-../../../target/python-bench.jsonl}"
: > "$out"
run() { "$py" bench.py "$@" | tail -n 1 | tee -a "$out"; }
for r in $(seq "$rounds"); do
  for m in ort ort-arena-off ta; do run overhead --mode "$m" --runs 1000; done
  run paired --mode ta --runs 2000
  for m in ort ort-arena-off ta; do run magika --mode "$m" --files 300; done
  for m in ort ort-arena-off ta; do run threads --mode "$m" --threads 16 --requests 96; done
  for m in ort ort-arena-off ta; do run ocr --mode "$m" --images 64 --idle 15; done
done
for k in drop all; do for m in ort ta-copy ta-view; do run outputs --mode "$m" --keep "$k" --images 48; done; done
"$py" summary.py "$out"
