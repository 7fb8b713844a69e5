//! Outputs through tensor-arena are bitwise those of a plain session, for
//! every model at several shapes, dynamic and planned; and outputs may
//! outlive their run, their worker and their session.

use crate::common::*;
use tensor_arena::{DynamicReason, PlanSource};
use tensor_arena_ort::ort::value::DynValue;
use tensor_arena_ort::{ArenaOptions, ArenaSession};

/// Runs `shapes` twice over (the second time from plans) on an arena
/// session and compares every output with a plain session's.
fn same_as_plain(model_file: &str, shapes: &[&[(&str, &[usize])]]) {
    let session =
        ArenaSession::open(runtime(), model(model_file), ArenaOptions::default()).unwrap();
    let runs: Vec<Vec<(String, DynValue)>> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| inputs(session.inputs(), s, i as u64))
        .collect();
    let expected = plain_bits(model_file, &runs);
    let mut worker = session.worker().unwrap();
    for pass in 0..2 {
        for (i, run) in runs.iter().enumerate() {
            let input: Vec<(&str, &DynValue)> = run.iter().map(|(n, v)| (n.as_str(), v)).collect();
            let out = worker.run(&input).unwrap();
            // The first pass plans a shape from its family after two,
            // unless it changes a dimension no earlier shape varied in
            // whose value cannot show which sizes follow it (no prime
            // factor of 11 or more: 1, or cls's width 192 = 3 x 64).
            let expected_plan = match (pass, i) {
                (1, _) => PlanSource::Exact,
                (_, 0) => PlanSource::Dynamic(DynamicReason::NewFamily),
                (_, 1) => PlanSource::Dynamic(DynamicReason::OneShape),
                (_, i) if unvaried(shapes, i) => PlanSource::Dynamic(DynamicReason::Unvaried),
                _ => PlanSource::Predicted,
            };
            assert_eq!(
                out.plan,
                Some(expected_plan),
                "{model_file} run {i} pass {pass}"
            );
            assert_eq!(
                out.report.planned,
                matches!(expected_plan, PlanSource::Exact | PlanSource::Predicted),
                "{model_file} run {i} pass {pass}"
            );
            assert!(
                !out.report.deviated,
                "{model_file} run {i} deviated from its plan: {:?}",
                out.report.deviation
            );
            let got = bits(out.outputs.iter().map(|(n, v)| (n.as_str(), v)));
            assert!(
                got == expected[i],
                "{model_file} run {i} pass {pass}: outputs differ from plain ort"
            );
        }
    }
}

/// Whether run `i` changes a dimension that every earlier run had alike
/// (its family never saw it vary) at a value that cannot show which sizes
/// follow it (no prime factor of 11 or more): not predicted.
fn unvaried(shapes: &[&[(&str, &[usize])]], i: usize) -> bool {
    let dims = |k: usize| -> Vec<usize> {
        shapes[k]
            .iter()
            .flat_map(|(_, d)| d.iter().copied())
            .collect()
    };
    let now = dims(i);
    let first = dims(0);
    (0..now.len())
        .any(|d| (1..i).all(|k| dims(k)[d] == first[d]) && now[d] != first[d] && !telling(first[d]))
}

/// Whether `v` has a prime factor of 11 or more (as the planner asks of a
/// dimension that never varied).
fn telling(v: usize) -> bool {
    let mut n = v;
    let mut largest = 1;
    let mut p = 2;
    while p * p <= n {
        while n % p == 0 {
            largest = p;
            n /= p;
        }
        p += 1;
    }
    largest.max(n) >= 11
}

#[test]
fn ppocr_cls_matches_plain_ort() {
    same_as_plain(
        "ppocr_cls.onnx",
        &[
            &[("x", &[1, 3, 48, 192])],
            &[("x", &[4, 3, 48, 192])],
            &[("x", &[8, 3, 48, 192])],
            &[("x", &[1, 3, 48, 100])],
        ],
    );
}

#[test]
fn ppocr_rec_matches_plain_ort() {
    same_as_plain(
        "ppocr_rec.onnx",
        &[
            &[("x", &[1, 3, 48, 320])],
            &[("x", &[1, 3, 48, 100])],
            &[("x", &[1, 3, 48, 640])],
            &[("x", &[2, 3, 48, 640])],
        ],
    );
}

#[test]
fn silero_vad_matches_plain_ort() {
    let h: &[usize] = &[1, 1, 128];
    same_as_plain(
        "silero_vad_16k_sequence.onnx",
        &[
            &[("input", &[1, 576]), ("h", h), ("c", h)],
            &[("input", &[16, 576]), ("h", h), ("c", h)],
            &[("input", &[3, 576]), ("h", h), ("c", h)],
        ],
    );
}

#[test]
fn densenet121_matches_plain_ort() {
    same_as_plain(
        "densenet121_batch.onnx",
        &[
            &[("data_0", &[1, 3, 224, 224])],
            &[("data_0", &[2, 3, 224, 224])],
        ],
    );
}

#[test]
fn outputs_outlive_their_run_worker_and_session() {
    let shape: &[(&str, &[usize])] = &[("x", &[1, 3, 48, 200])];
    let session =
        ArenaSession::open(runtime(), model("ppocr_rec.onnx"), ArenaOptions::default()).unwrap();
    let runs: Vec<_> = (0..3)
        .map(|i| inputs(session.inputs(), shape, 10 + i))
        .collect();
    let expected = plain_bits("ppocr_rec.onnx", &runs);
    let mut worker = session.worker().unwrap();
    // Keep every run's outputs while the next runs (same shape, so planned)
    // reuse the arena.
    let kept: Vec<_> = runs
        .iter()
        .map(|run| {
            let input: Vec<(&str, &DynValue)> = run.iter().map(|(n, v)| (n.as_str(), v)).collect();
            worker.run(&input).unwrap()
        })
        .collect();
    assert!(kept[2].report.planned);
    drop(worker);
    drop(session);
    for (out, want) in kept.iter().zip(&expected) {
        assert!(bits(out.outputs.iter().map(|(n, v)| (n.as_str(), v))) == *want);
    }
    // Dropped on another thread.
    std::thread::spawn(move || drop(kept)).join().unwrap();
}
