#!/usr/bin/env bash
# Reliability checks, called from .ci/run after the normal test steps:
#   (a) each fuzz target for a bounded time, address-sanitized;
#   (b) the arena's tests (and the shared operation language's) under
#       AddressSanitizer;
#   (c) the session example `worker_pool` under valgrind, leaks checked.
# Any failure fails the run. About 15-20 minutes on a 2-core machine, most
# of it (b).
#
# Knobs (environment): FUZZ_SECONDS (default 30 per target), PROPTEST_CASES
# (default 32: the most cases of each property under AddressSanitizer).
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZ_SECONDS="${FUZZ_SECONDS:-30}"
FUZZ_TARGETS=(arena_ops budget plans plan_store weights_load)
HOST=x86_64-unknown-linux-gnu

step() { printf '\n==> %s\n' "$*"; }
started=$(date +%s)

# The sanitizer runtimes need nightly flags; the stable toolchain accepts them
# with RUSTC_BOOTSTRAP=1 (no nightly toolchain is fetched).
export RUSTC_BOOTSTRAP=1
# The arena must turn a refused region into `BackingFailed`, including for
# sizes no machine has (tests ask for up to 128 TiB): make ASan's allocator
# refuse like a real one (return null) instead of aborting the process.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}allocator_may_return_null=1"
# plan_store asserts each input's load and save time: AddressSanitizer, debug
# assertions and the invariant checks run at every mutating call make a
# sanitized build tens of times slower than the release build the bound is
# for.
export PLAN_STORE_SLOWDOWN="${PLAN_STORE_SLOWDOWN:-50}"

# ---------------------------------------------------------------------------
step "(a) fuzz targets, ${FUZZ_SECONDS}s each, AddressSanitizer"
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
cargo fuzz --version
summary=()
(
    cd fuzz
    # One build for every target; debug assertions on (-a), so the arena's
    # own `debug_assert!`s run too; `cfg(fuzzing)` turns on its
    # `check_invariants` at every mutating call.
    cargo fuzz build -a
)
for target in "${FUZZ_TARGETS[@]}"; do
    log="fuzz/target/${target}.log"
    # New inputs go to a scratch corpus under target/ (not checked in); the
    # checked-in seeds in fuzz/corpus/<target> are read, never written.
    mkdir -p "fuzz/target/corpus/${target}"
    (
        cd fuzz
        cargo fuzz run -a "$target" "target/corpus/${target}" "corpus/${target}" -- \
            -max_total_time="$FUZZ_SECONDS" -print_final_stats=1
    ) >"$log" 2>&1 || {
        tail -n 80 "$log"
        echo "fuzz target ${target} failed; crash input under fuzz/artifacts/${target}/" >&2
        exit 1
    }
    done_line=$(grep -E '^Done [0-9]+ runs' "$log" | tail -n 1)
    echo "${target}: ${done_line}"
    summary+=("${target}: ${done_line}")
done

# ---------------------------------------------------------------------------
step "(b) tensor-arena and tensor-arena-ops tests under AddressSanitizer"
# The fault-count tests (tests/all/commit_faults.rs) add the sanitizer's
# shadow pages to their bounds when told they run under it. Every test
# runs; each property at most PROPTEST_CASES cases (the plain cargo test
# runs each at its own count): what this run is for is the memory layer's
# accesses, and the search's breadth at full count took most of the CI's
# time under the sanitizer.
PROPTEST_CASES="${PROPTEST_CASES:-32}" TENSOR_ARENA_SANITIZED=address RUSTFLAGS=-Zsanitizer=address RUSTDOCFLAGS=-Zsanitizer=address \
    cargo test -p tensor-arena -p tensor-arena-ops --target "$HOST" --target-dir target/asan

# ---------------------------------------------------------------------------
step "(c) session example worker_pool under valgrind"
if ! command -v valgrind >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq valgrind
fi
cargo build -p tensor-session --example worker_pool
supp=$(mktemp)
trap 'rm -f "$supp"' EXIT
# std keeps the main thread's handle in a thread-local as a tagged pointer,
# which memcheck cannot follow: reported as "possibly lost" (48 bytes, once
# per process), not ours.
cat >"$supp" <<'EOF'
{
   std-main-thread-handle-in-tls
   Memcheck:Leak
   match-leak-kinds: possible
   ...
   fun:*init_current*
}
EOF
valgrind --leak-check=full --error-exitcode=9 --suppressions="$supp" \
    "${CARGO_TARGET_DIR:-target}/debug/examples/worker_pool"

# ---------------------------------------------------------------------------
step "reliability checks passed in $(($(date +%s) - started)) s"
for line in "${summary[@]}"; do
    echo "fuzz ${line}"
done
