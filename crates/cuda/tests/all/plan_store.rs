//! Plans that outlive the process: one arena saves its plans to a store,
//! a second (another process's, here another simulated device) loads them
//! and is planned from its first run; files and paths that cannot be used
//! are clean errors that load nothing.

use crate::common::{sim_arena, SMALL};
use std::path::Path;
use tensor_arena::{PlanSource, RunReport};
use tensor_arena_cuda::driver::{DevicePtr, Stream};
use tensor_arena_cuda::{DeviceArena, DeviceConfig, SimDriver};

const K: usize = 64 << 10;
/// The weights: live outside runs, made before the first.
const WEIGHTS: usize = 1 << 20;
const OPTIONS: &str = "torch=test device=sim";

/// One run of the model at batch `n`: an input, activations that overlap,
/// an output copied out and dropped inside the run.
fn forward(a: &mut DeviceArena, n: usize) -> RunReport {
    a.begin_run(format!("m:{n}").as_bytes()).unwrap();
    let s = Stream::DEFAULT;
    let x = a.alloc(n * K, s).unwrap();
    let h1 = a.alloc(3 * n * K, s).unwrap();
    a.free(x, s).unwrap();
    let h2 = a.alloc(2 * n * K, s).unwrap();
    let h3 = a.alloc(4 * n * K + 512, s).unwrap();
    a.free(h1, s).unwrap();
    a.free(h2, s).unwrap();
    let out = a.alloc(n * K / 2, s).unwrap();
    a.free(h3, s).unwrap();
    a.free(out, s).unwrap();
    a.end_run().unwrap()
}

/// A fresh arena holding the model's weights.
fn with_weights() -> (DeviceArena, SimDriver, DevicePtr) {
    let (mut a, sim) = sim_arena(SMALL, DeviceConfig::default());
    let w = a.alloc(WEIGHTS, Stream::DEFAULT).unwrap();
    (a, sim, w)
}

/// The first process: batches 16, 1, 8, each twice (the second planned);
/// saves its plans to `dir`. Returns the planned runs' reports by batch.
fn first_process(dir: &Path) -> Vec<(usize, RunReport)> {
    let (mut a, _sim, _w) = with_weights();
    let mut planned = Vec::new();
    for n in [16, 1, 8] {
        forward(&mut a, n);
    }
    for n in [16, 1, 8] {
        let r = forward(&mut a, n);
        assert!(r.planned && !r.deviated, "{n}: {r:?}");
        planned.push((n, r));
    }
    let saved = a.save_plans(&a.plan_store(dir, "m", OPTIONS)).unwrap();
    assert_eq!(saved.plans, 3, "{saved:?}");
    assert!(saved.families >= 1, "{saved:?}");
    planned
}

#[test]
fn a_second_arena_is_planned_from_its_first_run() {
    let dir = tempfile::tempdir().unwrap();
    let planned = first_process(dir.path());
    let (mut b, _sim, _w) = with_weights();
    let store = b.plan_store(dir.path(), "m", OPTIONS);
    let loaded = b.load_plans(&store).unwrap();
    assert_eq!(loaded.plans, 3, "{loaded:?}");
    assert!(
        loaded.families >= 1 && loaded.warning.is_none(),
        "{loaded:?}"
    );
    // A key the first process learned: served from its plan at first sight,
    // at the plan's footprint (the first arena's planned run).
    let granule = b.granule();
    for (i, (n, want)) in planned.into_iter().enumerate() {
        let r = forward(&mut b, n);
        assert_eq!(b.last_plan(), Some(PlanSource::Exact), "{n}");
        assert!(r.planned && !r.deviated, "{n}: {r:?}");
        assert_eq!(r.high_water, want.high_water, "{n}: the plan's block");
        assert_eq!(r.peak_in_use, want.peak_in_use, "{n}");
        if i == 0 {
            // The process's first run (the largest batch): the weights and
            // the plan's block mapped, nothing more.
            assert_eq!(
                b.stats().last_run_peak_mapped,
                (WEIGHTS + r.high_water).next_multiple_of(granule),
                "{n}"
            );
        }
    }
    // A shape no process ran: predicted from the loaded family, kept to.
    let r = forward(&mut b, 4);
    assert!(
        matches!(
            b.last_plan(),
            Some(PlanSource::Predicted | PlanSource::Exact)
        ),
        "{:?}",
        b.last_plan()
    );
    assert!(r.planned && !r.deviated, "{r:?}");
    assert_eq!(
        r.high_water,
        r.peak_in_use - WEIGHTS,
        "predicted at the lower bound"
    );
    b.check_invariants();
}

#[test]
fn a_first_process_loads_nothing_and_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let (mut a, _sim, _w) = with_weights();
    let loaded = a
        .load_plans(&a.plan_store(dir.path(), "m", OPTIONS))
        .unwrap();
    assert_eq!((loaded.plans, loaded.families), (0, 0));
    assert!(loaded.warning.is_none());
    let r = forward(&mut a, 8);
    assert!(!r.planned);
}

/// The load refused with a message containing `why`, and nothing added.
fn refused(dir: &Path, model: &str, options: &str, why: &str) {
    let (mut b, _sim, _w) = with_weights();
    let e = b
        .load_plans(&b.plan_store(dir, model, options))
        .unwrap_err()
        .to_string();
    assert!(e.contains(why), "{e}");
    assert!(!e.contains('\n'), "one line: {e}");
    let s = b.stats().plans;
    assert_eq!((s.plans, s.families), (0, 0), "{s:?}");
    let r = forward(&mut b, 8);
    assert!(!r.planned, "nothing to plan with: {r:?}");
    b.check_invariants();
}

#[test]
fn unusable_stores_are_clean_errors() {
    let dir = tempfile::tempdir().unwrap();
    first_process(dir.path());
    let (probe, _sim, _w) = with_weights();
    let path = probe.plan_store(dir.path(), "m", OPTIONS).path();
    let good = std::fs::read(&path).unwrap();
    // Another setting's store (another torch, say) is a file of its own
    // (the file is named by the whole key): nothing loaded, no warning.
    {
        let (mut b, _sim, _w) = with_weights();
        let other = b
            .load_plans(&b.plan_store(dir.path(), "m", "torch=other device=sim"))
            .unwrap();
        assert_eq!((other.plans, other.families), (0, 0));
        assert!(other.warning.is_none());
    }
    // Corrupt: one byte of the body flipped.
    let mut bad = good.clone();
    let last = bad.len() - 1;
    bad[last] ^= 0x55;
    std::fs::write(&path, &bad).unwrap();
    refused(dir.path(), "m", OPTIONS, "checksum");
    // Truncated, empty, not a store.
    std::fs::write(&path, &good[..good.len() / 2]).unwrap();
    refused(dir.path(), "m", OPTIONS, "truncated");
    std::fs::write(&path, b"").unwrap();
    refused(dir.path(), "m", OPTIONS, "empty");
    std::fs::write(&path, b"not a plan store, not at all, no").unwrap();
    refused(dir.path(), "m", OPTIONS, "not a plan store");
    // A missing directory, a file where the directory should be.
    refused(&dir.path().join("missing"), "m", OPTIONS, "does not exist");
    refused(&path, "m", OPTIONS, "not a directory");
    // Saving where no directory can be made.
    let (a, _sim, _w) = with_weights();
    let e = a
        .save_plans(&a.plan_store(&path.join("below-a-file"), "m", OPTIONS))
        .unwrap_err()
        .to_string();
    assert!(e.contains("saving plan store"), "{e}");
}
