//! On the heap memory layer (regions drawn from an allocator, the default
//! off Linux: they cannot grow in place or give pages back, only whole
//! regions), an arena whose runs are served by plans reserves no more than
//! the same arena serving the same runs dynamically, on the shared traces
//! in the order recorded, ascending and descending, each shape twice.
//! (What the allocator under the regions keeps after a region is given
//! back, the whole process's share, is not measured here.)

use crate::common::{read_trace, TraceRun};
use crate::gpu_traces::{arena, replay};
use tensor_arena::PlanCache;

/// The most the arena reserved (at a run's end) over `runs`, served by plans learned by
/// run label (`planned`) or dynamically.
fn peak_reserved(runs: &[TraceRun], planned: bool) -> usize {
    let arena = arena();
    let cache: PlanCache<String> = PlanCache::new(64);
    let mut peak = 0;
    for run in runs {
        if planned {
            let lookup = cache.lookup(run.label.as_str());
            let (report, rec) = replay(&arena, lookup.plan.clone(), run);
            cache.after_run(run.label.as_str(), &lookup, &report, &rec, true);
        } else {
            replay(&arena, None, run);
        }
        arena.check_invariants();
        // Regions are only added during a run and given back at its
        // start (a plan's block) or by a shrink: the most is at a run's end.
        peak = peak.max(arena.stats().reserved);
    }
    peak
}

#[test]
fn plans_on_the_heap_layer_hold_no_more_than_no_plan() {
    // A region's size is rounded (to the arena's alignment): a page of
    // slack covers it.
    let page = 4096;
    for name in [
        "ort/ppocr-det-sizes.trace",
        "ort/ppocr-rec-widths.trace",
        "ort/densenet121-batches.trace",
        "densenet121-mixed.trace",
        "ppocr-cls-mixed.trace",
        "silero-vad-mixed.trace",
    ] {
        let runs = read_trace(name);
        let mut ascending = runs.clone();
        ascending.sort_by_key(TraceRun::lower_bound);
        let mut descending = ascending.clone();
        descending.reverse();
        for (order, runs) in [
            ("recorded", &runs),
            ("ascending", &ascending),
            ("descending", &descending),
        ] {
            // Each shape twice: the second time planned.
            let twice: Vec<TraceRun> = runs.iter().chain(runs.iter()).cloned().collect();
            let dynamic = peak_reserved(&twice, false);
            let planned = peak_reserved(&twice, true);
            println!(
                "{name} {order}: reserved peak planned {planned}, dynamic {dynamic} ({:.3}x)",
                planned as f64 / dynamic as f64
            );
            assert!(
                planned <= dynamic + page,
                "{name} {order}: planned runs reserved {planned} on the heap layer, against \
                 {dynamic} with no plan"
            );
        }
    }
}
