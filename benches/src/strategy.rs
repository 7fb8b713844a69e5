//! The allocation strategies every group compares.

/// Alignment every strategy is asked for (the arena's default granule).
pub const ALIGN: usize = 64;

/// An allocation strategy under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// [`Arena`](tensor_arena::Arena) with the default configuration, blocks inside runs.
    Arena,
    /// [`Arena`](tensor_arena::Arena) with a [`Plan`](tensor_arena::Plan) per run shape: the first run of a shape is
    /// dynamic and recorded; later runs of it are served by the plan. After
    /// learning a plan the arena shrinks to the largest plan, as `Session`
    /// does by default.
    Planned,
    /// [`SharedArena`](tensor_arena::SharedArena), one thread: every allocation and free takes the lock.
    /// `SharedArena` has no run API, so its blocks are outside runs.
    Shared,
    /// `std::alloc::System` (glibc malloc) through `GlobalAlloc`.
    System,
    /// `mimalloc::MiMalloc` through `GlobalAlloc` (not as the global allocator).
    Mimalloc,
    /// `tikv_jemallocator::Jemalloc` through `GlobalAlloc`.
    Jemalloc,
    /// `bumpalo::Bump`, reset after each run (it cannot free single blocks).
    Bumpalo,
    /// `rlsf::Tlsf` (two-level segregated fit) over one untouched pool
    /// ([`crate::peers::TlsfHeap`]).
    Rlsf,
    /// `talc` over one untouched pool ([`crate::peers::TalcHeap`]).
    Talc,
    /// Not an allocator: the same page writes into one block that stays
    /// resident, each buffer at the offset the planner gives it. The
    /// physical limit of a replay ([`bare_replayer`](crate::bare_replayer)).
    Bare,
}

impl Strategy {
    /// Every strategy, baselines after the arena's.
    pub const ALL: [Strategy; 10] = [
        Strategy::Arena,
        Strategy::Planned,
        Strategy::Shared,
        Strategy::System,
        Strategy::Mimalloc,
        Strategy::Jemalloc,
        Strategy::Bumpalo,
        Strategy::Rlsf,
        Strategy::Talc,
        Strategy::Bare,
    ];

    /// The allocators (every strategy but [`Strategy::Bare`]).
    pub const ALLOCATORS: [Strategy; 9] = [
        Strategy::Arena,
        Strategy::Planned,
        Strategy::Shared,
        Strategy::System,
        Strategy::Mimalloc,
        Strategy::Jemalloc,
        Strategy::Bumpalo,
        Strategy::Rlsf,
        Strategy::Talc,
    ];

    /// Short name, as in benchmark ids.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Arena => "arena",
            Strategy::Planned => "planned",
            Strategy::Shared => "shared",
            Strategy::System => "system",
            Strategy::Mimalloc => "mimalloc",
            Strategy::Jemalloc => "jemalloc",
            Strategy::Bumpalo => "bumpalo",
            Strategy::Rlsf => "rlsf",
            Strategy::Talc => "talc",
            Strategy::Bare => "bare",
        }
    }

    /// The strategy called `name`.
    pub fn from_name(name: &str) -> Option<Strategy> {
        Strategy::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Whether this is one of the general-purpose baselines the arena must
    /// beat (system, mimalloc, jemalloc, bumpalo, rlsf, talc).
    pub fn is_baseline(self) -> bool {
        matches!(
            self,
            Strategy::System
                | Strategy::Mimalloc
                | Strategy::Jemalloc
                | Strategy::Bumpalo
                | Strategy::Rlsf
                | Strategy::Talc
        )
    }
}

/// Counters a strategy can report after replays.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Regions drawn from the backing allocator so far (arena strategies).
    pub backing_allocs: Option<u64>,
    /// Bytes reserved now (arena strategies).
    pub reserved: Option<usize>,
}
