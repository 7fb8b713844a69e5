//! The public face: [`Arena`], its [`Block`]s and [`Run`]s.

use crate::config::{ArenaConfig, Relayout, ShrinkPolicy};
use crate::freemap::{simulate_extent, RegionId, RunOp, SpanId};
use crate::plan::{Plan, Recording};
use crate::pool::{Pool, RawBlock, Tag, NOT_PLANNED, PLAN_BLOCK};
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
use std::sync::Arc;

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
    /// A spare recording, likewise.
    spare_rec: Recording,
    /// Blocks drawn for planned runs, by slot; a slot outlives its run while
    /// a planned block of it is still live.
    plan_blocks: Vec<Option<PlanBlock>>,
    /// Sum of the sizes of the blocks in `plan_blocks`.
    plan_reserved: usize,
    /// Bytes of live planned blocks.
    planned_live: usize,
    planned_allocs: u64,
    planned_runs: u64,
    deviations: u64,
    /// Runs recorded as a trace, when recording is on.
    trace: Option<crate::trace::Trace>,
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
    /// The run's pool allocations and frees, in order.
    ops: Vec<RunOp>,
    /// `RunOp::Alloc` entries in `ops` (the index the next one gets).
    pool_allocs: u32,
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
    /// The run's planable blocks and events (see [`Serve::recording`]).
    rec: Recording,
    /// Planable blocks allocated so far (the next one's index).
    blocks: u32,
    /// The plan serving this run, if any.
    serve: Option<Serve>,
    planned_allocs: u64,
    /// Bytes requested by each recorded block (kept only while a trace is
    /// being recorded).
    lens: Vec<usize>,
    /// The run's label in a recorded trace.
    label: Option<String>,
}

/// A plan serving the open run.
struct Serve {
    plan: Arc<Plan>,
    /// Slot of the plan's block in [`State::plan_blocks`].
    slot: u32,
    /// Events of the run so far, all as recorded in the plan.
    pos: usize,
    /// Whether the run has left the plan (the rest is served dynamically).
    deviated: bool,
    /// Whether the run's own recording is kept. A run that follows its plan
    /// exactly records nothing (its recording is the plan's); at the first
    /// difference the plan's recording so far is copied into the run's and
    /// recording goes on from there.
    recording: bool,
}

/// A block drawn from the pool to serve a planned run.
struct PlanBlock {
    raw: RawBlock,
    /// Planned blocks of it still live, and their bytes.
    live: usize,
    live_bytes: usize,
    /// Whether its run is still open.
    open: bool,
}

/// What an allocation handed out.
enum Handed {
    Pool(RawBlock),
    Planned {
        ptr: NonNull<u8>,
        slot: u32,
        index: u32,
        size: usize,
    },
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
                spare_rec: Recording::new(),
                plan_blocks: Vec::new(),
                plan_reserved: 0,
                planned_live: 0,
                planned_allocs: 0,
                planned_runs: 0,
                deviations: 0,
                trace: None,
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
    ) -> Result<TypedBlock<'_, T, A>, ArenaError> {
        typed(self.alloc_slice_bytes::<T>(len, Location::caller())?)
    }

    fn alloc_slice_bytes<T>(
        &self,
        len: usize,
        location: &'static Location<'static>,
    ) -> Result<Block<'_, A>, ArenaError> {
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
        self.state
            .borrow_mut()
            .alloc_pool(len, align, location, false)
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
                ptr: dangling_for(align.max(self.config().alignment)),
                len: 0,
                origin: Origin::Empty,
            });
        }
        let handed = self.state.borrow_mut().alloc(len, align, location)?;
        let (ptr, origin) = match handed {
            Handed::Pool(raw) => (raw.ptr, Origin::Pool { span: raw.span }),
            Handed::Planned {
                ptr,
                slot,
                index,
                size,
            } => (ptr, Origin::Planned { slot, index, size }),
        };
        Ok(Block {
            arena: self,
            ptr,
            len,
            origin,
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
        self.open_run(None)
    }

    /// Opens a run served by `plan`: one block of [`Plan::size`] bytes is
    /// drawn from the pool (a cached span when the arena has one, which is
    /// the case after a run of the same shape), and the run's blocks are
    /// handed out at the plan's offsets while the run does what the plan
    /// recorded. A run that deviates continues on the dynamic pool; see
    /// [`crate::plan`].
    ///
    /// # Errors
    /// [`ArenaError::RunAlreadyOpen`], or the errors of drawing the plan's
    /// block ([`ArenaError::OverCap`], [`ArenaError::BackingFailed`]); the
    /// caller may then run unplanned with [`Arena::begin_run`].
    pub fn begin_planned_run(&self, plan: Arc<Plan>) -> Result<Run<'_, A>, ArenaError> {
        self.open_run(Some(plan))
    }

    fn open_run(&self, plan: Option<Arc<Plan>>) -> Result<Run<'_, A>, ArenaError> {
        let mut st = self.state.borrow_mut();
        if st.run.is_some() {
            return Err(ArenaError::RunAlreadyOpen);
        }
        let at_start = (st.pool.backing_allocs(), st.pool.backing_frees());
        let clean = match st.pool.single_region() {
            Some((rid, _)) if st.pool.in_use() == 0 => Some(rid),
            _ => None,
        };
        let serve = match plan {
            Some(plan) if plan.size() > 0 => Some(st.draw_plan_block(plan)?),
            _ => None,
        };
        let id = st.next_run;
        st.next_run += 1;
        let mut ops = core::mem::take(&mut st.spare_ops);
        ops.clear();
        let mut rec = core::mem::take(&mut st.spare_rec);
        rec.clear();
        let mut max_end = 0;
        if let Some(serve) = &serve {
            // The plan's block is the run's first pool allocation.
            let raw = st.plan_blocks[serve.slot as usize]
                .as_ref()
                .expect("just drawn")
                .raw;
            if clean == Some(raw.rid) {
                max_end = raw.off + raw.size;
            }
            ops.push(RunOp::Alloc {
                size: raw.size,
                align: serve.plan.align().max(st.pool.granule()),
                len: raw.size,
            });
            st.planned_runs += 1;
        }
        let peak = st.in_use();
        let pool_allocs = ops.len() as u32;
        st.run = Some(OpenRun {
            id,
            ops,
            pool_allocs,
            allocs: 0,
            frees: 0,
            live_blocks: 0,
            live_bytes: 0,
            peak,
            backing_allocs_at_start: at_start.0,
            backing_frees_at_start: at_start.1,
            clean,
            max_end,
            rec,
            blocks: 0,
            serve,
            planned_allocs: 0,
            lens: Vec::new(),
            label: None,
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

    /// Makes sure `bytes` can be served with no backing call (a free span
    /// that large exists); for instance to prepare a new session clone for a
    /// known plan before its first run. With no block live the arena is laid
    /// out again as one region large enough for this and for the runs since
    /// the last shrink (old regions are returned first); otherwise a region
    /// of exactly `bytes` is added.
    ///
    /// # Errors
    /// As [`Arena::try_alloc`].
    pub fn reserve(&self, bytes: usize) -> Result<(), ArenaError> {
        if bytes == 0 {
            return Ok(());
        }
        let mut st = self.state.borrow_mut();
        st.check();
        let size = st.pool.span_size(bytes, 1)?;
        // With nothing live, one region covering this and what the runs
        // since the last shrink needed (so they keep fitting too).
        let idle_target = st.need_since_shrink.max(size);
        st.pool.reserve(size, idle_target)
    }

    /// Starts (or stops) recording the runs of this arena as a
    /// [`Trace`](crate::trace::Trace): the real workload of a runtime,
    /// to replay elsewhere. Recording keeps one entry per block of every
    /// finished run until [`Arena::take_trace`].
    pub fn record_trace(&self, on: bool) {
        let mut st = self.state.borrow_mut();
        match (on, st.trace.is_some()) {
            (true, false) => st.trace = Some(crate::trace::Trace::default()),
            (false, true) => st.trace = None,
            _ => {}
        }
    }

    /// Whether runs are being recorded as a trace.
    pub fn is_recording_trace(&self) -> bool {
        self.state.borrow().trace.is_some()
    }

    /// The runs recorded since recording started or the last call; recording
    /// goes on if it was on. Blocks allocated through the `Allocator` trait
    /// are not in the trace.
    pub fn take_trace(&self) -> crate::trace::Trace {
        let mut st = self.state.borrow_mut();
        match &mut st.trace {
            Some(t) => core::mem::take(t),
            None => crate::trace::Trace::default(),
        }
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

    /// Frees the block in span `span`; used by [`Block`]'s drop.
    pub(crate) fn release(&self, span: SpanId) {
        let result = self.state.borrow_mut().free(span);
        debug_assert!(result.is_ok(), "a live block was not found in its arena");
    }

    /// Frees planned block `index` of plan block `slot`; used by [`Block`]'s drop.
    fn release_planned(&self, slot: u32, index: u32, size: usize) {
        self.state.borrow_mut().free_planned(slot, index, size);
    }

    fn finish_run(&self) -> (RunReport, Recording) {
        self.state.borrow_mut().finish_run()
    }
}

impl<A: Allocator> State<A> {
    #[inline]
    fn check(&self) {
        // Not while unwinding: a failed check inside a `Block`'s drop would
        // panic again and abort the process before the first panic reports.
        #[cfg(any(test, fuzzing, feature = "check-invariants"))]
        if !std::thread::panicking() {
            self.check_invariants();
        }
    }

    /// Bytes in live blocks: the pool's, minus the unused part of plan blocks.
    fn in_use(&self) -> usize {
        self.pool.in_use() - (self.plan_reserved - self.planned_live)
    }

    /// Draws the block of `plan` from the pool and returns its serving state.
    fn draw_plan_block(&mut self, plan: Arc<Plan>) -> Result<Serve, ArenaError> {
        self.check();
        let size = self.pool.span_size(plan.size(), plan.align())?;
        let tag = Tag {
            run: self.next_run,
            index: 0,
            rec: PLAN_BLOCK,
            len: size,
            #[cfg(debug_assertions)]
            location: Location::caller(),
        };
        let raw = self.pool.alloc(size, plan.align(), tag)?;
        let block = PlanBlock {
            raw,
            live: 0,
            live_bytes: 0,
            open: true,
        };
        let slot = match self.plan_blocks.iter().position(Option::is_none) {
            Some(i) => {
                self.plan_blocks[i] = Some(block);
                i
            }
            None => {
                self.plan_blocks.push(Some(block));
                self.plan_blocks.len() - 1
            }
        };
        self.plan_reserved += size;
        Ok(Serve {
            plan,
            slot: slot as u32,
            pos: 0,
            deviated: false,
            // A trace needs every block's requested bytes: record throughout.
            recording: self.trace.is_some(),
        })
    }

    /// Allocates a block for the caller: from the plan serving the run when
    /// the run still follows it, else from the pool.
    fn alloc(
        &mut self,
        len: usize,
        align: usize,
        location: &'static Location<'static>,
    ) -> Result<Handed, ArenaError> {
        let size = self.pool.span_size(len, align)?;
        let raw_align = align;
        let align = align.max(self.pool.granule());
        if let Some(run) = &mut self.run {
            if let Some(serve) = &mut run.serve {
                let index = run.blocks;
                let pb_size = self.plan_blocks[serve.slot as usize]
                    .as_ref()
                    .map_or(0, |pb| pb.raw.size);
                // Always checked, also in release builds: the block lies
                // inside the plan's block. A validated plan always passes;
                // were it not to, the run deviates instead of handing out
                // memory outside the block.
                let offset = serve
                    .plan
                    .offset(index as usize)
                    .filter(|&o| o.checked_add(size).is_some_and(|end| end <= pb_size));
                if let (false, true, Some(offset)) = (
                    serve.deviated,
                    serve.plan.serves_alloc(serve.pos, index, size, align),
                    offset,
                ) {
                    if serve.plan.block(index as usize) != Some((size, align)) {
                        // Served, but smaller than recorded: this run's own
                        // recording differs from the plan's from here on.
                        Self::materialize(serve, &mut run.rec, run.blocks);
                    }
                    let pb = self.plan_blocks[serve.slot as usize]
                        .as_mut()
                        .expect("the serving plan's block is live");
                    // SAFETY: `offset + size <= pb.raw.size` (checked just above): the
                    // pointer stays inside the plan's block, a live span of the pool.
                    let ptr = unsafe { pb.raw.ptr.add(offset) };
                    pb.live += 1;
                    pb.live_bytes += size;
                    serve.pos += 1;
                    let slot = serve.slot;
                    if serve.recording {
                        run.rec.alloc(size, align);
                        if self.trace.is_some() {
                            run.lens.push(len);
                        }
                    }
                    run.blocks += 1;
                    run.allocs += 1;
                    run.planned_allocs += 1;
                    self.planned_live += size;
                    self.planned_allocs += 1;
                    self.allocs += 1;
                    let in_use = self.pool.in_use() - (self.plan_reserved - self.planned_live);
                    self.peak_in_use = self.peak_in_use.max(in_use);
                    run.peak = run.peak.max(in_use);
                    return Ok(Handed::Planned {
                        ptr,
                        slot,
                        index,
                        size,
                    });
                }
                if !serve.deviated {
                    Self::materialize(serve, &mut run.rec, run.blocks);
                    serve.deviated = true;
                    self.deviations += 1;
                }
            }
        }
        debug_assert!(size > 0);
        self.alloc_pool(len, raw_align, location, true)
            .map(Handed::Pool)
    }

    /// Allocates from the pool; `planable` blocks enter the run's recording.
    fn alloc_pool(
        &mut self,
        len: usize,
        align: usize,
        location: &'static Location<'static>,
        planable: bool,
    ) -> Result<RawBlock, ArenaError> {
        self.check();
        let size = self.pool.span_size(len, align)?;
        let (run, index, rec) = match &self.run {
            Some(r) => (
                r.id,
                r.pool_allocs,
                if planable { r.blocks } else { NOT_PLANNED },
            ),
            None => (0, 0, NOT_PLANNED),
        };
        let tag = Tag {
            run,
            index,
            rec,
            len,
            #[cfg(debug_assertions)]
            location,
        };
        #[cfg(not(debug_assertions))]
        let _ = location;
        let raw = self.pool.alloc(size, align, tag)?;
        self.allocs += 1;
        let in_use = self.in_use();
        self.peak_in_use = self.peak_in_use.max(in_use);
        let granule = self.pool.granule();
        if let Some(r) = &mut self.run {
            r.ops.push(RunOp::Alloc {
                size,
                align: align.max(granule),
                len,
            });
            r.pool_allocs += 1;
            if rec != NOT_PLANNED {
                r.blocks += 1;
                r.rec.alloc(size, align.max(granule));
                if self.trace.is_some() {
                    r.lens.push(len);
                }
            }
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

    fn free(&mut self, span: SpanId) -> Result<(), crate::freemap::FreeError> {
        self.check();
        let (size, tag) = self.pool.free(span)?;
        self.frees += 1;
        if let Some(r) = &mut self.run {
            r.frees += 1;
            if tag.run == r.id {
                r.ops.push(RunOp::Free { index: tag.index });
                r.live_blocks -= 1;
                r.live_bytes -= size;
                if tag.rec != NOT_PLANNED {
                    Self::record_free(r, tag.rec, &mut self.deviations);
                }
            }
        }
        Ok(())
    }

    /// Records the free of block `index`, following it in the serving plan.
    fn record_free(run: &mut OpenRun, index: u32, deviations: &mut u64) {
        match &mut run.serve {
            None => run.rec.free(index),
            Some(serve) => {
                if !serve.deviated {
                    if serve.plan.expects_free(serve.pos, index) {
                        serve.pos += 1;
                    } else {
                        Self::materialize(serve, &mut run.rec, run.blocks);
                        serve.deviated = true;
                        *deviations += 1;
                    }
                }
                if serve.recording {
                    run.rec.free(index);
                }
            }
        }
    }

    /// Starts keeping the run's own recording: what the run did so far is
    /// the plan's recording up to `serve.pos` (its first `blocks` blocks).
    fn materialize(serve: &mut Serve, rec: &mut Recording, blocks: u32) {
        if serve.recording {
            return;
        }
        let plan = serve.plan.recording();
        rec.blocks
            .extend_from_slice(&plan.blocks[..(blocks as usize).min(plan.blocks.len())]);
        rec.events
            .extend_from_slice(&plan.events[..serve.pos.min(plan.events.len())]);
        serve.recording = true;
    }

    fn free_planned(&mut self, slot: u32, index: u32, size: usize) {
        self.check();
        self.frees += 1;
        self.planned_live -= size;
        let Some(pb) = self
            .plan_blocks
            .get_mut(slot as usize)
            .and_then(Option::as_mut)
        else {
            debug_assert!(false, "planned block of a released plan block");
            return;
        };
        pb.live -= 1;
        pb.live_bytes -= size;
        let orphan_done = !pb.open && pb.live == 0;
        if let Some(r) = &mut self.run {
            r.frees += 1;
            if r.serve.as_ref().is_some_and(|s| s.slot == slot) {
                Self::record_free(r, index, &mut self.deviations);
            }
        }
        if orphan_done {
            self.release_plan_block(slot);
        }
    }

    /// Returns plan block `slot` to the pool.
    fn release_plan_block(&mut self, slot: u32) {
        if let Some(pb) = self.plan_blocks[slot as usize].take() {
            self.plan_reserved -= pb.raw.size;
            let freed = self.pool.free(pb.raw.span);
            debug_assert!(freed.is_ok(), "plan block not live in the pool");
        }
    }

    fn watermark(&self) -> usize {
        self.recent.iter().copied().max().unwrap_or(0)
    }

    fn finish_run(&mut self) -> (RunReport, Recording) {
        self.check();
        let Some(mut run) = self.run.take() else {
            return (RunReport::default(), Recording::new());
        };
        let mut planned = false;
        let mut deviated = false;
        if let Some(mut serve) = run.serve.take() {
            planned = true;
            if !serve.deviated && serve.pos != serve.plan.event_count() {
                // The run did less than recorded (or kept blocks past its end).
                Self::materialize(&mut serve, &mut run.rec, run.blocks);
                self.deviations += 1;
                deviated = true;
            }
            deviated |= serve.deviated;
            let slot = serve.slot;
            let pb = self.plan_blocks[slot as usize]
                .as_mut()
                .expect("the serving plan's block is live");
            pb.open = false;
            // Planned blocks still live are the run's leaks too.
            run.live_blocks += pb.live;
            run.live_bytes += pb.live_bytes;
            if pb.live == 0 {
                self.release_plan_block(slot);
                run.ops.push(RunOp::Free { index: 0 });
            }
        }
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
            if let Some(bytes) = self.pool.try_relayout(self.need_since_shrink) {
                released += bytes;
                relaid_out = true;
                self.relayouts += 1;
            }
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
            planned,
            deviated,
            planned_allocs: run.planned_allocs,
        };
        run.ops.clear();
        self.spare_ops = core::mem::take(&mut run.ops);
        if let Some(trace) = &mut self.trace {
            let label = run.label.take().unwrap_or_else(|| format!("run{}", run.id));
            trace.runs.push(crate::trace::TraceRun::from_recording(
                label, &run.rec, &run.lens,
            ));
        }
        (report, run.rec)
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
                    // Down to what these runs needed, but never below what
                    // the watermark window still covers.
                    let target = self.below.1.max(self.watermark());
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
            in_use: self.in_use(),
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
            live_blocks: self.live_count(),
            runs: self.runs,
            shrinks: self.shrinks,
            relayouts: self.relayouts,
            planned_allocs: self.planned_allocs,
            planned_runs: self.planned_runs,
            deviations: self.deviations,
        }
    }

    /// Live blocks of the caller's: pool blocks other than plan blocks, and
    /// planned blocks.
    fn live_count(&self) -> usize {
        let plan_blocks = self.plan_blocks.iter().flatten();
        let planned: usize = plan_blocks.clone().map(|b| b.live).sum();
        self.pool.live_count() - plan_blocks.count() + planned
    }

    /// Pool blocks of the caller's (planned blocks are counted in
    /// [`Stats::live_blocks`] but not listed: they carry no tag).
    fn live_blocks(&self) -> Vec<LiveBlock> {
        self.pool
            .live()
            .filter(|(_, _, tag)| tag.rec != PLAN_BLOCK)
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
        let in_use = self.in_use();
        if let Some(r) = &self.run {
            assert!(r.live_bytes <= in_use);
            assert!(r.peak >= in_use);
        }
        assert!(self.peak_in_use >= in_use);
        let plan_blocks: usize = self.plan_blocks.iter().flatten().map(|b| b.raw.size).sum();
        assert_eq!(plan_blocks, self.plan_reserved);
        assert!(self.planned_live <= self.plan_reserved);
        for pb in self.plan_blocks.iter().flatten() {
            assert!(
                pb.open || pb.live > 0,
                "a finished plan block with nothing live"
            );
            assert!(self.pool.get(pb.raw.span).is_some());
        }
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
    Pool { span: SpanId },
    /// A place in a planned run's block.
    Planned { slot: u32, index: u32, size: usize },
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

impl<'a, A: Allocator> Block<'a, A> {
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
            Origin::Pool { span } => self.arena.state.borrow().pool.get(span).map_or(0, |s| s.0),
            Origin::Planned { size, .. } => size,
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

    /// The block as a typed buffer of `len() / size_of::<T>()` elements.
    ///
    /// # Errors
    /// Gives the block back when `T` is zero-sized, needs more alignment
    /// than the block's address has, or the length is not a multiple of
    /// `size_of::<T>()`.
    pub fn into_typed<T: bytemuck::Pod>(self) -> Result<TypedBlock<'a, T, A>, Self> {
        let size = size_of::<T>();
        if size == 0 || self.len % size != 0 || self.ptr.as_ptr() as usize % align_of::<T>() != 0 {
            return Err(self);
        }
        Ok(TypedBlock {
            len: self.len / size,
            block: self,
            _elem: core::marker::PhantomData,
        })
    }
}

/// A [`Block`] viewed as a slice of `T`: derefs to `[T]`; from
/// [`Arena::try_alloc_slice`] or [`Block::into_typed`].
pub struct TypedBlock<'a, T, A: Allocator = Global> {
    block: Block<'a, A>,
    /// Elements; `len * size_of::<T>() == block.len()`.
    len: usize,
    _elem: core::marker::PhantomData<T>,
}

impl<'a, T: bytemuck::Pod, A: Allocator> TypedBlock<'a, T, A> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there is no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The untyped block.
    pub fn into_block(self) -> Block<'a, A> {
        self.block
    }
}

impl<T: bytemuck::Pod, A: Allocator> Deref for TypedBlock<'_, T, A> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // Checked when the typed block was made (size and alignment), so
        // this cast cannot fail; bytemuck checks it again.
        bytemuck::cast_slice(&self.block)
    }
}

impl<T: bytemuck::Pod, A: Allocator> DerefMut for TypedBlock<'_, T, A> {
    fn deref_mut(&mut self) -> &mut [T] {
        bytemuck::cast_slice_mut(&mut self.block)
    }
}

impl<T, A: Allocator> fmt::Debug for TypedBlock<'_, T, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TypedBlock")
            .field("ptr", &self.block.ptr)
            .field("len", &self.len)
            .field("elem", &core::any::type_name::<T>())
            .finish()
    }
}

impl<A: Allocator> Deref for Block<'_, A> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` bytes (a live span, whose region stays while it lives,
        // or dangling with `len == 0`), initialized (the pool zeroes memory the first time it
        // hands it out), and no other block overlaps them.
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
        match self.origin {
            Origin::Empty => {}
            Origin::Pool { span } => self.arena.release(span),
            Origin::Planned { slot, index, size } => {
                self.arena.release_planned(slot, index, size);
            }
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

    /// Names the run in a recorded trace (default `run<id>`); the trace
    /// format wants no whitespace, so it is replaced by `_`.
    pub fn set_label(&self, label: &str) {
        let clean: String = label
            .chars()
            .map(|c| if c.is_whitespace() { '_' } else { c })
            .collect();
        if let Some(run) = &mut self.arena.state.borrow_mut().run {
            run.label = Some(clean);
        }
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

    /// A typed buffer in the run; the same as [`Arena::try_alloc_slice`].
    ///
    /// # Errors
    /// As [`Arena::try_alloc_slice`].
    #[track_caller]
    pub fn try_alloc_slice<T: bytemuck::Pod>(
        &self,
        len: usize,
    ) -> Result<TypedBlock<'a, T, A>, ArenaError> {
        typed(self.arena.alloc_slice_bytes::<T>(len, Location::caller())?)
    }

    /// Closes the run and reports what it did. Blocks of the run still live
    /// are counted as leaked; they stay valid until dropped.
    pub fn finish(mut self) -> RunReport {
        self.close(false).0
    }

    /// Closes the run and also returns its [`Recording`], from which a
    /// [`Plan`] for runs of the same shape can be made. A planned run that
    /// followed its plan exactly returns an empty recording: its plan's
    /// recording is already the run's.
    pub fn finish_with_recording(mut self) -> (RunReport, Recording) {
        self.close(true)
    }

    fn close(&mut self, keep_recording: bool) -> (RunReport, Recording) {
        self.open = false;
        let (report, mut rec) = self.arena.finish_run();
        let mut scratch = core::mem::take(&mut self.scratch);
        scratch.reset();
        let mut st = self.arena.state.borrow_mut();
        st.scratch = Some(scratch);
        if !keep_recording {
            rec.clear();
            st.spare_rec = core::mem::take(&mut rec);
        }
        (report, rec)
    }
}

impl<A: Allocator> Drop for Run<'_, A> {
    fn drop(&mut self) {
        if self.open {
            self.close(false);
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
            .alloc_pool(layout.size(), layout.align(), Location::caller(), false)
            .map_err(|_| AllocError)?;
        self.state.borrow_mut().pool.track_addr(&raw);
        Ok(NonNull::slice_from_raw_parts(raw.ptr, raw.size))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() == 0 {
            return;
        }
        let mut st = self.state.borrow_mut();
        let Some(span) = st.pool.take_by_addr(ptr) else {
            debug_assert!(
                false,
                "deallocate: {ptr:p} is not a live block of this arena (foreign pointer or double free)"
            );
            return;
        };
        st.pool.zero_block(span);
        let result = st.free(span);
        debug_assert!(
            result.is_ok(),
            "deallocate: {ptr:p} is not a live block of this arena (double free?): {result:?}"
        );
    }
}

/// Wraps a block just allocated for `T` (size and alignment already right).
fn typed<T: bytemuck::Pod, A: Allocator>(
    block: Block<'_, A>,
) -> Result<TypedBlock<'_, T, A>, ArenaError> {
    if size_of::<T>() == 0 {
        // A slice of zero-sized elements needs no memory; the block is empty.
        return Ok(TypedBlock {
            block,
            len: 0,
            _elem: core::marker::PhantomData,
        });
    }
    let len = block.len();
    block
        .into_typed()
        .map_err(|_| ArenaError::CapacityOverflow { requested: len })
}

/// A non-null pointer aligned to `align`, for zero-size allocations.
pub(crate) fn dangling_for(align: usize) -> NonNull<u8> {
    // A zero-size allocation may use any non-null, aligned address; the
    // alignment itself is one (the same trick as `NonNull::dangling`).
    NonNull::new(core::ptr::without_provenance_mut(align)).unwrap_or(NonNull::dangling())
}
