//! Silero VAD v6 (16 kHz) in plain Rust: the project's real client.
//!
//! The network is the `silero_vad_16k_sequence.onnx` graph of silero-vad
//! 6.2.3 (MIT, see `data/LICENSE-silero-vad.txt`); its weights, exported by
//! `tools/export_vad_weights.py`, are in `data/silero_vad_16k_v6.safetensors`.
//!
//! Input: `L` rows of 576 samples at 16 kHz, each the 64 samples before a
//! 512-sample window followed by the window ([`frame_rows`]), plus the LSTM
//! state `h`, `c`. Output: one speech probability per window, and the new state.
//!
//! Graph, for `L` windows (shapes in ONNX `N x C x T` order):
//!
//! | op | output shape | here |
//! |----|--------------|------|
//! | `Pad` reflect, 128 each side | `L x 832` | [`kernels::reflect_pad`] |
//! | `Unsqueeze` + `Conv` 258 x 1 x 256, stride 128 | `L x 258 x 5` | [`kernels::conv1d`] with `skip = 1` ... |
//! | `Slice` frames `1..` (x2), channels `0..129` / `129..` | `L x 129 x 4` twice | ... computes only frames `1..`: `L x 258 x 4` |
//! | `Pow` 2 (x2), `Add`, `Sqrt` | `L x 129 x 4` | [`kernels::complex_magnitude`] |
//! | `Conv` 128 x 129 x 3, pad 1, stride 1 + `Relu` | `L x 128 x 4` | [`kernels::conv1d`], [`kernels::relu`] |
//! | `Conv` 64 x 128 x 3, pad 1, stride 2 + `Relu` | `L x 64 x 2` | same |
//! | `Conv` 64 x 64 x 3, pad 1, stride 2 + `Relu` | `L x 64 x 1` | same |
//! | `Conv` 128 x 64 x 3, pad 1, stride 1 + `Relu` | `L x 128 x 1` | same |
//! | `Transpose` (0, 2, 1) | `L x 1 x 128` | no-op (time axis of 1) |
//! | `LSTM` hidden 128, `h`, `c` in, `hn`, `cn` out | `L x 1 x 1 x 128` | [`kernels::lstm`] |
//! | `Squeeze` + `Relu` | `L x 1 x 128` | [`kernels::relu`] |
//! | `Transpose` (1, 2, 0) + `Conv` 1 x 128 x 1 | `1 x 1 x L` | [`kernels::linear`] over the rows |
//! | `Sigmoid` + `Reshape` | `L` | [`kernels::sigmoid`] into the caller's slice |
//!
//! # Buffers
//!
//! Every kernel writes into a caller-provided slice and allocates nothing.
//! [`Model::forward`] gets each intermediate tensor from a [`Scratch`] right
//! before the kernel that fills it and drops it right after its last reader,
//! always in the order of [`SCHEDULE`]; [`Intermediate::len`] gives each size
//! for `L` windows (linear in `L`, except the im2col scratch of the
//! convolutions, one fixed tile of at most 40 output frames), [`total_len`]
//! their sum and [`peak_len`] the most live at once: 1864 floats per window
//! for long inputs (the padded rows and the STFT output), 2576 for one
//! window. A `Scratch` hands out owned buffers
//! (`DerefMut<Target = [f32]>`, freed on drop) and may fail, so an arena's
//! `Block` fits directly and the arena sees the real lifetimes of a run.
//! [`HeapScratch`] (a `Vec` per tensor) and [`SliceScratch`] (bump over one
//! slice, no allocation) are provided.
//!
//! ```
//! use tensor_vad::{Intermediate, Scratch};
//!
//! /// Counts what a forward pass asks for, handing out `Vec`s.
//! struct Counting(usize);
//!
//! impl Scratch for Counting {
//!     type Buf = Vec<f32>;
//!     type Error = std::convert::Infallible;
//!     fn take(&mut self, _t: Intermediate, len: usize) -> Result<Vec<f32>, Self::Error> {
//!         self.0 += len;
//!         Ok(vec![0.0; len])
//!     }
//! }
//! // 316 windows (10 s): 1.26 M floats in all, at most 0.59 M live at once.
//! let tiles = 40 * (387 + 384 + 192 + 192);
//! assert_eq!(tensor_vad::total_len(316), 316 * 3852 + tiles);
//! assert_eq!(tensor_vad::peak_len(316), 316 * 1864);
//! assert_eq!(tensor_vad::peak_len(1), 2576);
//! ```
//!
//! # On sessions
//!
//! [`Detector`] runs the model on a [`tensor_session::Session`]: weights
//! borrowed in place from the session's [`Weights`](tensor_session::Weights)
//! ([`load_weights`], [`Model::from_weights`]), every intermediate tensor a
//! `ctx.alloc_slice::<f32>(n)` of the run (a `&RunContext` is a [`Scratch`]),
//! one run per call keyed `[L, 576]`, so that repeated lengths are served
//! from the session's plans. [`segments()`] turns probabilities into speech
//! segments with silero's rule. The `tensor-vad` binary runs it all on WAV
//! files with a pool of workers.
//!
//! The crate has no `unsafe`.

#![forbid(unsafe_code)]

mod detector;
pub mod kernels;
mod model;
mod scratch;
pub mod segments;
mod shapes;
pub mod wav;

pub use detector::{key, load_weights, Detector, VadError};
pub use kernels::Sample;
pub use model::{frame_rows, num_windows, LstmState, Model, ModelError, Stream, TENSORS};
pub use scratch::{
    peak_len, total_len, Event, HeapScratch, Scratch, ScratchTooSmall, SliceScratch, SCHEDULE,
};
pub use segments::{segments, Segment, SegmentConfig, Segmenter};
pub use shapes::{
    conv_specs, Intermediate, CONTEXT, HIDDEN, ROW, SAMPLE_RATE, STFT_BINS, STFT_HOP, STFT_KERNEL,
    STFT_PAD, WINDOW,
};
