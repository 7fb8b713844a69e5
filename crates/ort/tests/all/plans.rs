//! Runs keyed by input shapes: a repeated shape makes no backing call and
//! holds its lower bound; a shrink policy follows small inputs.

use crate::common::*;
use tensor_arena::memory::{GiveBack, PagesConfig};
use tensor_arena::{ArenaConfig, ShrinkPolicy};
use tensor_arena_ort::ort::value::DynValue;
use tensor_arena_ort::{ArenaOptions, ArenaSession, RunOutput, SessionWorker, Shrink};

fn run(worker: &mut SessionWorker, inputs: &[(String, DynValue)]) -> RunOutput {
    let input: Vec<(&str, &DynValue)> = inputs.iter().map(|(n, v)| (n.as_str(), v)).collect();
    worker.run(&input).unwrap()
}

/// Memory-layer calls so far: reservations, commits, decommits, releases.
fn backing(w: &SessionWorker) -> u64 {
    let s = w.stats();
    s.backing_allocs + s.backing_frees + s.commits + s.decommits
}

#[test]
fn repeated_shapes_make_no_backing_call() {
    let options = ArenaOptions {
        shrink: Shrink::KeepLargest,
        ..ArenaOptions::default()
    };
    let session = ArenaSession::open(runtime(), model("ppocr_rec.onnx"), options).unwrap();
    let large = inputs(session.inputs(), &[("x", &[1, 3, 48, 960])], 1);
    let small = inputs(session.inputs(), &[("x", &[1, 3, 48, 160])], 2);
    let mut worker = session.worker().unwrap();
    // First of each shape: recorded and planned (backing calls allowed).
    let first_allocs = run(&mut worker, &large).report.allocs;
    drop(run(&mut worker, &small));
    let before = backing(&worker);
    for i in 0..4 {
        let input = if i % 2 == 0 { &large } else { &small };
        let out = run(&mut worker, input);
        assert!(
            out.report.planned && !out.report.deviated,
            "run {i}: {:?}",
            out.report
        );
        assert_eq!(out.report.planned_allocs, out.report.allocs, "run {i}");
        assert_eq!(
            out.alloc_calls, out.report.allocs,
            "every Alloc of the run is an arena block"
        );
    }
    assert_eq!(
        backing(&worker),
        before,
        "repeated shapes made backing calls"
    );
    // What is held is the largest plan, which is close to the largest run's
    // lower bound (the most bytes live at once).
    let plans = session.plans();
    let largest = plans.cache().largest().unwrap();
    let lower = largest.lower_bound();
    let stats = worker.stats();
    assert!(lower > 1 << 20, "a real model's tensors: {lower}");
    assert!(
        stats.reserved <= largest.size() + (2 << 20)
            && largest.size() as f64 <= lower as f64 * 1.10,
        "reserved {} plan {} lower bound {lower}",
        stats.reserved,
        largest.size()
    );
    assert!(
        first_allocs > 100,
        "rec allocates every tensor: {first_allocs}"
    );
}

#[test]
fn shrink_policy_follows_small_inputs() {
    let options = ArenaOptions {
        plans: false,
        shrink: Shrink::Never,
        arena: ArenaConfig {
            shrink_policy: ShrinkPolicy::AfterEveryRun,
            ..ArenaConfig::default()
        },
        ..ArenaOptions::default()
    };
    let session = ArenaSession::open(runtime(), model("ppocr_rec.onnx"), options).unwrap();
    let large = inputs(session.inputs(), &[("x", &[1, 3, 48, 1600])], 1);
    let small = inputs(session.inputs(), &[("x", &[1, 3, 48, 100])], 2);
    let mut worker = session.worker().unwrap();
    let big = run(&mut worker, &large);
    let big_need = big.report.high_water;
    drop(big);
    let after_large = worker.stats().reserved;
    let mut need = 0;
    for _ in 0..3 {
        let out = run(&mut worker, &small);
        need = out.report.high_water;
    }
    let after_small = worker.stats().reserved;
    assert!(big_need > 4 * need, "large {big_need} small {need}");
    assert!(after_large >= big_need / 2, "{after_large} {big_need}");
    // Reserved follows the small runs' need (a region's granule of slack).
    assert!(
        after_small >= need && after_small <= need + (2 << 20),
        "reserved {after_small} after small runs needing {need} (large needed {big_need})"
    );
}

#[test]
fn following_each_run_a_small_input_brings_memory_down_and_commits_again_in_place() {
    // The default before issue 35, kept as an option.
    let options = ArenaOptions {
        shrink: Shrink::FollowInput { runs: 1 },
        ..ArenaOptions::default()
    };
    let session = ArenaSession::open(runtime(), model("ppocr_rec.onnx"), options).unwrap();
    let large = inputs(session.inputs(), &[("x", &[1, 3, 48, 1600])], 1);
    let small = inputs(session.inputs(), &[("x", &[1, 3, 48, 100])], 2);
    let mut worker = session.worker().unwrap();
    let first = run(&mut worker, &large).report;
    let after_large = worker.stats().reserved;
    drop(run(&mut worker, &small));
    let small_plan = session
        .plans()
        .cache()
        .get(&[4usize, 1, 3, 48, 100][..])
        .expect("the small shape was planned");
    let after_small = worker.stats().reserved;
    assert!(
        after_small <= small_plan.size() + (2 << 20) && after_small * 4 < after_large,
        "reserved {after_small} after the small run (its plan {}), {after_large} after the large one",
        small_plan.size()
    );
    // The large shape again: served from its plan, committed again in
    // place (no new reservation), with no more commits than its first run.
    let again = run(&mut worker, &large).report;
    assert!(again.planned && !again.deviated, "{again:?}");
    assert_eq!(again.backing_allocs, 0, "a new reservation: {again:?}");
    assert!(
        again.commits >= 1 && again.commits <= first.commits.max(1),
        "commits: first {} again {}",
        first.commits,
        again.commits
    );
    // Nothing was given back since: the next one makes no memory-layer call.
    let before = backing(&worker);
    let third = run(&mut worker, &large).report;
    assert!(third.planned);
    assert_eq!(backing(&worker), before, "{third:?}");
}

#[test]
fn the_default_holds_alternating_sizes_and_follows_down_after_its_window() {
    let session =
        ArenaSession::open(runtime(), model("ppocr_rec.onnx"), ArenaOptions::default()).unwrap();
    let large = inputs(session.inputs(), &[("x", &[1, 3, 48, 1600])], 1);
    let small = inputs(session.inputs(), &[("x", &[1, 3, 48, 100])], 2);
    let mut worker = session.worker().unwrap();
    drop(run(&mut worker, &large));
    let after_large = worker.stats().reserved;
    // Sizes alternating at full rate: the large one's memory is held, so a
    // large run after a small one makes no memory-layer call.
    for _ in 0..2 {
        drop(run(&mut worker, &small));
        assert_eq!(worker.stats().reserved, after_large);
        let before = backing(&worker);
        let again = run(&mut worker, &large).report;
        assert!(again.planned, "{again:?}");
        assert_eq!(backing(&worker), before, "{again:?}");
    }
    // A window (1 s) of small runs only: memory follows them down.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    drop(run(&mut worker, &small));
    let after_small = worker.stats().reserved;
    assert!(
        after_small * 4 < after_large,
        "reserved {after_small} after the window, {after_large} after the large run"
    );
}

/// The outputs' hash of a run.
fn hash(out: &RunOutput) -> u64 {
    tensor_arena_ort::hash_outputs(out.outputs.iter().map(|(n, v)| (n.as_str(), v))).unwrap()
}

#[test]
fn given_back_lazily_memory_still_follows_the_input_down_and_outputs_match() {
    let options = ArenaOptions {
        pages: PagesConfig {
            give_back: GiveBack::Lazily,
            ..PagesConfig::default()
        },
        shrink: Shrink::FollowInput { runs: 1 },
        ..ArenaOptions::default()
    };
    let session = ArenaSession::open(runtime(), model("ppocr_rec.onnx"), options).unwrap();
    let large = inputs(session.inputs(), &[("x", &[1, 3, 48, 1600])], 1);
    let small = inputs(session.inputs(), &[("x", &[1, 3, 48, 100])], 2);
    let mut worker = session.worker().unwrap();
    let first = run(&mut worker, &large);
    let (first_hash, first_report) = (hash(&first), first.report);
    drop(first);
    let after_large = worker.stats().reserved;
    drop(run(&mut worker, &small));
    let after_small = worker.stats().reserved;
    assert!(
        after_small * 4 < after_large,
        "reserved {after_small} after the small run, {after_large} after the large one"
    );
    let lazy = worker.stats().lazily_given_back;
    assert!(
        lazy > 0 && lazy <= after_large - after_small,
        "{lazy} given back lazily of {}",
        after_large - after_small
    );
    // The large shape again, on pages given back lazily and settled by the
    // commit: served from its plan, committed again in place, and the same
    // outputs, bit for bit.
    let again = run(&mut worker, &large);
    assert!(
        again.report.planned && !again.report.deviated,
        "{:?}",
        again.report
    );
    assert_eq!(again.report.backing_allocs, 0, "{:?}", again.report);
    assert!(
        again.report.commits >= 1 && again.report.commits <= first_report.commits.max(1),
        "commits: first {} again {}",
        first_report.commits,
        again.report.commits
    );
    assert_eq!(
        hash(&again),
        first_hash,
        "outputs differ after a lazy give-back"
    );
    drop(again);
    // Small again, then everything given back lazily leaves at once.
    drop(run(&mut worker, &small));
    let lazy = worker.stats().lazily_given_back;
    assert!(lazy > 0);
    assert_eq!(worker.worker_mut().give_back_now(), lazy);
    assert_eq!(worker.stats().lazily_given_back, 0);
    assert_eq!(
        worker.stats().reserved,
        after_small,
        "what the worker holds stays"
    );
}
