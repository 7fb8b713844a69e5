//! The rules the planner rests on, each held through the public API
//! ([`PlanCache::lookup`] and [`PlanCache::after_run`] with hand-made
//! recordings and run reports), so that each fails when its rule is
//! dropped:
//!
//! - a prediction that needs more than its family's runs justify is refused
//!   (`Dynamic(Unbounded)`, counted in `dynamic_unbounded`);
//! - a prediction a run kept to but that was loose (its lower bound well
//!   over the run's own) is not kept as the key's plan: the key's plan is
//!   the run's own, at its own lower bound;
//! - a plan that needs more than the run needed dynamically (its high-water
//!   mark, to a granule) is not kept as its key's: a plan never costs more
//!   than no plan.

use std::sync::Arc;
use tensor_arena::{DynamicReason, Lookup, Plan, PlanCache, PlanSource, Recording, RunReport};

/// The arena's granule (`ArenaConfig::default().alignment`).
const GRANULE: usize = 64;

/// A run of one block of `size` bytes, allocated and freed.
fn one_block(size: usize) -> Recording {
    let mut rec = Recording::new();
    let b = rec.alloc(size, GRANULE);
    rec.free(b);
    rec
}

/// What a run that kept to `lookup`'s plan (if any) or ran dynamically
/// reports, reaching `high_water`.
fn report(lookup: &Lookup, high_water: usize) -> RunReport {
    RunReport {
        allocs: 1,
        frees: 1,
        high_water,
        planned: lookup.plan.is_some(),
        planned_allocs: u64::from(lookup.plan.is_some()),
        ..RunReport::default()
    }
}

/// A run of key `[w]` whose one block is `size` bytes: looked up, served
/// as the lookup says (on its plan, which it keeps to, when it has one;
/// else dynamically, reaching its own size) and taught to the cache.
fn teach(cache: &PlanCache<Vec<usize>>, w: usize, size: usize) -> Lookup {
    let key = [w];
    let lookup = cache.lookup(&key[..]);
    if let Some(plan) = &lookup.plan {
        assert!(
            plan.lower_bound() >= size,
            "[{w}]: a plan too small for a run that keeps to it"
        );
    }
    let high_water = lookup.plan.as_ref().map_or(size, |p| p.size());
    cache.after_run(
        &key[..],
        &lookup,
        &report(&lookup, high_water),
        &one_block(size),
        true,
    );
    lookup
}

/// Rule 1: a family whose fit extrapolates wrongly. Its one block was
/// 6400, 7040 and 7680 bytes at widths 1000, 1010 and 1020: no product of
/// the width (to degree 3, strided or not) grows a tenth from 1000 to
/// 1010, so the fit is affine, `64 * (w - 900)`, its intercept far below
/// zero. Within the widths seen that predicts well (1015: 7360 bytes,
/// predicted: a run at 1020 needed more). At width 10 000 it predicts 582 400 bytes; but sizes are
/// sums of products of the dimensions, so a run there needs at most the
/// run at 1020 (7680) scaled by the width's growth (9.8x) to the fit's
/// degree (1), and an eighth: about 85 KB. The prediction is not justified
/// by any run of the family, and is refused, counted as unbounded.
#[test]
fn a_prediction_past_what_the_family_justifies_is_refused() {
    let cache: PlanCache<Vec<usize>> = PlanCache::new(64);
    let size = |w: usize| 64 * (w - 900);
    for w in [1000, 1020, 1010] {
        teach(&cache, w, size(w));
    }
    // Within the widths seen, the fit predicts (no more than the run at
    // 1020 needed).
    let near = cache.lookup(&[1015usize][..]);
    assert_eq!(near.source, PlanSource::Predicted, "{near:?}");
    let plan = near.plan.as_ref().expect("a predicted plan");
    assert!(
        plan.lower_bound() >= size(1015) && plan.lower_bound() < size(1020),
        "{}",
        plan.lower_bound()
    );

    // Far past them, the fit's answer is refused.
    let before = cache.stats().runs;
    let family_before = cache.families()[0].counts;
    let key = [10_000usize];
    let far = cache.lookup(&key[..]);
    assert_eq!(
        far.source,
        PlanSource::Dynamic(DynamicReason::Unbounded),
        "the fit predicts {} bytes at 10 000 (a run there needs at most about {})",
        size(10_000),
        size(1020) * 10
    );
    assert!(far.plan.is_none());
    // The run is served dynamically, and counted as refused.
    let own = size(1020) * 10;
    cache.after_run(&key[..], &far, &report(&far, own), &one_block(own), true);
    let after = cache.stats().runs;
    assert_eq!(
        after.dynamic_unbounded,
        before.dynamic_unbounded + 1,
        "{after:?}"
    );
    assert_eq!(after.dynamic, before.dynamic + 1, "{after:?}");
    let families = cache.families();
    assert_eq!(families.len(), 1);
    assert_eq!(
        families[0].counts.dynamic_unbounded,
        family_before.dynamic_unbounded + 1,
        "{:?}",
        families[0]
    );
    // Its own plan is learned: the key is served exactly next time.
    assert_eq!(cache.lookup(&key[..]).source, PlanSource::Exact);
}

/// Rule 2: a prediction that a run kept to (every block within its slot)
/// but that was loose, its lower bound far over the run's own, is not kept
/// as the key's plan: the key's plan is solved from the run's own
/// recording, so the key's later runs are served at their own lower bound.
#[test]
fn a_loose_prediction_a_run_kept_to_is_not_its_keys_plan() {
    let cache: PlanCache<Vec<usize>> = PlanCache::new(64);
    // One block of 64 bytes a unit of width: proportional.
    for w in [10, 20] {
        teach(&cache, w, 64 * w);
    }
    let key = [15usize];
    let lookup = cache.lookup(&key[..]);
    assert_eq!(lookup.source, PlanSource::Predicted, "{lookup:?}");
    let predicted = lookup.plan.as_ref().expect("a predicted plan");
    // The run at 15 needs a tenth of its prediction: it keeps to the
    // prediction (its block fits its slot) with room to spare.
    let own = one_block(GRANULE);
    assert!(
        predicted.lower_bound() > 8 * own.peak_live(),
        "{}",
        predicted.lower_bound()
    );
    let report = RunReport {
        high_water: predicted.size(),
        ..report(&lookup, 0)
    };
    cache.after_run(&key[..], &lookup, &report, &own, true);
    let plan = cache
        .peek(&key[..])
        .expect("the key's plan is learned from the run");
    assert!(
        plan.lower_bound() <= own.peak_live() + GRANULE,
        "the key's plan's lower bound {} is not the run's own {} (the loose prediction's is {})",
        plan.lower_bound(),
        own.peak_live(),
        predicted.lower_bound()
    );
    let again = cache.lookup(&key[..]);
    assert_eq!(again.source, PlanSource::Exact);
    assert!(again.plan.unwrap().size() <= own.peak_live() + GRANULE);
}

/// Rule 3: a plan solved from a dynamic run is kept as its key's only if
/// it needs no more than the run needed dynamically (its high-water mark,
/// to a granule). A run whose high-water mark is below its solved plan's
/// size leaves no plan for its key; the same run reaching the plan's size
/// does.
#[test]
fn a_plan_larger_than_its_dynamic_run_is_not_kept() {
    // Three blocks: two small ones, then one as large as both, the first
    // freed before it. Solved alone, the plan is at least its lower bound.
    let mut rec = Recording::new();
    let a = rec.alloc(4096, GRANULE);
    let b = rec.alloc(2048, GRANULE);
    rec.free(a);
    let c = rec.alloc(6144, GRANULE);
    rec.free(b);
    rec.free(c);
    let size = Plan::from_recording(&rec).unwrap().size();
    assert!(size >= rec.peak_live());

    // Another family each (a key of one number, a key of two).
    let cases: [(Vec<usize>, usize, bool); 2] = [
        // Dynamically the run reached less than the plan needs (by more
        // than a granule): no plan.
        (vec![7], size - 2 * GRANULE, false),
        // It reached the plan's size: the plan is kept.
        (vec![7, 7], size, true),
    ];
    for (key, high_water, kept) in cases {
        let cache: PlanCache<Vec<usize>> = PlanCache::new(64);
        let lookup = cache.lookup(&key[..]);
        assert_eq!(lookup.source, PlanSource::Dynamic(DynamicReason::NewFamily));
        let report = RunReport {
            allocs: 3,
            frees: 3,
            high_water,
            ..RunReport::default()
        };
        let learned: Option<Arc<Plan>> = cache.after_run(&key[..], &lookup, &report, &rec, true);
        assert!(learned.is_some(), "the run's plan is solved either way");
        assert_eq!(
            cache.contains(&key[..]),
            kept,
            "{key:?}: a plan of {size} bytes after a dynamic run that reached {high_water}"
        );
        let next = cache.lookup(&key[..]).source;
        assert_eq!(next == PlanSource::Exact, kept, "{next:?}");
    }
}
