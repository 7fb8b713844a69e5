//! Issue 11: no undefined behaviour from safe code. Each reproduction of the
//! review is here; before the fix each one handed out two live blocks on the
//! same bytes, or a block outside its plan's block.

use proptest::prelude::*;
use std::sync::Arc;
use tensor_arena::plan::PlanEvent::{Alloc, Free};
use tensor_arena::plan::{PlanEvent, PlanParts};
use tensor_arena::{Arena, ArenaConfig, Block, Plan, Recording};

fn recording(blocks: &[(usize, usize)], events: &[PlanEvent]) -> Recording {
    Recording {
        blocks: blocks.to_vec(),
        events: events.to_vec(),
    }
}

/// The review's first reproduction: block 1 allocated twice, so its one
/// lifetime starts after block 0 died, and both were planned at offset 0.
#[test]
fn a_block_allocated_twice_is_refused() {
    let rec = recording(
        &[(64, 64), (64, 64)],
        &[Alloc(0), Alloc(1), Free(0), Alloc(1)],
    );
    let err = Plan::from_recording(&rec).unwrap_err();
    assert!(err.reason().contains("Alloc(1)"), "{err}");
    assert!(rec.validate().is_err());
}

#[test]
fn every_malformed_recording_is_refused_with_a_reason() {
    let b = [(64, 64), (64, 64)];
    type Case<'a> = (&'a [(usize, usize)], &'a [PlanEvent], &'a str);
    let cases: &[Case<'_>] = &[
        (&b, &[Alloc(1), Alloc(0)], "index order"),
        (&b, &[Alloc(0)], "only 1 Alloc"),
        (&b[..1], &[Alloc(0), Alloc(1)], "not in `blocks`"),
        (&b, &[Alloc(0), Free(1), Alloc(1)], "not allocated yet"),
        (&b, &[Alloc(0), Free(0), Free(0), Alloc(1)], "already freed"),
        (&[(0, 64)], &[Alloc(0)], "size 0"),
        (&[(64, 48)], &[Alloc(0)], "alignment 48"),
        (&[(64, 0)], &[Alloc(0)], "alignment 0"),
        (&[(1 << 48, 64)], &[Alloc(0)], "size"),
        (&[(64, 1 << 31)], &[Alloc(0)], "alignment"),
    ];
    for (blocks, events, why) in cases {
        let rec = recording(blocks, events);
        match Plan::from_recording(&rec) {
            Ok(plan) => panic!("{rec:?} planned as {plan:?}"),
            Err(e) => assert!(e.reason().contains(why), "{rec:?}: {e} (wanted {why:?})"),
        }
    }
    // The empty recording and a well-formed one plan.
    assert!(Plan::from_recording(&Recording::new()).is_ok());
    let ok = recording(&b, &[Alloc(0), Alloc(1), Free(0), Free(1)]);
    let plan = Plan::from_recording(&ok).unwrap();
    assert_eq!(plan.size(), 128);
}

/// The review's second reproduction: a deserialized plan whose offset lies
/// 1 MiB past its 64-byte block.
#[test]
fn a_deserialized_plan_with_an_offset_outside_its_block_is_refused() {
    let json = r#"{"recording":{"blocks":[[64,64]],"events":[{"Alloc":0}]},
                  "offsets":[1048576],"size":64,"align":64,"lower_bound":64}"#;
    let err = serde_json::from_str::<Plan>(json).unwrap_err();
    assert!(err.to_string().contains("highest end"), "{err}");
}

#[test]
fn a_deserialized_plan_that_overlaps_live_blocks_is_refused() {
    // A valid recording, but both live blocks at offset 0.
    let json = r#"{"recording":{"blocks":[[64,64],[64,64]],"events":[{"Alloc":0},{"Alloc":1}]},
                  "offsets":[0,0],"size":64,"align":64,"lower_bound":128}"#;
    let err = serde_json::from_str::<Plan>(json).unwrap_err();
    assert!(err.to_string().contains("overlap"), "{err}");
    // Each other field is checked too.
    let good = Plan::from_recording(&recording(
        &[(64, 64), (128, 128)],
        &[Alloc(0), Alloc(1), Free(0), Free(1)],
    ))
    .unwrap();
    let text = serde_json::to_string(&good).unwrap();
    assert_eq!(serde_json::from_str::<Plan>(&text).unwrap(), good);
    let parts = |f: &dyn Fn(&mut PlanParts)| {
        let mut p = PlanParts {
            recording: good.recording().clone(),
            offsets: (0..good.len()).map(|i| good.offset(i).unwrap()).collect(),
            size: good.size(),
            align: good.align(),
            lower_bound: good.lower_bound(),
        };
        f(&mut p);
        Plan::from_parts(p)
    };
    assert!(parts(&|_| {}).is_ok());
    for (why, change) in [
        (
            "aligned",
            &(|p: &mut PlanParts| p.offsets[1] += 64) as &dyn Fn(&mut PlanParts),
        ),
        ("offsets for", &|p: &mut PlanParts| {
            p.offsets.pop();
        }),
        ("highest end", &|p: &mut PlanParts| p.size += 1),
        ("align", &|p: &mut PlanParts| p.align = 64),
        ("align", &|p: &mut PlanParts| p.align = 384),
        ("lower_bound", &|p: &mut PlanParts| p.lower_bound = 1),
        ("Free(1)", &|p: &mut PlanParts| {
            p.recording.events.insert(0, Free(1))
        }),
    ] {
        let err = parts(change).unwrap_err();
        assert!(err.reason().contains(why), "{err} (wanted {why:?})");
    }
}

/// A planned run of a plan from JSON never hands out overlapping blocks:
/// the run that follows a valid plan gets every block at its offset.
#[test]
fn a_valid_plan_from_json_serves_disjoint_blocks_inside_its_block() {
    let plan = Plan::from_recording(&recording(
        &[(64, 64), (256, 64), (64, 64)],
        &[Alloc(0), Alloc(1), Free(0), Alloc(2), Free(1), Free(2)],
    ))
    .unwrap();
    let plan: Plan = serde_json::from_str(&serde_json::to_string(&plan).unwrap()).unwrap();
    let arena = Arena::new(ArenaConfig::default());
    let run = arena.begin_planned_run(Arc::new(plan.clone())).unwrap();
    let mut a = run.try_alloc(64).unwrap();
    let mut b = run.try_alloc(256).unwrap();
    a.fill(1);
    b.fill(2);
    assert_eq!(a[0], 1, "a and b share bytes");
    let base = a.as_ptr() as usize - plan.offset(0).unwrap();
    drop(a);
    let mut c = run.try_alloc(64).unwrap();
    c.fill(3);
    assert!(b.iter().all(|&x| x == 2), "c overwrote b");
    for (blk, i) in [(&b, 1), (&c, 2)] {
        let off = blk.as_ptr() as usize - base;
        assert_eq!(off, plan.offset(i).unwrap());
        assert!(off + blk.len() <= plan.size());
    }
    drop((b, c));
    let report = run.finish();
    assert!(report.planned && !report.deviated);
    assert_eq!(report.planned_allocs, 3);
}

/// Through a shared arena's guard, runs and allocations still work; the
/// guard cannot replace the arena (compile_fail doctests on
/// `SharedArena::lock`).
#[test]
fn a_shared_arenas_guard_gives_shared_access_only() {
    let shared = tensor_arena::SharedArena::new(ArenaConfig::default());
    let outside = shared.try_alloc(64).unwrap();
    {
        let guard = shared.lock();
        let arena: &Arena = &guard;
        let run = arena.begin_run();
        let b = run.try_alloc(100).unwrap();
        assert_ne!(b.as_ptr(), outside.as_ptr());
        drop(b);
        run.finish();
    }
    drop(outside);
    assert_eq!(shared.stats().in_use, 0);
}

/// Recordings with sizes and alignments as the arena rounds them (so a run
/// can follow them), in a valid order then perhaps corrupted.
fn arb_recording() -> impl Strategy<Value = Recording> {
    (
        prop::collection::vec((1usize..80, 0u32..2), 0..24),
        prop::collection::vec(any::<(bool, u8)>(), 0..64),
    )
        .prop_map(|(blocks, noise)| {
            let blocks: Vec<(usize, usize)> =
                blocks.into_iter().map(|(s, a)| (s * 64, 64 << a)).collect();
            // Start from a valid order, then corrupt it with `noise`.
            let mut events = Vec::new();
            let mut live: Vec<u32> = Vec::new();
            for i in 0..blocks.len() as u32 {
                events.push(Alloc(i));
                live.push(i);
                if i % 3 == 2 {
                    events.push(Free(live.remove(0)));
                }
            }
            for (alloc, k) in noise {
                let i = u32::from(k) % (blocks.len() as u32 + 2);
                let at = usize::from(k) % (events.len() + 1);
                if alloc {
                    events.insert(at, Alloc(i));
                } else {
                    events.insert(at, Free(i));
                }
                if k % 4 != 0 {
                    break;
                }
            }
            Recording { blocks, events }
        })
}

proptest! {
    /// A valid recording's peak of live bytes, read off its events in one
    /// pass, is the solver's lower bound of its requests (plans and
    /// predictions use the one pass).
    #[test]
    fn peak_live_is_the_solvers_lower_bound(rec in arb_recording()) {
        if rec.validate().is_ok() {
            prop_assert_eq!(
                rec.peak_live(),
                tensor_arena::plan::solver::lower_bound(&rec.requests())
            );
        }
    }

    /// Whatever the recording, a plan made from it never puts two live
    /// blocks on the same bytes, and a run that follows it gets blocks that
    /// keep their contents.
    #[test]
    fn no_recording_yields_overlapping_blocks(rec in arb_recording()) {
        let Ok(plan) = Plan::from_recording(&rec) else {
            prop_assert!(rec.validate().is_err());
            return Ok(());
        };
        prop_assert!(plan.validate().is_ok());
        let arena = Arena::new(ArenaConfig { max_align: 128, ..ArenaConfig::default() });
        let run = arena.begin_planned_run(Arc::new(plan.clone())).unwrap();
        let mut live: Vec<Option<(Block<'_>, u8)>> = (0..rec.blocks.len()).map(|_| None).collect();
        for ev in &rec.events {
            match *ev {
                Alloc(i) => {
                    let (size, align) = rec.blocks[i as usize];
                    let mut b = arena.try_alloc_aligned(size, align).unwrap();
                    b.fill(i as u8);
                    live[i as usize] = Some((b, i as u8));
                }
                Free(i) => {
                    let (b, tag) = live[i as usize].take().unwrap();
                    prop_assert!(b.iter().all(|&x| x == tag), "block {} overwritten", i);
                }
            }
            for (b, tag) in live.iter().flatten() {
                prop_assert!(b.iter().all(|x| x == tag));
            }
        }
        // Blocks never freed in the recording are dropped after its last
        // event, which the plan did not record: that may count as a
        // deviation, but every allocation was served from the plan.
        drop(live);
        let report = run.finish();
        prop_assert_eq!(report.planned_allocs, rec.blocks.len() as u64);
    }
}
