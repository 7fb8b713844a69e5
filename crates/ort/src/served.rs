//! Whether a run's tensors were served by the worker's arena: what
//! [`Worker::run`](crate::Worker::run) notes around the caller's closure.

use crate::OrtArenaError;
use std::sync::atomic::Ordering;

/// Why a run's tensors did not come from the worker's arena
/// ([`RunInfo::not_served`](crate::RunInfo::not_served)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotServed {
    /// The closure returned ONNX Runtime's asynchronous run
    /// (`session.run_async`, an `ort` `InferenceFut`): ONNX Runtime
    /// allocates that run's tensors on its own threads, after the closure
    /// returned, where no worker runs; the system allocator serves them.
    /// Await a synchronous `session.run` on a thread instead
    /// ([`WorkerPool::run_async`](crate::WorkerPool::run_async), or a
    /// [`Checkout`](crate::Checkout) in `spawn_blocking`).
    AsyncRun,
    /// The run made no allocation on the worker's thread while the system
    /// allocator served tensors through the registered allocator (blocks
    /// counted process-wide during the run): ONNX Runtime ran it on
    /// another thread, or the session was not built
    /// [`with_tensor_arena`](crate::SessionBuilderExt::with_tensor_arena)
    /// beside one that was.
    SystemAllocator {
        /// System-allocator blocks served during the run.
        blocks: u64,
    },
}

impl std::fmt::Display for NotServed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::AsyncRun => f.write_str(
                "the closure returned ONNX Runtime's run_async future, whose tensors are allocated on ONNX Runtime's threads by the system allocator; run session.run on a thread (WorkerPool::run_async, or a Checkout in spawn_blocking)",
            ),
            Self::SystemAllocator { blocks } => write!(
                f,
                "no allocation was made on the worker's thread while the system allocator served {blocks} tensor blocks (a run on another thread?)"
            ),
        }
    }
}

impl From<NotServed> for OrtArenaError {
    fn from(n: NotServed) -> Self {
        OrtArenaError::NotServed(n.to_string())
    }
}

/// Watches one run: counters before it.
pub(crate) struct Watch {
    system_before: usize,
}

impl Watch {
    pub(crate) fn start() -> Self {
        Self {
            system_before: crate::raw::SYSTEM_ALLOCS.load(Ordering::Relaxed),
        }
    }

    /// What the run that returned a `T` and made `alloc_calls` allocations
    /// on its thread was not served by, if anything.
    pub(crate) fn finish<T>(self, alloc_calls: u64) -> Option<NotServed> {
        let blocks = crate::raw::SYSTEM_ALLOCS
            .load(Ordering::Relaxed)
            .wrapping_sub(self.system_before) as u64;
        let found = judge::<T>(alloc_calls, blocks);
        if found == Some(NotServed::AsyncRun) {
            warn_once();
        }
        found
    }
}

/// The verdict on a run that returned a `T`, made `alloc_calls`
/// allocations on its thread, while the system allocator served `blocks`.
fn judge<T>(alloc_calls: u64, blocks: u64) -> Option<NotServed> {
    if is_async_run::<T>() {
        Some(NotServed::AsyncRun)
    } else {
        (alloc_calls == 0 && blocks > 0).then_some(NotServed::SystemAllocator { blocks })
    }
}

/// Whether `T` is `ort`'s future of `session.run_async` (`InferenceFut`),
/// alone or in a tuple, `Option`, `Box`... (its name appears in `T`'s).
fn is_async_run<T>() -> bool {
    std::any::type_name::<T>().contains("::InferenceFut<")
}

/// A server that passes `run_async` through a worker is told once, on
/// standard error, besides [`RunInfo::not_served`](crate::RunInfo).
fn warn_once() {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        eprintln!("tensor-arena-ort: {}", NotServed::AsyncRun);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_async_future_is_recognised_by_its_type() {
        assert!(is_async_run::<ort::session::InferenceFut<'static>>());
        assert!(is_async_run::<Option<ort::session::InferenceFut<'static>>>());
        assert!(!is_async_run::<ort::session::SessionOutputs<'static>>());
        assert!(!is_async_run::<u32>());
    }

    #[test]
    fn a_run_without_allocations_while_the_system_served_is_flagged() {
        assert_eq!(
            judge::<()>(0, 1),
            Some(NotServed::SystemAllocator { blocks: 1 })
        );
        assert_eq!(judge::<()>(0, 0), None);
        assert_eq!(judge::<()>(3, 1), None, "the arena served this run");
        assert_eq!(
            judge::<ort::session::InferenceFut<'static>>(0, 0),
            Some(NotServed::AsyncRun)
        );
        let e: OrtArenaError = NotServed::AsyncRun.into();
        assert!(e.to_string().contains("run_async"), "{e}");
    }
}
