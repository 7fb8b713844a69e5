//! The host shell: [`Arena`], a safe face over the [`RawArena`] core on
//! host memory, with `&[u8]` views of its blocks.
//!
//! One file per concept: blocks (`block.rs`), runs (`run.rs`), the
//! `Allocator` interface (`alloc_api.rs`); planned serving is the core's
//! (`raw/`).

mod alloc_api;
mod block;
mod replay;
mod run;
mod scoped;

pub use block::{Block, TypedBlock};
pub use run::Run;
pub use scoped::{ScopedBlock, ScopedRun};

pub(crate) use alloc_api::dangling_for;

use crate::config::ArenaConfig;
use crate::freemap::SpanId;
use crate::memory::{default_memory, DefaultMemory, Heap, HostMemory};
use crate::plan::{Plan, Recording};
use crate::raw::{Handle, RawArena};
use crate::stats::{LiveBlock, RunReport, Stats};
use crate::ArenaError;
use allocator_api2::alloc::{Allocator, Layout};
use bumpalo::Bump;
use core::cell::RefCell;
use core::fmt;
use core::panic::Location;
use std::collections::HashMap;
use std::sync::Arc;

/// A caching pool of tensor buffers on host memory.
///
/// `M` is the memory layer: [`Pages`](crate::memory::Pages) by default on
/// Linux (one reservation, committed in place, huge pages),
/// [`Heap`] over any `allocator_api2` allocator with
/// [`Arena::with_backing`].
///
/// Single-threaded: `Arena` is `Send` but not `Sync`, so the hot path takes
/// no lock; share one across threads with [`SharedArena`](crate::SharedArena).
///
/// ```compile_fail
/// fn is_sync<T: Sync>() {}
/// is_sync::<tensor_arena::Arena>();
/// ```
///
/// A [`Block`] borrows its arena, so it can never outlive it:
///
/// ```compile_fail
/// use tensor_arena::{Arena, ArenaConfig};
/// let block = {
///     let arena = Arena::new(ArenaConfig::default());
///     arena.try_alloc(64).unwrap()
/// };
/// ```
pub struct Arena<M: HostMemory = DefaultMemory> {
    state: RefCell<Shell<M>>,
}

/// Everything mutable, behind the arena's `RefCell`.
struct Shell<M: HostMemory> {
    raw: RawArena<M>,
    /// The per-run scratch allocator, lent to the open run.
    scratch: Option<Bump>,
    /// The list a scoped run notes its smaller steps in, kept between
    /// runs for its capacity.
    smaller: Vec<(usize, usize)>,
    /// Spans handed out through the `Allocator` trait, by address: that
    /// interface gives back a pointer, not a handle.
    by_addr: HashMap<usize, SpanId>,
}

impl Arena<DefaultMemory> {
    /// An arena on the default memory layer ([`DefaultMemory`]). Reserves
    /// nothing until the first request.
    ///
    /// # Panics
    /// If `config` is inconsistent ([`ArenaConfig::validate`]); use
    /// [`Arena::try_new`] to get an error instead.
    pub fn new(config: ArenaConfig) -> Self {
        match Self::try_new(config) {
            Ok(arena) => arena,
            Err(e) => panic!("{e}"),
        }
    }

    /// Like [`Arena::new`], returning an error for a bad configuration.
    ///
    /// # Errors
    /// [`ArenaError::InvalidConfig`].
    pub fn try_new(config: ArenaConfig) -> Result<Self, ArenaError> {
        Self::with_memory(
            config,
            default_memory(crate::memory::PagesConfig::default()),
        )
    }
}

impl Arena<crate::memory::Budgeted<DefaultMemory>> {
    /// An arena on the default memory layer whose commits are charged to
    /// `budget` (see [`Budget`](crate::Budget)): a commit the budget cannot
    /// make room for is [`ArenaError::CommitFailed`] with the code
    /// [`ErrorCode::OverBudget`](crate::memory::ErrorCode::OverBudget).
    /// Such an arena (one thread's, not lockable) is charged but never asked
    /// to give memory back for others; its own shrink policy does that. A
    /// [`SharedArena::with_budget`](crate::SharedArena::with_budget) is
    /// both.
    ///
    /// # Errors
    /// [`ArenaError::InvalidConfig`] for an inconsistent configuration.
    pub fn with_budget(
        config: ArenaConfig,
        budget: &std::sync::Arc<crate::Budget>,
    ) -> Result<Self, ArenaError> {
        let memory = default_memory(crate::memory::PagesConfig::default());
        Self::with_memory(
            config,
            crate::memory::Budgeted::new(memory, std::sync::Arc::clone(budget)),
        )
    }
}

impl Default for Arena<DefaultMemory> {
    fn default() -> Self {
        Self::new(ArenaConfig::default())
    }
}

impl<A: Allocator> Arena<Heap<A>> {
    /// An arena drawing its regions from `alloc` ([`Heap`]).
    ///
    /// # Panics
    /// If `config` is inconsistent ([`ArenaConfig::validate`]).
    pub fn with_backing(config: ArenaConfig, alloc: A) -> Self {
        match Self::try_with_backing(config, alloc) {
            Ok(arena) => arena,
            Err(e) => panic!("{e}"),
        }
    }

    /// Like [`Arena::with_backing`], returning an error for a bad configuration.
    ///
    /// # Errors
    /// [`ArenaError::InvalidConfig`].
    pub fn try_with_backing(config: ArenaConfig, alloc: A) -> Result<Self, ArenaError> {
        Self::with_memory(config, Heap::new(alloc))
    }
}

impl<M: HostMemory> Arena<M> {
    /// An arena on the memory layer `memory`. Reserves nothing until the
    /// first request.
    ///
    /// # Errors
    /// [`ArenaError::InvalidConfig`].
    pub fn with_memory(config: ArenaConfig, memory: M) -> Result<Self, ArenaError> {
        Ok(Self {
            state: RefCell::new(Shell {
                raw: RawArena::new(config, memory)?,
                scratch: Some(Bump::new()),
                smaller: Vec::new(),
                by_addr: HashMap::new(),
            }),
        })
    }

    /// The configuration the arena was made with.
    pub fn config(&self) -> ArenaConfig {
        *self.state.borrow().raw.config()
    }

    /// The memory layer's properties.
    pub fn memory_props(&self) -> crate::memory::MemoryProps {
        self.state.borrow().raw.memory().props()
    }

    /// A block of `len` bytes, aligned to the arena's alignment.
    ///
    /// A zero-size request succeeds with an empty block that holds no memory
    /// and is not counted (like a zero-size [`Layout`] for [`Allocator`]).
    /// The block's bytes are initialized but their values are unspecified
    /// (zero the first time memory is used, then whatever the last user left).
    ///
    /// # Errors
    /// [`ArenaError::CapacityOverflow`] when `len` cannot be served at all,
    /// [`ArenaError::OverCap`] past the memory cap,
    /// [`ArenaError::ReservationExhausted`] past the reserved address space,
    /// [`ArenaError::BackingFailed`], [`ArenaError::ReserveFailed`] or
    /// [`ArenaError::CommitFailed`] when the memory layer refuses.
    /// On error the arena is unchanged.
    #[track_caller]
    pub fn try_alloc(&self, len: usize) -> Result<Block<'_, M>, ArenaError> {
        self.alloc_inner(len, 1, Location::caller())
    }

    /// A block for `layout`: `layout.size()` bytes aligned to at least
    /// `layout.align()` (and to the arena's alignment).
    ///
    /// # Errors
    /// As [`Arena::try_alloc`], plus [`ArenaError::AlignmentTooLarge`] when
    /// the alignment exceeds [`ArenaConfig::max_align`].
    #[track_caller]
    pub fn try_alloc_layout(&self, layout: Layout) -> Result<Block<'_, M>, ArenaError> {
        self.alloc_inner(layout.size(), layout.align(), Location::caller())
    }

    /// A buffer of `len` elements of `T` (their values are unspecified:
    /// zero the first time memory is used, then whatever was last written).
    ///
    /// # Errors
    /// [`ArenaError::CapacityOverflow`] if the size overflows; otherwise as
    /// [`Arena::try_alloc_layout`] (for `T` aligned above
    /// [`ArenaConfig::max_align`]).
    #[track_caller]
    pub fn try_alloc_slice<T: bytemuck::Pod>(
        &self,
        len: usize,
    ) -> Result<TypedBlock<'_, T, M>, ArenaError> {
        block::typed(self.alloc_slice_bytes::<T>(len, Location::caller())?, len)
    }

    pub(crate) fn alloc_slice_bytes<T>(
        &self,
        len: usize,
        location: &'static Location<'static>,
    ) -> Result<Block<'_, M>, ArenaError> {
        let bytes = len
            .checked_mul(size_of::<T>())
            .ok_or(ArenaError::CapacityOverflow {
                requested: usize::MAX,
            })?;
        self.alloc_inner(bytes, align_of::<T>(), location)
    }

    /// A block of `len` bytes at alignment `align`, which must be a power of
    /// two (unlike a [`Layout`], any `align` value is accepted and checked).
    ///
    /// # Errors
    /// As [`Arena::try_alloc_layout`], plus [`ArenaError::InvalidAlignment`].
    #[track_caller]
    pub fn try_alloc_aligned(&self, len: usize, align: usize) -> Result<Block<'_, M>, ArenaError> {
        self.alloc_inner(len, align, Location::caller())
    }

    /// Allocates `len > 0` bytes outside any plan and returns the pointer
    /// and span (for [`SharedArena`](crate::SharedArena) and the
    /// `Allocator` interface).
    pub(crate) fn alloc_raw(
        &self,
        len: usize,
        align: usize,
        location: &'static Location<'static>,
    ) -> Result<(core::ptr::NonNull<u8>, SpanId, usize), ArenaError> {
        let raw = self
            .state
            .borrow_mut()
            .raw
            .alloc_pool(len, align, location, false)?;
        Ok((raw.ptr, raw.span, raw.size))
    }

    #[inline]
    pub(crate) fn alloc_inner(
        &self,
        len: usize,
        align: usize,
        location: &'static Location<'static>,
    ) -> Result<Block<'_, M>, ArenaError> {
        if len == 0 {
            if !align.is_power_of_two() {
                return Err(ArenaError::InvalidAlignment { align });
            }
            return Ok(Block::empty(
                self,
                dangling_for(align.max(self.config().alignment)),
            ));
        }
        let got = self.state.borrow_mut().raw.alloc_at(len, align, location)?;
        Ok(Block::new(self, got.ptr, len, got.handle))
    }

    /// Opens a run: one inference call. Blocks allocated until it finishes
    /// belong to it; its peak and high-water mark are measured.
    ///
    /// The run only counts: it keeps no recording, so
    /// [`Run::finish_with_recording`] returns an empty one. Open the run
    /// whose plan is to be learned (the first of its shape) with
    /// [`Arena::begin_recorded_run`].
    ///
    /// # Panics
    /// If a run is already open; [`Arena::try_begin_run`] returns an error
    /// instead.
    pub fn begin_run(&self) -> Run<'_, M> {
        match self.try_begin_run() {
            Ok(run) => run,
            Err(e) => panic!("{e}"),
        }
    }

    /// Opens a run, or fails if one is already open.
    ///
    /// # Errors
    /// [`ArenaError::RunAlreadyOpen`].
    pub fn try_begin_run(&self) -> Result<Run<'_, M>, ArenaError> {
        self.open_run(None, false)
    }

    /// Opens a run whose [`Recording`] is kept: its planable blocks and
    /// their frees, in order, which [`Run::finish_with_recording`] returns
    /// and [`Plan::from_recording`] turns into a plan for later runs of the
    /// same shape. Recording costs a log entry per allocation and free, so
    /// only the runs a plan will be learned from should ask for it.
    ///
    /// # Panics
    /// If a run is already open; [`Arena::try_begin_recorded_run`] returns
    /// an error instead.
    pub fn begin_recorded_run(&self) -> Run<'_, M> {
        match self.try_begin_recorded_run() {
            Ok(run) => run,
            Err(e) => panic!("{e}"),
        }
    }

    /// Opens a recorded run ([`Arena::begin_recorded_run`]), or fails if a
    /// run is already open.
    ///
    /// # Errors
    /// [`ArenaError::RunAlreadyOpen`].
    pub fn try_begin_recorded_run(&self) -> Result<Run<'_, M>, ArenaError> {
        self.open_run(None, true)
    }

    /// Opens a run served by `plan`: one block of [`Plan::size`] bytes is
    /// drawn from the pool (a cached span when the arena has one, which is
    /// the case after a run of the same shape), and the run's blocks are
    /// handed out at the plan's offsets while the run does what the plan
    /// recorded. A run that deviates continues on the dynamic pool and
    /// records from there on, so that [`Run::finish_with_recording`] gives
    /// what a new plan needs; see [`crate::plan`]. On memory that grows by
    /// regions ([`Heap`]), a run opened while blocks of earlier runs are
    /// live (outputs held into it) runs dynamically instead, recorded, and
    /// reports `planned: false`: the plan's block would need a region of
    /// its own beside the ones those blocks pin.
    ///
    /// # Errors
    /// [`ArenaError::RunAlreadyOpen`], or the errors of drawing the plan's
    /// block ([`ArenaError::OverCap`] and the memory layer's); the caller
    /// may then run unplanned with [`Arena::begin_run`].
    pub fn begin_planned_run(&self, plan: Arc<Plan>) -> Result<Run<'_, M>, ArenaError> {
        self.open_run(Some(plan), false)
    }

    fn open_run(&self, plan: Option<Arc<Plan>>, record: bool) -> Result<Run<'_, M>, ArenaError> {
        let mut st = self.state.borrow_mut();
        let id = st.raw.begin_run(plan, record)?;
        let scratch = st.scratch.take().unwrap_or_default();
        drop(st);
        Ok(Run::new(self, id, scratch))
    }

    /// Makes sure `bytes` can be served with no memory-layer call (a free
    /// span that large exists); for instance to prepare a new session clone
    /// for a known plan before its first run. On [`Pages`](crate::memory::Pages)
    /// this commits at the top of the reservation. On [`Heap`], with no
    /// block live, the arena is laid out again as one region large enough
    /// for this and for the runs since the last shrink (old regions are
    /// returned first); otherwise a region of exactly `bytes` is added.
    ///
    /// # Errors
    /// As [`Arena::try_alloc`].
    pub fn reserve(&self, bytes: usize) -> Result<(), ArenaError> {
        self.state.borrow_mut().raw.reserve(bytes)
    }

    /// Starts (or stops) recording the runs of this arena as a
    /// [`Trace`](crate::trace::Trace): the real workload of a runtime,
    /// to replay elsewhere. Recording keeps one entry per block of every
    /// finished run until [`Arena::take_trace`].
    pub fn record_trace(&self, on: bool) {
        self.state.borrow_mut().raw.record_trace(on);
    }

    /// Whether runs are being recorded as a trace.
    pub fn is_recording_trace(&self) -> bool {
        self.state.borrow().raw.is_recording_trace()
    }

    /// The runs recorded since recording started or the last call; recording
    /// goes on if it was on. Blocks allocated through the `Allocator` trait
    /// are not in the trace.
    pub fn take_trace(&self) -> crate::trace::Trace {
        self.state.borrow_mut().raw.take_trace()
    }

    /// Whether a run is open.
    pub fn in_run(&self) -> bool {
        self.state.borrow().raw.in_run()
    }

    /// Gives memory back down to the watermark (what the recent runs
    /// needed); returns the bytes released.
    ///
    /// On [`Pages`](crate::memory::Pages): decommits every whole free
    /// granule above the watermark (the top of the range, and free granules
    /// between live blocks), so `reserved` becomes the watermark rounded up
    /// to granules plus the granules live blocks pin; repeating the recent
    /// runs then makes no memory-layer call.
    ///
    /// On [`Heap`]: with no live block, the arena is left with one region of
    /// exactly the watermark; with blocks live, only wholly free regions are
    /// released. A second call releases nothing.
    pub fn shrink(&self) -> usize {
        self.state.borrow_mut().raw.shrink()
    }

    /// Gives back what planned runs whose one block is `block` bytes (the
    /// largest plan's [`Plan::size`](crate::Plan::size)) do not use; returns
    /// the bytes released.
    ///
    /// On [`Pages`](crate::memory::Pages): decommits the whole free
    /// granules between live blocks in every free span too small to hold
    /// the block (no planned run uses them), and the top beyond the block.
    /// [`Arena::shrink_to`] a byte target cuts the top first and keeps such
    /// fragments, such as the one left below a block that outlived the run
    /// it was allocated in; the next planned run then grows the top again
    /// and the fragment stays committed and unused. On [`Heap`]: as
    /// `shrink_to` of the bytes in use and the block.
    pub fn shrink_for_plans(&self, block: usize) -> usize {
        self.state.borrow_mut().raw.shrink_for_plans(block)
    }

    /// Gives memory back until at most `bytes` (rounded up to the granule)
    /// stay reserved, as far as live blocks allow; see [`Arena::shrink`].
    /// Returns the bytes released.
    pub fn shrink_to(&self, bytes: usize) -> usize {
        self.state.borrow_mut().raw.shrink_to(bytes)
    }

    /// A snapshot of the counters.
    ///
    /// # Panics
    /// If called while this arena is in the middle of a call on this
    /// thread (from a budget member's [`Reclaim`](crate::Reclaim) during
    /// this arena's commit); [`Arena::try_stats`] answers `None` there.
    pub fn stats(&self) -> Stats {
        self.state.borrow().raw.stats()
    }

    /// The counters, or `None` while this arena is in the middle of a call
    /// on this thread (a commit that asks a budget's members to reclaim):
    /// the one call a [`Reclaim`](crate::Reclaim) member may make on the
    /// arena being committed.
    pub fn try_stats(&self) -> Option<Stats> {
        self.state.try_borrow().ok().map(|st| st.raw.stats())
    }

    /// Gives the memory this arena decommitted lazily
    /// ([`GiveBack::Lazily`](crate::memory::GiveBack::Lazily),
    /// [`Stats::lazily_given_back`]) back to the system at once, so that the
    /// process's resident memory comes down by it: for a server that gives
    /// back lazily while it is busy and wants RSS to show what it holds
    /// when it goes idle. Returns the bytes (0 on a layer that gives back at
    /// once). The next commit of those bytes then faults in zeroed pages.
    pub fn give_back_now(&self) -> usize {
        self.state.borrow_mut().raw.give_back_now()
    }

    /// Lowers `peak_in_use` to the bytes in use now.
    pub fn reset_peak(&self) {
        self.state.borrow_mut().raw.reset_peak();
    }

    /// Every live block, with the run it belongs to and (in debug builds)
    /// where it was allocated.
    pub fn live_blocks(&self) -> Vec<LiveBlock> {
        self.state.borrow().raw.live_blocks()
    }

    /// Walks every region and span and panics if an invariant is broken.
    #[cfg(any(test, fuzzing, feature = "check-invariants"))]
    pub fn check_invariants(&self) {
        self.state.borrow().raw.check_invariants();
    }

    /// Frees the block of `handle`; used by [`Block`]'s drop.
    #[inline]
    pub(crate) fn release(&self, handle: Handle) {
        let result = self.state.borrow_mut().raw.free(handle);
        debug_assert!(result.is_ok(), "a live block was not found in its arena");
    }

    /// Gives back committed free memory if the arena is not in the middle
    /// of another call (and, with `idle_only`, has no run open): every
    /// whole free granule when no run is open, else those above what is in
    /// use. Memory is short on this path, so what was given back lazily
    /// ([`GiveBack::Lazily`](crate::memory::GiveBack::Lazily)) leaves at
    /// once too. Returns the bytes given back (out of `reserved`). For a
    /// [`Budget`](crate::Budget)'s reclaim, which must never wait.
    pub(crate) fn try_release_cached(&self, idle_only: bool) -> usize {
        let Ok(mut st) = self.state.try_borrow_mut() else {
            return 0;
        };
        let busy = st.raw.in_run();
        if busy && idle_only {
            return 0;
        }
        let target = if busy { st.raw.stats().in_use } else { 0 };
        let released = st.raw.shrink_to(target);
        st.raw.give_back_now();
        released
    }

    /// Frees the pool block in `span`; used by `SharedBlock`'s drop.
    pub(crate) fn release_span(&self, span: SpanId) {
        let result = self.state.borrow_mut().raw.free_span(span);
        debug_assert!(result.is_ok(), "a live block was not found in its arena");
    }

    /// Bytes the block of `handle` holds.
    pub(crate) fn capacity_of(&self, handle: Handle) -> usize {
        self.state.borrow().raw.capacity(handle)
    }

    pub(crate) fn set_run_label(&self, label: String) {
        self.state.borrow_mut().raw.set_label(label);
    }

    /// Closes the open run; gives the scratch allocator back. The run's
    /// recording is made only if `recording` asks for it (else it is empty).
    pub(crate) fn finish_run(&self, mut scratch: Bump, recording: bool) -> (RunReport, Recording) {
        scratch.reset();
        let mut st = self.state.borrow_mut();
        st.scratch = Some(scratch);
        if recording {
            st.raw.finish_run()
        } else {
            (st.raw.finish_run_unrecorded(), Recording::new())
        }
    }
}

impl<M: HostMemory> fmt::Debug for Arena<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.state.try_borrow() {
            Ok(st) => f
                .debug_struct("Arena")
                .field("config", st.raw.config())
                .field("stats", &st.raw.stats())
                .finish(),
            Err(_) => f.write_str("Arena { <busy> }"),
        }
    }
}
