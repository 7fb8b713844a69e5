#!/usr/bin/env bash
# Builds crates/cuda's wheel (setuptools-rust, fetched from PyPI by pip as a
# build dependency), installs it into a fresh virtual environment, and runs
# the Python tests there against the library's simulated driver (no GPU, no
# torch: the MemPool test uses the stand-in in tools/gpu-check/fake). The
# tests run from a directory outside the source tree, so the installed
# package is the one imported; the script checks that it is. Any failure
# fails the script.
# Usage: tools/wheel-check.sh [OUT_DIR]   (the wheel is left in OUT_DIR if given)
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

python=python3
command -v "$python" >/dev/null || { echo "wheel-check: python3 not found" >&2; exit 1; }

echo "wheel-check: building the wheel"
# Linked against glibc 2.28's symbols and tagged manylinux_2_28 once
# auditwheel allows it (tools/manylinux.sh).
# shellcheck source=tools/manylinux.sh
. tools/manylinux.sh
manylinux_setup "$work"
wheel="$(manylinux_build_cuda)"
echo "wheel-check: $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB)"

echo "wheel-check: fresh virtual environment"
"$python" -m venv "$work/venv" || { echo "wheel-check: python3 -m venv failed (install python3-venv)" >&2; exit 1; }
py="$work/venv/bin/python"
# The wheel has no dependencies: nothing else is fetched.
"$py" -m pip install --no-index --quiet "$wheel"

mkdir "$work/run"
cp crates/cuda/python/test_mempool.py "$work/run/"
cd "$work/run"
unset TENSOR_ARENA_CUDA_LIB TENSOR_ARENA_CUDA_DRIVER TENSOR_ARENA_CUDA_SHRINK PYTHONPATH
"$py" - <<'PY'
import os, tensor_arena_cuda as t
lib = t.library_path()
assert "site-packages" in t.__file__ and lib.startswith(os.path.dirname(t.__file__)), (t.__file__, lib)
print("wheel-check: imported", t.__file__, "library", os.path.basename(lib))
PY
# The wheel's library (linked for glibc 2.28) throws std::bad_alloc into a
# C++ host as the cargo-built one does.
c++ -o "$work/cxx_host" "$root/crates/cuda/tests/cxx_host.cc" -ldl
host_out="$(TENSOR_ARENA_CUDA_DRIVER=simulated "$work/cxx_host" "$("$py" -c 'import tensor_arena_cuda as t; print(t.library_path())')" 2>/dev/null)"
for line in "small: ok" "zero: null" "huge: caught std::bad_alloc" "huge, C entry: null" "after: ok"; do
    grep -qF "$line" <<<"$host_out" || { echo "wheel-check: C++ host: '$line' missing in: $host_out" >&2; exit 1; }
done
echo "wheel-check: C++ host catches std::bad_alloc from the wheel's library"
# Each test in its own process: the library picks its driver once.
"$py" -m tensor_arena_cuda.selftest
PYTHONPATH="$root/tools/gpu-check/fake" PYTHONDONTWRITEBYTECODE=1 "$py" test_mempool.py
if [ $# -ge 1 ]; then
  mkdir -p "$1"
  cp "$wheel" "$1/"
  echo "wheel-check: wheel copied to $1"
fi
echo "wheel-check: ok"
