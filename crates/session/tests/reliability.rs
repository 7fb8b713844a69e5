//! Adversarial cases for sessions: each gives a documented result and
//! leaves the session (or pool) usable.
//!
//! Related cases that live elsewhere (not repeated here):
//! - 10,000 session clone/destroy cycles back to the baseline bytes:
//!   `tests/clone_destroy.rs` (`clone_destroy_10000_times_returns_to_baseline`,
//!   alone in its binary because it counts through a global allocator);
//! - a panicking run: `tests/sessions.rs`
//!   (`a_panicking_run_returns_its_buffers_and_the_session_stays_usable`);
//! - the mmap'd weights file truncated while mapped (SIGBUS, asserted in a
//!   child process) and replaced by rename (old bytes stay valid):
//!   `tests/weights/` (`truncated_while_mapped_raises_sigbus`,
//!   `replaced_by_rename_while_mapped_old_bytes_stay_valid`);
//! - arbitrary bytes as a weights file, both load modes: the `weights_load`
//!   fuzz target, replayed over its corpus by `crates/arena-ops/tests/corpus.rs`.

use std::sync::Arc;
use tensor_session::tensor_arena::ArenaError;
use tensor_session::{Dtype, ModelHandle, Session, SessionConfig, SessionPool, Weights};

const COLS: usize = 32;

/// A `rows` x 32 f32 matrix `w` with small integer entries (exact sums).
fn weights(rows: usize) -> Arc<Weights> {
    let w: Vec<u8> = (0..rows * COLS)
        .flat_map(|i| ((i % 5) as f32).to_le_bytes())
        .collect();
    Arc::new(Weights::from_tensors([("w", Dtype::F32, vec![rows, COLS], w)]).unwrap())
}

/// `n` products `W x` with `x = [1; 32]`, in arena buffers; returns their sum.
fn infer(session: &mut Session, n: usize) -> f32 {
    session.run(&[n], |ctx| {
        let w = ctx.weights().get("w").unwrap();
        let w = w.try_as_slice::<f32>().unwrap();
        let rows = w.len() / COLS;
        let mut x = ctx.alloc_slice::<f32>(n * COLS).unwrap();
        x.fill(1.0);
        let mut y = ctx.alloc_slice::<f32>(n * rows).unwrap();
        for (xr, yr) in x.chunks_exact(COLS).zip(y.chunks_exact_mut(rows)) {
            for (o, wr) in yr.iter_mut().zip(w.chunks_exact(COLS)) {
                *o = xr.iter().zip(wr).map(|(a, b)| a * b).sum();
            }
        }
        drop(x);
        y.iter().sum()
    })
}

fn expected(rows: usize, n: usize) -> f32 {
    let per_row: Vec<f32> = (0..rows)
        .map(|r| (0..COLS).map(|c| ((r * COLS + c) % 5) as f32).sum())
        .collect();
    n as f32 * per_row.iter().sum::<f32>()
}

/// Workers created and destroyed 50 times (new threads every round) over
/// one pool; every few rounds the idle clones are shrunk or dropped, so
/// clones are made and destroyed too. Nothing stays in use, the pool never
/// exceeds its bound, and when the pool goes the weights are released.
#[test]
fn thread_churn_50_rounds_with_a_pool() {
    const WORKERS: usize = 4;
    const ROWS: usize = 8;
    let w = weights(ROWS);
    let pool = SessionPool::new(
        ModelHandle::new(Arc::clone(&w)),
        SessionConfig::default(),
        WORKERS,
    );
    let mut total_runs = 0u64;
    for round in 0..50usize {
        let workers = 1 + round % WORKERS;
        std::thread::scope(|s| {
            for t in 0..workers {
                let pool = &pool;
                s.spawn(move || {
                    let mut session = pool.get();
                    for i in 0..3 {
                        let n = 1 + (round * 7 + t * 5 + i * 3) % 48;
                        assert_eq!(infer(&mut session, n), expected(ROWS, n));
                    }
                    assert_eq!(session.stats().arena.in_use, 0);
                });
            }
        });
        total_runs += 3 * workers as u64;
        assert!(
            pool.sessions() <= WORKERS,
            "round {round}: {} clones",
            pool.sessions()
        );
        assert_eq!(
            pool.idle(),
            pool.sessions(),
            "round {round}: a clone was not given back"
        );
        let st = pool.stats();
        assert_eq!(st.arena.in_use, 0, "round {round}");
        assert_eq!(st.arena.live_blocks, 0, "round {round}");
        assert_eq!(st.runs, total_runs, "round {round}");
        assert_eq!(
            st.clones_alive,
            1 + pool.sessions(),
            "round {round}: template + clones"
        );
        match round % 10 {
            4 => {
                pool.shrink_idle();
            }
            9 => {
                let alive = pool.sessions();
                assert_eq!(pool.trim(0), alive);
                assert_eq!(pool.sessions(), 0);
                assert_eq!(pool.stats().clones_alive, 1);
            }
            _ => {}
        }
    }
    assert!(
        pool.stats().clones_created > 1 + WORKERS as u64,
        "clones were remade"
    );
    // The pool is usable after all that, and dropping it releases the weights.
    assert_eq!(infer(&mut pool.get(), 5), expected(ROWS, 5));
    drop(pool);
    assert_eq!(Arc::strong_count(&w), 1, "the weights outlived the pool");
}

/// Requests the arena refuses come back as errors inside the run; the run
/// ends cleanly and the session stays usable.
#[test]
fn a_run_refused_by_the_arena_leaves_the_session_usable() {
    let mut s = Session::new(weights(4), SessionConfig::default());
    let errors = s.run(&[1], |ctx| {
        let ok = ctx.alloc(1000).unwrap();
        let e1 = ctx.alloc(usize::MAX).unwrap_err();
        let e2 = ctx.alloc_slice::<f64>(usize::MAX / 4).unwrap_err();
        let e3 = ctx.arena().try_alloc_aligned(64, 3).unwrap_err();
        assert_eq!(ok.len(), 1000);
        [e1, e2, e3]
    });
    assert!(matches!(errors[0], ArenaError::CapacityOverflow { .. }));
    assert!(matches!(errors[1], ArenaError::CapacityOverflow { .. }));
    assert_eq!(errors[2], ArenaError::InvalidAlignment { align: 3 });
    let st = s.stats();
    assert_eq!(st.arena.in_use, 0);
    assert_eq!(st.last_run.map(|r| r.leaked_blocks), Some(0));
    assert!(!s.arena().in_run());
    assert_eq!(infer(&mut s, 3), expected(4, 3));
}

/// A session whose arena is capped: a run that needs more than the cap gets
/// `OverCap`, and the next, smaller run succeeds on the same session.
#[test]
fn a_run_over_the_cap_leaves_the_session_usable() {
    let mut config = SessionConfig::default();
    config.arena.max_reserved = 256 << 10;
    let mut s = Session::new(weights(4), config);
    let err = s.run(&[10_000], |ctx| {
        let _a = ctx.alloc(200 << 10).unwrap();
        ctx.alloc(200 << 10).map(drop).unwrap_err()
    });
    assert!(
        matches!(err, ArenaError::OverCap { limit, .. } if limit == 256 << 10),
        "{err}"
    );
    assert_eq!(s.stats().arena.in_use, 0);
    assert!(s.stats().arena.reserved <= 256 << 10);
    assert_eq!(infer(&mut s, 50), expected(4, 50));
}

/// The model swapped 50 times while workers run: every run sees one
/// consistent set of weights, and each old set is freed once no run uses it.
#[test]
fn hot_swap_churn_releases_every_old_model() {
    let first = weights(4);
    let model = ModelHandle::new(Arc::clone(&first));
    let pool = SessionPool::new(model.clone(), SessionConfig::default(), 2);
    let mut old = vec![Arc::downgrade(&first)];
    drop(first);
    std::thread::scope(|s| {
        let pool = &pool;
        let worker = s.spawn(move || {
            for i in 0..200usize {
                let mut session = pool.get();
                let got = infer(&mut session, 1 + i % 7);
                // Any of the models: 4 or 8 rows.
                let n = 1 + i % 7;
                assert!(
                    got == expected(4, n) || got == expected(8, n),
                    "run {i}: {got} matches no model"
                );
            }
        });
        for i in 0..50usize {
            let rows = if i % 2 == 0 { 8 } else { 4 };
            let new = weights(rows);
            old.push(Arc::downgrade(&new));
            drop(model.swap(new));
            std::thread::yield_now();
        }
        worker.join().unwrap();
    });
    // Every model but the current one is gone.
    let alive = old.iter().filter(|w| w.strong_count() > 0).count();
    assert_eq!(alive, 1, "{alive} models still alive");
    drop(pool);
    drop(model);
    assert!(old.iter().all(|w| w.strong_count() == 0));
}
