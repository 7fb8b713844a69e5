//! Joining a server's own `ort` setup: the allocator registered on *its*
//! environment, and one call on *its* `SessionBuilder`.

use crate::OrtArenaError;
use ort::session::builder::SessionBuilder;
use ort::AsPointer;
use std::sync::atomic::{AtomicBool, Ordering};

/// Serialises registrations (ONNX Runtime's check and register are two
/// calls).
static REGISTERING: parking_lot::Mutex<()> = parking_lot::Mutex::new(());
static REGISTERED: AtomicBool = AtomicBool::new(false);

/// Registers tensor-arena's CPU allocator on `env`, the environment the
/// server already made (`ort::init()...build()` or `ort::init_from(path)`),
/// so that sessions built with
/// [`with_tensor_arena`](SessionBuilderExt::with_tensor_arena) take their
/// CPU tensors from it. Registering again on the same environment does
/// nothing.
///
/// Until a [`Worker`](crate::Worker) runs on a thread, allocations there
/// (initializers at session creation, other code's runs) are served by the
/// system allocator, counted in [`allocator_counters`](crate::allocator_counters).
///
/// Registering changes nothing process-wide: the C library's heaps stay
/// as the program set them ([`limit_system_heaps`](crate::limit_system_heaps)
/// says how to choose them).
///
/// Whether `env` already has the allocator is asked of `env` itself (ONNX
/// Runtime's `GetSharedAllocator`), not of a list of addresses seen: an
/// environment dropped and made again, even at the same address, is
/// registered again.
///
/// # Errors
/// [`OrtArenaError::Ort`] if ONNX Runtime refuses the registration (for
/// instance another allocator for CPU memory is already registered on the
/// environment).
pub fn register(env: &ort::environment::Environment) -> Result<(), OrtArenaError> {
    register_ptr(env.ptr().cast_mut())
}

/// [`register`] on a raw environment, live for the call.
pub(crate) fn register_ptr(env: *mut ort::sys::OrtEnv) -> Result<(), OrtArenaError> {
    let _one = REGISTERING.lock();
    if crate::raw::registered_on(env).map_err(OrtArenaError::Ort)? {
        return Ok(());
    }
    crate::raw::register_ptr(env).map_err(OrtArenaError::Ort)?;
    REGISTERED.store(true, Ordering::Release);
    Ok(())
}

/// Whether the allocator has been registered on an environment in this
/// process (the process-wide check
/// [`with_tensor_arena`](SessionBuilderExt::with_tensor_arena) makes: `ort`
/// does not show a builder's environment). That environment may since have
/// been dropped; [`is_registered_on`] asks a given environment.
pub fn is_registered() -> bool {
    REGISTERED.load(Ordering::Acquire)
}

/// Whether `env` has this crate's allocator as its CPU allocator now (asked
/// of ONNX Runtime).
pub fn is_registered_on(env: &ort::environment::Environment) -> bool {
    crate::raw::registered_on(env.ptr().cast_mut()).unwrap_or(false)
}

/// One call on a server's own `SessionBuilder` that makes the session's CPU
/// tensors come from tensor-arena.
pub trait SessionBuilderExt: Sized {
    /// Sets what the arena needs and nothing else:
    /// - `session.use_env_allocators = 1`: the session takes the
    ///   environment's CPU allocator, tensor-arena's (see [`register`]);
    /// - ONNX Runtime's CPU memory arena off (it would sit between ONNX
    ///   Runtime and the allocator, caching blocks of its own);
    /// - the memory pattern off (one block per run sized by ONNX Runtime's
    ///   own planner; the worker's plans replace it).
    ///
    /// Every other option (optimization level, threads, execution
    /// providers, config entries, how the model is loaded) stays as the
    /// caller set it, before or after this call. Execution providers other
    /// than the CPU keep their own device memory.
    ///
    /// # Errors
    /// An `ort` error if the allocator is not registered on an environment
    /// yet (call [`register`] first), or if ONNX Runtime refuses an option.
    fn with_tensor_arena(self) -> ort::Result<SessionBuilder>;
}

impl SessionBuilderExt for SessionBuilder {
    fn with_tensor_arena(self) -> ort::Result<SessionBuilder> {
        if !is_registered() {
            return Err(ort::Error::new(
                "tensor-arena's allocator is not registered: call tensor_arena_ort::register(&environment) before building sessions with it",
            ));
        }
        let mut b = self
            .with_env_allocators()
            .map_err(ort::Error::<()>::from)?
            .with_memory_pattern(false)
            .map_err(ort::Error::<()>::from)?;
        crate::raw::disable_cpu_arena(&mut b).map_err(ort::Error::new)?;
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    //! Review finding 5 (issue 35): registration is asked of the
    //! environment. ONNX Runtime's environments are made through its C API
    //! here (`ort` allows one per process), with the library the tests
    //! fetch.
    use super::*;

    fn library() -> std::path::PathBuf {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let dir = std::env::var_os("TENSOR_ARENA_ORT_ASSETS")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| root.join("target/ort-assets"));
        let lib = dir.join("libonnxruntime.so");
        if !lib.is_file() {
            let ok = std::process::Command::new("bash")
                .arg(root.join("tools/fetch-ort-assets.sh"))
                .arg(&dir)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "tools/fetch-ort-assets.sh failed");
        }
        lib
    }

    fn create_env() -> *mut ort::sys::OrtEnv {
        let api = ort::api();
        let mut env = std::ptr::null_mut();
        // SAFETY: a NUL-terminated name and a place for the result.
        let status = unsafe {
            (api.CreateEnv)(
                ort::sys::OrtLoggingLevel::ORT_LOGGING_LEVEL_WARNING,
                c"register-test".as_ptr(),
                &mut env,
            )
        };
        crate::raw::status_result_for_tests(status).unwrap();
        assert!(!env.is_null());
        env
    }

    fn release_env(env: *mut ort::sys::OrtEnv) {
        // SAFETY: `env` came from `CreateEnv` and is released once.
        unsafe { (ort::api().ReleaseEnv)(env) };
    }

    #[test]
    fn a_recreated_environment_and_two_environments_are_each_registered() {
        // Loads the library (no environment is made through `ort`).
        let _ = ort::init_from(library()).expect("ONNX Runtime is needed for this test");
        let a = create_env();
        assert!(!crate::raw::registered_on(a).unwrap());
        register_ptr(a).unwrap();
        assert!(crate::raw::registered_on(a).unwrap());
        register_ptr(a).unwrap(); // again: nothing happens
                                  // A second environment while the first lives: ONNX Runtime hands
                                  // out the same one (counted), which has the allocator.
        let b = create_env();
        assert!(crate::raw::registered_on(b).unwrap());
        register_ptr(b).unwrap();
        release_env(b);
        assert!(crate::raw::registered_on(a).unwrap());
        // Released for good, then made again: a new environment (often at
        // the same address) without the allocator, registered again.
        release_env(a);
        let c = create_env();
        assert!(
            !crate::raw::registered_on(c).unwrap(),
            "a new environment has no allocator yet"
        );
        register_ptr(c).unwrap();
        assert!(crate::raw::registered_on(c).unwrap());
        release_env(c);
    }
}
