//! [`SessionPool`]: per-thread clones lent to workers.

use crate::session::{Session, SessionConfig, SessionStats};
use crate::swap::ModelHandle;
use parking_lot::{Condvar, Mutex};
use std::fmt;
use std::ops::{Deref, DerefMut};
use tensor_arena::{DefaultMemory, HostMemory};

/// Lends clones of one session to worker threads.
///
/// [`SessionPool::get`] hands out an idle clone, or makes a new one while
/// fewer than `max_sessions` exist, or waits for one to come back. The
/// guard gives the clone back when dropped. The pool's lock is held only to
/// take or return a clone, never while a worker runs.
///
/// A pool made [`from_session`](SessionPool::from_session) of a
/// [`BudgetedSession`](crate::BudgetedSession) lends clones that all commit
/// under the template's budget; idle clones give their cache back when
/// another member needs room.
pub struct SessionPool<M: HostMemory + Send + 'static = DefaultMemory> {
    /// Clones are made from this one (it never runs).
    template: Mutex<Session<M>>,
    idle: Mutex<Idle<M>>,
    returned: Condvar,
    max_sessions: usize,
}

struct Idle<M: HostMemory + Send + 'static> {
    sessions: Vec<Session<M>>,
    /// Clones that exist (idle or lent).
    count: usize,
    /// Counters of clones dropped by `trim`, so that pool stats keep them.
    retired: SessionStats,
}

impl SessionPool {
    /// A pool of at most `max_sessions` clones (at least 1) of a session
    /// over `model`.
    ///
    /// # Panics
    /// If `config.arena` is inconsistent.
    pub fn new(model: ModelHandle, config: SessionConfig, max_sessions: usize) -> Self {
        Self::from_session(Session::with_model(model, config), max_sessions)
    }
}

impl<M: HostMemory + Send + 'static> SessionPool<M> {
    /// A pool whose clones are made from `template` (which itself is kept
    /// only to clone from).
    pub fn from_session(template: Session<M>, max_sessions: usize) -> Self {
        Self {
            template: Mutex::new(template),
            idle: Mutex::new(Idle {
                sessions: Vec::new(),
                count: 0,
                retired: SessionStats::default(),
            }),
            returned: Condvar::new(),
            max_sessions: max_sessions.max(1),
        }
    }

    /// The handle the pool's sessions read weights from: swap it to update
    /// the model for every worker.
    pub fn model(&self) -> ModelHandle {
        self.template.lock().model().clone()
    }

    /// A session for this thread: an idle clone, a new clone if fewer than
    /// the bound exist, or else the next one given back (this waits).
    pub fn get(&self) -> PoolGuard<'_, M> {
        let mut idle = self.idle.lock();
        loop {
            if let Some(session) = idle.sessions.pop() {
                return self.guard(session);
            }
            if idle.count < self.max_sessions {
                idle.count += 1;
                drop(idle);
                let session = self.template.lock().try_clone();
                return self.guard(session);
            }
            self.returned.wait(&mut idle);
        }
    }

    /// Like [`SessionPool::get`], but `None` instead of waiting.
    pub fn try_get(&self) -> Option<PoolGuard<'_, M>> {
        let mut idle = self.idle.lock();
        if let Some(session) = idle.sessions.pop() {
            return Some(self.guard(session));
        }
        if idle.count < self.max_sessions {
            idle.count += 1;
            drop(idle);
            let session = self.template.lock().try_clone();
            return Some(self.guard(session));
        }
        None
    }

    fn guard(&self, session: Session<M>) -> PoolGuard<'_, M> {
        PoolGuard {
            pool: self,
            session: Some(session),
        }
    }

    fn give_back(&self, session: Session<M>) {
        self.idle.lock().sessions.push(session);
        self.returned.notify_one();
    }

    /// Shrinks every idle clone's arena to its watermark; returns the bytes
    /// released.
    pub fn shrink_idle(&self) -> usize {
        let mut idle = self.idle.lock();
        idle.sessions.iter_mut().map(Session::shrink).sum()
    }

    /// Drops idle clones until at most `keep` remain idle; returns how many
    /// were dropped. Each dropped clone frees all its arena's memory.
    pub fn trim(&self, keep: usize) -> usize {
        let mut idle = self.idle.lock();
        let mut dropped = 0;
        while idle.sessions.len() > keep {
            let session = idle.sessions.pop().expect("len > keep");
            let stats = session.stats();
            add(&mut idle.retired, &stats, false);
            idle.count -= 1;
            dropped += 1;
            drop(session);
        }
        dropped
    }

    /// Clones that exist now (idle or lent).
    pub fn sessions(&self) -> usize {
        self.idle.lock().count
    }

    /// Idle clones now.
    pub fn idle(&self) -> usize {
        self.idle.lock().sessions.len()
    }

    /// The bound on clones.
    pub fn max_sessions(&self) -> usize {
        self.max_sessions
    }

    /// Counters summed over the idle clones (lent clones are counted when
    /// they come back) and the clones trimmed so far; arena byte figures
    /// (`in_use`, `reserved`...) cover the idle clones only.
    pub fn stats(&self) -> SessionStats {
        let idle = self.idle.lock();
        let mut total = idle.retired;
        total.arena.in_use = 0;
        total.arena.reserved = 0;
        for s in &idle.sessions {
            add(&mut total, &s.stats(), true);
        }
        let t = self.template.lock().stats();
        total.clones_alive = t.clones_alive;
        total.clones_created = t.clones_created;
        total.weight_bytes_mapped = t.weight_bytes_mapped;
        total.weight_bytes_copied = t.weight_bytes_copied;
        total.plans = t.plans;
        total
    }
}

/// Adds `s` into `total`; with `bytes`, also the arena's current byte figures.
fn add(total: &mut SessionStats, s: &SessionStats, bytes: bool) {
    let (t, a) = (&mut total.arena, &s.arena);
    if bytes {
        t.in_use += a.in_use;
        t.reserved += a.reserved;
        t.free_bytes += a.free_bytes;
        t.regions += a.regions;
        t.live_blocks += a.live_blocks;
        t.watermark = t.watermark.max(a.watermark);
        t.largest_free_block = t.largest_free_block.max(a.largest_free_block);
    }
    t.peak_in_use = t.peak_in_use.max(a.peak_in_use);
    t.allocs += a.allocs;
    t.frees += a.frees;
    t.cache_hits += a.cache_hits;
    t.backing_allocs += a.backing_allocs;
    t.backing_frees += a.backing_frees;
    t.bytes_released += a.bytes_released;
    t.runs += a.runs;
    t.shrinks += a.shrinks;
    t.relayouts += a.relayouts;
    t.planned_allocs += a.planned_allocs;
    t.planned_runs += a.planned_runs;
    t.deviations += a.deviations;
    total.runs += s.runs;
    total.keys = total.keys.max(s.keys);
}

impl<M: HostMemory + Send + 'static> fmt::Debug for SessionPool<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionPool")
            .field("sessions", &self.sessions())
            .field("idle", &self.idle())
            .field("max_sessions", &self.max_sessions)
            .finish()
    }
}

/// A session lent by a [`SessionPool`]; derefs to [`Session`] and goes
/// back to the pool when dropped.
///
/// `DerefMut` hands out `&mut Session`, so the lent session can be replaced
/// or swapped (`*guard = other`, `mem::swap`). That is sound: a session owns
/// its arena, and whatever replaces it goes back to the pool in its place.
/// What must not happen, replacing the session while a buffer borrows its
/// arena, does not compile:
///
/// ```compile_fail
/// # use std::sync::Arc;
/// # use tensor_session::{Dtype, ModelHandle, Session, SessionConfig, SessionPool, Weights};
/// # let w = Arc::new(Weights::from_tensors([("w", Dtype::U8, vec![1], vec![0u8])]).unwrap());
/// let pool = SessionPool::new(ModelHandle::new(Arc::clone(&w)), SessionConfig::default(), 1);
/// let mut guard = pool.get();
/// let arena = guard.arena();
/// let block = arena.try_alloc(64).unwrap();
/// *guard = Session::new(w, SessionConfig::default()); // the arena `block` lives in would drop
/// drop((block, arena));
/// ```
pub struct PoolGuard<'p, M: HostMemory + Send + 'static = DefaultMemory> {
    pool: &'p SessionPool<M>,
    session: Option<Session<M>>,
}

impl<M: HostMemory + Send + 'static> PoolGuard<'_, M> {
    /// Keeps the session out of the pool for good (it no longer counts
    /// against the bound).
    pub fn detach(mut self) -> Session<M> {
        let session = self.session.take().expect("guard holds a session");
        self.pool.idle.lock().count -= 1;
        self.pool.returned.notify_one();
        session
    }
}

impl<M: HostMemory + Send + 'static> Deref for PoolGuard<'_, M> {
    type Target = Session<M>;
    fn deref(&self) -> &Session<M> {
        self.session.as_ref().expect("guard holds a session")
    }
}

impl<M: HostMemory + Send + 'static> DerefMut for PoolGuard<'_, M> {
    fn deref_mut(&mut self) -> &mut Session<M> {
        self.session.as_mut().expect("guard holds a session")
    }
}

impl<M: HostMemory + Send + 'static> Drop for PoolGuard<'_, M> {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            self.pool.give_back(session);
        }
    }
}

impl<M: HostMemory + Send + 'static> fmt::Debug for PoolGuard<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PoolGuard").field(&self.session).finish()
    }
}
