//! Sessions: runs, clones, pools, panics and hot swap.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tensor_session::{
    Dtype, LoadMode, MmapAck, ModelHandle, Session, SessionConfig, SessionPool, Weights,
};

/// Weights `w` (rows x 16, f32, w[r][c] = r + c/16) and a bias `b` (rows).
fn matvec_weights(rows: usize, bias: f32) -> Weights {
    let w: Vec<u8> = (0..rows * 16)
        .flat_map(|i| ((i / 16) as f32 + (i % 16) as f32 / 16.0).to_le_bytes())
        .collect();
    let b: Vec<u8> = (0..rows).flat_map(|_| bias.to_le_bytes()).collect();
    Weights::from_tensors([
        ("w", Dtype::F32, vec![rows, 16], w),
        ("b", Dtype::F32, vec![rows], b),
    ])
    .unwrap()
}

/// For a batch of `n` inputs x_k = [k; 16], computes sum_k sum_r (W x_k + b)_r
/// in arena buffers.
fn infer(session: &mut Session, n: usize) -> f32 {
    session.run(&[n, 16], |ctx| {
        let weights = ctx.weights();
        let w = weights.get("w").unwrap().try_as_slice::<f32>().unwrap();
        let b = weights.get("b").unwrap().try_as_slice::<f32>().unwrap();
        let rows = b.len();
        let mut x = ctx.alloc_slice::<f32>(n * 16).unwrap();
        for (i, v) in x.iter_mut().enumerate() {
            *v = (i / 16) as f32;
        }
        let mut y = ctx.alloc_slice::<f32>(n * rows).unwrap();
        let (xs, ys) = (&x[..], &mut y[..]);
        for k in 0..n {
            for r in 0..rows {
                let dot: f32 = (0..16).map(|c| w[r * 16 + c] * xs[k * 16 + c]).sum();
                ys[k * rows + r] = dot + b[r];
            }
        }
        ys.iter().sum()
    })
}

/// The same sum computed directly.
fn expected(rows: usize, n: usize, bias: f32) -> f32 {
    let mut total = 0.0;
    for k in 0..n {
        for r in 0..rows {
            let dot: f32 = (0..16)
                .map(|c| (r as f32 + c as f32 / 16.0) * k as f32)
                .sum();
            total += dot + bias;
        }
    }
    total
}

#[test]
fn a_run_computes_from_weights_and_returns_its_buffers() {
    let mut s = Session::new(Arc::new(matvec_weights(8, 0.5)), SessionConfig::default());
    assert_eq!(infer(&mut s, 3), expected(8, 3, 0.5));
    let st = s.stats();
    assert_eq!((st.runs, st.arena.in_use, st.keys), (1, 0, 1));
    assert_eq!(s.runs_with_key(&[3, 16]), 1);
    let before = s.stats().arena.backing_allocs;
    for _ in 0..100 {
        infer(&mut s, 3);
    }
    assert_eq!(s.stats().arena.backing_allocs, before, "steady state");
}

#[test]
fn clones_share_weights_and_start_empty() {
    let weights = Arc::new(matvec_weights(32, 1.0));
    let mut a = Session::new(Arc::clone(&weights), SessionConfig::default());
    infer(&mut a, 10);
    let b = a.try_clone();
    assert_eq!(
        b.stats().arena.reserved,
        0,
        "a clone starts with an empty arena"
    );
    assert!(Arc::ptr_eq(&a.weights(), &b.weights()));
    let pa = a.weights().get("w").unwrap().bytes().as_ptr();
    let pb = b.weights().get("w").unwrap().bytes().as_ptr();
    assert_eq!(pa, pb, "same weight bytes, not a copy");
    assert_eq!(a.stats().clones_alive, 2);
    drop(b);
    assert_eq!(a.stats().clones_alive, 1);
}

#[test]
fn a_panicking_run_returns_its_buffers_and_the_session_stays_usable() {
    let mut s = Session::new(Arc::new(matvec_weights(4, 0.0)), SessionConfig::default());
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        s.run(&[1], |ctx| {
            let _a = ctx.alloc(1 << 20).unwrap();
            let _b = ctx.alloc(1 << 10).unwrap();
            panic!("kernel failed");
        })
    }));
    assert!(r.is_err());
    assert_eq!(s.stats().arena.in_use, 0);
    assert!(!s.arena().in_run());
    assert_eq!(infer(&mut s, 2), expected(4, 2, 0.0));
}

#[test]
fn a_pool_of_workers_computes_correctly_with_mixed_sizes() {
    for threads in [2usize, 4, 8] {
        let pool = SessionPool::new(
            ModelHandle::new(Arc::new(matvec_weights(16, 0.25))),
            SessionConfig::default(),
            threads,
        );
        std::thread::scope(|s| {
            for t in 0..threads {
                let pool = &pool;
                s.spawn(move || {
                    for i in 0..40 {
                        let n = 1 + (i * 7 + t * 3) % 64;
                        let mut session = pool.get();
                        assert_eq!(infer(&mut session, n), expected(16, n, 0.25));
                        assert_eq!(session.stats().arena.in_use, 0);
                    }
                });
            }
        });
        assert!(pool.sessions() <= threads);
        let st = pool.stats();
        assert_eq!(st.runs, 40 * threads as u64);
        assert_eq!(st.arena.in_use, 0);
        let reserved = st.arena.reserved;
        let released = pool.shrink_idle();
        assert!(released <= reserved);
        let alive = pool.sessions();
        assert_eq!(pool.trim(1), alive - 1);
        assert_eq!(pool.trim(0), 1);
        assert_eq!(pool.sessions(), 0);
        assert_eq!(
            pool.stats().runs,
            40 * threads as u64,
            "trimmed clones still counted"
        );
    }
}

#[test]
fn the_pool_bounds_its_clones_and_waits_for_one_back() {
    let pool = SessionPool::new(
        ModelHandle::new(Arc::new(matvec_weights(2, 0.0))),
        SessionConfig::default(),
        2,
    );
    let a = pool.get();
    let b = pool.get();
    assert!(pool.try_get().is_none());
    std::thread::scope(|s| {
        let waiter = s.spawn(|| pool.get().stats().runs);
        std::thread::sleep(std::time::Duration::from_millis(20));
        drop(a);
        assert_eq!(waiter.join().unwrap(), 0);
    });
    let detached = b.detach();
    assert_eq!(pool.sessions(), 1);
    drop(detached);
}

fn unique_path(tag: &str) -> PathBuf {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    std::env::temp_dir().join(format!(
        "tensor-session-{tag}-{}-{n}.safetensors",
        std::process::id()
    ))
}

fn write_weights(path: &Path, rows: usize, bias: f32) {
    let w = matvec_weights(rows, bias);
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = w
        .iter()
        .map(|t| {
            let dtype = safetensors::Dtype::F32;
            let view =
                safetensors::tensor::TensorView::new(dtype, t.shape().to_vec(), t.bytes()).unwrap();
            (t.name().to_string(), view)
        })
        .collect();
    let bytes = safetensors::serialize(views, None).unwrap();
    std::fs::File::create(path)
        .unwrap()
        .write_all(&bytes)
        .unwrap();
}

fn is_mapped(path: &Path) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let p = path.to_str().unwrap();
    maps.lines().any(|l| l.contains(p))
}

#[test]
fn hot_swap_moves_new_runs_and_releases_the_old_map_after_the_last_old_run() {
    let old_path = unique_path("old");
    let new_path = unique_path("new");
    write_weights(&old_path, 8, 0.0);
    write_weights(&new_path, 8, 100.0);
    // SAFETY: both files are written above by this test under names unique to this process
    // and run, and are only removed, after every map of them is gone.
    let mmap = LoadMode::Mmap(unsafe { MmapAck::new() });
    let handle = ModelHandle::new(Arc::new(Weights::open(&old_path, mmap).unwrap()));
    let pool = SessionPool::new(handle.clone(), SessionConfig::default(), 2);
    assert!(is_mapped(&old_path));

    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        // A run in flight on the old weights.
        let pool = &pool;
        let in_flight = s.spawn(move || {
            let mut session = pool.get();
            session.run(&[1], |ctx| {
                started_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                ctx.weights()
                    .get("b")
                    .unwrap()
                    .try_as_slice::<f32>()
                    .unwrap()[0]
            })
        });
        started_rx.recv().unwrap();
        let old = handle.swap(Arc::new(Weights::open(&new_path, mmap).unwrap()));
        drop(old);
        // New runs see the new weights at once...
        let mut other = pool.get();
        assert_eq!(infer(&mut other, 1), expected(8, 1, 100.0));
        drop(other);
        // ...while the old file stays mapped for the run in flight.
        assert!(is_mapped(&old_path));
        go_tx.send(()).unwrap();
        assert_eq!(
            in_flight.join().unwrap(),
            0.0,
            "the in-flight run finished on the old weights"
        );
    });
    assert!(
        !is_mapped(&old_path),
        "old map released after the last old run"
    );
    assert!(is_mapped(&new_path));
    drop(pool);
    drop(handle);
    assert!(!is_mapped(&new_path));
    std::fs::remove_file(old_path).unwrap();
    std::fs::remove_file(new_path).unwrap();
}

#[test]
fn a_plan_learned_by_one_clone_serves_another_clones_first_run() {
    let weights = Arc::new(matvec_weights(16, 0.0));
    let mut a = Session::new(weights, SessionConfig::default());
    assert_eq!(infer(&mut a, 12), expected(16, 12, 0.0));
    assert_eq!(
        a.plans().stats().plans,
        1,
        "the first run of the key is planned"
    );
    let mut b = a.try_clone();
    assert_eq!(b.stats().arena.reserved, 0);
    assert!(b.warm(&[12, 16]).unwrap(), "the family knows the key");
    let reserved = b.stats().arena;
    assert_eq!(infer(&mut b, 12), expected(16, 12, 0.0));
    let report = b.stats().last_run.unwrap();
    assert!(report.planned && !report.deviated);
    assert_eq!(report.backing_allocs, 0, "no backing call");
    assert_eq!(
        report.planned_allocs, report.allocs,
        "no dynamic-pool search"
    );
    assert_eq!(b.stats().arena.backing_allocs, reserved.backing_allocs);
    // A new key is recorded, then planned, by whichever clone sees it.
    infer(&mut b, 5);
    infer(&mut a, 5);
    assert!(a.stats().last_run.unwrap().planned);
    let st = a.stats().plans;
    assert_eq!((st.plans, st.deviations), (2, 0));
}

/// The base page size: the commit granule of `Pages` without huge pages.
const PAGE: usize = 4096;

/// `Pages` in base pages, so that byte counts below 2 MiB are exact.
fn base_pages() -> tensor_arena::memory::PagesConfig {
    tensor_arena::memory::PagesConfig {
        huge_pages: tensor_arena::memory::HugePages::Never,
        ..Default::default()
    }
}

#[test]
fn a_small_shape_is_served_by_a_larger_plan_then_gets_its_own_after_shrink() {
    let config = SessionConfig {
        plans: tensor_session::PlanConfig {
            serve_smaller_from_larger: true,
            ..tensor_session::PlanConfig::default()
        },
        memory: base_pages(),
        ..SessionConfig::default()
    };
    let mut s = Session::new(Arc::new(matvec_weights(64, 0.0)), config);
    infer(&mut s, 400); // the large shape, recorded and planned
    let large = s.plans().get(&[400usize, 16][..]).unwrap();
    // A new, smaller shape: served at once from the large plan.
    assert_eq!(infer(&mut s, 3), expected(64, 3, 0.0));
    let first = s.stats().last_run.unwrap();
    assert!(first.planned && !first.deviated, "{first:?}");
    assert_eq!(first.backing_allocs, 0);
    // Its own plan was learned at the same time and serves it from now on.
    let small = s.plans().get(&[3usize, 16][..]).expect("own plan learned");
    assert!(small.size() < large.size());
    infer(&mut s, 3);
    assert!(s.stats().last_run.unwrap().planned);
    // Traffic stays small: shrink releases the large plan's block.
    s.shrink();
    let reserved = s.stats().arena.reserved;
    assert!(
        reserved < large.size(),
        "{reserved} vs large plan {}",
        large.size()
    );
    assert!(reserved <= small.size().next_multiple_of(PAGE));
    infer(&mut s, 3);
    assert_eq!(s.stats().last_run.unwrap().memory_calls(), 0);
}

#[test]
fn warming_a_used_clone_keeps_one_region_and_the_next_run_calls_nothing() {
    let mut a = Session::new(Arc::new(matvec_weights(16, 0.0)), SessionConfig::default());
    infer(&mut a, 200); // plan for the large key
    let mut b = a.try_clone();
    infer(&mut b, 2); // b holds a small region
    assert!(b.warm(&[200, 16]).unwrap());
    let st = b.stats().arena;
    assert_eq!(
        st.regions, 1,
        "laid out again as one region, not a second one"
    );
    infer(&mut b, 200);
    let report = b.stats().last_run.unwrap();
    assert!(report.planned);
    assert_eq!((report.backing_allocs, report.backing_frees), (0, 0));
    assert_eq!((a.id(), b.id()), (0, 1));
}

#[test]
fn after_learning_a_plan_the_arena_keeps_only_the_plans_block() {
    // Best fit reaches 600 KiB on this run; its lower bound (and plan) is 500 KiB.
    fn tricky(s: &mut Session) {
        s.run(&[7], |ctx| {
            let k = 1024;
            let a = ctx.alloc(300 * k).unwrap();
            let b = ctx.alloc(100 * k).unwrap();
            drop(a);
            let c = ctx.alloc(200 * k).unwrap();
            let d = ctx.alloc(200 * k).unwrap();
            drop((b, c, d));
        })
    }
    let pages = SessionConfig {
        memory: base_pages(),
        ..SessionConfig::default()
    };
    let mut s = Session::new(Arc::new(matvec_weights(4, 0.0)), pages);
    tricky(&mut s);
    let plan = s.plans().peek(&[7usize][..]).unwrap();
    assert_eq!(plan.size(), 500 * 1024);
    let first = s.stats().last_run.unwrap();
    assert_eq!(
        first.high_water,
        600 * 1024,
        "the recorded run needed more than its plan"
    );
    assert_eq!(s.stats().arena.reserved, plan.size());
    let hits = s.plans().stats().hits;
    tricky(&mut s);
    assert_eq!(
        s.plans().stats().hits,
        hits + 1,
        "peek counts nothing, get does"
    );
    let report = s.stats().last_run.unwrap();
    assert!(report.planned && report.backing_allocs == 0);

    let off = SessionConfig {
        plans: tensor_session::PlanConfig {
            shrink_to_plans: false,
            ..tensor_session::PlanConfig::default()
        },
        memory: base_pages(),
        ..SessionConfig::default()
    };
    let mut s = Session::new(Arc::new(matvec_weights(4, 0.0)), off);
    tricky(&mut s);
    assert_eq!(s.stats().arena.reserved, 600 * 1024);
}
