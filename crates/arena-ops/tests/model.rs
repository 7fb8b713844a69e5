//! Property test: random operation sequences through the model checker.
//!
//! The same [`Op`] language as the `arena_ops` fuzz target, generated here
//! by a hand-written strategy weighted towards realistic sizes; proptest
//! shrinks a failing sequence to a short one.

use proptest::prelude::*;
use tensor_arena_ops::{run, run_pages, Op, RawOp, SharedOp, Size, CAP};

/// Sizes: mostly up to a few hundred KiB, some up to the cap and past it,
/// and the edge values.
fn size() -> impl Strategy<Value = Size> {
    prop_oneof![
        6 => (0u32..18, any::<u32>()).prop_map(|(log2, extra)| {
            Size((1usize << log2) + extra as usize % (1usize << log2))
        }),
        1 => (0..=CAP + CAP / 4).prop_map(Size),
        1 => prop::sample::select(Size::EDGES.to_vec()).prop_map(Size),
    ]
}

fn shared_op() -> impl Strategy<Value = SharedOp> {
    prop_oneof![
        4 => any::<u16>().prop_map(|size| SharedOp::Alloc { size }),
        3 => any::<u8>().prop_map(|index| SharedOp::Free { index }),
        1 => Just(SharedOp::Shrink),
    ]
}

/// The core's steps: mostly allocations and frees, with stale and foreign
/// frees and runs (so planned handles go stale too).
fn raw_op() -> impl Strategy<Value = RawOp> {
    prop_oneof![
        4 => (any::<u16>(), any::<bool>()).prop_map(|(size, second)| RawOp::Alloc { size, second }),
        3 => (any::<u8>(), any::<bool>()).prop_map(|(index, second)| RawOp::Free { index, second }),
        2 => any::<u8>().prop_map(|index| RawOp::Stale { index }),
        2 => any::<u8>().prop_map(|index| RawOp::Foreign { index }),
        1 => Just(RawOp::Run),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (size(), prop_oneof![8 => 0u8..13, 1 => any::<u8>()])
            .prop_map(|(size, align_log2)| Op::Alloc { size, align_log2 }),
        10 => any::<u16>().prop_map(|index| Op::Free { index }),
        2 => any::<bool>().prop_map(|recorded| Op::BeginRun { recorded }),
        2 => Just(Op::EndRun),
        2 => any::<u8>().prop_map(|plan| Op::BeginPlannedRun { plan }),
        1 => Just(Op::Shrink),
        1 => (0u16..32768).prop_map(|kib| Op::ShrinkTo { kib }),
        1 => any::<u8>().prop_map(|plan| Op::ShrinkForPlans { plan }),
        1 => any::<u8>().prop_map(|calls| Op::FailBacking { calls }),
        1 => (0u16..5000).prop_map(|len| Op::Collection { len }),
        1 => Just(Op::SessionClone),
        1 => any::<u8>().prop_map(|index| Op::SessionDrop { index }),
        1 => (any::<u8>(), 0u16..4096).prop_map(|(index, size)| Op::SessionRun { index, size }),
        1 => (
            prop::collection::vec(shared_op(), 0..24),
            prop::collection::vec(shared_op(), 0..24)
        )
            .prop_map(|(a, b)| Op::Shared { a, b }),
        1 => prop::collection::vec(raw_op(), 0..48).prop_map(|ops| Op::Raw { ops }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// The core alone: stale and foreign handles among valid ones are
    /// refused and change nothing.
    #[test]
    fn stale_and_foreign_handles_are_refused(ops in prop::collection::vec(raw_op(), 1..96)) {
        run(&[Op::Raw { ops }]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_operation_sequences_match_the_model(ops in prop::collection::vec(op(), 1..160)) {
        run(&ops);
    }

    /// The same language on the `Pages` memory layer: commits, decommits,
    /// holes read as zero when recommitted, injected reserve and commit
    /// failures, nothing reserved after drop.
    #[test]
    fn random_operation_sequences_on_pages(ops in prop::collection::vec(op(), 1..160)) {
        run_pages(&ops);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// `free_bytes + in_use <= reserved` after every step, on both memory
    /// layers: `Heap` (regions wholly committed) and `Pages` (shrinks
    /// leave decommitted holes inside free spans, which are not free
    /// bytes: they are not reserved). The models' shared check asserts it
    /// after every step of `run` and `run_pages`.
    #[test]
    fn free_bytes_and_in_use_fit_in_reserved_on_both_memory_layers(
        ops in prop::collection::vec(op(), 1..160),
    ) {
        run(&ops);
        run_pages(&ops);
    }
}

/// One run's operations: three blocks, one freed in the middle.
fn a_run(sizes: [usize; 3]) -> Vec<Op> {
    let alloc = |n: usize| Op::Alloc {
        size: Size(n),
        align_log2: 6,
    };
    vec![
        alloc(sizes[0]),
        alloc(sizes[1]),
        Op::Free { index: 0 },
        alloc(sizes[2]),
        Op::Free { index: 0 },
        Op::Free { index: 0 },
    ]
}

/// A run repeated under its plan is served from the plan: no deviation,
/// every block planned.
#[test]
fn a_repeated_run_is_served_by_its_plan() {
    let sizes = [10_000, 3000, 7000];
    let mut ops = vec![Op::BeginRun { recorded: true }];
    ops.extend(a_run(sizes));
    ops.extend([Op::EndRun, Op::BeginPlannedRun { plan: 0 }]);
    ops.extend(a_run(sizes));
    ops.push(Op::EndRun);
    let stats = run(&ops);
    assert_eq!((stats.planned_runs, stats.deviations), (1, 0));
    assert_eq!(stats.planned_allocs, 3);
}

/// A planned run that asks for more than recorded deviates, and the rest of
/// it is served by the pool; the model's checks hold throughout.
#[test]
fn a_planned_run_that_deviates_stays_correct() {
    let mut ops = vec![Op::BeginRun { recorded: true }];
    ops.extend(a_run([10_000, 3000, 7000]));
    ops.extend([Op::EndRun, Op::BeginPlannedRun { plan: 0 }]);
    ops.extend(a_run([10_000, 3000, 70_000]));
    ops.extend([Op::EndRun, Op::BeginPlannedRun { plan: 1 }]);
    ops.extend(a_run([10_000, 3000, 70_000]));
    ops.push(Op::EndRun);
    let stats = run(&ops);
    assert_eq!(stats.planned_runs, 2);
    assert_eq!(stats.deviations, 1, "{stats:?}");
    assert_eq!(stats.planned_allocs, 2 + 3);
}

/// A hand-picked sequence touching every operation once, so a broken
/// operation fails here with a readable name before proptest shrinks.
#[test]
fn every_operation_once() {
    let ops = vec![
        Op::Alloc {
            size: Size(100),
            align_log2: 0,
        },
        Op::BeginRun { recorded: false },
        Op::BeginRun { recorded: true },
        Op::Alloc {
            size: Size(5000),
            align_log2: 12,
        },
        Op::Alloc {
            size: Size(0),
            align_log2: 13,
        },
        Op::Alloc {
            size: Size(64),
            align_log2: 254,
        },
        Op::Alloc {
            size: Size(64),
            align_log2: 255,
        },
        Op::Alloc {
            size: Size(64),
            align_log2: 14,
        },
        Op::Alloc {
            size: Size(usize::MAX),
            align_log2: 0,
        },
        Op::Alloc {
            size: Size(CAP + 1),
            align_log2: 0,
        },
        Op::Collection { len: 1000 },
        Op::Free { index: 1 },
        Op::EndRun,
        Op::BeginPlannedRun { plan: 0 },
        Op::Alloc {
            size: Size(100),
            align_log2: 0,
        },
        Op::EndRun,
        Op::FailBacking { calls: 2 },
        Op::Alloc {
            size: Size(1 << 20),
            align_log2: 6,
        },
        Op::Alloc {
            size: Size(1 << 20),
            align_log2: 6,
        },
        Op::Shrink,
        Op::ShrinkTo { kib: 0 },
        Op::SessionClone,
        Op::SessionClone,
        Op::SessionRun {
            index: 1,
            size: 300,
        },
        Op::SessionRun { index: 0, size: 0 },
        Op::SessionDrop { index: 0 },
        Op::Shared {
            a: vec![SharedOp::Alloc { size: 1000 }, SharedOp::Alloc { size: 70 }],
            b: vec![SharedOp::Alloc { size: 0 }, SharedOp::Shrink],
        },
        Op::Shared {
            a: vec![SharedOp::Free { index: 0 }],
            b: vec![SharedOp::Free { index: 1 }, SharedOp::Alloc { size: 65535 }],
        },
        Op::Free { index: 0 },
    ];
    run(&ops);
}
