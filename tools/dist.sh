#!/usr/bin/env bash
# Builds the project's distributable wheels into dist/ (or OUT_DIR):
#   tensor_arena-<version>-cp39-abi3-manylinux_2_28_x86_64.whl
#       (`import tensor_arena`, crates/python: every CPython from 3.9)
#   tensor_arena_cuda-<version>-py3-none-manylinux_2_28_x86_64.whl
#       (`import tensor_arena_cuda`, crates/cuda/python)
# linked against glibc 2.28's symbols (RHEL 8, Ubuntu 20.04, Debian 11 and
# later) and checked by auditwheel, the way CI builds the ones it tests
# (tools/manylinux.sh, shared with tools/python-check.sh and
# tools/wheel-check.sh). Installing them needs Python and pip only:
#   pip install dist/tensor_arena-*.whl 'onnxruntime>=1.31,<1.32'   (1.31: what the tests cover)
#
# Needs: a Rust toolchain (rust-version in Cargo.toml, 1.85 or later),
# python3 with venv and pip, a C compiler for libgcc_s's path, and PyPI
# (maturin, setuptools-rust, ziglang, auditwheel, wheel: pinned build
# tools). Cargo builds in target/manylinux (ignored by git; set
# MANYLINUX_TARGET_DIR for another place). Nothing is tested here: CI's
# tools/python-check.sh and tools/wheel-check.sh test the same build.
#
# Usage: tools/dist.sh [--only python|cuda] [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."

only=""
if [ "${1:-}" = "--only" ]; then
    only="${2:-}"
    case "$only" in python|cuda) ;; *) echo "dist: --only takes python or cuda" >&2; exit 2 ;; esac
    shift 2
fi
out="${1:-dist}"
[ $# -le 1 ] || { echo "usage: tools/dist.sh [--only python|cuda] [OUT_DIR]" >&2; exit 2; }
command -v python3 >/dev/null || { echo "dist: python3 not found" >&2; exit 1; }
command -v cargo >/dev/null || { echo "dist: cargo not found (a Rust toolchain builds the wheels: https://rustup.rs)" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# shellcheck source=tools/manylinux.sh
. tools/manylinux.sh
manylinux_setup "$work"

mkdir -p "$out"
built=()
if [ "$only" != cuda ]; then
    echo "dist: building tensor-arena (crates/python)" >&2
    built+=("$(manylinux_build_python)")
fi
if [ "$only" != python ]; then
    echo "dist: building tensor_arena_cuda (crates/cuda/python)" >&2
    built+=("$(manylinux_build_cuda)")
fi
for w in "${built[@]}"; do
    cp "$w" "$out/"
    echo "dist: $out/$(basename "$w") ($(du -k "$w" | cut -f1) KiB)" >&2
done
