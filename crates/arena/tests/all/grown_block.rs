//! A real run that leaves its own plan because one block grows (a
//! data-dependent size: a box count, a longer output), against the same
//! run with no plan. ONNX Runtime's order of PP-OCRv4 det and rec and of
//! DenseNet-121 (`traces/ort/`): the first run's own plan serves the first
//! run with its middle block four times its size, or its largest block
//! twice its size. The run follows the plan to that block, cannot be served
//! inside the plan's block, and the rest is served around the blocks live
//! there, which keep the places the plan gave them (`raw/repair.rs`).
//!
//! Where it stands (2026-11-28; planned against no plan): det's middle
//! block 4x, 178.1 MiB against 180.5 (it was 215.6 before the rest of the
//! plan was placed again); its largest block 2x, 180.5 as with no plan
//! (200.0 before det's plan started with the run's own placement as far
//! as that is as low, `Search::dynamic_start` in `solver/outputs.rs`: the
//! run leaves it there, every block where a dynamic arena has it, and the
//! pool's best fit goes on as that arena would); rec's middle block 4x
//! and largest 2x, 22.0 and 20.4, as with no plan (31.6 and 24.2 before
//! rec's plan became the run's own placement, which is as low:
//! `Search::as_dynamic`); DenseNet's middle block 4x, 79.6 against 94.9;
//! its largest 2x, 128.6 against 94.9. That one stays over: at the
//! deviation, a block live there sits where the plan put it, in the range
//! the grown block needs for its life, which a dynamic arena had left
//! free; DenseNet's plan starts with less of the run's own placement than
//! the block's place in the run. It is held where it stands; the goal (no
//! run past its dynamic run by more than a granule) is not met on it.

use crate::common::{read_trace, TraceRun};
use crate::gpu_traces::{arena, replay};

/// `run` with its middle allocation (`largest`: its largest) `times` its
/// size.
fn grown(run: &TraceRun, largest: bool, times: usize) -> TraceRun {
    let allocs: Vec<(usize, usize)> = run
        .events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.0)
        .map(|(i, e)| (i, e.2))
        .collect();
    let at = if largest {
        allocs.iter().max_by_key(|a| a.1).map_or(0, |a| a.0)
    } else {
        allocs[allocs.len() / 2].0
    };
    let mut out = run.clone();
    out.events[at].2 *= times;
    out
}

#[test]
fn a_grown_block_against_no_plan() {
    let granule = tensor_arena::ArenaConfig::default().alignment;
    // (trace, largest, times, bound over the dynamic run in thousandths,
    // whether the run leaves its plan with every block where a dynamic
    // arena has it).
    let cases = [
        ("ort/ppocr-det.trace", false, 4, 1000, false),
        ("ort/ppocr-det.trace", true, 2, 1000, true),
        ("ort/ppocr-rec.trace", false, 4, 1000, true),
        ("ort/ppocr-rec.trace", true, 2, 1000, true),
        ("ort/densenet121.trace", false, 4, 1000, false),
        ("ort/densenet121.trace", true, 2, 1360, false),
    ];
    for (name, largest, times, bound, as_dynamic) in cases {
        let first = read_trace(name).swap_remove(0);
        let (_, recording) = replay(&arena(), None, &first);
        let plan = std::sync::Arc::new(tensor_arena::Plan::from_recording(&recording).unwrap());
        let run = grown(&first, largest, times);
        let arena = arena();
        // Warmed by the run itself, as a server's arena is.
        replay(&arena, Some(plan.clone()), &run);
        let (report, _) = replay(&arena, Some(plan.clone()), &run);
        let (dynamic, _) = replay(&crate::gpu_traces::arena(), None, &run);
        let (hw, dyn_hw) = (report.high_water, dynamic.high_water);
        println!(
            "{name} {} {times}x: {:.1} MiB planned, {:.1} with no plan (left as a dynamic arena: {})",
            if largest { "largest" } else { "middle" },
            hw as f64 / (1 << 20) as f64,
            dyn_hw as f64 / (1 << 20) as f64,
            report.left_as_dynamic
        );
        assert!(report.planned);
        assert_eq!(
            report.left_as_dynamic, as_dynamic,
            "{name} largest={largest}"
        );
        assert!(
            hw <= dyn_hw + granule || hw as u128 * 1000 <= dyn_hw as u128 * bound,
            "{name} largest={largest} {times}x: {hw} against {dyn_hw}"
        );
        arena.check_invariants();
    }
}

/// ResNet-50's GPU trace (`traces/gpu/resnet50-mixed.trace`: batches 64, 8,
/// 32, 8, 64) keyed by keys that explain nothing (`run1` to `run5`): a run
/// served on a plan of another batch would leave it at its first block,
/// and its rest must not be placed again (that put the last 37 MiB over).
/// Now that the batches share their core (their workspaces apart), the
/// family sees their sizes contradict the keys and predicts none of them:
/// every run within a granule of the same run with no plan, and none kept
/// on a plan of another batch.
#[test]
fn a_plan_of_another_shape_is_not_repaired() {
    let granule = tensor_arena::ArenaConfig::default().alignment;
    let runs = read_trace("gpu/resnet50-mixed.trace");
    let arena = arena();
    let cache: tensor_arena::PlanCache<String> = tensor_arena::PlanCache::new(64);
    let mut kept_on_another = 0;
    for (i, run) in runs.iter().enumerate() {
        let key = format!("run{}", i + 1);
        let lookup = cache.lookup(key.as_str());
        let (report, rec) = replay(&arena, lookup.plan.clone(), run);
        cache.after_run(key.as_str(), &lookup, &report, &rec, true);
        let (dynamic, _) = replay(&crate::gpu_traces::arena(), None, run);
        kept_on_another += usize::from(lookup.plan.is_some() && !report.deviated && i > 0);
        assert!(
            report.high_water <= dynamic.high_water + granule,
            "{key}: {} against {}",
            report.high_water,
            dynamic.high_water
        );
    }
    assert_eq!(kept_on_another, 0, "a run kept on a plan of another batch");
}
