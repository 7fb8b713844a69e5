//! Scoped runs ([`ScopedRun`]): the same blocks, reports, recordings and
//! statistics as a planned [`Run`](tensor_arena::Run) doing the same
//! thing, whether the run follows its plan or leaves it anywhere.

use crate::common::read_trace;
use core::ops::DerefMut;
use proptest::prelude::*;
use std::sync::Arc;
use tensor_arena::{
    Arena, ArenaConfig, ArenaError, Block, HostMemory, Plan, Recording, Run, RunReport,
    ScopedBlock, ScopedRun, Stats,
};

/// One event of a script.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Ev {
    /// Allocate `len` bytes at `align`.
    Alloc(usize, usize),
    /// Free the live block at this position (modulo the live count).
    Free(usize),
    /// Read the arena's statistics.
    Stats,
}

/// What one event gave: the block's address relative to the anchor and its
/// length, an error, the statistics read, or a free.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    Block(isize, usize),
    Refused(ArenaError),
    Stats(Stats),
    Freed,
}

/// Everything a script's run showed, to compare between the two ways.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub(crate) seen: Vec<Seen>,
    pub(crate) report: RunReport,
    pub(crate) recording: Recording,
    pub(crate) after: Stats,
}

/// `stats` without what depends on the machine's timing, not on the
/// run: commits found slow to take huge pages (one arena may meet a slow
/// patch of memory, or a busy moment, where the other did not).
pub(crate) fn comparable(stats: Stats) -> Stats {
    Stats {
        slow_huge_commits: 0,
        ..stats
    }
}

/// Where block `b` lies relative to `anchor`, which the first block sets
/// if the plan's run had none (a zero-size block's address is only
/// aligned).
fn at(b: &[u8], anchor: &mut Option<usize>) -> Seen {
    match b.len() {
        0 => Seen::Block(0, 0),
        len => {
            let from = *anchor.get_or_insert(b.as_ptr() as usize);
            Seen::Block(b.as_ptr() as isize - from as isize, len)
        }
    }
}

fn fill(b: &mut [u8], seed: u8) {
    b.fill(seed);
}

fn intact(b: &[u8], seed: u8) -> bool {
    b.iter().all(|&x| x == seed)
}

/// An arena that ran `base` once, recorded: its plan and an anchor address
/// (the first block's, if any), the same for every arena made this way.
pub(crate) fn learned(base: &[Ev]) -> (Arena, Arc<Plan>, Option<usize>) {
    let arena = Arena::new(ArenaConfig::default());
    let r = arena.begin_recorded_run();
    let mut live: Vec<Block<'_>> = Vec::new();
    let mut anchor = None;
    for ev in base {
        match *ev {
            Ev::Alloc(len, align) => {
                if let Ok(b) = r.arena().try_alloc_aligned(len, align) {
                    if !b.is_empty() {
                        anchor.get_or_insert(b.as_ptr() as usize);
                    }
                    live.push(b);
                }
            }
            Ev::Free(i) if !live.is_empty() => {
                let at = i % live.len();
                live.remove(at);
            }
            _ => {}
        }
    }
    drop(live);
    let (_, recording) = r.finish_with_recording();
    let plan = Arc::new(Plan::from_recording(&recording).expect("a recorded run plans"));
    (arena, plan, anchor)
}

/// Plays `script`: allocates with `alloc`, hands each block to `check`,
/// fills it, frees blocks as the script says (checking their fill), reads
/// statistics with `stats`; returns what each event showed. Every block is
/// dropped, its fill checked, before it returns.
pub(crate) fn play<B: DerefMut<Target = [u8]>>(
    script: &[Ev],
    mut anchor: Option<usize>,
    mut alloc: impl FnMut(usize, usize) -> Result<B, ArenaError>,
    mut check: impl FnMut(&B),
    mut stats: impl FnMut() -> Stats,
) -> Vec<Seen> {
    let mut live: Vec<(B, u8)> = Vec::new();
    let mut seen = Vec::new();
    for (n, ev) in script.iter().enumerate() {
        match *ev {
            Ev::Alloc(len, align) => match alloc(len, align) {
                Ok(mut b) => {
                    seen.push(at(&b, &mut anchor));
                    check(&b);
                    let seed = n as u8 ^ 0xa5;
                    fill(&mut b, seed);
                    live.push((b, seed));
                }
                Err(e) => seen.push(Seen::Refused(e)),
            },
            Ev::Free(i) if !live.is_empty() => {
                let (b, seed) = live.remove(i % live.len());
                assert!(intact(&b, seed), "event {n}: a block was overwritten");
                seen.push(Seen::Freed);
            }
            Ev::Free(_) => {}
            Ev::Stats => seen.push(Seen::Stats(comparable(stats()))),
        }
    }
    for (b, seed) in live.drain(..) {
        assert!(intact(&b, seed), "a block was overwritten");
    }
    seen
}

/// `script` played in `arena`'s open run `r`, which then finishes.
pub(crate) fn run_outcome<M: HostMemory>(
    arena: &Arena<M>,
    r: Run<'_, M>,
    anchor: Option<usize>,
    script: &[Ev],
) -> Outcome {
    let seen = play(
        script,
        anchor,
        |len, align| r.arena().try_alloc_aligned(len, align),
        |_: &Block<'_, M>| {},
        || arena.stats(),
    );
    let (report, recording) = r.finish_with_recording();
    Outcome {
        seen,
        report,
        recording,
        after: comparable(arena.stats()),
    }
}

/// What a scoped run showed: the events, its report and recording, and
/// whether it still served its steps itself at the end.
pub(crate) type Scoped = (Vec<Seen>, RunReport, Recording, bool);

/// `script` played in the scoped run `r` (each block handed to `check`),
/// which then finishes; the arena's statistics afterwards are the caller's
/// to read once `r` is gone.
pub(crate) fn scope_outcome<M: HostMemory>(
    r: ScopedRun<'_, M>,
    anchor: Option<usize>,
    script: &[Ev],
    check: impl FnMut(&ScopedBlock<'_, '_, M>),
) -> Scoped {
    let seen = play(
        script,
        anchor,
        |len, align| r.try_alloc_aligned(len, align),
        check,
        || r.stats(),
    );
    let on_tape = r.on_tape();
    let (report, recording) = r.finish_with_recording();
    (seen, report, recording, on_tape)
}

/// `script` as a planned [`Run`](tensor_arena::Run).
pub(crate) fn through_run(
    arena: &Arena,
    plan: &Arc<Plan>,
    anchor: Option<usize>,
    script: &[Ev],
) -> Outcome {
    let r = arena.begin_planned_run(Arc::clone(plan)).unwrap();
    run_outcome(arena, r, anchor, script)
}

/// `script` as a [`ScopedRun`](tensor_arena::ScopedRun), and whether the
/// run still served its steps itself at the end.
pub(crate) fn through_scope(
    arena: &mut Arena,
    plan: &Arc<Plan>,
    anchor: Option<usize>,
    script: &[Ev],
) -> (Outcome, bool) {
    let r = arena.begin_scoped_run(plan).unwrap();
    let (seen, report, recording, on_tape) = scope_outcome(r, anchor, script, |b| {
        assert!(b.capacity() >= b.len());
    });
    let outcome = Outcome {
        seen,
        report,
        recording,
        after: comparable(arena.stats()),
    };
    (outcome, on_tape)
}

/// Runs `base` recorded on two fresh arenas, then `script` on one as a
/// planned run and on the other as a scoped run, and checks that both
/// showed the same; returns the scoped run's outcome.
fn same_both_ways(base: &[Ev], script: &[Ev]) -> Outcome {
    let (run_arena, run_plan, run_anchor) = learned(base);
    let (mut scoped_arena, plan, anchor) = learned(base);
    assert_eq!(*run_plan, *plan, "the same history plans the same");
    let by_run = through_run(&run_arena, &run_plan, run_anchor, script);
    let (by_scope, _) = through_scope(&mut scoped_arena, &plan, anchor, script);
    assert_eq!(by_run, by_scope);
    // And the arenas go on alike: the next run follows the plan again,
    // the scoped one on its own reading of the plan to the end (unless the
    // plan has no block to serve from).
    let again_run = through_run(&run_arena, &run_plan, run_anchor, base);
    let (again_scope, on_tape) = through_scope(&mut scoped_arena, &plan, anchor, base);
    assert_eq!(again_run, again_scope);
    assert!(!again_scope.report.deviated);
    assert_eq!(
        on_tape,
        plan.size() > 0,
        "a run that follows its plan left it"
    );
    by_scope
}

/// A script: allocations of mixed sizes, frees in any order.
pub(crate) fn base_script() -> Vec<Ev> {
    vec![
        Ev::Alloc(4096, 1),
        Ev::Alloc(1000, 64),
        Ev::Alloc(70_000, 1),
        Ev::Free(0),
        Ev::Alloc(3000, 128),
        Ev::Free(1),
        Ev::Alloc(1 << 20, 1),
        Ev::Free(2),
        Ev::Free(0),
        Ev::Alloc(64, 1),
        Ev::Free(1),
    ]
}

#[test]
fn a_scoped_run_that_follows_its_plan_serves_it_alone_and_reports_like_a_run() {
    let base = base_script();
    let outcome = same_both_ways(&base, &base);
    assert!(outcome.report.planned && !outcome.report.deviated);
    assert_eq!(outcome.report.planned_allocs, 6);
    assert_eq!(outcome.report.allocs, 6);
    assert!(outcome.recording.is_empty());
    assert_eq!(outcome.after.in_use, 0);
}

#[test]
fn a_scoped_run_stays_on_its_tape_until_an_event_differs() {
    let base = base_script();
    let (mut arena, plan, _) = learned(&base);
    let r = arena.begin_scoped_run(&plan).unwrap();
    assert!(r.on_tape());
    let a = r.try_alloc(4096).unwrap();
    // Statistics bring the arena up to date without leaving the tape.
    let s = r.stats();
    assert_eq!((s.in_use, s.allocs - s.frees), (4096, 1));
    assert!(r.on_tape());
    // A zero-size block needs no memory and is not an event.
    let empty = r.try_alloc(0).unwrap();
    assert!(empty.is_empty() && r.on_tape());
    // The plan's second block is 1,000 bytes at 64 (1,024 held): 900 is
    // smaller (960 held), served from the step's slot on the tape.
    let b = r.try_alloc(900).unwrap();
    assert!(r.on_tape());
    assert_eq!(b.capacity(), 960);
    let s = r.stats();
    assert_eq!((s.in_use, s.allocs - s.frees), (4096 + 960, 2));
    assert!(r.on_tape());
    // The third step holds 70,016 bytes: 80,000 is larger, and the run
    // leaves its tape (the core serves it, the plan followed no more).
    let c = r.try_alloc(80_000).unwrap();
    assert!(!r.on_tape());
    assert_eq!(c.capacity(), 80_000);
    drop((a, b, c, empty));
    let report = r.finish();
    assert!(report.planned && report.deviated);
    assert_eq!(arena.stats().in_use, 0);
}

#[test]
fn bad_requests_are_errors_and_change_nothing() {
    let base = base_script();
    let mut script = vec![
        Ev::Alloc(4096, 3),
        Ev::Alloc(4096, 1 << 20),
        Ev::Alloc(usize::MAX - 10, 1),
        Ev::Alloc(0, 3),
    ];
    script.extend(base.iter().copied());
    let outcome = same_both_ways(&base, &script);
    assert!(matches!(
        outcome.seen[..4],
        [
            Seen::Refused(ArenaError::InvalidAlignment { .. }),
            Seen::Refused(ArenaError::AlignmentTooLarge { .. }),
            Seen::Refused(_),
            Seen::Refused(ArenaError::InvalidAlignment { .. }),
        ]
    ));
    // Refused requests are not deviations: the rest follows the plan.
    assert!(!outcome.report.deviated);
}

#[test]
fn an_arena_over_its_cap_refuses_a_scoped_runs_extra_block() {
    let base = base_script();
    let (_, plan, _) = learned(&base);
    let mut arena = Arena::new(ArenaConfig {
        max_reserved: 2 << 20,
        ..ArenaConfig::default()
    });
    let r = arena.begin_scoped_run(&plan).unwrap();
    let a = r.try_alloc(4096).unwrap();
    let refused = r.try_alloc(4 << 20);
    assert!(matches!(refused, Err(ArenaError::OverCap { .. })));
    drop(a);
    drop(refused);
    assert!(r.finish().deviated);
    let s = arena.stats();
    assert_eq!(s.in_use, 0);
    assert!(s.reserved <= 2 << 20);
}

#[test]
fn dropping_a_scoped_run_closes_it() {
    let base = base_script();
    let (mut arena, plan, _) = learned(&base);
    {
        let r = arena.begin_scoped_run(&plan).unwrap();
        let _a = r.try_alloc(4096).unwrap();
    }
    let s = arena.stats();
    assert_eq!((s.in_use, s.runs), (0, 2));
    let r = arena.begin_scoped_run(&plan).unwrap();
    assert!(r.on_tape());
    r.finish();
}

#[test]
fn a_scoped_run_serves_a_real_trace_like_a_run() {
    // DenseNet-121's first run: 400-odd blocks, frees in graph order.
    let run = &read_trace("densenet121-1x3x224x224.trace")[0];
    let mut ids = Vec::new();
    let script: Vec<Ev> = run
        .events
        .iter()
        .map(|&(alloc, id, bytes)| {
            if alloc {
                ids.push(id);
                Ev::Alloc(bytes, 64)
            } else {
                let at = ids
                    .iter()
                    .position(|&x| x == id)
                    .expect("freed after allocated");
                ids.remove(at);
                Ev::Free(at)
            }
        })
        .collect();
    let outcome = same_both_ways(&script, &script);
    assert!(outcome.report.planned && !outcome.report.deviated);
    // One block of the plan changed halfway: both ways leave the plan there.
    let mut changed = script.clone();
    let half = changed.len() / 2;
    let at = (half..changed.len())
        .find(|&i| matches!(changed[i], Ev::Alloc(..)))
        .expect("an allocation after the middle");
    changed[at] = Ev::Alloc(5 << 20, 64);
    let outcome = same_both_ways(&script, &changed);
    assert!(outcome.report.deviated);
    assert!(!outcome.recording.is_empty());
}

pub(crate) fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        6 => (1usize..20_000, prop::sample::select(vec![1usize, 64, 128, 4096]))
            .prop_map(|(len, align)| Ev::Alloc(len, align)),
        1 => (1usize..(2 << 20)).prop_map(|len| Ev::Alloc(len, 1)),
        1 => Just(Ev::Alloc(0, 1)),
        5 => (0usize..8).prop_map(Ev::Free),
        1 => Just(Ev::Stats),
    ]
}

/// A change to a script: one event replaced, one inserted, two swapped,
/// the tail cut, an allocation made smaller (to `eighths / 8` of its size,
/// at least a byte), as a predicted plan's runs are.
#[derive(Clone, Debug)]
enum Edit {
    Replace(usize, Ev),
    Insert(usize, Ev),
    Swap(usize),
    Cut(usize),
    Shrink(usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), ev()).prop_map(|(i, e)| Edit::Replace(i, e)),
        (any::<usize>(), ev()).prop_map(|(i, e)| Edit::Insert(i, e)),
        any::<usize>().prop_map(Edit::Swap),
        any::<usize>().prop_map(Edit::Cut),
        (any::<usize>(), 0usize..8).prop_map(|(i, e)| Edit::Shrink(i, e)),
    ]
}

fn apply(script: &mut Vec<Ev>, edit: &Edit) {
    let n = script.len();
    match *edit {
        Edit::Replace(i, e) if n > 0 => script[i % n] = e,
        Edit::Insert(i, e) => script.insert(i % (n + 1), e),
        Edit::Swap(i) if n > 1 => script.swap(i % (n - 1), i % (n - 1) + 1),
        Edit::Cut(i) if n > 0 => script.truncate(i % n),
        Edit::Shrink(i, eighths) if n > 0 => {
            if let Ev::Alloc(len @ 1.., align) = script[i % n] {
                script[i % n] = Ev::Alloc((len * eighths / 8).max(1), align);
            }
        }
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: crate::common::cases(128), ..ProptestConfig::default() })]

    /// Whatever a run does against its plan, a scoped run shows exactly
    /// what a planned run shows: the same blocks at the same places, the
    /// same errors, statistics at every point, report and recording, and
    /// the arena afterwards; no block is overwritten while live.
    #[test]
    fn a_scoped_run_is_a_planned_run(
        base in prop::collection::vec(ev(), 1..40),
        edits in prop::collection::vec(edit(), 0..3),
    ) {
        let mut script = base.clone();
        for e in &edits {
            apply(&mut script, e);
        }
        let outcome = same_both_ways(&base, &script);
        if edits.is_empty() {
            prop_assert!(!outcome.report.deviated);
        }
    }

    /// Requests smaller than their steps (a predicted plan's runs) keep a
    /// scoped run on its tape to the end, and it still shows exactly what
    /// a planned run shows, with the smaller sizes in its recording.
    #[test]
    fn smaller_requests_keep_a_scoped_run_on_its_tape(
        base in prop::collection::vec(ev(), 1..40),
        shrinks in prop::collection::vec((any::<usize>(), 0usize..8), 1..6),
    ) {
        let mut script = base.clone();
        // A request at most half its step may be a block the plan does not
        // have: the core serves it beside the plan, pending the next event,
        // and the run goes on off its tape (granule-rounded, as the steps).
        let round = |len: usize| len.div_ceil(64) * 64;
        let mut halved = false;
        for &(i, eighths) in &shrinks {
            apply(&mut script, &Edit::Shrink(i, eighths));
            let at = i % base.len();
            if let (Ev::Alloc(step @ 1.., _), Ev::Alloc(len, _)) = (base[at], script[at]) {
                halved |= round(len) * 2 <= round(step);
            }
        }
        let (_, plan, anchor) = learned(&base);
        let (mut arena, _, _) = learned(&base);
        let (outcome, on_tape) = through_scope(&mut arena, &plan, anchor, &script);
        // A plan with a block to serve from keeps the run on it (zero-size
        // blocks and frees of foreign blocks are no steps).
        if plan.size() > 0 && !outcome.report.deviated && !halved {
            prop_assert!(on_tape);
        }
        same_both_ways(&base, &script);
    }
}

#[test]
fn a_plan_recorded_at_a_finer_granule_is_served_by_the_core_alike() {
    // Sizes rounded to 64 bytes (3,000 -> 3,008) are not multiples of an
    // arena whose granule is 128: the scoped run hands every event to the
    // core, which serves what it can from the plan, as a planned run does.
    let base = base_script();
    let (_, plan, _) = learned(&base);
    let config = ArenaConfig {
        alignment: 128,
        ..ArenaConfig::default()
    };
    let run_arena = Arena::new(config);
    let mut scoped_arena = Arena::new(config);
    let r = scoped_arena.begin_scoped_run(&plan).unwrap();
    assert!(!r.on_tape());
    drop(r);
    drop(run_arena.begin_planned_run(Arc::clone(&plan)).unwrap());
    let by_run = through_run(&run_arena, &plan, None, &base);
    let (by_scope, on_tape) = through_scope(&mut scoped_arena, &plan, None, &base);
    assert_eq!(by_run, by_scope);
    assert!(by_scope.report.planned && !on_tape);
}
