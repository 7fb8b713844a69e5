//! A bounded pool of workers for elastic executors: the number of arenas
//! follows the concurrency the server chooses, not the number of threads
//! its executor happens to run (tokio's blocking pool, rayon, any pool).
//!
//! | a request                 | what it does                                       |
//! |---------------------------|----------------------------------------------------|
//! | [`WorkerPool::checkout`]  | waits (blocking) for an idle worker, takes it      |
//! | [`WorkerPool::checkout_async`] | the same as a future: the task waits, no thread does |
//! | [`WorkerPool::run_async`] | checks out asynchronously, runs on one of the pool's run threads, returns the result as a future |
//! | dropping a [`Checkout`]   | the worker (and its state) goes back; one waiter wakes |

use crate::runners::Runners;
use crate::worker::{Worker, WorkerOptions};
use crate::OrtArenaError;
use parking_lot::{Condvar, Mutex};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

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
    state: Mutex<State<S>>,
    /// Blocking checkouts wait here.
    returned: Condvar,
    /// The threads of `run_async`.
    runners: Runners,
}

struct State<S> {
    /// Idle workers with their states (last in, first out: the worker that
    /// ran last has the warmest cache).
    idle: Vec<(Worker, S)>,
    /// Asynchronous checkouts waiting, by id (one entry per future).
    waiting: Vec<(u64, Waker)>,
    next_waiter: u64,
    /// Checkouts handed out, ever.
    checkouts: u64,
    /// Checkouts that had to wait.
    waits: u64,
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
        let size = states.len();
        let idle = states
            .into_iter()
            .map(|s| Ok((Worker::new(options.clone())?, s)))
            .collect::<Result<Vec<_>, OrtArenaError>>()?;
        Ok(Self {
            inner: Arc::new(Inner {
                size,
                state: Mutex::new(State {
                    idle,
                    waiting: Vec::new(),
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
        }
    }

    fn take(&self, st: &mut State<S>) -> Option<Checkout<S>> {
        let (worker, state) = st.idle.pop()?;
        st.checkouts += 1;
        Some(Checkout {
            pool: Arc::clone(&self.inner),
            parts: Some((worker, state)),
        })
    }

    /// An idle worker, if there is one now.
    pub fn try_checkout(&self) -> Option<Checkout<S>> {
        let mut st = self.inner.state.lock();
        self.take(&mut st)
    }

    /// An idle worker, waiting (blocking this thread) until one is given
    /// back. For threads that may block: tokio's `spawn_blocking`, rayon,
    /// a thread pool. An async task uses [`WorkerPool::checkout_async`].
    pub fn checkout(&self) -> Checkout<S> {
        let mut st = self.inner.state.lock();
        let mut waited = false;
        loop {
            if let Some(c) = self.take(&mut st) {
                if waited {
                    st.waits += 1;
                }
                return c;
            }
            waited = true;
            self.inner.returned.wait(&mut st);
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
        let wake = {
            let mut st = self.pool.state.lock();
            st.idle.push(parts);
            (!st.waiting.is_empty()).then(|| st.waiting.remove(0).1)
        };
        self.pool.returned.notify_one();
        if let Some(w) = wake {
            w.wake();
        }
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
        if let Some(c) = this.pool.take(&mut st) {
            if let Some(id) = this.id.take() {
                st.waiting.retain(|(i, _)| *i != id);
                st.waits += 1;
            }
            return Poll::Ready(c);
        }
        let id = *this.id.get_or_insert_with(|| {
            st.next_waiter += 1;
            st.next_waiter
        });
        match st.waiting.iter_mut().find(|(i, _)| *i == id) {
            Some((_, w)) => w.clone_from(cx.waker()),
            None => st.waiting.push((id, cx.waker().clone())),
        }
        Poll::Pending
    }
}

impl<S> Drop for CheckoutFuture<S> {
    /// A future dropped while waiting may have been woken for a worker it
    /// will not take: the wake passes to the next waiter.
    fn drop(&mut self) {
        let Some(id) = self.id else {
            return;
        };
        let wake = {
            let mut st = self.pool.inner.state.lock();
            st.waiting.retain(|(i, _)| *i != id);
            (!st.idle.is_empty() && !st.waiting.is_empty()).then(|| st.waiting[0].1.clone())
        };
        if let Some(w) = wake {
            w.wake();
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
mod tests {
    use super::*;
    use std::task::Wake;

    struct Flag(std::sync::atomic::AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn flag() -> (Arc<Flag>, Waker) {
        let f = Arc::new(Flag(false.into()));
        (f.clone(), Waker::from(f))
    }

    #[test]
    fn an_empty_pool_is_an_error() {
        let err = WorkerPool::<()>::with_states(WorkerOptions::default(), vec![]).unwrap_err();
        assert!(err.to_string().contains("at least one worker"), "{err}");
        assert!(WorkerPool::new(0, WorkerOptions::default()).is_err());
    }

    #[test]
    fn states_go_out_and_back_with_their_workers() {
        let pool = WorkerPool::with_states(WorkerOptions::default(), vec![1u32, 2]).unwrap();
        let mut a = pool.checkout();
        *a.state() += 10;
        let id = a.worker().slot().id;
        drop(a);
        let mut b = pool.checkout();
        assert_eq!(*b.state(), 12, "last in, first out");
        assert_eq!(b.worker().slot().id, id);
        assert_eq!(pool.stats().idle, 1);
        assert_eq!(pool.stats().checkouts, 2);
    }

    #[test]
    fn an_async_checkout_waits_and_is_woken_by_a_return() {
        let pool = WorkerPool::new(1, WorkerOptions::default()).unwrap();
        let held = pool.checkout();
        let mut fut = Box::pin(pool.checkout_async());
        let (woken, waker) = flag();
        let mut cx = Context::from_waker(&waker);
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        assert!(!woken.0.load(std::sync::atomic::Ordering::SeqCst));
        drop(held);
        assert!(woken.0.load(std::sync::atomic::Ordering::SeqCst));
        assert!(matches!(fut.as_mut().poll(&mut cx), Poll::Ready(_)));
        assert_eq!(pool.stats().waits, 1);
    }

    #[test]
    fn a_dropped_waiter_passes_its_wake_on() {
        let pool = WorkerPool::new(1, WorkerOptions::default()).unwrap();
        let held = pool.checkout();
        let (f1, w1) = flag();
        let (f2, w2) = flag();
        let mut a = Box::pin(pool.checkout_async());
        let mut b = Box::pin(pool.checkout_async());
        assert!(a.as_mut().poll(&mut Context::from_waker(&w1)).is_pending());
        assert!(b.as_mut().poll(&mut Context::from_waker(&w2)).is_pending());
        drop(held); // wakes `a`, which is then dropped without taking it
        assert!(f1.0.load(std::sync::atomic::Ordering::SeqCst));
        drop(a);
        assert!(f2.0.load(std::sync::atomic::Ordering::SeqCst));
        assert!(b.as_mut().poll(&mut Context::from_waker(&w2)).is_ready());
    }

    #[test]
    fn blocking_checkouts_never_exceed_the_pool() {
        let pool = WorkerPool::new(3, WorkerOptions::default()).unwrap();
        let out = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let max = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        std::thread::scope(|s| {
            for _ in 0..16 {
                s.spawn(|| {
                    for _ in 0..20 {
                        let c = pool.checkout();
                        let n = out.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                        max.fetch_max(n, std::sync::atomic::Ordering::SeqCst);
                        std::thread::yield_now();
                        out.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                        drop(c);
                    }
                });
            }
        });
        assert!(max.load(std::sync::atomic::Ordering::SeqCst) <= 3);
        assert_eq!(pool.stats().idle, 3);
        assert_eq!(pool.stats().checkouts, 16 * 20);
    }
}
