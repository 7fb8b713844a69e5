//! Plan families on real models: shapes never seen are planned from the
//! model's earlier shapes (PP-OCRv4 rec at 20 random widths, det at 10
//! random sizes), outputs bitwise those of ONNX Runtime with its own arena,
//! and the coverage read from the counters.

use crate::common::*;
use tensor_arena::{FamilyCounts, PlanSource};
use tensor_arena_ort::ort::value::DynValue;
use tensor_arena_ort::{ArenaOptions, ArenaSession};

/// A fixed-seed generator (xorshift), so that the shapes are the same in
/// every run of the test.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Runs every shape once on an arena session: outputs against a plain
/// session's; returns the family's counts and how each run was served.
fn first_sights(
    model_file: &str,
    input: &str,
    shapes: &[Vec<usize>],
) -> (FamilyCounts, Vec<PlanSource>) {
    let session =
        ArenaSession::open(runtime(), model(model_file), ArenaOptions::default()).unwrap();
    let runs: Vec<Vec<(String, DynValue)>> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| inputs(session.inputs(), &[(input, s.as_slice())], i as u64))
        .collect();
    let expected = plain_bits(model_file, &runs);
    let mut worker = session.worker().unwrap();
    let mut served = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        // What the earlier runs left to the background thread, learned
        // before this one (the thread keeps up in a release build; this
        // test's debug build would lag it behind the runs).
        session.plans().learn_now();
        let input: Vec<(&str, &DynValue)> = run.iter().map(|(n, v)| (n.as_str(), v)).collect();
        let out = worker.run(&input).unwrap();
        let got = bits(out.outputs.iter().map(|(n, v)| (n.as_str(), v)));
        assert!(
            got == expected[i],
            "{model_file} run {i} {:?} ({:?}): outputs differ from ONNX Runtime's own arena",
            shapes[i],
            out.plan
        );
        served.push(if out.report.deviated {
            // Counted as predicted, and as fallen back.
            PlanSource::Dynamic(tensor_arena::DynamicReason::Off)
        } else {
            out.plan.expect("served by the arena")
        });
    }
    let families = session.plans().families();
    assert_eq!(families.len(), 1, "one model, one family: {families:?}");
    // Named by its inputs (these models take one 4-d image), not by the
    // key's length (five numbers).
    assert_eq!(families[0].name, "1 input: 4-d", "{families:?}");
    (families[0].counts, served)
}

/// Of the runs from the 4th on, the share served on a plan to their end.
fn coverage(served: &[PlanSource]) -> f64 {
    let later = &served[3..];
    let on_plan = later
        .iter()
        .filter(|s| matches!(s, PlanSource::Exact | PlanSource::Predicted))
        .count();
    on_plan as f64 / later.len() as f64
}

#[test]
fn rec_at_twenty_random_widths_is_planned_from_its_family() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let shapes: Vec<Vec<usize>> = (0..20)
        .map(|_| vec![1, 3, 48, 80 + rng.below(1200) as usize])
        .collect();
    let (counts, served) = first_sights("ppocr_rec.onnx", "x", &shapes);
    assert_eq!(counts.runs(), 20);
    eprintln!("rec: {served:?}");
    let share = coverage(&served);
    assert!(
        share >= 0.95,
        "rec: {share:.2} of runs from the 4th on served on a plan ({served:?}, {counts:?})"
    );
}

#[test]
fn det_at_ten_random_sizes_is_planned_from_its_family() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let shapes: Vec<Vec<usize>> = (0..10)
        .map(|_| {
            let h = 32 * (8 + rng.below(16) as usize);
            let w = 32 * (8 + rng.below(16) as usize);
            vec![1, 3, h, w]
        })
        .collect();
    let (counts, served) = first_sights("ppocr_det.onnx", "x", &shapes);
    assert_eq!(counts.runs(), 10);
    eprintln!("det: {served:?}");
    let share = coverage(&served);
    assert!(
        share >= 0.95,
        "det: {share:.2} of runs from the 4th on served on a plan ({served:?}, {counts:?})"
    );
}
