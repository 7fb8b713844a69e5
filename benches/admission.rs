//! Admission by predicted need: what it adds to a run of a worker pool.
//!
//! - `uncontended`: one thread, a checkout and a run that allocates
//!   nothing (after its first run, admitted for the 0 bytes its model's
//!   runs need, beside others), on a pool whose workers are admitted and
//!   on the same pool with
//!   admission taken off its workers. The difference is admission's cost
//!   on the whole path (lookup to learned).
//! - `threads/16`: 16 threads, each [`RUNS`] checkouts and runs on a pool
//!   of 4 workers, with and without admission: runs per second.
//!
//! No limit is set (`TENSOR_ARENA_MEMORY_LIMIT=off` is not needed: the
//! pool's budget is unlimited), so admission never waits: this measures
//! its bookkeeping, not its queue.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::sync::Arc;
use tensor_arena_ort::{Admission, Budget, Plans, RunKey, WorkerOptions, WorkerPool};

/// Runs per thread in one iteration of the threaded bench.
const RUNS: usize = 64;

fn pool(admitted: bool) -> WorkerPool {
    let budget = Budget::new(usize::MAX);
    let pool = WorkerPool::new(
        4,
        WorkerOptions {
            budget: Some(Arc::clone(&budget)),
            decay: None,
            ..WorkerOptions::default()
        },
    )
    .expect("a pool");
    if !admitted {
        let mut out: Vec<_> = std::iter::from_fn(|| pool.try_checkout()).collect();
        for c in &mut out {
            c.worker().set_admission(None);
        }
    } else {
        let a = Admission::of_budget(budget);
        let mut out: Vec<_> = std::iter::from_fn(|| pool.try_checkout()).collect();
        for c in &mut out {
            c.worker().set_admission(Some(Arc::clone(&a)));
        }
    }
    pool
}

fn bench(c: &mut Criterion) {
    let key = RunKey::from_shapes([[1i64, 3, 224, 224]]);
    let mut g = c.benchmark_group("admission/uncontended");
    g.throughput(Throughput::Elements(1));
    for admitted in [false, true] {
        let pool = pool(admitted);
        let plans = Plans::default();
        g.bench_function(if admitted { "admitted" } else { "not admitted" }, |b| {
            b.iter(|| {
                let mut c = pool.checkout();
                let out: Result<(), ()> = c.worker().run(&plans, &key, || Ok(()));
                std::hint::black_box(out)
            })
        });
    }
    g.finish();
    let mut g = c.benchmark_group("admission/threads");
    g.throughput(Throughput::Elements((16 * RUNS) as u64));
    for admitted in [false, true] {
        let pool = pool(admitted);
        let plans = Plans::default();
        g.bench_with_input(
            BenchmarkId::new(if admitted { "admitted" } else { "not admitted" }, 16),
            &16,
            |b, &threads| {
                b.iter(|| {
                    std::thread::scope(|s| {
                        for _ in 0..threads {
                            s.spawn(|| {
                                for _ in 0..RUNS {
                                    let mut c = pool.checkout();
                                    let out: Result<(), ()> =
                                        c.worker().run(&plans, &key, || Ok(()));
                                    std::hint::black_box(out).ok();
                                }
                            });
                        }
                    })
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
