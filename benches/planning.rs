//! Planning: time to plan 100, 1,000 and 10,000 buffers with
//! `tensor_arena::plan::solver::plan`, next to the greedy-by-size heuristic.
//!
//! The buffers are the densenet121-mixed trace's runs laid end to end (in a
//! cycle, cut at the wanted count): real sizes and lifetimes, as one long
//! graph would have them. The bench also prints each plan's footprint
//! against the lower bound.

use benches::{Op, Trace, ALIGN};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use std::time::Duration;
use tensor_arena::plan::solver::{self, Request};
use tensor_arena::Recording;

/// The first `n` buffers of `trace`'s runs, laid end to end and cycled.
fn requests(trace: &Trace, n: usize) -> Vec<Request> {
    let mut rec = Recording::new();
    'outer: for run in trace.runs.iter().cycle() {
        let mut index = vec![None; run.slots];
        for op in &run.ops {
            match *op {
                Op::Alloc { id, bytes } => {
                    if rec.len() == n {
                        break 'outer;
                    }
                    index[id as usize] = Some(rec.alloc(bytes.next_multiple_of(ALIGN), ALIGN));
                }
                Op::Free { id } => {
                    if let Some(i) = index[id as usize] {
                        rec.free(i);
                    }
                }
            }
        }
    }
    rec.requests()
}

fn planning(c: &mut Criterion) {
    let trace = Trace::load("densenet121-mixed");
    let mut group = c.benchmark_group("planning");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    let mut lines = Vec::new();
    for n in [100, 1_000, 10_000] {
        let reqs = requests(&trace, n);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::new("plan", n), &reqs, |b, reqs| {
            b.iter(|| solver::plan(black_box(reqs)))
        });
        group.bench_with_input(BenchmarkId::new("greedy_by_size", n), &reqs, |b, reqs| {
            b.iter(|| solver::greedy_by_size(black_box(reqs)))
        });
        let lb = solver::lower_bound(&reqs) as f64;
        lines.push(format!(
            "| {n} | {:.4} | {:.4} |",
            solver::plan(&reqs).size as f64 / lb,
            solver::greedy_by_size(&reqs).size as f64 / lb,
        ));
    }
    group.finish();
    println!("\nplanning: footprint / lower bound");
    println!("| buffers | plan | greedy_by_size |");
    println!("|---:|---:|---:|");
    for line in lines {
        println!("{line}");
    }
    println!();
}

criterion_group! {
    name = benches;
    config = benches::criterion();
    targets = planning
}
criterion_main!(benches);
