//! The pool's checkouts: states, wakers, first come first served, the bound, and its rebuild after a fork.

use super::*;
use std::task::Wake;

struct Flag(std::sync::atomic::AtomicBool);
impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn after_fork_keeps_idle_workers_and_replaces_checked_out_ones() {
    let pool = WorkerPool::new(3, WorkerOptions::default()).unwrap();
    // Held by a "thread of the parent": in a child it is never returned.
    let held = pool.checkout();
    let waiter = pool.try_checkout().unwrap();
    drop(waiter);
    let child = pool.clone().after_fork(WorkerOptions::default()).unwrap();
    assert_eq!(child.size(), 3);
    let all: Vec<_> = (0..3).map(|_| child.try_checkout().unwrap()).collect();
    assert!(child.try_checkout().is_none());
    drop(all);
    assert_eq!(child.stats().idle, 3);
    drop(held);
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
fn a_returned_worker_goes_to_the_oldest_waiter_blocking_or_async() {
    use std::sync::atomic::Ordering::SeqCst;
    let pool = WorkerPool::new(1, WorkerOptions::default()).unwrap();
    let held = pool.checkout();
    let (fa, wa) = flag();
    let mut a = Box::pin(pool.checkout_async());
    assert!(a.as_mut().poll(&mut Context::from_waker(&wa)).is_pending());
    // A blocking checkout queues second.
    let got_blocking = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let t = {
        let (pool, got) = (pool.clone(), got_blocking.clone());
        std::thread::spawn(move || {
            let c = pool.checkout();
            got.store(true, SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(20));
            drop(c);
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while pool.stats().waits < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the blocking one never queued"
        );
        std::thread::yield_now();
    }
    let (fb, wb) = flag();
    let mut b = Box::pin(pool.checkout_async());
    assert!(b.as_mut().poll(&mut Context::from_waker(&wb)).is_pending());
    // The holder gives its worker back and asks again at once: it
    // queues behind the three, and the worker is `a`'s.
    drop(held);
    let (fd, wd) = flag();
    let mut again = Box::pin(pool.checkout_async());
    assert!(again
        .as_mut()
        .poll(&mut Context::from_waker(&wd))
        .is_pending());
    assert!(pool.try_checkout().is_none(), "no jumping the queue");
    assert!(fa.0.load(SeqCst));
    let ca = match a.as_mut().poll(&mut Context::from_waker(&wa)) {
        Poll::Ready(c) => c,
        Poll::Pending => panic!("the oldest waiter did not get the worker"),
    };
    assert!(!got_blocking.load(SeqCst));
    drop(ca); // to the blocking one, second in line
    t.join().unwrap();
    assert!(got_blocking.load(SeqCst));
    assert!(
        fb.0.load(SeqCst) && !fd.0.load(SeqCst),
        "then `b`, not the latecomer"
    );
    assert!(b.as_mut().poll(&mut Context::from_waker(&wb)).is_ready());
    assert!(fd.0.load(SeqCst));
    assert!(again
        .as_mut()
        .poll(&mut Context::from_waker(&wd))
        .is_ready());
    assert_eq!(pool.stats().waits, 4);
}

#[test]
fn under_contention_no_checkout_is_overtaken_by_later_askers() {
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    // Each thread holds its worker briefly, gives it back and asks
    // again at once. `grants` counts checkouts handed out: a checkout
    // that asked when it read `asked` and got the grant numbered `got`
    // waited behind `got - asked` others. First come, first served,
    // those are at most the other threads (each at most once ahead of
    // it), give or take a thread preempted between reading the count
    // and joining the queue.
    let threads = 8;
    let pool = WorkerPool::new(2, WorkerOptions::default()).unwrap();
    let grants = AtomicU64::new(0);
    let worst = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                for _ in 0..40 {
                    let asked = grants.load(SeqCst);
                    let c = pool.checkout();
                    let got = grants.fetch_add(1, SeqCst);
                    worst.fetch_max(got - asked, SeqCst);
                    std::thread::sleep(std::time::Duration::from_micros(200));
                    drop(c);
                }
            });
        }
    });
    let worst = worst.load(SeqCst);
    assert!(
        worst <= 2 * threads,
        "a checkout waited behind {worst} later grants"
    );
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
