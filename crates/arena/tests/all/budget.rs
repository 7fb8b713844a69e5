//! One budget over several arenas: commits never exceed it, idle arenas'
//! cache is reclaimed before a refusal, live blocks are never touched, a
//! busy member is never waited for, and the limit can come from a cgroup.

use proptest::prelude::*;
use std::sync::{mpsc, Arc};
use std::time::Duration;
use tensor_arena::memory::ErrorCode;
use tensor_arena::{default_headroom, Arena, ArenaConfig, ArenaError, Budget, SharedArena};

const MIB: usize = 1 << 20;

fn over_budget(e: &ArenaError) -> bool {
    matches!(
        e,
        ArenaError::CommitFailed {
            code: Some(ErrorCode::OverBudget { .. }),
            ..
        }
    )
}

/// An idle arena's cache is given back so another arena's commit fits; the
/// idle arena's live block is untouched.
#[test]
fn an_idle_arenas_cache_is_reclaimed_before_a_refusal() {
    let budget = Budget::new(64 * MIB);
    let a = SharedArena::with_budget(ArenaConfig::default(), &budget).unwrap();
    let b = SharedArena::with_budget(ArenaConfig::default(), &budget).unwrap();
    let mut keep = b.try_alloc(MIB).unwrap();
    keep.fill(0x5a);
    drop(b.try_alloc(40 * MIB).unwrap()); // cached in `b` now
    assert!(b.stats().reserved >= 41 * MIB);
    let before = budget.stats();
    let mut big = a
        .try_alloc(40 * MIB)
        .expect("room made by reclaiming b's cache");
    big.fill(1);
    let after = budget.stats();
    assert!(
        after.reclaimed >= before.reclaimed + 16 * MIB as u64,
        "{after:?}"
    );
    assert_eq!(after.refusals, 0);
    assert!(b.stats().reserved < 41 * MIB);
    assert!(keep.iter().all(|&x| x == 0x5a), "a live block was touched");
    assert!(budget.committed() <= budget.limit());
    assert_eq!(
        budget.committed(),
        a.stats().reserved + b.stats().reserved,
        "every committed byte is charged once"
    );
}

/// Over the limit even after reclaiming: the commit is refused with the
/// budget's error, the arena is unchanged, a smaller request succeeds, and
/// the other arena's blocks are intact.
#[test]
fn a_refused_commit_names_the_budget_and_changes_nothing() {
    let budget = Budget::new(32 * MIB);
    let a = Arena::with_budget(ArenaConfig::default(), &budget).unwrap();
    let b = SharedArena::with_budget(ArenaConfig::default(), &budget).unwrap();
    let mut other = b.try_alloc(8 * MIB).unwrap();
    other.fill(3);
    let mut mine = a.try_alloc(4 * MIB).unwrap();
    mine.fill(4);
    let st = a.stats();
    let err = a.try_alloc(30 * MIB).unwrap_err();
    assert!(over_budget(&err), "{err:?}");
    assert!(err.is_out_of_memory());
    assert!(err.to_string().contains("over the memory budget"), "{err}");
    assert_eq!(a.stats().in_use, st.in_use);
    assert_eq!(budget.stats().refusals, 1);
    let small = a.try_alloc(8 * MIB).expect("a smaller request");
    assert!(mine.iter().all(|&x| x == 4) && other.iter().all(|&x| x == 3));
    drop((small, mine, other));
    drop(a);
    drop(b);
    assert_eq!(budget.committed(), 0, "dropped arenas give everything back");
}

/// A member whose lock another thread holds is skipped, not waited for: the
/// commit that needed its cache is refused at once.
#[test]
fn a_busy_member_is_never_waited_for() {
    let budget = Budget::new(32 * MIB);
    let a = SharedArena::with_budget(ArenaConfig::default(), &budget).unwrap();
    let b = SharedArena::with_budget(ArenaConfig::default(), &budget).unwrap();
    drop(b.try_alloc(24 * MIB).unwrap());
    let (locked_tx, locked_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let holder = {
        let b = Arc::clone(&b);
        std::thread::spawn(move || {
            let _guard = b.lock();
            locked_tx.send(()).unwrap();
            release_rx.recv().unwrap();
        })
    };
    locked_rx.recv().unwrap();
    let (done_tx, done_rx) = mpsc::channel();
    let a2 = Arc::clone(&a);
    std::thread::spawn(move || {
        let r = a2.try_alloc(24 * MIB).map(drop);
        done_tx.send(r).unwrap();
    });
    let r = done_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the commit waited for a busy member");
    assert!(over_budget(&r.unwrap_err()));
    release_tx.send(()).unwrap();
    holder.join().unwrap();
    // Once b is idle and unlocked, its cache makes room.
    a.try_alloc(24 * MIB).expect("b's cache reclaimed");
}

/// A budget with a wait: a commit over the limit waits (bounded) for a
/// busy member to come free and give its cache back, then fits; with
/// nothing to wait for it is refused once the bound has passed.
#[test]
fn a_budget_with_a_wait_waits_for_a_busy_member_then_fits() {
    let budget = Budget::with_wait(32 * MIB, Duration::from_secs(10));
    let a = SharedArena::with_budget(ArenaConfig::default(), &budget).unwrap();
    let b = SharedArena::with_budget(ArenaConfig::default(), &budget).unwrap();
    drop(b.try_alloc(24 * MIB).unwrap());
    let (locked_tx, locked_rx) = mpsc::channel();
    let holder = {
        let b = Arc::clone(&b);
        std::thread::spawn(move || {
            let _guard = b.lock();
            locked_tx.send(()).unwrap();
            // Busy for a while (a run), then free.
            std::thread::sleep(Duration::from_millis(60));
        })
    };
    locked_rx.recv().unwrap();
    let t = std::time::Instant::now();
    let mut big = a.try_alloc(24 * MIB).expect("fits once b is free");
    big.fill(7);
    assert!(
        t.elapsed() >= Duration::from_millis(30),
        "{:?}",
        t.elapsed()
    );
    holder.join().unwrap();
    let s = budget.stats();
    assert_eq!((s.waited, s.refusals), (1, 0), "{s:?}");
    assert!(s.peak_committed <= s.limit);
    // Nothing to give: refused after the bound (short here), unchanged.
    let short = Budget::with_wait(8 * MIB, Duration::from_millis(20));
    let c = SharedArena::with_budget(ArenaConfig::default(), &short).unwrap();
    let keep = c.try_alloc(4 * MIB).unwrap();
    let t = std::time::Instant::now();
    assert!(over_budget(&c.try_alloc(8 * MIB).unwrap_err()));
    assert!(t.elapsed() >= Duration::from_millis(20));
    assert_eq!(short.stats().refusals, 1);
    assert_eq!(short.committed(), c.stats().reserved);
    drop(keep);
}

/// `relieve` takes idle members' cache only.
#[test]
fn relieve_gives_back_idle_caches() {
    let budget = Budget::new(256 * MIB);
    let a = SharedArena::with_budget(ArenaConfig::default(), &budget).unwrap();
    let live = a.try_alloc(MIB).unwrap();
    drop(a.try_alloc(16 * MIB).unwrap());
    assert!(budget.committed() >= 17 * MIB);
    let got = budget.relieve();
    assert!(got >= 14 * MIB, "{got}");
    assert_eq!(budget.committed(), a.stats().reserved);
    assert_eq!(budget.stats().members, 1);
    drop(live);
}

/// The limit of a cgroup (v2 `memory.max`, v1 `memory.limit_in_bytes`)
/// less the headroom; none without a limit. A fake tree: no root needed.
#[test]
fn the_budget_comes_from_a_cgroup() {
    let dir = tempfile::tempdir().unwrap();
    let v2 = dir.path().join("v2");
    std::fs::create_dir(&v2).unwrap();
    std::fs::write(v2.join("memory.max"), "2147483648\n").unwrap();
    let b = Budget::from_cgroup(&v2, default_headroom).unwrap();
    assert_eq!(b.limit(), 2147483648 - 2147483648 / 10);
    std::fs::write(v2.join("memory.max"), "max\n").unwrap();
    assert!(Budget::from_cgroup(&v2, default_headroom).is_none());
    let v1 = dir.path().join("v1");
    std::fs::create_dir(&v1).unwrap();
    std::fs::write(v1.join("memory.limit_in_bytes"), "536870912\n").unwrap();
    let b = Budget::from_cgroup(&v1, |_| 64 * MIB).unwrap();
    assert_eq!(b.limit(), 512 * MIB - 64 * MIB);
    std::fs::write(v1.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
    assert!(Budget::from_cgroup(&v1, default_headroom).is_none());
    // A limit below the headroom, garbage, or no file: no budget.
    std::fs::write(v1.join("memory.limit_in_bytes"), "1000\n").unwrap();
    assert!(Budget::from_cgroup(&v1, default_headroom).is_none());
    std::fs::write(v1.join("memory.limit_in_bytes"), "lots\n").unwrap();
    assert!(Budget::from_cgroup(&v1, default_headroom).is_none());
    assert!(Budget::from_cgroup(&dir.path().join("none"), default_headroom).is_none());
}

#[derive(Clone, Debug)]
enum BudgetOp {
    Alloc { arena: u8, kib: u32 },
    Free { arena: u8, index: u8 },
    Shrink { arena: u8 },
    Relieve,
}

fn budget_op() -> impl Strategy<Value = BudgetOp> {
    prop_oneof![
        5 => (0u8..4, 1u32..6_144).prop_map(|(arena, kib)| BudgetOp::Alloc { arena, kib }),
        4 => (0u8..4, any::<u8>()).prop_map(|(arena, index)| BudgetOp::Free { arena, index }),
        1 => (0u8..4).prop_map(|arena| BudgetOp::Shrink { arena }),
        1 => Just(BudgetOp::Relieve),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: crate::common::cases(32), ..ProptestConfig::default() })]

    /// Four arenas (two shared members, two plain) under one 12 MiB budget:
    /// after every step the budget's count is exactly the sum of what the
    /// arenas committed and never over the limit; a refusal is the budget's
    /// (or the request's own) and changes nothing; live blocks keep their
    /// fill.
    #[test]
    fn commits_across_arenas_never_exceed_the_budget(ops in prop::collection::vec(budget_op(), 1..40)) {
        let budget = Budget::new(12 * MIB);
        let shared: Vec<_> = (0..2)
            .map(|_| SharedArena::with_budget(ArenaConfig::default(), &budget).unwrap())
            .collect();
        let plain: Vec<_> = (0..2)
            .map(|_| Arena::with_budget(ArenaConfig::default(), &budget).unwrap())
            .collect();
        let mut live_shared: Vec<Vec<(tensor_arena::SharedBlock<'_, _>, u8)>> = vec![Vec::new(), Vec::new()];
        let mut live_plain: Vec<Vec<(tensor_arena::Block<'_, _>, u8)>> = vec![Vec::new(), Vec::new()];
        for (step, op) in ops.iter().enumerate() {
            let fill = step as u8 | 1;
            match *op {
                BudgetOp::Alloc { arena, kib } => {
                    let len = kib as usize * 1024;
                    let i = usize::from(arena % 2);
                    let got = if arena < 2 {
                        let before = shared[i].stats().in_use;
                        match shared[i].try_alloc(len) {
                            Ok(mut b) => { b.fill(fill); live_shared[i].push((b, fill)); Ok(()) }
                            Err(e) => { prop_assert_eq!(shared[i].stats().in_use, before); Err(e) }
                        }
                    } else {
                        let before = plain[i].stats().in_use;
                        match plain[i].try_alloc(len) {
                            Ok(mut b) => { b.fill(fill); live_plain[i].push((b, fill)); Ok(()) }
                            Err(e) => { prop_assert_eq!(plain[i].stats().in_use, before); Err(e) }
                        }
                    };
                    if let Err(e) = got {
                        prop_assert!(over_budget(&e), "{:?}", e);
                    }
                }
                BudgetOp::Free { arena, index } => {
                    let i = usize::from(arena % 2);
                    let list_len = if arena < 2 { live_shared[i].len() } else { live_plain[i].len() };
                    if list_len > 0 {
                        let k = usize::from(index) % list_len;
                        if arena < 2 { live_shared[i].swap_remove(k); } else { live_plain[i].swap_remove(k); }
                    }
                }
                BudgetOp::Shrink { arena } => {
                    let i = usize::from(arena % 2);
                    if arena < 2 { shared[i].shrink_to(0); } else { plain[i].shrink_to(0); }
                }
                BudgetOp::Relieve => { budget.relieve(); }
            }
            let sum: usize = shared.iter().map(|a| a.stats().reserved).sum::<usize>()
                + plain.iter().map(|a| a.stats().reserved).sum::<usize>();
            prop_assert_eq!(budget.committed(), sum, "step {}", step);
            prop_assert!(budget.committed() <= budget.limit());
            for (b, f) in live_shared.iter().flatten() {
                prop_assert!(b.iter().all(|x| x == f), "a shared block changed");
            }
            for (b, f) in live_plain.iter().flatten() {
                prop_assert!(b.iter().all(|x| x == f), "a block changed");
            }
        }
        drop(live_shared);
        drop(live_plain);
        drop(shared);
        drop(plain);
        prop_assert_eq!(budget.committed(), 0);
    }
}

/// The committed peak counts what two arenas held at once, and starts again
/// from what is committed at a reset.
#[test]
fn the_committed_peak_counts_arenas_together_and_resets_to_now() {
    let budget = Budget::new(256 * MIB);
    let a = SharedArena::with_budget(ArenaConfig::default(), &budget).unwrap();
    let b = SharedArena::with_budget(ArenaConfig::default(), &budget).unwrap();
    let x = a.try_alloc(8 * MIB).unwrap();
    let y = b.try_alloc(8 * MIB).unwrap();
    let together = budget.committed();
    assert!(together >= 16 * MIB, "{together}");
    assert!(budget.stats().peak_committed >= together);
    drop((x, y));
    a.shrink();
    b.shrink();
    let now = budget.committed();
    assert!(now < together, "{now} {together}");
    assert!(budget.stats().peak_committed >= together);
    budget.reset_peak();
    assert_eq!(budget.stats().peak_committed, now);
}
