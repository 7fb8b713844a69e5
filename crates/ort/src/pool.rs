//! A bounded pool of workers for elastic executors: the number of arenas
//! follows the concurrency the server chooses, not the number of threads
//! its executor happens to run (tokio's blocking pool, rayon, any pool).
//!
//! | a request                 | what it does                                       |
//! |---------------------------|----------------------------------------------------|
//! | [`WorkerPool::checkout`]  | waits (blocking) for an idle worker, takes it      |
//! | [`WorkerPool::checkout_async`] | the same as a future: the task waits, no thread does |
//! | [`WorkerPool::run_async`] | checks out asynchronously, runs on one of the pool's run threads, returns the result as a future |
//! | dropping a [`Checkout`]   | the worker (and its state) goes straight to the oldest waiter, or back to the idle list if none waits |
//!
//! Checkout is first come, first served: a returned worker is handed to
//! the checkout that has waited longest (blocking or asynchronous alike),
//! never left for whoever asks next, so a task that gives its worker back
//! and asks again at once queues behind the waiters. Hence the invariant:
//! a worker is idle only while nobody waits.

use crate::admit::{Admission, AdmissionStats};
use crate::large::LargeBlocks;
use crate::runners::Runners;
use crate::worker::{Worker, WorkerOptions};
use crate::OrtArenaError;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use tensor_arena::Stats;

/// A bounded pool of [`Worker`]s, each paired with a state of the caller's
/// (`S`: typically the worker's own `ort::Session`, since `Session::run`
/// takes `&mut self`; `()` when sessions live elsewhere).
///
/// A request checks a worker out ([`WorkerPool::checkout`],
/// [`WorkerPool::checkout_async`]) and gives it back by dropping the
/// [`Checkout`]. However many threads an executor grows, at most
/// [`WorkerPool::size`] arenas exist, and a request that finds every
/// worker busy waits for one. Idle workers give their memory back after
/// [`WorkerOptions::decay`]. Cloning the pool clones a handle: every clone
/// checks out of the same workers.
///
/// ```
/// use tensor_arena_ort::{WorkerOptions, WorkerPool};
/// let pool = WorkerPool::new(2, WorkerOptions::default())?;
/// let a = pool.checkout();
/// let b = pool.checkout();
/// assert!(pool.try_checkout().is_none(), "both workers are out");
/// drop(a);
/// assert!(pool.try_checkout().is_some());
/// # drop(b);
/// # Ok::<(), tensor_arena_ort::OrtArenaError>(())
/// ```
pub struct WorkerPool<S = ()> {
    inner: Arc<Inner<S>>,
}

impl<S> Clone for WorkerPool<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

struct Inner<S> {
    size: usize,
    /// Where the workers' runs are admitted: the default limit's (shared
    /// by every pool under it), or this pool's budget's.
    admission: Arc<Admission>,
    /// The arena the workers share for their large blocks, if they do.
    large: Option<Arc<LargeBlocks>>,
    state: Mutex<State<S>>,
    /// Blocking checkouts wait here.
    returned: Condvar,
    /// The threads of `run_async`.
    runners: Runners,
}

struct State<S> {
    /// Idle workers with their states (last in, first out: the worker that
    /// ran last has the warmest cache). Never non-empty while `waiting`
    /// is: a returned worker goes to the oldest waiter first.
    idle: Vec<(Worker, S)>,
    /// Checkouts waiting, oldest first, by id: an asynchronous one with its
    /// waker, a blocking one with `None` (it waits on `returned`).
    waiting: VecDeque<(u64, Option<Waker>)>,
    /// Workers handed to a waiter that has not taken them yet, by its id
    /// (at most one each; at most the pool's size in all).
    handed: Vec<(u64, (Worker, S))>,
    next_waiter: u64,
    /// Checkouts handed out, ever.
    checkouts: u64,
    /// Checkouts that had to wait.
    waits: u64,
}

impl<S> State<S> {
    /// Gives a worker back: to the oldest waiter (returned: whom to wake
    /// if it is asynchronous, and whether it was a blocking one), else to
    /// the idle list.
    fn give_back(&mut self, parts: (Worker, S)) -> Handoff {
        match self.waiting.pop_front() {
            Some((id, waker)) => {
                self.handed.push((id, parts));
                match waker {
                    Some(w) => Handoff::Async(w),
                    None => Handoff::Blocking,
                }
            }
            None => {
                self.idle.push(parts);
                Handoff::Idle
            }
        }
    }

    /// The worker handed to waiter `id`, if any.
    fn take_handed(&mut self, id: u64) -> Option<(Worker, S)> {
        let at = self.handed.iter().position(|(i, _)| *i == id)?;
        Some(self.handed.swap_remove(at).1)
    }

    /// A new waiter's id, queued last.
    fn enqueue(&mut self, waker: Option<Waker>) -> u64 {
        self.next_waiter += 1;
        self.waits += 1;
        self.waiting.push_back((self.next_waiter, waker));
        self.next_waiter
    }
}

/// Whom a returned worker went to.
enum Handoff {
    Idle,
    Blocking,
    Async(Waker),
}

impl Handoff {
    /// Wakes the waiter the worker went to (after the state's lock is
    /// released).
    fn wake<S>(self, inner: &Inner<S>) {
        match self {
            Handoff::Idle => {}
            // Every blocking waiter checks whether the worker is its own.
            Handoff::Blocking => {
                inner.returned.notify_all();
            }
            Handoff::Async(w) => w.wake(),
        }
    }
}

/// Counters of a [`WorkerPool`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Workers in the pool (arenas it can have).
    pub size: usize,
    /// Workers idle now.
    pub idle: usize,
    /// Checkouts so far.
    pub checkouts: u64,
    /// Of those, checkouts that found every worker busy and waited.
    pub waits: u64,
    /// How the workers' runs were admitted by what they need: the queue,
    /// waits, bytes promised, retries alone, refusals. Shared by every
    /// pool under the default limit.
    pub admission: AdmissionStats,
    /// The arena the workers share for their large blocks
    /// ([`WorkerOptions::share_large_blocks`]), if they do: its `reserved`
    /// is part of what the pool holds, beside each worker's own.
    pub large_blocks: Option<Stats>,
}

impl WorkerPool<()> {
    /// A pool of `size` workers made with `options` (their arenas reserve
    /// nothing until their first run).
    ///
    /// # Errors
    /// [`OrtArenaError::Pool`] if `size` is 0; [`OrtArenaError::Arena`] if
    /// `options.arena` is invalid.
    pub fn new(size: usize, options: WorkerOptions) -> Result<Self, OrtArenaError> {
        Self::with_states(options, (0..size).map(|_| ()).collect())
    }

    /// The pool as a child process has it after `fork()` (call it there,
    /// after [`fork::child`](crate::fork::child), before other threads use
    /// the pool): a new pool of the same size whose workers are this
    /// pool's idle ones (their memory, decaying as before) and, in place of
    /// those checked out by threads the child does not have, new ones made
    /// with `options`. A worker whose locks a thread of the parent held at
    /// the fork, or a pool whose own lock was held, is left alone (never
    /// locked again; its memory stays mapped in the child): the child never
    /// waits for a thread it does not have.
    ///
    /// # Errors
    /// [`OrtArenaError::Arena`] if `options.arena` is invalid.
    pub fn after_fork(self, options: WorkerOptions) -> Result<Self, OrtArenaError> {
        let mut kept: Vec<Worker> = Vec::new();
        // The shared arena of the parent's large blocks is replaced by a
        // new one (below); one whose lock a thread of the parent held is
        // never dropped (dropping locks it).
        if let Some(l) = self.inner.large.as_ref().filter(|l| !l.is_free()) {
            std::mem::forget(Arc::clone(l));
        }
        let took = self.inner.state.try_lock().map(|mut st| {
            let idle = std::mem::take(&mut st.idle);
            let handed = std::mem::take(&mut st.handed);
            // Nobody waits in the child: the waiters were threads of the
            // parent (their wakers are the parent's executors': not dropped).
            std::mem::forget(std::mem::take(&mut st.waiting));
            for (w, ()) in idle.into_iter().chain(handed.into_iter().map(|(_, p)| p)) {
                if w.is_free() {
                    kept.push(w);
                } else {
                    // Dropping it would lock what a thread of the parent holds.
                    std::mem::forget(w);
                }
            }
        });
        let size = self.inner.size;
        let own_admission = options
            .budget
            .is_some()
            .then(|| self.inner.admission.after_fork());
        if took.is_none() {
            // Its lock was held: it keeps its workers, never used again
            // (dropping them could wait on that lock's holder).
            std::mem::forget(self);
        }
        kept.truncate(size);
        while kept.len() < size {
            kept.push(Worker::new(options.clone())?);
        }
        let admission = match own_admission {
            Some(a) => a,
            // The default limit's admission, as the child has it
            // (`fork::child` made it).
            None => crate::limit::default_admission()?,
        };
        // `of` gives the child's workers a new shared arena for their large
        // blocks: the parent's may be locked by a thread the child does not
        // have, and its runs in flight there are not the child's.
        Self::of(
            kept.into_iter().map(|w| (w, ())).collect(),
            admission,
            &options,
        )
    }
}

impl<S> WorkerPool<S> {
    /// A pool of one worker per state in `states` (for example one
    /// `ort::Session` each, built by the caller with
    /// [`with_tensor_arena`](crate::SessionBuilderExt::with_tensor_arena)):
    /// a checkout hands out a worker and its state together.
    ///
    /// # Errors
    /// [`OrtArenaError::Pool`] if `states` is empty;
    /// [`OrtArenaError::Arena`] if `options.arena` is invalid.
    pub fn with_states(options: WorkerOptions, states: Vec<S>) -> Result<Self, OrtArenaError> {
        if states.is_empty() {
            return Err(OrtArenaError::Pool(
                "a pool needs at least one worker".into(),
            ));
        }
        let idle = states
            .into_iter()
            .map(|s| Ok((Worker::new(options.clone())?, s)))
            .collect::<Result<Vec<_>, OrtArenaError>>()?;
        let admission = match &options.budget {
            None => crate::limit::default_admission()?,
            Some(b) => Admission::of_budget(Arc::clone(b)),
        };
        Self::of(idle, admission, &options)
    }

    /// A pool of these workers (made with `options`) and states, all idle,
    /// their runs admitted by `admission`, their large blocks served by a
    /// new arena they share (`options.share_large_blocks`; under their
    /// budget).
    fn of(
        mut idle: Vec<(Worker, S)>,
        admission: Arc<Admission>,
        options: &WorkerOptions,
    ) -> Result<Self, OrtArenaError> {
        let large = LargeBlocks::for_pool(
            options.share_large_blocks,
            idle.len(),
            options.pages,
            idle.first().and_then(|(w, _)| w.budget()),
            options.decay,
        )?;
        for (w, _) in &mut idle {
            w.set_admission(Some(Arc::clone(&admission)));
            w.set_large_blocks(large.clone());
        }
        Ok(Self {
            inner: Arc::new(Inner {
                size: idle.len(),
                admission,
                large,
                state: Mutex::new(State {
                    idle,
                    waiting: VecDeque::new(),
                    handed: Vec::new(),
                    next_waiter: 0,
                    checkouts: 0,
                    waits: 0,
                }),
                returned: Condvar::new(),
                runners: Runners::default(),
            }),
        })
    }

    /// Workers in the pool.
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// The pool's counters.
    pub fn stats(&self) -> PoolStats {
        let st = self.inner.state.lock();
        PoolStats {
            size: self.inner.size,
            idle: st.idle.len(),
            checkouts: st.checkouts,
            waits: st.waits,
            admission: self.inner.admission.stats(),
            large_blocks: self.inner.large.as_ref().map(|l| l.stats()),
        }
    }

    /// The arena the workers share for their large blocks, if they do.
    #[cfg(test)]
    pub(crate) fn large(&self) -> Option<Arc<LargeBlocks>> {
        self.inner.large.clone()
    }

    /// Where the pool's runs are admitted ([`Admission`](crate::Admission)).
    pub fn admission(&self) -> &Arc<Admission> {
        &self.inner.admission
    }

    fn checkout_of(&self, st: &mut State<S>, parts: (Worker, S)) -> Checkout<S> {
        st.checkouts += 1;
        Checkout {
            pool: Arc::clone(&self.inner),
            parts: Some(parts),
        }
    }

    /// An idle worker, if there is one now (none while checkouts wait: they
    /// come first).
    pub fn try_checkout(&self) -> Option<Checkout<S>> {
        let mut st = self.inner.state.lock();
        let parts = st.idle.pop()?;
        Some(self.checkout_of(&mut st, parts))
    }

    /// An idle worker, waiting (blocking this thread) until one is handed
    /// to it: first come, first served with every other checkout. For
    /// threads that may block: tokio's `spawn_blocking`, rayon, a thread
    /// pool. An async task uses [`WorkerPool::checkout_async`].
    pub fn checkout(&self) -> Checkout<S> {
        let mut st = self.inner.state.lock();
        if let Some(parts) = st.idle.pop() {
            return self.checkout_of(&mut st, parts);
        }
        let id = st.enqueue(None);
        loop {
            self.inner.returned.wait(&mut st);
            if let Some(parts) = st.take_handed(id) {
                return self.checkout_of(&mut st, parts);
            }
        }
    }

    /// An idle worker, as a future that waits without blocking a thread
    /// (any executor: it needs nothing but its waker).
    pub fn checkout_async(&self) -> CheckoutFuture<S> {
        CheckoutFuture {
            pool: self.clone(),
            id: None,
        }
    }
}

impl<S: Send + 'static> WorkerPool<S> {
    /// Runs `f` with a worker and its state, as a future: checks a worker
    /// out without blocking (waiting while all are busy), then calls `f`
    /// on one of the pool's run threads (about one per worker, started
    /// when needed and kept), so that the caller's executor thread never
    /// blocks on inference. `f` calls [`Worker::run`] around the session's
    /// run, as anywhere else, and returns what the server needs (outputs
    /// borrow their session, so extract them inside). A tokio server may
    /// equally call [`WorkerPool::checkout_async`] and hand the
    /// [`Checkout`] to `spawn_blocking`.
    ///
    /// # Errors
    /// [`OrtArenaError::Pool`] if the thread cannot be started or `f`
    /// panicked (the worker goes back to the pool either way).
    pub fn run_async<R, F>(&self, f: F) -> impl Future<Output = Result<R, OrtArenaError>> + Send
    where
        F: FnOnce(&mut Worker, &mut S) -> R + Send + 'static,
        R: Send + 'static,
    {
        let checkout = self.checkout_async();
        async move {
            let mut c = checkout.await;
            let reply = Arc::new(Reply::<R>::default());
            let to = Arc::clone(&reply);
            let pool = Arc::clone(&c.pool);
            let spawned = pool.runners.run(Box::new(move || {
                let (worker, state) = c.parts();
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(worker, state)));
                drop(c);
                to.send(r.map_err(|p| {
                    let msg = p
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| p.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic".into());
                    OrtArenaError::Pool(format!("the run panicked: {msg}"))
                }));
            }));
            if let Err(e) = spawned {
                return Err(OrtArenaError::Pool(format!(
                    "cannot start the run's thread: {e}"
                )));
            }
            ReplyFuture(reply).await
        }
    }
}

impl<S> std::fmt::Debug for WorkerPool<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerPool")
            .field("stats", &self.stats())
            .finish()
    }
}

/// A worker (and its state) checked out of a [`WorkerPool`]; dropping it
/// gives both back. Owned and `Send` (when `S` is): move it into
/// `spawn_blocking` or a thread.
pub struct Checkout<S = ()> {
    pool: Arc<Inner<S>>,
    /// Always `Some` until dropped.
    parts: Option<(Worker, S)>,
}

impl<S> Checkout<S> {
    /// The worker and its state.
    pub fn parts(&mut self) -> (&mut Worker, &mut S) {
        let (w, s) = self.parts.as_mut().expect("a checkout holds its worker");
        (w, s)
    }

    /// The worker.
    pub fn worker(&mut self) -> &mut Worker {
        self.parts().0
    }

    /// The state paired with the worker.
    pub fn state(&mut self) -> &mut S {
        self.parts().1
    }
}

impl<S> Drop for Checkout<S> {
    fn drop(&mut self) {
        let Some(parts) = self.parts.take() else {
            return;
        };
        let handoff = self.pool.state.lock().give_back(parts);
        handoff.wake(&self.pool);
    }
}

impl<S> std::fmt::Debug for Checkout<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkout")
            .field("worker", &self.parts.as_ref().map(|p| &p.0))
            .finish_non_exhaustive()
    }
}

/// The future of [`WorkerPool::checkout_async`].
pub struct CheckoutFuture<S = ()> {
    pool: WorkerPool<S>,
    /// Its entry among the waiters, once it has waited.
    id: Option<u64>,
}

impl<S> Future for CheckoutFuture<S> {
    type Output = Checkout<S>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Checkout<S>> {
        let this = &mut *self;
        let mut st = this.pool.inner.state.lock();
        let Some(id) = this.id else {
            if let Some(parts) = st.idle.pop() {
                return Poll::Ready(this.pool.checkout_of(&mut st, parts));
            }
            this.id = Some(st.enqueue(Some(cx.waker().clone())));
            return Poll::Pending;
        };
        if let Some(parts) = st.take_handed(id) {
            this.id = None;
            return Poll::Ready(this.pool.checkout_of(&mut st, parts));
        }
        if let Some((_, Some(w))) = st.waiting.iter_mut().find(|(i, _)| *i == id) {
            w.clone_from(cx.waker());
        }
        Poll::Pending
    }
}

impl<S> Drop for CheckoutFuture<S> {
    /// A future dropped while waiting leaves the queue; a worker already
    /// handed to it goes on to the next waiter.
    fn drop(&mut self) {
        let Some(id) = self.id else {
            return;
        };
        let handoff = {
            let mut st = self.pool.inner.state.lock();
            st.waiting.retain(|(i, _)| *i != id);
            st.take_handed(id).map(|parts| st.give_back(parts))
        };
        if let Some(h) = handoff {
            h.wake(&self.pool.inner);
        }
    }
}

/// A one-shot reply from a run's thread to the awaiting task: the result,
/// and the task to wake when it comes.
struct Reply<R> {
    slot: Mutex<(Option<RunResult<R>>, Option<Waker>)>,
}

type RunResult<R> = Result<R, OrtArenaError>;

impl<R> Default for Reply<R> {
    fn default() -> Self {
        Self {
            slot: Mutex::new((None, None)),
        }
    }
}

impl<R> Reply<R> {
    fn send(&self, r: Result<R, OrtArenaError>) {
        let waker = {
            let mut s = self.slot.lock();
            s.0 = Some(r);
            s.1.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

struct ReplyFuture<R>(Arc<Reply<R>>);

impl<R> Future for ReplyFuture<R> {
    type Output = Result<R, OrtArenaError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut s = self.0.slot.lock();
        match s.0.take() {
            Some(r) => Poll::Ready(r),
            None => {
                s.1 = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
