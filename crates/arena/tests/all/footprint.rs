//! Reserved bytes against the lower bound on the shared traces.

use crate::common::{read_trace, trace_names, TraceRun};
use std::collections::HashMap;
use tensor_arena::{Arena, ArenaConfig, Block, HostMemory, RunReport};

/// Replays one run through the arena, writing the first byte of every block.
fn replay<M: HostMemory>(arena: &Arena<M>, run: &TraceRun) -> RunReport {
    let r = arena.begin_run();
    let mut live: HashMap<usize, Block<'_, M>> = HashMap::new();
    for &(alloc, id, bytes) in &run.events {
        if alloc {
            let mut b = r.try_alloc(bytes).unwrap();
            b[0] = id as u8;
            live.insert(id, b);
        } else {
            let b = live.remove(&id).unwrap();
            assert_eq!(b[0], id as u8, "block {id} was overwritten");
        }
    }
    assert!(live.is_empty());
    r.finish()
}

/// On every trace, reserved bytes stay within 1.25x of the largest lower
/// bound since the last shrink, rounded up to the memory layer's granule
/// step (2 MiB huge pages for `Pages` past 2 MiB, else 4 KiB pages; 1 for
/// `Heap`); a repeated run has the
/// same high-water mark and makes no memory-layer call.
fn footprint<M: HostMemory>(make: impl Fn() -> Arena<M>) {
    for name in trace_names() {
        let arena = make();
        let props = arena.memory_props();
        let mut largest = 0;
        for run in read_trace(&name) {
            let lb = run.lower_bound();
            largest = largest.max(lb);
            let report = replay(&arena, &run);
            let bound = (largest as f64 * 1.25) as usize;
            println!(
                "{name} {}: lower bound {lb}, high water {}, reserved {} ({:.3}x largest lb)",
                run.label,
                report.high_water,
                report.reserved,
                report.reserved as f64 / largest as f64
            );
            assert!(
                report.reserved <= bound.next_multiple_of(props.commit_step(bound)),
                "{name} {}: reserved {} over 1.25x the largest lower bound {largest}",
                run.label,
                report.reserved
            );
            // The high-water mark is a property of the run: simulated when
            // the run grew, measured in place when it repeats on memory
            // that suffices.
            let again = replay(&arena, &run);
            assert_eq!(again.high_water, report.high_water, "{name} {}", run.label);
            assert_eq!(again.memory_calls(), 0, "{name} {}", run.label);
        }
    }
}

#[test]
fn reserved_stays_within_1_25x_of_the_largest_lower_bound_since_shrink() {
    footprint(|| Arena::new(ArenaConfig::default()));
    footprint(|| Arena::with_backing(ArenaConfig::default(), allocator_api2::alloc::Global));
}

#[test]
fn densenet_mixed_reserved_after_each_run_and_after_shrink() {
    let arena = Arena::new(ArenaConfig::default());
    let runs = read_trace("densenet121-mixed.trace");
    for run in &runs {
        let report = replay(&arena, run);
        println!(
            "densenet121-mixed {:>14}: lower bound {:>10}  high water {:>10}  reserved {:>10}  backing calls {}",
            run.label,
            run.lower_bound(),
            report.high_water,
            report.reserved,
            report.memory_calls(),
        );
    }
    // Then the smallest shape, and a shrink to its watermark.
    let small = &runs[1];
    replay(&arena, small);
    let released = arena.shrink();
    let stats = arena.stats();
    println!(
        "after {} then shrink: released {released}, reserved {}, lower bound {}",
        small.label,
        stats.reserved,
        small.lower_bound()
    );
    // Pages: the small run's high water in whole granules.
    let bound = (small.lower_bound() as f64 * 1.25) as usize;
    assert!(stats.reserved <= bound.next_multiple_of(arena.memory_props().commit_step(bound)));
    let again = replay(&arena, small);
    assert_eq!(again.memory_calls(), 0);
    assert_eq!(arena.shrink(), 0);
}

/// Issue 23: every run's dynamic high-water mark against its lower bound,
/// on every shared trace, with each [`Fit`] (each run on a fresh arena, so
/// that it starts on one free region). The default must stay within 1.10x
/// (Silero VAD excepted, below), and good fit no worse than best fit.
#[test]
fn high_water_within_1_10x_of_the_lower_bound_by_fit() {
    use tensor_arena::{Coalesce, Fit};
    println!(
        "| trace | good fit, immediate | best fit, immediate | good fit, lazy | best fit, lazy |"
    );
    println!("|---|---:|---:|---:|---:|");
    for name in trace_names() {
        let worst = |fit: Fit, coalesce: Coalesce| {
            read_trace(&name)
                .iter()
                .map(|run| {
                    let arena = Arena::new(ArenaConfig {
                        fit,
                        coalesce,
                        ..ArenaConfig::default()
                    });
                    let report = replay(&arena, run);
                    report.high_water as f64 / run.lower_bound() as f64
                })
                .fold(0.0, f64::max)
        };
        let good = worst(Fit::Good, Coalesce::Immediate);
        let best = worst(Fit::Best, Coalesce::Immediate);
        let good_lazy = worst(Fit::Good, Coalesce::Lazy);
        let best_lazy = worst(Fit::Best, Coalesce::Lazy);
        println!("| {name} | {good:.3} | {best:.3} | {good_lazy:.3} | {best_lazy:.3} |");
        let default = worst(Fit::default(), Coalesce::default());
        // The defaults are chosen from these figures: good fit is never
        // looser than best fit, and with good fit immediate merging never
        // looser than lazy (best fit merged at once is: DenseNet-121).
        assert!(
            good <= best && good_lazy <= best_lazy,
            "{name}: good fit over best fit"
        );
        assert!(good <= good_lazy, "{name}: immediate merging over lazy");
        // Silero VAD: 1.205-1.208x with every policy (and before issue
        // 23), above the 1.10 goal, set by each run's first three events
        // (`silero_vads_excess_is_set_by_its_first_three_events`).
        let goal = if name.starts_with("silero-vad") {
            1.21
        } else {
            1.10
        };
        assert!(default <= goal, "{name}: {default:.3}x the lower bound");
    }
}

/// What keeps Silero VAD above 1.10x: its first three events. Every run
/// starts `alloc A`, `alloc B` (the same size), `free A`, `alloc C` with C
/// larger than A: A's hole cannot hold C, so C goes above B, and the run's
/// high water is A + B + C, set right there, while the most ever live at
/// once comes later. No online placement that puts B next to A (as every
/// allocator does: leaving a gap after A would need to know C) does better;
/// a plan, which knows C, reaches the lower bound.
#[test]
fn silero_vads_excess_is_set_by_its_first_three_events() {
    let align = ArenaConfig::default().alignment;
    let round = |n: usize| n.next_multiple_of(align);
    for name in trace_names().iter().filter(|n| n.starts_with("silero-vad")) {
        for run in read_trace(name) {
            let e = &run.events;
            let (a, b, c) = (e[0], e[1], e[3]);
            assert!(
                a.0 && b.0 && !e[2].0 && e[2].1 == a.1 && c.0,
                "{name} {}: starts alloc A, alloc B, free A, alloc C",
                run.label
            );
            assert!(c.2 > a.2, "{name} {}: C does not fit A's hole", run.label);
            let prefix = TraceRun {
                label: run.label.clone(),
                events: vec![a, b, e[2], c, (false, b.1, 0), (false, c.1, 0)],
            };
            let whole = replay(&Arena::new(ArenaConfig::default()), &run).high_water;
            let head = replay(&Arena::new(ArenaConfig::default()), &prefix).high_water;
            assert_eq!(
                head,
                round(a.2) + round(b.2) + round(c.2),
                "{name} {}",
                run.label
            );
            assert_eq!(
                whole, head,
                "{name} {}: the high water is set by the first three events",
                run.label
            );
            assert!(run.lower_bound() < head, "{name} {}", run.label);
        }
    }
}

/// The first run of a shape under ONNX Runtime's own allocation order
/// (traces recorded from `crates/ort`, issue 20) is placed dynamically, and
/// it is the process's peak: within 1.10x of its lower bound on PP-OCR det
/// and rec with the default policy. DenseNet-121 in that order stays at
/// 1.192x with every simple online policy measured (`BENCHMARKS.md`).
#[test]
fn onnx_runtime_order_first_sight_by_policy() {
    use tensor_arena::{Coalesce, Fit};
    for (name, goal) in [
        ("ort/ppocr-det.trace", 1.10),
        ("ort/ppocr-rec.trace", 1.10),
        ("ort/densenet121.trace", 1.20),
    ] {
        for run in read_trace(name) {
            let ratio = |fit: Fit, coalesce: Coalesce| {
                let arena = Arena::new(ArenaConfig {
                    fit,
                    coalesce,
                    ..ArenaConfig::default()
                });
                replay(&arena, &run).high_water as f64 / run.lower_bound() as f64
            };
            let default = ratio(Fit::default(), Coalesce::default());
            println!(
                "{name} {}: good fit, immediate {default:.3}; lazy {:.3}; best fit, immediate {:.3}; lazy {:.3}",
                run.label,
                ratio(Fit::Good, Coalesce::Lazy),
                ratio(Fit::Best, Coalesce::Immediate),
                ratio(Fit::Best, Coalesce::Lazy),
            );
            assert!(default <= goal, "{name} {}: {default:.3}x", run.label);
        }
    }
}
