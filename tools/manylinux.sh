# Sourced by tools/dist.sh, tools/wheel-check.sh and tools/python-check.sh:
# builds the project's wheels to the manylinux_2_28 policy (glibc 2.28: RHEL 8, Ubuntu
# 20.04 and later) on any Linux machine, and checks and tags them.
#
# Rust links against the build machine's glibc, whose newest symbol
# versions (dlopen, dladdr, pthread_key_create at GLIBC_2.34 on a current
# Debian) would keep the wheel off older systems. Linking with `zig cc`
# against glibc 2.28's symbols instead (the `ziglang` package from PyPI, a
# pinned version) gives a library that needs nothing newer than 2.28;
# `auditwheel show` then checks the policy and `wheel tags` writes it into
# the file name. libgcc_s (the unwinder, which C++ exceptions thrown
# through the library need) is linked by path: manylinux allows it.
#
#   manylinux_setup WORKDIR   # a venv with ziglang, auditwheel and wheel;
#                             # exports the linker for cargo
#   manylinux_tag WHEEL       # auditwheel must allow manylinux_2_28_x86_64;
#                             # prints the retagged wheel's path
#   manylinux_build_python    # tensor-arena (crates/python, maturin): builds,
#                             # tags, checks abi3; prints the wheel's path
#   manylinux_build_cuda      # tensor_arena_cuda (crates/cuda/python,
#                             # setuptools-rust): likewise
# (run from the repository root, after manylinux_setup).

MANYLINUX_POLICY=manylinux_2_28_x86_64

manylinux_setup() {
    local work="$1"
    MANYLINUX_WORK="$work"
    local python=python3
    "$python" -m venv "$work/manylinux-venv"
    "$work/manylinux-venv/bin/python" -m pip install --disable-pip-version-check -q \
        ziglang==0.13.0 auditwheel==6.8.2 wheel==0.45.1
    MANYLINUX_PY="$work/manylinux-venv/bin/python"
    local gcc_s
    gcc_s="$("${CC:-cc}" -print-file-name=libgcc_s.so.1)"
    [ -f "$gcc_s" ] || gcc_s=/lib/x86_64-linux-gnu/libgcc_s.so.1
    [ -f "$gcc_s" ] || { echo "manylinux: libgcc_s.so.1 not found" >&2; return 1; }
    local linker="$work/zig-cc-glibc-2.28"
    cat >"$linker" <<EOF
#!/usr/bin/env bash
# zig cc for glibc 2.28, as cargo's linker (tools/manylinux.sh).
args=()
for a in "\$@"; do
  case "\$a" in
    # Flags of rustc's own lld that zig's linker does not take.
    -fuse-ld=lld|-B*gcc-ld|-Wl,--no-undefined-version|-Wl,-znostart-stop-gc) ;;
    -lgcc_s) args+=("$gcc_s") ;;
    *) args+=("\$a") ;;
  esac
done
exec "$MANYLINUX_PY" -m ziglang cc -target x86_64-linux-gnu.2.28 "\${args[@]}"
EOF
    chmod +x "$linker"
    export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER="$linker"
    # Its own build directory: the usual one keeps its host-linked objects.
    export CARGO_TARGET_DIR="${MANYLINUX_TARGET_DIR:-$PWD/target/manylinux}"
}

manylinux_tag() {
    local wheel="$1" out
    out="$("$MANYLINUX_PY" -m auditwheel show "$wheel" 2>&1)" || { echo "$out" >&2; return 1; }
    if ! grep -q "\"$MANYLINUX_POLICY\"" <<<"$out"; then
        echo "manylinux: $(basename "$wheel") is not $MANYLINUX_POLICY:" >&2
        echo "$out" >&2
        return 1
    fi
    echo "manylinux: $(basename "$wheel"): auditwheel allows $MANYLINUX_POLICY" >&2
    "$MANYLINUX_PY" -m wheel tags --remove --platform-tag "$MANYLINUX_POLICY" "$wheel" >/dev/null
    local tagged
    tagged="$(dirname "$wheel")/$(basename "$wheel" | sed "s/linux_x86_64\.whl\$/$MANYLINUX_POLICY.whl/")"
    [ -f "$tagged" ] || { echo "manylinux: retagged wheel $tagged not found" >&2; return 1; }
    echo "$tagged"
}

# One wheel from `pip wheel SRC` into a fresh folder of the work directory,
# tagged; prints its path.
manylinux_build() {
    local src="$1" glob="$2" out
    out="$(mktemp -d "$MANYLINUX_WORK/wheel.XXXXXX")"
    python3 -m pip wheel --no-deps --disable-pip-version-check -q -w "$out" "$src" >&2
    local wheels=("$out"/$glob)
    [ "${#wheels[@]}" -eq 1 ] && [ -f "${wheels[0]}" ] || {
        echo "manylinux: expected one $glob from $src, got: ${wheels[*]}" >&2
        return 1
    }
    manylinux_tag "${wheels[0]}"
}

manylinux_build_python() {
    local wheel
    wheel="$(manylinux_build crates/python 'tensor_arena-*.whl')" || return 1
    case "$(basename "$wheel")" in
      *-abi3-*) ;;
      *) echo "manylinux: $(basename "$wheel") is not abi3" >&2; return 1 ;;
    esac
    echo "$wheel"
}

manylinux_build_cuda() {
    # setuptools builds in the source tree: start from no earlier build, and
    # leave none behind.
    rm -rf crates/cuda/python/build crates/cuda/python/*.egg-info
    local wheel rc=0
    wheel="$(manylinux_build crates/cuda/python 'tensor_arena_cuda-*.whl')" || rc=$?
    rm -rf crates/cuda/python/build crates/cuda/python/*.egg-info
    [ "$rc" -eq 0 ] || return "$rc"
    echo "$wheel"
}
