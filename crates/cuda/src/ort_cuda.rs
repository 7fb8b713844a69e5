//! ONNX Runtime's CUDA memory from the device arena: the CUDA execution
//! provider's external allocator.
//!
//! ONNX Runtime takes an external CUDA allocator two ways:
//!
//! 1. the CUDA execution provider's options `gpu_external_alloc`,
//!    `gpu_external_free` and `gpu_external_empty_cache`: the addresses of
//!    `void* alloc(size_t)`, `void free(void*)` and `void empty_cache()`.
//!    The provider then makes no arena of its own: every device allocation
//!    of the session (initializers at creation, activations in runs,
//!    cuDNN and cuBLAS workspaces it asks for) goes to these functions;
//! 2. an allocator registered on the environment for the CUDA device
//!    (`CreateAndRegisterAllocatorV2` / `RegisterAllocator`), taken by
//!    sessions with `session.use_env_allocators`. Its `OrtAllocator` struct
//!    grows with the API version (an allocator declaring version 23 or later
//!    is read past the end of `ort-sys`' struct, which ends at `Reserve`),
//!    and ONNX Runtime still wraps it in its own arena unless told not to.
//!
//! This crate takes the first: plain C functions, one set per process, no
//! struct whose layout moves between releases, and no arena of ONNX
//! Runtime's between the session and ours. What it gives up: the functions
//! carry no stream. A CUDA session queues its kernels on one compute
//! stream of its own, so every block of it is tagged with one stream and
//! a freed block is reused at once by the session's next allocation,
//! which its stream orders after the old work; sessions that run **at the
//! same time** on one device must share that stream or the device.
//!
//! **Sharing the arena with PyTorch.** The arena of a device is the one
//! PyTorch's entries use too; their blocks carry PyTorch's stream. A block
//! ONNX Runtime frees mid-run, its kernels still queued, must not go to
//! PyTorch's stream with nothing ordering the two. So:
//! - with ONNX Runtime's stream given ([`set_stream`], before its first
//!   allocation; [`provider_options`] then passes it as the provider's
//!   `user_compute_stream`, so ONNX Runtime computes on it), its blocks are
//!   tagged with that stream, and reuse across the two streams waits on an
//!   event recorded at the free, as between any two streams;
//! - without it, the two sharing one device's arena is refused with
//!   [`CudaError::UnorderedSharing`]: whichever of them comes second gets
//!   a null pointer and the message (PyTorch an exception);
//! - given later, once ONNX Runtime holds no block, [`set_stream`]
//!   synchronises each device ONNX Runtime allocated from without it and
//!   forgets that past, so ONNX Runtime (and a caller on another stream)
//!   is served again.
//!
//! `empty_cache` is a shrink down to the watermark (the last runs' need
//! plus what lives outside runs: the initializers).
//!
//! Runs are keyed as on the host: open one with [`begin_run`] (or the C
//! ABI's `tensor_arena_cuda_run_begin`) around the session's run, with a key
//! from the input shapes (`tensor_arena_ort::RunKey`); a key seen before is
//! served from its plan with no driver call.
//!
//! The arena is the C ABI's arena of the device (the one PyTorch's
//! entries use too), so stats, shrink and runs work through either.

use crate::driver::{DevicePtr, Stream};
use crate::ffi::{code, set_error, trampoline, with_arena, Caller};
use crate::{CudaError, DeviceArena};
use core::ffi::{c_int, c_void};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicI32, AtomicI64, Ordering};
use tensor_arena::ArenaError;

/// The device the three entry points serve (ONNX Runtime passes none).
static DEVICE: AtomicI32 = AtomicI32::new(0);
/// Blocks handed to ONNX Runtime and not given back yet.
static LIVE: AtomicI64 = AtomicI64::new(0);
/// ONNX Runtime's compute stream, when given ([`set_stream`]).
static STREAM: Mutex<Option<Stream>> = Mutex::new(None);

/// The old Rust paths of the entry points (their symbols are
/// `tensor_arena_cuda_ort_*` now), kept for code that names them.
#[doc(hidden)]
pub use self::{
    tensor_arena_cuda_ort_alloc as tensor_arena_ort_cuda_alloc,
    tensor_arena_cuda_ort_free as tensor_arena_ort_cuda_free,
};

/// The stream ONNX Runtime's blocks are tagged with, and who they are to
/// the arena.
fn ort_stream() -> (Stream, Caller) {
    match *STREAM.lock() {
        Some(s) => (s, Caller::Stream),
        None => (Stream::DEFAULT, Caller::OrtUnknownStream),
    }
}

/// Gives the external allocator ONNX Runtime's compute stream: its blocks
/// are tagged with it from then on (see the module's docs), and
/// [`provider_options`] passes it as `user_compute_stream`, so that ONNX
/// Runtime computes on it. Call it before the session is made.
///
/// Given after ONNX Runtime allocated without it (and freed every
/// block), it also ends that past: each device it allocated from is
/// synchronised (its old kernels ran on a stream the arena never knew),
/// and the arena stops refusing callers on a stream for it.
///
/// # Errors
/// [`CudaError::Arena`] while ONNX Runtime holds blocks (they were tagged
/// with another stream); [`CudaError::Driver`] if a synchronisation fails.
pub fn set_stream(stream: Stream) -> Result<(), CudaError> {
    let mut s = STREAM.lock();
    if *s != Some(stream) && LIVE.load(Ordering::Acquire) > 0 {
        return Err(CudaError::Arena(ArenaError::InvalidConfig(
            "ONNX Runtime's stream cannot change while it holds blocks",
        )));
    }
    if LIVE.load(Ordering::Acquire) == 0 {
        crate::ffi::forget_ort_unknown_stream()?;
    }
    *s = Some(stream);
    Ok(())
}

/// Makes `arena` the C ABI's arena of `device` (the one PyTorch's entries
/// and ONNX Runtime's external allocator use), before the device's first
/// use: an arena over a driver of the caller's own, e.g. a
/// [`SimDriver`](crate::SimDriver) whose clone the caller keeps to check
/// the work queued on the blocks.
///
/// # Errors
/// [`CudaError::BadDevice`]; [`CudaError::Arena`] when the device's arena
/// exists already.
pub fn set_device_arena(device: i32, arena: DeviceArena) -> Result<(), CudaError> {
    crate::ffi::set_arena(device, arena)
}

/// The device ONNX Runtime's blocks come from now.
pub fn device() -> i32 {
    DEVICE.load(Ordering::Acquire)
}

/// Makes `device` the one the external allocator serves (0 by default).
///
/// # Errors
/// [`CudaError::BadDevice`] for an ordinal out of range;
/// [`CudaError::Arena`] when blocks of another device are still held by
/// ONNX Runtime (they would be given back to the wrong arena).
pub fn set_device(device: i32) -> Result<(), CudaError> {
    if !(0..64).contains(&device) {
        return Err(CudaError::BadDevice { device });
    }
    if DEVICE.load(Ordering::Acquire) != device && LIVE.load(Ordering::Acquire) > 0 {
        return Err(CudaError::Arena(ArenaError::InvalidConfig(
            "the external allocator's device cannot change while ONNX Runtime holds blocks of another",
        )));
    }
    DEVICE.store(device, Ordering::Release);
    Ok(())
}

/// The CUDA execution provider's options that make it take its device
/// memory from the arena of `device`: `device_id`, `gpu_external_alloc`,
/// `gpu_external_free` and `gpu_external_empty_cache` (addresses in
/// decimal, as ONNX Runtime parses them), and `user_compute_stream` when
/// [`set_stream`] gave ONNX Runtime's stream. Sets the external
/// allocator's device ([`set_device`]).
///
/// # Errors
/// As [`set_device`].
pub fn provider_options(device: i32) -> Result<Vec<(&'static str, String)>, CudaError> {
    set_device(device)?;
    let alloc: extern "C" fn(usize) -> *mut c_void = tensor_arena_cuda_ort_alloc;
    let free: unsafe extern "C" fn(*mut c_void) = tensor_arena_cuda_ort_free;
    let empty: extern "C" fn() = tensor_arena_cuda_ort_empty_cache;
    let mut options = vec![
        ("device_id", device.to_string()),
        ("gpu_external_alloc", (alloc as usize).to_string()),
        ("gpu_external_free", (free as usize).to_string()),
        ("gpu_external_empty_cache", (empty as usize).to_string()),
    ];
    if let Some(stream) = *STREAM.lock() {
        options.push(("user_compute_stream", stream.raw().to_string()));
    }
    Ok(options)
}

/// Picks the driver of the C ABI's arenas, `"cuda"` or `"simulated"` (as
/// `tensor_arena_cuda_init`), before the first allocation.
///
/// # Errors
/// [`CudaError::Arena`] for an unknown name, or when arenas exist already
/// with another driver.
pub fn init_driver(name: &str) -> Result<(), CudaError> {
    crate::ffi::init(Some(name))
}

/// Runs `f` on the arena of `device` (made on first use, with the driver
/// the C ABI chose: see `tensor_arena_cuda_init`): stats, shrink, runs.
///
/// # Errors
/// [`CudaError::BadDevice`]; the arena's creation errors (no driver);
/// whatever `f` returns.
pub fn with_device_arena<T>(
    device: i32,
    f: impl FnOnce(&mut DeviceArena) -> Result<T, CudaError>,
) -> Result<T, CudaError> {
    with_arena(device, f)
}

/// An open run of a device's arena; ends when dropped (or with
/// [`RunScope::end`], which says how it went).
#[derive(Debug)]
#[must_use = "the run ends when the scope is dropped"]
pub struct RunScope {
    device: i32,
    open: bool,
}

/// Opens a run keyed by `key` (the input shapes) on `device`'s arena: a
/// key seen before is served from its plan.
///
/// # Errors
/// [`CudaError::Arena`] with `RunAlreadyOpen` when a run is open on the
/// device; the arena's creation errors.
pub fn begin_run(device: i32, key: &[u8]) -> Result<RunScope, CudaError> {
    with_arena(device, |a| a.begin_run(key))?;
    Ok(RunScope { device, open: true })
}

impl RunScope {
    /// Ends the run and reports it.
    ///
    /// # Errors
    /// [`CudaError::NoRun`] if the run was ended another way (the C ABI).
    pub fn end(mut self) -> Result<tensor_arena::RunReport, CudaError> {
        self.open = false;
        with_arena(self.device, DeviceArena::end_run)
    }
}

impl Drop for RunScope {
    fn drop(&mut self) {
        if self.open {
            let _ = with_arena(self.device, DeviceArena::end_run);
        }
    }
}

/// `gpu_external_alloc`: `size` bytes of the external allocator's device
/// ([`set_device`]). Null for a zero size or when the arena refuses (out of
/// device memory, say): ONNX Runtime checks the pointer and fails the call
/// with an error; the message is in `tensor_arena_cuda_last_error` and on
/// stderr. Never throws, never unwinds.
#[no_mangle]
pub extern "C" fn tensor_arena_cuda_ort_alloc(size: usize) -> *mut c_void {
    trampoline(core::ptr::null_mut(), || {
        let Ok(size) = isize::try_from(size) else {
            set_error(format!("allocation of {size} bytes is past isize::MAX"));
            return core::ptr::null_mut();
        };
        let (stream, caller) = ort_stream();
        let p = crate::ffi::alloc(size, device(), stream, caller);
        if !p.is_null() {
            LIVE.fetch_add(1, Ordering::AcqRel);
        }
        p
    })
}

/// `gpu_external_free`: gives back a block [`tensor_arena_cuda_ort_alloc`]
/// handed out. Null is ignored; a pointer that is not a live block is
/// ignored with a message in `tensor_arena_cuda_last_error`.
///
/// # Safety
/// No work queued after this call uses the block (ONNX Runtime frees a
/// block once the kernels of its stream that use it are queued; they run
/// before any later work of that stream).
#[no_mangle]
pub unsafe extern "C" fn tensor_arena_cuda_ort_free(ptr: *mut c_void) {
    trampoline((), || {
        if ptr.is_null() {
            return;
        }
        let addr = DevicePtr(ptr as usize as u64);
        let (stream, _) = ort_stream();
        match with_arena(device(), |a| a.free(addr, stream)) {
            Ok(()) => {
                LIVE.fetch_sub(1, Ordering::AcqRel);
            }
            Err(e) => set_error(format!("freeing {addr} for ONNX Runtime: {e}")),
        }
    });
}

/// `gpu_external_empty_cache`: gives the device's cached memory back down
/// to the watermark (what the last runs needed plus what lives outside
/// runs). A run that repeats after it makes no driver call.
#[no_mangle]
pub extern "C" fn tensor_arena_cuda_ort_empty_cache() {
    trampoline((), || {
        let _ = code(with_arena(device(), |a| Ok(a.shrink())), |b| b as i64);
    });
}

/// Sets the device the three functions above serve. Returns 0, or -1 (an
/// ordinal out of range, or ONNX Runtime still holds blocks of another
/// device) with the message in `tensor_arena_cuda_last_error`.
#[no_mangle]
pub extern "C" fn tensor_arena_cuda_ort_set_device(device: c_int) -> c_int {
    trampoline(-1, || code(set_device(device), |()| 0) as c_int)
}

/// Gives the external allocator ONNX Runtime's compute stream
/// ([`set_stream`]): the stream passed to the provider as
/// `user_compute_stream`. Returns 0, or -1 while ONNX Runtime holds blocks
/// (the message in `tensor_arena_cuda_last_error`).
///
/// # Safety
/// `stream` is 0 or a live CUDA stream of the external allocator's
/// device, and stays live while blocks freed on it may be reused.
#[no_mangle]
pub unsafe extern "C" fn tensor_arena_cuda_ort_set_stream(stream: *mut c_void) -> c_int {
    // SAFETY: the caller's promise about `stream`.
    let stream = unsafe { Stream::from_raw(stream as usize as u64) };
    trampoline(-1, || code(set_stream(stream), |()| 0) as c_int)
}
