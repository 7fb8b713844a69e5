//! Arbitrary bytes as a safetensors file, loaded with both `LoadMode`s:
//! never a panic, and both modes agree.
//!
//! `crates/arena-ops/tests/corpus.rs` replays `corpus/weights_load/`
//! through the same function.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tensor_arena_ops::fuzz_weights_load(data);
});
