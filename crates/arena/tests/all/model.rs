//! The model test: random operation sequences checked after every step.

use crate::common::Counting;
use proptest::prelude::*;
use tensor_arena::{Arena, ArenaConfig, ArenaError, Block, Heap, Run};

const CAP: usize = 256 << 20;

#[derive(Clone, Debug)]
enum Op {
    /// Allocate `2^log2 + extra` bytes (1 B to 64 MiB) at `2^align_log2`.
    Alloc {
        log2: u8,
        extra: u32,
        align_log2: u8,
    },
    /// Free the live block at `index % live`.
    Free {
        index: usize,
    },
    BeginRun,
    EndRun,
    Shrink,
    ShrinkTo {
        kib: u32,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..26, any::<u32>(), 0u8..13).prop_map(|(log2, extra, align_log2)| Op::Alloc { log2, extra, align_log2 }),
        5 => any::<usize>().prop_map(|index| Op::Free { index }),
        1 => Just(Op::BeginRun),
        1 => Just(Op::EndRun),
        1 => Just(Op::Shrink),
        1 => (0u32..65536).prop_map(|kib| Op::ShrinkTo { kib }),
    ]
}

/// A live block and the byte its pattern is made of.
struct Live<'a, 'c> {
    block: Block<'a, Heap<&'c Counting>>,
    seed: u8,
    align: usize,
}

/// Where the pattern is written: both ends and the middle of the block.
fn probes(len: usize) -> impl Iterator<Item = usize> {
    let ends = (0..len.min(16)).chain(len.saturating_sub(16)..len);
    ends.chain(std::iter::once(len / 2))
}

fn fill(live: &mut Live<'_, '_>) {
    let seed = live.seed;
    for i in probes(live.block.len()) {
        live.block[i] = seed.wrapping_add(i as u8);
    }
}

fn check(arena: &Arena<Heap<&Counting>>, live: &[Live<'_, '_>]) {
    arena.check_invariants();
    let stats = arena.stats();
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for l in live {
        let addr = l.block.as_ptr() as usize;
        assert_eq!(
            addr % l.align,
            0,
            "block at {addr:#x} not aligned to {}",
            l.align
        );
        assert_eq!(addr % 64, 0);
        for i in probes(l.block.len()) {
            assert_eq!(
                l.block[i],
                l.seed.wrapping_add(i as u8),
                "pattern lost at {addr:#x}+{i}"
            );
        }
        ranges.push((addr, addr + l.block.capacity()));
    }
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "blocks overlap: {:x?} and {:x?}",
            w[0],
            w[1]
        );
    }
    let sum: usize = live.iter().map(|l| l.block.capacity()).sum();
    assert_eq!(stats.in_use, sum, "in_use is not the sum of live blocks");
    assert!(stats.in_use <= stats.reserved);
    assert!(stats.reserved <= CAP, "cap exceeded: {}", stats.reserved);
    assert_eq!(stats.live_blocks, live.len());
    let mut addrs: Vec<usize> = arena.live_blocks().iter().map(|b| b.addr).collect();
    addrs.sort_unstable();
    assert_eq!(addrs, ranges.iter().map(|r| r.0).collect::<Vec<_>>());
}

fn run_ops(ops: &[Op]) {
    let counting = Counting::default();
    {
        let cfg = ArenaConfig {
            max_reserved: CAP,
            ..ArenaConfig::default()
        };
        let arena = Arena::with_backing(cfg, &counting);
        let mut live: Vec<Live<'_, '_>> = Vec::new();
        let mut run: Option<Run<'_, Heap<&Counting>>> = None;
        for (step, op) in ops.iter().enumerate() {
            match *op {
                Op::Alloc {
                    log2,
                    extra,
                    align_log2,
                } => {
                    let len = (1usize << log2) + (extra as usize % (1usize << log2));
                    let align = 1usize << align_log2;
                    let before = arena.stats();
                    match arena.try_alloc_aligned(len, align) {
                        Ok(block) => {
                            let mut l = Live {
                                block,
                                seed: step as u8,
                                align,
                            };
                            fill(&mut l);
                            live.push(l);
                        }
                        Err(ArenaError::OverCap { limit, .. }) => {
                            assert_eq!(limit, CAP);
                            assert_eq!(arena.stats().in_use, before.in_use);
                        }
                        Err(e) => panic!("unexpected error {e}"),
                    }
                }
                Op::Free { index } => {
                    if !live.is_empty() {
                        live.swap_remove(index % live.len());
                    }
                }
                Op::BeginRun => {
                    if run.is_none() {
                        run = Some(arena.begin_run());
                    }
                }
                Op::EndRun => {
                    if let Some(r) = run.take() {
                        let report = r.finish();
                        assert!(report.reserved <= CAP);
                        assert!(report.peak_in_use >= arena.stats().in_use);
                    }
                }
                Op::Shrink => {
                    let before = arena.stats().reserved;
                    let released = arena.shrink();
                    let after = arena.stats().reserved;
                    // A shrink never raises the reservation, and reports
                    // exactly what it gave back.
                    assert!(
                        after <= before,
                        "shrink raised reserved {before} -> {after}"
                    );
                    assert_eq!(released, before - after, "released bytes");
                    if live.is_empty() {
                        let watermark = arena.stats().watermark;
                        assert!(
                            after <= before.min(watermark.next_multiple_of(64)),
                            "nothing live: shrink reaches the watermark {watermark}, kept {after}"
                        );
                    }
                }
                Op::ShrinkTo { kib } => {
                    let target = kib as usize * 1024;
                    let before = arena.stats().reserved;
                    let released = arena.shrink_to(target);
                    let after = arena.stats().reserved;
                    assert!(
                        after <= before,
                        "shrink_to raised reserved {before} -> {after}"
                    );
                    assert_eq!(released, before - after, "released bytes");
                    if live.is_empty() && before > target {
                        assert!(
                            after <= target,
                            "nothing live: shrink_to reaches its target"
                        );
                    }
                }
            }
            check(&arena, &live);
        }
        drop(live);
        drop(run);
        assert_eq!(arena.stats().in_use, 0);
    }
    assert_eq!(
        counting.allocs.get(),
        counting.frees.get(),
        "backing allocs != frees"
    );
    assert_eq!(
        counting.outstanding.get(),
        0,
        "bytes leaked to the backing allocator"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: crate::common::cases(96), ..ProptestConfig::default() })]

    #[test]
    fn random_operation_sequences_keep_every_invariant(ops in prop::collection::vec(op(), 1..120)) {
        run_ops(&ops);
    }
}
