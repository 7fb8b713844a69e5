#!/usr/bin/env bash
# Fetches what crates/ort's tests, benchmarks and the `tensor-arena ort`
# examples need, from PyPI only (`pip download --no-deps`), into a cache
# directory (default target/ort-assets, git-ignored):
#   libonnxruntime.so           from onnxruntime==1.31.1
#   libonnxruntime-1.20.so      from onnxruntime==1.20.1 (too old: the tests
#                               check that it is refused with a clear error)
#   ppocr_cls.onnx, ppocr_rec.onnx, ppocr_det.onnx
#                               from rapidocr-onnxruntime==1.4.4
#   silero_vad_16k_sequence.onnx from silero-vad==6.2.3
#   densenet121.onnx            (onnx/backend/test/data/light/light_densenet121.onnx)
#                               from onnx==1.19.1
#   densenet121_batch.onnx      the same with its batch dimension free
#                               (tools/onnx-free-batch.py), so it runs at
#                               several batch sizes
# Safe to run again: files already present are kept. Prints the directory.
# Usage: tools/fetch-ort-assets.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-${TENSOR_ARENA_ORT_ASSETS:-target/ort-assets}}"
mkdir -p "$dir/wheels"
dir="$(cd "$dir" && pwd)"

# One fetch at a time (test binaries may start it concurrently).
if command -v flock >/dev/null; then
  exec 9>"$dir/.lock"
  flock 9
fi

python=python3
command -v "$python" >/dev/null || python=python
command -v "$python" >/dev/null || { echo "fetch-ort-assets: python3 not found" >&2; exit 1; }

# file-in-cache  wheel-requirement  path-inside-the-wheel
assets=(
  "libonnxruntime.so|onnxruntime==1.31.1|onnxruntime/capi/libonnxruntime.so.1.31.1"
  "libonnxruntime-1.20.so|onnxruntime==1.20.1|onnxruntime/capi/libonnxruntime.so.1.20.1"
  "ppocr_cls.onnx|rapidocr-onnxruntime==1.4.4|rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"
  "ppocr_rec.onnx|rapidocr-onnxruntime==1.4.4|rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"
  "ppocr_det.onnx|rapidocr-onnxruntime==1.4.4|rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"
  "silero_vad_16k_sequence.onnx|silero-vad==6.2.3|silero_vad/data/silero_vad_16k_sequence.onnx"
  "densenet121.onnx|onnx==1.19.1|onnx/backend/test/data/light/light_densenet121.onnx"
)

for entry in "${assets[@]}"; do
  IFS='|' read -r name req member <<<"$entry"
  [ -s "$dir/$name" ] && continue
  pkg="${req%%==*}"
  wheel="$(ls "$dir/wheels/" 2>/dev/null | grep -i "^${pkg//-/_}-${req##*==}-" | head -n1 || true)"
  if [ -z "$wheel" ]; then
    echo "fetch-ort-assets: pip download --no-deps $req" >&2
    # The same x86-64 Linux wheels whatever the local Python: only the files
    # inside are used (nothing is installed or imported).
    "$python" -m pip download --no-deps --disable-pip-version-check -q -d "$dir/wheels" \
      --only-binary=:all: --python-version 3.11 --implementation cp \
      --abi cp311 --abi abi3 --abi none \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform any "$req" >&2
    wheel="$(ls "$dir/wheels/" | grep -i "^${pkg//-/_}-${req##*==}-" | head -n1)"
  fi
  "$python" - "$dir/wheels/$wheel" "$member" "$dir/$name" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst)
import os
os.replace(out + ".part", out)
PY
done
if [ ! -s "$dir/densenet121_batch.onnx" ]; then
  "$python" tools/onnx-free-batch.py "$dir/densenet121.onnx" "$dir/densenet121_batch.onnx.part"
  mv "$dir/densenet121_batch.onnx.part" "$dir/densenet121_batch.onnx"
fi
echo "$dir"
