//! What an arena holds and has done: plain `Copy` structs with public fields.

/// A snapshot of an arena's counters, from [`Arena::stats`](crate::Arena::stats).
///
/// Byte figures count blocks as handed out, that is rounded up to the arena's
/// alignment. Counters only grow, except `peak_in_use`, which
/// [`Arena::reset_peak`](crate::Arena::reset_peak) lowers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Stats {
    /// Bytes in live blocks now.
    pub in_use: usize,
    /// Highest `in_use` since the arena was made or the peak was reset.
    pub peak_in_use: usize,
    /// Bytes committed in the memory layer now: for [`Pages`](crate::memory::Pages)
    /// the committed granules (address space reserved but not committed is
    /// not counted); for [`Heap`](crate::memory::Heap) the sum of region sizes.
    pub reserved: usize,
    /// What the recent runs needed: the largest high-water mark among the
    /// last [`ArenaConfig::watermark_window`](crate::ArenaConfig::watermark_window)
    /// runs (0 before the first run). [`Arena::shrink`](crate::Arena::shrink)
    /// shrinks to it.
    pub watermark: usize,
    /// Blocks handed out (zero-size requests excluded).
    pub allocs: u64,
    /// Blocks given back.
    pub frees: u64,
    /// Allocations served from committed memory with no memory-layer call.
    pub cache_hits: u64,
    /// Ranges reserved from the memory layer (regions of a `Heap`, the one
    /// reservation of `Pages`).
    pub backing_allocs: u64,
    /// Ranges released to the memory layer.
    pub backing_frees: u64,
    /// Commit calls (growth in place, holes committed again).
    pub commits: u64,
    /// Decommit calls (shrink).
    pub decommits: u64,
    /// Bytes given back to the memory layer (decommitted or released, by
    /// shrink, relayout or cap pressure; a relayout's new region is not
    /// subtracted).
    pub bytes_released: u64,
    /// Size of the largest free span: the largest request served with no
    /// backing call (at the default alignment).
    pub largest_free_block: usize,
    /// Bytes of free spans in the regions: `reserved - in_use`, less the
    /// unused part of a planned run's block while one is held.
    pub free_bytes: usize,
    /// Regions held now (at most 1 for `Pages`).
    pub regions: usize,
    /// Live blocks now.
    pub live_blocks: usize,
    /// Runs finished.
    pub runs: u64,
    /// Shrinks that released memory (manual or by policy).
    pub shrinks: u64,
    /// Relayouts after growth (see [`Relayout`](crate::Relayout)).
    pub relayouts: u64,
    /// Blocks served from a plan (no search, no backing call).
    pub planned_allocs: u64,
    /// Runs opened with a plan.
    pub planned_runs: u64,
    /// Planned runs that deviated from their plan.
    pub deviations: u64,
    /// Bytes decommitted lazily ([`GiveBack::Lazily`](crate::memory::GiveBack::Lazily))
    /// and not committed again: out of `reserved`, but the system may still
    /// hold their pages (in RSS as `LazyFree`) until it needs them or
    /// [`Arena::give_back_now`](crate::Arena::give_back_now) is called.
    /// 0 on a layer that gives back at once.
    pub lazily_given_back: usize,
    /// Commits that took base pages where they would have taken huge
    /// pages, because the first huge pages of a commit were slow to
    /// populate (a guest whose free memory went back to its host), or came
    /// within a second of one that was ([`HugePages::Auto`](crate::memory::HugePages::Auto)).
    pub slow_huge_commits: u64,
}

impl Stats {
    /// Every call to the memory layer so far: reservations, releases,
    /// commits and decommits.
    pub fn memory_calls(&self) -> u64 {
        self.backing_allocs + self.backing_frees + self.commits + self.decommits
    }

    /// Share of free bytes that the largest free span does not cover:
    /// 0.0 when all free memory is one span (or there is none), towards 1.0
    /// as it splinters.
    pub fn fragmentation(&self) -> f64 {
        if self.free_bytes == 0 {
            0.0
        } else {
            // A free span may hold decommitted holes (`Pages` after a
            // shrink), which `free_bytes` leaves out: never below 0.
            let largest = self.largest_free_block.min(self.free_bytes);
            1.0 - largest as f64 / self.free_bytes as f64
        }
    }
}

/// What one run did, from [`Run::finish`](crate::Run::finish).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RunReport {
    /// The run's id (1 for the arena's first run, then counting up).
    pub run: u64,
    /// Blocks allocated during the run.
    pub allocs: u64,
    /// Blocks freed during the run (including blocks from before it).
    pub frees: u64,
    /// Highest bytes in use during the run (arena-wide).
    pub peak_in_use: usize,
    /// The run's high-water mark: how far into one wholly free region the
    /// run's allocations reach when replayed alone. A region this large
    /// serves the same run again with no backing call.
    pub high_water: usize,
    /// Ranges reserved from the memory layer during the run.
    pub backing_allocs: u64,
    /// Ranges released during the run, including at its end.
    pub backing_frees: u64,
    /// Commit calls during the run (0 when the run fit committed memory).
    pub commits: u64,
    /// Decommit calls during the run, including at its end.
    pub decommits: u64,
    /// Blocks allocated in the run and still live at its end.
    pub leaked_blocks: usize,
    /// Bytes of those blocks.
    pub leaked_bytes: usize,
    /// Bytes reserved after the run (after any relayout or shrink).
    pub reserved: usize,
    /// Net bytes given back at the end of the run (relayout or shrink policy).
    pub released: usize,
    /// Whether the regions were laid out again at the end of the run.
    pub relaid_out: bool,
    /// Whether the run was opened with a plan.
    pub planned: bool,
    /// Whether a planned run deviated from its plan.
    pub deviated: bool,
    /// Why a planned run left its plan (`None` when it did not).
    pub deviation: Option<crate::plan::Deviation>,
    /// Whether a run that left its plan had every block it allocated until
    /// then at its planned size and where a dynamic arena would have put
    /// it (the plan starts with the run's own placement past them: the
    /// solver plans so wherever that is as low). The rest was then served
    /// by the pool's best fit, as that arena serves it: such a run reaches
    /// no higher than the same run on a fresh dynamic arena, or than the
    /// plan's block it drew (to a granule).
    pub left_as_dynamic: bool,
    /// Blocks served from the plan; `allocs - planned_allocs` came from the
    /// dynamic pool.
    pub planned_allocs: u64,
}

impl RunReport {
    /// Every call to the memory layer during the run.
    pub fn memory_calls(&self) -> u64 {
        self.backing_allocs + self.backing_frees + self.commits + self.decommits
    }
}

/// A block still live, from [`Arena::live_blocks`](crate::Arena::live_blocks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveBlock {
    /// Address of its first byte.
    pub addr: usize,
    /// Bytes requested.
    pub len: usize,
    /// Bytes held (the request rounded up to the alignment).
    pub size: usize,
    /// The run it was allocated in, if any.
    pub run: Option<u64>,
    /// Where it was allocated (debug builds only).
    pub location: Option<&'static core::panic::Location<'static>>,
}
