//! The device layer: growth maps chunks at the top, shrink unmaps down to
//! the watermark, planned runs make no driver call, drop returns all.

use crate::common::{assert_device_clean, sim_arena, SMALL};
use tensor_arena_cuda::{CudaError, DeviceConfig, SimConfig, Stream, DEVICE_ALIGN};

const G: usize = 64 << 10;
const S: Stream = Stream::DEFAULT;

#[test]
fn growth_maps_granules_at_the_top_of_one_reservation() {
    let (mut a, sim) = sim_arena(SMALL, DeviceConfig::default());
    assert_eq!(sim.calls().total(), 0, "an empty arena maps nothing");
    let p = a.alloc(100_000, S).unwrap();
    assert_eq!(p.0 % DEVICE_ALIGN as u64, 0);
    assert_eq!(a.size_of(p), Some(100_352), "rounded to 512 bytes");
    assert_eq!(sim.mapped_bytes(), 2 * G);
    let q = a.alloc(200_000, S).unwrap();
    assert!(q.0 >= p.0 + 100_352 || q.0 + 200_192 <= p.0, "overlap");
    let st = a.stats();
    assert_eq!(sim.reservations(), 1);
    assert_eq!(st.calls.address_reserve, 1);
    assert_eq!(st.mapped, sim.mapped_bytes());
    assert_eq!(st.arena.reserved, sim.mapped_bytes());
    assert_eq!(
        sim.mapped_bytes(),
        (100_352 + 200_192usize).next_multiple_of(G)
    );
    // One physical chunk per granule, one access call per commit.
    assert_eq!(st.calls.mem_create as usize, sim.mapped_bytes() / G);
    assert_eq!(st.calls.set_access, st.arena.commits);
    // The blocks are usable device memory.
    sim.write(p, &[7; 100_000]).unwrap();
    sim.write(q, &[9; 200_000]).unwrap();
    assert!(sim.read(p, 100_000).unwrap().iter().all(|&b| b == 7));
    a.free(p, S).unwrap();
    a.free(q, S).unwrap();
    drop(a);
    assert_device_clean(&sim);
}

#[test]
fn shrink_unmaps_down_to_the_watermark() {
    let (mut a, sim) = sim_arena(SMALL, DeviceConfig::default());
    // A big run, then a small one.
    a.begin_run(b"big").unwrap();
    let big: Vec<_> = (0..8).map(|_| a.alloc(1 << 20, S).unwrap()).collect();
    for p in big {
        a.free(p, S).unwrap();
    }
    a.end_run().unwrap();
    let after_big = sim.mapped_bytes();
    assert_eq!(after_big, 8 << 20);
    a.begin_run(b"small").unwrap();
    let small = a.alloc(300_000, S).unwrap();
    a.free(small, S).unwrap();
    a.end_run().unwrap();
    assert_eq!(sim.mapped_bytes(), after_big, "no shrink until asked");
    let released = a.shrink();
    assert_eq!(released, after_big - sim.mapped_bytes());
    let need = 300_032usize.next_multiple_of(G);
    assert_eq!(sim.mapped_bytes(), need, "down to the small run's need");
    assert!(sim.physical_bytes() <= need);
    // The small run again: no driver call.
    let before = sim.calls();
    a.begin_run(b"small").unwrap();
    let small = a.alloc(300_000, S).unwrap();
    a.free(small, S).unwrap();
    a.end_run().unwrap();
    assert_eq!(sim.calls(), before);
    drop(a);
    assert_device_clean(&sim);
}

#[test]
fn a_key_seen_before_is_served_from_its_plan_with_no_driver_call() {
    let (mut a, sim) = sim_arena(SMALL, DeviceConfig::default());
    let sizes = [300_000, 50_000, 1_000_000, 7_000, 400_000];
    let run = |a: &mut tensor_arena_cuda::DeviceArena, key: &[u8], scale: usize| {
        a.begin_run(key).unwrap();
        let mut live = Vec::new();
        for (i, &s) in sizes.iter().enumerate() {
            live.push(a.alloc(s * scale, S).unwrap());
            if i % 2 == 1 {
                let p = live.remove(0);
                a.free(p, S).unwrap();
            }
        }
        for p in live {
            a.free(p, S).unwrap();
        }
        a.end_run().unwrap()
    };
    let first = run(&mut a, b"batch=4", 4);
    assert!(!first.planned);
    run(&mut a, b"batch=1", 1);
    let calls = sim.calls();
    let again = run(&mut a, b"batch=4", 4);
    assert!(again.planned && !again.deviated, "{again:?}");
    assert_eq!(again.planned_allocs, sizes.len() as u64);
    assert_eq!(sim.calls(), calls, "a planned run makes no driver call");
    // The plan's block is the run's lower bound rounded to the alignment.
    assert!(a.stats().plans.hits >= 1);
    drop(a);
    assert_device_clean(&sim);
}

#[test]
fn a_failed_commit_changes_nothing_and_is_an_error() {
    let (mut a, sim) = sim_arena(SMALL, DeviceConfig::default());
    let p = a.alloc(G, S).unwrap();
    let mapped = sim.mapped_bytes();
    // Fail the third chunk of the next growth (and every retry).
    sim.fail_next("cuMemCreate", 100);
    let e = a.alloc(4 * G, S).unwrap_err();
    assert!(matches!(e, CudaError::DeviceMemory { .. }), "{e}");
    assert!(
        e.to_string().contains("cuMemCreate failed with CUresult 2"),
        "{e}"
    );
    assert!(a.last_driver_error().unwrap().contains("cuMemCreate"));
    assert_eq!(sim.mapped_bytes(), mapped, "rolled back");
    assert_eq!(a.stats().out_of_memory, 1);
    sim.fail_next("cuMemCreate", 0);
    sim.fail_next("cuMemSetAccess", 1);
    // A failed access call rolls back the chunks it mapped; the retry works.
    let q = a.alloc(4 * G, S).unwrap();
    assert_eq!(sim.mapped_bytes(), mapped + 4 * G);
    a.free(p, S).unwrap();
    a.free(q, S).unwrap();
    a.check_invariants();
    drop(a);
    assert_device_clean(&sim);
}

#[test]
fn out_of_device_memory_gives_cached_memory_back_and_retries() {
    let sim_config = SimConfig {
        granularity: G,
        memory: 16 << 20,
    };
    let config = DeviceConfig {
        reservation: 64 << 20,
        ..DeviceConfig::default()
    };
    let (mut a, sim) = sim_arena(sim_config, config);
    let big = a.alloc(10 << 20, S).unwrap();
    let pin = a.alloc(G, S).unwrap();
    a.free(big, S).unwrap();
    // 10 MiB cached below a live block; 12 MiB more does not fit the
    // device unless the cache goes.
    let c = a.alloc(12 << 20, S).unwrap();
    assert!(sim.physical_bytes() <= 16 << 20);
    assert_eq!(a.stats().out_of_memory, 0);
    // Truly too much: an error, not a panic.
    let e = a.alloc(15 << 20, S).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("device memory exhausted") && !msg.contains("os error"),
        "{msg}"
    );
    assert_eq!(a.stats().out_of_memory, 1);
    a.free(pin, S).unwrap();
    a.free(c, S).unwrap();
    a.check_invariants();
    drop(a);
    assert_device_clean(&sim);
}

#[test]
fn bad_requests_are_errors() {
    let (mut a, sim) = sim_arena(SMALL, DeviceConfig::default());
    assert!(matches!(a.alloc(0, S), Err(CudaError::ZeroSize)));
    assert!(a.alloc(usize::MAX, S).is_err());
    assert!(a.alloc(1 << 40, S).is_err(), "past the reservation");
    let p = a.alloc(1000, S).unwrap();
    assert!(matches!(
        a.free(tensor_arena_cuda::DevicePtr(p.0 + 512), S),
        Err(CudaError::UnknownPointer { .. })
    ));
    a.free(p, S).unwrap();
    assert!(matches!(
        a.free(p, S),
        Err(CudaError::UnknownPointer { .. })
    ));
    assert!(matches!(a.end_run(), Err(CudaError::NoRun)));
    a.begin_run(b"k").unwrap();
    assert!(a.begin_run(b"k").is_err(), "a run is open");
    a.end_run().unwrap();
    drop(a);
    assert_device_clean(&sim);
}

#[test]
fn dropping_with_live_blocks_returns_everything() {
    let (mut a, sim) = sim_arena(SMALL, DeviceConfig::default());
    let s2 = sim.stream();
    for i in 0..20 {
        let p = a
            .alloc(50_000 * (i + 1), if i % 2 == 0 { S } else { s2 })
            .unwrap();
        if i % 3 == 0 {
            a.free(p, s2).unwrap();
        }
    }
    drop(a);
    assert_device_clean(&sim);
}

#[test]
fn shrink_policies_work_on_the_device() {
    let config = DeviceConfig {
        arena: tensor_arena::ArenaConfig {
            shrink_policy: tensor_arena::ShrinkPolicy::AfterEveryRun,
            ..DeviceConfig::default().arena
        },
        ..DeviceConfig::default()
    };
    let (mut a, sim) = sim_arena(SMALL, config);
    for (key, size) in [(&b"big"[..], 8usize << 20), (b"small", 1 << 20)] {
        a.begin_run(key).unwrap();
        let p = a.alloc(size, S).unwrap();
        a.free(p, S).unwrap();
        let r = a.end_run().unwrap();
        // Every run ends at its own need.
        assert_eq!(r.reserved, size, "{r:?}");
        assert_eq!(sim.mapped_bytes(), size);
    }
    drop(a);
    assert_device_clean(&sim);
}

#[test]
fn learning_a_plan_shrinks_to_what_the_plans_need() {
    let (mut a, sim) = sim_arena(SMALL, DeviceConfig::default());
    // Weights: live outside every run, at the bottom.
    let w = a.alloc(512 << 10, S).unwrap();
    let pass = |a: &mut tensor_arena_cuda::DeviceArena| {
        a.begin_run(b"k").unwrap();
        let x = a.alloc(1 << 20, S).unwrap();
        let y = a.alloc(1 << 20, S).unwrap();
        a.free(x, S).unwrap();
        // Does not fit x's hole: the dynamic layout grows past the need.
        let z = a.alloc(2 << 20, S).unwrap();
        a.free(y, S).unwrap();
        a.free(z, S).unwrap();
        a.end_run().unwrap()
    };
    let first = pass(&mut a);
    assert!(!first.planned);
    let st = a.stats();
    assert_eq!(
        st.last_run_peak_mapped,
        (512 << 10) + (4 << 20),
        "the run's real footprint"
    );
    // The plan needs 3 MiB (y and z live at once) above the weights.
    assert_eq!(st.mapped, (512 << 10) + (3 << 20));
    let calls = sim.calls();
    let again = pass(&mut a);
    assert!(again.planned && !again.deviated, "{again:?}");
    assert_eq!(
        sim.calls(),
        calls,
        "served from the plan with no driver call"
    );
    assert_eq!(a.stats().last_run_peak_mapped, (512 << 10) + (3 << 20));
    a.free(w, S).unwrap();
    drop(a);
    assert_device_clean(&sim);
}

/// What PyTorch does with its cuBLAS workspace: allocated at the first
/// matrix product, inside the first run, and kept for good. It sits above
/// that run's activations; once plans are learned, the free granules below
/// it (a fragment no plan block fits) are unmapped, and what stays mapped
/// is the weights, the workspace and one plan block, which the top holds:
/// planned runs map nothing more and make no driver call.
#[test]
fn a_block_that_outlives_its_run_leaves_no_mapped_fragment_once_planned() {
    let (mut a, sim) = sim_arena(SMALL, DeviceConfig::default());
    let w = a.alloc(G, S).unwrap();
    let mut workspace = None;
    let mut pass = |a: &mut tensor_arena_cuda::DeviceArena| {
        a.begin_run(b"k").unwrap();
        let x = a.alloc(4 * G, S).unwrap();
        if workspace.is_none() {
            workspace = Some(a.alloc(2 * G, S).unwrap());
        }
        let y = a.alloc(3 * G, S).unwrap();
        a.free(x, S).unwrap();
        a.free(y, S).unwrap();
        a.end_run().unwrap()
    };
    let first = pass(&mut a);
    assert_eq!(first.leaked_blocks, 1, "the workspace outlives the run");
    let second = pass(&mut a);
    assert!(!second.planned, "no plan from a run that leaked");
    // The plan: x and y live at once, 7 granules. The 4-granule fragment
    // below the workspace (x's place in the first run) no plan block fits:
    // unmapped. The top (y's 3 granules) stays.
    let st = a.stats();
    assert_eq!(st.plans.plans, 1);
    assert_eq!(st.mapped, G + 2 * G + 3 * G, "the fragment unmapped");
    // The first planned run grows the top to the plan block; from then on
    // nothing more is mapped and no driver call is made.
    let first_planned = pass(&mut a);
    assert!(first_planned.planned && !first_planned.deviated);
    assert_eq!(
        a.stats().mapped,
        G + 2 * G + 7 * G,
        "weights, workspace and one plan block"
    );
    let calls = sim.calls();
    for _ in 0..3 {
        let again = pass(&mut a);
        assert!(again.planned && !again.deviated, "{again:?}");
    }
    assert_eq!(sim.calls(), calls, "planned runs make no driver call");
    assert_eq!(a.stats().mapped, 10 * G);
    // A smaller shape, whose block the fragment would hold: its first run
    // is dynamic (and commits the fragment again); once its plan is
    // learned, its block is taken from the top kept for the larger plan,
    // not from the fragment, which is given back again.
    let small = |a: &mut tensor_arena_cuda::DeviceArena| {
        a.begin_run(b"s").unwrap();
        let p = a.alloc(3 * G, S).unwrap();
        a.free(p, S).unwrap();
        a.end_run().unwrap()
    };
    small(&mut a);
    assert_eq!(a.stats().mapped, 10 * G, "learned: the fragment given back");
    let calls = sim.calls();
    for _ in 0..3 {
        assert!(small(&mut a).planned);
        assert!(pass(&mut a).planned);
    }
    assert_eq!(sim.calls(), calls, "both shapes planned, no driver call");
    assert_eq!(a.stats().mapped, 10 * G);
    a.free(workspace.take().unwrap(), S).unwrap();
    a.free(w, S).unwrap();
    a.check_invariants();
    drop(a);
    assert_device_clean(&sim);
}

#[test]
fn shrink_keeps_what_lives_outside_runs_and_the_last_runs_need() {
    let config = DeviceConfig {
        shrink_to_plans: false,
        ..DeviceConfig::default()
    };
    let (mut a, sim) = sim_arena(SMALL, config);
    // Weights: live outside every run, at the bottom.
    let w = a.alloc(3 << 20, S).unwrap();
    let pass = |a: &mut tensor_arena_cuda::DeviceArena, key: &[u8], n: usize| {
        a.begin_run(key).unwrap();
        let x = a.alloc(n, S).unwrap();
        let y = a.alloc(n, S).unwrap();
        a.free(x, S).unwrap();
        a.free(y, S).unwrap();
        a.end_run().unwrap()
    };
    pass(&mut a, b"big", 4 << 20);
    pass(&mut a, b"small", 1 << 20);
    a.shrink();
    // The weights and the small run's 2 MiB stay mapped.
    assert_eq!(sim.mapped_bytes(), (3 << 20) + (2 << 20));
    let calls = sim.calls();
    pass(&mut a, b"small", 1 << 20);
    assert_eq!(sim.calls(), calls, "the small run again: no driver call");
    a.free(w, S).unwrap();
    drop(a);
    assert_device_clean(&sim);
}

#[test]
fn policies_keep_the_weights_and_repeat_runs_make_no_driver_call() {
    for policy in [
        tensor_arena::ShrinkPolicy::AfterEveryRun,
        tensor_arena::ShrinkPolicy::AfterRunsBelow { runs: 2 },
    ] {
        let config = DeviceConfig {
            arena: tensor_arena::ArenaConfig {
                shrink_policy: policy,
                ..DeviceConfig::default().arena
            },
            shrink_to_plans: false,
            ..DeviceConfig::default()
        };
        let (mut a, sim) = sim_arena(SMALL, config);
        let w = a.alloc(3 << 20, S).unwrap();
        let run = |a: &mut tensor_arena_cuda::DeviceArena, key: &[u8], n: usize| {
            a.begin_run(key).unwrap();
            let x = a.alloc(n, S).unwrap();
            a.free(x, S).unwrap();
            a.end_run().unwrap()
        };
        run(&mut a, b"big", 8 << 20);
        for _ in 0..3 {
            run(&mut a, b"small", 1 << 20);
        }
        // Shrunk to the weights and the small run's need, no lower.
        assert_eq!(sim.mapped_bytes(), (3 << 20) + (1 << 20), "{policy:?}");
        let calls = sim.calls();
        let r = run(&mut a, b"small", 1 << 20);
        assert_eq!(sim.calls(), calls, "{policy:?}: the same run again");
        assert_eq!(r.reserved, (3 << 20) + (1 << 20));
        a.free(w, S).unwrap();
        drop(a);
        assert_device_clean(&sim);
    }
}

/// Two arenas on one device under one budget of device memory: their
/// mappings never pass it; an arena over it first gives its own cache back,
/// then is refused with the budget's error without asking the driver; a
/// smaller request still succeeds; dropping both credits everything.
#[test]
fn device_arenas_share_a_budget_of_their_own() {
    use std::sync::Arc;
    use tensor_arena::memory::ErrorCode;
    use tensor_arena::{ArenaError, Budget};
    use tensor_arena_cuda::{DeviceArena, SimDriver};
    let sim = SimDriver::new(SMALL);
    let budget = Budget::new(16 * G);
    let arena =
        || DeviceArena::with_budget(Arc::new(sim.clone()), DeviceConfig::default(), &budget);
    let (mut a, mut b) = (arena().unwrap(), arena().unwrap());
    let pa = a.alloc(10 * G, S).unwrap();
    let cached = b.alloc(4 * G, S).unwrap();
    b.free(cached, S).unwrap();
    assert_eq!(budget.committed(), sim.mapped_bytes());
    assert_eq!(budget.committed(), 14 * G);
    // 8 granules more for b: its own 4 cached ones are given back first,
    // and that is not enough.
    let created = sim.calls().mem_create;
    let err = b.alloc(8 * G, S).unwrap_err();
    assert!(
        matches!(
            err,
            CudaError::Arena(ArenaError::CommitFailed {
                code: Some(ErrorCode::OverBudget { .. }),
                ..
            })
        ),
        "{err}"
    );
    assert_eq!(
        sim.calls().mem_create,
        created,
        "the driver was not asked for memory"
    );
    assert_eq!(b.stats().mapped, 0, "b gave its cache back first");
    assert_eq!(b.stats().out_of_memory, 1);
    assert!(budget.stats().peak_committed <= 16 * G);
    assert_eq!(budget.committed(), sim.mapped_bytes());
    // a's block is intact, and a smaller request fits.
    sim.write(pa, &[3; 4096]).unwrap();
    let pb = b.alloc(5 * G, S).unwrap();
    assert!(sim.read(pa, 4096).unwrap().iter().all(|&x| x == 3));
    assert_eq!(budget.committed(), 15 * G);
    a.free(pa, S).unwrap();
    b.free(pb, S).unwrap();
    drop((a, b));
    assert_eq!(budget.committed(), 0);
    assert_device_clean(&sim);
}
