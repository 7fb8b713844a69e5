//! Several models on one worker, and one budget over several workers.

use crate::common::*;
use tensor_arena::Budget;
use tensor_arena_ort::ort::value::DynValue;
use tensor_arena_ort::{run_shared, ArenaOptions, ArenaSession, RunKey, Worker, WorkerOptions};

/// Runs `session` on `inputs` through `worker`; returns the outputs' bits.
fn run_on(
    worker: &mut Worker,
    session: &ArenaSession,
    inputs: &[(String, DynValue)],
) -> Result<Bits, String> {
    let input: Vec<(&str, &DynValue)> = inputs.iter().map(|(n, v)| (n.as_str(), v)).collect();
    let key = RunKey::of(input.as_slice());
    let outputs = worker.run(session.plans(), &key, || {
        run_shared(session.session(), &input, None).map_err(|e| e.to_string())
    })?;
    Ok(bits(outputs.iter().map(|(n, v)| (n.as_str(), v))))
}

/// Memory-layer calls of a worker so far.
fn calls(w: &Worker) -> u64 {
    let s = w.stats();
    s.backing_allocs + s.backing_frees + s.commits + s.decommits
}

fn open(file: &str) -> ArenaSession {
    ArenaSession::open(runtime(), model(file), ArenaOptions::default()).unwrap()
}

#[test]
fn three_models_on_one_worker_hold_the_largest_need_not_the_sum() {
    // An OCR pipeline on one worker: det on an image, cls and rec on crops.
    let det = open("ppocr_det.onnx");
    let cls = open("ppocr_cls.onnx");
    let rec = open("ppocr_rec.onnx");
    let det_in = inputs(det.inputs(), &[("x", &[1, 3, 480, 480])], 1);
    let cls_in = inputs(cls.inputs(), &[("x", &[6, 3, 48, 192])], 2);
    let rec_in = inputs(rec.inputs(), &[("x", &[6, 3, 48, 320])], 3);
    let mut worker = Worker::new(WorkerOptions::default()).unwrap();
    let mut peak_reserved = 0;
    let mut calls_after_first = 0;
    for round in 0..3 {
        for (session, x) in [(&det, &det_in), (&cls, &cls_in), (&rec, &rec_in)] {
            run_on(&mut worker, session, x).unwrap();
            peak_reserved = peak_reserved.max(worker.stats().reserved);
            let info = worker.last_run().unwrap();
            assert_eq!(info.report.planned, round > 0, "round {round}");
            assert!(!info.report.deviated);
        }
        if round == 0 {
            calls_after_first = calls(&worker);
        }
    }
    // Repeated shapes of every model: no memory-layer call at all.
    assert_eq!(calls(&worker), calls_after_first);
    let need = |s: &ArenaSession| s.plans().cache().largest().unwrap().size();
    let (d, c, r) = (need(&det), need(&cls), need(&rec));
    let largest = d.max(c).max(r);
    assert!(
        peak_reserved <= largest + (2 << 20),
        "reserved peak {peak_reserved}, needs det {d} cls {c} rec {r}"
    );
    assert!(
        d + c + r > largest + (4 << 20),
        "the test needs models whose sum is well above the largest: {d} {c} {r}"
    );
}

#[test]
fn idle_workers_give_way_under_a_budget_and_a_refused_run_fails_cleanly() {
    let det = open("ppocr_det.onnx");
    let large = inputs(det.inputs(), &[("x", &[1, 3, 640, 640])], 1);
    let small = inputs(det.inputs(), &[("x", &[1, 3, 160, 160])], 2);
    // The same values again (same seeds) for a plain session.
    let expected = plain_bits(
        "ppocr_det.onnx",
        &[
            inputs(det.inputs(), &[("x", &[1, 3, 640, 640])], 1),
            inputs(det.inputs(), &[("x", &[1, 3, 160, 160])], 2),
        ],
    );
    // What one large run needs, measured on a worker of its own.
    let mut probe = Worker::new(WorkerOptions::default()).unwrap();
    run_on(&mut probe, &det, &large).unwrap();
    let need = probe.stats().reserved;
    drop(probe);
    // Room for one large run (and a little), not two.
    let budget = Budget::new(need + need / 4);
    let options = WorkerOptions {
        budget: Some(budget.clone()),
        ..WorkerOptions::default()
    };
    let mut a = Worker::new(options.clone()).unwrap();
    let mut b = Worker::new(options).unwrap();
    assert_eq!(run_on(&mut a, &det, &large).unwrap(), expected[0]);
    // `a` is idle and holds its cache; `b`'s commits reclaim it.
    assert_eq!(run_on(&mut b, &det, &large).unwrap(), expected[0]);
    let st = budget.stats();
    assert!(st.reclaimed > 0, "{st:?}");
    assert!(st.peak_committed <= st.limit, "{st:?}");
    assert_eq!(st.refusals, 0, "{st:?}");
    // A budget too small for a run: the run fails as out of memory, nothing
    // is lost, and a smaller run then succeeds with the right outputs.
    let tight = Budget::new(need / 3);
    let mut c = Worker::new(WorkerOptions {
        budget: Some(tight.clone()),
        ..WorkerOptions::default()
    })
    .unwrap();
    let err = run_on(&mut c, &det, &large).unwrap_err();
    assert!(err.contains("bad_alloc"), "{err}");
    let info = c.last_run().unwrap();
    assert!(info.out_of_memory() && info.refused_allocs > 0, "{info:?}");
    assert!(tight.stats().refusals > 0);
    assert!(tight.stats().peak_committed <= tight.stats().limit);
    assert_eq!(c.stats().in_use, 0, "a failed run left blocks live");
    assert_eq!(run_on(&mut c, &det, &small).unwrap(), expected[1]);
    // The other workers were not affected.
    assert_eq!(run_on(&mut a, &det, &large).unwrap(), expected[0]);
}

#[test]
fn a_worker_busy_when_memory_ran_short_gives_back_its_other_models_at_the_run_end() {
    let det = open("ppocr_det.onnx");
    let cls = open("ppocr_cls.onnx");
    let det_in = inputs(det.inputs(), &[("x", &[1, 3, 640, 640])], 1);
    let cls_in = inputs(cls.inputs(), &[("x", &[2, 3, 48, 192])], 2);
    let cls_x: Vec<(&str, &DynValue)> = cls_in.iter().map(|(n, v)| (n.as_str(), v)).collect();
    let budget = Budget::new(usize::MAX);
    let options = || WorkerOptions {
        budget: Some(budget.clone()),
        ..WorkerOptions::default()
    };
    // Two workers, det then cls: each holds det's need for det's sake.
    let mut calm = Worker::new(options()).unwrap();
    let mut pressed = Worker::new(options()).unwrap();
    for w in [&mut calm, &mut pressed] {
        run_on(w, &det, &det_in).unwrap();
    }
    let det_need = det.plans().cache().largest().unwrap().size();
    run_on(&mut calm, &cls, &cls_in).unwrap();
    assert!(calm.stats().reserved >= det_need, "cls keeps det's share");
    // Memory runs short while `pressed` runs cls: it is busy, so relieve
    // takes nothing from it then (the idle `calm` gives everything) ...
    let key = RunKey::of(cls_x.as_slice());
    let before = budget.pressure();
    pressed
        .run(cls.plans(), &key, || {
            budget.relieve();
            run_shared(cls.session(), &cls_x, None)
        })
        .unwrap();
    assert_eq!(budget.pressure(), before + 1);
    assert_eq!(calm.stats().reserved, 0, "the idle worker gave everything");
    // ... and at the run's end it gives back det's share, holding cls's
    // need alone.
    let cls_need = cls.plans().cache().largest().unwrap().size();
    let info = pressed.last_run().unwrap();
    assert!(info.released > 0, "{info:?}");
    let reserved = pressed.stats().reserved;
    assert!(
        reserved <= cls_need + (2 << 20) && reserved < det_need,
        "reserved {reserved}, cls needs {cls_need}, det {det_need}"
    );
    // No pressure since: the next runs follow the usual policy again.
    run_on(&mut pressed, &det, &det_in).unwrap();
    run_on(&mut pressed, &cls, &cls_in).unwrap();
    assert!(pressed.stats().reserved >= det_need);
}

#[test]
fn relieving_a_budget_takes_lazily_given_back_memory_out_at_once() {
    let rec = open("ppocr_rec.onnx");
    let large = inputs(rec.inputs(), &[("x", &[1, 3, 48, 1600])], 1);
    let small = inputs(rec.inputs(), &[("x", &[1, 3, 48, 100])], 2);
    let budget = Budget::new(usize::MAX);
    let mut worker = Worker::new(WorkerOptions {
        budget: Some(budget.clone()),
        pages: tensor_arena_ort::PagesConfig {
            give_back: tensor_arena_ort::GiveBack::Lazily,
            ..Default::default()
        },
        shrink: tensor_arena_ort::Shrink::FollowInput { runs: 1 },
        ..WorkerOptions::default()
    })
    .unwrap();
    run_on(&mut worker, &rec, &large).unwrap();
    run_on(&mut worker, &rec, &small).unwrap();
    // Followed down lazily: given back to the budget, still in RSS.
    let lazy = worker.stats().lazily_given_back;
    assert!(lazy > 0, "{:?}", worker.stats());
    let charged = budget.stats().committed;
    assert_eq!(charged, worker.stats().reserved, "the budget was credited");
    // Memory is short: the idle worker gives back its cache, and what it
    // gave back lazily leaves the process too.
    assert!(budget.relieve() > 0);
    let after = worker.stats();
    assert_eq!(after.reserved, 0, "{after:?}");
    assert_eq!(after.lazily_given_back, 0, "{after:?}");
    // And it still runs, with the same outputs as a fresh worker.
    let again = run_on(&mut worker, &rec, &large).unwrap();
    let mut fresh = Worker::new(WorkerOptions::default()).unwrap();
    assert_eq!(again, run_on(&mut fresh, &rec, &large).unwrap());
}
