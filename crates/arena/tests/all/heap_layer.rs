//! On the heap memory layer (regions drawn from an allocator, the default
//! off Linux: they cannot grow in place or give pages back, only whole
//! regions), an arena whose runs are served by plans reserves no more than
//! the same arena serving the same runs dynamically, on the shared traces
//! in the order recorded, ascending and descending, each shape twice; and
//! the same with each run's output held into the next run, and for a
//! decoder whose lengths grow, repeat, shrink or come at random.
//! (What the allocator under the regions keeps after a region is given
//! back, the whole process's share, is not measured here.)

use crate::common::{read_trace, TraceRun};
use crate::gpu_traces::{arena, replay};
use std::collections::HashMap;
use tensor_arena::PlanCache;

const KIB: usize = 1024;
/// A region's size is rounded (to the arena's alignment): a page of slack
/// covers it.
const PAGE: usize = 4096;

/// The most the arena reserved over `runs`, read after every allocation,
/// served by plans learned by run label (`planned`) or dynamically; with
/// `hold`, each run's last block allocated (its output) held until the
/// next run's first allocation, as a server that sends a response while
/// the next request runs.
fn peak_reserved(runs: &[TraceRun], planned: bool, hold: bool) -> usize {
    let arena = arena();
    let cache: PlanCache<String> = PlanCache::new(64);
    let mut peak = 0;
    let mut held = None;
    for t in runs {
        let lookup = cache.lookup(t.label.as_str());
        let run = match (&lookup.plan, planned) {
            (Some(p), true) => arena.begin_planned_run(p.clone()).unwrap(),
            _ => arena.begin_recorded_run(),
        };
        let output = t.events.iter().rev().find(|e| e.0).map(|e| e.1);
        let mut live = HashMap::new();
        let mut out = None;
        for &(alloc, id, bytes) in &t.events {
            if alloc {
                let mut b = run.try_alloc(bytes).unwrap();
                // Its first and last bytes marked.
                let last = b.len() - 1;
                b[0] = id as u8;
                b[last] = !(id as u8);
                live.insert(id, b);
                peak = peak.max(arena.stats().reserved);
                // The previous output goes once this run has started.
                drop(held.take());
            } else {
                let b = live.remove(&id).unwrap();
                let last = b.len() - 1;
                assert!(
                    b[0] == id as u8 && b[last] == !(id as u8),
                    "block {id} overwritten"
                );
                if hold && Some(id) == output {
                    out = Some(b);
                }
            }
        }
        if hold {
            out = out.or_else(|| output.and_then(|id| live.remove(&id)));
        }
        drop(live);
        let (report, rec) = run.finish_with_recording();
        if planned {
            cache.after_run(t.label.as_str(), &lookup, &report, &rec, true);
        }
        held = out;
        arena.check_invariants();
        peak = peak.max(arena.stats().reserved);
    }
    drop(held);
    peak
}

/// `planned` (the most reserved under plans) at most `dynamic` (with no
/// plan) and a page.
fn no_more_than_no_plan(what: &str, planned: usize, dynamic: usize) {
    println!(
        "{what}: reserved peak planned {planned}, dynamic {dynamic} ({:.3}x)",
        planned as f64 / dynamic as f64
    );
    assert!(
        planned <= dynamic + PAGE,
        "{what}: planned runs reserved {planned} on the heap layer, against {dynamic} with no plan"
    );
}

/// The shared traces in the order recorded, ascending and descending,
/// each shape twice (the second time planned), named.
fn traces_in_three_orders() -> Vec<(String, Vec<TraceRun>)> {
    let mut out = Vec::new();
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
            ("recorded", runs),
            ("ascending", ascending),
            ("descending", descending),
        ] {
            let twice = runs.iter().chain(runs.iter()).cloned().collect();
            out.push((format!("{name} {order}"), twice));
        }
    }
    out
}

#[test]
fn plans_on_the_heap_layer_hold_no_more_than_no_plan() {
    for (name, runs) in traces_in_three_orders() {
        no_more_than_no_plan(
            &name,
            peak_reserved(&runs, true, false),
            peak_reserved(&runs, false, false),
        );
    }
}

#[test]
fn outputs_held_into_the_next_run_leave_plans_holding_no_more_than_no_plan() {
    for (name, runs) in traces_in_three_orders() {
        no_more_than_no_plan(
            &format!("{name}, outputs held"),
            peak_reserved(&runs, true, true),
            peak_reserved(&runs, false, true),
        );
    }
}

/// One decoder-like run at length `l`: K/V growing with `l`, live the whole
/// run, per-layer temporaries, and an output allocated last.
fn decoder_run(l: usize) -> TraceRun {
    let mut events = vec![(true, 0, l * 64 * KIB)];
    for layer in 0..6 {
        let id = 1 + 3 * layer;
        events.extend([
            (true, id, l * 16 * KIB),
            (true, id + 1, l * 32 * KIB),
            (false, id, 0),
            (true, id + 2, l * 8 * KIB),
            (false, id + 1, 0),
            (false, id + 2, 0),
        ]);
    }
    events.extend([(true, 999, l * 4 * KIB), (false, 0, 0), (false, 999, 0)]);
    TraceRun {
        label: format!("decoder-{l}"),
        events,
    }
}

/// Decoder lengths growing each pair of runs, growing slowly, repeating,
/// shrinking, and at random.
fn decoder_orders() -> Vec<(&'static str, Vec<usize>)> {
    let growing = vec![64, 64, 96, 96, 144, 144, 216, 216, 324, 324];
    let shrinking = growing.iter().rev().copied().collect();
    let slowly = (0..16).map(|i| 64 + 8 * i).flat_map(|l| [l, l]).collect();
    let mut x: u64 = 7;
    let random = (0..40)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            32 + ((x >> 33) % 8) as usize * 32
        })
        .collect();
    vec![
        ("growing", growing),
        ("growing slowly", slowly),
        ("repeating", vec![64, 128, 64, 128, 96, 128, 64, 128]),
        ("shrinking", shrinking),
        ("random", random),
    ]
}

#[test]
fn a_decoders_plans_on_the_heap_layer_hold_no_more_than_no_plan() {
    for (order, lengths) in decoder_orders() {
        let runs: Vec<TraceRun> = lengths.iter().map(|&l| decoder_run(l)).collect();
        no_more_than_no_plan(
            &format!("decoder {order}"),
            peak_reserved(&runs, true, false),
            peak_reserved(&runs, false, false),
        );
        no_more_than_no_plan(
            &format!("decoder {order}, outputs held"),
            peak_reserved(&runs, true, true),
            peak_reserved(&runs, false, true),
        );
    }
}

/// Outputs dropped before the next run: its plan serves it (the rule above
/// only takes plans away while blocks of earlier runs are live).
#[test]
fn runs_whose_outputs_are_gone_are_still_planned() {
    let runs: Vec<TraceRun> = [64, 64, 64, 96, 96]
        .iter()
        .map(|&l| decoder_run(l))
        .collect();
    let arena = arena();
    let cache: PlanCache<String> = PlanCache::new(8);
    let mut planned = 0;
    for t in &runs {
        let lookup = cache.lookup(t.label.as_str());
        let (report, rec) = replay(&arena, lookup.plan.clone(), t);
        planned += u64::from(report.planned);
        cache.after_run(t.label.as_str(), &lookup, &report, &rec, true);
    }
    assert!(planned >= 3, "{planned} planned runs");
}
