#!/usr/bin/env bash
# Builds the `tensor-arena` Python wheel (crates/python: maturin, fetched
# from PyPI by pip as the build backend), then, in fresh virtual
# environments:
#   1. the wheel with numpy only: `import tensor_arena` works and
#      `import tensor_arena.onnxruntime` raises a clear ImportError;
#   2. the wheel with crates/python/tests/requirements.txt (onnxruntime,
#      onnx, pytest, rapidocr-onnxruntime, fastapi, uvicorn, gunicorn,
#      ray[serve]; pinned): the pytest suite (with examples/servers, whose
#      Ray test starts and stops a local Ray cluster), run
#      from a directory outside the source tree so the installed package is
#      the one imported (checked);
#   3. the example service's install step (examples/ocr-service/install.sh)
#      and its test.
# The models come from tools/fetch-ort-assets.sh (run first here). Any
# failure fails the script; pytest's "no tests ran" (exit 5) fails it too,
# and the suite's conftest fails a run with a skipped test.
# Usage: tools/python-check.sh [OUT_DIR]   (the wheel is left in OUT_DIR if given)
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

python=python3
command -v "$python" >/dev/null || { echo "python-check: python3 not found" >&2; exit 1; }

assets="$(bash tools/fetch-ort-assets.sh)"

echo "python-check: building the wheel"
# Linked against glibc 2.28's symbols and tagged manylinux_2_28 once
# auditwheel allows it (tools/manylinux.sh).
# shellcheck source=tools/manylinux.sh
. tools/manylinux.sh
manylinux_setup "$work"
wheel="$(manylinux_build_python)"
echo "python-check: $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB)"

unset TENSOR_ARENA_ORT_LIB PYTHONPATH

echo "python-check: without onnxruntime (numpy only)"
"$python" -m venv "$work/bare" || { echo "python-check: python3 -m venv failed (install python3-venv)" >&2; exit 1; }
"$work/bare/bin/python" -m pip install --disable-pip-version-check -q "$wheel" "numpy==2.4.6"
(cd "$work" && "$work/bare/bin/python" - <<'PY'
import tensor_arena
try:
    import tensor_arena.onnxruntime
except ImportError as e:
    assert "pip install 'onnxruntime>=1.31'" in str(e) and "tools/dist.sh" in str(e), e
    print("python-check: ImportError as expected:", e)
else:
    raise SystemExit("python-check: tensor_arena.onnxruntime imported without onnxruntime")
PY
)

echo "python-check: fresh virtual environment with the test requirements"
"$python" -m venv "$work/venv"
py="$work/venv/bin/python"
"$py" -m pip install --disable-pip-version-check -q "$wheel" -r crates/python/tests/requirements.txt

mkdir "$work/run"
cp crates/python/tests/*.py "$work/run/"
# test_servers.py starts the example servers from their folder.
cp -r crates/python/examples/servers "$work/run/servers"
cd "$work/run"
"$py" - <<'PY'
import tensor_arena, tensor_arena.onnxruntime as ta
assert "site-packages" in tensor_arena.__file__, tensor_arena.__file__
print("python-check: imported", tensor_arena.__file__)
PY
TENSOR_ARENA_ORT_ASSETS="$assets" PYTHONDONTWRITEBYTECODE=1 "$py" -m pytest -p no:cacheprovider -q -rA .

# The example service's recipe (examples/ocr-service): the Dockerfile's
# install step (install.sh: pinned requirements, then the wheel with its
# extra, which must not move the pinned onnxruntime) into a fresh venv,
# then its test (uvicorn in a child process: answers, 400, 503 under
# TENSOR_ARENA_MEMORY_LIMIT=32M).
echo "python-check: the example service (examples/ocr-service/install.sh, test_service.py)"
"$python" -m venv "$work/service"
bash "$root/examples/ocr-service/install.sh" "$work/service/bin/python" "$(dirname "$wheel")"
"$work/service/bin/python" -m pip install --disable-pip-version-check -q "pytest==9.2.0"
mkdir "$work/service-run"
cp "$root/crates/python/tests/conftest.py" "$root/examples/ocr-service/test_service.py" "$work/service-run/"
(cd "$work/service-run" && OCR_SERVICE_DIR="$root/examples/ocr-service" PYTHONDONTWRITEBYTECODE=1 \
    "$work/service/bin/python" -m pytest -p no:cacheprovider -q -rA test_service.py)
if [ $# -ge 1 ]; then
  mkdir -p "$1"
  cp "$wheel" "$1/"
  echo "python-check: wheel copied to $1"
fi
echo "python-check: ok"
