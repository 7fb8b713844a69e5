//! Whole runs: every trace replayed run after run, with one write per 4 KiB
//! page of every buffer, for every strategy.
//!
//! One iteration replays the whole trace file (all its runs, in order).
//! Each strategy replays the trace twice before measuring (steady state;
//! the faults and backing allocations printed per run show whether it was
//! reached).
//! Criterion cannot count page faults, so each benchmark also counts minor
//! faults and backing allocations over all its measured iterations and
//! prints them per run, and each trace ends with a summary table (mean
//! times from the same iterations, ratios to the bare loop and to the best
//! baseline). Peak RSS needs one process per strategy: see `src/bin/rss.rs`.

use benches::{minor_faults, replayer, trace_names, Replay, Strategy, Trace};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::time::{Duration, Instant};

/// What one benchmark measured, next to criterion's own statistics.
struct Tally {
    strategy: Strategy,
    replays: u64,
    elapsed: Duration,
    faults: u64,
    backing: Option<u64>,
}

fn whole_runs(c: &mut Criterion) {
    for name in trace_names() {
        let trace = Trace::load(&name);
        let runs = trace.runs.len() as u64;
        let mut group = c.benchmark_group(format!("whole_runs/{name}"));
        group
            .throughput(Throughput::Elements(runs))
            .sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        let mut tallies = Vec::new();
        for strategy in Strategy::ALL {
            let mut tally = Tally {
                strategy,
                replays: 0,
                elapsed: Duration::ZERO,
                faults: 0,
                backing: None,
            };
            // Made and warmed up on first use, so that a filtered-out
            // benchmark costs nothing.
            let mut slot: Option<(Box<dyn Replay>, Option<u64>)> = None;
            group.bench_function(strategy.name(), |b| {
                let (r, backing_start) = slot.get_or_insert_with(|| {
                    let mut r = replayer(strategy, &trace);
                    // Two replays: the first grows the arena and ends with a
                    // relayout into one fresh region; the second touches it.
                    r.replay(&trace);
                    r.replay(&trace);
                    let start = r.counters().backing_allocs;
                    (r, start)
                });
                b.iter_custom(|iters| {
                    let faults = minor_faults();
                    let start = Instant::now();
                    for _ in 0..iters {
                        r.replay(&trace);
                    }
                    let elapsed = start.elapsed();
                    tally.faults += minor_faults() - faults;
                    tally.replays += iters;
                    tally.elapsed += elapsed;
                    elapsed
                });
                tally.backing = r
                    .counters()
                    .backing_allocs
                    .zip(*backing_start)
                    .map(|(now, start)| now - start);
            });
            drop(slot);
            if tally.replays > 0 {
                tallies.push(tally);
            }
        }
        group.finish();
        if !tallies.is_empty() {
            print_summary(&trace, &tallies);
        }
    }
}

fn print_summary(trace: &Trace, tallies: &[Tally]) {
    let runs = trace.runs.len() as f64;
    let per_replay = |t: &Tally| t.elapsed.as_secs_f64() / t.replays.max(1) as f64;
    let bare = tallies
        .iter()
        .find(|t| t.strategy == Strategy::Bare)
        .map(per_replay);
    let best_baseline = tallies
        .iter()
        .filter(|t| t.strategy.is_baseline())
        .map(per_replay)
        .fold(f64::INFINITY, f64::min);
    println!(
        "\nwhole_runs/{}: {} runs, {} page writes per replay, lower bound {} MiB",
        trace.name,
        trace.runs.len(),
        trace.runs.iter().map(|r| r.page_touches()).sum::<usize>(),
        benches::mib(trace.lower_bound()),
    );
    println!("| strategy | ms/run (mean) | x bare | x best baseline | minor faults/run | backing allocs/run |");
    println!("|---|---:|---:|---:|---:|---:|");
    for t in tallies {
        let per_run = per_replay(t) / runs;
        let backing = t.backing.map_or("-".to_owned(), |b| {
            format!("{:.2}", b as f64 / (t.replays.max(1) as f64 * runs))
        });
        let ratio = |of: f64| {
            if of.is_finite() {
                format!("{:.2}", per_replay(t) / of)
            } else {
                "-".to_owned()
            }
        };
        println!(
            "| {} | {:.3} | {} | {} | {:.1} | {} |",
            t.strategy.name(),
            per_run * 1e3,
            ratio(bare.unwrap_or(f64::INFINITY)),
            ratio(best_baseline),
            t.faults as f64 / (t.replays.max(1) as f64 * runs),
            backing,
        );
    }
    println!();
}

criterion_group! {
    name = benches;
    config = benches::criterion();
    targets = whole_runs
}
criterion_main!(benches);
