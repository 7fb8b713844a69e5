//! Planned runs: serving, deviation, the cache, saving and loading.

use crate::common::{read_trace, Counting, TraceRun};
use std::collections::HashMap;
use std::sync::Arc;
use tensor_arena::{Arena, ArenaConfig, Block, Coalesce, Plan, PlanCache, Recording, RunReport};

/// Replays `run` (scaled sizes), checking a per-block pattern when each
/// block dies, and returns the report and recording.
fn replay<A: tensor_arena::HostMemory>(
    arena: &Arena<A>,
    plan: Option<Arc<Plan>>,
    run: &TraceRun,
    change: Option<(usize, usize)>,
) -> (RunReport, Recording) {
    let r = match plan {
        Some(p) => arena.begin_planned_run(p).unwrap(),
        None => arena.begin_recorded_run(),
    };
    let mut live: HashMap<usize, (Block<'_, A>, u8)> = HashMap::new();
    let mut n = 0;
    for &(alloc, id, bytes) in &run.events {
        if alloc {
            let bytes = match change {
                Some((at, to)) if at == n => to,
                _ => bytes,
            };
            n += 1;
            let mut b = r.try_alloc(bytes).unwrap();
            let seed = id as u8 ^ 0x5a;
            b.fill(seed);
            live.insert(id, (b, seed));
        } else {
            let (b, seed) = live.remove(&id).unwrap();
            assert!(b.iter().all(|&x| x == seed), "block {id} overwritten");
        }
    }
    r.finish_with_recording()
}

#[test]
fn a_planned_run_serves_every_block_with_no_search_and_no_backing_call() {
    let counting = Counting::default();
    let arena = Arena::with_backing(ArenaConfig::default(), &counting);
    let run = &read_trace("ppocr-cls-6x3x48x192.trace")[0];
    let (first, rec) = replay(&arena, None, run, None);
    assert!(!first.planned);
    assert_eq!(rec.len(), run.events.iter().filter(|e| e.0).count());
    let plan = Arc::new(Plan::from_recording(&rec).unwrap());
    plan.validate().unwrap();
    assert!(plan.size() <= first.high_water);
    let calls = counting.calls.get() + counting.frees.get();
    for _ in 0..20 {
        let (report, own) = replay(&arena, Some(Arc::clone(&plan)), run, None);
        assert!(report.planned && !report.deviated);
        assert!(
            own.is_empty(),
            "a run that follows its plan records nothing"
        );
        assert_eq!(report.planned_allocs, report.allocs);
        assert_eq!(report.backing_allocs, 0);
        assert_eq!(report.high_water, plan.size().next_multiple_of(64));
    }
    assert_eq!(counting.calls.get() + counting.frees.get(), calls);
    let s = arena.stats();
    assert_eq!((s.in_use, s.planned_runs, s.deviations), (0, 20, 0));
    // The plan's block is all the run needs: shrink to it.
    arena.shrink();
    assert!(arena.stats().reserved <= plan.size() + 64);
    let (report, _) = replay(&arena, Some(plan), run, None);
    assert_eq!(report.backing_allocs, 0);
}

#[test]
fn a_run_that_changes_one_size_halfway_deviates_and_stays_correct() {
    a_run_that_changes_one_size_halfway(Coalesce::Immediate);
}

/// The same on an arena whose freed spans merge lazily: the plan's block,
/// dissolved at the deviation, still becomes free memory merged at once,
/// from which the run's live planned blocks are taken back.
#[test]
fn a_run_that_changes_one_size_halfway_deviates_and_stays_correct_when_freed_spans_merge_lazily() {
    a_run_that_changes_one_size_halfway(Coalesce::Lazy);
}

/// A DenseNet run recorded, then served on its plan with one size changed
/// halfway, on the default (`Pages`) arena with freed spans merged as
/// `coalesce` says.
fn a_run_that_changes_one_size_halfway(coalesce: Coalesce) {
    let arena = Arena::new(ArenaConfig {
        coalesce,
        ..ArenaConfig::default()
    });
    let run = &read_trace("densenet121-1x3x224x224.trace")[0];
    let (_, rec) = replay(&arena, None, run, None);
    let plan = Arc::new(Plan::from_recording(&rec).unwrap());
    let half = rec.len() / 2;
    let twice = 2 * rec.blocks[half].0;
    let (report, rec2) = replay(&arena, Some(Arc::clone(&plan)), run, Some((half, twice)));
    assert!(report.planned && report.deviated);
    // Repaired in place: the grown block goes where the rest of the plan
    // leaves it room for its life, every other block to its slot, and
    // the whole run stays inside the plan's block.
    assert_eq!(report.planned_allocs, report.allocs);
    assert_eq!(report.high_water, plan.size().next_multiple_of(64));
    assert_eq!(arena.stats().deviations, 1);
    assert_eq!(arena.stats().in_use, 0);
    // The re-recording serves the changed run exactly.
    let replan = Arc::new(Plan::from_recording(&rec2).unwrap());
    let (again, _) = replay(&arena, Some(replan), run, Some((half, twice)));
    assert!(!again.deviated);
    // A block many times its slot is not this one (the run went another
    // way): the block is dissolved at it, and the rest comes from the pool.
    let huge = plan.size() + (1 << 20);
    let (report, _) = replay(&arena, Some(Arc::clone(&plan)), run, Some((half, huge)));
    assert!(report.deviated);
    assert_eq!(report.planned_allocs, half as u64);
    assert!(report.high_water > plan.size() + (1 << 20));
    assert_eq!(arena.stats().in_use, 0);
    // More blocks than recorded: the extra ones come from the pool.
    let r = arena.begin_planned_run(Arc::clone(&plan)).unwrap();
    let blocks: Vec<_> = (0..plan.len() + 3)
        .map(|i| r.try_alloc(64 + i).unwrap())
        .collect();
    drop(blocks);
    assert!(r.finish().deviated);
}

#[test]
fn a_smaller_run_is_served_by_a_larger_plan_that_covers_it() {
    let arena = Arena::new(ArenaConfig::default());
    let big = &read_trace("silero-vad-313x576.trace")[0];
    let small = &read_trace("silero-vad-31x576.trace")[0];
    let (_, rec_big) = replay(&arena, None, big, None);
    let plan = Arc::new(Plan::from_recording(&rec_big).unwrap());
    let (report, rec_small) = replay(&arena, Some(Arc::clone(&plan)), small, None);
    assert!(report.planned && !report.deviated, "{report:?}");
    assert_eq!(
        rec_small.len(),
        29,
        "served smaller: the run's own recording is kept"
    );
    assert!(plan.covers(&rec_small));
    assert!(!Plan::from_recording(&rec_small).unwrap().covers(&rec_big));
}

/// A planned block kept past its run keeps its own bytes only: the run's
/// end dissolves the plan's block, so the rest of it is free memory the
/// next allocation is served from (no growth), not held until the kept
/// block goes.
#[test]
fn a_leaked_planned_block_keeps_only_its_own_bytes() {
    let arena = Arena::new(ArenaConfig::default());
    let r = arena.begin_recorded_run();
    let a = r.try_alloc(1000).unwrap();
    let b = r.try_alloc(64 << 10).unwrap();
    drop((a, b));
    let (_, rec) = r.finish_with_recording();
    let plan = Arc::new(Plan::from_recording(&rec).unwrap());
    let r = arena.begin_planned_run(plan).unwrap();
    let mut kept = r.try_alloc(1000).unwrap();
    drop(r.try_alloc(64 << 10).unwrap());
    assert_eq!(
        arena.stats().live_blocks,
        1,
        "the plan's own block is not counted"
    );
    assert!(
        arena.live_blocks().is_empty(),
        "planned blocks carry no tag to list"
    );
    let report = r.finish();
    assert!(
        report.deviated,
        "the recorded free did not happen in the run"
    );
    assert_eq!((report.leaked_blocks, report.leaked_bytes), (1, 1024));
    kept.fill(7);
    let st = arena.stats();
    assert_eq!(st.in_use, 1024);
    assert_eq!(st.live_blocks, 1);
    assert!(arena.live_blocks().is_empty(), "still a planned block");
    // The rest of the plan's block is free: a block of its size fits with
    // no memory-layer call.
    assert!(st.free_bytes >= 64 << 10, "{st:?}");
    let calls = st.memory_calls();
    let r = arena.begin_run();
    let other = r.try_alloc(64 << 10).unwrap();
    assert_eq!(
        arena.stats().memory_calls(),
        calls,
        "served from the dissolved block"
    );
    drop(other);
    r.finish();
    assert!(kept.iter().all(|&x| x == 7));
    drop(kept);
    assert_eq!(arena.stats().in_use, 0);
    assert_eq!(arena.stats().live_blocks, 0);
}

#[test]
fn the_cache_compares_keys_exactly_and_evicts_the_least_recently_used() {
    let plan = |n: usize| {
        let mut rec = Recording::new();
        let i = rec.alloc(n * 64, 64);
        rec.free(i);
        Arc::new(Plan::from_recording(&rec).unwrap())
    };
    // Keys whose XOR of dimensions collide (ONNX Runtime's weakness) stay apart.
    let cache: PlanCache<Vec<usize>> = PlanCache::new(2);
    cache.insert(vec![1, 2, 3], plan(1));
    cache.insert(vec![3, 2, 1], plan(2));
    assert_eq!(cache.get(&vec![1, 2, 3]).unwrap().size(), 64);
    assert_eq!(cache.get(&vec![3, 2, 1]).unwrap().size(), 128);
    assert!(cache.get(&vec![0, 0, 0]).is_none());
    cache.get(&vec![1, 2, 3]); // now [3,2,1] is the least recently used
    cache.insert(vec![4], plan(3));
    assert!(cache.contains(&vec![1, 2, 3]) && cache.contains(&vec![4]));
    assert!(!cache.contains(&vec![3, 2, 1]));
    let s = cache.stats();
    assert_eq!(
        (s.hits, s.misses, s.evictions, s.inserts, s.plans),
        (3, 1, 1, 3, 2)
    );
    assert_eq!(cache.largest().unwrap().size(), 192);
}

#[test]
fn plans_round_trip_through_serde() {
    let arena = Arena::new(ArenaConfig::default());
    let run = &read_trace("silero-vad-31x576.trace")[0];
    let (_, rec) = replay(&arena, None, run, None);
    let cache: PlanCache<String> = PlanCache::new(8);
    cache.insert(
        "31x576".into(),
        Arc::new(Plan::from_recording(&rec).unwrap()),
    );
    let saved: Vec<(String, Plan)> = cache
        .entries()
        .into_iter()
        .map(|(k, p)| (k, (*p).clone()))
        .collect();
    let json = serde_json::to_string(&saved).unwrap();
    let loaded: Vec<(String, Plan)> = serde_json::from_str(&json).unwrap();
    let warm: PlanCache<String> = PlanCache::new(8);
    warm.load(loaded);
    let plan = warm.get("31x576").unwrap();
    assert_eq!(*plan, *cache.get("31x576").unwrap());
    let (report, _) = replay(&arena, Some(plan), run, None);
    assert!(report.planned && !report.deviated);
}

/// Runs the first run of DenseNet-121's trace on `arena`, recorded or not,
/// with `outside` bytes live from before the run (0: the run starts on a
/// wholly free arena).
fn densenet_run(arena: &Arena, recorded: bool, outside: usize) -> (RunReport, Recording) {
    let run = &read_trace("densenet121-mixed.trace")[0];
    let kept = (outside > 0).then(|| arena.try_alloc(outside).unwrap());
    let r = if recorded {
        arena.begin_recorded_run()
    } else {
        arena.begin_run()
    };
    let mut live: HashMap<usize, Block<'_>> = HashMap::new();
    for &(alloc, id, bytes) in &run.events {
        if alloc {
            live.insert(id, r.try_alloc(bytes).unwrap());
        } else {
            live.remove(&id);
        }
    }
    let out = r.finish_with_recording();
    drop(kept);
    out
}

/// Only a run opened to be recorded keeps a recording; the others only
/// count, and report the same high-water mark, whether they start on a
/// wholly free arena (measured in place) or beside a live block (then
/// simulated from the operation log they keep for it).
#[test]
fn only_recorded_runs_keep_a_recording() {
    for outside in [0, 3 << 20] {
        let arena = Arena::new(ArenaConfig::default());
        // A first run makes the arena's one region.
        densenet_run(&arena, false, outside);
        let (plain, none) = densenet_run(&arena, false, outside);
        assert!(none.is_empty(), "an unrecorded run returns no recording");
        let (recorded, rec) = densenet_run(&arena, true, outside);
        assert!(!rec.is_empty(), "a recorded run returns its recording");
        assert_eq!(plain.high_water, recorded.high_water, "outside {outside}");
        assert_eq!(plain.peak_in_use, recorded.peak_in_use);
        let plan = Plan::from_recording(&rec).unwrap();
        assert!(plan.size() <= recorded.high_water);
        // Planned and not deviating: nothing new to record either way.
        let r = arena.begin_planned_run(Arc::new(plan)).unwrap();
        assert!(r.finish_with_recording().1.is_empty());
    }
}

/// An unrecorded run whose region is given back in its middle (a shrink
/// while nothing was live) and made again still reports a need of at
/// least its peak.
#[test]
fn an_unrecorded_run_that_loses_its_region_reports_its_need() {
    let arena = Arena::new(ArenaConfig::default());
    drop(arena.try_alloc(8 << 20).unwrap());
    let r = arena.begin_run();
    drop(r.try_alloc(1 << 20).unwrap());
    arena.shrink_to(0);
    let a = r.try_alloc(4 << 20).unwrap();
    let b = r.try_alloc(2 << 20).unwrap();
    drop((a, b));
    let (report, rec) = r.finish_with_recording();
    assert!(rec.is_empty());
    assert_eq!(
        (report.backing_frees, report.backing_allocs),
        (1, 1),
        "the region went and came back"
    );
    assert!(
        report.high_water >= 6 << 20,
        "high water {} under the run's peak",
        report.high_water
    );
    arena.check_invariants();
}
