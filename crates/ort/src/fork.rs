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
//! | the default budget          | a worker's creation                   |
//! | the decay pass              | one pass of the background thread: its refits (< 1 ms each) and decay |
//! | the decay registry          | a worker's registration, a pass's collection |
//! | the plan caches (shared)    | a run's lookup and its learning after the run (not the run), `Plans`' stats and saves |
//! | the refits owed             | a run's end, a pass's collection      |
//! | the arena registry          | a worker's creation, `arenas()`       |
//! | the decay thread's handle   | waking it                             |
//!
//! Nothing here waits for a run: a worker a run held at the fork belongs to
//! a thread the child does not have, and is left out of the child's pool
//! (its memory stays mapped in the child, shared copy-on-write with the
//! parent, and counted in [`arenas`](crate::arenas)).
//!
//! What any thread may touch outside these locks is never locked at all,
//! so no fork can copy it held: a budget's members (the default budget's
//! and a caller's, joined at each worker's creation outside the locks
//! above) and each worker's published stats are lists and values swapped
//! atomically. A budget's members were a lock until a child hung on it:
//! the parent's thread creating a worker held it at the fork (1 child in
//! 500 on CI's machine; `tests/fork.rs`).
//!
//! Nothing is registered with the C library: the caller calls these from
//! its own fork hooks (the Python package from `os.register_at_fork`). A
//! caller with process-wide locks of its own takes them with the same
//! protection: a [`ForkMutex`] or [`ForkRwLock`] (whose waiters leave
//! nothing behind in the child), its guard kept by [`hold`] before
//! [`prepare`], and let go with this crate's by [`parent`] or [`child`].

use crate::{decay, learn, limit, slot};

pub use crate::forklock::{hold, ForkMutex, ForkRwLock};

/// Takes this crate's process-wide locks, in the parent, just before
/// `fork()`, and keeps their guards on this thread. Must be followed by
/// [`parent`] in the parent and [`child`] in the child (or by [`parent`]
/// alone if the fork failed), on the same thread, with no call into this
/// crate in between.
pub fn prepare() {
    limit::prepare_fork();
    decay::prepare_fork();
    learn::prepare_fork();
    slot::prepare_fork();
    decay::prepare_fork_thread();
}

/// Lets go, in the parent after `fork()`, the locks [`prepare`] and
/// [`hold`] kept on this thread, last taken first.
pub fn parent() {
    crate::forklock::release();
}

/// In the child after `fork()`: lets go the locks [`prepare`] and [`hold`]
/// kept on this thread, forgets the parent's decay thread, and starts one
/// for this process if a worker is waiting to decay.
///
/// # Safety
/// - Called in the child process right after `fork()`, on the thread that
///   forked, before any other thread of the child calls into this crate;
/// - [`prepare`] was called in the parent just before the fork.
pub unsafe fn child() {
    crate::forklock::release();
    limit::child_after_fork();
    slot::child_after_fork();
    decay::child_after_fork();
    decay::wake_if_due();
}
