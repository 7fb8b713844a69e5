//! Plans that outlive the process (issue 47): a session started from the
//! store an earlier session of the same model saved serves each shape the
//! earlier one saw on its exact plan from its first run (no dynamic run,
//! the plan's own block), predicts new widths from the loaded family, and
//! computes the same outputs; a store of another model is refused and the
//! session starts empty; a `PlanSaver` saves off the runs' threads.

use crate::common::*;
use std::time::Duration;
use tensor_arena_ort::ort::value::DynValue;
use tensor_arena_ort::{
    hash_outputs, model_key, ArenaOptions, ArenaSession, PlanSaver, PlanSource, PlanStore,
    RunOutput, SessionWorker,
};

fn digest(out: &RunOutput) -> u64 {
    hash_outputs(out.outputs.iter().map(|(n, v)| (n.as_str(), v))).unwrap()
}

fn run(worker: &mut SessionWorker, inputs: &[(String, DynValue)]) -> RunOutput {
    let input: Vec<(&str, &DynValue)> = inputs.iter().map(|(n, v)| (n.as_str(), v)).collect();
    worker.run(&input).unwrap()
}

fn session(store: PlanStore) -> ArenaSession {
    let options = ArenaOptions {
        plan_store: Some(store),
        ..ArenaOptions::default()
    };
    ArenaSession::open(runtime(), model("ppocr_rec.onnx"), options).unwrap()
}

fn store(dir: &std::path::Path, model_name: &str) -> PlanStore {
    let bytes = std::fs::read(model(model_name)).unwrap();
    let key = model_key(&bytes, runtime().version(), "intra_threads=0");
    PlanStore::new(dir, key)
}

const SEEN: [usize; 3] = [160, 320, 640];

#[test]
fn a_fresh_session_from_a_store_is_planned_from_its_first_run() {
    let dir = tempfile::tempdir().unwrap();
    let first = session(store(dir.path(), "ppocr_rec.onnx"));
    let mut hashes = Vec::new();
    {
        let mut w = first.worker().unwrap();
        for (i, width) in SEEN.into_iter().enumerate() {
            let x = inputs(first.inputs(), &[("x", &[1, 3, 48, width])], i as u64);
            let out = run(&mut w, &x);
            hashes.push(digest(&out));
        }
    }
    let saved = first.plans().save().expect("a store").expect("saved");
    assert!(saved.plans >= SEEN.len(), "{saved:?}");
    assert!(first.plans().save().is_none(), "nothing new to save");

    let second = session(store(dir.path(), "ppocr_rec.onnx"));
    assert!(second.plans().stats().plans >= SEEN.len());
    let mut w = second.worker().unwrap();
    for (i, width) in SEEN.into_iter().enumerate() {
        let x = inputs(second.inputs(), &[("x", &[1, 3, 48, width])], i as u64);
        let out = run(&mut w, &x);
        assert_eq!(out.plan, Some(PlanSource::Exact), "width {width}");
        assert!(
            out.report.planned && !out.report.deviated,
            "{:?}",
            out.report
        );
        assert_eq!(digest(&out), hashes[i], "width {width}");
    }
    // A width never seen: predicted from the loaded family.
    let x = inputs(second.inputs(), &[("x", &[1, 3, 48, 480])], 9);
    let out = run(&mut w, &x);
    assert_eq!(out.plan, Some(PlanSource::Predicted), "{:?}", out.report);
}

#[test]
fn another_models_store_is_refused_and_the_session_starts_empty() {
    let dir = tempfile::tempdir().unwrap();
    let rec = session(store(dir.path(), "ppocr_rec.onnx"));
    {
        let mut w = rec.worker().unwrap();
        let x = inputs(rec.inputs(), &[("x", &[1, 3, 48, 160])], 1);
        drop(run(&mut w, &x));
    }
    rec.plans().save().unwrap().unwrap();
    // The cls model's store path, holding rec's file.
    let cls = store(dir.path(), "ppocr_cls.onnx");
    std::fs::copy(store(dir.path(), "ppocr_rec.onnx").path(), cls.path()).unwrap();
    let plans = tensor_arena_ort::Plans::with_store(16, cls);
    assert_eq!(plans.stats().plans, 0);
    assert_eq!(plans.stats().families, 0);
}

#[test]
fn a_plan_saver_saves_off_the_runs_threads_and_once_more_when_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let s = session(store(dir.path(), "ppocr_rec.onnx"));
    let saver = PlanSaver::start(Duration::from_secs(3600), {
        let s = s.clone();
        move || {
            assert_eq!(
                std::thread::current().name(),
                Some("tensor-arena-plan-saver")
            );
            if let Some(r) = s.plans().save() {
                r.unwrap();
            }
        }
    })
    .unwrap();
    {
        let mut w = s.worker().unwrap();
        let x = inputs(s.inputs(), &[("x", &[1, 3, 48, 160])], 1);
        drop(run(&mut w, &x));
    }
    let path = s.plans().plan_store().unwrap().path();
    assert!(!path.exists(), "saved before the saver's time");
    saver.stop();
    assert!(path.exists(), "the last save on stop");
    let again = tensor_arena_ort::Plans::with_store(16, store(dir.path(), "ppocr_rec.onnx"));
    assert!(again.stats().plans >= 1);
}

#[test]
fn a_process_whose_plans_another_save_dropped_saves_them_again_with_nothing_new() {
    let dir = tempfile::tempdir().unwrap();
    let first = session(store(dir.path(), "ppocr_rec.onnx"));
    {
        let mut w = first.worker().unwrap();
        let x = inputs(first.inputs(), &[("x", &[1, 3, 48, 160])], 0);
        run(&mut w, &x);
    }
    first.plans().save().expect("a store").expect("saved");
    // Nothing new, the file as this process wrote it: nothing to do.
    assert!(first.plans().save().is_none());
    // Another replica's save (on a file system without locks) replaced
    // the file with one that lacks this process's plans.
    let path = store(dir.path(), "ppocr_rec.onnx").path();
    std::fs::remove_file(&path).unwrap();
    let other = session(store(dir.path(), "ppocr_rec.onnx"));
    {
        let mut w = other.worker().unwrap();
        let x = inputs(other.inputs(), &[("x", &[1, 3, 48, 320])], 1);
        run(&mut w, &x);
    }
    other.plans().save().expect("a store").expect("saved");
    // Nothing new here, but the file lost this process's shape: saved
    // again (before, "nothing new since the last save" skipped it).
    let again = first.plans().save().expect("saved again").expect("written");
    assert!(again.plans >= 2, "{again:?}");
    // Now the file holds it: the next period writes nothing.
    assert!(first.plans().save().is_none());
    let fresh = session(store(dir.path(), "ppocr_rec.onnx"));
    let mut w = fresh.worker().unwrap();
    for (i, width) in [160, 320].into_iter().enumerate() {
        let x = inputs(fresh.inputs(), &[("x", &[1, 3, 48, width])], i as u64);
        let out = run(&mut w, &x);
        assert_eq!(out.plan, Some(PlanSource::Exact), "width {width}");
    }
}
