//! Arbitrary operation sequences against an arena, a shared arena and a
//! session, checked against the model after every step.
//!
//! The input is decoded by `tensor_arena_ops::decode` (deterministic), and
//! `crates/arena-ops/tests/corpus.rs` replays `corpus/arena_ops/` through
//! the same function.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tensor_arena_ops::fuzz_arena_ops(data);
});
