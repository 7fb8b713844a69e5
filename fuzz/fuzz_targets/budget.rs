//! Several arenas under one budget: arbitrary operation sequences, checked
//! against the budget's arithmetic after every step.
//!
//! The input is decoded by `tensor_arena_ops::decode_budget` (deterministic),
//! and `crates/arena-ops/tests/corpus.rs` replays `corpus/budget/` through
//! the same function.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tensor_arena_ops::fuzz_budget(data);
});
