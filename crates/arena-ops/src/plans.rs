//! [`plans`]: arbitrary recordings and plans, built from fuzz bytes or
//! deserialized from arbitrary JSON, fed to planned runs.
//!
//! Whatever comes in, a plan is either refused with an error or serves runs
//! whose live blocks never overlap and each lie inside the plan's block.
//! After every step of a run the checker compares every pair of live
//! blocks' address ranges, re-reads their fill patterns, and checks that
//! each block served from the plan sits at its planned offset from one
//! common base, inside `base..base + plan.size()`.

use crate::checks;
use crate::slots::{check, free_slot, recording, Live, MAX_EVENTS};
use crate::Counting;
use arbitrary::{Arbitrary, Unstructured};
use std::sync::Arc;
use tensor_arena::plan::{PlanEvent, PlanParts};
use tensor_arena::{
    Arena, ArenaConfig, Block, FreeError, Handle, Heap, Plan, RawArena, Recording, RunReport,
    ScopedBlock,
};

/// Runs one fuzz input: the first byte chooses how the rest is read.
/// - 7 modulo 8: a plan family (the private `families` module): a run
///   structure, sizes as functions of a key, and runs at keys from the
///   bytes, planned exactly, predicted or not at all;
/// - even: as JSON text, deserialized both as a [`Plan`] and as a
///   [`Recording`] (then planned with [`Plan::from_recording`]);
/// - odd: as structured data: a recording, and offsets, size, alignment and
///   lower bound for [`Plan::from_parts`] (mostly near the planner's own,
///   so that deep checks are reached), followed by the run's steps.
///
/// Each plan accepted is served by a planned run (`drive`).
///
/// # Panics
/// When a check fails: overlapping live blocks, a block outside its plan's
/// block or away from its offset, a fill pattern overwritten, or memory not
/// returned after the arena drops.
pub fn plans(data: &[u8]) {
    plans_reported(data);
}

/// [`plans`], returning what a plan family input's runs were served as
/// (`None` for other inputs, and for a family input whose bytes make no
/// valid run structure): for checking that a corpus reaches families.
pub fn plans_reported(data: &[u8]) -> crate::families::FamilyRuns {
    let (&mode, rest) = data.split_first()?;
    if mode % 8 == 7 {
        return crate::families::families(&mut Unstructured::new(rest));
    }
    if mode % 2 == 0 {
        if let Ok(plan) = serde_json::from_slice::<Plan>(rest) {
            check_accepted(&plan);
            drive(&plan, &mut Unstructured::new(&[]));
            scoped_alike(&plan, &mut Unstructured::new(&[]));
            stale_handles(&plan);
        }
        if let Ok(rec) = serde_json::from_slice::<Recording>(rest) {
            if let Ok(plan) = Plan::from_recording(&rec) {
                check_accepted(&plan);
                drive(&plan, &mut Unstructured::new(rest));
            }
        }
        return None;
    }
    let mut u = Unstructured::new(rest);
    let Ok(rec) = recording(&mut u) else {
        return None;
    };
    match Plan::from_recording(&rec) {
        Ok(plan) => {
            check_accepted(&plan);
            // The same plan through its serialized form, perhaps tampered.
            if let Ok(parts) = tamper(&plan, &mut u) {
                if let Ok(other) = Plan::from_parts(parts) {
                    check_accepted(&other);
                    drive(&other, &mut u);
                    scoped_alike(&other, &mut u);
                }
            }
            drive(&plan, &mut u);
            scoped_alike(&plan, &mut u);
            stale_handles(&plan);
        }
        Err(_) => assert!(rec.validate().is_err(), "refused a valid recording"),
    }
    None
}

/// A plan that was accepted must pass its own check again.
fn check_accepted(plan: &Plan) {
    if let Err(e) = plan.validate() {
        panic!("an accepted plan fails validation: {e}");
    }
}

/// The plan's parts, each field perhaps changed a little or a lot.
fn tamper(plan: &Plan, u: &mut Unstructured<'_>) -> arbitrary::Result<PlanParts> {
    let mut parts = PlanParts {
        recording: plan.recording(),
        offsets: (0..plan.len()).filter_map(|i| plan.offset(i)).collect(),
        size: plan.size(),
        align: plan.align(),
        lower_bound: plan.lower_bound(),
    };
    let what = u8::arbitrary(u)?;
    let delta = usize::from(u16::arbitrary(u)?);
    match what % 8 {
        0 => {}
        1 if !parts.offsets.is_empty() => {
            let i = delta % parts.offsets.len();
            parts.offsets[i] = parts.offsets[i].wrapping_add(delta & !63);
        }
        2 if !parts.offsets.is_empty() => {
            let i = delta % parts.offsets.len();
            parts.offsets[i] = 0;
        }
        3 => parts.size = parts.size.wrapping_add(delta).wrapping_sub(delta / 2),
        4 => parts.align = 1 << (delta % 40),
        5 => parts.lower_bound = delta,
        6 => parts.offsets.truncate(delta % (parts.offsets.len() + 1)),
        _ => {
            // Both offsets of two blocks set equal: overlapping, unless
            // they never live at once.
            if parts.offsets.len() >= 2 {
                let (i, j) = (
                    delta % parts.offsets.len(),
                    (delta / 7) % parts.offsets.len(),
                );
                parts.offsets[i] = parts.offsets[j];
            }
        }
    }
    Ok(parts)
}

/// Serves a planned run of `plan`: follows its events, and with the bytes
/// of `u` sometimes asks for less or more than recorded, adds blocks, or
/// frees out of order (deviations). Checks after every step.
pub(crate) fn drive(plan: &Plan, u: &mut Unstructured<'_>) {
    let counting = Counting::new();
    {
        let config = ArenaConfig {
            max_reserved: 64 << 20,
            ..ArenaConfig::default()
        };
        let arena = Arena::with_backing(config, &counting);
        let deviations = arena.stats().deviations;
        let Ok(run) = arena.begin_planned_run(Arc::new(plan.clone())) else {
            // Over the cap, or an alignment over the arena's maximum.
            return;
        };
        let rec = plan.recording();
        // Blocks of the recording by index, then blocks it never recorded.
        let mut live: Vec<Option<Live<'_, '_>>> = Vec::new();
        let mut extras: Vec<Live<'_, '_>> = Vec::new();
        let mut base: Option<usize> = None;
        // Blocks served from the plan so far: the next one gets this index.
        let mut served = 0usize;
        let mut step = 0u8;
        for ev in rec.events.iter().take(MAX_EVENTS) {
            step = step.wrapping_add(1);
            let tweak = u8::arbitrary(u).unwrap_or(0);
            match *ev {
                PlanEvent::Alloc(i) => {
                    let (size, align) = rec.blocks[i as usize];
                    let len = match tweak % 16 {
                        0 => size / 2 + 1,
                        1 => size + 64,
                        _ => size,
                    };
                    let before = arena.stats().planned_allocs;
                    let left_before = arena.stats().deviations > deviations;
                    let Ok(mut block) = arena.try_alloc_aligned(len, align.min(4096)) else {
                        live.push(None);
                        continue;
                    };
                    block.fill(step);
                    if arena.stats().planned_allocs > before {
                        // Served from the plan: as its next block, whatever
                        // this event was (an extra block may have taken an
                        // earlier one's place).
                        // A block that makes the run leave its plan may be
                        // moved as well.
                        let left = left_before || arena.stats().deviations > deviations;
                        check_planned(
                            plan,
                            &mut base,
                            &mut served,
                            left,
                            block.as_ptr() as usize,
                            block.len(),
                        );
                    }
                    live.push(Some(Live { block, fill: step }));
                    if tweak % 16 == 2 {
                        // An extra block the plan never recorded (it may be
                        // served as the plan's next block).
                        let before = arena.stats().planned_allocs;
                        if let Ok(mut extra) = arena.try_alloc(64 + usize::from(tweak)) {
                            if arena.stats().planned_allocs > before {
                                let left = arena.stats().deviations > deviations;
                                check_planned(
                                    plan,
                                    &mut base,
                                    &mut served,
                                    left,
                                    extra.as_ptr() as usize,
                                    extra.len(),
                                );
                            }
                            extra.fill(!step);
                            extras.push(Live {
                                block: extra,
                                fill: !step,
                            });
                        }
                    }
                }
                // Now and then some other block instead: out of order.
                PlanEvent::Free(i) => {
                    free_slot(
                        &mut live,
                        i,
                        (tweak % 16 == 3).then_some(usize::from(tweak)),
                    );
                }
            }
            check(live.iter().flatten().chain(&extras));
        }
        drop(extras);
        drop(live);
        let _report = run.finish();
        assert_eq!(
            arena.stats().in_use,
            0,
            "bytes in use after every block dropped"
        );
    }
    assert_eq!(counting.outstanding(), 0, "memory not returned after drop");
}

/// One step of [`scoped_alike`]'s script.
#[derive(Clone, Copy, Debug)]
enum Step {
    Alloc(usize, usize),
    /// Free the `k % live`th live block.
    Free(usize),
}

/// The script [`scoped_alike`] runs both ways: `plan`'s events, with the
/// bytes of `u` sometimes asking for less or more than recorded, adding
/// blocks or freeing out of order.
fn script(plan: &Plan, u: &mut Unstructured<'_>) -> Vec<Step> {
    let rec = plan.recording();
    let mut order: Vec<u32> = Vec::new();
    let mut steps = Vec::new();
    for ev in rec.events.iter().take(MAX_EVENTS) {
        let tweak = u8::arbitrary(u).unwrap_or(0);
        match *ev {
            PlanEvent::Alloc(i) => {
                let (size, align) = rec.blocks[i as usize];
                let len = match tweak % 16 {
                    0 => size / 2 + 1,
                    1 => size + 64,
                    _ => size,
                };
                steps.push(Step::Alloc(len, align.min(4096)));
                order.push(i);
                if tweak % 16 == 2 {
                    steps.push(Step::Alloc(64 + usize::from(tweak), 1));
                    order.push(u32::MAX);
                }
            }
            PlanEvent::Free(_) if tweak % 16 == 3 => steps.push(Step::Free(usize::from(tweak))),
            PlanEvent::Free(i) => {
                if let Some(k) = order.iter().position(|&x| x == i) {
                    order.remove(k);
                    steps.push(Step::Free(k));
                }
            }
        }
    }
    steps
}

/// What one way of running a script showed: each allocation's place
/// relative to the first block (or `None`, refused), the report and the
/// recording.
type Shown = (Vec<Option<(isize, usize)>>, RunReport, Recording);

/// Runs `plan`'s events (tweaked by `u`) on two fresh arenas of the default
/// layer (one reservation, so that places compare), once by a planned run
/// and a scoped run ([`ScopedRun`](tensor_arena::ScopedRun)) of `plan`, and
/// once by a recorded dynamic run and a recorded dynamic scoped run: each
/// time, every block lies at the same place relative to the first, every
/// request is refused or served alike, and the reports and recordings
/// agree; the scoped run's live blocks never overlap and keep their fill
/// patterns.
fn scoped_alike(plan: &Plan, u: &mut Unstructured<'_>) {
    let steps = script(plan, u);
    // Each run on a copy of the plan as given: a run may mark the plan it
    // served (`Plan::mark_sizes_vary`: a block came larger), and the
    // scoped run after it would then be served as a later run is.
    let fresh = || Arc::new(plan.clone());
    let config = ArenaConfig {
        max_reserved: 64 << 20,
        ..ArenaConfig::default()
    };
    for planned in [true, false] {
        let by_run: Option<Shown> = {
            let arena = Arena::try_new(config).expect("a valid configuration");
            let run = if planned {
                arena.begin_planned_run(fresh())
            } else {
                arena.try_begin_recorded_run()
            };
            run.ok().map(|run| {
                let mut shown = Vec::new();
                let mut first = None;
                let mut live: Vec<Block<'_>> = Vec::new();
                for step in &steps {
                    match *step {
                        Step::Alloc(len, align) => match arena.try_alloc_aligned(len, align) {
                            Ok(b) => {
                                let at = b.as_ptr() as isize;
                                let from = *first.get_or_insert(at);
                                shown.push(Some((at - from, b.len())));
                                live.push(b);
                            }
                            Err(_) => shown.push(None),
                        },
                        Step::Free(k) if !live.is_empty() => {
                            let k = k % live.len();
                            live.remove(k);
                        }
                        Step::Free(_) => {}
                    }
                }
                drop(live);
                let (report, recording) = run.finish_with_recording();
                (shown, report, recording)
            })
        };
        let mut arena = Arena::try_new(config).expect("a valid configuration");
        let scoped_plan = fresh();
        let run = if planned {
            arena.begin_scoped_run(&scoped_plan)
        } else {
            arena.begin_scoped_recorded_run()
        };
        let by_scope: Option<Shown> = run.ok().map(|run| {
            let mut shown = Vec::new();
            let mut first = None;
            let mut live: Vec<(ScopedBlock<'_, '_>, u8)> = Vec::new();
            for (n, step) in steps.iter().enumerate() {
                match *step {
                    Step::Alloc(len, align) => match run.try_alloc_aligned(len, align) {
                        Ok(mut b) => {
                            let at = b.as_ptr() as isize;
                            let from = *first.get_or_insert(at);
                            shown.push(Some((at - from, b.len())));
                            let fill = n as u8 ^ 0x3c;
                            b.fill(fill);
                            live.push((b, fill));
                        }
                        Err(_) => shown.push(None),
                    },
                    Step::Free(k) if !live.is_empty() => {
                        let k = k % live.len();
                        live.remove(k);
                    }
                    Step::Free(_) => {}
                }
                let mut ranges: Vec<(usize, usize)> = live
                    .iter()
                    .filter(|(b, _)| !b.is_empty())
                    .map(|(b, _)| (b.as_ptr() as usize, b.as_ptr() as usize + b.len()))
                    .collect();
                checks::disjoint(&"scoped", "live blocks", &mut ranges);
                for (b, fill) in &live {
                    assert!(
                        b.iter().all(|x| x == fill),
                        "a scoped run's live block was overwritten"
                    );
                }
            }
            drop(live);
            let (report, recording) = run.finish_with_recording();
            (shown, report, recording)
        });
        match (by_run, by_scope) {
            (Some(by_run), Some(by_scope)) => {
                assert_eq!(by_run.0, by_scope.0, "a scoped run placed blocks elsewhere");
                assert_eq!(by_run.1, by_scope.1, "a scoped run reported otherwise");
                assert_eq!(by_run.2, by_scope.2, "a scoped run recorded otherwise");
            }
            (None, None) => {}
            _ => panic!("a run and a scoped run began differently"),
        }
        assert_eq!(arena.stats().in_use, 0);
    }
}

/// Two planned runs of `plan` on the core ([`RawArena`], whose handles are
/// `Copy`): during the second, every handle of the first (freed, its places
/// now serving the second run's blocks) is refused as freed already, and
/// every handle of the second is refused by another arena; neither changes
/// a live block.
fn stale_handles(plan: &Plan) {
    let counting = Counting::new();
    {
        let config = ArenaConfig {
            max_reserved: 64 << 20,
            ..ArenaConfig::default()
        };
        let mut core = RawArena::new(config, Heap::new(&counting)).expect("a valid configuration");
        let mut other = RawArena::new(ArenaConfig::default(), Heap::new(&counting))
            .expect("a valid configuration");
        let plan = Arc::new(plan.clone());
        let rec = plan.recording();
        let mut first: Vec<Handle> = Vec::new();
        for round in 0..2 {
            if core.begin_run(Some(Arc::clone(&plan)), false).is_err() {
                return;
            }
            let mut live: Vec<Option<Handle>> = Vec::new();
            for (step, ev) in rec.events.iter().take(MAX_EVENTS).enumerate() {
                match *ev {
                    PlanEvent::Alloc(i) => {
                        let (size, align) = rec.blocks[i as usize];
                        let got = core.alloc(size, align.min(4096)).ok().map(|a| a.handle);
                        live.push(got);
                    }
                    PlanEvent::Free(i) => {
                        if let Some(h) = live.get_mut(i as usize).and_then(Option::take) {
                            core.free(h).expect("a live handle frees");
                            if round == 0 {
                                first.push(h);
                            }
                        }
                    }
                }
                if round == 1 {
                    let in_use = core.stats().in_use;
                    if !first.is_empty() {
                        let h = first[step % first.len()];
                        assert_eq!(
                            core.free(h),
                            Err(FreeError::AlreadyFree),
                            "a stale handle freed"
                        );
                    }
                    for h in live.iter().flatten() {
                        assert!(core.capacity(*h) > 0, "a live block was lost");
                        assert_eq!(
                            other.free(*h),
                            Err(FreeError::Foreign),
                            "a foreign handle freed"
                        );
                    }
                    assert_eq!(
                        core.stats().in_use,
                        in_use,
                        "a refused free changed the arena"
                    );
                }
            }
            for h in live.into_iter().flatten() {
                core.free(h).expect("a live handle frees");
                if round == 0 {
                    first.push(h);
                }
            }
            core.finish_run();
        }
        assert_eq!(core.stats().in_use, 0);
        drop(other);
    }
    assert_eq!(counting.outstanding(), 0, "memory not returned after drop");
}

/// A block served from `plan` as its block number `*served` sits at that
/// block's offset from the plan block's base (the same for every block),
/// inside the plan's block; once the run has `left` its plan (it is then
/// repaired in place: a block may be moved), anywhere inside the block.
fn check_planned(
    plan: &Plan,
    base: &mut Option<usize>,
    served: &mut usize,
    left: bool,
    at: usize,
    len: usize,
) {
    let i = *served;
    *served += 1;
    if left {
        if let Some(b) = *base {
            // The block's bytes: the plan's, to the pool's granule.
            let block = plan.size().next_multiple_of(4096);
            assert!(
                at >= b && at + len <= b + block,
                "block {i} outside the plan's block"
            );
        }
        return;
    }
    let offset = plan.offset(i).expect("a planned block has an offset");
    let b = *base.get_or_insert(at - offset);
    // A small block where the plan allocates, served beside the plan's
    // block and then found to be the plan's own, moves the plan past its
    // index: the block served is a later one's, at its offset.
    let (i, offset) = (i..plan.len())
        .filter_map(|j| plan.offset(j).map(|o| (j, o)))
        .find(|&(_, o)| b + o == at)
        .unwrap_or((i, offset));
    *served = i + 1;
    assert_eq!(at, b + offset, "block {i} away from its planned offset");
    assert!(
        offset + len <= plan.size(),
        "block {i} outside the plan's block"
    );
    assert_eq!(b % plan.align(), 0, "plan block misaligned");
}
