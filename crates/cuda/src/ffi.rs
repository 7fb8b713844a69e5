//! The C ABI: PyTorch's `CUDAPluggableAllocator` entry points and the
//! extra ones of the Python module.
//!
//! Every `extern "C"` function is a thin trampoline: raw arguments are
//! wrapped at the edge, the work is a safe Rust function, and a panic is
//! caught and turned into a null pointer or an error code (the message in
//! [`tensor_arena_cuda_last_error`]), never unwound into C. The one exception
//! on purpose is [`tensor_arena_cuda_alloc`], PyTorch's: a request it cannot serve throws
//! `std::bad_alloc` into its C++ caller, as PyTorch's own allocator throws,
//! because PyTorch uses the pointer unchecked.
//!
//! One arena per device, made on the device's first allocation, behind one
//! mutex (PyTorch may allocate from several threads). The driver is the
//! real one unless [`tensor_arena_cuda_init`] or the environment variable
//! `TENSOR_ARENA_CUDA_DRIVER` says `simulated`.

use crate::driver::{DevicePtr, SimConfig, SimDriver, Stream};
use crate::{CudaError, DeviceArena, DeviceConfig};
use core::ffi::{c_char, c_int, c_void, CStr};
use parking_lot::Mutex;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use tensor_arena::{ArenaError, ShrinkPolicy};

/// Devices the C ABI serves (ordinals `0..MAX_DEVICES`).
const MAX_DEVICES: usize = 64;

/// The environment variable that picks the driver when
/// [`tensor_arena_cuda_init`] was not called: `cuda` (default) or `simulated`.
pub const DRIVER_ENV: &str = "TENSOR_ARENA_CUDA_DRIVER";

/// The environment variable that sets the arenas' shrink policy, read when
/// a device's arena is made: `manual` (default), `every-run`, or
/// `below:N` (after N runs in a row that needed at least 1/8 less than is
/// mapped).
pub const SHRINK_ENV: &str = "TENSOR_ARENA_CUDA_SHRINK";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Choice {
    Cuda,
    Simulated,
}

struct Global {
    choice: Option<Choice>,
    arenas: Vec<Option<DeviceArena>>,
    /// Per device: which kinds of [`Caller`] have allocated from its arena
    /// (bits of [`Caller::bit`]).
    callers: Vec<u8>,
}

static GLOBAL: Mutex<Global> = Mutex::new(Global {
    choice: None,
    arenas: Vec::new(),
    callers: Vec::new(),
});

/// Who allocates from a device's arena through the C ABI. The stream
/// layer orders reuse across streams only when each block is tagged with
/// the stream its work really runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Caller {
    /// An entry that passes the stream its work runs on: PyTorch's, the
    /// ctypes layer's, ONNX Runtime's external allocator once its compute
    /// stream was given (`ort_cuda::set_stream`).
    Stream,
    /// ONNX Runtime's external allocator with its compute stream unknown:
    /// its blocks are tagged [`Stream::DEFAULT`], but its kernels run on a
    /// stream of its own, so nothing orders them against another caller's.
    OrtUnknownStream,
}

impl Caller {
    fn bit(self) -> u8 {
        match self {
            Self::Stream => 1,
            Self::OrtUnknownStream => 2,
        }
    }

    /// Who this is, for [`CudaError::UnorderedSharing`]'s message.
    fn describe(self) -> &'static str {
        match self {
            Self::Stream => {
                "a caller on a stream (PyTorch's entries, the ctypes layer, or ONNX \
                 Runtime's external allocator once given its stream)"
            }
            Self::OrtUnknownStream => {
                "ONNX Runtime's external allocator with its compute stream unknown"
            }
        }
    }

    fn other(self) -> Self {
        match self {
            Self::Stream => Self::OrtUnknownStream,
            Self::OrtUnknownStream => Self::Stream,
        }
    }
}

static LAST_ERROR: Mutex<String> = Mutex::new(String::new());

pub(crate) fn set_error(msg: String) {
    *LAST_ERROR.lock() = msg;
}

/// Runs `f`; a panic becomes `fallback` and an error message.
pub(crate) fn trampoline<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown".into());
            set_error(format!("tensor-arena-cuda panicked: {what}"));
            fallback
        }
    }
}

/// `Err` into an error code, with its message kept.
pub(crate) fn code<T>(r: Result<T, CudaError>, ok: impl FnOnce(T) -> i64) -> i64 {
    match r {
        Ok(v) => ok(v),
        Err(e) => {
            set_error(e.to_string());
            -1
        }
    }
}

fn choice_from_env() -> Result<Choice, CudaError> {
    match std::env::var(DRIVER_ENV) {
        Err(_) => Ok(Choice::Cuda),
        Ok(v) => parse_choice(&v),
    }
}

fn parse_choice(s: &str) -> Result<Choice, CudaError> {
    match s {
        "cuda" | "" => Ok(Choice::Cuda),
        "simulated" => Ok(Choice::Simulated),
        _ => Err(CudaError::Arena(ArenaError::InvalidConfig(
            "unknown driver: use \"cuda\" or \"simulated\"",
        ))),
    }
}

fn parse_policy(s: &str) -> Result<ShrinkPolicy, CudaError> {
    let bad = || {
        CudaError::Arena(ArenaError::InvalidConfig(
            "TENSOR_ARENA_CUDA_SHRINK: use manual, every-run or below:N (N >= 1)",
        ))
    };
    match s {
        "" | "manual" => Ok(ShrinkPolicy::Manual),
        "every-run" => Ok(ShrinkPolicy::AfterEveryRun),
        _ => {
            let runs = s.strip_prefix("below:").ok_or_else(bad)?;
            match runs.parse::<u32>() {
                Ok(runs) if runs >= 1 => Ok(ShrinkPolicy::AfterRunsBelow { runs }),
                _ => Err(bad()),
            }
        }
    }
}

fn config_from_env() -> Result<DeviceConfig, CudaError> {
    let mut config = DeviceConfig::default();
    if let Ok(v) = std::env::var(SHRINK_ENV) {
        config.arena.shrink_policy = parse_policy(&v)?;
    }
    Ok(config)
}

fn device_index(device: c_int) -> Result<usize, CudaError> {
    usize::try_from(device)
        .ok()
        .filter(|&d| d < MAX_DEVICES)
        .ok_or(CudaError::BadDevice { device })
}

/// Makes `arena` the arena of `device`, before that device's first use.
pub(crate) fn set_arena(device: c_int, arena: DeviceArena) -> Result<(), CudaError> {
    let index = device_index(device)?;
    let mut g = GLOBAL.lock();
    if g.arenas.len() <= index {
        g.arenas.resize_with(index + 1, || None);
    }
    if g.arenas[index].is_some() {
        return Err(CudaError::Arena(ArenaError::InvalidConfig(
            "the device's arena exists already: set it before the device's first use",
        )));
    }
    g.arenas[index] = Some(arena);
    Ok(())
}

/// [`with_arena`] for an allocation by `caller`: refuses
/// ([`CudaError::UnorderedSharing`]) when ONNX Runtime's external allocator
/// with its stream unknown and a caller with a stream would share the
/// device's arena, since a block one of them frees could reach the other
/// with nothing ordering their kernels.
pub(crate) fn with_arena_for<T>(
    device: c_int,
    caller: Caller,
    f: impl FnOnce(&mut DeviceArena) -> Result<T, CudaError>,
) -> Result<T, CudaError> {
    let index = device_index(device)?;
    {
        let mut g = GLOBAL.lock();
        if g.callers.len() <= index {
            g.callers.resize(index + 1, 0);
        }
        let seen = g.callers[index] | caller.bit();
        if seen == Caller::Stream.bit() | Caller::OrtUnknownStream.bit() {
            return Err(CudaError::UnorderedSharing {
                device,
                asking: caller.describe(),
                earlier: caller.other().describe(),
            });
        }
        g.callers[index] = seen;
    }
    with_arena(device, f)
}

/// Forgets that ONNX Runtime's external allocator allocated with its
/// stream unknown, on every device where it did, once it holds no block
/// (the caller checks): ONNX Runtime is being given its stream, and
/// its blocks from then on are ordered like any stream's. Each such
/// device is synchronised first, so that no kernel ONNX Runtime queued on
/// its old, unknown stream still uses memory the arena hands out next.
///
/// # Errors
/// [`CudaError::Driver`] if a synchronisation fails (the record is kept,
/// and later callers on a stream are still refused).
pub(crate) fn forget_ort_unknown_stream() -> Result<(), CudaError> {
    let devices: Vec<usize> = {
        let g = GLOBAL.lock();
        g.callers
            .iter()
            .enumerate()
            .filter(|(_, &bits)| bits & Caller::OrtUnknownStream.bit() != 0)
            .map(|(i, _)| i)
            .collect()
    };
    for index in devices {
        let device = c_int::try_from(index).expect("fewer than 64 devices");
        with_arena(device, |a| {
            a.driver().synchronize().map_err(CudaError::Driver)
        })?;
        GLOBAL.lock().callers[index] &= !Caller::OrtUnknownStream.bit();
    }
    Ok(())
}

/// The arena of `device`, made on first use.
pub(crate) fn with_arena<T>(
    device: c_int,
    f: impl FnOnce(&mut DeviceArena) -> Result<T, CudaError>,
) -> Result<T, CudaError> {
    let index = device_index(device)?;
    let mut g = GLOBAL.lock();
    let choice = match g.choice {
        Some(c) => c,
        None => {
            let c = choice_from_env()?;
            g.choice = Some(c);
            c
        }
    };
    if g.arenas.len() <= index {
        g.arenas.resize_with(index + 1, || None);
    }
    let slot = &mut g.arenas[index];
    if slot.is_none() {
        let config = config_from_env()?;
        let arena = match choice {
            Choice::Cuda => DeviceArena::cuda(device, config)?,
            Choice::Simulated => {
                DeviceArena::new(Arc::new(SimDriver::new(SimConfig::default())), config)?
            }
        };
        *slot = Some(arena);
    }
    f(slot.as_mut().expect("made above"))
}

/// Copies `s` and a NUL into `buf` if it fits in `cap` bytes; returns the
/// length of `s` (without the NUL) either way.
///
/// # Safety
/// `buf` is null or valid for writes of `cap` bytes.
unsafe fn write_str(buf: *mut c_char, cap: usize, s: &str) -> isize {
    if !buf.is_null() && s.len() < cap {
        // SAFETY: `buf` is valid for `cap > s.len()` bytes (caller), and
        // `s` does not overlap it (it is ours).
        let out = unsafe { core::slice::from_raw_parts_mut(buf.cast::<u8>(), s.len() + 1) };
        out[..s.len()].copy_from_slice(s.as_bytes());
        out[s.len()] = 0;
    }
    isize::try_from(s.len()).unwrap_or(isize::MAX)
}

/// The stream PyTorch passes.
///
/// # Safety
/// `stream` is 0 or a live stream of `device`'s context (what PyTorch
/// passes: its current stream for the device).
unsafe fn stream_of(stream: *mut c_void) -> Stream {
    // SAFETY: forwarded from the caller.
    unsafe { Stream::from_raw(stream as usize as u64) }
}

pub(crate) fn alloc(size: isize, device: c_int, stream: Stream, caller: Caller) -> *mut c_void {
    let Ok(size) = usize::try_from(size) else {
        set_error(format!("negative allocation size {size}"));
        return core::ptr::null_mut();
    };
    if size == 0 {
        return core::ptr::null_mut();
    }
    match with_arena_for(device, caller, |a| a.alloc(size, stream)) {
        Ok(p) => p.0 as usize as *mut c_void,
        Err(e) => {
            let msg = format!("allocating {size} bytes on device {device}: {e}");
            // Say why on stderr too: the exception `tensor_arena_cuda_alloc` throws (or
            // the null it returns without a C++ runtime) carries no message.
            let _ = writeln!(std::io::stderr(), "tensor-arena-cuda: {msg}");
            set_error(msg);
            core::ptr::null_mut()
        }
    }
}

pub(crate) fn free(ptr: *mut c_void, device: c_int, stream: Stream) {
    if ptr.is_null() {
        return;
    }
    let addr = DevicePtr(ptr as usize as u64);
    if let Err(e) = with_arena(device, |a| a.free(addr, stream)) {
        set_error(format!("freeing {addr} on device {device}: {e}"));
    }
}

fn stats_json(device: c_int) -> Result<String, CudaError> {
    with_arena(device, |a| {
        let s = a.stats();
        let v = serde_json::json!({
            "device": device,
            "driver": a.driver().name(),
            "arena": s.arena,
            "mapped": s.mapped,
            "last_run_peak_mapped": s.last_run_peak_mapped,
            "reserved_peak": s.reserved_peak,
            // PyTorch's `memory_stats()` names (crate::TorchStats).
            "memory_stats": crate::TorchStats::of(&s).to_json(),
            "calls": {
                "address_reserve": s.calls.address_reserve,
                "address_free": s.calls.address_free,
                "mem_create": s.calls.mem_create,
                "mem_release": s.calls.mem_release,
                "mem_map": s.calls.mem_map,
                "mem_unmap": s.calls.mem_unmap,
                "set_access": s.calls.set_access,
                "synchronize": s.calls.synchronize,
                "failed": s.calls.failed,
                "total": s.calls.total(),
            },
            "streams": {
                "multi_stream": s.streams.multi_stream,
                "events_created": s.streams.events_created,
                "events_recorded": s.streams.events_recorded,
                "waits": s.streams.waits,
                "pending_ranges": s.streams.pending_ranges,
            },
            "plans": s.plans,
            "out_of_memory": s.out_of_memory,
            "stranded_blocks": s.stranded_blocks,
            "last_run": a.last_run(),
            "last_plan": a.last_plan(),
            "families": a.plan_families(),
            "in_run": a.in_run(),
        });
        Ok(v.to_string())
    })
}

type Runtime = Option<&'static tensor_arena::cxx::CxxRuntime>;

/// The C++ runtime of [`tensor_arena_cuda_alloc`]'s first caller, kept
/// for the process's life.
static CALLER_CXX: std::sync::OnceLock<Runtime> = std::sync::OnceLock::new();

/// `find()`, with a panic of it caught: `None` then (the caller gets a
/// null rather than an exception) and the message in
/// [`tensor_arena_cuda_last_error`]. What [`tensor_arena_cuda_alloc`]
/// looks its caller's runtime up with, so that no panic of the lookup
/// unwinds into C++.
fn runtime_contained(find: impl FnOnce() -> Runtime) -> Runtime {
    trampoline(None, find)
}

/// Whether [`caller_runtime`] panics, for tests ([`panic_in_caller_lookup`]).
static PANIC_IN_CALLER_LOOKUP: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Makes the lookup of [`tensor_arena_cuda_alloc`]'s caller's C++ runtime
/// panic, for the C ABI's contract test that a panic there stays inside
/// (null and a message, not an abort). Not part of the API: a Rust
/// function, not exported from the `cdylib`, so no C, C++ or Python caller
/// can reach it, and no environment variable changes what a build does.
#[doc(hidden)]
pub fn panic_in_caller_lookup() {
    PANIC_IN_CALLER_LOOKUP.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// [`tensor_arena::cxx::runtime_for_caller`], or a panic where a test asked
/// for one ([`panic_in_caller_lookup`]).
fn caller_runtime() -> Runtime {
    if PANIC_IN_CALLER_LOOKUP.load(std::sync::atomic::Ordering::Relaxed) {
        panic!("the caller's runtime lookup failed (test hook)");
    }
    tensor_arena::cxx::runtime_for_caller()
}

/// `CUDAPluggableAllocator`'s allocation function: `size` bytes on
/// `device` for work on `stream`. Null for a zero size. A request that
/// cannot be served (out of device memory, a bad device) **throws
/// `std::bad_alloc`** through the C++ runtime of the code that calls
/// `tensor_arena_cuda_alloc` (PyTorch's: found at the first call, while
/// memory is not short, with [`tensor_arena::cxx::runtime_for_caller`]),
/// and returns null when that runtime cannot be established (a caller with
/// a hidden, statically linked runtime, or one the loader cannot name); the
/// message is in [`tensor_arena_cuda_last_error`] either way.
///
/// How the runtime is found has limits (`runtime_for_caller`'s docs and
/// the crate's README): the **first** caller's answer is kept for the
/// process's life, so a second C++ host calling through another runtime
/// gets the first's; the caller's binding of `__cxa_throw` is assumed to
/// follow the global scope first (not so under `RTLD_DEEPBIND` or
/// `-Bsymbolic`); and a caller the loader cannot name (JIT code, a libffi
/// closure) gets null rather than a throw.
///
/// PyTorch does not check the pointer `tensor_arena_cuda_alloc` returns: a null becomes a
/// tensor at address 0, and the first kernel on it poisons the CUDA
/// context (an illegal memory access; seen on an H100). Thrown, the
/// exception unwinds PyTorch as its own allocator's would and reaches
/// Python as an exception; the process stays usable (`tensor_arena::cxx`).
///
/// # Safety
/// - `stream` is 0 or a live CUDA stream of `device`'s primary context;
/// - the caller is C++ (PyTorch) and can be unwound by `std::bad_alloc`:
///   C, Rust and ctypes callers use [`tensor_arena_cuda_try_alloc`], which never
///   throws.
#[no_mangle]
pub unsafe extern "C-unwind" fn tensor_arena_cuda_alloc(
    size: isize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    // The caller's C++ runtime, found at the first call (memory is not
    // short yet) and kept; a panic of the lookup is caught there.
    let thrower = *CALLER_CXX.get_or_init(|| runtime_contained(caller_runtime));
    // SAFETY: the caller's promise about `stream`.
    let p = unsafe { tensor_arena_cuda_try_alloc(size, device, stream) };
    if p.is_null() && size > 0 {
        if let Some(rt) = thrower {
            // SAFETY: this `extern "C-unwind"` function is called by C++
            // that can be unwound (the caller's promise), and nothing in
            // this frame has a destructor or holds a lock: the arena's
            // mutex was released when `tensor_arena_cuda_try_alloc` returned.
            unsafe { tensor_arena::cxx::throw_bad_alloc(rt) }
        }
    }
    p
}

/// `size` bytes on `device` for work on `stream`, for callers that cannot
/// catch a C++ exception (C, Rust, Python's ctypes): null for a zero size
/// or on failure (the message in [`tensor_arena_cuda_last_error`]); never throws.
///
/// # Safety
/// `stream` is 0 or a live CUDA stream of `device`'s primary context.
#[no_mangle]
pub unsafe extern "C" fn tensor_arena_cuda_try_alloc(
    size: isize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    // SAFETY: the caller's promise about `stream`.
    let stream = unsafe { stream_of(stream) };
    trampoline(core::ptr::null_mut(), || {
        alloc(size, device, stream, Caller::Stream)
    })
}

/// `CUDAPluggableAllocator`'s free function. A pointer this library did
/// not hand out is ignored (the message in [`tensor_arena_cuda_last_error`]).
///
/// # Safety
/// `stream` is 0 or a live CUDA stream of `device`'s primary context; work
/// that uses the block after this call is queued on no stream.
#[no_mangle]
pub unsafe extern "C" fn tensor_arena_cuda_free(
    ptr: *mut c_void,
    _size: isize,
    device: c_int,
    stream: *mut c_void,
) {
    // SAFETY: the caller's promise about `stream`.
    let stream = unsafe { stream_of(stream) };
    trampoline((), || free(ptr, device, stream));
}

/// Picks the driver, `"cuda"` or `"simulated"` (a NUL-terminated string),
/// before the first allocation. Returns 0, or -1 for an unknown name or
/// when arenas exist already with another driver.
///
/// # Safety
/// `driver` is null (keeps the default) or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn tensor_arena_cuda_init(driver: *const c_char) -> c_int {
    trampoline(-1, || {
        let name = if driver.is_null() {
            None
        } else {
            // SAFETY: a NUL-terminated string (caller).
            let name = unsafe { CStr::from_ptr(driver) };
            Some(name.to_string_lossy().into_owned())
        };
        code(init(name.as_deref()), |()| 0) as c_int
    })
}

/// Picks the driver (`None`: from the environment).
pub(crate) fn init(name: Option<&str>) -> Result<(), CudaError> {
    let choice = match name {
        None => choice_from_env()?,
        Some(n) => parse_choice(n)?,
    };
    let mut g = GLOBAL.lock();
    let used = g.arenas.iter().any(Option::is_some);
    if used && g.choice != Some(choice) {
        return Err(CudaError::Arena(ArenaError::InvalidConfig(
            "the driver cannot change once memory was allocated",
        )));
    }
    g.choice = Some(choice);
    Ok(())
}

/// Opens a run on `device` for the input shape named by `key` (`key_len`
/// bytes, any content): a key seen before is served from its plan. Returns
/// 0, or -1 (a run is open already, say).
///
/// # Safety
/// `key` is valid for reads of `key_len` bytes (or null with `key_len` 0).
#[no_mangle]
pub unsafe extern "C" fn tensor_arena_cuda_run_begin(
    device: c_int,
    key: *const u8,
    key_len: usize,
) -> c_int {
    trampoline(-1, || {
        let key: &[u8] = if key_len == 0 {
            &[]
        } else if key.is_null() {
            set_error("null run key with a non-zero length".into());
            return -1;
        } else {
            // SAFETY: `key_len` readable bytes at `key` (caller).
            unsafe { core::slice::from_raw_parts(key, key_len) }
        };
        code(with_arena(device, |a| a.begin_run(key)), |_| 0) as c_int
    })
}

/// Closes the open run on `device` (a plan is learned for its key when no
/// block of it is left live). Returns 0, or -1 when no run is open.
#[no_mangle]
pub extern "C" fn tensor_arena_cuda_run_end(device: c_int) -> c_int {
    trampoline(-1, || {
        code(with_arena(device, |a| a.end_run()), |_| 0) as c_int
    })
}

/// Gives `device`'s memory back down to the watermark; returns the bytes
/// released, or -1.
#[no_mangle]
pub extern "C" fn tensor_arena_cuda_shrink(device: c_int) -> i64 {
    trampoline(-1, || {
        code(with_arena(device, |a| Ok(a.shrink())), |b| b as i64)
    })
}

/// Gives `device`'s memory back towards `bytes`; returns the bytes
/// released, or -1.
#[no_mangle]
pub extern "C" fn tensor_arena_cuda_shrink_to(device: c_int, bytes: u64) -> i64 {
    let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
    trampoline(-1, || {
        code(with_arena(device, |a| Ok(a.shrink_to(bytes))), |b| b as i64)
    })
}

/// Lowers `device`'s peaks (bytes live, bytes mapped) to what is held now,
/// as `torch.cuda.reset_peak_memory_stats` does. Returns 0, or -1.
#[no_mangle]
pub extern "C" fn tensor_arena_cuda_reset_peaks(device: c_int) -> c_int {
    trampoline(-1, || {
        let reset = with_arena(device, |a| {
            a.reset_peaks();
            Ok(())
        });
        code(reset, |()| 0) as c_int
    })
}

/// Writes `device`'s stats as JSON (NUL-terminated) into `buf` if they fit
/// in `cap` bytes; returns their length without the NUL (call again with a
/// larger buffer when it is not below `cap`), or -1.
///
/// # Safety
/// `buf` is null or valid for writes of `cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn tensor_arena_cuda_stats_json(
    device: c_int,
    buf: *mut c_char,
    cap: usize,
) -> isize {
    trampoline(-1, || match stats_json(device) {
        // SAFETY: `buf` is null or writable for `cap` bytes (caller).
        Ok(s) => unsafe { write_str(buf, cap, &s) },
        Err(e) => {
            set_error(e.to_string());
            -1
        }
    })
}

/// Writes the last error message into `buf` as [`tensor_arena_cuda_stats_json`]
/// does; returns its length (0: no error so far).
///
/// # Safety
/// `buf` is null or valid for writes of `cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn tensor_arena_cuda_last_error(buf: *mut c_char, cap: usize) -> isize {
    trampoline(-1, || {
        let msg = LAST_ERROR.lock().clone();
        // SAFETY: `buf` is null or writable for `cap` bytes (caller).
        unsafe { write_str(buf, cap, &msg) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shrink_policies_parse() {
        assert_eq!(parse_policy("manual").unwrap(), ShrinkPolicy::Manual);
        assert_eq!(parse_policy("").unwrap(), ShrinkPolicy::Manual);
        assert_eq!(
            parse_policy("every-run").unwrap(),
            ShrinkPolicy::AfterEveryRun
        );
        assert_eq!(
            parse_policy("below:3").unwrap(),
            ShrinkPolicy::AfterRunsBelow { runs: 3 }
        );
        for bad in ["below:0", "below:", "below:x", "sometimes", "below:-1"] {
            let e = parse_policy(bad).unwrap_err().to_string();
            assert!(e.contains("TENSOR_ARENA_CUDA_SHRINK"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_panicking_runtime_lookup_stays_inside() {
        let found = runtime_contained(|| panic!("lookup failed"));
        assert!(found.is_none(), "no runtime: null, not a throw");
        let msg = LAST_ERROR.lock().clone();
        assert!(msg.contains("panicked: lookup failed"), "{msg}");
    }

    #[test]
    fn driver_names_parse() {
        assert_eq!(parse_choice("cuda").unwrap(), Choice::Cuda);
        assert_eq!(parse_choice("simulated").unwrap(), Choice::Simulated);
        assert!(parse_choice("gpu").is_err());
    }
}
