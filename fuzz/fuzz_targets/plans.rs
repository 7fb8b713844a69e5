//! Arbitrary recordings and plans (built from bytes, or deserialized from
//! arbitrary JSON) fed to planned runs: live blocks never overlap and each
//! lies inside its plan's block. Plan families too: a run structure with
//! sizes that follow functions of a key, run at keys from the bytes, each
//! planned exactly, predicted from its family or not at all.
//!
//! `crates/arena-ops/tests/corpus.rs` replays `corpus/plans/` through the
//! same function.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tensor_arena_ops::fuzz_plans(data);
});
