#!/usr/bin/env bash
# Builds the `tensor-arena` Python wheel (crates/python: maturin, fetched
# from PyPI by pip as the build backend), then, in fresh virtual
# environments:
#   1. the wheel with numpy only: `import tensor_arena` works and
#      `import tensor_arena.onnxruntime` raises a clear ImportError;
#   2. the wheel with crates/python/tests/requirements.txt (onnxruntime,
#      onnx, pytest, rapidocr-onnxruntime, fastapi, uvicorn, gunicorn;
#      pinned): the pytest suite (with examples/servers), run
#      from a directory outside the source tree so the installed package is
#      the one imported (checked).
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
"$python" -m pip wheel --no-deps --disable-pip-version-check -q -w "$work/dist" crates/python
wheels=("$work"/dist/tensor_arena-*.whl)
[ "${#wheels[@]}" -eq 1 ] && [ -f "${wheels[0]}" ] || { echo "python-check: expected one wheel, got: ${wheels[*]}" >&2; exit 1; }
wheel="$(manylinux_tag "${wheels[0]}")"
echo "python-check: $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB)"
case "$(basename "$wheel")" in
  *-abi3-*) ;;
  *) echo "python-check: the wheel is not abi3" >&2; exit 1 ;;
esac

unset TENSOR_ARENA_ORT_LIB PYTHONPATH

echo "python-check: without onnxruntime (numpy only)"
"$python" -m venv "$work/bare" || { echo "python-check: python3 -m venv failed (install python3-venv)" >&2; exit 1; }
"$work/bare/bin/python" -m pip install --disable-pip-version-check -q "$wheel" "numpy==2.4.6"
(cd "$work" && "$work/bare/bin/python" - <<'PY'
import tensor_arena
try:
    import tensor_arena.onnxruntime
except ImportError as e:
    assert "pip install 'tensor-arena[onnxruntime]'" in str(e), e
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
if [ $# -ge 1 ]; then
  mkdir -p "$1"
  cp "$wheel" "$1/"
  echo "python-check: wheel copied to $1"
fi
echo "python-check: ok"
