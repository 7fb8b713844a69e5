//! Predict boldly, pay nothing when wrong: a shape seen for the first time
//! is planned at its lower bound where its family's shapes show how it
//! follows the key (a dimension that never varied included), and a run that
//! is refused or leaves its plan reaches no higher than the same run on a
//! fresh dynamic arena, plus a granule.

use super::families::{arena, drive, run, size, Model, Twist, GRANULE};
use tensor_arena::{DynamicReason, PlanCache, PlanSource};

/// Runs `model` at `key` (twisted) through `cache` on `arena`, and checks
/// that its high-water is at most the same run's on a fresh dynamic arena
/// plus a granule; returns how it was served and whether it left its plan.
fn no_worse(
    arena: &tensor_arena::Arena<tensor_arena::Heap<tensor_arena::allocator_api2::alloc::Global>>,
    cache: &PlanCache<Vec<usize>>,
    model: &Model,
    key: [usize; 2],
    twist: Twist,
) -> (PlanSource, bool, usize, usize) {
    let (lookup, report, lb) = run(arena, cache, model, key, twist);
    let (dynamic, _, _) = drive(&arena_fresh(), None, model, key, twist);
    assert!(
        report.high_water <= dynamic.high_water + GRANULE,
        "{key:?} {twist:?} {:?} (deviated: {}): high-water {} over the dynamic run's {}",
        lookup.source,
        report.deviated,
        report.high_water,
        dynamic.high_water
    );
    (lookup.source, report.deviated, report.high_water, lb)
}

fn arena_fresh(
) -> tensor_arena::Arena<tensor_arena::Heap<tensor_arena::allocator_api2::alloc::Global>> {
    arena()
}

/// A transformer-like family whose batch and sequence first vary together
/// (`[1, 512]`, then `[2, 1024]`): a block that follows the sequence alone
/// is explained as well by the batch. At `[16, 512]` or `[64, 128]` the two
/// part; the run is not planned from a guess (it was kept at 2.4x to 4.7x
/// its need), but refused as ambiguous, and costs what no plan costs.
#[test]
fn batch_and_sequence_that_varied_together_are_not_guessed() {
    let model = Model {
        // Embeddings that follow the sequence alone, activations in batch
        // x sequence, attention in batch x sequence^2, a constant.
        sizes: vec![
            size(0, 3072, 2),
            size(0, 256, 3),
            size(0, 256, 3),
            size(0, 64, 5),
            size(4096, 0, 0),
            size(0, 3072, 2),
        ],
        events: vec![
            (true, 0),
            (true, 4),
            (true, 1),
            (false, 0),
            (true, 3),
            (true, 2),
            (false, 1),
            (false, 3),
            (true, 5),
            (false, 2),
            (false, 5),
        ],
    };
    let arena = arena();
    for key in [[16, 512], [64, 128]] {
        let cache: PlanCache<Vec<usize>> = PlanCache::new(64);
        for seen in [[1, 512], [2, 1024]] {
            no_worse(&arena, &cache, &model, seen, Twist::None);
        }
        let (source, _, _, _) = no_worse(&arena, &cache, &model, key, Twist::None);
        assert_eq!(source, PlanSource::Dynamic(DynamicReason::Ambiguous));
        assert_eq!(cache.stats().runs.dynamic_ambiguous, 1);
        // The run taught the family how the two part: the other key is
        // predicted now, and kept.
        let other = if key == [16, 512] {
            [64, 128]
        } else {
            [16, 512]
        };
        let (source, deviated, _, _) = no_worse(&arena, &cache, &model, other, Twist::None);
        assert_eq!(source, PlanSource::Predicted);
        assert!(!deviated);
    }
    // Along the line they varied on, the models agree: predicted.
    let cache: PlanCache<Vec<usize>> = PlanCache::new(64);
    for key in [[1, 512], [2, 1024]] {
        no_worse(&arena, &cache, &model, key, Twist::None);
    }
    let (source, deviated, _, _) = no_worse(&arena, &cache, &model, [4, 2048], Twist::None);
    assert_eq!(source, PlanSource::Predicted);
    assert!(!deviated);
}

/// A small block that lives to the end of the run (an output) and a last
/// block that grows past its slot (a data-dependent box count): the plan
/// keeps the output at the bottom of its block, so that when the run
/// leaves the plan the rest of the block is one free span the grown block
/// extends, and the run reaches no higher than it would with no plan
/// (it reached 1.8x).
#[test]
fn a_long_lived_block_does_not_split_what_a_fallback_needs() {
    let mb = 1 << 20;
    let model = Model {
        sizes: vec![
            size(mb, 0, 0),
            size(mb, 0, 0),
            size(64 << 10, 0, 0),
            size(mb, 0, 0),
            size(3 * mb / 2, 0, 0),
        ],
        events: vec![
            (true, 0),
            (true, 1),
            (false, 0),
            (true, 2),
            (true, 3),
            (false, 1),
            (false, 3),
            (true, 4),
            (false, 4),
        ],
    };
    let arena = arena();
    let cache: PlanCache<Vec<usize>> = PlanCache::new(64);
    no_worse(&arena, &cache, &model, [1, 1], Twist::None);
    let (source, deviated, _, _) = no_worse(&arena, &cache, &model, [1, 1], Twist::None);
    assert_eq!(source, PlanSource::Exact);
    assert!(!deviated);
    // The last block twice its size: the run leaves its plan there.
    let (source, deviated, _, _) = no_worse(&arena, &cache, &model, [1, 1], Twist::Larger(4));
    assert_eq!(source, PlanSource::Exact);
    assert!(deviated);
}

/// `[1, 1]`, `[8, 1]`, `[4, 1]` then `[4, 64]`: the width never varied and
/// its value (1) cannot show which blocks follow it, so the run is not
/// planned from a 64-fold guess, and costs what no plan costs.
#[test]
fn a_dimension_with_nothing_to_tell_costs_no_more_than_no_plan() {
    let model = Model {
        sizes: vec![size(0, 4096, 3), size(65536, 0, 0), size(0, 1024, 3)],
        events: vec![
            (true, 0),
            (true, 1),
            (false, 0),
            (true, 2),
            (false, 1),
            (false, 2),
        ],
    };
    let arena = arena();
    let cache: PlanCache<Vec<usize>> = PlanCache::new(64);
    for key in [[1, 1], [8, 1], [4, 1]] {
        no_worse(&arena, &cache, &model, key, Twist::None);
    }
    let (source, _, _, _) = no_worse(&arena, &cache, &model, [4, 64], Twist::None);
    assert_eq!(source, PlanSource::Dynamic(DynamicReason::Unvaried));
}

/// PP-OCR det's case: two images 736 high (`736 x 992`, `736 x 1312`),
/// then the largest, `1280 x 1280`. The height never varied, but every
/// feature map's size is a multiple of 736 (`23 * 32`): the sizes show
/// that they follow it, so the largest run is predicted at its lower bound
/// on first sight (it was refused, and served at 1.09x to 1.20x).
#[test]
fn an_image_height_that_never_varied_is_predicted_at_the_lower_bound() {
    // Keys `[h, w]`: `m = 3` is h x w, `m = 4` h x ceil(w / 4).
    let model = Model {
        sizes: vec![
            size(0, 12, 3),
            size(0, 64, 4),
            size(4096, 0, 0),
            size(0, 64, 3),
            size(0, 96, 4),
            size(0, 4, 3),
        ],
        events: vec![
            (true, 0),
            (true, 2),
            (true, 1),
            (false, 0),
            (true, 3),
            (false, 1),
            (true, 4),
            (false, 3),
            (true, 5),
            (false, 4),
        ],
    };
    let arena = arena();
    let cache: PlanCache<Vec<usize>> = PlanCache::new(64);
    for key in [[736, 992], [736, 1312]] {
        no_worse(&arena, &cache, &model, key, Twist::None);
    }
    let (source, deviated, high_water, lb) =
        no_worse(&arena, &cache, &model, [1280, 1280], Twist::None);
    assert_eq!(source, PlanSource::Predicted);
    assert!(!deviated);
    assert!(
        high_water <= lb + GRANULE * 6,
        "high-water {high_water} against the lower bound {lb}"
    );
}

/// What a run that leaves its plan costs against no plan: over random
/// families (random structures, sizes affine in random products of the
/// key's dimensions) run at random shapes with random deviations (a block
/// above its slot, an extra allocation, a missing free, two frees
/// swapped), every fell-back run's high-water against the same run's on
/// a fresh dynamic arena. Every run is held to the envelope in
/// [`run`](super::families) (the block and the dynamic need, and an
/// eighth); a run that left its plan with every block where a dynamic
/// arena would have it (`RunReport::left_as_dynamic`) to its dynamic run
/// or the plan's block it drew, to a granule; and this holds the
/// distribution where it stands. At the default 150 families
/// (2026-12-07): 775 of 782 predicted runs within max(a granule, 3%) of
/// their dynamic runs; 137 of 204 fell-back runs within a granule, mean
/// 0.9791x, p95 1.015x, worst 1.390x, 0.81 MiB past their dynamic runs in
/// all; kept predictions 47.2 MiB under theirs. The goal (99%
/// within the mark, worst 1.25x) is measured at 1,200 families
/// (`TENSOR_ARENA_FAMILIES=1200`; BENCHMARKS.md, "Where each goal of
/// planning stands"). The sequence is deterministic (a fixed seed), so
/// the figures move only when the planner does; how each rule moved them
/// is in git's history and docs/decisions.md.
#[test]
fn fell_back_runs_against_no_plan() {
    let f = fell_back_against_no_plan(super::families::arena);
    // (The figures are in the doc above.)
    f.holds(1.019, 1.25);
    // Kept predictions: mostly a few granules over (safe-side slots on
    // runs of a few KiB). The worst were local models (a block no model
    // explains at every shape, fitted to the three nearest) through a
    // shape whose block a twist doubled, 2.517x; local models over the
    // nearest four that part refuse the key (1.016x now). Plans in the
    // run's own order (robust, or a family's first plans within a
    // thirty-second of the lowest) keep their runs a few granules over the
    // dynamic run's high-water (safe-side slots placed as a dynamic arena
    // would place them), within 3%: 284 of 578 over by more than a
    // granule (205 of 389 before a shape the data made larger was left
    // out of a block's fit), against 180 of 393 with the lowest plans
    // until a run left one, and 57 of 390 before robust plans.
    assert!(
        f.kept_over * 100 <= f.kept * 55,
        "{} of {}",
        f.kept_over,
        f.kept
    );
    assert!(f.kept_worst <= 1.1, "kept at worst {:.3}x", f.kept_worst);
}

/// [`fell_back_runs_against_no_plan`] on pages, one reservation that grows
/// in place (the memory servers run on), where a run that left its plan
/// grows past the plan's block at the top: the same families, every block
/// intact, and the fell-back runs as near their dynamic runs.
#[cfg(target_os = "linux")]
#[test]
fn fell_back_runs_against_no_plan_on_pages() {
    use tensor_arena::memory::{Pages, PagesConfig};
    let f = fell_back_against_no_plan(|| {
        tensor_arena::Arena::with_memory(
            tensor_arena::ArenaConfig::default(),
            Pages::new(PagesConfig::default()),
        )
        .unwrap()
    });
    // (1.0160x: 13 fewer fell-back runs than before the refusals of
    // models of one degree that part, closer to their dynamic runs than
    // the mean; 1.0198x, p95 1.261x, once extra blocks were served beside
    // the plan: 30 runs that fell back near their dynamic runs kept their
    // plans.)
    f.holds(1.021, 1.27);
}

impl FellBack {
    /// The fell-back runs where they stand: enough of them, 64% within a
    /// granule of their dynamic runs (74% before robust plans: more were
    /// below them), a mean over them of at most `mean`
    /// times their dynamic runs' high-water, p95 at most `p95`, worst
    /// 1.6x (2.304x before affine fits of every degree were compared);
    /// enough of them left where a dynamic arena would be (each
    /// held, as it goes, to its dynamic run or its plan's block); and of
    /// every predicted run (kept or fell back), 97% within max(a granule,
    /// 3%) of its dynamic run (95.4-95.6% before robust plans, 97.8%
    /// since).
    fn holds(&self, mean: f64, p95: f64) {
        assert!(
            self.goal_within * 1000 >= self.predicted * 970,
            "{} of {} predicted runs within max(a granule, 3%)",
            self.goal_within,
            self.predicted
        );
        // (137 since a strided fit's twin divided further is compared
        // with it and keys where they part are refused, 151 before: the
        // runs that left plans fitted to the wrong stride are no longer
        // predicted.)
        assert!(self.fell >= 120, "{} fell-back runs", self.fell);
        assert!(
            self.within * 100 >= self.fell * 64,
            "{} of {} within a granule",
            self.within,
            self.fell
        );
        assert!(self.mean <= mean, "mean {:.4}x", self.mean);
        assert!(self.p95 <= p95, "p95 {:.3}x", self.p95);
        assert!(self.worst <= 1.6, "worst {:.3}x", self.worst);
        assert!(self.as_dynamic >= 25, "{} left as dynamic", self.as_dynamic);
    }
}

/// What [`fell_back_against_no_plan`] found.
struct FellBack {
    /// Predicted runs (kept or fell back), and those within max(a
    /// granule, 3%) of their dynamic runs.
    predicted: u32,
    goal_within: u32,
    fell: u32,
    within: u32,
    /// Left with every block where a dynamic arena would have it.
    as_dynamic: u32,
    /// Over every fell-back run: its high-water over its dynamic run's.
    mean: f64,
    p95: f64,
    worst: f64,
    kept: usize,
    kept_over: usize,
    kept_worst: f64,
}

/// Runs the random families on arenas from `make`; prints and returns the
/// fell-back runs against the same runs on a fresh dynamic arena.
fn fell_back_against_no_plan<M: super::families::Fresh>(
    make: impl Fn() -> tensor_arena::Arena<M>,
) -> FellBack {
    let (mut fell, mut within, mut kept, mut as_dynamic) = (0u32, 0u32, 0u32, 0u32);
    let (mut predicted, mut goal_within, mut goal_worst, mut goal_net) = (0u32, 0u32, 1f64, 0f64);
    // Bytes under their dynamic runs, over the fell-back and kept runs.
    let (mut saved, mut kept_saved) = (0f64, 0f64);
    let mut as_dynamic_over: Vec<f64> = Vec::new();
    let mut over: Vec<f64> = Vec::new();
    let mut kept_over: Vec<f64> = Vec::new();
    // Every fell-back run's high-water over its dynamic run's, and the
    // bytes past it.
    let (mut ratios, mut excess): (Vec<f64>, usize) = (Vec::new(), 0);
    for (model, runs) in super::families::random_families().take(models()) {
        let arena = make();
        let cache: PlanCache<Vec<usize>> = PlanCache::new(64);
        for ([b, w], twist) in runs {
            let (lookup, report, _) = run(&arena, &cache, &model, [b, w], twist);
            if lookup.plan.is_none() {
                continue;
            }
            let (dynamic, _, _) = drive(&make(), None, &model, [b, w], twist);
            // The goal's measure, over every predicted run (kept or fell
            // back): within max(a granule, 3%) of its dynamic run.
            if lookup.source == PlanSource::Predicted {
                predicted += 1;
                let d = dynamic.high_water;
                goal_within += u32::from(report.high_water <= d + GRANULE.max(d * 3 / 100));
                goal_worst = goal_worst.max(report.high_water as f64 / d.max(1) as f64);
                goal_net += report.high_water as f64 - d as f64;
            }
            if !report.deviated {
                if lookup.source == PlanSource::Predicted {
                    kept += 1;
                    kept_saved += dynamic.high_water as f64 - report.high_water as f64;
                    if report.high_water > dynamic.high_water + GRANULE {
                        kept_over.push(report.high_water as f64 / dynamic.high_water as f64);
                    }
                }
                continue;
            }
            fell += 1;
            // A run that left its plan with every block where a dynamic
            // arena would have it goes on as that arena would: no higher
            // than its dynamic run, or than the plan's block it drew.
            if report.left_as_dynamic {
                as_dynamic += 1;
                let plan = lookup.plan.as_ref().map_or(0, |p| p.size());
                assert!(
                    report.high_water <= dynamic.high_water.max(plan) + GRANULE,
                    "[{b}, {w}] {twist:?}: left as a dynamic arena, at {} against {} (plan {plan})",
                    report.high_water,
                    dynamic.high_water
                );
                if report.high_water > dynamic.high_water + GRANULE {
                    as_dynamic_over.push(report.high_water as f64 / dynamic.high_water as f64);
                }
            }
            saved += dynamic.high_water as f64 - report.high_water as f64;
            ratios.push(report.high_water as f64 / dynamic.high_water as f64);
            excess += report.high_water.saturating_sub(dynamic.high_water);
            if report.high_water <= dynamic.high_water + GRANULE {
                within += 1;
            } else {
                over.push(report.high_water as f64 / dynamic.high_water as f64);
            }
        }
    }
    over.sort_by(f64::total_cmp);
    let median = over.get(over.len() / 2).copied().unwrap_or(1.0);
    let worst = over.last().copied().unwrap_or(1.0);
    kept_over.sort_by(f64::total_cmp);
    let kept_worst = kept_over.last().copied().unwrap_or(1.0);
    ratios.sort_by(f64::total_cmp);
    let mean = ratios.iter().sum::<f64>() / ratios.len().max(1) as f64;
    let p95 = ratios.get(ratios.len() * 95 / 100).copied().unwrap_or(1.0);
    let below = ratios.iter().filter(|&&r| r < 1.0).count();
    let mib = |b: f64| b / (1 << 20) as f64;
    let as_dynamic_worst = as_dynamic_over.iter().copied().fold(1.0, f64::max);
    println!(
        "{within} of {fell} fell-back runs within a granule of the dynamic run ({below} \
         below it; {as_dynamic} left as a dynamic arena would be, {} of them over it, worst \
         {as_dynamic_worst:.4}x); the rest: median \
         {median:.3}x, worst {worst:.3}x; all: mean {mean:.4}x, p95 {p95:.3}x, {:.2} MiB past \
         their dynamic runs in all, {:.2} MiB under them net; kept predictions over it by \
         more than a granule: {} of {kept}, worst {kept_worst:.3}x; {:.2} MiB under their \
         dynamic runs net",
        as_dynamic_over.len(),
        mib(excess as f64),
        mib(saved),
        kept_over.len(),
        mib(kept_saved),
    );
    println!(
        "predicted runs (kept or fell back): {goal_within} of {predicted} within max(a granule, \
         3%) of their dynamic runs, worst {goal_worst:.3}x, {:+.2} MiB against them in all",
        mib(goal_net)
    );
    FellBack {
        predicted,
        goal_within,
        fell,
        within,
        as_dynamic,
        mean,
        p95,
        worst,
        kept: kept as usize,
        kept_over: kept_over.len(),
        kept_worst,
    }
}

/// Random families run by [`fell_back_runs_against_no_plan`].
const MODELS: usize = 150;

/// [`MODELS`], or `TENSOR_ARENA_FAMILIES` where set (a larger sample for
/// BENCHMARKS.md: 1,200 give 2,118 fell-back runs); the first [`MODELS`]
/// are the same either way. The tests' bounds are the default sample's.
fn models() -> usize {
    std::env::var("TENSOR_ARENA_FAMILIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(MODELS)
}
