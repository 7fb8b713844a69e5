//! The model on [`tensor_session`]: weights from a [`Weights`], every
//! intermediate tensor from the session's arena, one session run per call.
//!
//! - [`load_weights`] opens the safetensors file (mapped or copied) and
//!   checks that the model can borrow every tensor in place.
//! - [`Model::from_weights`] borrows the tensors of a [`Weights`] (no copy).
//! - A `&RunContext` is a [`Scratch`]: each intermediate tensor is one
//!   `ctx.alloc_slice::<f32>(n)`, dropped after its last reader, so the
//!   session sees the real sizes and lifetimes of the run, plans them by key
//!   and serves later runs of the same key from one block.
//! - [`Detector`] carries the LSTM state and the 64-sample context between
//!   calls: a whole recording in one run ([`Detector::process`]), in chunks
//!   of `N` windows ([`Detector::process_chunked`]), or one window per call
//!   ([`Detector::process_window`]). The run's key is `[L, 576]`, the shape
//!   of the ONNX model's input.

use std::fmt;
use std::path::Path;

use tensor_arena::{ArenaError, TypedBlock};
use tensor_session::{LoadMode, RunContext, Session, Weights, WeightsError};

use crate::kernels::Sample;
use crate::model::{LstmState, Model, ModelError, TENSORS};
use crate::scratch::Scratch;
use crate::shapes::{Intermediate, CONTEXT, ROW, WINDOW};

/// A run's context is a scratch: every intermediate tensor is a
/// [`RunContext::alloc_slice`] of the session's arena (values unspecified:
/// every kernel overwrites its output), given back when dropped.
impl<'r> Scratch for &RunContext<'r> {
    type Buf = TypedBlock<'r, f32>;
    type Error = ArenaError;

    fn take(
        &mut self,
        _tensor: Intermediate,
        len: usize,
    ) -> Result<TypedBlock<'r, f32>, ArenaError> {
        self.alloc_slice::<f32>(len)
    }
}

impl<'w> Model<'w> {
    /// The model borrowing the tensors of `weights` in place: each of
    /// [`TENSORS`] must be `F32`, of the expected shape, and aligned for
    /// `f32` (the committed file is; [`load_weights`] realigns any file
    /// once at load time). Cheap: 14 lookups, no copy, so it can be called
    /// at the start of every run (and then follows a hot swap).
    ///
    /// # Errors
    /// [`ModelError`] naming the first tensor at fault.
    pub fn from_weights(weights: &'w Weights) -> Result<Self, ModelError> {
        let mut err = None;
        let model = Model::from_tensors(|name| {
            let view = weights.get(name)?;
            let name = TENSORS.iter().find(|t| t.0 == name).map_or("?", |t| t.0);
            match view.typed::<f32>() {
                Ok(data) => Some((data, view.shape())),
                Err(WeightsError::DtypeMismatch { dtype, .. }) => {
                    err = Some(ModelError::Dtype {
                        name,
                        found: dtype.to_string(),
                    });
                    None
                }
                Err(_) => {
                    err = Some(ModelError::Misaligned(name));
                    None
                }
            }
        });
        match (model, err) {
            (Ok(m), _) => Ok(m),
            (Err(_), Some(e)) => Err(e),
            (Err(e), None) => Err(e),
        }
    }
}

/// Opens a weights file (see [`Weights::open`]) and checks that the model
/// can use it: every tensor of [`TENSORS`] present, `F32`, of the right
/// shape. If a tensor's data is not aligned for `f32` (safetensors does not
/// promise aligned offsets; the committed file is aligned), the model's
/// tensors are copied once into aligned owned memory
/// ([`Weights::from_tensors`]) so that runs never copy. With
/// [`LoadMode::Mmap`], the caller's [`MmapAck`](tensor_session::MmapAck)
/// covers this file: it must not be written in place or truncated while the
/// returned weights live.
///
/// # Errors
/// [`VadError::Weights`] if the file cannot be loaded, [`VadError::Model`]
/// if it does not hold the model.
pub fn load_weights(path: impl AsRef<Path>, mode: LoadMode) -> Result<Weights, VadError> {
    let weights = Weights::open(path, mode).map_err(VadError::Weights)?;
    match Model::from_weights(&weights) {
        Ok(_) => Ok(weights),
        Err(ModelError::Misaligned(_)) => {
            let mut tensors = Vec::with_capacity(TENSORS.len());
            for &(name, _) in &TENSORS {
                let view = weights.get(name).ok_or(ModelError::Missing(name))?;
                tensors.push((name, view.dtype(), view.shape().to_vec(), view.bytes()));
            }
            let aligned = Weights::from_tensors(tensors).map_err(VadError::Weights)?;
            Model::from_weights(&aligned)?;
            Ok(aligned)
        }
        Err(e) => Err(e.into()),
    }
}

/// Why a detector call failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum VadError {
    /// The weights file could not be loaded.
    Weights(WeightsError),
    /// The weights do not hold the model.
    Model(ModelError),
    /// The session's arena refused a buffer (e.g. over its `max_reserved`).
    Arena(ArenaError),
}

impl fmt::Display for VadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VadError::Weights(e) => write!(f, "{e}"),
            VadError::Model(e) => write!(f, "{e}"),
            VadError::Arena(e) => write!(f, "arena: {e}"),
        }
    }
}

impl std::error::Error for VadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            VadError::Weights(e) => Some(e),
            VadError::Model(e) => Some(e),
            VadError::Arena(e) => Some(e),
        }
    }
}

impl From<ModelError> for VadError {
    fn from(e: ModelError) -> Self {
        VadError::Model(e)
    }
}

impl From<ArenaError> for VadError {
    fn from(e: ArenaError) -> Self {
        VadError::Arena(e)
    }
}

/// The session key of a run over `l` windows: `[l, 576]`, the shape of the
/// ONNX model's `input`.
pub fn key(l: usize) -> [usize; 2] {
    [l, ROW]
}

/// Voice activity detection over one audio stream on a [`Session`]: holds
/// the LSTM state and the last 64 samples between calls; the session (any
/// clone, e.g. a [`PoolGuard`](tensor_session::PoolGuard)) is passed to each
/// call.
///
/// Each call is one [`Session::run`] with key [`key`]`(L)`; the weights are
/// read from the run's context, so a hot swap takes effect at the next call.
/// Probabilities do not depend on how a stream is cut into calls beyond
/// float rounding in the batched products (whole-file and one-window-per-call
/// agree with onnxruntime within 1.1e-6 on the reference recording).
///
/// ```
/// use std::sync::Arc;
/// use tensor_session::{LoadMode, MmapAck, Session, SessionConfig};
/// use tensor_vad::{load_weights, Detector, WINDOW};
///
/// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/silero_vad_16k_v6.safetensors");
/// // SAFETY: the committed model file is only read, never written, while this runs.
/// let mmap = LoadMode::Mmap(unsafe { MmapAck::new() });
/// let weights = Arc::new(load_weights(path, mmap)?);
/// let mut session = Session::new(weights, SessionConfig::default());
/// let silence = vec![0i16; 4 * WINDOW];
///
/// // Four windows in one run...
/// let mut probs = [0.0f32; 4];
/// let mut detector = Detector::new();
/// detector.process(&mut session, &silence, &mut probs)?;
/// assert!(probs.iter().all(|&p| p < 0.5));
///
/// // ... or one per call (key [1, 576]): the same probabilities.
/// let mut stream = Detector::new();
/// for (w, &p) in silence.chunks_exact(WINDOW).zip(&probs) {
///     let q = stream.process_window(&mut session, w)?;
///     assert!((p - q).abs() < 1e-5);
/// }
/// assert_eq!(session.stats().arena.in_use, 0);
/// # Ok::<(), tensor_vad::VadError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Detector {
    state: LstmState,
    context: [f32; CONTEXT],
    windows: u64,
}

impl Default for Detector {
    fn default() -> Self {
        Self::new()
    }
}

impl Detector {
    /// A detector at the start of a stream: zero state and context.
    pub fn new() -> Self {
        Detector {
            state: LstmState::default(),
            context: [0.0; CONTEXT],
            windows: 0,
        }
    }

    /// Back to the start of a stream.
    pub fn reset(&mut self) {
        *self = Detector::new();
    }

    /// The LSTM state after the last window (`hn`, `cn`).
    pub fn state(&self) -> &LstmState {
        &self.state
    }

    /// Windows processed since the start of the stream.
    pub fn windows(&self) -> u64 {
        self.windows
    }

    /// The next `L = probs.len()` windows of the stream (`samples` holds
    /// `512 L` samples) in one run of `session` with key `[L, 576]`; writes
    /// one speech probability per window. Every intermediate tensor comes
    /// from the session's arena and is back in it when this returns; the
    /// samples are framed on the fly ([`Model::forward_samples`]), so the
    /// `L x 576` input matrix is never built.
    ///
    /// On error the detector is unchanged (the call can be retried).
    ///
    /// # Errors
    /// [`VadError::Arena`] if the arena refuses a buffer, [`VadError::Model`]
    /// if the session's weights (swapped in since loading) lack the model.
    ///
    /// # Panics
    /// If `samples.len() != 512 * probs.len()`.
    pub fn process<T: Sample>(
        &mut self,
        session: &mut Session,
        samples: &[T],
        probs: &mut [f32],
    ) -> Result<(), VadError> {
        let l = probs.len();
        assert_eq!(
            samples.len(),
            l * WINDOW,
            "Detector::process: samples must be 512 x probs.len()"
        );
        if l == 0 {
            return Ok(());
        }
        let (context, state) = (&mut self.context, &mut self.state);
        session.run(&key(l), |ctx| -> Result<(), VadError> {
            let model = Model::from_weights(ctx.weights())?;
            model.forward_samples(samples, context, state, probs, ctx)?;
            Ok(())
        })?;
        self.windows += l as u64;
        Ok(())
    }

    /// The next window (512 samples) in one run with key `[1, 576]`: the
    /// streaming call.
    ///
    /// # Errors
    /// As [`Detector::process`].
    ///
    /// # Panics
    /// If `window.len() != 512`.
    pub fn process_window<T: Sample>(
        &mut self,
        session: &mut Session,
        window: &[T],
    ) -> Result<f32, VadError> {
        let mut p = [0.0f32];
        self.process(session, window, &mut p)?;
        Ok(p[0])
    }

    /// A whole recording, `probs.len()` windows of `samples` (a trailing
    /// partial window is not used), in runs of at most `chunk_windows`
    /// windows each (`0`: one run for everything), carrying the state from
    /// chunk to chunk; the arena then needs what one chunk needs, whatever
    /// the recording's length. `on_chunk` is called after each run with the
    /// session (for its stats) and the chunk's window range.
    ///
    /// # Errors
    /// As [`Detector::process`]; the windows before the failing chunk are
    /// processed.
    ///
    /// # Panics
    /// If `probs.len()` differs from [`num_windows`](crate::num_windows)`(samples.len())`.
    pub fn process_chunked<T: Sample>(
        &mut self,
        session: &mut Session,
        samples: &[T],
        chunk_windows: usize,
        probs: &mut [f32],
        mut on_chunk: impl FnMut(&Session, std::ops::Range<usize>),
    ) -> Result<(), VadError> {
        let l = probs.len();
        assert_eq!(
            l,
            samples.len() / WINDOW,
            "Detector::process_chunked: probs must have one slot per full window"
        );
        let chunk = if chunk_windows == 0 {
            l.max(1)
        } else {
            chunk_windows
        };
        let mut start = 0;
        while start < l {
            let end = (start + chunk).min(l);
            self.process(
                session,
                &samples[start * WINDOW..end * WINDOW],
                &mut probs[start..end],
            )?;
            on_chunk(session, start..end);
            start = end;
        }
        Ok(())
    }
}
