//! SharedArena contention: 2 threads doing allocate-and-free pairs on one
//! `SharedArena`, against 2 threads each with its own `Arena` (no lock), and
//! against the system allocator, mimalloc and jemalloc on 2 threads. The
//! 1-thread rows do the same work per thread on one thread: with perfect
//! scaling, a 2-thread row takes the same time per iteration.
//!
//! One iteration is [`BATCH`] pairs per thread (sizes from the traces, as in
//! the hot path); throughput counts the pairs of all threads. Threads are
//! spawned once per sample and released together by a barrier; the clock
//! runs from the barrier to the last join.

use benches::{arena_pairs_outside_runs, hot_path_sizes, pairs, shared_pairs, Pairs, Strategy};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use tensor_arena::{ArenaConfig, SharedArena};

/// Pairs per thread per iteration.
const BATCH: usize = 1024;

/// Each worker does `iters` batches on its own thread; returns the time from
/// the common start to the last finish.
fn hammer(workers: &mut [Box<dyn Pairs>], sizes: &[usize], iters: u64) -> Duration {
    let barrier = Barrier::new(workers.len() + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = workers
            .iter_mut()
            .map(|w| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    for _ in 0..iters {
                        w.pairs(sizes);
                    }
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        for h in handles {
            h.join().expect("worker panicked");
        }
        start.elapsed()
    })
}

fn shared(threads: usize) -> Vec<Box<dyn Pairs>> {
    let arena = Arc::new(SharedArena::new(ArenaConfig::default()));
    (0..threads)
        .map(|_| shared_pairs(Arc::clone(&arena)))
        .collect()
}

fn per_thread(threads: usize) -> Vec<Box<dyn Pairs>> {
    (0..threads).map(|_| arena_pairs_outside_runs()).collect()
}

fn global(strategy: Strategy, threads: usize, sizes: &[usize]) -> Vec<Box<dyn Pairs>> {
    (0..threads)
        .map(|_| pairs(strategy, sizes).expect("an allocator"))
        .collect()
}

fn contention(c: &mut Criterion) {
    let sizes = hot_path_sizes(BATCH);
    type Make<'a> = Box<dyn Fn() -> Vec<Box<dyn Pairs>> + 'a>;
    let candidates: Vec<(&str, Make<'_>)> = vec![
        ("shared/2-threads", Box::new(|| shared(2))),
        ("per-thread-arenas/2-threads", Box::new(|| per_thread(2))),
        (
            "system/2-threads",
            Box::new(|| global(Strategy::System, 2, &sizes)),
        ),
        (
            "mimalloc/2-threads",
            Box::new(|| global(Strategy::Mimalloc, 2, &sizes)),
        ),
        (
            "jemalloc/2-threads",
            Box::new(|| global(Strategy::Jemalloc, 2, &sizes)),
        ),
        ("shared/1-thread", Box::new(|| shared(1))),
        ("arena/1-thread", Box::new(|| per_thread(1))),
    ];
    let mut group = c.benchmark_group("contention");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for (name, make) in &candidates {
        let threads = if name.ends_with("2-threads") { 2 } else { 1 };
        group.throughput(Throughput::Elements((threads * BATCH) as u64));
        let mut workers: Option<Vec<Box<dyn Pairs>>> = None;
        group.bench_function(*name, |b| {
            let workers = workers.get_or_insert_with(|| {
                let mut w = make();
                hammer(&mut w, &sizes, 3);
                w
            });
            b.iter_custom(|iters| hammer(workers, &sizes, iters));
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = benches::criterion();
    targets = contention
}
criterion_main!(benches);
