//! Joining a server's own `ort` setup: the allocator registered on *its*
//! environment, and one call on *its* `SessionBuilder`.

use crate::OrtArenaError;
use ort::session::builder::SessionBuilder;
use ort::AsPointer;
use std::sync::atomic::{AtomicBool, Ordering};

/// Environments the allocator is registered on (their `OrtEnv` addresses).
static REGISTERED_ON: parking_lot::Mutex<Vec<usize>> = parking_lot::Mutex::new(Vec::new());
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
/// # Errors
/// [`OrtArenaError::Ort`] if ONNX Runtime refuses the registration (for
/// instance another allocator for CPU memory is already registered on the
/// environment).
pub fn register(env: &ort::environment::Environment) -> Result<(), OrtArenaError> {
    let addr = env.ptr() as usize;
    let mut on = REGISTERED_ON.lock();
    if on.contains(&addr) {
        return Ok(());
    }
    crate::raw::register(env).map_err(OrtArenaError::Ort)?;
    on.push(addr);
    REGISTERED.store(true, Ordering::Release);
    Ok(())
}

/// Whether the allocator has been registered on an environment in this
/// process.
pub fn is_registered() -> bool {
    REGISTERED.load(Ordering::Acquire)
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
