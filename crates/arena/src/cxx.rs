//! Refusing an allocation the way a C++ host expects: by throwing
//! `std::bad_alloc` (feature `cxx`).
//!
//! C++ runtimes that embed an allocator through a C function pointer often
//! use the pointer it returns without a null check, because their own
//! allocators report failure by throwing:
//!
//! - **ONNX Runtime**: its CPU allocators throw `std::bad_alloc`; the
//!   wrapper around a registered `OrtAllocator` passes the pointer on
//!   unchecked, and the exception is caught where the kernel runs
//!   (`ExecuteKernel`) and turned into the status `Run` returns. A null is
//!   dereferenced instead (a crash, or `std::terminate` on a pool thread).
//! - **PyTorch**: `CUDAPluggableAllocator::malloc` records and returns the
//!   pointer of its `alloc_fn` unchecked, and its own caching allocator
//!   throws (`torch.cuda.OutOfMemoryError`). A null becomes a tensor at
//!   address 0: the first kernel on it is an illegal memory access, which
//!   poisons the process's CUDA context (seen on an H100: `BENCHMARKS.md`, "GPU").
//!
//! So an allocation function that nothing can serve throws `std::bad_alloc`
//! through the C++ runtime the host itself uses (`libstdc++.so.6`, already
//! loaded with it: found with `dlopen(RTLD_NOLOAD)`, never loaded here):
//! the host unwinds as from its own allocator and stays usable. The
//! function that throws must be `extern "C-unwind"`, called only from C++,
//! with no value with a destructor and no lock held in its frames when it
//! throws. Where the C++ runtime cannot be found, it returns null instead.
//!
//! Which runtime throws matters: an exception thrown by one C++ runtime and
//! caught by another (a host built with `-static-libstdc++` beside a
//! `libstdc++.so.6` loaded by something else) corrupts the catcher's
//! exception bookkeeping (its `std::uncaught_exceptions()` went negative).
//! [`runtime_for`] therefore finds the runtime a given library binds
//! `__cxa_throw` to, and answers `None` (so the caller returns null rather
//! than throw) when it cannot prove one: a library that carries a hidden
//! runtime of its own, or none in its scope. [`runtime`] is the older,
//! process-wide answer (whichever `libstdc++.so.6` is loaded).
//!
//! A build with `panic = "abort"` is refused at compile time: Rust aborts
//! the process when a foreign exception unwinds through a frame of such a
//! build, so the first refused allocation would kill the process ("panic
//! in a function that cannot unwind").

include!("cxx_panic.rs");

use std::ffi::{c_void, CStr};
use std::sync::OnceLock;

type AllocateException = unsafe extern "C" fn(usize) -> *mut c_void;
type Destructor = unsafe extern "C" fn(*mut c_void);
type Throw = unsafe extern "C-unwind" fn(*mut c_void, *mut c_void, Option<Destructor>) -> !;

/// What throwing `std::bad_alloc` takes, resolved in the loaded
/// `libstdc++.so.6`.
pub struct CxxRuntime {
    allocate: AllocateException,
    throw: Throw,
    /// `typeinfo for std::bad_alloc`.
    typeinfo: *mut c_void,
    /// `vtable for std::bad_alloc`.
    vtable: *const *const c_void,
    /// `std::bad_alloc::~bad_alloc()`.
    destructor: Destructor,
}

impl CxxRuntime {
    /// The address of this runtime's `__cxa_throw` (to tell runtimes apart).
    pub fn throw_address(&self) -> usize {
        self.throw as usize
    }
}

impl std::fmt::Debug for CxxRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CxxRuntime")
            .field("throw", &format_args!("{:#x}", self.throw_address()))
            .finish_non_exhaustive()
    }
}

// SAFETY: the fields are addresses of functions and read-only data of a
// shared library that is never unloaded while the host (which links it)
// is loaded; nothing is written through them.
unsafe impl Send for CxxRuntime {}
// SAFETY: as above: shared, read-only.
unsafe impl Sync for CxxRuntime {}

static RUNTIME: OnceLock<Option<CxxRuntime>> = OnceLock::new();

/// The C++ runtime, if a `libstdc++.so.6` is loaded in the process (the
/// host's); looked up once. Call it first once the host is loaded (when
/// registering the allocator), not while memory is short.
pub fn runtime() -> Option<&'static CxxRuntime> {
    RUNTIME.get_or_init(resolve).as_ref()
}

fn resolve() -> Option<CxxRuntime> {
    resolve_in(loaded(c"libstdc++.so.6")?)
}

/// A handle to the library `name`, if it is loaded (never loads it).
fn loaded(name: &CStr) -> Option<*mut c_void> {
    // SAFETY: `RTLD_NOLOAD` only returns a handle to a library already
    // loaded (nothing is loaded or initialised); the name is a C string.
    let lib = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    (!lib.is_null()).then_some(lib)
}

/// The loaded object that contains `addr`: its file name and base.
fn object_of(addr: *const c_void) -> Option<(std::ffi::CString, usize)> {
    // SAFETY: `Dl_info` is plain data; all-zero is a valid value to be
    // overwritten.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `dladdr` only reads the loader's tables and writes `info`.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: `dli_fname` is a NUL-terminated string of the loader's, valid
    // while the object is loaded (it is: `addr` is in it); copied now.
    let name = unsafe { CStr::from_ptr(info.dli_fname) }.to_owned();
    Some((name, info.dli_fbase as usize))
}

/// The C++ runtime that the loaded library containing `addr` (a function
/// of the caller that will catch: for ONNX Runtime, one of its API
/// functions) binds `__cxa_throw` to, if that can be established; looked
/// up each call (do it once, when the library is first seen, and keep the
/// answer).
///
/// - The library's own scope (itself, then its dependencies) must define
///   `__cxa_throw`: a library with no C++ runtime in its scope, or one that
///   linked a runtime statically and hid it (`-static-libstdc++` with its
///   symbols not exported), gets `None`, since throwing through any other
///   runtime would be caught by one that does not know the exception.
/// - A definition in the library itself is its own runtime; otherwise the
///   process's global scope comes first, as the dynamic linker binds by
///   default (a library loaded with `RTLD_DEEPBIND` or linked with
///   `-Bsymbolic` binds in its own scope first: not told apart here).
/// - When the code is the main program, its scope is the global scope:
///   a program that linked its C++ runtime statically while another
///   `libstdc++.so.6` is loaded globally cannot be told apart from one that
///   uses that library (it would need the program's undefined dynamic
///   symbols), and gets that library's runtime, as [`runtime`] gives.
///
/// With `None` the allocation function returns null instead of throwing:
/// what a host then does with it is its own (ONNX Runtime dereferences it).
pub fn runtime_for(addr: *const c_void) -> Option<&'static CxxRuntime> {
    static FOUND: std::sync::Mutex<Vec<(usize, &'static CxxRuntime)>> =
        std::sync::Mutex::new(Vec::new());
    let (name, base) = object_of(addr)?;
    let lib = loaded(&name).or_else(|| main_program(base))?;
    let throw = c"__cxa_throw";
    // SAFETY: `lib` is a live handle and the name a C string.
    let local = unsafe { libc::dlsym(lib, throw.as_ptr()) };
    if local.is_null() {
        return None;
    }
    let chosen = if object_of(local).is_some_and(|(_, b)| b == base) {
        local
    } else {
        // SAFETY: `RTLD_DEFAULT` searches the global scope; the name is a
        // C string.
        let global = unsafe { libc::dlsym(libc::RTLD_DEFAULT, throw.as_ptr()) };
        if global.is_null() {
            local
        } else {
            global
        }
    };
    let (runtime_name, runtime_base) = object_of(chosen)?;
    let mut found = FOUND.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, rt)) = found.iter().find(|(b, _)| *b == runtime_base) {
        return Some(rt);
    }
    let rt = resolve_in(loaded(&runtime_name)?)?;
    if rt.throw as usize != chosen as usize {
        return None;
    }
    // One per runtime for the process's life (a handful at most).
    let rt: &'static CxxRuntime = Box::leak(Box::new(rt));
    found.push((runtime_base, rt));
    Some(rt)
}

/// A handle to the main program if it is the object at `base` (its name
/// as the loader gives it cannot be opened again): its scope is the
/// process's global scope.
fn main_program(base: usize) -> Option<*mut c_void> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `getauxval` reads the auxiliary vector the kernel gave
        // the process; AT_PHDR is the main program's program headers.
        let phdr = unsafe { libc::getauxval(libc::AT_PHDR) } as *const c_void;
        if object_of(phdr).is_some_and(|(_, b)| b == base) {
            // SAFETY: a null name asks for the main program's handle.
            let h = unsafe { libc::dlopen(std::ptr::null(), libc::RTLD_LAZY) };
            return (!h.is_null()).then_some(h);
        }
    }
    let _ = base;
    None
}

/// The C++ runtime of the code that called into the library this function
/// is linked in (a `cdylib` whose allocation function a C++ host calls):
/// [`runtime_for`] of the first return address on the stack outside that
/// library. Call it from inside the allocation function, while memory is
/// not short, and keep the answer. `None` where the stack cannot be read
/// (targets other than Linux with glibc) or where [`runtime_for`] says so.
///
/// # Limits
/// The answer is a best effort from the stack and the loader's tables:
/// - **A caller the loader cannot name** (JIT-compiled code, a libffi
///   closure: `dladdr` finds no object for its address) gets `None`: the
///   runtime of a library further up the stack is not the one that would
///   catch, so the allocation function returns null rather than throw.
/// - **Binding is assumed to follow the global scope first**, as the
///   dynamic linker does by default (see [`runtime_for`]). A caller loaded
///   with `RTLD_DEEPBIND`, or linked with `-Bsymbolic`, binds `__cxa_throw`
///   in its own scope first: where a different C++ runtime is loaded
///   globally, the answer names that one, not the caller's.
/// - **Callers keep one answer.** Looked up once and kept (as the
///   allocation functions of this workspace do), the answer is the first
///   caller's: a second C++ host in the process, calling through another
///   runtime, would be thrown at through the first's.
pub fn runtime_for_caller() -> Option<&'static CxxRuntime> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let own = object_of(runtime_for_caller as *const c_void)?.1;
        let mut frames = [std::ptr::null_mut::<c_void>(); 64];
        // SAFETY: `backtrace` writes at most 64 return addresses into the
        // array it is given, which has room for 64.
        let n = unsafe { libc::backtrace(frames.as_mut_ptr(), 64) };
        let n = usize::try_from(n).unwrap_or(0).min(frames.len());
        let caller = first_caller(&frames[..n], own, |f| object_of(f).map(|(_, b)| b))?;
        return runtime_for(caller);
    }
    #[allow(unreachable_code)]
    None
}

/// The first of `frames` (innermost first) outside the object based at
/// `own`, as `base_of` names each frame's object: `None` when every frame
/// is `own`'s, or when the first frame outside it has no name (unknown
/// code: whatever library lies further up did not make the call).
/// libc's `backtrace` reports none of its own frames.
fn first_caller(
    frames: &[*mut c_void],
    own: usize,
    base_of: impl Fn(*const c_void) -> Option<usize>,
) -> Option<*const c_void> {
    for &f in frames {
        match base_of(f) {
            Some(b) if b == own => continue,
            Some(_) => return Some(f),
            None => return None,
        }
    }
    None
}

/// The runtime's symbols as the handle `lib` resolves them.
fn resolve_in(lib: *mut c_void) -> Option<CxxRuntime> {
    let sym = |name: &CStr| -> Option<*mut c_void> {
        // SAFETY: `lib` is a live handle (kept: never closed) and `name`
        // a C string.
        let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
        (!p.is_null()).then_some(p)
    };
    let allocate = sym(c"__cxa_allocate_exception")?;
    let throw = sym(c"__cxa_throw")?;
    let typeinfo = sym(c"_ZTISt9bad_alloc")?;
    let vtable = sym(c"_ZTVSt9bad_alloc")?;
    let destructor = sym(c"_ZNSt9bad_allocD1Ev")?;
    // SAFETY: each address is the symbol of that name in the Itanium C++
    // ABI's runtime, whose signatures are the types transmuted to:
    // `void* __cxa_allocate_exception(size_t)`,
    // `void __cxa_throw(void*, std::type_info*, void (*)(void*))` (never
    // returns; unwinds), and `bad_alloc::~bad_alloc()` (`this` only).
    unsafe {
        Some(CxxRuntime {
            allocate: std::mem::transmute::<*mut c_void, AllocateException>(allocate),
            throw: std::mem::transmute::<*mut c_void, Throw>(throw),
            typeinfo,
            vtable: vtable.cast_const().cast(),
            destructor: std::mem::transmute::<*mut c_void, Destructor>(destructor),
        })
    }
}

/// Throws `std::bad_alloc`; never returns.
///
/// # Safety
/// - The caller is an `extern "C-unwind"` function called from C++ (the
///   host), and every frame between here and that caller may be unwound
///   by a foreign exception: no Rust frame in between has a value with a
///   destructor or a lock held.
pub unsafe fn throw_bad_alloc(rt: &CxxRuntime) -> ! {
    // `std::bad_alloc` is one vtable pointer (an exception with no data).
    // SAFETY: `__cxa_allocate_exception` returns room for an object of the
    // size asked (it terminates rather than returning null).
    let obj = unsafe { (rt.allocate)(size_of::<*const c_void>()) };
    // The object's vtable pointer: the vtable's address point, two words in
    // (after offset-to-top and the typeinfo pointer), as the Itanium ABI
    // lays out a class with one primary vtable.
    // SAFETY: the vtable symbol has at least those two words and the
    // virtual functions after them.
    let address_point = unsafe { rt.vtable.add(2) };
    // SAFETY: `obj` is fresh, aligned for a pointer, and its size.
    unsafe { obj.cast::<*const *const c_void>().write(address_point) };
    // SAFETY: `obj` is an initialised `std::bad_alloc` in exception
    // storage, with its typeinfo and destructor; the caller allows the
    // unwinding (see above).
    unsafe { (rt.throw)(obj, rt.typeinfo, Some(rt.destructor)) }
}

#[cfg(test)]
mod tests {
    use super::first_caller;
    use std::ffi::c_void;

    /// Frames at addresses 1, 2, ...; `objects` gives each frame's object
    /// base (0: none the loader can name).
    fn pick(objects: &[usize]) -> Option<usize> {
        let frames: Vec<*mut c_void> = (1..=objects.len()).map(|i| i as *mut c_void).collect();
        first_caller(&frames, 100, |f| {
            let base = objects[f as usize - 1];
            (base != 0).then_some(base)
        })
        .map(|f| f as usize)
    }

    #[test]
    fn the_caller_is_the_first_frame_outside_the_library() {
        assert_eq!(pick(&[100, 100, 200, 300]), Some(3));
        assert_eq!(pick(&[200, 100, 300]), Some(1));
        assert_eq!(pick(&[100, 100]), None, "no frame outside the library");
        assert_eq!(pick(&[]), None);
    }

    #[test]
    fn an_unnamed_caller_is_not_skipped() {
        // JIT code or a libffi closure called the library: the library
        // further up (200) did not, and its runtime is not the catcher's.
        assert_eq!(pick(&[100, 0, 200]), None);
        assert_eq!(pick(&[100, 300, 0, 200]), Some(2), "only the first counts");
    }
}
