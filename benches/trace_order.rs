//! Hot path in real order: the allocations and frees of the shared traces,
//! replayed as traced (many blocks live at once), no page touched.
//!
//! One iteration replays every run of a trace once ([`Touch::Nothing`]);
//! criterion's throughput is in allocations (each with its free) per
//! second. Each strategy replays the trace once before it is measured, so
//! what is measured is the steady state: cached memory for the arena,
//! learned plans for `planned`, a warm pool for rlsf and talc.

use benches::{
    dynamic_scoped_replayer, floor_replayer, replayer, scoped_replayer, Replay, Strategy, Touch,
    Trace,
};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::time::Duration;

/// The traces replayed: one per model, each mixing several input shapes.
const TRACES: [&str; 3] = ["densenet121-mixed", "ppocr-cls-mixed", "silero-vad-mixed"];

/// The strategies compared.
const STRATEGIES: [Strategy; 5] = [
    Strategy::Arena,
    Strategy::Planned,
    Strategy::Rlsf,
    Strategy::Talc,
    Strategy::System,
];

fn trace_order(c: &mut Criterion) {
    for name in TRACES {
        let trace = Trace::load(name);
        let allocs: usize = trace.runs.iter().map(|r| r.allocs().count()).sum();
        let mut group = c.benchmark_group(format!("trace_order/{name}"));
        group
            .throughput(Throughput::Elements(allocs as u64))
            .sample_size(20)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        type Make<'t> = Box<dyn Fn() -> Box<dyn Replay> + 't>;
        let mut candidates: Vec<(&str, Make<'_>)> = STRATEGIES
            .into_iter()
            .map(|s| -> (&str, Make<'_>) {
                let trace = &trace;
                (s.name(), Box::new(move || replayer(s, trace)))
            })
            .collect();
        // Dynamic and planned runs through `ScopedRun` (the arena held
        // exclusively).
        candidates.insert(1, ("arena-scoped", Box::new(dynamic_scoped_replayer)));
        candidates.insert(3, ("planned-scoped", Box::new(scoped_replayer)));
        // The floor of side-table bookkeeping (`benches::floor`).
        candidates.push(("floor", Box::new(floor_replayer)));
        for (name, make) in candidates {
            // Made and warmed up on first use, so that a filtered-out
            // benchmark costs nothing.
            let mut slot: Option<Box<dyn Replay>> = None;
            group.bench_function(name, |b| {
                let r = slot.get_or_insert_with(|| {
                    let mut r = make();
                    replay_untouched(r.as_mut(), &trace);
                    r
                });
                b.iter(|| replay_untouched(r.as_mut(), &trace));
            });
        }
        group.finish();
    }
}

/// Every run of `trace`, in order, without touching memory.
fn replay_untouched(r: &mut dyn Replay, trace: &Trace) {
    for run in &trace.runs {
        r.run_with(run, Touch::Nothing);
    }
}

criterion_group! {
    name = benches;
    config = benches::criterion();
    targets = trace_order
}
criterion_main!(benches);
