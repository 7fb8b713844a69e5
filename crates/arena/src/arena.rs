//! The public face: [`Arena`], its [`Block`]s and [`Run`]s.

use crate::config::{ArenaConfig, Relayout, ShrinkPolicy};
use crate::freemap::{simulate_extent, RegionId, RunOp};
use crate::pool::{Pool, RawBlock, Tag};
use crate::stats::{LiveBlock, RunReport, Stats};
use crate::ArenaError;
use allocator_api2::alloc::{AllocError, Allocator, Global, Layout};
use bumpalo::Bump;
use core::cell::RefCell;
use core::fmt;
use core::ops::{Deref, DerefMut};
use core::panic::Location;
use core::ptr::NonNull;
use std::collections::VecDeque;

/// A caching pool of tensor buffers.
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
pub struct Arena<A: Allocator = Global> {
    state: RefCell<State<A>>,
}

/// Everything mutable, behind the arena's `RefCell`.
struct State<A: Allocator> {
    pool: Pool<A>,
    config: ArenaConfig,
    /// The open run, if any.
    run: Option<OpenRun>,
    /// Id the next run gets; run ids start at 1 (0 tags blocks outside runs).
    next_run: u64,
    /// The per-run scratch allocator, lent to the open run.
    scratch: Option<Bump>,
    /// A spare operation log, kept to avoid allocating one per run.
    spare_ops: Vec<RunOp>,
    /// High-water marks of the most recent runs, newest last.
    recent: VecDeque<usize>,
    /// Largest high-water mark since the last shrink.
    need_since_shrink: usize,
    /// Consecutive runs below the reservation, and the largest need among
    /// them (for [`ShrinkPolicy::AfterRunsBelow`]).
    below: (u32, usize),
    allocs: u64,
    frees: u64,
    runs: u64,
    peak_in_use: usize,
    shrinks: u64,
    relayouts: u64,
}

/// Bookkeeping of the open run.
struct OpenRun {
    id: u64,
    /// The run's allocations and frees, in order.
    ops: Vec<RunOp>,
    allocs: u64,
    frees: u64,
    /// Blocks of this run still live, and their bytes.
    live_blocks: usize,
    live_bytes: usize,
    peak: usize,
    backing_allocs_at_start: u64,
    backing_frees_at_start: u64,
    /// `Some(region)` if the run started on exactly one wholly free region:
    /// then its high-water mark is simply `max_end` in that region.
    clean: Option<RegionId>,
    max_end: usize,
}

impl Arena<Global> {
    /// An arena drawing from the global allocator. Allocates nothing until
    /// the first request.
    ///
    /// # Panics
    /// If `config` is inconsistent ([`ArenaConfig::validate`]); use
    /// [`Arena::try_new`] to get an error instead.
    pub fn new(config: ArenaConfig) -> Self {
        Self::with_backing(config, Global)
    }

    /// Like [`Arena::new`], returning an error for a bad configuration.
    ///
    /// # Errors
    /// [`ArenaError::InvalidConfig`].
    pub fn try_new(config: ArenaConfig) -> Result<Self, ArenaError> {
        Self::try_with_backing(config, Global)
    }
}

impl Default for Arena<Global> {
    fn default() -> Self {
        Self::new(ArenaConfig::default())
    }
}

impl<A: Allocator> Arena<A> {
    /// An arena drawing its regions from `alloc`.
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
        config.validate()?;
        Ok(Self {
            state: RefCell::new(State {
                pool: Pool::new(&config, alloc),
                config,
                run: None,
                next_run: 1,
                scratch: Some(Bump::new()),
                spare_ops: Vec::new(),
                recent: VecDeque::new(),
                need_since_shrink: 0,
                below: (0, 0),
                allocs: 0,
                frees: 0,
                runs: 0,
                peak_in_use: 0,
                shrinks: 0,
                relayouts: 0,
            }),
        })
    }

    /// The configuration the arena was made with.
    pub fn config(&self) -> ArenaConfig {
        self.state.borrow().config
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
    /// [`ArenaError::BackingFailed`] when the backing allocator refuses.
    /// On error the arena is unchanged.
    #[track_caller]
    pub fn try_alloc(&self, len: usize) -> Result<Block<'_, A>, ArenaError> {
        self.alloc_inner(len, 1, Location::caller())
    }

    /// A block for `layout`: `layout.size()` bytes aligned to at least
    /// `layout.align()` (and to the arena's alignment).
    ///
    /// # Errors
    /// As [`Arena::try_alloc`], plus [`ArenaError::AlignmentTooLarge`] when
    /// the alignment exceeds [`ArenaConfig::max_align`].
    #[track_caller]
    pub fn try_alloc_layout(&self, layout: Layout) -> Result<Block<'_, A>, ArenaError> {
        self.alloc_inner(layout.size(), layout.align(), Location::caller())
    }

    /// A block of `len` bytes at alignment `align`, which must be a power of
    /// two (unlike a [`Layout`], any `align` value is accepted and checked).
    ///
    /// # Errors
    /// As [`Arena::try_alloc_layout`], plus [`ArenaError::InvalidAlignment`].
    #[track_caller]
    pub fn try_alloc_aligned(&self, len: usize, align: usize) -> Result<Block<'_, A>, ArenaError> {
        self.alloc_inner(len, align, Location::caller())
    }

    /// Allocates `len > 0` bytes and returns the raw block (for [`SharedArena`](crate::SharedArena)).
    pub(crate) fn alloc_raw(
        &self,
        len: usize,
        align: usize,
        location: &'static Location<'static>,
    ) -> Result<RawBlock, ArenaError> {
        self.state.borrow_mut().alloc(len, align, location)
    }

    fn alloc_inner(
        &self,
        len: usize,
        align: usize,
        location: &'static Location<'static>,
    ) -> Result<Block<'_, A>, ArenaError> {
        if len == 0 {
            if !align.is_power_of_two() {
                return Err(ArenaError::InvalidAlignment { align });
            }
            return Ok(Block {
                arena: self,
                ptr: NonNull::<u8>::dangling(),
                len: 0,
                origin: Origin::Empty,
            });
        }
        let raw = self.state.borrow_mut().alloc(len, align, location)?;
        Ok(Block {
            arena: self,
            ptr: raw.ptr,
            len,
            origin: Origin::Pool {
                rid: raw.rid,
                off: raw.off,
            },
        })
    }

    /// Opens a run: one inference call. Blocks allocated until it finishes
    /// belong to it; its peak and high-water mark are recorded.
    ///
    /// # Panics
    /// If a run is already open; [`Arena::try_begin_run`] returns an error
    /// instead.
    pub fn begin_run(&self) -> Run<'_, A> {
        match self.try_begin_run() {
            Ok(run) => run,
            Err(e) => panic!("{e}"),
        }
    }

    /// Opens a run, or fails if one is already open.
    ///
    /// # Errors
    /// [`ArenaError::RunAlreadyOpen`].
    pub fn try_begin_run(&self) -> Result<Run<'_, A>, ArenaError> {
        let mut st = self.state.borrow_mut();
        if st.run.is_some() {
            return Err(ArenaError::RunAlreadyOpen);
        }
        let id = st.next_run;
        st.next_run += 1;
        let clean = match st.pool.single_region() {
            Some((rid, _)) if st.pool.in_use() == 0 => Some(rid),
            _ => None,
        };
        let mut ops = core::mem::take(&mut st.spare_ops);
        ops.clear();
        st.run = Some(OpenRun {
            id,
            ops,
            allocs: 0,
            frees: 0,
            live_blocks: 0,
            live_bytes: 0,
            peak: st.pool.in_use(),
            backing_allocs_at_start: st.pool.backing_allocs(),
            backing_frees_at_start: st.pool.backing_frees(),
            clean,
            max_end: 0,
        });
        let scratch = st.scratch.take().unwrap_or_default();
        drop(st);
        Ok(Run {
            arena: self,
            id,
            scratch,
            open: true,
        })
    }

    /// Whether a run is open.
    pub fn in_run(&self) -> bool {
        self.state.borrow().run.is_some()
    }

    /// Gives cached memory back down to the watermark (what the recent runs
    /// needed); returns the bytes released. With no live block, the arena is
    /// left with one region of exactly the watermark, so repeating the
    /// recent runs makes no backing call; a second call releases nothing.
    ///
    /// Live blocks pin their regions: with any block live, only wholly free
    /// regions are released.
    pub fn shrink(&self) -> usize {
        let mut st = self.state.borrow_mut();
        let target = st.watermark();
        st.shrink_to(target)
    }

    /// Gives cached memory back until at most `bytes` (rounded up to the
    /// alignment) stay reserved, as far as live blocks allow: with none live,
    /// the arena keeps one region of `bytes`; otherwise only wholly free
    /// regions are released. Returns the bytes released.
    pub fn shrink_to(&self, bytes: usize) -> usize {
        self.state.borrow_mut().shrink_to(bytes)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        self.state.borrow().stats()
    }

    /// Lowers `peak_in_use` to the bytes in use now.
    pub fn reset_peak(&self) {
        let mut st = self.state.borrow_mut();
        st.peak_in_use = st.pool.in_use();
    }

    /// Every live block, with the run it belongs to and (in debug builds)
    /// where it was allocated.
    pub fn live_blocks(&self) -> Vec<LiveBlock> {
        self.state.borrow().live_blocks()
    }

    /// Walks every region and span and panics if an invariant is broken.
    #[cfg(any(test, fuzzing, feature = "check-invariants"))]
    pub fn check_invariants(&self) {
        self.state.borrow().check_invariants();
    }

    /// Frees the block at `(rid, off)`; used by [`Block`]'s drop.
    pub(crate) fn release(&self, rid: RegionId, off: usize) {
        let result = self.state.borrow_mut().free(rid, off);
        debug_assert!(result.is_ok(), "a live block was not found in its arena");
    }

    fn finish_run(&self) -> RunReport {
        self.state.borrow_mut().finish_run()
    }
}

impl<A: Allocator> State<A> {
    #[inline]
    fn check(&self) {
        #[cfg(any(test, fuzzing, feature = "check-invariants"))]
        self.check_invariants();
    }

    fn alloc(
        &mut self,
        len: usize,
        align: usize,
        location: &'static Location<'static>,
    ) -> Result<RawBlock, ArenaError> {
        self.check();
        let size = self.pool.span_size(len, align)?;
        let (run, index) = match &self.run {
            Some(r) => (r.id, r.allocs as u32),
            None => (0, 0),
        };
        let tag = Tag {
            run,
            index,
            len,
            #[cfg(debug_assertions)]
            location,
        };
        #[cfg(not(debug_assertions))]
        let _ = location;
        let raw = self.pool.alloc(size, align, tag)?;
        self.allocs += 1;
        let in_use = self.pool.in_use();
        self.peak_in_use = self.peak_in_use.max(in_use);
        if let Some(r) = &mut self.run {
            r.ops.push(RunOp::Alloc {
                size,
                align: align.max(self.pool.granule()),
                len,
            });
            r.allocs += 1;
            r.live_blocks += 1;
            r.live_bytes += size;
            r.peak = r.peak.max(in_use);
            if r.clean == Some(raw.rid) {
                r.max_end = r.max_end.max(raw.off + size);
            }
        }
        Ok(raw)
    }

    fn free(&mut self, rid: RegionId, off: usize) -> Result<(), crate::freemap::FreeError> {
        self.check();
        let (size, tag) = self.pool.free(rid, off)?;
        self.frees += 1;
        if let Some(r) = &mut self.run {
            r.frees += 1;
            if tag.run == r.id {
                r.ops.push(RunOp::Free { index: tag.index });
                r.live_blocks -= 1;
                r.live_bytes -= size;
            }
        }
        Ok(())
    }

    fn watermark(&self) -> usize {
        self.recent.iter().copied().max().unwrap_or(0)
    }

    fn finish_run(&mut self) -> RunReport {
        self.check();
        let Some(mut run) = self.run.take() else {
            return RunReport::default();
        };
        let grew = self.pool.backing_allocs() != run.backing_allocs_at_start;
        let high_water = match run.clean {
            Some(rid) if !grew && self.pool.single_region().map(|r| r.0) == Some(rid) => {
                run.max_end
            }
            _ => simulate_extent(&run.ops),
        };
        self.runs += 1;
        self.recent.push_back(high_water);
        while self.recent.len() > self.config.watermark_window {
            self.recent.pop_front();
        }
        self.need_since_shrink = self.need_since_shrink.max(high_water);

        let mut released = 0;
        let mut relaid_out = false;
        if self.config.relayout == Relayout::AfterGrowth
            && self.pool.in_use() == 0
            && (grew || self.pool.region_count() > 1)
        {
            released += self.pool.relayout(self.need_since_shrink);
            relaid_out = true;
            self.relayouts += 1;
        }
        released += self.apply_policy(high_water);

        let report = RunReport {
            run: run.id,
            allocs: run.allocs,
            frees: run.frees,
            peak_in_use: run.peak,
            high_water,
            backing_allocs: self.pool.backing_allocs() - run.backing_allocs_at_start,
            backing_frees: self.pool.backing_frees() - run.backing_frees_at_start,
            leaked_blocks: run.live_blocks,
            leaked_bytes: run.live_bytes,
            reserved: self.pool.reserved(),
            released,
            relaid_out,
        };
        run.ops.clear();
        self.spare_ops = core::mem::take(&mut run.ops);
        report
    }

    fn apply_policy(&mut self, high_water: usize) -> usize {
        match self.config.shrink_policy {
            ShrinkPolicy::Manual => 0,
            ShrinkPolicy::AfterEveryRun => {
                let target = self.watermark();
                self.shrink_to(target)
            }
            ShrinkPolicy::AfterRunsBelow { runs } => {
                let reserved = self.pool.reserved();
                if high_water.saturating_add(high_water / 8) < reserved {
                    self.below = (self.below.0 + 1, self.below.1.max(high_water));
                } else {
                    self.below = (0, 0);
                }
                if self.below.0 >= runs {
                    let target = self.below.1;
                    self.below = (0, 0);
                    self.shrink_to(target)
                } else {
                    0
                }
            }
        }
    }

    fn shrink_to(&mut self, bytes: usize) -> usize {
        self.check();
        let released = if self.pool.in_use() == 0 {
            let target = crate::freemap::align_up(bytes, self.pool.granule()).unwrap_or(usize::MAX);
            if self.pool.reserved() <= target && self.pool.region_count() <= 1 {
                0
            } else if self.pool.reserved() <= target {
                // Several regions within the target: nothing to give back.
                0
            } else {
                self.pool.relayout(bytes)
            }
        } else {
            self.pool.release_free_regions(bytes)
        };
        if released > 0 {
            self.shrinks += 1;
            self.need_since_shrink = 0;
            if let Some(run) = &mut self.run {
                // The run's region may be gone (and its id reused): its
                // high-water mark must come from the simulation now.
                run.clean = None;
            }
        }
        released
    }

    fn stats(&self) -> Stats {
        Stats {
            in_use: self.pool.in_use(),
            peak_in_use: self.peak_in_use,
            reserved: self.pool.reserved(),
            watermark: self.watermark(),
            allocs: self.allocs,
            frees: self.frees,
            cache_hits: self.pool.cache_hits,
            backing_allocs: self.pool.backing_allocs(),
            backing_frees: self.pool.backing_frees(),
            bytes_released: self.pool.bytes_released,
            largest_free_block: self.pool.largest_free(),
            free_bytes: self.pool.free_bytes(),
            regions: self.pool.region_count(),
            live_blocks: self.pool.live_count(),
            runs: self.runs,
            shrinks: self.shrinks,
            relayouts: self.relayouts,
        }
    }

    fn live_blocks(&self) -> Vec<LiveBlock> {
        self.pool
            .live()
            .map(|(addr, size, tag)| LiveBlock {
                addr,
                len: tag.len,
                size,
                run: (tag.run != 0).then_some(tag.run),
                #[cfg(debug_assertions)]
                location: Some(tag.location),
                #[cfg(not(debug_assertions))]
                location: None,
            })
            .collect()
    }

    #[cfg(any(test, fuzzing, feature = "check-invariants"))]
    fn check_invariants(&self) {
        self.pool.check_invariants();
        if let Some(r) = &self.run {
            assert!(r.live_bytes <= self.pool.in_use());
            assert!(r.peak >= self.pool.in_use());
        }
        assert!(self.peak_in_use >= self.pool.in_use());
        assert!(self.recent.len() <= self.config.watermark_window);
    }
}

impl<A: Allocator> fmt::Debug for Arena<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.state.try_borrow() {
            Ok(st) => f
                .debug_struct("Arena")
                .field("config", &st.config)
                .field("stats", &st.stats())
                .finish(),
            Err(_) => f.write_str("Arena { <busy> }"),
        }
    }
}

/// Where a block's memory comes from.
#[derive(Clone, Copy, Debug)]
enum Origin {
    /// A zero-size block: no memory.
    Empty,
    /// A span of the pool.
    Pool { rid: RegionId, off: usize },
}

/// A buffer from an [`Arena`]; derefs to `[u8]` and goes back to the
/// arena's cache when dropped.
///
/// | state  | how it gets there |
/// |--------|-------------------|
/// | free   | in a region's free spans (or not yet carved) |
/// | live   | handed out by [`Arena::try_alloc`] as a `Block` |
/// | cached | the `Block` dropped: free again, kept by the arena until a shrink or drop |
pub struct Block<'a, A: Allocator = Global> {
    arena: &'a Arena<A>,
    /// Valid for `len` bytes, initialized, owned by this block alone.
    ptr: NonNull<u8>,
    len: usize,
    origin: Origin,
}

impl<A: Allocator> Block<'_, A> {
    /// Bytes requested (the block may hold a few more, see [`Block::capacity`]).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the block is empty (a zero-size request).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the block holds: the request rounded up to the alignment.
    pub fn capacity(&self) -> usize {
        match self.origin {
            Origin::Empty => 0,
            Origin::Pool { rid, off } => self
                .arena
                .state
                .borrow()
                .pool
                .get(rid, off)
                .map_or(0, |s| s.0),
        }
    }

    /// Pointer to the first byte.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Mutable pointer to the first byte.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes as a slice of `T`.
    ///
    /// # Errors
    /// When the length is not a multiple of `size_of::<T>()` or the block is
    /// not aligned enough for `T` (blocks are aligned to the arena's
    /// alignment, 64 by default).
    pub fn pod<T: bytemuck::Pod>(&self) -> Result<&[T], bytemuck::PodCastError> {
        bytemuck::try_cast_slice(self)
    }

    /// The bytes as a mutable slice of `T`.
    ///
    /// # Errors
    /// As [`Block::pod`].
    pub fn pod_mut<T: bytemuck::Pod>(&mut self) -> Result<&mut [T], bytemuck::PodCastError> {
        bytemuck::try_cast_slice_mut(self)
    }
}

impl<A: Allocator> Deref for Block<'_, A> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` bytes (a live span of a region
        // that is not released while the span is live, or dangling with
        // `len == 0`), the bytes are initialized (the pool zeroes memory the
        // first time it hands it out), and no other block overlaps them.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<A: Allocator> DerefMut for Block<'_, A> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only access.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<A: Allocator> Drop for Block<'_, A> {
    fn drop(&mut self) {
        if let Origin::Pool { rid, off } = self.origin {
            self.arena.release(rid, off);
        }
    }
}

impl<A: Allocator> fmt::Debug for Block<'_, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Block")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

/// One inference call on an [`Arena`], from [`Arena::begin_run`].
///
/// Close it with [`Run::finish`] to get its [`RunReport`]; dropping it (for
/// instance while unwinding from a panic) closes it too.
pub struct Run<'a, A: Allocator = Global> {
    arena: &'a Arena<A>,
    id: u64,
    scratch: Bump,
    open: bool,
}

impl<'a, A: Allocator> Run<'a, A> {
    /// The run's id, as in [`RunReport::run`].
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The arena the run is on.
    pub fn arena(&self) -> &'a Arena<A> {
        self.arena
    }

    /// A scratch allocator for small per-run data (shape vectors and the
    /// like), reset when the run finishes; what it hands out borrows the run.
    pub fn scratch(&self) -> &Bump {
        &self.scratch
    }

    /// Allocates a block in the run; the same as [`Arena::try_alloc`].
    ///
    /// # Errors
    /// As [`Arena::try_alloc`].
    #[track_caller]
    pub fn try_alloc(&self, len: usize) -> Result<Block<'a, A>, ArenaError> {
        self.arena.alloc_inner(len, 1, Location::caller())
    }

    /// Closes the run and reports what it did. Blocks of the run still live
    /// are counted as leaked; they stay valid until dropped.
    pub fn finish(mut self) -> RunReport {
        self.close()
    }

    fn close(&mut self) -> RunReport {
        self.open = false;
        let report = self.arena.finish_run();
        let mut scratch = core::mem::take(&mut self.scratch);
        scratch.reset();
        self.arena.state.borrow_mut().scratch = Some(scratch);
        report
    }
}

impl<A: Allocator> Drop for Run<'_, A> {
    fn drop(&mut self) {
        if self.open {
            self.close();
        }
    }
}

impl<A: Allocator> fmt::Debug for Run<'_, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Run").field("id", &self.id).finish()
    }
}

// SAFETY: the trait's contract holds: 1. a returned block stays valid until it
// is deallocated or the arena is dropped: regions are released only when
// wholly free, and moving the `Arena` value does not move its regions (they
// are separate allocations); 2. blocks never overlap (the free map tiles each
// region); 3. zero-size layouts get a dangling, aligned pointer and are never
// passed to the pool; 4. failures return `Err`, never panic; 5. the size
// returned is the real span size, which `deallocate` does not need.
unsafe impl<A: Allocator> Allocator for &Arena<A> {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if layout.size() == 0 {
            let ptr = dangling_for(layout.align());
            return Ok(NonNull::slice_from_raw_parts(ptr, 0));
        }
        let raw = self
            .state
            .borrow_mut()
            .alloc(layout.size(), layout.align(), Location::caller())
            .map_err(|_| AllocError)?;
        Ok(NonNull::slice_from_raw_parts(raw.ptr, raw.size))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() == 0 {
            return;
        }
        let mut st = self.state.borrow_mut();
        let Some((rid, off)) = st.pool.locate(ptr) else {
            debug_assert!(false, "deallocate: {ptr:p} does not belong to this arena");
            return;
        };
        st.pool.zero_block(rid, off);
        let result = st.free(rid, off);
        debug_assert!(
            result.is_ok(),
            "deallocate: {ptr:p} is not a live block of this arena (double free?): {result:?}"
        );
    }
}

/// A non-null pointer aligned to `align`, for zero-size allocations.
fn dangling_for(align: usize) -> NonNull<u8> {
    // A zero-size allocation may use any non-null, aligned address; the
    // alignment itself is one (the same trick as `NonNull::dangling`).
    NonNull::new(core::ptr::without_provenance_mut(align)).unwrap_or(NonNull::dangling())
}
