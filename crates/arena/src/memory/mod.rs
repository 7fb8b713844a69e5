//! The memory layer: where an arena's bytes live.
//!
//! A [`Memory`] reserves ranges of addresses and commits and decommits
//! granules inside them. The arena's core ([`RawArena`](crate::RawArena))
//! only ever asks it for those calls and does arithmetic on offsets; it
//! never reads or writes the memory, so the same core serves host memory
//! ([`Pages`], [`Heap`]) and device memory (`tensor-arena-cuda`).
//!
//! | layer | reserve | commit / decommit | fresh memory | default |
//! |---|---|---|---|---|
//! | [`Pages`] | one range of address space per arena, nothing committed (`mmap` `PROT_NONE`) | in place at the range's top, granules of 2 MiB with transparent huge pages (else pages): `mprotect`, then populated at once (`MADV_POPULATE_WRITE`) in huge pages where they cost no compaction; decommit: a fresh `PROT_NONE` mapping over the range, or `madvise(MADV_FREE)` with [`GiveBack::Lazily`] | reads as zero (from the kernel); with [`GiveBack::Lazily`], what was last written or zero | on Linux |
//! | [`Heap`] | a region from an `allocator_api2` allocator, committed at once (`allocate_zeroed`) | none: regions are returned whole | reads as zero (`allocate_zeroed`) | elsewhere, or with a custom allocator |
//!
//! All pointer arithmetic of the crate happens in this module (and the
//! host shell's views of blocks): the core hands out offsets, and
//! [`Memory::at`] turns a range's base and an offset into an address.

mod budgeted;
mod heap;
#[cfg(target_os = "linux")]
mod pages;
#[cfg(target_os = "linux")]
mod thp;

pub use budgeted::Budgeted;
pub use heap::Heap;
#[cfg(target_os = "linux")]
pub use pages::Pages;

use core::fmt;
use core::ptr::NonNull;

/// What a memory layer is like; fixed for the layer's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryProps {
    /// Commits and decommits are made in multiples of this (a power of
    /// two): the base page (4 KiB) for `Pages`.
    pub granule: usize,
    /// The huge page size (a multiple of `granule`) when the layer has huge
    /// pages, else 0. Once an arena reaches it, the arena commits and
    /// decommits in whole huge pages, so each 2 MiB faults in at once and
    /// stays one page; below it, in granules, so a small arena holds no
    /// more than it uses.
    pub huge: usize,
    /// Whether memory reads as zero when it is first committed and after it
    /// is decommitted and committed again.
    pub zeroed: bool,
    /// Whether the CPU may read and write committed memory (false for
    /// device memory).
    pub host_accessible: bool,
    /// Whether a reservation is committed whole when it is made and can
    /// neither grow in place nor decommit ([`Heap`]): the arena then grows
    /// by new regions and shrinks by returning whole ones.
    pub committed_on_reserve: bool,
}

impl MemoryProps {
    /// The step in which an arena of `bytes` commits and decommits: the
    /// huge page size from there on, else the granule.
    pub fn commit_step(&self, bytes: usize) -> usize {
        if self.huge > self.granule && bytes >= self.huge {
            self.huge
        } else {
            self.granule
        }
    }
}

/// What failed in a memory layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryOp {
    /// Reserving a range.
    Reserve,
    /// Committing granules.
    Commit,
    /// Decommitting granules.
    Decommit,
}

/// An error number from below a memory layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    /// The operating system's `errno` (`Pages`).
    Os(i32),
    /// A device driver's status code (a CUDA `CUresult`, say).
    Driver(i32),
    /// Not the system's: the arena's [`Budget`](crate::Budget) had no room
    /// left, even after asking its other members to give cached memory
    /// back ([`Budgeted`]).
    OverBudget {
        /// The budget's limit in bytes.
        limit: usize,
    },
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Os(code) => write!(f, "{}", std::io::Error::from_raw_os_error(code)),
            Self::Driver(code) => write!(f, "driver error {code}"),
            Self::OverBudget { limit } => write!(f, "over the memory budget of {limit} bytes"),
        }
    }
}

/// A memory layer's refusal: which call, how many bytes, and the system's
/// or driver's error code when there is one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryError {
    /// The call that failed.
    pub op: MemoryOp,
    /// Bytes it was asked for.
    pub bytes: usize,
    /// The operating system's or driver's error code, if any.
    pub code: Option<ErrorCode>,
}

impl fmt::Display for MemoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.op {
            MemoryOp::Reserve => "reserving",
            MemoryOp::Commit => "committing",
            MemoryOp::Decommit => "decommitting",
        };
        write!(f, "{op} {} bytes failed", self.bytes)?;
        if let Some(code) = self.code {
            write!(f, " ({code})")?;
        }
        Ok(())
    }
}

impl std::error::Error for MemoryError {}

/// A memory layer: reserves ranges, commits and decommits granules in them.
///
/// The arena calls it with these promises, which an implementation may rely
/// on: `commit` and `decommit` name granule-aligned ranges inside a range
/// `reserve` returned and that was not released; `release` is called once
/// per reservation, with its base, length and alignment, and nothing is used after.
/// Every call is counted by the arena ([`Stats`](crate::Stats)).
pub trait Memory {
    /// An address in this memory: a pointer for host memory, a device
    /// address for device memory. The core never dereferences it.
    type Ptr: Copy + fmt::Debug;

    /// What the layer is like.
    fn props(&self) -> MemoryProps;

    /// How many bytes of address space to reserve for an arena whose first
    /// request needs `min` bytes and that is capped at `cap` bytes
    /// (`usize::MAX`: no cap). Layers that commit on reserve return `min`;
    /// a layer that grows in place returns its whole reservation, and a
    /// request past it fails.
    fn reservation_size(&self, min: usize, cap: usize) -> usize;

    /// Reserves `len` bytes (a multiple of the granule) aligned to `align`
    /// (a power of two). With [`MemoryProps::committed_on_reserve`] the
    /// range is usable at once; otherwise nothing in it is.
    ///
    /// # Errors
    /// [`MemoryError`] when the range cannot be had.
    fn reserve(&mut self, len: usize, align: usize) -> Result<Self::Ptr, MemoryError>;

    /// Makes `len` bytes at `offset` of the range at `base` usable.
    ///
    /// # Errors
    /// [`MemoryError`]; the range is then as before.
    fn commit(&mut self, base: Self::Ptr, offset: usize, len: usize) -> Result<(), MemoryError>;

    /// Gives back the memory behind `len` bytes at `offset` of the range at
    /// `base`; they keep their addresses and may be committed again.
    ///
    /// # Errors
    /// [`MemoryError`]; the arena then counts the bytes as still committed.
    fn decommit(&mut self, base: Self::Ptr, offset: usize, len: usize) -> Result<(), MemoryError>;

    /// Returns the range at `base` that `reserve(len, align)` gave,
    /// committed or not.
    fn release(&mut self, base: Self::Ptr, len: usize, align: usize);

    /// Bytes decommitted whose memory the system may still hold, given
    /// back lazily ([`GiveBack::Lazily`]); 0 (the default) for a layer that
    /// gives back at once.
    fn lazily_given_back(&self) -> usize {
        0
    }

    /// Commits that took base pages because huge pages were slow to
    /// populate ([`Stats::slow_huge_commits`](crate::Stats::slow_huge_commits));
    /// 0 (the default) for a layer without huge pages.
    fn slow_huge_commits(&self) -> u64 {
        0
    }

    /// Gives the memory of every range given back lazily back at once, as
    /// a decommit with [`GiveBack::Now`] would have; returns the bytes. The
    /// default has none. A range the system refuses this for stays given
    /// back lazily.
    fn give_back_now(&mut self) -> usize {
        0
    }

    /// The address `offset` bytes past `base` (inside a range, or one past
    /// its end).
    fn at(base: Self::Ptr, offset: usize) -> Self::Ptr;

    /// `ptr` as a number, for reports ([`LiveBlock::addr`](crate::LiveBlock::addr)).
    fn address(ptr: Self::Ptr) -> usize;
}

/// A [`Memory`] whose committed bytes the CPU may read and write: what the
/// host arena ([`Arena`](crate::Arena)) needs to hand out `&[u8]` views.
///
/// # Safety
/// Implementors promise, for every range `reserve` returned and until it is
/// released:
/// - the range's addresses belong to this layer alone (no other allocation
///   overlaps them), and they do not move;
/// - after `commit` returns `Ok` (or at once, with
///   [`MemoryProps::committed_on_reserve`]), the committed bytes may be read
///   and written through pointers derived from the range's base, by any
///   thread, and they are initialized (zeroed, or holding what was last
///   written), until they are decommitted or the range released;
/// - [`Memory::at`] returns `base` moved by `offset` bytes with `base`'s
///   provenance, and [`MemoryProps::host_accessible`] is true.
pub unsafe trait HostMemory: Memory<Ptr = NonNull<u8>> {}

/// Address space reserved for an arena with no cap: 64 GiB. Nothing of it
/// is committed until used; see "Address space" in the crate docs.
pub const DEFAULT_RESERVATION: usize = 64 << 30;

/// Whether `Pages` asks for transparent huge pages.
///
/// A huge page makes 2 MiB one page fault instead of 512. But a fault in a
/// range advised `MADV_HUGEPAGE` that finds no free huge page compacts
/// memory directly, on the faulting thread, where the system's THP
/// `defrag` setting is `madvise` (the kernel's default), `defer+madvise`
/// or `always`: the run that first touches its memory waits for it
/// (magika's one large run 1.3x to 1.9x slower, `BENCHMARKS.md`,
/// "Python"). Whatever the mode, a commit populates its range in one call
/// (`MADV_POPULATE_WRITE`, see `Pages`), and no process-wide setting is
/// changed. `docs/decisions.md` ("Huge pages without the stall") has the
/// table of what `Auto` does under each `enabled` and `defrag` setting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HugePages {
    /// Huge pages wherever they cost no compaction on the committing
    /// thread. Where the system offers them (THP `enabled` is `always` or
    /// `madvise`), the reservation is aligned to the huge page size and
    /// the arena commits in whole huge pages. A commit then asks for them
    /// as the system's settings allow without a stall: where no fault
    /// compacts (`defrag` `defer` or `never`), the range is advised
    /// `MADV_HUGEPAGE`; where the system gives huge pages without advice
    /// (`enabled` `always`) and a fault without advice never compacts
    /// (`defrag` other than `always`), nothing is asked; elsewhere only as
    /// many of the range's huge pages as the kernel has free
    /// (`/proc/buddyinfo`: at most half of them past a margin) are
    /// advised, and the rest is populated in base pages (`MADV_NOHUGEPAGE`
    /// while it is populated) and advised after, so that khugepaged, the
    /// kernel's own thread, may collapse it later. There, the huge pages
    /// of every commit are timed in the thread's CPU time (one of 4 or more populated 2, then 8 at
    /// a time; smaller ones whole, judged every 4 huge pages): after a
    /// step slower than 1 ms a huge page (free memory the host of a
    /// virtual machine must back again, say), the rest of the commit, and
    /// every commit of the next 5 seconds, takes base pages the same way
    /// ([`Stats::slow_huge_commits`](crate::Stats::slow_huge_commits)),
    /// but for a commit of 32 MiB or more taking back memory the arena
    /// gave back in the last second: it is timed again, a huge page at a
    /// time (memory just freed is still backed).
    #[default]
    Auto,
    /// Where the system offers them, every commit is advised, whatever
    /// the `defrag` setting: first touches may pay direct compaction.
    Advise,
    /// Never: the granule is the base page size (4 KiB) and nothing is
    /// advised.
    Never,
}

/// How `Pages` gives the memory of a decommitted range back to the kernel.
///
/// Both take the bytes out of the arena's `committed` (and of a
/// [`Budget`](crate::Budget)'s charge) at once; they differ in when the
/// process's resident memory comes down and in what the next commit of the
/// range costs. `BENCHMARKS.md`, "Alternating sizes", has both on ONNX
/// Runtime's alternating sequences; `docs/decisions.md` says why `Now` is
/// the default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GiveBack {
    /// At once: the range is mapped anew, `PROT_NONE`. Its pages and its
    /// commit charge go now, so the process's RSS comes down; committing it
    /// again faults in pages the kernel must zero (about 0.2-0.3 ms per
    /// 2 MiB huge page measured here), which a large run that follows a
    /// small one pays.
    #[default]
    Now,
    /// Lazily, as jemalloc's "muzzy" pages: `madvise(MADV_FREE)`. The pages
    /// stay mapped, and counted in the process's RSS (as `LazyFree` in
    /// `/proc/PID/smaps`, and on the cgroup's inactive file list, outside
    /// its working set), until the kernel needs memory: it then takes them
    /// without writing them anywhere, before anything else. Committing the
    /// range again before that writes one byte per page (about 3 µs per
    /// 2 MiB) and faults nothing in; after it, it costs what
    /// [`GiveBack::Now`] costs. The range keeps its commit charge
    /// (`RLIMIT_DATA`, strict overcommit) until it is committed again or
    /// the arena drops. Where the kernel refuses `MADV_FREE` (before Linux
    /// 4.5), the range is given back at once.
    Lazily,
}

/// Settings of a `Pages` layer (ignored where there is none: the default
/// layer is then [`Heap`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagesConfig {
    /// Address space reserved per arena when it has no cap; with a cap
    /// ([`ArenaConfig::max_reserved`](crate::ArenaConfig::max_reserved))
    /// the reservation is the cap. Default [`DEFAULT_RESERVATION`].
    pub reservation: usize,
    /// Huge pages; default [`HugePages::Auto`].
    pub huge_pages: HugePages,
    /// How decommitted memory goes back to the kernel; default
    /// [`GiveBack::Now`].
    pub give_back: GiveBack,
}

impl Default for PagesConfig {
    fn default() -> Self {
        Self {
            reservation: DEFAULT_RESERVATION,
            huge_pages: HugePages::Auto,
            give_back: GiveBack::Now,
        }
    }
}

/// The memory layer of [`Arena::new`](crate::Arena::new): `Pages` on
/// Linux, [`Heap`] over the global allocator elsewhere.
#[cfg(target_os = "linux")]
pub type DefaultMemory = Pages;

/// The memory layer of [`Arena::new`](crate::Arena::new): `Pages` on
/// Linux, [`Heap`] over the global allocator elsewhere.
#[cfg(not(target_os = "linux"))]
pub type DefaultMemory = Heap<allocator_api2::alloc::Global>;

/// A new [`DefaultMemory`] with `pages` (used on Linux only).
pub fn default_memory(pages: PagesConfig) -> DefaultMemory {
    #[cfg(target_os = "linux")]
    {
        Pages::new(pages)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = pages;
        Heap::new(allocator_api2::alloc::Global)
    }
}
