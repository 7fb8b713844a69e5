#!/usr/bin/env bash
# The ONNX Runtime benchmark of BENCHMARKS.md: PP-OCRv4 rec, DenseNet-121 and
# PP-OCRv4 det on alternating large and small inputs, every strategy, REPS repetitions
# (default 3), summarised by tools/ort-bench-summary.py.
# Usage: tools/ort-bench.sh [REPS]
set -euo pipefail
cd "$(dirname "$0")/.."
reps="${1:-3}"
assets="$(tools/fetch-ort-assets.sh)"
export ORT_DYLIB_PATH="$assets/libonnxruntime.so"
cargo build --release -q -p tensor-arena-cli
out="$(mktemp -d)"
rec="1x3x48x1280 1x3x48x160"
dn="8x3x224x224 1x3x224x224"
det="1x3x1280x1280 1x3x320x320"
for i in $(seq "$reps"); do
  # shellcheck disable=SC2086
  target/release/tensor-arena ort --model "$assets/ppocr_rec.onnx" --inputs $rec $rec $rec $rec $rec $rec --json >"$out/rec-$i.json"
  # shellcheck disable=SC2086
  target/release/tensor-arena ort --model "$assets/densenet121_batch.onnx" --inputs $dn $dn $dn $dn $dn $dn --json >"$out/dn-$i.json"
  # shellcheck disable=SC2086
  target/release/tensor-arena ort --model "$assets/ppocr_det.onnx" --inputs $det $det $det $det $det $det --json >"$out/det-$i.json"
done
echo "## PP-OCRv4 rec: 1x3x48x1280, 1x3x48x160, repeated 6 times"
python3 tools/ort-bench-summary.py "$out"/rec-*.json
echo
echo "## DenseNet-121: 8x3x224x224, 1x3x224x224, repeated 6 times"
python3 tools/ort-bench-summary.py "$out"/dn-*.json
echo
echo "## PP-OCRv4 det: 1x3x1280x1280, 1x3x320x320, repeated 6 times"
python3 tools/ort-bench-summary.py "$out"/det-*.json
rm -rf "$out"
