// Included by `cxx.rs` (and compiled alone by the test
// `cxx_refuses_panic_abort`): throwing `std::bad_alloc` unwinds a C++
// exception through the Rust frame of the allocation function that throws.
// Built with `panic = "abort"`, Rust aborts the process when a foreign
// exception enters such a frame ("panic in a function that cannot
// unwind"), at the first allocation refused: the very failure `cxx` exists
// to turn into an error the host recovers from. So such builds are refused
// here, when they are made, rather than killed under load.
#[cfg(panic = "abort")]
compile_error!(
    "tensor-arena's `cxx` feature (used by tensor-arena-ort and tensor-arena-cuda) needs panic = \"unwind\": \
     it refuses an allocation by throwing std::bad_alloc through a Rust frame, which a panic = \"abort\" build \
     turns into a process abort. Build with panic = \"unwind\" (the default) in the profile of the crate that \
     links it."
);
