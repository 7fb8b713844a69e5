//! Shape changes: `densenet121-mixed` (batch 16, 1, 4, 1, 8, 16) replayed
//! with page touches under each shrink policy: time per replay, and the
//! bytes reserved after each run.
//!
//! One iteration replays the six runs. Each policy's arena replays the trace
//! twice first. After measuring, the bench prints per policy: minor faults
//! and backing allocations per run (over the measured iterations) and the
//! reserved bytes after each run of one more replay.

use benches::{arena_run, config_with, mib, minor_faults, Trace};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::time::{Duration, Instant};
use tensor_arena::{Arena, ShrinkPolicy};

const POLICIES: [(&str, ShrinkPolicy); 3] = [
    ("manual", ShrinkPolicy::Manual),
    ("after-every-run", ShrinkPolicy::AfterEveryRun),
    (
        "after-2-runs-below",
        ShrinkPolicy::AfterRunsBelow { runs: 2 },
    ),
];

fn shape_changes(c: &mut Criterion) {
    let trace = Trace::load("densenet121-mixed");
    let runs = trace.runs.len() as u64;
    let mut group = c.benchmark_group("shape_changes/densenet121-mixed");
    group
        .throughput(Throughput::Elements(runs))
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    let mut lines = Vec::new();
    for (name, policy) in POLICIES {
        let mut arena: Option<Arena> = None;
        let (mut replays, mut faults, mut elapsed) = (0u64, 0u64, Duration::ZERO);
        let mut backing = (0u64, 0u64);
        group.bench_function(name, |b| {
            let arena = arena.get_or_insert_with(|| {
                let arena = Arena::new(config_with(policy));
                for _ in 0..2 {
                    for run in &trace.runs {
                        arena_run(&arena, run);
                    }
                }
                backing.0 = arena.stats().backing_allocs;
                arena
            });
            b.iter_custom(|iters| {
                let f0 = minor_faults();
                let start = Instant::now();
                for _ in 0..iters {
                    for run in &trace.runs {
                        arena_run(arena, run);
                    }
                }
                let took = start.elapsed();
                faults += minor_faults() - f0;
                replays += iters;
                elapsed += took;
                took
            });
            backing.1 = arena.stats().backing_allocs;
        });
        if let Some(arena) = arena {
            let reserved: Vec<usize> = trace
                .runs
                .iter()
                .map(|run| arena_run(&arena, run).reserved)
                .collect();
            let n = (replays.max(1) * runs) as f64;
            lines.push(format!(
                "| {name} | {:.2} | {:.1} | {:.2} | {} | {} |",
                elapsed.as_secs_f64() * 1e3 / n,
                faults as f64 / n,
                (backing.1 - backing.0) as f64 / n,
                reserved
                    .iter()
                    .map(|&r| mib(r))
                    .collect::<Vec<_>>()
                    .join(" / "),
                mib(reserved.iter().copied().max().unwrap_or(0)),
            ));
        }
    }
    group.finish();
    if !lines.is_empty() {
        let lbs: Vec<String> = trace.runs.iter().map(|r| mib(r.lower_bound())).collect();
        println!(
            "\nshape_changes/densenet121-mixed (runs {})",
            trace
                .runs
                .iter()
                .map(|r| r.label.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        println!("| policy | ms/run (mean) | minor faults/run | backing allocs/run | reserved after each run, MiB | max reserved MiB |");
        println!("|---|---:|---:|---:|---|---:|");
        for line in lines {
            println!("{line}");
        }
        println!(
            "| lower bound | | | | {} | {} |\n",
            lbs.join(" / "),
            mib(trace.lower_bound())
        );
    }
}

criterion_group! {
    name = benches;
    config = benches::criterion();
    targets = shape_changes
}
criterion_main!(benches);
