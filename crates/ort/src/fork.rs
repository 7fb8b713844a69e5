//! Forking a process that has workers (`gunicorn --preload`,
//! `multiprocessing` with fork): the child's workers, idle decay and
//! budget work as in a fresh process.
//!
//! `fork()` copies the calling thread only. A lock another thread held at
//! that instant stays held in the child forever, and a thread (the decay
//! thread, a run's thread) does not exist there. So, as `pthread_atfork`
//! prescribes, the forking thread takes this crate's process-wide locks
//! just before the fork ([`prepare`]) and lets them go just after it, in
//! the parent ([`parent`]) and in the child ([`child`]); in the child the
//! decay thread is started again where a worker is waiting to decay, and a
//! pool is rebuilt with [`WorkerPool::after_fork`](crate::WorkerPool::after_fork).
//!
//! | lock (taken in this order)  | held by others for                    |
//! |-----------------------------|---------------------------------------|
//! | the decay pass              | one pass of the decay thread (< 1 ms) |
//! | the decay registry          | a worker's registration, a pass's collection |
//! | the arena registry          | a worker's creation, `arenas()`       |
//! | the decay thread's handle   | waking it                             |
//!
//! Nothing here waits for a run: a worker a run held at the fork belongs to
//! a thread the child does not have, and is left out of the child's pool
//! (its memory stays mapped in the child, shared copy-on-write with the
//! parent, and counted in [`arenas`](crate::arenas)).
//!
//! Nothing is registered with the C library: the caller calls these from
//! its own fork hooks (the Python package from `os.register_at_fork`).

use crate::{decay, slot};

/// Takes this crate's process-wide locks, in the parent, just before
/// `fork()`. Must be followed by [`parent`] in the parent and [`child`] in
/// the child (or by [`parent`] alone if the fork failed), on the same
/// thread, with no call into this crate in between.
pub fn prepare() {
    decay::prepare_fork();
    slot::prepare_fork();
    decay::prepare_fork_thread();
}

/// Lets the locks [`prepare`] took go, in the parent after `fork()`.
///
/// # Safety
/// - [`prepare`] was called on this thread just before, and neither
///   [`parent`] nor [`child`] since.
pub unsafe fn parent() {
    // SAFETY: the caller vouches that `prepare` took the locks on this
    // thread and nothing released them since.
    unsafe {
        decay::release_fork_thread();
        slot::release_fork();
        decay::release_fork();
    }
}

/// In the child after `fork()`: lets the locks [`prepare`] took go, frees
/// the stats locks of workers whose runs were cut off by the fork, forgets
/// the parent's decay thread, and starts one for this process if a worker
/// is waiting to decay.
///
/// # Safety
/// - Called in the child process right after `fork()`, on the thread that
///   forked, before any other thread of the child calls into this crate;
/// - [`prepare`] was called in the parent just before the fork.
pub unsafe fn child() {
    // SAFETY: as the caller vouches, this is the forking thread in the
    // child, which holds the locks `prepare` took; no other thread runs.
    unsafe {
        decay::child_after_fork();
        slot::child_after_fork();
        slot::release_fork();
        decay::release_fork();
    }
    decay::wake_if_due();
}
