//! Allocation, runs, caching, shrink, leaks and collections.

use crate::common::Counting;
use allocator_api2::vec::Vec as AVec;
use tensor_arena::{Arena, ArenaConfig, Growth, Heap, Relayout, ShrinkPolicy};

/// A run shaped like a small network: a chain of layers whose outputs die
/// one step later, plus one long-lived skip tensor.
fn pattern(arena: &Arena<impl tensor_arena::HostMemory>, scale: usize) -> usize {
    let run = arena.begin_run();
    let skip = run.try_alloc(3000 * scale).unwrap();
    let mut prev = run.try_alloc(10_000 * scale).unwrap();
    for layer in 0..20 {
        let mut next = run.try_alloc((layer % 5 + 1) * 4000 * scale).unwrap();
        next.fill(layer as u8);
        drop(prev);
        prev = next;
    }
    drop(prev);
    drop(skip);
    let report = run.finish();
    assert_eq!(report.leaked_blocks, 0);
    report.high_water
}

#[test]
fn an_empty_arena_allocates_nothing() {
    let counting = Counting::default();
    let arena = Arena::with_backing(ArenaConfig::default(), &counting);
    assert_eq!(arena.stats().reserved, 0);
    drop(arena.begin_run());
    assert_eq!(counting.calls.get(), 0);
}

#[test]
fn blocks_are_aligned_sized_and_writable() {
    let arena = Arena::new(ArenaConfig::default());
    let mut blocks: Vec<_> = (1..50).map(|i| arena.try_alloc(i * 37).unwrap()).collect();
    for (i, b) in blocks.iter_mut().enumerate() {
        assert_eq!(b.as_ptr() as usize % 64, 0);
        assert_eq!(b.len(), (i + 1) * 37);
        assert!(b.capacity() >= b.len() && b.capacity() % 64 == 0);
        b.fill(i as u8);
    }
    for (i, b) in blocks.iter().enumerate() {
        assert!(b.iter().all(|&x| x == i as u8));
    }
    let mut f = arena.try_alloc(64).unwrap();
    f.pod_mut::<f32>().unwrap().copy_from_slice(&[1.5; 16]);
    assert_eq!(f.pod::<f32>().unwrap(), &[1.5; 16]);
    assert!(arena.try_alloc(6).unwrap().pod::<f32>().is_err());
    let big = arena.try_alloc_aligned(100, 4096).unwrap();
    assert_eq!(big.as_ptr() as usize % 4096, 0);
}

#[test]
fn freed_blocks_are_reused_without_backing_calls() {
    let arena = Arena::new(ArenaConfig::default());
    drop(arena.try_alloc(1 << 20).unwrap());
    let before = arena.stats();
    for _ in 0..100 {
        drop(arena.try_alloc(1 << 19).unwrap());
    }
    let after = arena.stats();
    assert_eq!(after.backing_allocs, before.backing_allocs);
    assert_eq!(after.cache_hits, before.cache_hits + 100);
    assert_eq!(after.in_use, 0);
}

#[test]
fn the_same_run_repeated_1000_times_makes_no_backing_call_after_the_first() {
    let counting = Counting::default();
    let arena = Arena::with_backing(ArenaConfig::default(), &counting);
    pattern(&arena, 16);
    let calls = counting.calls.get() + counting.frees.get();
    for _ in 0..1000 {
        pattern(&arena, 16);
    }
    assert_eq!(counting.calls.get() + counting.frees.get(), calls);
    assert_eq!(arena.stats().runs, 1001);
}

#[test]
fn shrink_falls_to_the_small_runs_high_water_mark() {
    let counting = Counting::default();
    let arena = Arena::with_backing(ArenaConfig::default(), &counting);
    let large = pattern(&arena, 64);
    let small = pattern(&arena, 2);
    assert!(small * 10 < large);
    assert!(arena.stats().reserved >= large);
    let released = arena.shrink();
    let stats = arena.stats();
    assert!(released > 0);
    assert_eq!(stats.watermark, small);
    assert!(
        stats.reserved as f64 <= small as f64 * 1.1,
        "reserved {} vs small high water {small}",
        stats.reserved
    );
    let calls = counting.calls.get() + counting.frees.get();
    assert_eq!(pattern(&arena, 2), small);
    assert_eq!(counting.calls.get() + counting.frees.get(), calls);
    assert_eq!(arena.shrink(), 0, "a second shrink releases nothing");
    assert_eq!(arena.shrink_to(0), stats.reserved);
    assert_eq!(arena.stats().reserved, 0);
    drop(arena);
    assert_eq!(counting.allocs.get(), counting.frees.get());
    assert_eq!(counting.outstanding.get(), 0);
}

/// `x` rounded up to the arena's commit step (and alignment).
fn granules<M: tensor_arena::HostMemory>(arena: &Arena<M>, x: usize) -> usize {
    x.next_multiple_of(arena.memory_props().commit_step(x).max(64))
}

fn shrink_policies<M: tensor_arena::HostMemory>(make: impl Fn(ArenaConfig) -> Arena<M>) {
    let arena = make(ArenaConfig {
        shrink_policy: ShrinkPolicy::AfterEveryRun,
        ..ArenaConfig::default()
    });
    let large = pattern(&arena, 64);
    assert!(arena.stats().reserved >= large);
    let small = pattern(&arena, 2);
    assert!(arena.stats().reserved <= granules(&arena, small));

    let arena = make(ArenaConfig {
        shrink_policy: ShrinkPolicy::AfterRunsBelow { runs: 3 },
        ..ArenaConfig::default()
    });
    let large = pattern(&arena, 64);
    pattern(&arena, 2);
    pattern(&arena, 2);
    assert!(
        arena.stats().reserved >= large,
        "two runs below: no shrink yet"
    );
    let small = pattern(&arena, 2);
    assert!(
        arena.stats().reserved <= granules(&arena, small),
        "third run below: shrunk: reserved {} small {small} stats {:?}",
        arena.stats().reserved,
        arena.stats()
    );
    assert_eq!(arena.stats().shrinks, 1);
}

#[test]
fn shrink_policies_shrink_on_their_own() {
    shrink_policies(Arena::new);
    shrink_policies(|cfg| Arena::with_backing(cfg, allocator_api2::alloc::Global));
}

fn watermark_window<M: tensor_arena::HostMemory>(arena: Arena<M>) {
    let large = pattern(&arena, 128);
    pattern(&arena, 1);
    pattern(&arena, 1);
    assert_eq!(arena.stats().watermark, large);
    assert_eq!(arena.shrink(), 0, "the large run is still in the window");
    let small = pattern(&arena, 1);
    assert_eq!(arena.stats().watermark, small);
    assert!(arena.shrink() > 0);
    assert!(arena.stats().reserved <= granules(&arena, small));
}

#[test]
fn watermark_window_covers_recent_runs() {
    let cfg = ArenaConfig {
        watermark_window: 3,
        ..ArenaConfig::default()
    };
    watermark_window(Arena::new(cfg));
    watermark_window(Arena::with_backing(cfg, allocator_api2::alloc::Global));
}

#[test]
fn growth_policies_and_relayout() {
    let exact = ArenaConfig {
        growth: Growth::Exact,
        relayout: Relayout::Never,
        ..ArenaConfig::default()
    };
    // Growth policies and relayout are `Heap`'s: `Pages` grows in place.
    let arena = Arena::with_backing(exact, allocator_api2::alloc::Global);
    let _a = arena.try_alloc(1000).unwrap();
    assert_eq!(arena.stats().reserved, 1024);
    let _b = arena.try_alloc(5000).unwrap();
    assert_eq!(arena.stats().reserved, 1024 + 5056);

    let pow2 = ArenaConfig {
        growth: Growth::PowerOfTwo {
            max_extend: 256 << 10,
        },
        initial_region: 4096,
        ..ArenaConfig::default()
    };
    let arena = Arena::with_backing(pow2, allocator_api2::alloc::Global);
    let _a = arena.try_alloc(100).unwrap();
    assert_eq!(arena.stats().reserved, 4096, "initial region");
    let _b = arena.try_alloc(5000).unwrap();
    assert_eq!(arena.stats().reserved, 4096 + 8192, "next power of two");
    let _c = arena.try_alloc(3 << 20).unwrap();
    assert_eq!(
        arena.stats().reserved,
        4096 + 8192 + (3 << 20) + (256 << 10),
        "extension capped at max_extend past the request"
    );
}

#[test]
fn a_run_that_grew_is_laid_out_again_in_one_region() {
    let arena = Arena::with_backing(ArenaConfig::default(), allocator_api2::alloc::Global);
    let hw = pattern(&arena, 50);
    let s = arena.stats();
    assert_eq!(s.regions, 1);
    assert_eq!(s.reserved, hw);
    assert_eq!(s.relayouts, 1);
}

#[test]
fn a_run_grows_pages_in_place_to_its_high_water_mark() {
    let arena = Arena::new(ArenaConfig::default());
    let hw = pattern(&arena, 50);
    let s = arena.stats();
    assert_eq!(s.regions, 1, "one reservation");
    assert_eq!(s.backing_allocs, 1);
    assert_eq!(s.relayouts, 0, "growth in place needs no relayout");
    assert_eq!(
        s.reserved,
        granules(&arena, hw),
        "committed: the high water mark"
    );
    // Repeating the run (and smaller ones) makes no memory-layer call.
    let calls = s.memory_calls();
    assert_eq!(pattern(&arena, 50), hw);
    assert_eq!(pattern(&arena, 10), pattern(&arena, 10));
    assert_eq!(arena.stats().memory_calls(), calls);
    // A larger run commits only what it needs beyond.
    let hw2 = pattern(&arena, 80);
    assert!(hw2 > hw);
    assert_eq!(arena.stats().reserved, granules(&arena, hw2));
    assert_eq!(arena.stats().backing_allocs, 1, "still the one reservation");
}

#[test]
fn leaked_blocks_are_reported_with_their_location() {
    let arena = Arena::new(ArenaConfig::default());
    let run = arena.begin_run();
    let id = run.id();
    let kept = run.try_alloc(100).unwrap();
    drop(run.try_alloc(200).unwrap());
    let report = run.finish();
    assert_eq!(report.leaked_blocks, 1);
    assert_eq!(report.leaked_bytes, 128);
    let live = arena.live_blocks();
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].run, Some(id));
    assert_eq!(live[0].len, 100);
    assert_eq!(live[0].addr, kept.as_ptr() as usize);
    if cfg!(debug_assertions) {
        let loc = live[0].location.expect("debug builds record locations");
        assert!(loc.file().ends_with("basics.rs"), "{loc}");
    }
    drop(kept);
    assert!(arena.live_blocks().is_empty());
}

#[test]
fn runs_do_not_nest_and_close_on_drop() {
    let arena = Arena::new(ArenaConfig::default());
    let run = arena.begin_run();
    assert!(matches!(
        arena.try_begin_run(),
        Err(tensor_arena::ArenaError::RunAlreadyOpen)
    ));
    let v = run.scratch().alloc_slice_copy(&[1, 2, 3]);
    assert_eq!(v.iter().sum::<i32>(), 6);
    drop(run);
    assert!(!arena.in_run());
    assert_eq!(arena.stats().runs, 1);
    let run = arena.begin_run();
    assert_eq!(run.id(), 2);
    assert!(run.scratch().allocated_bytes() > 0, "scratch chunk is kept");
}

#[test]
fn a_panicking_run_returns_its_blocks() {
    let arena = Arena::new(ArenaConfig::default());
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let run = arena.begin_run();
        let _a = run.try_alloc(1 << 20).unwrap();
        panic!("kernel failed");
    }));
    assert!(result.is_err());
    let s = arena.stats();
    assert_eq!((s.in_use, s.runs), (0, 1));
    assert!(!arena.in_run());
    drop(arena.begin_run().try_alloc(10).unwrap());
}

#[test]
fn collections_live_in_the_arena() {
    let counting = Counting::default();
    let arena = Arena::with_backing(ArenaConfig::default(), &counting);
    {
        let mut v: AVec<u64, &Arena<Heap<&Counting>>> = AVec::new_in(&arena);
        for i in 0..10_000 {
            v.push(i);
        }
        assert_eq!(v.iter().sum::<u64>(), 10_000 * 9_999 / 2);
        let mut map = hashbrown::HashMap::new_in(&arena);
        for i in 0..1000u32 {
            map.insert(i, i * 2);
        }
        assert_eq!(map[&500], 1000);
        assert!(arena.stats().in_use >= 80_000);
        let mut zst: AVec<(), _> = AVec::new_in(&arena);
        zst.extend(std::iter::repeat_n((), 10));
        assert_eq!(zst.len(), 10);
    }
    assert_eq!(arena.stats().in_use, 0);
    drop(arena);
    assert_eq!(counting.outstanding.get(), 0);
}

#[test]
fn dropping_the_arena_returns_every_region() {
    let counting = Counting::default();
    {
        let arena = Arena::with_backing(
            ArenaConfig {
                relayout: Relayout::Never,
                ..ArenaConfig::default()
            },
            &counting,
        );
        let blocks: Vec<_> = (0..30)
            .map(|i| arena.try_alloc(1 << (i % 22)).unwrap())
            .collect();
        assert!(arena.stats().regions > 1);
        drop(blocks);
    }
    assert_eq!(counting.allocs.get(), counting.frees.get());
    assert_eq!(counting.outstanding.get(), 0);
}

/// Before planned runs, `shrink_for_plans` gives back the fragments no
/// plan's block fits: a block that outlived its run (a workspace allocated
/// on first use, say) leaves a fragment below it that a byte target keeps
/// committed for good, while it cuts the top the plan's block needs.
#[test]
fn shrink_for_plans_gives_back_fragments_no_plan_block_fits() {
    use std::sync::Arc;
    use tensor_arena::memory::{HugePages, Pages, PagesConfig};
    use tensor_arena::{Plan, RawArena};
    const MIB: usize = 1 << 20;
    let pages = || {
        Pages::new(PagesConfig {
            reservation: 256 * MIB,
            huge_pages: HugePages::Never,
            ..PagesConfig::default()
        })
    };
    // The same history on two arenas, then a byte target on one and
    // `shrink_for_plans` on the other; then planned runs on both.
    let history = |raw: &mut RawArena<Pages>| {
        let weights = raw.alloc(2 * MIB, 64).unwrap();
        raw.begin_run(None, false).unwrap();
        let x = raw.alloc(8 * MIB, 64).unwrap();
        let workspace = raw.alloc(MIB, 64).unwrap();
        let y = raw.alloc(6 * MIB, 64).unwrap();
        raw.free(x.handle).unwrap();
        raw.free(y.handle).unwrap();
        assert_eq!(raw.finish_run_unrecorded().leaked_blocks, 1);
        // The shape again, recorded: x lands in the fragment, y on top.
        raw.begin_run(None, true).unwrap();
        let x = raw.alloc(8 * MIB, 64).unwrap();
        let y = raw.alloc(6 * MIB, 64).unwrap();
        raw.free(x.handle).unwrap();
        raw.free(y.handle).unwrap();
        let (report, recording) = raw.finish_run();
        assert_eq!(report.leaked_blocks, 0);
        let plan = Arc::new(Plan::from_recording(&recording).unwrap());
        assert_eq!(plan.size(), 14 * MIB);
        assert_eq!(raw.stats().reserved, 17 * MIB);
        (weights, workspace, plan)
    };
    let planned = |raw: &mut RawArena<Pages>, plan: &Arc<Plan>| {
        raw.begin_run(Some(Arc::clone(plan)), false).unwrap();
        let x = raw.alloc(8 * MIB, 64).unwrap();
        let y = raw.alloc(6 * MIB, 64).unwrap();
        raw.free(x.handle).unwrap();
        raw.free(y.handle).unwrap();
        let report = raw.finish_run_unrecorded();
        assert!(report.planned && !report.deviated, "{report:?}");
    };
    let mut by_bytes = RawArena::new(ArenaConfig::default(), pages()).unwrap();
    let (_, _, plan) = history(&mut by_bytes);
    let in_use = by_bytes.stats().in_use;
    by_bytes.shrink_to(in_use + plan.size());
    for _ in 0..3 {
        planned(&mut by_bytes, &plan);
    }
    // The 8 MiB fragment stays, and the block grew the top past it.
    assert_eq!(by_bytes.stats().reserved, 25 * MIB);

    let mut for_plans = RawArena::new(ArenaConfig::default(), pages()).unwrap();
    let (_, _, plan) = history(&mut for_plans);
    let released = for_plans.shrink_for_plans(plan.size());
    // The fragment (8 MiB, too small for the 14 MiB block) goes; the top
    // (6 MiB) stays, short of the block.
    assert_eq!(released, 8 * MIB);
    assert_eq!(for_plans.stats().reserved, 9 * MIB);
    planned(&mut for_plans, &plan);
    let st = for_plans.stats();
    assert_eq!(st.reserved, 3 * MIB + 14 * MIB, "weights, workspace, block");
    let commits = st.commits;
    for _ in 0..3 {
        planned(&mut for_plans, &plan);
    }
    assert_eq!(for_plans.stats().commits, commits, "no commit once planned");
    assert_eq!(for_plans.stats().reserved, 17 * MIB);
    // Nothing more to give: a second call releases nothing.
    assert_eq!(for_plans.shrink_for_plans(plan.size()), 0);
    for_plans.check_invariants();
}

/// `free_bytes` counts only committed free memory: after a shrink leaves
/// decommitted holes inside a free span (`Pages`, in place), free bytes and
/// bytes in use are at most the bytes reserved, as on `Heap` (which gives
/// back whole regions). A small block stays live below a large one freed,
/// so the shrink cannot give back the top alone.
#[test]
fn free_bytes_and_in_use_never_exceed_reserved_after_a_shrink() {
    fn check(st: tensor_arena::Stats, what: &str) {
        assert!(
            st.free_bytes + st.in_use <= st.reserved,
            "{what}: free {} + in use {} > reserved {}",
            st.free_bytes,
            st.in_use,
            st.reserved
        );
    }
    fn exercise<M: tensor_arena::HostMemory>(arena: &Arena<M>, what: &str) {
        let low = arena.try_alloc(64 << 10).unwrap();
        let mid = arena.try_alloc(4 << 20).unwrap();
        let high = arena.try_alloc(64 << 10).unwrap();
        drop(mid);
        check(arena.stats(), what);
        arena.shrink_to(arena.stats().in_use);
        check(arena.stats(), what);
        drop(high);
        check(arena.stats(), what);
        arena.shrink_to(arena.stats().in_use);
        check(arena.stats(), what);
        drop(low);
        arena.shrink_to(0);
        check(arena.stats(), what);
    }
    exercise(&Arena::new(ArenaConfig::default()), "default memory");
    exercise(
        &Arena::with_backing(ArenaConfig::default(), allocator_api2::alloc::Global),
        "Heap",
    );
}
