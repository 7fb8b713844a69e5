//! The operation language: what a test or a fuzz input asks the arena to do.
//!
//! Decoding is deterministic: the same bytes always give the same operations
//! (no randomness inside [`Arbitrary`]), so a fuzz input replays exactly as a
//! plain test.

use arbitrary::{Arbitrary, Unstructured};
use core::fmt;

/// The cap on reserved bytes of the arenas [`run`](crate::run) drives.
pub const CAP: usize = 4 << 20;

/// The largest alignment those arenas serve (the default `max_align`).
pub const MAX_ALIGN: usize = 4096;

/// Their granule (the default `alignment`): every block starts at a multiple
/// of it and its size is rounded up to it.
pub const GRANULE: usize = 64;

/// The largest span the arena serves (its `MAX_REGION`, 128 TiB, beyond
/// any address space in use): a larger request is `CapacityOverflow`.
pub const MAX_REQUEST: usize = 1 << 47;

/// Most operations one input runs (the rest is ignored), so that one fuzz
/// execution stays short.
pub const MAX_OPS: usize = 512;

/// Most operations one thread of an [`Op::Shared`] runs.
pub const MAX_SHARED_OPS: usize = 64;

/// Most plans kept at once in one input.
pub const MAX_PLANS: usize = 4;

/// Most session clones alive at once in one input.
pub const MAX_SESSIONS: usize = 8;

/// One step of a test sequence.
#[derive(Clone, Debug, PartialEq, Eq, Arbitrary)]
pub enum Op {
    /// Allocate `size` bytes at alignment [`align_from_log2`]`(align_log2)`
    /// (invalid and too large alignments included) and fill the block with a
    /// pattern.
    Alloc {
        /// Bytes requested.
        size: Size,
        /// Encodes the alignment; see [`align_from_log2`].
        align_log2: u8,
    },
    /// Drop the live block number `index % live` (nothing if none is live).
    Free {
        /// Which block.
        index: u16,
    },
    /// Open a run (expects `RunAlreadyOpen` if one is open): recorded
    /// (`Arena::begin_recorded_run`, its recording becomes a plan) or not
    /// (`Arena::begin_run`, which keeps none).
    BeginRun {
        /// Whether the run keeps its recording.
        recorded: bool,
    },
    /// Finish the open run, if any, and check its report; a run that left no
    /// block live becomes a plan (the last [`MAX_PLANS`] are kept).
    EndRun,
    /// Open a run served by the kept plan number `plan % plans` (a plain run
    /// if there is none). The operations that follow decide whether the run
    /// does what the plan recorded or deviates from it.
    BeginPlannedRun {
        /// Which plan.
        plan: u8,
    },
    /// `Arena::shrink`.
    Shrink,
    /// `Arena::shrink_to(kib * 1024)`.
    ShrinkTo {
        /// Target in KiB.
        kib: u16,
    },
    /// `Arena::shrink_for_plans` with the size of the kept plan number
    /// `plan % plans` (0 if none is kept).
    ShrinkForPlans {
        /// Which plan.
        plan: u8,
    },
    /// Make the next `calls % 4` backing allocation calls fail.
    FailBacking {
        /// How many (modulo 4).
        calls: u8,
    },
    /// Fill an `allocator_api2` `Vec<u32>` of `len % 2048` elements living in the
    /// arena (through `&Arena: Allocator`: allocate, grow, deallocate), check
    /// it, and drop it.
    Collection {
        /// Elements pushed.
        len: u16,
    },
    /// Clone a session (at most [`MAX_SESSIONS`] alive).
    SessionClone,
    /// Drop the session clone number `index % clones`.
    SessionDrop {
        /// Which clone.
        index: u8,
    },
    /// Run the clone number `index % clones` on an input of `size % 2048` words:
    /// buffers from its arena, results checked against the weights.
    SessionRun {
        /// Which clone.
        index: u8,
        /// Input length in `u32`s (modulo 2048).
        size: u16,
    },
    /// Run `a` and `b` on two scoped threads against one `SharedArena`;
    /// blocks still live from earlier `Shared` steps are dealt out to the
    /// two threads (so blocks are freed by other threads than their
    /// allocator's). Checked after both join.
    Shared {
        /// The first thread's operations.
        a: Vec<SharedOp>,
        /// The second thread's operations.
        b: Vec<SharedOp>,
    },
    /// Drive two fresh [`RawArena`](tensor_arena::RawArena)s (the core,
    /// whose handles are `Copy`) with these steps, stale and foreign frees
    /// among them (at most [`MAX_SHARED_OPS`]).
    Raw {
        /// The steps.
        ops: Vec<RawOp>,
    },
}

/// One step of an [`Op::Raw`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Arbitrary)]
pub enum RawOp {
    /// Allocate `size + 1` bytes in the first arena (or the second).
    Alloc {
        /// Bytes requested, less one.
        size: u16,
        /// Whether in the second arena.
        second: bool,
    },
    /// Free the live block number `index % live` of the first arena (or
    /// the second).
    Free {
        /// Which block.
        index: u8,
        /// Whether in the second arena.
        second: bool,
    },
    /// Free, in each arena, its freed handle number `index % stale` again:
    /// refused as freed already, nothing changes.
    Stale {
        /// Which handle.
        index: u8,
    },
    /// Free, in each arena, the other arena's handle number `index %
    /// handles` (live or freed): refused as foreign, nothing changes.
    Foreign {
        /// Which handle.
        index: u8,
    },
    /// Finish the first arena's open run (learning a plan from it), or open
    /// one (served by the last plan learned).
    Run,
}

/// One step of a thread in [`Op::Shared`].
#[derive(Clone, Debug, PartialEq, Eq, Arbitrary)]
pub enum SharedOp {
    /// Allocate `size` bytes and fill them with a pattern.
    Alloc {
        /// Bytes requested.
        size: u16,
    },
    /// Check and drop the thread's live block number `index % live`.
    Free {
        /// Which block.
        index: u8,
    },
    /// `SharedArena::shrink`.
    Shrink,
}

/// A request size. Decoded from four bytes so that small, large, and edge
/// sizes are all likely: the low five bits pick a scale, or (all ones) an
/// entry of [`Size::EDGES`].
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Size(pub usize);

impl Size {
    /// Sizes at the edges: zero, around the granule and the page, around
    /// the cap, and the largest values a `usize` can hold.
    pub const EDGES: [usize; 18] = [
        0,
        1,
        GRANULE - 1,
        GRANULE,
        GRANULE + 1,
        MAX_ALIGN - 1,
        MAX_ALIGN,
        MAX_ALIGN + 1,
        CAP - GRANULE,
        CAP,
        CAP + 1,
        MAX_REQUEST,
        MAX_REQUEST + 1,
        isize::MAX as usize - (MAX_ALIGN - 1),
        isize::MAX as usize - (GRANULE - 1),
        isize::MAX as usize,
        usize::MAX - (GRANULE - 1),
        usize::MAX,
    ];

    /// The size four input bytes (as a little-endian `u32`) stand for.
    pub fn decode(raw: u32) -> Self {
        let scale = raw & 31;
        let rest = (raw >> 5) as usize;
        if scale == 31 {
            Self(Self::EDGES[rest % Self::EDGES.len()])
        } else {
            // 24 bits, shifted right by 0..=23: up to 16 MiB (over the cap),
            // most often a few KiB or bytes.
            Self((rest & 0xff_ffff) >> scale.min(23))
        }
    }
}

impl<'a> Arbitrary<'a> for Size {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(Self::decode(u32::arbitrary(u)?))
    }

    fn size_hint(depth: usize) -> (usize, Option<usize>) {
        u32::size_hint(depth)
    }
}

impl fmt::Debug for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// The alignment an [`Op::Alloc`]'s `align_log2` stands for: `0..=15` is
/// `1 << align_log2` (13 and up exceed [`MAX_ALIGN`]); 254 is 0 and 255 is 3
/// (both invalid); anything else is `1 << (align_log2 % 13)`, a valid one.
pub fn align_from_log2(align_log2: u8) -> usize {
    match align_log2 {
        0..=15 => 1 << align_log2,
        254 => 0,
        255 => 3,
        n => 1 << (n % 13),
    }
}

/// Decodes a fuzz input into operations: as many as the bytes make, at most
/// [`MAX_OPS`], each [`Op::Shared`] thread cut to [`MAX_SHARED_OPS`].
pub fn decode(data: &[u8]) -> Vec<Op> {
    let mut u = Unstructured::new(data);
    let mut ops = Vec::new();
    while ops.len() < MAX_OPS && !u.is_empty() {
        match Op::arbitrary(&mut u) {
            Ok(mut op) => {
                if let Op::Shared { a, b } = &mut op {
                    a.truncate(MAX_SHARED_OPS);
                    b.truncate(MAX_SHARED_OPS);
                }
                if let Op::Raw { ops } = &mut op {
                    ops.truncate(MAX_SHARED_OPS);
                }
                ops.push(op);
            }
            Err(_) => break,
        }
    }
    ops
}

/// How many arenas a [`run_budget`](crate::run_budget) sequence drives
/// under its one budget: [`BUDGET_MEMBERS`] shared arenas registered as
/// members, then one single-threaded arena that is charged but never asked.
pub const BUDGET_ARENAS: usize = BUDGET_MEMBERS + 1;

/// How many of those arenas are members of the budget (reclaimable).
pub const BUDGET_MEMBERS: usize = 3;

/// The budget's limit in [`run_budget`](crate::run_budget): under the sum
/// of the arenas' caps ([`CAP`] each), so commits compete for it.
pub const BUDGET_LIMIT: usize = 3 << 20;

/// One step of a budget sequence ([`run_budget`](crate::run_budget)):
/// several arenas under one [`Budget`](tensor_arena::Budget).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Arbitrary)]
pub enum BudgetOp {
    /// Allocate [`budget_size`]`(size)` bytes in arena `arena %`
    /// [`BUDGET_ARENAS`] and fill them with a pattern (nothing if another
    /// thread holds that arena).
    Alloc {
        /// Which arena.
        arena: u8,
        /// Encodes the size; see [`budget_size`].
        size: u16,
    },
    /// Drop the live block number `index % live` of arena `arena %`
    /// [`BUDGET_ARENAS`] (nothing if another thread holds that arena).
    Free {
        /// Which arena.
        arena: u8,
        /// Which block.
        index: u8,
    },
    /// `shrink()` on arena `arena %` [`BUDGET_ARENAS`].
    Shrink {
        /// Which arena.
        arena: u8,
    },
    /// Open a run on the single-threaded (non-member) arena, or finish the
    /// open one.
    Run,
    /// Member `member %` [`BUDGET_MEMBERS`]'s lock: another thread takes
    /// and holds it (the member is busy: reclaim must skip it, never wait),
    /// or gives it back.
    Hold {
        /// Which member.
        member: u8,
    },
    /// `Budget::relieve`: idle members give back all their cache.
    Relieve,
}

/// The bytes a [`BudgetOp::Alloc`]'s `size` stands for: the high 13 bits
/// shifted left by the low 3 (0 up to almost 1 MiB, most often a few KiB).
pub fn budget_size(size: u16) -> usize {
    ((size >> 3) as usize) << (size & 7)
}

/// Decodes a fuzz input into budget operations, at most [`MAX_OPS`].
pub fn decode_budget(data: &[u8]) -> Vec<BudgetOp> {
    let mut u = Unstructured::new(data);
    let mut ops = Vec::new();
    while ops.len() < MAX_OPS && !u.is_empty() {
        match BudgetOp::arbitrary(&mut u) {
            Ok(op) => ops.push(op),
            Err(_) => break,
        }
    }
    ops
}
