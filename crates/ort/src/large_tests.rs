//! The arena a pool's workers share for their large blocks, through real
//! workers: runs in flight together reuse each other's large blocks; a run
//! alone keeps them on its own plan; a run's admission counts them; the
//! shared arena follows its runs down and gives everything back when the
//! pool is gone; a block freed on another thread goes back to it.

use crate::large::WINDOW;
use crate::{OrtArenaError, Plans, RunKey, WorkerOptions, WorkerPool};
use std::ptr::NonNull;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;
use tensor_arena::Budget;

const MIB: usize = 1 << 20;

fn options(budget: &Arc<Budget>) -> WorkerOptions {
    WorkerOptions {
        budget: Some(Arc::clone(budget)),
        decay: None,
        ..WorkerOptions::default()
    }
}

/// A block of `bytes` as ONNX Runtime gets one, written through.
fn alloc(bytes: usize) -> Result<NonNull<u8>, OrtArenaError> {
    crate::raw::return_null_on_failure();
    let p = crate::raw::alloc_for_test(bytes).ok_or(OrtArenaError::Ort("bad_alloc".into()))?;
    // SAFETY: `p` is a block of `bytes` bytes just handed out.
    unsafe { std::ptr::write_bytes(p.as_ptr(), 1, bytes) };
    Ok(p)
}

fn free(p: NonNull<u8>) {
    // SAFETY: `p` came from `alloc_for_test`, freed once.
    unsafe { crate::raw::free_for_test(p) };
}

/// A run of a 16 MiB block and a 64 KiB one, both freed.
fn run_of_two() -> Result<(), OrtArenaError> {
    let big = alloc(16 * MIB)?;
    let small = alloc(64 << 10)?;
    free(small);
    free(big);
    Ok(())
}

/// A run of `plans`' model that allocates nothing: the model's first run
/// is admitted alone (nothing known of it), so the tests' models run once
/// before their runs in flight together.
fn warm(pool: &WorkerPool, plans: &Plans) {
    pool.checkout()
        .worker()
        .run(plans, &RunKey::from_shapes([[0i64]]), || {
            Ok::<(), OrtArenaError>(())
        })
        .unwrap();
}

/// Runs `f` while another worker of `pool` has a run in flight.
fn beside_a_run<R>(pool: &WorkerPool, f: impl FnOnce() -> R) -> R {
    let (started_tx, started_rx) = mpsc::channel();
    let (end_tx, end_rx) = mpsc::channel::<()>();
    let plans = Plans::default();
    warm(pool, &plans);
    std::thread::scope(|s| {
        let pool = pool.clone();
        let plans = &plans;
        let other = s.spawn(move || {
            let mut c = pool.checkout();
            c.worker()
                .run(plans, &RunKey::from_shapes([[1i64]]), || {
                    started_tx.send(()).unwrap();
                    end_rx.recv_timeout(Duration::from_secs(30)).ok();
                    Ok::<(), OrtArenaError>(())
                })
                .unwrap();
        });
        started_rx.recv().unwrap();
        let out = f();
        end_tx.send(()).unwrap();
        other.join().unwrap();
        out
    })
}

/// A pool of two workers under an unlimited budget, and a 16 MiB block a
/// sharing run left live (an output), by address.
fn a_pool_with_a_kept_large_block() -> (Arc<Budget>, WorkerPool, usize) {
    let budget = Budget::new(usize::MAX);
    let pool = WorkerPool::new(2, options(&budget)).unwrap();
    let plans = Plans::default();
    warm(&pool, &plans);
    let key = RunKey::from_shapes([[16i64]]);
    let kept = beside_a_run(&pool, || {
        let mut c = pool.checkout();
        let mut kept = None;
        c.worker()
            .run(&plans, &key, || {
                kept = Some(alloc(16 * MIB)?.as_ptr() as usize);
                Ok::<(), OrtArenaError>(())
            })
            .unwrap();
        kept.unwrap()
    });
    (budget, pool, kept)
}

/// Two runs after each other, each beside a third run in flight, on two
/// different workers: the second reuses the 16 MiB the first freed in the
/// shared arena; the pool commits it once. Each worker serving its own
/// (`share_large_blocks: None`) commits it twice.
#[test]
fn runs_in_flight_together_reuse_each_others_large_blocks() {
    for share in [true, false] {
        let budget = Budget::new(usize::MAX);
        let opts = WorkerOptions {
            share_large_blocks: share.then_some(crate::SHARE_LARGE_BLOCKS),
            ..options(&budget)
        };
        let pool = WorkerPool::new(3, opts).unwrap();
        let plans = Plans::default();
        warm(&pool, &plans);
        let key = RunKey::from_shapes([[16i64]]);
        let infos = beside_a_run(&pool, || {
            let (mut a, mut b) = (pool.checkout(), pool.checkout());
            a.worker().run(&plans, &key, run_of_two).unwrap();
            b.worker().run(&plans, &key, run_of_two).unwrap();
            [a, b].map(|mut c| c.worker().last_run().cloned().unwrap())
        });
        let committed = budget.stats().peak_committed;
        if share {
            for info in &infos {
                assert!(info.large_peak > 16 * MIB, "{info:?}");
                assert!(
                    info.report.high_water < MIB,
                    "only the small block: {info:?}"
                );
            }
            let large = pool.stats().large_blocks.expect("a pool of 3 shares");
            assert!(large.reserved >= 16 * MIB, "{large:?}");
            assert!(committed < 24 * MIB, "16 MiB committed once: {committed}");
        } else {
            assert!(pool.stats().large_blocks.is_none());
            for info in &infos {
                assert_eq!(info.large_peak, 0, "{info:?}");
                assert!(info.report.high_water > 16 * MIB, "{info:?}");
            }
            assert!(committed >= 32 * MIB, "once per worker: {committed}");
        }
    }
}

/// A run with no other in flight keeps its large blocks on its own plan
/// (a single stream's runs are planned whole), and its model's plans are
/// its own; a run beside another shares them, under the model's plans for
/// sharing runs.
#[test]
fn a_run_alone_keeps_its_large_blocks_beside_another_it_shares_them() {
    let budget = Budget::new(usize::MAX);
    let pool = WorkerPool::new(2, options(&budget)).unwrap();
    let plans = Plans::default();
    warm(&pool, &plans);
    let key = RunKey::from_shapes([[16i64]]);
    for _ in 0..2 {
        let mut c = pool.checkout();
        c.worker().run(&plans, &key, run_of_two).unwrap();
        let info = c.worker().last_run().cloned().unwrap();
        assert_eq!(info.large_peak, 0, "alone: {info:?}");
        assert!(info.report.high_water > 16 * MIB, "{info:?}");
    }
    assert!(
        plans.cache().get(&key).is_some(),
        "the run alone taught its plan"
    );
    assert!(plans.cache().get(&key).unwrap().size() > 16 * MIB);
    let info = beside_a_run(&pool, || {
        let mut c = pool.checkout();
        c.worker().run(&plans, &key, run_of_two).unwrap();
        c.worker().last_run().cloned().unwrap()
    });
    assert!(info.large_peak > 16 * MIB, "beside another: {info:?}");
    let shared = plans
        .sharing()
        .cache()
        .get(&key)
        .expect("learned for sharing runs");
    assert!(
        shared.size() < MIB,
        "its plan holds the small block: {}",
        shared.size()
    );
}

/// A sharing run of a key with a plan is admitted for the plan's block
/// and what its last run held in the shared arena; a key not run yet for
/// the most any run held there.
#[test]
fn a_sharing_runs_admission_counts_its_large_blocks() {
    let budget = Budget::new(1 << 30);
    let pool = WorkerPool::new(3, options(&budget)).unwrap();
    let plans = Plans::default();
    warm(&pool, &plans);
    let key = RunKey::from_shapes([[16i64]]);
    let admitted = beside_a_run(&pool, || {
        let mut c = pool.checkout();
        for _ in 0..2 {
            c.worker().run(&plans, &key, run_of_two).unwrap();
        }
        c.worker().last_run().unwrap().admitted
    });
    let sharing = plans.sharing();
    assert!(sharing.large_need(&key) > 16 * MIB);
    assert!(admitted > 16 * MIB, "admitted for {admitted}");
    let other = RunKey::from_shapes([[8i64]]);
    assert_eq!(sharing.large_need(&other), sharing.large_need(&key));
    assert_eq!(
        plans.large_need(&key),
        0,
        "the model's own runs hold theirs"
    );
}

/// An output of an earlier run freed during a run does not lower what the
/// run is counted to hold in the shared arena: its own blocks are.
#[test]
fn an_earlier_runs_block_freed_in_a_run_is_not_counted_against_it() {
    let budget = Budget::new(usize::MAX);
    let pool = WorkerPool::new(2, options(&budget)).unwrap();
    let plans = Plans::default();
    warm(&pool, &plans);
    let peak = beside_a_run(&pool, || {
        let mut c = pool.checkout();
        let mut kept = None;
        c.worker()
            .run(&plans, &RunKey::from_shapes([[16i64]]), || {
                kept = Some(alloc(16 * MIB)?);
                Ok::<(), OrtArenaError>(())
            })
            .unwrap();
        let old = kept.unwrap();
        c.worker()
            .run(&plans, &RunKey::from_shapes([[8i64]]), || {
                let a = alloc(8 * MIB)?;
                free(old);
                let b = alloc(8 * MIB)?;
                free(a);
                free(b);
                Ok::<(), OrtArenaError>(())
            })
            .unwrap();
        c.worker().last_run().unwrap().large_peak
    });
    assert!(peak >= 16 * MIB, "two 8 MiB blocks at once: {peak}");
}

/// A large block freed on a thread with no worker (an output dropped
/// later) goes back to the shared arena, and the pool's end gives every
/// byte back.
#[test]
fn a_large_block_freed_elsewhere_goes_back_and_nothing_is_left() {
    let (budget, pool, out) = a_pool_with_a_kept_large_block();
    let large = pool.stats().large_blocks.unwrap();
    assert!(large.in_use > 16 * MIB, "{large:?}");
    std::thread::spawn(move || free(NonNull::new(out as *mut u8).unwrap()))
        .join()
        .unwrap();
    assert_eq!(pool.stats().large_blocks.unwrap().in_use, 0);
    drop(pool);
    assert_eq!(budget.committed(), 0, "everything given back");
}

/// The shared arena holds the most its blocks reached over the last
/// window or two, then follows its runs down.
#[test]
fn the_shared_arena_follows_its_runs_down_after_a_window() {
    let budget = Budget::new(usize::MAX);
    let pool = WorkerPool::new(2, options(&budget)).unwrap();
    let plans = Plans::default();
    warm(&pool, &plans);
    let run = |bytes: usize| {
        beside_a_run(&pool, || {
            let mut c = pool.checkout();
            c.worker()
                .run(&plans, &RunKey::from_shapes([[bytes as i64]]), || {
                    free(alloc(bytes)?);
                    Ok::<(), OrtArenaError>(())
                })
                .unwrap();
        });
    };
    run(32 * MIB);
    let reserved = || pool.stats().large_blocks.unwrap().reserved;
    assert!(reserved() >= 32 * MIB);
    run(2 * MIB);
    assert!(reserved() >= 32 * MIB, "held within the window");
    for _ in 0..2 {
        std::thread::sleep(WINDOW + Duration::from_millis(50));
        run(2 * MIB);
    }
    assert!(reserved() < 8 * MIB, "followed down: {}", reserved());
}

/// A worker whose run alone cached the model's whole plan follows the
/// model's sharing runs down after its shrink policy's window, as it would
/// a smaller input: the large blocks those runs need are in the shared
/// arena, not in what the worker holds.
#[test]
fn a_worker_follows_its_models_sharing_runs_down_after_a_window() {
    let budget = Budget::new(usize::MAX);
    let pool = WorkerPool::new(2, options(&budget)).unwrap();
    let plans = Plans::default();
    warm(&pool, &plans);
    let key = RunKey::from_shapes([[16i64]]);
    let mut c = pool.checkout();
    c.worker().run(&plans, &key, run_of_two).unwrap();
    let alone = std::time::Instant::now();
    assert!(
        c.worker().stats().reserved > 16 * MIB,
        "the run alone's plan"
    );
    let (within, after) = beside_a_run(&pool, || {
        c.worker().run(&plans, &key, run_of_two).unwrap();
        assert!(c.worker().last_run().unwrap().large_peak > 16 * MIB);
        let within = (alone.elapsed() < WINDOW).then(|| c.worker().stats().reserved);
        std::thread::sleep(WINDOW + Duration::from_millis(50));
        c.worker().run(&plans, &key, run_of_two).unwrap();
        (within, c.worker().stats().reserved)
    });
    // A machine that stalled past the window has nothing to hold.
    if let Some(within) = within {
        assert!(within > 16 * MIB, "held within the window: {within}");
    }
    assert!(after < 4 * MIB, "followed down after it: {after}");
}

/// A fork while a thread of the parent holds the shared arena's lock (a
/// large allocation or free in flight): the child's pool gets a new shared
/// arena, and a large block of the parent's freed in the child (an output
/// it inherited) is left where it is instead of waiting for ever on that
/// lock.
#[cfg(unix)]
#[test]
fn a_fork_while_the_shared_arena_is_locked_never_hangs_the_child() {
    let (budget, pool, kept) = a_pool_with_a_kept_large_block();
    let large = pool.large().unwrap();
    let (locked_tx, locked_rx) = mpsc::channel();
    let (end_tx, end_rx) = mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let guard = large.slot().lock();
        locked_tx.send(()).unwrap();
        end_rx.recv().ok();
        drop(guard);
    });
    locked_rx.recv().unwrap();
    crate::fork::prepare();
    // SAFETY: `fork` in a test: the child only calls this crate (whose
    // locks `prepare` took) and exits with `_exit`.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: the child, right after `fork()`, on the forking thread.
        unsafe { crate::fork::child() };
        let ok = pool
            .after_fork(options(&budget))
            .is_ok_and(|p| p.large().is_some_and(|l| l.is_free()));
        free(NonNull::new(kept as *mut u8).unwrap());
        // SAFETY: ends the child at once, running nothing of the parent's.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    crate::fork::parent();
    assert!(pid > 0, "fork failed");
    let mut status = 0;
    let t0 = std::time::Instant::now();
    let exited = loop {
        // SAFETY: `pid` is our child; `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break true;
        }
        if t0.elapsed() > Duration::from_secs(10) {
            // SAFETY: kills and reaps our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            break false;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    end_tx.send(()).unwrap();
    holder.join().unwrap();
    free(NonNull::new(kept as *mut u8).unwrap());
    assert!(exited, "the child hung on the parent's lock");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "status {status}"
    );
}

/// A pool of one worker has nothing to share.
#[test]
fn a_pool_of_one_shares_nothing() {
    let pool = WorkerPool::new(1, WorkerOptions::default()).unwrap();
    assert!(pool.stats().large_blocks.is_none());
}
