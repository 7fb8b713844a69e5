//! Arbitrary bytes as a plan store file (or as a body under a valid
//! header and checksum), loaded into a fresh cache as a new replica loads
//! its store: refused whole with one warning, or everything it adds (exact
//! plans, and the predictions of its families) validates and serves
//! planned runs with no overlap.
//!
//! `crates/arena-ops/tests/corpus.rs` replays `corpus/plan_store/` through
//! the same function.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tensor_arena_ops::fuzz_plan_store(data);
});
