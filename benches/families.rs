//! Plan families: what planning a shape never seen costs. For ONNX
//! Runtime's own order of PP-OCRv4 rec (8 widths), det (6 sizes) and
//! DenseNet-121 (5 batches), `traces/ort/`, the family learns the first
//! three runs; then `PlanCache::lookup` of each later run's key, which
//! predicts every block's size from the fit and solves the plan (the key
//! itself is never learned, so every lookup predicts), is timed beside the
//! lookup of a key learned exactly. Compare with the run's own time in
//! ONNX Runtime (`tensor-arena ort`, BENCHMARKS.md).
//!
//! `lookup-to-learned` times what a predicted run costs its thread besides
//! serving: the lookup (predict and solve) and `after_run` (learning), for
//! a run that kept to its prediction; `fell-back-to-learned` the same for a
//! run that left it (its own plan solved, the family refitted): the worst
//! case. Each iteration starts from a cache that learned the first three
//! runs (made outside the timing). The `-deferred` variants time the same
//! with the refit left to `PlanCache::learn` (`set_deferred_learning`, as
//! crates/ort's plans do, whose background thread makes it): what the
//! run's thread pays there.

use benches::{Op, Trace, ALIGN};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::hint::black_box;
use std::time::Duration;
use tensor_arena::{PlanCache, PlanSource, Recording, RunReport};

/// The recording an arena of 64-byte alignment makes of `run`.
fn recording(run: &benches::TraceRun) -> Recording {
    let mut rec = Recording::new();
    let mut index = vec![None; run.slots];
    for op in &run.ops {
        match *op {
            Op::Alloc { id, bytes } => {
                index[id as usize] = Some(rec.alloc(bytes.next_multiple_of(ALIGN), ALIGN));
            }
            Op::Free { id } => {
                if let Some(i) = index[id as usize] {
                    rec.free(i);
                }
            }
        }
    }
    rec
}

fn families(c: &mut Criterion) {
    let mut group = c.benchmark_group("families");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    for name in [
        "ort/ppocr-rec-widths",
        "ort/ppocr-det-sizes",
        "ort/densenet121-batches",
    ] {
        let trace = Trace::load(name);
        let cache: PlanCache<String> = PlanCache::new(64);
        for run in &trace.runs[..3] {
            let lookup = cache.lookup(run.label.as_str());
            let learned = cache.after_run(
                run.label.as_str(),
                &lookup,
                &RunReport::default(),
                &recording(run),
                true,
            );
            assert!(learned.is_some(), "{name}: {} not learned", run.label);
        }
        let next = &trace.runs[3];
        let lookup = cache.lookup(next.label.as_str());
        assert_eq!(lookup.source, PlanSource::Predicted, "{name}");
        let blocks = lookup.plan.as_ref().map_or(0, |p| p.len());
        group.bench_with_input(
            BenchmarkId::new("predict-and-solve", format!("{name} ({blocks} blocks)")),
            &next.label,
            |b, key| b.iter(|| cache.lookup(black_box(key.as_str()))),
        );
        let warm = |defer: bool| {
            let cache: PlanCache<String> = PlanCache::new(64);
            cache.set_deferred_learning(defer);
            for run in &trace.runs[..3] {
                let lookup = cache.lookup(run.label.as_str());
                cache.after_run(
                    run.label.as_str(),
                    &lookup,
                    &RunReport::default(),
                    &recording(run),
                    true,
                );
            }
            cache.learn();
            cache
        };
        let own = recording(next);
        for (id, deviated, defer) in [
            ("lookup-to-learned", false, false),
            ("fell-back-to-learned", true, false),
            ("lookup-to-learned-deferred", false, true),
            ("fell-back-to-learned-deferred", true, true),
        ] {
            let report = RunReport {
                planned: true,
                deviated,
                deviation: deviated.then_some(tensor_arena::Deviation::Larger),
                ..RunReport::default()
            };
            group.bench_with_input(
                BenchmarkId::new(id, format!("{name} ({blocks} blocks)")),
                &next.label,
                |b, key| {
                    b.iter_batched(
                        || warm(defer),
                        |cache| {
                            let lookup = cache.lookup(black_box(key.as_str()));
                            cache.after_run(key.as_str(), &lookup, &report, &own, true);
                            cache
                        },
                        criterion::BatchSize::LargeInput,
                    )
                },
            );
        }
        let seen = &trace.runs[0].label;
        group.bench_with_input(
            BenchmarkId::new("exact", format!("{name} ({blocks} blocks)")),
            seen,
            |b, key| b.iter(|| cache.lookup(black_box(key.as_str()))),
        );
    }
    group.finish();
}

criterion_group!(benches, families);
criterion_main!(benches);
