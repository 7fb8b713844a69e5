//! A run that leaves its plan midway: what serving it costs its thread.
//!
//! For ONNX Runtime's order of PP-OCRv4 det and rec and DenseNet-121
//! (`traces/ort/`), the first run's own plan serves the first run again
//! (`exact`); the first run with its middle allocation four times its size
//! (`left-midway`): the run follows the plan to there, cannot be served
//! inside the plan's block, which is dissolved, and the rest is served
//! from the pool; and with its largest allocation twice its size
//! (`largest-doubled`): dissolved there too, and the rest of the plan
//! placed again first (`raw/repair.rs`: a block many times its slot is
//! not). One iteration is the whole run, its blocks
//! untouched, on an arena warmed by the same run; the plan is made outside
//! the timing.

use benches::{replay_in, Op, Touch, Trace, TraceRun};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::sync::Arc;
use std::time::Duration;
use tensor_arena::{Arena, ArenaConfig, Plan};

/// Serves `run` on `arena`, from `plan`; returns its report.
fn serve(arena: &Arena, plan: &Arc<Plan>, run: &TraceRun) -> tensor_arena::RunReport {
    let r = arena
        .begin_planned_run(Arc::clone(plan))
        .expect("a planned run");
    replay_in(&r, run, Touch::Nothing);
    r.finish()
}

/// `run` with its middle allocation (`largest`: its largest) `times` its
/// size.
fn grown(run: &TraceRun, largest: bool, times: usize) -> TraceRun {
    let mut out = run.clone();
    let allocs: Vec<(usize, usize)> = (0..out.ops.len())
        .filter_map(|i| match out.ops[i] {
            Op::Alloc { bytes, .. } => Some((i, bytes)),
            Op::Free { .. } => None,
        })
        .collect();
    let at = if largest {
        allocs.iter().max_by_key(|a| a.1).map_or(0, |a| a.0)
    } else {
        allocs[allocs.len() / 2].0
    };
    if let Op::Alloc { bytes, .. } = &mut out.ops[at] {
        *bytes *= times;
    }
    out
}

fn leave_plan(c: &mut Criterion) {
    let mut group = c.benchmark_group("leave_plan");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for name in ["ort/ppocr-det", "ort/ppocr-rec", "ort/densenet121"] {
        let trace = Trace::load(name);
        let first = &trace.runs[0];
        let scratch = Arena::new(ArenaConfig::default());
        let r = scratch.begin_recorded_run();
        replay_in(&r, first, Touch::Nothing);
        let (_, recording) = r.finish_with_recording();
        let plan = Arc::new(Plan::from_recording(&recording).expect("plans"));
        let left = grown(first, false, 4);
        let doubled = grown(first, true, 2);
        for (id, run, deviates) in [
            ("exact", first, false),
            ("left-midway", &left, true),
            ("largest-doubled", &doubled, true),
        ] {
            let arena = Arena::new(ArenaConfig::default());
            for _ in 0..3 {
                assert_eq!(serve(&arena, &plan, run).deviated, deviates, "{name} {id}");
            }
            // What the run reaches, beside the same run with no plan.
            let fresh = Arena::new(ArenaConfig::default());
            let r = fresh.begin_run();
            replay_in(&r, run, Touch::Nothing);
            let dynamic = r.finish().high_water;
            println!(
                "{name} {id}: high-water {} planned, {} with no plan",
                benches::mib(serve(&arena, &plan, run).high_water),
                benches::mib(dynamic)
            );
            group.bench_with_input(
                BenchmarkId::new(id, format!("{name} ({} blocks)", plan.len())),
                run,
                |b, run| b.iter(|| serve(&arena, &plan, run)),
            );
        }
    }
    group.finish();
}

criterion_group!(benches, leave_plan);
criterion_main!(benches);
