//! The C edge: the `OrtAllocator` that ONNX Runtime calls, its registration
//! on an environment, and `Run` through the C API. Calls go one way: this
//! module calls [`crate::slot`] (whose blocks carry the header of
//! [`crate::block`]), never the reverse.
//!
//! Every function in the `OrtAllocator` table is a thin trampoline: it
//! catches any panic of the safe Rust function it calls (`alloc`, `free`,
//! the memory info) and turns it into a system-allocator block, a leak or
//! a null info, so a *panic* never unwinds into ONNX Runtime. One thing
//! does unwind on purpose: `Alloc` (`extern "C-unwind"`), when nothing can
//! serve a request, throws the C++ `std::bad_alloc` that ONNX Runtime's own
//! allocators throw and its kernels catch (`tensor_arena::cxx`), after its
//! `catch_unwind` has returned, with no Rust value left to drop in its
//! frame. `Free` and `Info` never unwind.

use crate::block::{read_header, Header, ALIGN, HEADER};
use crate::slot::{self, Slot};
use ort::AsPointer;
use std::alloc::Layout;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Counters of the allocator's calls, for all threads.
pub(crate) static ALLOC_CALLS: AtomicUsize = AtomicUsize::new(0);
pub(crate) static FREE_CALLS: AtomicUsize = AtomicUsize::new(0);
pub(crate) static SYSTEM_ALLOCS: AtomicUsize = AtomicUsize::new(0);
pub(crate) static SYSTEM_LIVE: AtomicUsize = AtomicUsize::new(0);
pub(crate) static REFUSED_ALLOCS: AtomicUsize = AtomicUsize::new(0);
/// Bytes asked for by every `Alloc` call, and by those served by the system
/// allocator (cumulative).
pub(crate) static ALLOC_BYTES: AtomicUsize = AtomicUsize::new(0);
pub(crate) static SYSTEM_BYTES: AtomicUsize = AtomicUsize::new(0);

/// A block from the system allocator, for an allocation on a thread where
/// no worker runs (ONNX Runtime allocates initializers at session creation
/// and may allocate on its own pool threads).
fn system_alloc(size: usize) -> Option<NonNull<u8>> {
    let total = size.checked_add(HEADER)?;
    let layout = Layout::from_size_align(total, ALIGN).ok()?;
    // SAFETY: `layout` has a non-zero size (at least HEADER).
    let base = NonNull::new(unsafe { std::alloc::alloc(layout) })?;
    let header = Header {
        owner: 0,
        size: total,
    }
    .to_bytes();
    // SAFETY: `base` is a fresh block of `total >= HEADER` bytes, so the
    // header fits; the source is a local array, no overlap.
    unsafe {
        base.as_ptr()
            .copy_from_nonoverlapping(header.as_ptr(), header.len())
    };
    SYSTEM_ALLOCS.fetch_add(1, Ordering::Relaxed);
    SYSTEM_BYTES.fetch_add(size, Ordering::Relaxed);
    SYSTEM_LIVE.fetch_add(1, Ordering::Relaxed);
    // SAFETY: `HEADER < total`, so the result is inside the block.
    Some(unsafe { base.add(HEADER) })
}

/// Frees a block of [`system_alloc`].
///
/// # Safety
/// - `user` was returned by [`system_alloc`], `size` is its header's size,
///   and it is not used again.
unsafe fn system_free(user: NonNull<u8>, size: usize) {
    // SAFETY: as in `read_header`: the block starts HEADER bytes before.
    let base = unsafe { user.as_ptr().sub(HEADER) };
    SYSTEM_LIVE.fetch_sub(1, Ordering::Relaxed);
    // SAFETY: `base` came from `std::alloc::alloc` with this very layout
    // (size from the header, ALIGN), which was valid then.
    unsafe { std::alloc::dealloc(base, Layout::from_size_align_unchecked(size, ALIGN)) };
}

thread_local! {
    static THREAD_ALLOC_CALLS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    static THREAD_REFUSED_ALLOCS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// `Alloc` calls made on this thread so far, and how many of them a
/// worker's arena refused (served by the system allocator instead).
pub(crate) fn thread_alloc_calls() -> (u64, u64) {
    (
        THREAD_ALLOC_CALLS.with(std::cell::Cell::get),
        THREAD_REFUSED_ALLOCS.with(std::cell::Cell::get),
    )
}

/// The safe body of `Alloc`. A request the worker's arena refuses (over
/// its `max_reserved` cap, out of memory) is served by the system allocator
/// instead, and counted. `None` (refused to ONNX Runtime with
/// `std::bad_alloc` by the caller) when the worker's budget refuses it, or
/// when even the system allocator cannot serve it.
fn alloc(size: usize) -> Option<NonNull<u8>> {
    ALLOC_CALLS.fetch_add(1, Ordering::Relaxed);
    ALLOC_BYTES.fetch_add(size, Ordering::Relaxed);
    THREAD_ALLOC_CALLS.with(|c| c.set(c.get() + 1));
    match slot::alloc_current(size) {
        slot::Served::Arena(ptr) => Some(ptr),
        slot::Served::NoWorker => system_alloc(size),
        slot::Served::OverBudget => {
            THREAD_REFUSED_BYTES.with(|c| c.set(c.get().max(size)));
            REFUSED_ALLOCS.fetch_add(1, Ordering::Relaxed);
            THREAD_REFUSED_ALLOCS.with(|c| c.set(c.get() + 1));
            None
        }
        slot::Served::Failed => {
            REFUSED_ALLOCS.fetch_add(1, Ordering::Relaxed);
            THREAD_REFUSED_ALLOCS.with(|c| c.set(c.get() + 1));
            system_alloc(size)
        }
    }
}

/// The body of `Free`.
///
/// # Safety
/// - `user` was returned by [`alloc`] and is not used again.
unsafe fn free(user: NonNull<u8>) {
    FREE_CALLS.fetch_add(1, Ordering::Relaxed);
    // SAFETY: the caller's obligation is `read_header`'s.
    let Some(header) = (unsafe { read_header(user) }) else {
        debug_assert!(false, "Free({user:p}): not a block of this allocator");
        return;
    };
    match NonNull::new(header.owner as *mut Slot) {
        // SAFETY: a system block, freed once (the caller's obligation).
        None => unsafe { system_free(user, header.size) },
        Some(owner) => {
            // SAFETY: `owner` is the `Arc<Slot>` reference the block took
            // when it was handed out (`slot::alloc_current`); the block
            // gives it back now, exactly once.
            let owner = unsafe { Arc::from_raw(owner.as_ptr().cast_const()) };
            slot::free(owner, user.as_ptr() as usize);
        }
    }
}

thread_local! {
    /// Whether a request nothing can serve throws `std::bad_alloc` (the
    /// default: ONNX Runtime calls `Alloc`) or returns null (the contract
    /// tests, which call `Alloc` from Rust).
    static THROW_ON_FAILURE: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
    static THREAD_FAILED_ALLOCS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// The largest request a budget refused on this thread since
    /// [`take_refused_bytes`] last asked.
    static THREAD_REFUSED_BYTES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The largest request a budget refused on this thread since the last
/// call (0: none), and starts counting again.
pub(crate) fn take_refused_bytes() -> usize {
    THREAD_REFUSED_BYTES.with(|c| c.replace(0))
}

/// Requests on this thread that neither the arena nor the system allocator
/// could serve (each refused to ONNX Runtime with `std::bad_alloc`).
pub(crate) fn thread_failed_allocs() -> u64 {
    THREAD_FAILED_ALLOCS.with(std::cell::Cell::get)
}

/// `Alloc` as ONNX Runtime calls it, from a Rust test: the block, or
/// `None` counted as a failed request (as `Alloc` counts it before it
/// throws).
#[cfg(test)]
pub(crate) fn alloc_for_test(size: usize) -> Option<NonNull<u8>> {
    let p = alloc(size);
    if p.is_none() {
        THREAD_FAILED_ALLOCS.with(|c| c.set(c.get() + 1));
    }
    p
}

/// `Free` of a block [`alloc_for_test`] returned.
///
/// # Safety
/// `p` came from [`alloc_for_test`] and is freed once.
#[cfg(test)]
pub(crate) unsafe fn free_for_test(p: NonNull<u8>) {
    // SAFETY: the caller's obligation.
    unsafe { free(p) }
}

/// Makes `Alloc` on this thread return null instead of throwing (for
/// callers in Rust, which cannot catch a C++ exception).
#[cfg(test)]
pub(crate) fn return_null_on_failure() {
    THROW_ON_FAILURE.with(|t| t.set(false));
}

/// `Alloc`. `extern "C-unwind"`: when nothing can serve the request it
/// throws `std::bad_alloc` into ONNX Runtime, which fails the run with a
/// status instead of dereferencing a null (see `tensor_arena::cxx`).
extern "C-unwind" fn tensor_arena_alloc(
    _this: *mut ort::sys::OrtAllocator,
    size: usize,
) -> *mut c_void {
    // A panic (a bug) is caught and the request served by the system
    // allocator.
    let served = catch_unwind(|| alloc(size))
        .unwrap_or_else(|_| catch_unwind(|| system_alloc(size)).ok().flatten());
    if let Some(p) = served {
        return p.as_ptr().cast();
    }
    THREAD_FAILED_ALLOCS.with(|c| c.set(c.get() + 1));
    if THROW_ON_FAILURE.with(std::cell::Cell::get) {
        if let Some(rt) = THROWER.get().copied().flatten() {
            // SAFETY: this is the `extern "C-unwind"` function ONNX Runtime
            // calls (C++), and nothing in this frame has a destructor or
            // holds a lock now: the exception may unwind it.
            unsafe { tensor_arena::cxx::throw_bad_alloc(rt) }
        }
    }
    std::ptr::null_mut()
}

/// The C++ runtime `Alloc` throws `std::bad_alloc` through: the one the
/// ONNX Runtime library binds `__cxa_throw` to (`None`: it cannot be
/// established, and `Alloc` returns null). Set at registration.
static THROWER: std::sync::OnceLock<Option<&'static tensor_arena::cxx::CxxRuntime>> =
    std::sync::OnceLock::new();

/// The runtime of the loaded ONNX Runtime library, found through the
/// address of one of its API functions.
fn onnxruntime_cxx() -> Option<&'static tensor_arena::cxx::CxxRuntime> {
    let run = ort::api().Run as *const c_void;
    tensor_arena::cxx::runtime_for(run)
}

/// Whether `Alloc` can throw `std::bad_alloc` into ONNX Runtime (the C++
/// runtime ONNX Runtime uses was found at registration).
pub(crate) fn can_throw() -> bool {
    THROWER.get().copied().flatten().is_some()
}

/// `Alloc`'s type in the `OrtAllocator` table.
type AllocFnC = unsafe extern "system" fn(*mut ort::sys::OrtAllocator, usize) -> *mut c_void;
/// `tensor_arena_alloc` as the table stores it.
// SAFETY: the same signature and calling convention ("system" is "C" on
// the targets ONNX Runtime ships for); only the permission to unwind
// differs, which concerns the caller: ONNX Runtime (C++) calls it and
// catches the exception, and Rust calls it only through `tensor_arena_alloc`
// itself or, in the contract tests, with throwing turned off.
const ALLOC_FN: AllocFnC = unsafe {
    std::mem::transmute::<
        extern "C-unwind" fn(*mut ort::sys::OrtAllocator, usize) -> *mut c_void,
        AllocFnC,
    >(tensor_arena_alloc)
};

extern "system" fn tensor_arena_free(_this: *mut ort::sys::OrtAllocator, p: *mut c_void) {
    let Some(user) = NonNull::new(p.cast::<u8>()) else {
        return;
    };
    // SAFETY: ONNX Runtime calls `Free` only with pointers this allocator's
    // `Alloc` returned, once each (the `OrtAllocator` contract). A panic is
    // caught: the block leaks, nothing unwinds into C.
    let _ = catch_unwind(AssertUnwindSafe(|| unsafe { free(user) }));
}

extern "system" fn tensor_arena_info(
    _this: *const ort::sys::OrtAllocator,
) -> *const ort::sys::OrtMemoryInfo {
    catch_unwind(|| MEMORY_INFO.get().map_or(std::ptr::null(), |m| m.0.ptr()))
        .unwrap_or(std::ptr::null())
}

/// The CPU memory info of the allocator, created once.
struct Info(ort::memory::MemoryInfo<'static>);
// SAFETY: an `OrtMemoryInfo` is immutable after creation; ONNX Runtime reads
// it from any thread. It is created once and never released.
unsafe impl Send for Info {}
// SAFETY: as above: only read after creation.
unsafe impl Sync for Info {}
static MEMORY_INFO: std::sync::OnceLock<Info> = std::sync::OnceLock::new();

/// The allocator ONNX Runtime calls. It must outlive the environment it is
/// registered on, so it lives in a `static`; only ONNX Runtime touches it.
struct Registered(std::cell::UnsafeCell<ort::sys::OrtAllocator>);
// SAFETY: Rust never writes the struct after its constant initialisation;
// ONNX Runtime only reads it (the `OrtAllocator` contract), from any thread.
unsafe impl Sync for Registered {}
static ALLOCATOR: Registered = Registered(std::cell::UnsafeCell::new(ort::sys::OrtAllocator {
    version: ort::sys::ORT_API_VERSION,
    Alloc: Some(ALLOC_FN),
    Free: Some(tensor_arena_free),
    Info: Some(tensor_arena_info),
    // The optional entries (which ones exist depends on the `ort` API
    // features the build unifies to) stay null.
    // SAFETY: `default` only fills the table with nulls and the version;
    // it is `unsafe` because a table of nulls must not be handed to ONNX
    // Runtime as is, and this one gets its three required entries above.
    ..unsafe { ort::sys::OrtAllocator::default() }
}));

/// Registers the allocator on `env`, a live environment (borrowed for the
/// call); [`crate::register`] first asks the environment whether it has it
/// ([`registered_on`]).
pub(crate) fn register_ptr(env: *mut ort::sys::OrtEnv) -> Result<(), String> {
    let info = ort::memory::MemoryInfo::new(
        ort::memory::AllocationDevice::CPU,
        0,
        ort::memory::AllocatorType::Device,
        ort::memory::MemoryType::Default,
    )
    .map_err(|e| e.message().to_string())?;
    let _ = MEMORY_INFO.set(Info(info));
    // Find the C++ runtime now, not while a run is out of memory: the one
    // ONNX Runtime itself binds `__cxa_throw` to (found from one of its API
    // functions), or none.
    let _ = THROWER.get_or_init(onnxruntime_cxx);
    let api = ort::api();
    // SAFETY: 1. `env` is a live environment (the caller's, for the call);
    // 2. `ALLOCATOR` is a `static`, so it outlives the environment; its
    // function pointers are the trampolines above, which match the C
    // signatures and unwind into ONNX Runtime only with the `std::bad_alloc`
    // `Alloc` throws (see `tensor_arena_alloc`), never with a panic; 3. ONNX
    // Runtime does not write to it.
    let status = unsafe { (api.RegisterAllocator)(env, ALLOCATOR.0.get()) };
    // SAFETY: `status` was just returned by ONNX Runtime and is not used again.
    unsafe { status_result(status) }
}

/// Whether `env` holds this allocator as its shared CPU allocator now
/// (ONNX Runtime's `GetSharedAllocator`): the environment itself says, so
/// an environment released and made again (at the same address, perhaps)
/// is seen as the new, unregistered one it is.
pub(crate) fn registered_on(env: *mut ort::sys::OrtEnv) -> Result<bool, String> {
    let Some(info) = MEMORY_INFO.get() else {
        return Ok(false);
    };
    let api = ort::api();
    let mut found: *mut ort::sys::OrtAllocator = std::ptr::null_mut();
    // SAFETY: 1. `env` is a live environment (the caller's obligation,
    // borrowed for the call); 2. `info` is the live memory info the
    // allocator was registered with; 3. `found` is written once.
    let status = unsafe { (api.GetSharedAllocator)(env, info.0.ptr(), &mut found) };
    // SAFETY: `status` was just returned by ONNX Runtime and is not used again.
    unsafe { status_result(status) }?;
    Ok(std::ptr::eq(found, ALLOCATOR.0.get()))
}

/// Registers ONNX Runtime's *own* CPU arena allocator on `env`, shared by
/// every session built with `session.use_env_allocators` (ONNX Runtime's
/// shared allocators, `CreateAndRegisterAllocator` with its default arena
/// settings). A baseline to compare with: a process does this instead of
/// [`register`], not beside it (one CPU allocator per environment).
/// Used by [`crate::ArenaSession`]'s baseline, which loads ONNX Runtime
/// dynamically.
#[cfg(feature = "load-dynamic")]
pub(crate) fn register_ort_arena(env: &ort::environment::Environment) -> Result<(), String> {
    let info = ort::memory::MemoryInfo::new(
        ort::memory::AllocationDevice::CPU,
        0,
        ort::memory::AllocatorType::Arena,
        ort::memory::MemoryType::Default,
    )
    .map_err(|e| e.message().to_string())?;
    let api = ort::api();
    // SAFETY: 1. `env.ptr()` is a live environment (borrowed for the call);
    // 2. `info` is a live memory info, which ONNX Runtime copies into the
    // allocator it creates; 3. a null arena configuration asks for the
    // default one.
    let status = unsafe {
        (api.CreateAndRegisterAllocator)(env.ptr().cast_mut(), info.ptr(), std::ptr::null())
    };
    // SAFETY: `status` was just returned by ONNX Runtime and is not used again.
    unsafe { status_result(status) }
}

/// Turns ONNX Runtime's CPU memory arena off in a session builder's
/// options (what `ort`'s CPU execution provider does with
/// `with_arena_allocator(false)`, without registering a provider).
pub(crate) fn disable_cpu_arena(
    builder: &mut ort::session::builder::SessionBuilder,
) -> Result<(), String> {
    let api = ort::api();
    // SAFETY: the builder's session options are live and borrowed mutably
    // for the call; `DisableCpuMemArena` only sets a flag in them.
    let status = unsafe { (api.DisableCpuMemArena)(builder.ptr_mut()) };
    // SAFETY: `status` was just returned by ONNX Runtime and is not used again.
    unsafe { status_result(status) }
}

/// Turns an `OrtStatus*` that ONNX Runtime just returned into a result,
/// releasing it: `Err` with its message, `Ok` for a null status. For code
/// that calls ONNX Runtime's C API itself beside this crate (the Python
/// module's tensors).
///
/// # Safety
/// - `status` is null or a status ONNX Runtime returned and nothing has
///   released;
/// - it is not used after this call (it is released here).
pub unsafe fn status_result(status: ort::sys::OrtStatusPtr) -> Result<(), String> {
    let Some(status) = NonNull::new(status.0) else {
        return Ok(());
    };
    let api = ort::api();
    // SAFETY: `status` is a non-null status ONNX Runtime returned, not yet
    // released (the caller's obligation); its message lives until the
    // status is released below.
    let message = unsafe { std::ffi::CStr::from_ptr((api.GetErrorMessage)(status.as_ptr())) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: released once; not used afterwards.
    unsafe { (api.ReleaseStatus)(status.as_ptr()) };
    Err(message)
}

/// [`status_result`] for the tests of other modules.
#[cfg(test)]
pub(crate) fn status_result_for_tests(status: ort::sys::OrtStatusPtr) -> Result<(), String> {
    // SAFETY: the tests pass statuses ONNX Runtime just returned, once.
    unsafe { status_result(status) }
}

/// Runs `session` on the given inputs through the C API directly, from
/// `&Session`, so that several threads can run one session at once (ONNX
/// Runtime documents `Run` as thread-safe; the CPU execution provider, the
/// only one this crate configures, holds no per-run state in the session).
pub(crate) fn run(
    session: &ort::session::Session,
    run_options: Option<&ort::session::RunOptions>,
    input_names: &[std::ffi::CString],
    inputs: &[&ort::value::DynValue],
    output_names: &[std::ffi::CString],
) -> Result<Vec<ort::value::DynValue>, String> {
    if input_names.len() != inputs.len() {
        return Err(format!(
            "{} names for {} inputs",
            input_names.len(),
            inputs.len()
        ));
    }
    let in_names: Vec<*const std::ffi::c_char> = input_names.iter().map(|c| c.as_ptr()).collect();
    let in_values: Vec<*const ort::sys::OrtValue> = inputs.iter().map(|v| v.ptr()).collect();
    let out_names: Vec<*const std::ffi::c_char> = output_names.iter().map(|c| c.as_ptr()).collect();
    let mut outs: Vec<*mut ort::sys::OrtValue> = vec![std::ptr::null_mut(); out_names.len()];
    let opts = run_options.map_or(std::ptr::null(), |o| o.ptr());
    let api = ort::api();
    // SAFETY: 1. the session, run options and input values are live for the
    // call (borrowed); 2. the name and value arrays have the lengths passed
    // and their strings are NUL-terminated `CString`s; 3. `outs` has room
    // for one value per output name and starts all null (ONNX Runtime then
    // allocates each output).
    let status = unsafe {
        (api.Run)(
            session.ptr().cast_mut(),
            opts,
            in_names.as_ptr(),
            in_values.as_ptr(),
            in_values.len(),
            out_names.as_ptr(),
            out_names.len(),
            outs.as_mut_ptr(),
        )
    };
    // SAFETY: `status` was just returned by ONNX Runtime and is not used again.
    let result = unsafe { status_result(status) };
    let mut values = Vec::with_capacity(outs.len());
    for p in outs {
        if let Some(p) = NonNull::new(p) {
            // SAFETY: `p` is an output value ONNX Runtime just created and
            // handed to us (we own it; `Value` releases it on drop); the
            // session's allocator describes CPU memory, as the value's is.
            values.push(unsafe { ort::value::DynValue::from_ptr(p, Some(session.allocator())) });
        }
    }
    result?;
    if values.len() != output_names.len() {
        return Err("ONNX Runtime returned a null output".into());
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    //! Contract tests: the allocator called through its C signature, as ONNX
    //! Runtime calls it (no library needed).
    use super::*;
    use crate::slot::{self, Slot};
    use tensor_arena::ArenaConfig;

    type AllocFn = unsafe extern "system" fn(*mut ort::sys::OrtAllocator, usize) -> *mut c_void;
    type FreeFn = unsafe extern "system" fn(*mut ort::sys::OrtAllocator, *mut c_void);

    fn fns() -> (AllocFn, FreeFn, *mut ort::sys::OrtAllocator) {
        let a = ALLOCATOR.0.get();
        // SAFETY: the static is only read here (nothing writes it).
        let table = unsafe { *a };
        (table.Alloc.unwrap(), table.Free.unwrap(), a)
    }

    /// Writes and reads back every byte of a block.
    fn touch(p: *mut c_void, len: usize) {
        let p = p.cast::<u8>();
        for i in 0..len {
            // SAFETY: `p` is a live block of at least `len` bytes.
            unsafe { p.add(i).write(i as u8) };
        }
        for i in 0..len {
            // SAFETY: as above.
            assert_eq!(unsafe { p.add(i).read() }, i as u8);
        }
    }

    #[test]
    fn no_worker_means_system_allocator() {
        let (alloc, free, this) = fns();
        // SAFETY: called as ONNX Runtime would: any size, then `Free` once.
        let p = unsafe { alloc(this, 1000) };
        assert!(!p.is_null());
        assert_eq!(p as usize % ALIGN, 0);
        touch(p, 1000);
        // SAFETY: `p` came from `alloc` and is freed once.
        unsafe { free(this, p) };
        // SAFETY: null is ignored, as `free(NULL)` is.
        unsafe { free(this, std::ptr::null_mut()) };
    }

    #[test]
    fn oversized_request_is_null_not_a_panic() {
        return_null_on_failure();
        let (alloc, _, this) = fns();
        // SAFETY: as ONNX Runtime would call it.
        assert!(unsafe { alloc(this, usize::MAX) }.is_null());
        let slot = Slot::new(ArenaConfig::default(), Default::default(), None).unwrap();
        let mut core = slot.lock();
        let _in = slot::enter(&slot, &mut core);
        // SAFETY: as above.
        assert!(unsafe { alloc(this, usize::MAX - 10) }.is_null());
    }

    #[test]
    fn blocks_come_from_the_entered_arena_and_go_back() {
        let (alloc, free, this) = fns();
        let slot = Slot::new(ArenaConfig::default(), Default::default(), None).unwrap();
        let mut core = slot.lock();
        core.begin_run(None, true, false);
        let ptrs: Vec<*mut c_void> = {
            let _in = slot::enter(&slot, &mut core);
            // SAFETY: as ONNX Runtime would call it.
            (1..20).map(|i| unsafe { alloc(this, i * 100) }).collect()
        };
        let st = core.arena_stats();
        assert_eq!(st.live_blocks, 19);
        assert!(st.in_use >= (1..20).map(|i| i * 100 + HEADER).sum::<usize>());
        for (i, &p) in ptrs.iter().enumerate() {
            assert_eq!(p as usize % ALIGN, 0);
            touch(p, (i + 1) * 100);
        }
        {
            let _in = slot::enter(&slot, &mut core);
            for &p in &ptrs {
                // SAFETY: each pointer came from `alloc` and is freed once.
                unsafe { free(this, p) };
            }
        }
        let (report, rec) = core.finish_run().unwrap();
        assert_eq!(
            (report.allocs, report.frees, report.leaked_blocks),
            (19, 19, 0)
        );
        assert_eq!(rec.len(), 19);
        assert_eq!(core.arena_stats().in_use, 0);
    }

    /// Two workers' runs overlap: each holds 1 MiB while the other
    /// allocates its own. Their live peak together counts both (the sum of
    /// the arenas' published stats, read after each run, saw one at a
    /// time). Other tests' blocks only add to the count.
    #[test]
    fn the_live_peak_counts_runs_that_overlap() {
        const MIB: usize = 1 << 20;
        let barrier = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let (alloc, free, this) = fns();
                    let slot = Slot::new(ArenaConfig::default(), Default::default(), None).unwrap();
                    let mut core = slot.lock();
                    let _in = slot::enter(&slot, &mut core);
                    // SAFETY: as ONNX Runtime would call it.
                    let p = unsafe { alloc(this, MIB) };
                    assert!(!p.is_null());
                    barrier.wait();
                    assert!(crate::live_together().0 >= 2 * MIB);
                    barrier.wait();
                    // SAFETY: `p` came from `alloc` and is freed once.
                    unsafe { free(this, p) };
                });
            }
        });
        assert!(crate::live_together().1 >= 2 * MIB);
    }

    #[test]
    fn a_block_freed_on_another_thread_finds_its_arena() {
        let (alloc, free, this) = fns();
        let slot = Slot::new(ArenaConfig::default(), Default::default(), None).unwrap();
        let weak = Arc::downgrade(&slot);
        let mut core = slot.lock();
        let (a, b) = {
            let _in = slot::enter(&slot, &mut core);
            // SAFETY: as ONNX Runtime would call it.
            unsafe { (alloc(this, 4096) as usize, alloc(this, 4096) as usize) }
        };
        // `a` is freed while the owner holds its core (as during a run):
        // it is queued, and freed at the owner's next lock.
        std::thread::spawn(move || {
            // SAFETY: `a` came from `alloc` and is freed once.
            unsafe { free(this_ptr(), a as *mut c_void) }
        })
        .join()
        .unwrap();
        assert_eq!(core.arena_stats().live_blocks, 2);
        drop(core);
        assert_eq!(slot.lock().arena_stats().live_blocks, 1);
        // The owner retires with `b` still live; `b` keeps the arena, and its
        // free on another thread drops it.
        slot.retire();
        drop(slot);
        assert!(weak.upgrade().is_some(), "a live block keeps its arena");
        std::thread::spawn(move || {
            // SAFETY: `b` came from `alloc` and is freed once.
            unsafe { free(this_ptr(), b as *mut c_void) }
        })
        .join()
        .unwrap();
        assert!(weak.upgrade().is_none(), "the last free drops the arena");
        let _ = this;
    }

    fn this_ptr() -> *mut ort::sys::OrtAllocator {
        ALLOCATOR.0.get()
    }

    /// Review finding 4 (issue 35): the module's docs and SAFETY comments
    /// must not say that every trampoline never unwinds, since `Alloc`
    /// throws `std::bad_alloc` on purpose; they say which one does.
    #[test]
    fn the_docs_say_that_alloc_unwinds_on_purpose() {
        let src = include_str!("raw.rs");
        let docs: String = src
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .collect::<Vec<_>>()
            .join(" ");
        assert!(docs.contains("`Alloc` (`extern \"C-unwind\"`)"), "{docs}");
        assert!(docs.contains("throws the C++ `std::bad_alloc`"), "{docs}");
        let unqualified = ["never unwinds into C", "and never unwind;"];
        for claim in unqualified {
            let n = src.matches(claim).count();
            // Once each: here, in this test's own list.
            assert_eq!(n, 1, "raw.rs claims {claim:?} again");
        }
    }

    /// The registered table called as ONNX Runtime (C) calls it: its
    /// entries as plain C function pointers. `Alloc` serves the entered
    /// worker's arena and counts the call, `Free` gives the block back, and
    /// a request nothing can serve is null (throwing off: the caller is
    /// Rust) and counted as failed.
    #[test]
    fn the_table_called_through_the_c_signature_serves_the_entered_arena() {
        type CAlloc = unsafe extern "C" fn(*mut ort::sys::OrtAllocator, usize) -> *mut c_void;
        type CFree = unsafe extern "C" fn(*mut ort::sys::OrtAllocator, *mut c_void);
        let this = ALLOCATOR.0.get();
        // SAFETY: the static is only read here (nothing writes it).
        let table = unsafe { *this };
        assert_eq!(table.version, ort::sys::ORT_API_VERSION);
        let (alloc, free) = (table.Alloc.expect("Alloc"), table.Free.expect("Free"));
        // SAFETY: the C prototypes of `OrtAllocator::Alloc` and `Free`;
        // "system" is "C" on the targets ONNX Runtime ships for.
        let alloc = unsafe { std::mem::transmute::<AllocFnC, CAlloc>(alloc) };
        // SAFETY: as above.
        let free = unsafe {
            std::mem::transmute::<
                unsafe extern "system" fn(*mut ort::sys::OrtAllocator, *mut c_void),
                CFree,
            >(free)
        };
        let slot = Slot::new(ArenaConfig::default(), Default::default(), None).unwrap();
        let mut core = slot.lock();
        core.begin_run(None, false, false);
        let calls = ALLOC_CALLS.load(Ordering::Relaxed);
        let p = {
            let _in = slot::enter(&slot, &mut core);
            // SAFETY: as ONNX Runtime calls it.
            unsafe { alloc(this, 4000) }
        };
        assert!(!p.is_null() && p as usize % ALIGN == 0);
        touch(p, 4000);
        assert!(ALLOC_CALLS.load(Ordering::Relaxed) > calls);
        let st = core.arena_stats();
        assert_eq!(st.live_blocks, 1, "served by the entered arena: {st:?}");
        assert!(st.in_use >= 4000 + HEADER, "{st:?}");
        {
            let _in = slot::enter(&slot, &mut core);
            // SAFETY: `p` came from `alloc` and is freed once.
            unsafe { free(this, p) };
        }
        assert_eq!(core.arena_stats().live_blocks, 0);
        return_null_on_failure();
        let failed = thread_failed_allocs();
        // SAFETY: as ONNX Runtime calls it.
        assert!(unsafe { alloc(this, usize::MAX) }.is_null());
        assert_eq!(thread_failed_allocs(), failed + 1);
    }

    #[test]
    fn system_blocks_are_counted() {
        let before = SYSTEM_ALLOCS.load(Ordering::Relaxed);
        let p = system_alloc(10).unwrap();
        assert!(SYSTEM_ALLOCS.load(Ordering::Relaxed) > before);
        // SAFETY: `p` came from `system_alloc`; header read as `free` does.
        let h = unsafe { read_header(p) }.unwrap();
        assert_eq!(
            h,
            Header {
                owner: 0,
                size: HEADER + 10
            }
        );
        // SAFETY: freed once.
        unsafe { system_free(p, h.size) };
    }
}
