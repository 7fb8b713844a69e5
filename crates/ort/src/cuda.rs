//! ONNX Runtime's CUDA memory from tensor-arena's device arena
//! (`tensor_arena_cuda`), beside the CPU adoption: one call on the user's
//! CUDA execution provider, and runs keyed by the input shapes as the
//! [`Worker`](crate::Worker) keys them on the host.
//!
//! The provider takes its device memory through its external-allocator
//! options (`gpu_external_alloc` / `gpu_external_free` /
//! `gpu_external_empty_cache`), which bypass its own arena; see
//! `tensor_arena_cuda::ort_cuda` for why this route and what it assumes
//! about streams.

use crate::{OrtArenaError, RunKey};
use ort::ep::ArbitrarilyConfigurableExecutionProvider;
use tensor_arena::RunReport;
use tensor_arena_cuda::ort_cuda::{self, RunScope};
pub use tensor_arena_cuda::{DeviceStats, TorchStats};

/// One call on a server's own CUDA execution provider that makes its
/// device memory come from tensor-arena.
pub trait CudaExt: Sized {
    /// Sets `device_id` to `device` and points the provider's external
    /// allocator at the arena of that device; every other option stays as
    /// the caller set it. Sessions built with the provider take their
    /// initializers, activations and workspaces from the arena; ONNX
    /// Runtime's own CUDA arena is not made.
    ///
    /// # Errors
    /// [`OrtArenaError::Device`] for a device ordinal out of range, or when
    /// ONNX Runtime still holds blocks of another device's arena (one
    /// device per process is served).
    fn with_tensor_arena(self, device: i32) -> Result<Self, OrtArenaError>;
}

impl CudaExt for ort::ep::CUDA {
    fn with_tensor_arena(self, device: i32) -> Result<Self, OrtArenaError> {
        let mut ep = self;
        for (key, value) in ort_cuda::provider_options(device).map_err(OrtArenaError::Device)? {
            ep = ep.with_arbitrary_config(key, value);
        }
        Ok(ep)
    }
}

/// An open run of a device's arena, keyed by input shapes; ends when
/// dropped or with [`CudaRun::end`].
#[derive(Debug)]
#[must_use = "the run ends when this is dropped"]
pub struct CudaRun(RunScope);

/// Opens a run of `device`'s arena keyed by `key`: wrap the session's run
/// in it, as [`Worker::run`](crate::Worker::run) does on the host. A key
/// seen before is served from its plan with no driver call.
///
/// ```no_run
/// # fn f(session: &mut ort::session::Session, x: ort::value::Tensor<f32>) -> Result<(), Box<dyn std::error::Error>> {
/// use tensor_arena_ort::{cuda_run, RunKey};
/// let inputs = ort::inputs![x];
/// let run = cuda_run(0, &RunKey::of(&inputs))?;
/// let outputs = session.run(inputs)?;
/// // ... copy the outputs to the host, drop them ...
/// drop(outputs);
/// run.end()?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`OrtArenaError::Device`] when a run is open on the device already, or
/// the arena cannot be made (no CUDA driver).
pub fn cuda_run(device: i32, key: &RunKey) -> Result<CudaRun, OrtArenaError> {
    let bytes: Vec<u8> = key
        .as_slice()
        .iter()
        .flat_map(|d| (*d as u64).to_le_bytes())
        .collect();
    ort_cuda::begin_run(device, &bytes)
        .map(CudaRun)
        .map_err(OrtArenaError::Device)
}

impl CudaRun {
    /// Ends the run and reports it (planned, driver calls, peak).
    ///
    /// # Errors
    /// [`OrtArenaError::Device`] if the run was ended another way.
    pub fn end(self) -> Result<RunReport, OrtArenaError> {
        self.0.end().map_err(OrtArenaError::Device)
    }
}

/// The stats of `device`'s arena ([`TorchStats::of`] gives them under
/// PyTorch's names).
///
/// # Errors
/// [`OrtArenaError::Device`] when the arena cannot be made.
pub fn cuda_stats(device: i32) -> Result<DeviceStats, OrtArenaError> {
    ort_cuda::with_device_arena(device, |a| Ok(a.stats())).map_err(OrtArenaError::Device)
}

/// Gives `device`'s memory back down to the watermark (what the last runs
/// needed plus the initializers); returns the bytes released.
///
/// # Errors
/// [`OrtArenaError::Device`] when the arena cannot be made.
pub fn cuda_shrink(device: i32) -> Result<usize, OrtArenaError> {
    ort_cuda::with_device_arena(device, |a| Ok(a.shrink())).map_err(OrtArenaError::Device)
}
