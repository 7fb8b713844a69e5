//! Property tests in the operation-language style of `crates/arena-ops`:
//! random sequences of device operations against a model (a list of live
//! blocks), over the simulated driver. After every step: live blocks do not
//! overlap and are mapped with access, each keeps its fill pattern, every
//! byte is accounted for (in use = live bytes, reserved = mapped on the
//! device), the stream rule holds (no hazard); after the arena drops,
//! nothing is mapped, reserved or held and every create and map was undone.

use crate::common::{assert_device_clean, sim_arena, SMALL};
use proptest::prelude::*;
use tensor_arena_cuda::{DeviceArena, DeviceConfig, DevicePtr, SimDriver, Stream, DEVICE_ALIGN};

/// Live bytes the model keeps below (a quarter of the simulated device),
/// so that an allocation failing for want of memory is a bug.
const LIVE_LIMIT: usize = 16 << 20;

/// Driver calls a step may make fail.
const FAILABLE: [&str; 5] = [
    "cuMemCreate",
    "cuMemMap",
    "cuMemSetAccess",
    "cuEventRecord",
    "cuStreamWaitEvent",
];

/// One step.
#[derive(Clone, Debug)]
enum Op {
    /// Allocate `size` bytes on stream `stream % 3`, write a pattern, and
    /// queue simulated work on the block.
    Alloc { size: usize, stream: u8 },
    /// Check and free live block `index % live` on its stream.
    Free { index: u16 },
    /// Queue more work on live block `index % live`.
    Launch { index: u16 },
    /// Let the work queued on stream `stream % 3` finish.
    Complete { stream: u8 },
    /// Open a run with key `key % 4` (an error if one is open).
    BeginRun { key: u8 },
    /// Close the open run (an error if none is).
    EndRun,
    /// `DeviceArena::shrink`.
    Shrink,
    /// `DeviceArena::shrink_to(kib * 1024)`.
    ShrinkTo { kib: u16 },
    /// Make the next `count % 3` calls of `FAILABLE[call % 5]` fail.
    Fail { call: u8, count: u8 },
}

struct Live {
    ptr: DevicePtr,
    len: usize,
    stream: Stream,
    fill: u8,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (prop_oneof![
            6 => 1usize..70_000,
            3 => 70_000usize..1_000_000,
            1 => 1_000_000usize..4_000_000,
        ], any::<u8>()).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        8 => any::<u16>().prop_map(|index| Op::Free { index }),
        3 => any::<u16>().prop_map(|index| Op::Launch { index }),
        2 => any::<u8>().prop_map(|stream| Op::Complete { stream }),
        2 => any::<u8>().prop_map(|key| Op::BeginRun { key }),
        2 => Just(Op::EndRun),
        1 => Just(Op::Shrink),
        1 => (0u16..8192).prop_map(|kib| Op::ShrinkTo { kib }),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(call, count)| Op::Fail { call, count }),
    ]
}

/// Bytes checked at each end of a block.
const EDGE: usize = 64;

fn check_pattern(sim: &SimDriver, b: &Live) {
    let n = b.len.min(EDGE);
    let head = sim.read(b.ptr, n).expect("a live block is mapped");
    let tail = sim
        .read(DevicePtr(b.ptr.0 + (b.len - n) as u64), n)
        .expect("a live block is mapped");
    assert!(
        head.iter().chain(&tail).all(|&x| x == b.fill),
        "block at {} lost its pattern {:#x}",
        b.ptr,
        b.fill
    );
}

fn fill(sim: &SimDriver, b: &Live) {
    let n = b.len.min(EDGE);
    sim.write(b.ptr, &vec![b.fill; n]).unwrap();
    sim.write(DevicePtr(b.ptr.0 + (b.len - n) as u64), &vec![b.fill; n])
        .unwrap();
}

fn check(a: &DeviceArena, sim: &SimDriver, live: &[Live]) {
    a.check_invariants();
    let st = a.stats();
    assert_eq!(
        st.mapped,
        sim.mapped_bytes(),
        "reserved = mapped on the device"
    );
    assert_eq!(st.arena.reserved, st.mapped);
    let bytes: usize = live
        .iter()
        .map(|b| b.len.next_multiple_of(DEVICE_ALIGN))
        .sum();
    assert_eq!(st.arena.in_use, bytes, "every live byte accounted for");
    assert!(st.arena.in_use <= st.arena.reserved);
    let mut ranges: Vec<(u64, u64)> = live
        .iter()
        .map(|b| (b.ptr.0, b.ptr.0 + b.len as u64))
        .collect();
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        assert!(w[0].1 <= w[1].0, "blocks overlap: {w:?}");
    }
    for b in live {
        assert_eq!(b.ptr.0 % DEVICE_ALIGN as u64, 0);
        check_pattern(sim, b);
    }
    assert!(
        sim.hazards().is_empty(),
        "stream rule broken: {:?}",
        sim.hazards()
    );
}

fn run(ops: &[Op]) {
    let (mut a, sim) = sim_arena(SMALL, DeviceConfig::default());
    let streams = [Stream::DEFAULT, sim.stream(), sim.stream()];
    let mut live: Vec<Live> = Vec::new();
    let mut injected = 0u32;
    let mut next_fill = 1u8;
    let mut in_run = false;
    for op in ops {
        match *op {
            Op::Alloc { size, stream } => {
                let held: usize = live.iter().map(|b| b.len).sum();
                if held + size > LIVE_LIMIT {
                    continue;
                }
                let stream = streams[stream as usize % 3];
                match a.alloc(size, stream) {
                    Ok(ptr) => {
                        let b = Live {
                            ptr,
                            len: size,
                            stream,
                            fill: next_fill,
                        };
                        next_fill = next_fill.wrapping_add(1).max(1);
                        sim.launch(stream, ptr, size)
                            .expect("a new block is mapped");
                        fill(&sim, &b);
                        live.push(b);
                    }
                    Err(e) => assert!(
                        injected > 0,
                        "allocation failed with no failure injected: {e}"
                    ),
                }
            }
            Op::Free { index } => {
                if live.is_empty() {
                    continue;
                }
                let b = live.swap_remove(index as usize % live.len());
                check_pattern(&sim, &b);
                if let Err(e) = a.free(b.ptr, b.stream) {
                    // Only when ordering the stream failed: kept out of reuse.
                    assert!(injected > 0, "free failed with no failure injected: {e}");
                }
            }
            Op::Launch { index } => {
                if let Some(b) = live.get(index as usize % live.len().max(1)) {
                    sim.launch(b.stream, b.ptr, b.len)
                        .expect("a live block is mapped");
                }
            }
            Op::Complete { stream } => sim.complete(streams[stream as usize % 3]),
            Op::BeginRun { key } => {
                let r = a.begin_run(&[key % 4]);
                assert_eq!(r.is_ok(), !in_run, "{r:?}");
                in_run = true;
            }
            Op::EndRun => {
                let r = a.end_run();
                assert_eq!(r.is_ok(), in_run, "{r:?}");
                in_run = false;
            }
            Op::Shrink => {
                a.shrink();
            }
            Op::ShrinkTo { kib } => {
                a.shrink_to(kib as usize * 1024);
            }
            Op::Fail { call, count } => {
                let count = u32::from(count % 3);
                sim.fail_next(FAILABLE[call as usize % FAILABLE.len()], count);
                injected += count;
            }
        }
        check(&a, &sim, &live);
    }
    drop(a);
    assert_device_clean(&sim);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn random_device_operation_sequences_match_the_model(ops in prop::collection::vec(op(), 1..120)) {
        run(&ops);
    }
}

/// A fixed sequence exercising every operation once, so the model checker
/// runs even where proptest's cases all happen to be short.
#[test]
fn every_operation_once() {
    run(&[
        Op::BeginRun { key: 1 },
        Op::Alloc {
            size: 300_000,
            stream: 0,
        },
        Op::Alloc {
            size: 5_000,
            stream: 1,
        },
        Op::Launch { index: 0 },
        Op::Free { index: 0 },
        Op::Alloc {
            size: 2_000_000,
            stream: 2,
        },
        Op::Fail { call: 4, count: 1 },
        Op::Alloc {
            size: 100_000,
            stream: 1,
        },
        Op::Complete { stream: 1 },
        Op::Free { index: 1 },
        Op::EndRun,
        Op::EndRun,
        Op::Shrink,
        Op::ShrinkTo { kib: 0 },
        Op::Fail { call: 0, count: 2 },
        Op::Alloc {
            size: 3_000_000,
            stream: 0,
        },
        Op::BeginRun { key: 1 },
        Op::BeginRun { key: 2 },
        Op::Free { index: 0 },
        Op::Free { index: 0 },
        Op::EndRun,
    ]);
}
