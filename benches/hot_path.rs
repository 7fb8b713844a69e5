//! Hot path: allocate-and-free pairs with sizes drawn from the traces
//! (1 KiB to 50 MiB), one block live at a time, no page touched.
//!
//! One iteration is a batch of [`BATCH`] pairs; criterion's throughput is in
//! pairs (elements) per second, and time per pair is the iteration time
//! divided by [`BATCH`]. Every strategy does three warm-up batches first, so
//! what is measured is the steady state (cached memory).

use benches::{
    arena_pairs_outside_runs, arena_scoped_pairs, floor_pairs, hot_path_sizes, pairs,
    planned_scoped_pairs, Pairs, Strategy,
};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::time::Duration;

/// Pairs per iteration.
const BATCH: usize = 1024;

fn hot_path(c: &mut Criterion) {
    let sizes = hot_path_sizes(BATCH);
    let mut group = c.benchmark_group("hot_path");
    group
        .throughput(Throughput::Elements(BATCH as u64))
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));

    type Make = Box<dyn Fn(&[usize]) -> Box<dyn Pairs>>;
    let mut candidates: Vec<(&str, Make)> = Strategy::ALLOCATORS
        .into_iter()
        .map(|s| -> (&str, Make) {
            (
                s.name(),
                Box::new(move |sizes| pairs(s, sizes).expect("an allocator")),
            )
        })
        .collect();
    candidates.insert(
        1,
        ("arena-no-run", Box::new(|_| arena_pairs_outside_runs())),
    );
    candidates.insert(2, ("arena-scoped", Box::new(|_| arena_scoped_pairs())));
    candidates.insert(
        4,
        (
            "planned-scoped",
            Box::new(|sizes| planned_scoped_pairs(sizes)),
        ),
    );

    // The floor of side-table bookkeeping (`benches::floor`).
    candidates.push(("floor", Box::new(|_| floor_pairs())));

    for (name, make) in candidates {
        // Made and warmed up on first use, so that a filtered-out benchmark
        // costs nothing.
        let mut slot: Option<Box<dyn Pairs>> = None;
        group.bench_function(name, |b| {
            let p = slot.get_or_insert_with(|| {
                let mut p = make(&sizes);
                for _ in 0..3 {
                    p.pairs(&sizes);
                }
                p
            });
            b.iter(|| p.pairs(&sizes));
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = benches::criterion();
    targets = hot_path
}
criterion_main!(benches);
