//! Dynamic scoped runs ([`Arena::begin_scoped_dynamic_run`],
//! [`Arena::begin_scoped_recorded_run`]): the same blocks, errors,
//! statistics, reports and recordings as a dynamic [`Run`](tensor_arena::Run)
//! doing the same thing, and a recording that plans the scoped runs after it.

use crate::common::Counting;
use crate::scoped::{
    base_script, comparable, ev, learned, run_outcome, scope_outcome, through_run, through_scope,
    Ev, Outcome, Seen,
};
use proptest::prelude::*;
use std::sync::Arc;
use tensor_arena::{Arena, ArenaConfig, ArenaError, HostMemory, Plan, ScopedBlock};

/// `script` as a dynamic [`Run`](tensor_arena::Run), recorded or not.
fn through_dynamic_run<M: HostMemory>(
    arena: &Arena<M>,
    record: bool,
    anchor: Option<usize>,
    script: &[Ev],
) -> Outcome {
    let r = if record {
        arena.begin_recorded_run()
    } else {
        arena.begin_run()
    };
    run_outcome(arena, r, anchor, script)
}

/// `script` as a dynamic [`ScopedRun`](tensor_arena::ScopedRun), recorded
/// or not; `check` sees each block.
fn through_dynamic_scope<M: HostMemory>(
    arena: &mut Arena<M>,
    record: bool,
    anchor: Option<usize>,
    script: &[Ev],
    check: impl FnMut(&ScopedBlock<'_, '_, M>),
) -> Outcome {
    let r = if record {
        arena.begin_scoped_recorded_run()
    } else {
        arena.begin_scoped_dynamic_run()
    }
    .unwrap();
    assert!(r.plan().is_none() && !r.on_tape());
    let (seen, report, recording, on_tape) = scope_outcome(r, anchor, script, check);
    assert!(!on_tape);
    Outcome {
        seen,
        report,
        recording,
        after: comparable(arena.stats()),
    }
}

/// Runs `history` recorded on two fresh arenas, then `script` on one as a
/// dynamic run and on the other as a dynamic scoped run, and checks that
/// both showed the same. A recorded script's recording then plans the next
/// runs of both alike, the scoped one serving that plan itself to the end.
fn same_both_ways(history: &[Ev], script: &[Ev], record: bool) -> Outcome {
    let (run_arena, _, run_anchor) = learned(history);
    let (mut scoped_arena, _, anchor) = learned(history);
    let by_run = through_dynamic_run(&run_arena, record, run_anchor, script);
    // A span holds the request rounded up to the granule.
    let granule = ArenaConfig::default().alignment;
    let by_scope = through_dynamic_scope(&mut scoped_arena, record, anchor, script, |b| {
        assert_eq!(b.capacity(), b.len().div_ceil(granule) * granule);
    });
    assert_eq!(by_run, by_scope);
    assert!(!by_scope.report.planned && !by_scope.report.deviated);
    if !record {
        assert!(by_scope.recording.is_empty());
        return by_scope;
    }
    let plan = Arc::new(Plan::from_recording(&by_scope.recording).expect("a recorded run plans"));
    let run_plan = Arc::new(Plan::from_recording(&by_run.recording).expect("a recorded run plans"));
    assert_eq!(*plan, *run_plan);
    let again_run = through_run(&run_arena, &run_plan, run_anchor, script);
    let (again_scope, on_tape) = through_scope(&mut scoped_arena, &plan, anchor, script);
    assert_eq!(again_run, again_scope);
    // (A plan with no block, from a run with none, serves nothing.)
    assert_eq!(again_scope.report.planned, plan.size() > 0);
    assert!(!again_scope.report.deviated);
    assert_eq!(
        on_tape,
        plan.size() > 0,
        "a run that follows its plan left it"
    );
    by_scope
}

#[test]
fn a_dynamic_scoped_run_places_and_reports_like_a_run() {
    let base = base_script();
    for record in [false, true] {
        let outcome = same_both_ways(&base, &base, record);
        assert_eq!(outcome.report.allocs, 6);
        assert_eq!(outcome.report.frees, 6);
        assert_eq!(outcome.after.in_use, 0);
        assert_eq!(outcome.recording.is_empty(), !record);
    }
    // On a fresh arena too (no history): the first block anchors both.
    same_both_ways(&[], &base, true);
}

#[test]
fn bad_requests_are_errors_and_change_nothing() {
    let mut arena = Arena::new(ArenaConfig::default());
    let r = arena.begin_scoped_dynamic_run().unwrap();
    let a = r.try_alloc(4096).unwrap();
    let before = r.stats();
    assert!(matches!(
        r.try_alloc_aligned(64, 3),
        Err(ArenaError::InvalidAlignment { align: 3 })
    ));
    assert!(matches!(
        r.try_alloc_aligned(64, 1 << 40),
        Err(ArenaError::AlignmentTooLarge { .. })
    ));
    assert!(matches!(
        r.try_alloc(usize::MAX - 10),
        Err(ArenaError::CapacityOverflow { .. })
    ));
    assert!(matches!(
        r.try_alloc_aligned(0, 3),
        Err(ArenaError::InvalidAlignment { align: 3 })
    ));
    assert_eq!(r.stats(), before);
    // A zero-size block holds no memory and is not an allocation.
    let empty = r.try_alloc(0).unwrap();
    assert!(empty.is_empty() && empty.capacity() == 0);
    assert_eq!(r.stats(), before);
    drop((a, empty));
    let report = r.finish();
    assert_eq!((report.allocs, report.frees), (1, 1));
}

#[test]
fn over_its_cap_a_dynamic_scoped_run_refuses_and_loses_nothing() {
    let mut arena = Arena::new(ArenaConfig {
        max_reserved: 2 << 20,
        ..ArenaConfig::default()
    });
    let r = arena.begin_scoped_dynamic_run().unwrap();
    let mut a = r.try_alloc(1 << 20).unwrap();
    a.fill(7);
    let before = r.stats();
    assert!(matches!(
        r.try_alloc(4 << 20),
        Err(ArenaError::OverCap { .. })
    ));
    assert_eq!(r.stats(), before);
    assert!(a.iter().all(|&x| x == 7));
    // A smaller request still succeeds.
    let b = r.try_alloc(512 << 10).unwrap();
    drop((a, b));
    r.finish();
    let s = arena.stats();
    assert_eq!(s.in_use, 0);
    assert!(s.reserved <= 2 << 20);
}

#[test]
fn dropping_a_dynamic_scoped_run_closes_it_and_a_forgotten_block_stays_live() {
    let mut arena = Arena::new(ArenaConfig::default());
    {
        let r = arena.begin_scoped_dynamic_run().unwrap();
        let _a = r.try_alloc(4096).unwrap();
    }
    let s = arena.stats();
    assert_eq!((s.in_use, s.runs), (0, 1));
    // A block that is never dropped is never freed: its memory stays out of
    // the pool (leaked, never handed out twice), and the run reports it.
    let r = arena.begin_scoped_dynamic_run().unwrap();
    let mut kept = r.try_alloc(8192).unwrap();
    kept.fill(9);
    let ptr = kept.as_ptr();
    core::mem::forget(kept);
    let report = r.finish();
    assert_eq!((report.leaked_blocks, report.leaked_bytes), (1, 8192));
    assert_eq!(arena.stats().in_use, 8192);
    let next = arena.try_alloc(8192).unwrap();
    assert_ne!(next.as_ptr(), ptr);
}

#[test]
fn an_executor_uses_scoped_runs_for_every_run() {
    // The first run of each shape is recorded, later ones follow its plan;
    // in steady state no run calls the memory layer.
    let shapes = [base_script(), base_script()[..7].to_vec()];
    let mut arena = Arena::new(ArenaConfig::default());
    let mut plans: Vec<Option<Arc<Plan>>> = vec![None, None];
    let mut calls_after_warmup = None;
    for round in 0..4 {
        for (shape, script) in shapes.iter().enumerate() {
            let run = match &plans[shape] {
                Some(plan) => arena.begin_scoped_run(plan).unwrap(),
                None => arena.begin_scoped_recorded_run().unwrap(),
            };
            let mut live: Vec<ScopedBlock<'_, '_>> = Vec::new();
            for ev in script {
                match *ev {
                    Ev::Alloc(len, align) => live.push(run.try_alloc_aligned(len, align).unwrap()),
                    Ev::Free(i) if !live.is_empty() => drop(live.remove(i % live.len())),
                    _ => {}
                }
            }
            drop(live);
            let planned = run.plan().is_some();
            assert_eq!(run.on_tape(), planned);
            let (report, recording) = run.finish_with_recording();
            assert_eq!(report.planned, planned);
            assert!(!report.deviated);
            if !planned {
                plans[shape] = Some(Arc::new(Plan::from_recording(&recording).unwrap()));
            }
        }
        let s = arena.stats();
        let calls = (s.backing_allocs, s.commits, s.decommits);
        if round == 1 {
            calls_after_warmup = Some(calls);
        } else if round > 1 {
            assert_eq!(
                Some(calls),
                calls_after_warmup,
                "a steady run called the memory layer"
            );
        }
        assert_eq!(s.in_use, 0);
    }
}

#[test]
fn on_heap_regions_a_dynamic_scoped_run_reports_like_a_run_and_returns_everything() {
    // Memory that grows by regions (`Heap`): a growth adds a region, and the
    // run's high-water mark is simulated from its log. Regions lie anywhere,
    // so places are compared by length only; everything else the runs show
    // must agree, and dropping each arena gives back every byte it took.
    let mut script = base_script();
    script.extend([
        Ev::Alloc(8 << 20, 64),
        Ev::Stats,
        Ev::Alloc(3 << 20, 1),
        Ev::Free(0),
        Ev::Stats,
    ]);
    let lengths = |seen: Vec<Seen>| -> Vec<Seen> {
        seen.into_iter()
            .map(|s| match s {
                Seen::Block(_, len) => Seen::Block(0, len),
                other => other,
            })
            .collect()
    };
    let (run_counting, scope_counting) = (Counting::default(), Counting::default());
    {
        let run_arena = Arena::with_backing(ArenaConfig::default(), &run_counting);
        let mut scoped_arena = Arena::with_backing(ArenaConfig::default(), &scope_counting);
        for record in [true, false, true] {
            let mut by_run = through_dynamic_run(&run_arena, record, None, &script);
            let mut by_scope =
                through_dynamic_scope(&mut scoped_arena, record, None, &script, |_| {});
            by_run.seen = lengths(by_run.seen);
            by_scope.seen = lengths(by_scope.seen);
            assert_eq!(by_run, by_scope);
            assert!(
                by_scope.after.backing_allocs >= 2,
                "the script grew the arena"
            );
        }
    }
    for c in [&run_counting, &scope_counting] {
        assert_eq!(c.outstanding.get(), 0, "memory not returned after drop");
        assert_eq!(c.allocs.get(), c.frees.get());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: crate::common::cases(128), ..ProptestConfig::default() })]

    /// Whatever a dynamic run does, a dynamic scoped run with the same
    /// history shows exactly the same: blocks at the same places, errors,
    /// statistics at every point, report, recording and the arena
    /// afterwards; no block is overwritten while live; and a recorded one
    /// plans the next runs alike.
    #[test]
    fn a_dynamic_scoped_run_is_a_run(
        history in prop::collection::vec(ev(), 0..20),
        script in prop::collection::vec(ev(), 0..40),
        record in any::<bool>(),
    ) {
        same_both_ways(&history, &script, record);
    }
}
