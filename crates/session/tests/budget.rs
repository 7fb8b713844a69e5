//! Sessions under one memory budget: idle sessions (standalone or idle in a
//! pool) give their cache back before a run is refused; a running session
//! is never waited for and keeps its buffers; a refused run returns the
//! error and a smaller run then succeeds; stats and drop.

use std::sync::{mpsc, Arc};
use std::time::Duration;
use tensor_session::tensor_arena::memory::ErrorCode;
use tensor_session::tensor_arena::{ArenaError, Budget};
use tensor_session::{BudgetedSession, Dtype, Session, SessionConfig, SessionPool, Weights};

const MIB: usize = 1 << 20;

fn weights() -> Arc<Weights> {
    Arc::new(Weights::from_tensors([("w", Dtype::U8, vec![4], vec![1, 2, 3, 4])]).unwrap())
}

fn over_budget(e: &ArenaError) -> bool {
    matches!(
        e,
        ArenaError::CommitFailed {
            code: Some(ErrorCode::OverBudget { .. }),
            ..
        }
    )
}

/// One run that allocates `bytes` in one buffer, fills it and checks it:
/// `Ok(sum of the weights)` or the allocation's error.
fn run(s: &mut BudgetedSession, bytes: usize) -> Result<u32, ArenaError> {
    s.run(&[bytes], |ctx| {
        let mut buf = ctx.alloc(bytes)?;
        buf.fill(0xa5);
        assert!(buf.iter().all(|&b| b == 0xa5));
        let w = ctx.weights().get("w").unwrap().bytes();
        Ok(w.iter().map(|&b| u32::from(b)).sum())
    })
}

/// An idle session's cache makes room for another session's run: reclaimed
/// before any refusal.
#[test]
fn an_idle_sessions_cache_is_reclaimed_before_a_refusal() {
    let budget = Budget::new(40 * MIB);
    let mut a = Session::with_budget(weights(), SessionConfig::default(), &budget);
    let mut b = a.clone();
    assert_eq!(run(&mut a, 24 * MIB).unwrap(), 10);
    let cached = a.stats().arena.reserved;
    assert!(cached >= 24 * MIB, "a keeps its run's memory: {cached}");
    assert_eq!(budget.committed(), cached);

    assert_eq!(
        run(&mut b, 24 * MIB).unwrap(),
        10,
        "room made from a's cache"
    );
    let st = budget.stats();
    assert_eq!(st.refusals, 0, "{st:?}");
    assert!(st.reclaimed >= 8 * MIB as u64, "{st:?}");
    assert!(a.stats().arena.reserved < cached, "a gave back");
    assert_eq!(st.members, 2);
    assert!(budget.committed() <= budget.limit());
    assert_eq!(
        budget.committed(),
        a.stats().arena.reserved + b.stats().arena.reserved
    );
    // a runs again: b is idle now and gives back in turn.
    assert_eq!(run(&mut a, 24 * MIB).unwrap(), 10);
    drop((a, b));
    assert_eq!(
        budget.committed(),
        0,
        "dropped sessions give everything back"
    );
    assert_eq!(budget.stats().members, 0);
}

/// Over the budget even after reclaiming: the run gets the budget's error,
/// the session stays usable and a smaller run succeeds.
#[test]
fn a_refused_run_returns_the_error_and_a_smaller_run_succeeds() {
    let budget = Budget::new(32 * MIB);
    let mut s = Session::with_budget(weights(), SessionConfig::default(), &budget);
    let e = run(&mut s, 48 * MIB).unwrap_err();
    assert!(over_budget(&e), "{e:?}");
    assert_eq!(budget.stats().refusals, 1);
    assert!(!s.arena().in_run());
    assert_eq!(run(&mut s, 8 * MIB).unwrap(), 10);
    assert_eq!(s.stats().runs, 2);
    assert!(budget.stats().peak_committed <= 32 * MIB);
}

/// A session running on another thread is never waited for and its live
/// buffer is never touched: the run that needed its memory is refused at
/// once; once it is idle, its cache makes room.
#[test]
fn a_running_session_is_never_waited_for() {
    let budget = Budget::new(40 * MIB);
    let mut busy = Session::with_budget(weights(), SessionConfig::default(), &budget);
    let mut other = busy.clone();
    assert_eq!(run(&mut busy, 24 * MIB).unwrap(), 10); // cached in busy now
    let (inside_tx, inside_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let worker = std::thread::spawn(move || {
        let ok = busy.run(&[1], |ctx| {
            let mut live = ctx.alloc(MIB).unwrap();
            live.fill(7);
            inside_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            live.iter().all(|&b| b == 7)
        });
        (busy, ok)
    });
    inside_rx.recv().unwrap();
    let (done_tx, done_rx) = mpsc::channel();
    let refused = std::thread::spawn(move || {
        let r = run(&mut other, 24 * MIB);
        done_tx.send(r.map_err(|e| over_budget(&e))).unwrap();
        other
    });
    let r = done_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the run waited for a busy session");
    assert_eq!(r, Err(true), "refused: the busy session gave nothing");
    let mut other = refused.join().unwrap();
    go_tx.send(()).unwrap();
    let (busy, intact) = worker.join().unwrap();
    assert!(intact, "a running session's buffer was touched");
    assert_eq!(
        run(&mut other, 24 * MIB).unwrap(),
        10,
        "idle now: reclaimed"
    );
    drop(busy);
}

/// A pool of budgeted clones: the clone idle in the pool gives its cache
/// to the one lent out.
#[test]
fn idle_pool_clones_give_back_to_lent_ones() {
    let budget = Budget::new(40 * MIB);
    let pool = SessionPool::from_session(
        Session::with_budget(weights(), SessionConfig::default(), &budget),
        2,
    );
    let mut first = pool.get();
    let mut second = pool.get();
    assert_eq!(run(&mut first, 24 * MIB).unwrap(), 10);
    drop(first); // idle in the pool, 24 MiB cached
    assert_eq!(run(&mut second, 24 * MIB).unwrap(), 10);
    let st = budget.stats();
    assert_eq!(st.refusals, 0, "{st:?}");
    assert!(st.reclaimed > 0, "{st:?}");
    assert_eq!(st.members, 3, "template and two clones");
    drop(second);
    let pooled = pool.stats();
    assert_eq!(pooled.runs, 2);
    assert_eq!(pooled.arena.reserved, budget.committed());
    drop(pool);
    assert_eq!(budget.committed(), 0);
}

/// A session that was busy when memory ran short gives back what it caches
/// beyond its watermark at its next run boundary.
#[test]
fn a_busy_session_gives_back_at_its_next_run_boundary() {
    let budget = Budget::new(1 << 30);
    let mut s = Session::with_budget(weights(), SessionConfig::default(), &budget);
    assert_eq!(run(&mut s, 24 * MIB).unwrap(), 10);
    let cached = s.stats().arena.reserved;
    let small = s.run(&[1], |ctx| {
        let b = ctx.alloc(MIB).unwrap();
        budget.relieve(); // memory is short while s runs: s gives nothing now
        b.len()
    });
    assert_eq!(small, MIB);
    assert!(
        s.stats().arena.reserved < cached,
        "gave back at the run's end: {} of {cached}",
        s.stats().arena.reserved
    );
}

/// Unbudgeted sessions are unchanged: no budget, the default memory layer.
#[test]
fn sessions_without_a_budget_have_none() {
    let s = Session::new(weights(), SessionConfig::default());
    assert!(s.budget().is_none());
    let b = Session::with_budget(weights(), SessionConfig::default(), &Budget::new(MIB));
    assert!(b.budget().is_some());
}
