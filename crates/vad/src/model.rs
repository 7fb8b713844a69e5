//! The Silero VAD v6 (16 kHz) network: weights, forward pass, framing.

use std::fmt;

use crate::kernels::{self, LstmWeights, Sample};
use crate::scratch::Scratch;
use crate::shapes::{conv_specs, Intermediate, CONTEXT, HIDDEN, ROW, STFT_BINS, STFT_PAD, WINDOW};

/// A weight tensor the model needs: name in the safetensors file, shape.
pub const TENSORS: [(&str, &[usize]); 14] = [
    ("stft.forward_basis_buffer", &[258, 1, 256]),
    ("encoder.0.weight", &[128, 129, 3]),
    ("encoder.0.bias", &[128]),
    ("encoder.1.weight", &[64, 128, 3]),
    ("encoder.1.bias", &[64]),
    ("encoder.2.weight", &[64, 64, 3]),
    ("encoder.2.bias", &[64]),
    ("encoder.3.weight", &[128, 64, 3]),
    ("encoder.3.bias", &[128]),
    ("recurrent.W", &[1, 512, 128]),
    ("recurrent.R", &[1, 512, 128]),
    ("recurrent.B", &[1, 1024]),
    ("output.weight", &[1, 128, 1]),
    ("output.bias", &[1]),
];

/// A weight tensor was missing or had the wrong shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelError {
    /// No tensor of this name.
    Missing(&'static str),
    /// The shape differs from the one expected.
    Shape {
        /// Tensor name.
        name: &'static str,
        /// Expected shape.
        expected: &'static [usize],
        /// Shape found.
        found: Vec<usize>,
    },
    /// The tensor's element type is not `F32`.
    Dtype {
        /// Tensor name.
        name: &'static str,
        /// The element type found.
        found: String,
    },
    /// The tensor's data is not aligned for `f32`, so it cannot be borrowed
    /// in place (see [`load_weights`](crate::load_weights), which realigns).
    Misaligned(&'static str),
    /// The data length does not match the shape.
    Len {
        /// Tensor name.
        name: &'static str,
        /// Elements expected.
        expected: usize,
        /// Elements found.
        found: usize,
    },
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelError::Missing(n) => write!(f, "weight tensor {n} is missing"),
            ModelError::Shape {
                name,
                expected,
                found,
            } => write!(
                f,
                "weight tensor {name} has shape {found:?}, expected {expected:?}"
            ),
            ModelError::Dtype { name, found } => {
                write!(f, "weight tensor {name} is {found}, expected F32")
            }
            ModelError::Misaligned(name) => {
                write!(f, "weight tensor {name} is not aligned for f32")
            }
            ModelError::Len {
                name,
                expected,
                found,
            } => write!(
                f,
                "weight tensor {name} has {found} elements, expected {expected}"
            ),
        }
    }
}

impl std::error::Error for ModelError {}

/// LSTM state carried between calls (`h`, `c` of shape `1 x 1 x 128`).
#[derive(Clone, Debug, PartialEq)]
pub struct LstmState {
    /// Hidden state.
    pub h: [f32; HIDDEN],
    /// Cell state.
    pub c: [f32; HIDDEN],
}

impl Default for LstmState {
    fn default() -> Self {
        LstmState {
            h: [0.0; HIDDEN],
            c: [0.0; HIDDEN],
        }
    }
}

/// Silero VAD v6, 16 kHz, borrowing its weights (from an owned copy, a
/// memory map, a session's weights...). Cheap to copy.
#[derive(Clone, Copy, Debug)]
pub struct Model<'w> {
    stft_basis: &'w [f32],
    encoder: [(&'w [f32], &'w [f32]); 4],
    lstm: LstmWeights<'w>,
    out_weight: &'w [f32],
    out_bias: &'w [f32],
}

impl<'w> Model<'w> {
    /// Builds the model from named tensors: `get(name)` returns the data
    /// (row-major `f32`) and shape of a tensor of [`TENSORS`], or `None`.
    /// Shapes are checked.
    pub fn from_tensors<F>(mut get: F) -> Result<Self, ModelError>
    where
        F: FnMut(&str) -> Option<(&'w [f32], &'w [usize])>,
    {
        let mut t: [&'w [f32]; 14] = [&[]; 14];
        for (slot, &(name, shape)) in t.iter_mut().zip(TENSORS.iter()) {
            let (data, found) = get(name).ok_or(ModelError::Missing(name))?;
            if found != shape {
                return Err(ModelError::Shape {
                    name,
                    expected: shape,
                    found: found.to_vec(),
                });
            }
            let expected = shape.iter().product();
            if data.len() != expected {
                return Err(ModelError::Len {
                    name,
                    expected,
                    found: data.len(),
                });
            }
            *slot = data;
        }
        Ok(Model {
            stft_basis: t[0],
            encoder: [(t[1], t[2]), (t[3], t[4]), (t[5], t[6]), (t[7], t[8])],
            lstm: LstmWeights {
                w: t[9],
                r: t[10],
                b: t[11],
                hidden: HIDDEN,
            },
            out_weight: t[12],
            out_bias: t[13],
        })
    }

    /// Runs the network on `L = probs.len()` windows.
    ///
    /// `input` is `L x 576` (see [`frame_rows`]); `state` holds `h`, `c` on
    /// entry and `hn`, `cn` on return; `probs` receives the speech
    /// probability of each window. Intermediate tensors come from `scratch`
    /// in the order of [`SCHEDULE`](crate::SCHEDULE), each dropped as soon as
    /// it is dead; nothing else is allocated. `scratch` is taken by value:
    /// pass `&mut s` for a scratch you keep (`&mut S` is a [`Scratch`] too),
    /// or a session's [`RunContext`](tensor_session::RunContext) reference
    /// as it is.
    ///
    /// If `scratch` fails, the error is returned and `state` is unchanged
    /// (the LSTM runs after the last buffer is taken).
    ///
    /// # Panics
    /// If `input.len() != 576 * probs.len()`, or if `scratch` returns a
    /// buffer of the wrong length.
    pub fn forward<S: Scratch>(
        &self,
        input: &[f32],
        state: &mut LstmState,
        probs: &mut [f32],
        scratch: S,
    ) -> Result<(), S::Error> {
        let l = probs.len();
        assert_eq!(input.len(), l * ROW, "forward: input must be L x {ROW}");
        self.forward_with(state, probs, scratch, |padded| {
            kernels::reflect_pad(input, ROW, STFT_PAD, STFT_PAD, padded);
        })
    }

    /// Runs the network on the `L = probs.len()` windows of `samples`
    /// (`512 L` samples, `f32` or `i16`, see [`Sample`]), framing them on the
    /// fly: the rows of [`frame_rows`] are never built, the first kernel
    /// reads the samples and `context` (the 64 samples before `samples[0]`;
    /// zeros at the start of a stream) directly
    /// ([`kernels::frame_reflect_pad`]). The results are bitwise those of
    /// [`frame_rows`] then [`Model::forward`].
    ///
    /// On success `context` holds the last 64 samples, ready for the next
    /// call, and `state` the new LSTM state; if `scratch` fails, both are
    /// unchanged.
    ///
    /// # Panics
    /// If `samples.len() != 512 * probs.len()`, or if `scratch` returns a
    /// buffer of the wrong length.
    pub fn forward_samples<T: Sample, S: Scratch>(
        &self,
        samples: &[T],
        context: &mut [f32; CONTEXT],
        state: &mut LstmState,
        probs: &mut [f32],
        scratch: S,
    ) -> Result<(), S::Error> {
        let l = probs.len();
        assert_eq!(
            samples.len(),
            l * WINDOW,
            "forward_samples: samples must be L x {WINDOW}"
        );
        let ctx = *context;
        self.forward_with(state, probs, scratch, |padded| {
            kernels::frame_reflect_pad(samples, WINDOW, &ctx, STFT_PAD, padded);
        })?;
        if l > 0 {
            for (d, &s) in context.iter_mut().zip(&samples[l * WINDOW - CONTEXT..]) {
                *d = s.to_f32();
            }
        }
        Ok(())
    }

    /// The forward pass after its input: `fill_padded` writes the
    /// reflect-padded rows (`L x 832`) into the first buffer taken.
    fn forward_with<S: Scratch>(
        &self,
        state: &mut LstmState,
        probs: &mut [f32],
        mut scratch: S,
        fill_padded: impl FnOnce(&mut [f32]),
    ) -> Result<(), S::Error> {
        use Intermediate as I;
        let l = probs.len();
        if l == 0 {
            return Ok(());
        }
        let specs = conv_specs(l);
        let mut take = |t: Intermediate| -> Result<S::Buf, S::Error> {
            let len = t.len(l);
            let buf = scratch.take(t, len)?;
            assert_eq!(
                buf.len(),
                len,
                "scratch returned a buffer of the wrong length"
            );
            Ok(buf)
        };

        // STFT: reflect pad, conv (frame 0 sliced off), magnitude.
        let mut padded = take(I::Padded)?;
        fill_padded(&mut padded);
        let mut stft = take(I::Stft)?;
        kernels::conv1d(
            &specs[0],
            &padded,
            self.stft_basis,
            None,
            &mut [],
            &mut stft,
        );
        drop(padded);
        let mut x = take(I::Magnitude)?;
        kernels::complex_magnitude(&stft, STFT_BINS, specs[0].out_len(), &mut x);
        drop(stft);

        // Encoder: four conv + ReLU blocks.
        let blocks = [
            (I::Cols0, I::Enc0),
            (I::Cols1, I::Enc1),
            (I::Cols2, I::Enc2),
            (I::Cols3, I::Enc3),
        ];
        for ((spec, &(w, b)), &(cols_t, out_t)) in specs[1..].iter().zip(&self.encoder).zip(&blocks)
        {
            let mut cols = take(cols_t)?;
            let mut y = take(out_t)?;
            kernels::conv1d(spec, &x, w, Some(b), &mut cols, &mut y);
            drop(cols);
            kernels::relu(&mut y);
            x = y; // drops the block input
        }

        // Encoder output L x 128 x 1 is the LSTM input L x 1 x 128 (the
        // Transpose is a no-op for a time axis of 1).
        debug_assert_eq!(specs[4].out_len(), 1);
        let mut gates = take(I::Gates)?;
        let mut y = take(I::Lstm)?;
        kernels::lstm(
            &x,
            &self.lstm,
            &mut state.h,
            &mut state.c,
            &mut gates,
            &mut y,
        );
        drop(gates);
        drop(x);
        kernels::relu(&mut y);

        // Transpose to 1 x 128 x L + 1x1 conv == dense layer over the rows.
        kernels::linear(&y, HIDDEN, self.out_weight, Some(self.out_bias), probs);
        kernels::sigmoid(probs);
        drop(y);
        Ok(())
    }
}

/// Number of full windows in `num_samples` samples (a trailing partial window
/// is not used).
pub fn num_windows(num_samples: usize) -> usize {
    num_samples / WINDOW
}

/// Builds `L = samples.len() / 512` input rows of 576: row `i` is the 64
/// samples before `samples[512 i]` followed by `samples[512 i .. 512 (i + 1)]`,
/// where the samples before `samples[0]` come from `context` (zeros at the start
/// of a stream). On return `context` holds the last 64 samples, ready for the
/// next call.
///
/// # Panics
/// If `samples.len()` is not a multiple of 512 or `rows.len() != 576 L`.
pub fn frame_rows(samples: &[f32], context: &mut [f32; CONTEXT], rows: &mut [f32]) {
    assert_eq!(
        samples.len() % WINDOW,
        0,
        "frame_rows: samples must be whole windows"
    );
    let l = samples.len() / WINDOW;
    assert_eq!(rows.len(), l * ROW, "frame_rows: rows must be L x {ROW}");
    for (i, (row, new)) in rows
        .chunks_exact_mut(ROW)
        .zip(samples.chunks_exact(WINDOW))
        .enumerate()
    {
        let (ctx, body) = row.split_at_mut(CONTEXT);
        if i == 0 {
            ctx.copy_from_slice(context);
        } else {
            ctx.copy_from_slice(&samples[i * WINDOW - CONTEXT..i * WINDOW]);
        }
        body.copy_from_slice(new);
    }
    if l > 0 {
        context.copy_from_slice(&samples[samples.len() - CONTEXT..]);
    }
}

/// Streaming inference, one 512-sample window per call, carrying the LSTM
/// state and the 64-sample context across calls.
#[derive(Clone, Debug)]
pub struct Stream {
    /// LSTM state after the last window.
    pub state: LstmState,
    context: [f32; CONTEXT],
}

impl Default for Stream {
    fn default() -> Self {
        Self::new()
    }
}

impl Stream {
    /// A stream at its start: zero state, zero context.
    pub fn new() -> Self {
        Stream {
            state: LstmState::default(),
            context: [0.0; CONTEXT],
        }
    }

    /// Back to the start of a stream.
    pub fn reset(&mut self) {
        *self = Stream::new();
    }

    /// Speech probability of the next window of 512 samples (see
    /// [`Model::forward_samples`]; `scratch` as in [`Model::forward`]).
    ///
    /// # Panics
    /// If `window.len() != 512`.
    pub fn process<T: Sample, S: Scratch>(
        &mut self,
        model: &Model<'_>,
        window: &[T],
        scratch: S,
    ) -> Result<f32, S::Error> {
        assert_eq!(
            window.len(),
            WINDOW,
            "Stream::process takes {WINDOW} samples"
        );
        let mut prob = [0.0f32];
        model.forward_samples(
            window,
            &mut self.context,
            &mut self.state,
            &mut prob,
            scratch,
        )?;
        Ok(prob[0])
    }
}
