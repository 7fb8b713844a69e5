//! Locks a `fork()` takes, and the guards it holds across the fork.
//!
//! A process-wide lock that [`crate::fork::prepare`] takes may have
//! waiters at the fork: a run's thread waiting to register a worker, the
//! decay thread waiting for its pass. Such a waiter does not exist in the
//! child. With `parking_lot`, a waiter leaves a record in the global queue
//! of parked threads, copied into the child; an unlock in the child then
//! wakes that missing thread instead of one of the child's, which waits
//! forever (`tests/fork.rs`; 1 child in 50 with ONNX Runtime,
//! `test_fork.py`). These locks are the standard library's: their waiters
//! are the kernel's (a futex word), and none is left in the child.
//!
//! The guards the fork takes are kept in a thread-local list ([`hold`]) and
//! dropped, last taken first, right after the fork in the parent and in the
//! child ([`release`]): the same thread, so no lock is unlocked by a thread
//! that does not hold it, and no `unsafe` is needed.

use std::any::Any;
use std::cell::RefCell;
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A mutex safe to hold across `fork()` (see the module's docs).
/// Poisoning is ignored: the data of these locks stays consistent when a
/// holder panics (each update is a single push, take or store).
#[derive(Debug, Default)]
pub struct ForkMutex<T>(Mutex<T>);

impl<T> ForkMutex<T> {
    /// A mutex holding `value`.
    pub const fn new(value: T) -> Self {
        Self(Mutex::new(value))
    }

    /// Locks it, waiting for its holder.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Locks it if nobody holds it, without waiting: `None` if held. A
    /// thread that must not wait (one holding Python's GIL, say) tries
    /// this first and waits only after letting its own lock go.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        match self.0.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
}

/// A readers-writer lock safe to hold across `fork()` (see the module's
/// docs). A waiting writer keeps new readers out. Poisoning is ignored, as
/// for [`ForkMutex`].
#[derive(Debug, Default)]
pub struct ForkRwLock<T>(RwLock<T>);

impl<T> ForkRwLock<T> {
    /// A lock holding `value`.
    pub const fn new(value: T) -> Self {
        Self(RwLock::new(value))
    }

    /// Shares it, waiting for a writer.
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes it alone, waiting for the readers.
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}

thread_local! {
    static HELD: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

/// Keeps `guard` (a lock taken for the fork) on this thread until
/// [`fork::parent`](crate::fork::parent) or
/// [`fork::child`](crate::fork::child) drops it (last taken, first
/// dropped).
pub fn hold<G: 'static>(guard: G) {
    HELD.with(|h| h.borrow_mut().push(Box::new(guard)));
}

/// Drops the guards [`hold`] kept on this thread, last taken first.
pub(crate) fn release() {
    while let Some(g) = HELD.with(|h| h.borrow_mut().pop()) {
        drop(g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static A: ForkMutex<u32> = ForkMutex::new(0);
    static B: ForkRwLock<u32> = ForkRwLock::new(0);

    #[test]
    fn held_guards_keep_their_locks_until_released() {
        hold(A.lock());
        hold(B.write());
        std::thread::scope(|s| {
            s.spawn(|| {
                assert!(A.try_lock().is_none());
                assert!(B.0.try_read().is_err());
            });
        });
        release();
        *A.lock() += 1;
        assert_eq!(*B.read(), 0);
        assert_eq!(*A.lock(), 1);
        assert_eq!(A.try_lock().map(|g| *g), Some(1));
    }

    #[test]
    fn try_lock_takes_a_poisoned_lock() {
        static P: ForkMutex<u32> = ForkMutex::new(7);
        let _ = std::thread::spawn(|| {
            let _g = P.lock();
            panic!("poisons it");
        })
        .join();
        assert_eq!(P.try_lock().map(|g| *g), Some(7));
    }
}
