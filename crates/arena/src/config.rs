//! How an arena grows, shrinks and aligns.

use crate::ArenaError;

/// One GiB: the default cap on a single power-of-two extension, as in ONNX
/// Runtime's `max_power_of_two_extend_bytes`.
pub const DEFAULT_MAX_EXTEND: usize = 1 << 30;

/// How the arena sizes a new region when no cached block fits a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Growth {
    /// The next power of two at least as large as the request and as the
    /// bytes already reserved (so the reservation roughly doubles), but no
    /// more than `max_extend` bytes beyond the request.
    PowerOfTwo {
        /// Upper bound on one extension (unless the request itself is larger).
        max_extend: usize,
    },
    /// Exactly the request (rounded up to the alignment).
    Exact,
}

/// When the arena gives cached memory back on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum ShrinkPolicy {
    /// Only when [`Arena::shrink`](crate::Arena::shrink) or
    /// [`Arena::shrink_to`](crate::Arena::shrink_to) is called.
    #[default]
    Manual,
    /// After every run, down to the watermark.
    AfterEveryRun,
    /// After `runs` consecutive runs that each needed at least 1/8 less
    /// than what is reserved, down to the largest need among them.
    AfterRunsBelow {
        /// How many consecutive runs below the reservation trigger a shrink.
        runs: u32,
    },
}

/// Whether the arena may lay its regions out again when a run ends with no
/// block live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Relayout {
    /// When a run had to grow the arena (or the arena holds more than one
    /// region) and no block is live at its end, replace every region by one
    /// region sized to the largest need seen since the last shrink. The next
    /// run of any shape seen since then fits it with no backing call.
    #[default]
    AfterGrowth,
    /// Never: regions stay as they grew until a shrink or drop.
    Never,
}

/// How the dynamic path picks a free span for a request (after the
/// exact-size front of [`Coalesce::Lazy`], which serves a request of a size
/// freed last first).
///
/// Both bound the work per allocation by a constant; they differ in how
/// closely the span found fits, that is in the footprint of a run. With
/// either, a request that neither the spans looked at nor a region's top
/// holds is not refused yet: every free span of its class and above is
/// tried first (not constant time, but only on the way to growing the
/// arena or failing), so no request fails while a free span holds it.
/// `BENCHMARKS.md`, "First sight of a shape", has both on every shared
/// trace; `docs/decisions.md` says why good fit is the default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Fit {
    /// TLSF's *good fit*: the request is rounded up to the next size class
    /// (1/16 of a power of two), so that any span of the first non-empty
    /// class from there holds it: two bit-scans and the head of one list,
    /// no list walked. Failing that, the head of the request's own class
    /// if it fits, then a region's top. The default: on every trace
    /// measured its high-water marks are at most best fit's (`BENCHMARKS.md`,
    /// "First sight of a shape").
    #[default]
    Good,
    /// Segregated *best fit*: the smallest of the first 8 spans of the
    /// request's class that holds it, else the first span of the next
    /// non-empty class, then a region's top. Tighter on some traces, and
    /// up to 8 spans compared per request.
    Best,
}

/// When a freed span is merged with its free neighbours.
///
/// `BENCHMARKS.md`, "First sight of a shape", has both on every shared trace
/// and on ONNX Runtime's own allocation order; `docs/decisions.md` says why
/// merging at once is the default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Coalesce {
    /// At once, as TLSF does: a free merges the span with its free
    /// neighbours (at most two) and files the result. The default: the
    /// lowest high-water marks on every trace measured (PP-OCR det under
    /// ONNX Runtime 1.013x its lower bound, against 1.228x lazily;
    /// DenseNet-121 in graph order 1.048x against 1.095x), for 9-17% more
    /// instructions per allocation in the traces' order, where sizes
    /// repeat (11% fewer on random sizes).
    #[default]
    Immediate,
    /// Lazily: a freed span waits, unmerged, on a small front of recently
    /// freed sizes (at most 2 spans per size, 64 sizes), so that a request
    /// of a size just freed takes it back with no search, split or merge;
    /// the front is merged when a request misses it. Faster where a run
    /// repeats sizes, looser where it does not.
    Lazy,
}

/// Configuration of an [`Arena`](crate::Arena).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ArenaConfig {
    /// Every block starts at a multiple of this and its size is rounded up
    /// to it. A power of two; default 64 (a cache line, enough for AVX-512).
    pub alignment: usize,
    /// The largest alignment a request may ask for; regions are aligned to
    /// it. A power of two, at least `alignment`; default 4096 (a page).
    pub max_align: usize,
    /// How new regions are sized.
    pub growth: Growth,
    /// Minimum size of the first region (0: sized by the first request). The
    /// arena still allocates nothing until the first request.
    pub initial_region: usize,
    /// Hard cap on reserved bytes; a request that would exceed it fails with
    /// [`ArenaError::OverCap`]. Default: no cap (`usize::MAX`).
    pub max_reserved: usize,
    /// How many recent runs the watermark covers (at least 1; default 1: the
    /// last run).
    pub watermark_window: usize,
    /// When to shrink automatically.
    pub shrink_policy: ShrinkPolicy,
    /// Whether regions are laid out again after a run that grew the arena.
    pub relayout: Relayout,
    /// How the dynamic path picks a free span ([`Fit`]).
    #[cfg_attr(feature = "serde", serde(default))]
    pub fit: Fit,
    /// When freed spans are merged with their neighbours ([`Coalesce`]).
    #[cfg_attr(feature = "serde", serde(default))]
    pub coalesce: Coalesce,
}

impl Default for ArenaConfig {
    fn default() -> Self {
        Self {
            alignment: 64,
            max_align: 4096,
            growth: Growth::PowerOfTwo {
                max_extend: DEFAULT_MAX_EXTEND,
            },
            initial_region: 0,
            max_reserved: usize::MAX,
            watermark_window: 1,
            shrink_policy: ShrinkPolicy::Manual,
            relayout: Relayout::AfterGrowth,
            fit: Fit::default(),
            coalesce: Coalesce::default(),
        }
    }
}

impl ArenaConfig {
    /// Checks that the fields are consistent.
    ///
    /// # Errors
    /// [`ArenaError::InvalidConfig`] naming the first bad field.
    pub fn validate(&self) -> Result<(), ArenaError> {
        if !self.alignment.is_power_of_two() {
            return Err(ArenaError::InvalidConfig(
                "alignment must be a power of two",
            ));
        }
        if !self.max_align.is_power_of_two() || self.max_align < self.alignment {
            return Err(ArenaError::InvalidConfig(
                "max_align must be a power of two no smaller than alignment",
            ));
        }
        if self.max_align > 1 << 30 {
            return Err(ArenaError::InvalidConfig("max_align must be at most 1 GiB"));
        }
        if self.watermark_window == 0 {
            return Err(ArenaError::InvalidConfig(
                "watermark_window must be at least 1",
            ));
        }
        if let ShrinkPolicy::AfterRunsBelow { runs: 0 } = self.shrink_policy {
            return Err(ArenaError::InvalidConfig(
                "ShrinkPolicy::AfterRunsBelow needs runs >= 1",
            ));
        }
        if let Growth::PowerOfTwo { max_extend: 0 } = self.growth {
            return Err(ArenaError::InvalidConfig(
                "Growth::PowerOfTwo needs max_extend >= 1",
            ));
        }
        Ok(())
    }
}
