//! Admission through real workers and a real ledger: runs admitted by what
//! they need stay under the limit where the same runs counted by workers
//! alone run out of memory; a run that ran out beside others succeeds
//! alone; a killed process's share comes back.

use crate::admit::{Admission, Room, Shared};
use crate::ledger::{Ledger, Share};
use crate::{OrtArenaError, Plans, RunKey, WorkerOptions, WorkerPool};
use std::path::Path;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tensor_arena::Budget;

const MIB: usize = 1 << 20;

/// Waits (up to 10 s) until `admission` has a run queued, then a further
/// `more`: a run that is still queued then was held back, not slow to start.
fn queued_then(admission: &Admission, more: Duration) {
    let until = Instant::now() + Duration::from_secs(10);
    while admission.stats().queued == 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(more);
}

/// The admission of a limit of `limit` bytes shared through the ledger in
/// `dir` (`whole`: the limit is the container's, less the rest of every
/// process), on `budget`.
fn shared(dir: &Path, budget: Arc<Budget>, limit: usize, whole: bool) -> Arc<Admission> {
    Admission::new(Room::Shared(Shared {
        budget,
        ledger: Ledger::open(dir, "k").unwrap(),
        limit,
        whole,
        margin: 0,
        usage: None,
    }))
}

/// Another process of the container (a `sleep` spawned after this one, so
/// its PID is higher, PIDs wrapping aside) whose slot in the ledger in
/// `dir` says `share`.
fn other_process(dir: &Path, share: Share) -> Child {
    let other = Command::new("sleep").arg("60").spawn().unwrap();
    Ledger::open(dir, "k").unwrap().pretend(other.id(), share);
    other
}

/// A share of nothing promised, committed or held beside the arenas, and
/// no run alone.
const NOTHING: Share = Share {
    promised: 0,
    committed: 0,
    rest: 0,
    alone_since: None,
    alone_running: false,
};

/// A run as ONNX Runtime makes one: `bytes` allocated through the
/// registered allocator on this thread, written, held `hold`, freed.
fn run_of(bytes: usize, hold: Duration) -> Result<(), OrtArenaError> {
    crate::raw::return_null_on_failure();
    let Some(p) = crate::raw::alloc_for_test(bytes) else {
        return Err(OrtArenaError::Ort("bad_alloc".into()));
    };
    // SAFETY: `p` is a block of `bytes` bytes just handed out.
    unsafe { std::ptr::write_bytes(p.as_ptr(), 1, bytes) };
    std::thread::sleep(hold);
    // SAFETY: `p` came from `alloc_for_test`, freed once.
    unsafe { crate::raw::free_for_test(p) };
    Ok(())
}

/// Workers under `budget`, each serving all its blocks (the runs here are
/// one block each: `large_tests` has the arena a pool shares).
fn options(budget: &Arc<Budget>) -> WorkerOptions {
    WorkerOptions {
        budget: Some(Arc::clone(budget)),
        decay: None,
        share_large_blocks: None,
        ..WorkerOptions::default()
    }
}

/// Four runs of 20 MiB at once under a limit of 48 MiB: admitted by their
/// plan's block, at most two run together and none runs out of memory.
/// Without admission (four workers, four runs) the third commit is refused.
#[test]
fn runs_admitted_by_their_plans_never_run_out_of_memory() {
    let budget = Budget::new(48 * MIB);
    let pool = WorkerPool::new(4, options(&budget)).unwrap();
    let plans = Arc::new(Plans::default());
    let key = RunKey::from_shapes([[20i64]]);
    {
        let mut c = pool.checkout();
        c.worker()
            .run_retrying(&plans, &key, || run_of(20 * MIB, Duration::ZERO))
            .unwrap();
        assert!(c.worker().last_run().unwrap().learned);
    }
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (pool, plans, key) = (pool.clone(), Arc::clone(&plans), key.clone());
                s.spawn(move || {
                    let mut c = pool.checkout();
                    let out = c
                        .worker()
                        .run_retrying(&plans, &key, || run_of(20 * MIB, Duration::from_millis(40)));
                    (out, c.worker().last_run().cloned().unwrap())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (out, info) in &results {
        assert!(out.is_ok(), "{out:?}");
        assert_eq!(info.failed_allocs, 0, "ran out of memory: {info:?}");
        assert!(info.admitted >= 20 * MIB, "admitted by its plan: {info:?}");
    }
    let a = pool.stats().admission;
    assert!(a.running_peak <= 2, "three 20 MiB runs in 48 MiB: {a:?}");
    assert!(a.waited >= 1, "{a:?}");
    assert_eq!(a.retried_alone, 0, "{a:?}");
    assert!(budget.stats().peak_committed <= 48 * MIB);
}

/// A run whose need was underestimated (the model's runs so far were
/// small and it has no plan) runs out of memory beside a large one; it
/// runs again alone, once the large one ended, and succeeds.
#[test]
fn a_run_that_ran_out_beside_others_runs_again_alone() {
    let budget = Budget::new(48 * MIB);
    let pool = WorkerPool::new(
        2,
        WorkerOptions {
            plans: false,
            ..options(&budget)
        },
    )
    .unwrap();
    let (small_model, big_model) = (Plans::default(), Plans::default());
    let key = RunKey::from_shapes([[1i64]]);
    for (plans, bytes) in [(&small_model, MIB), (&big_model, 30 * MIB)] {
        let mut c = pool.checkout();
        c.worker()
            .run_retrying(plans, &key, || run_of(bytes, Duration::ZERO))
            .unwrap();
    }
    assert_eq!(small_model.largest_run() / MIB, 1);
    std::thread::scope(|s| {
        let big = s.spawn(|| {
            let mut c = pool.checkout();
            c.worker().run_retrying(&big_model, &key, || {
                run_of(30 * MIB, Duration::from_millis(300))
            })
        });
        // The large run is in flight when the underestimated one starts.
        let deadline = Instant::now() + Duration::from_secs(10);
        while pool.stats().admission.running == 0 {
            assert!(Instant::now() < deadline);
            std::thread::yield_now();
        }
        let mut c = pool.checkout();
        let out = c
            .worker()
            .run_retrying(&small_model, &key, || run_of(30 * MIB, Duration::ZERO));
        assert!(out.is_ok(), "not run again alone: {out:?}");
        let info = c.worker().last_run().unwrap();
        assert!(info.alone && info.succeeded, "{info:?}");
        drop(c);
        big.join().unwrap().unwrap();
    });
    let a = pool.stats().admission;
    assert_eq!(a.retried_alone, 1, "{a:?}");
}

/// A run that could not fit even alone is refused with an error naming
/// its need and the limit, and the runs beside it are not disturbed.
#[test]
fn a_run_too_large_to_fit_alone_fails_with_its_need_and_the_limit() {
    let budget = Budget::new(16 * MIB);
    let pool = WorkerPool::new(2, options(&budget)).unwrap();
    let plans = Plans::default();
    let key = RunKey::from_shapes([[3i64]]);
    let mut c = pool.checkout();
    let err = c
        .worker()
        .run_retrying(&plans, &key, || run_of(40 * MIB, Duration::ZERO))
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, OrtArenaError::OutOfMemory(_)), "{err:?}");
    assert!(
        msg.contains("needs at least") && msg.contains(&format!("{}", 16 * MIB)),
        "{msg}"
    );
    // The next run, small, succeeds.
    c.worker()
        .run_retrying(&plans, &RunKey::from_shapes([[4i64]]), || {
            run_of(MIB, Duration::ZERO)
        })
        .unwrap();
}

/// A process that holds part of a shared limit and is killed (SIGKILL)
/// gives its share back: the run waiting for it is admitted within a few
/// seconds.
#[test]
fn a_killed_process_share_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    // Another process of the container, with 40 MiB of the 64 held.
    let mut other = other_process(
        dir.path(),
        Share {
            promised: 40 * MIB as u64,
            committed: 40 * MIB as u64,
            ..NOTHING
        },
    );
    let admission = shared(dir.path(), Budget::new(64 * MIB), 64 * MIB, false);
    assert!(
        admission.admit(20 * MIB, false).is_ok(),
        "20 MiB fits beside 40"
    );
    let waiting = {
        let a = Arc::clone(&admission);
        std::thread::spawn(move || {
            let t0 = Instant::now();
            let t = a.admit(30 * MIB, false).unwrap();
            drop(t);
            t0.elapsed()
        })
    };
    queued_then(&admission, Duration::from_millis(300));
    assert_eq!(admission.stats().queued, 1, "30 MiB admitted beside 40");
    other.kill().unwrap();
    let killed = Instant::now();
    other.wait().unwrap();
    // Within 5 s of the kill, the waiting run is admitted.
    while !waiting.is_finished() {
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "the killed process's share never came back: {:?}",
            admission.stats()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(waiting.join().unwrap() >= Duration::from_millis(300));
    assert_eq!(admission.stats().processes, 1);
}

/// A run alone (a model's first run: nobody knows its need) is promised
/// what it asked for, not all the room: the other processes' runs already
/// in flight keep their room (their commits are measured against what
/// this process was promised), and the ledger's flag holds their new runs
/// back while it runs.
#[test]
fn a_run_alone_is_promised_its_need_not_all_the_room() {
    let dir = tempfile::tempdir().unwrap();
    let admission = shared(dir.path(), Budget::new(64 * MIB), 64 * MIB, false);
    let first = admission.admit(0, true).unwrap();
    assert!(first.alone());
    assert_eq!(
        admission.stats().promised,
        0,
        "a first run alone promised the room"
    );
    drop(first);
    let retry = admission.admit(10 * MIB, true).unwrap();
    assert_eq!(admission.stats().promised, 10 * MIB);
    drop(retry);
    assert_eq!(admission.stats().promised, 0);
}

/// A model whose runs take nothing from the arena (ONNX Runtime allocated
/// elsewhere, or a model with no intermediate tensors) runs alone only
/// once: after its first run it needs 0 bytes, and its runs go on side by
/// side (they were all run alone, one at a time, when "no run seen" and
/// "runs of 0 bytes" were one figure).
#[test]
fn a_model_whose_runs_take_nothing_runs_alone_only_once() {
    let budget = Budget::new(48 * MIB);
    let pool = WorkerPool::new(2, options(&budget)).unwrap();
    let plans = Plans::default();
    let key = RunKey::from_shapes([[1i64]]);
    pool.checkout()
        .worker()
        .run_retrying(&plans, &key, || Ok(()))
        .unwrap();
    let inside = std::sync::atomic::AtomicUsize::new(0);
    let together = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let mut c = pool.checkout();
                c.worker()
                    .run_retrying(&plans, &key, || {
                        use std::sync::atomic::Ordering::SeqCst;
                        inside.fetch_add(1, SeqCst);
                        let until = Instant::now() + Duration::from_secs(2);
                        while Instant::now() < until && inside.load(SeqCst) < 2 {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        if inside.load(SeqCst) == 2 {
                            together.store(true, SeqCst);
                        }
                        Ok(())
                    })
                    .unwrap();
            });
        }
    });
    assert!(
        together.into_inner(),
        "the runs were admitted one at a time"
    );
    assert_eq!(pool.stats().admission.running_peak, 2);
}

/// A run alone of another process holds this process's runs alone back,
/// whatever the two PIDs: the order they came in decides only among runs that
/// wait (a model's first run is promised nothing, so two first runs of two
/// worker processes side by side ran out of memory together).
#[test]
fn a_run_alone_waits_for_another_process_running_alone() {
    held_back_by(
        Share {
            alone_running: true,
            ..NOTHING
        },
        "a run alone started beside another process's",
    );
}

/// Runs a run alone of this process beside another process whose slot
/// says `share`: it waits while that process lives (`why` otherwise),
/// and is admitted once it is gone.
fn held_back_by(share: Share, why: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut other = other_process(dir.path(), share);
    let admission = shared(dir.path(), Budget::new(64 * MIB), 64 * MIB, false);
    let waiting = {
        let a = Arc::clone(&admission);
        std::thread::spawn(move || {
            let t0 = Instant::now();
            drop(a.admit(MIB, true).unwrap());
            t0.elapsed()
        })
    };
    queued_then(&admission, Duration::from_millis(300));
    assert_eq!(admission.stats().queued, 1, "{why}");
    other.kill().unwrap();
    other.wait().unwrap();
    assert!(waiting.join().unwrap() >= Duration::from_millis(300));
}

/// A run waiting at the head of its queue whose need outgrows what the
/// limit could ever give it alone (the rest of the processes grew while it
/// waited) fails with `OutOfMemory` instead of waiting for ever.
#[test]
fn a_waiting_run_the_rest_outgrew_fails_instead_of_waiting_for_ever() {
    let dir = tempfile::tempdir().unwrap();
    let own = usize::try_from(crate::ledger::anon_resident().unwrap()).unwrap();
    // This process's rest, plus 200 MiB: another process holds 150 of them.
    let limit = own + 200 * MIB;
    let mut holder = other_process(
        dir.path(),
        Share {
            promised: 150 * MIB as u64,
            ..NOTHING
        },
    );
    let admission = shared(dir.path(), Budget::new(limit), limit, true);
    let waiting = {
        let a = Arc::clone(&admission);
        std::thread::spawn(move || a.admit(100 * MIB, false).map(drop))
    };
    queued_then(&admission, Duration::from_millis(200));
    assert_eq!(
        admission.stats().queued,
        1,
        "100 MiB admitted beside 150 of 200"
    );
    // The holder ends; a process whose rest takes 150 MiB comes.
    let mut grown = other_process(
        dir.path(),
        Share {
            rest: 150 * MIB as u64,
            ..NOTHING
        },
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
    let t0 = Instant::now();
    while !waiting.is_finished() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the run waits for room that cannot come: {:?}",
            admission.stats()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let err = waiting.join().unwrap().expect_err("refused");
    assert!(matches!(err, OrtArenaError::OutOfMemory(_)), "{err}");
    assert_eq!(admission.stats().refused, 1);
    grown.kill().unwrap();
    grown.wait().unwrap();
}

/// Runs alone of two processes go in the order they came, not by PID: a
/// run alone of this process waits for one another process has waited
/// with since before it, though that process's PID is higher.
#[test]
fn runs_alone_of_two_processes_go_in_the_order_they_came() {
    held_back_by(
        Share {
            alone_since: Some(crate::ledger::monotonic_ns() - 1_000_000_000),
            ..NOTHING
        },
        "a run alone went before another process's that came first",
    );
}

/// A run alone whose commit finds the room held by another process's idle
/// cache waits for it to be given back (the other process relieves its
/// idle workers on seeing the run alone's flag; here it exits) instead of
/// failing at once: a first run, promised nothing, ran out of memory alone
/// beside four workers' caches and its request was refused.
#[test]
fn a_run_alone_waits_for_other_processes_caches() {
    let dir = tempfile::tempdir().unwrap();
    let mut other = other_process(
        dir.path(),
        Share {
            committed: 40 * MIB as u64,
            ..NOTHING
        },
    );
    let budget = Budget::new(64 * MIB);
    let admission = shared(dir.path(), Arc::clone(&budget), 64 * MIB, false);
    admission.follow_commits();
    let pool = WorkerPool::new(1, options(&budget)).unwrap();
    let plans = Plans::default();
    let key = RunKey::from_shapes([[30i64]]);
    let gives_back = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        other.kill().unwrap();
        other.wait().unwrap();
    });
    let mut c = pool.checkout();
    c.worker().set_admission(Some(Arc::clone(&admission)));
    let out = c
        .worker()
        .run_retrying(&plans, &key, || run_of(30 * MIB, Duration::ZERO));
    gives_back.join().unwrap();
    assert!(out.is_ok(), "{out:?}");
    let info = c.worker().last_run().unwrap();
    assert!(info.alone && info.failed_allocs == 0, "{info:?}");
}
