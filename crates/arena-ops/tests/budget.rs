//! Property test: several arenas under one budget, random operation
//! sequences through `run_budget` (the same `BudgetOp` language as the
//! `budget` fuzz target).

use proptest::prelude::*;
use tensor_arena_ops::{run_budget, BudgetOp, BUDGET_ARENAS};

/// Sizes: mostly up to a few hundred KiB (a third of the limit), some
/// small, as `budget_size` encodes them.
fn size() -> impl Strategy<Value = u16> {
    any::<u16>()
}

fn op() -> impl Strategy<Value = BudgetOp> {
    let arena = 0u8..BUDGET_ARENAS as u8;
    prop_oneof![
        10 => (arena.clone(), size()).prop_map(|(arena, size)| BudgetOp::Alloc { arena, size }),
        7 => (arena.clone(), any::<u8>()).prop_map(|(arena, index)| BudgetOp::Free { arena, index }),
        1 => arena.prop_map(|arena| BudgetOp::Shrink { arena }),
        1 => Just(BudgetOp::Run),
        1 => any::<u8>().prop_map(|member| BudgetOp::Hold { member }),
        1 => Just(BudgetOp::Relieve),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Commits across the arenas never exceed the budget, every committed
    /// byte is charged once, a refusal changes nothing and happens only when
    /// no member could give more, and dropping the arenas credits it all.
    #[test]
    fn commits_across_arenas_never_exceed_the_budget(ops in prop::collection::vec(op(), 1..160)) {
        run_budget(&ops);
    }
}

/// The budget is actually contended: a fixed sequence that fills one
/// member, frees it (its cache stays), then needs that cache in another
/// member and in the non-member arena, and overflows once.
#[test]
fn a_contended_sequence_reclaims_and_refuses() {
    // 0x8000 >> 3 = 4096, << 7 = 512 KiB.
    let half_mib = (4096u16 << 3) | 7;
    let mut ops = Vec::new();
    for _ in 0..5 {
        ops.push(BudgetOp::Alloc {
            arena: 0,
            size: half_mib,
        });
    }
    for _ in 0..5 {
        ops.push(BudgetOp::Free { arena: 0, index: 0 });
    }
    for _ in 0..4 {
        ops.push(BudgetOp::Alloc {
            arena: 1,
            size: half_mib,
        });
    }
    for _ in 0..4 {
        ops.push(BudgetOp::Alloc {
            arena: 3,
            size: half_mib,
        });
    }
    let st = run_budget(&ops).budget;
    assert!(st.reclaimed > 0, "{st:?}");
    assert!(st.refusals > 0, "{st:?}");
}

/// The memory contract: after a refusal the arena is unchanged. A request
/// that grows the range's top and also covers a decommitted hole below it
/// commits twice; when the second commit is refused the first is given
/// back (the pool undoes the growth), so the arena holds no more free,
/// charged memory than before. Found by
/// `commits_across_arenas_never_exceed_the_budget`.
#[test]
fn a_refusal_keeps_no_partial_commit() {
    use BudgetOp::*;
    let ops = vec![
        Alloc {
            arena: 3,
            size: 62722,
        },
        Alloc {
            arena: 3,
            size: 12517,
        },
        Alloc {
            arena: 3,
            size: 45622,
        },
        Alloc {
            arena: 1,
            size: 22893,
        },
        Hold { member: 245 },
        Hold { member: 187 },
        Alloc {
            arena: 3,
            size: 20810,
        },
        Alloc {
            arena: 3,
            size: 54150,
        },
        Hold { member: 215 },
        Alloc {
            arena: 0,
            size: 22244,
        },
        Alloc {
            arena: 0,
            size: 38390,
        },
        Alloc {
            arena: 2,
            size: 32600,
        },
        Alloc {
            arena: 2,
            size: 42461,
        },
        Alloc {
            arena: 0,
            size: 22142,
        },
        Alloc {
            arena: 3,
            size: 11526,
        },
        Alloc {
            arena: 0,
            size: 829,
        },
        Alloc {
            arena: 2,
            size: 52833,
        },
        Alloc {
            arena: 2,
            size: 10661,
        },
        Free {
            arena: 0,
            index: 55,
        },
        Alloc {
            arena: 0,
            size: 39546,
        },
        Free {
            arena: 0,
            index: 214,
        },
        Hold { member: 168 },
        Hold { member: 237 },
        Alloc {
            arena: 2,
            size: 50695,
        },
        Alloc {
            arena: 2,
            size: 45399,
        },
        Alloc {
            arena: 0,
            size: 57307,
        },
        Alloc {
            arena: 0,
            size: 6969,
        },
        Free {
            arena: 0,
            index: 212,
        },
        Alloc {
            arena: 0,
            size: 39431,
        },
        Alloc {
            arena: 3,
            size: 21565,
        },
        Alloc {
            arena: 1,
            size: 5921,
        },
        Free {
            arena: 3,
            index: 117,
        },
        Free {
            arena: 1,
            index: 203,
        },
        Alloc {
            arena: 1,
            size: 4495,
        },
        Alloc {
            arena: 3,
            size: 58612,
        },
        Alloc {
            arena: 0,
            size: 36170,
        },
        Free {
            arena: 1,
            index: 110,
        },
        Alloc {
            arena: 0,
            size: 1330,
        },
        Alloc {
            arena: 0,
            size: 49601,
        },
        Alloc {
            arena: 1,
            size: 46709,
        },
        Alloc {
            arena: 3,
            size: 1517,
        },
        Free {
            arena: 0,
            index: 245,
        },
        Alloc {
            arena: 1,
            size: 64348,
        },
        Alloc {
            arena: 2,
            size: 12403,
        },
        Run,
        Alloc {
            arena: 0,
            size: 40080,
        },
        Free {
            arena: 2,
            index: 10,
        },
        Free {
            arena: 1,
            index: 243,
        },
        Alloc {
            arena: 0,
            size: 58261,
        },
        Free {
            arena: 0,
            index: 166,
        },
        Run,
        Shrink { arena: 0 },
        Alloc {
            arena: 1,
            size: 10603,
        },
        Alloc {
            arena: 3,
            size: 42565,
        },
        Alloc {
            arena: 2,
            size: 33670,
        },
        Shrink { arena: 2 },
        Relieve,
        Shrink { arena: 3 },
        Alloc {
            arena: 1,
            size: 29051,
        },
        Hold { member: 186 },
        Alloc {
            arena: 0,
            size: 17209,
        },
        Alloc {
            arena: 0,
            size: 8847,
        },
        Free {
            arena: 2,
            index: 93,
        },
    ];
    let report = run_budget(&ops);
    assert_eq!(report.grown_on_refusal, 0, "{report:?}");
}
