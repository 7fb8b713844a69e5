#!/usr/bin/env bash
# Installs the OCR service's packages into PYTHON's environment: the pinned
# requirements.txt, then the tensor-arena wheel from WHEEL_DIR (built by
# tools/dist.sh) with its `onnxruntime` extra, which must leave the pinned
# onnxruntime where it is (the extra is a range, `onnxruntime>=1.31`; this
# script fails if the install moved it). Then checks that the service's
# imports work and prints the memory limit tensor-arena would use here.
# The Dockerfile's runtime stage runs it; so does CI (tools/python-check.sh,
# into a fresh virtual environment), so the recipe's steps are tested
# without docker.
# Usage: examples/ocr-service/install.sh PYTHON WHEEL_DIR
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: install.sh PYTHON WHEEL_DIR" >&2; exit 2; }
py="$1"
wheels=("$2"/tensor_arena-*.whl)
[ "${#wheels[@]}" -eq 1 ] && [ -f "${wheels[0]}" ] || {
    echo "install.sh: expected one tensor_arena-*.whl in $2 (tools/dist.sh builds it), got: ${wheels[*]}" >&2
    exit 1
}
here="$(cd "$(dirname "$0")" && pwd)"
pin="$(sed -n 's/^onnxruntime==//p' "$here/requirements.txt")"
pip=("$py" -m pip install --disable-pip-version-check -q)
"${pip[@]}" -r "$here/requirements.txt"
"${pip[@]}" "${wheels[0]}[onnxruntime]"
got="$("$py" -c 'import importlib.metadata as m; print(m.version("onnxruntime"))')"
[ "$got" = "$pin" ] || { echo "install.sh: onnxruntime moved from $pin to $got" >&2; exit 1; }
(cd "$here" && "$py" - <<'PY'
import fastapi, uvicorn, rapidocr_onnxruntime
import tensor_arena.onnxruntime as ta
import tensor_arena; print("install.sh: tensor-arena", tensor_arena.__version__, "memory limit here:", ta.memory_limit())
PY
)
echo "install.sh: ok (onnxruntime $got kept)"
