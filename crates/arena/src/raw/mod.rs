//! The arena's core, [`RawArena`]: blocks, runs, watermark, plans and
//! stats over a memory layer, in offsets and addresses. Nothing here reads
//! or writes the memory.

use crate::config::ArenaConfig;
use crate::freemap::{FreeError, RegionId, RunOp, SpanId};
use crate::memory::Memory;
use crate::plan::{Deviation, Plan, Recording};
use crate::pool::{Pool, RawBlock, Tag, NOT_PLANNED};
use crate::ArenaError;
use core::panic::Location;
use std::collections::VecDeque;
use std::sync::Arc;

mod fallback;
mod finish;
mod loose;
mod repair;
mod serve;
mod tentative;
mod workspace;

pub(crate) use tentative::may_be_extra;

/// The arena's core: blocks, runs, watermark, plans and stats over a
/// [`Memory`] layer, in offsets and the layer's addresses. It never reads
/// or writes the memory, so it serves host memory (the [`Arena`] shell
/// adds `&[u8]` views) and device memory alike.
///
/// [`Arena`]: crate::Arena
pub struct RawArena<M: Memory> {
    /// Unique in the process; every handle carries it.
    id: u64,
    /// Generation of each pool span, by span id: bumped when the span is
    /// freed, so a handle kept past its free no longer matches.
    span_gens: Vec<u32>,
    /// Generation the next plan block gets.
    next_plan_gen: u32,
    pool: Pool<M>,
    config: ArenaConfig,
    /// The open run, if any.
    run: Option<OpenRun>,
    /// Id the next run gets; run ids start at 1 (0 tags blocks outside runs).
    next_run: u64,
    /// A spare operation log, kept to avoid allocating one per run.
    spare_ops: Vec<RunOp>,
    /// A spare per-block table for plan blocks, likewise.
    spare_served: Vec<usize>,
    /// A spare recording, likewise.
    spare_rec: Recording,
    /// Blocks drawn for planned runs, by slot; a slot outlives its run while
    /// a planned block of it is still live.
    plan_blocks: Vec<Option<PlanBlock<M::Ptr>>>,
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
    /// Whether `ops` is kept: for a run whose recording is wanted (see
    /// [`RawArena::begin_run`]), while a trace is recorded, and for a run
    /// that did not start on one wholly free region or may leave it (memory
    /// that grows by regions): its high-water mark is then simulated from
    /// `ops`. A run that keeps none only counts.
    log: bool,
    /// Whether the run's recording was asked for at its start.
    recorded: bool,
    /// Whether a trace was being recorded when the run began: only such a
    /// run enters the trace (one begun before the trace started has no
    /// complete log to derive it from).
    traced: bool,
    /// Bytes the run placed outside its `clean` region: with no log, its
    /// high-water mark is estimated from them (see `finish`).
    outside: usize,
    /// The run's pool allocations and frees, in order (if `log`).
    ops: Vec<RunOp>,
    /// `RunOp::Alloc` entries in `ops` (the index the next one gets).
    pool_allocs: u32,
    /// The arena's allocations, frees and planned allocations when the run
    /// began: the run's own are the differences (one counter per event,
    /// not two).
    allocs_at_start: u64,
    frees_at_start: u64,
    planned_allocs_at_start: u64,
    /// Blocks of this run still live, and their bytes.
    live_blocks: usize,
    live_bytes: usize,
    peak: usize,
    backing_allocs_at_start: u64,
    backing_frees_at_start: u64,
    commits_at_start: u64,
    decommits_at_start: u64,
    /// `Some(region)` if the run started on exactly one wholly free region:
    /// then its high-water mark is simply `max_end` in that region.
    clean: Option<RegionId>,
    max_end: usize,
    /// The run's planable blocks and events, for a planned run only (see
    /// [`Serve::recording`]): a dynamic run's are derived from `ops` when
    /// it ends, if wanted.
    rec: Recording,
    /// Planable blocks allocated so far (the next one's index).
    blocks: u32,
    /// The plan serving this run, if any.
    serve: Option<Serve>,
    /// Bytes requested by each recorded block (kept only while a trace is
    /// being recorded).
    lens: Vec<usize>,
    /// The run's label in a recorded trace.
    label: Option<String>,
}

/// A plan serving the open run.
struct Serve {
    plan: Arc<Plan>,
    /// Slot of the plan's block in `RawArena::plan_blocks`.
    slot: u32,
    /// Events of the run so far, all as recorded in the plan.
    pos: usize,
    /// Whether the run has left the plan (the rest is served dynamically).
    deviated: bool,
    /// Why it left (set with `deviated`, on the cold path).
    why: Option<Deviation>,
    /// Whether the run's own recording is kept. A run that follows its plan
    /// exactly records nothing (its recording is the plan's); at the first
    /// difference the plan's recording so far is copied into the run's and
    /// recording goes on from there.
    recording: bool,
    /// After the run left the plan, how the rest is served inside the
    /// plan's block ([`loose`]); `None` before, and once the block was
    /// dissolved.
    loose: Option<Box<loose::Loose>>,
    /// After the block was dissolved, where the rest of the plan was
    /// placed again ([`repair`]); `None` before, or where it was not.
    repair: Option<Box<repair::Repair>>,
    /// Set when the run leaves the plan: whether every block it allocated
    /// so far is where a dynamic arena would have put it (the plan starts
    /// with the run's own placement, [`Plan::run_order_start`], past
    /// them). The rest is then left to the pool's best fit, which goes on
    /// as that arena would: not served inside the block first, nor
    /// repaired.
    straight: bool,
    /// Whether a block was served smaller than its slot: the blocks are
    /// then where the plan's sizes put them, not the run's (a dynamic
    /// arena's placement of the run's own sizes may differ).
    resized: bool,
    /// Whether a block was served at most half its slot: the run's blocks
    /// may no longer be the plan's by index (an extra one took a slot).
    halved: bool,
    /// Whether a block was served beside the plan's block (not where a
    /// dynamic arena would have it, [`RawArena::alloc_past_plan`]).
    beside: bool,
    /// A block served in a hole of the plan's block that is a workspace
    /// if freed next ([`workspace`]).
    pending: Option<workspace::Pending>,
    /// The flags before the latest block served smaller than its slot.
    undo: Option<workspace::Undo>,
    /// A small block where the plan allocates, served beside the plan's
    /// block until the next event says whether it is the plan's
    /// ([`tentative`]).
    tentative: Option<tentative::Tentative>,
    /// Blocks the plan does not have that the run made where the plan
    /// allocates, served beside it ([`tentative`]).
    extras: u32,
    /// Whether the run's next block goes past the plan's block: it has no
    /// room inside, and the rest of the plan placed again around what is
    /// live would reach further than the block and it together
    /// ([`RawArena::leave_block`]).
    past_next: bool,
}

/// A block drawn from the pool to serve a planned run.
struct PlanBlock<P> {
    raw: RawBlock<P>,
    /// Generation of the blocks served from it (handles carry it).
    generation: u32,
    /// Size of each planned block served from it and still live, by block
    /// index; 0 for none (so a stale or repeated free is refused).
    served: Vec<usize>,
    /// Planned blocks of it still live, and their bytes.
    live: usize,
    live_bytes: usize,
    /// Whether its run is still open.
    open: bool,
    /// Whether it has been dissolved ([`RawArena::dissolve`]): its live
    /// planned blocks are spans of the pool now (`spans`, by block index),
    /// the rest of it free memory of the pool, and `raw` no longer a span.
    dissolved: bool,
    /// The pool span of each planned block still live, by block index,
    /// once dissolved (empty before).
    spans: Vec<SpanId>,
    /// How many times each block index was handed out and taken back as a
    /// workspace ([`workspace`]), by index (empty for none): its handles
    /// carry it, so a workspace's handle does not free the block after it.
    reissued: Vec<u32>,
}

/// A block handed out by a [`RawArena`]: its address and the handle that
/// gives it back ([`RawArena::free`]).
#[derive(Clone, Copy, Debug)]
pub struct RawAlloc<P> {
    /// Address of the first byte.
    pub ptr: P,
    /// How to give it back.
    pub handle: Handle,
}

/// Identifies a live block of a [`RawArena`]; pass it to [`RawArena::free`]
/// once.
///
/// A handle names its arena and its block's generation: a handle of
/// another arena, or one whose block was freed (even if its place now holds
/// another block), is refused with a [`FreeError`], never frees someone
/// else's block. Handles can only be made by the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle {
    pub(crate) kind: HandleKind,
    /// [`RawArena::id`] of the arena that made it.
    arena: u64,
    /// The block's generation: the span's (pool) or the plan block's
    /// (planned) when it was handed out.
    generation: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HandleKind {
    /// A span of the pool.
    Pool { span: SpanId },
    /// Block `index` of the plan block in `slot` (its size is in the plan
    /// block's table while it lives).
    Planned { slot: u32, index: u32 },
}

/// Ids of arenas ([`RawArena::id`]), from 1.
static NEXT_ARENA_ID: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(1);

// SAFETY: everything in a `RawArena` is `Send` except, possibly, the
// layer's addresses (`M::Ptr`: `NonNull<u8>` for host memory), which the
// core keeps as values and never reads or writes through. Moving the core
// to another thread therefore moves no access to memory; the memory itself
// is the layer's (`M: Send`), and host layers promise that any thread may
// use it (`HostMemory`).
unsafe impl<M: Memory + Send> Send for RawArena<M> {}

impl<M: Memory> RawArena<M> {
    /// A core over `memory`; reserves nothing until the first request.
    ///
    /// # Errors
    /// [`ArenaError::InvalidConfig`] for an inconsistent configuration, or
    /// a memory layer whose granule is not a power of two.
    pub fn new(config: ArenaConfig, memory: M) -> Result<Self, ArenaError> {
        config.validate()?;
        if !memory.props().granule.is_power_of_two() {
            return Err(ArenaError::InvalidConfig(
                "the memory layer's granule must be a power of two",
            ));
        }
        Ok(Self {
            id: NEXT_ARENA_ID.fetch_add(1, core::sync::atomic::Ordering::Relaxed),
            span_gens: Vec::new(),
            next_plan_gen: 0,
            pool: Pool::new(&config, memory),
            config,
            run: None,
            next_run: 1,
            spare_ops: Vec::new(),
            spare_served: Vec::new(),
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
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ArenaConfig {
        &self.config
    }

    /// The memory layer.
    pub fn memory(&self) -> &M {
        self.pool.memory()
    }

    /// Allocates `len > 0` bytes at `align` (a power of two, at most
    /// [`ArenaConfig::max_align`]): from the plan serving the open run when
    /// the run still follows it, else from the pool.
    ///
    /// # Errors
    /// As [`Arena::try_alloc_aligned`](crate::Arena::try_alloc_aligned);
    /// a zero `len` is [`ArenaError::CapacityOverflow`] here (the host
    /// shell serves it without the core).
    #[track_caller]
    pub fn alloc(&mut self, len: usize, align: usize) -> Result<RawAlloc<M::Ptr>, ArenaError> {
        if len == 0 {
            return Err(ArenaError::CapacityOverflow { requested: 0 });
        }
        self.alloc_at(len, align, Location::caller())
    }

    /// This arena's id, unique in the process (handles carry it).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The granule: every block's size is a multiple of it, and its
    /// alignment at least it.
    pub(crate) fn granule(&self) -> usize {
        self.pool.granule()
    }

    /// Gives a block back.
    ///
    /// # Errors
    /// [`FreeError`] when `handle` names no live block of this arena:
    /// [`FreeError::Foreign`] for another arena's handle,
    /// [`FreeError::AlreadyFree`] for a block freed already (also when its
    /// place holds a newer block now). Nothing changes then.
    #[inline]
    pub fn free(&mut self, handle: Handle) -> Result<(), FreeError> {
        if handle.arena != self.id {
            return Err(FreeError::Foreign);
        }
        match handle.kind {
            HandleKind::Pool { span } => {
                // Handles cannot be forged: one of this arena that names no
                // current block names a block freed already.
                if self.span_gens.get(span as usize) != Some(&handle.generation) {
                    return Err(FreeError::AlreadyFree);
                }
                self.free_span(span)
            }
            HandleKind::Planned { slot, index } => {
                self.free_planned(slot, index, handle.generation)
            }
        }
    }

    /// Bytes the block of `handle` holds (its request rounded up to the
    /// alignment), or 0 if it is not a live block of this arena.
    pub fn capacity(&self, handle: Handle) -> usize {
        if self.check_handle(handle).is_err() {
            return 0;
        }
        match handle.kind {
            HandleKind::Pool { span } => self.pool.get(span).map_or(0, |s| s.0),
            HandleKind::Planned { slot, index } => self
                .plan_blocks
                .get(slot as usize)
                .and_then(Option::as_ref)
                .and_then(|pb| pb.served.get(index as usize).copied())
                .unwrap_or(0),
        }
    }

    /// Whether `handle` was made by this arena for a block of the current
    /// generation (live, or freed and not handed out again: the frees then
    /// tell which).
    #[inline]
    fn check_handle(&self, handle: Handle) -> Result<(), FreeError> {
        if handle.arena != self.id {
            return Err(FreeError::Foreign);
        }
        let current = match handle.kind {
            HandleKind::Pool { span } => self.span_gens.get(span as usize).copied(),
            HandleKind::Planned { slot, index } => self
                .plan_blocks
                .get(slot as usize)
                .and_then(Option::as_ref)
                .map(|pb| pb.generation_of(index)),
        };
        // Handles cannot be forged: one of this arena that names no current
        // block names a block freed already (its plan block may be gone).
        match current {
            Some(g) if g == handle.generation => Ok(()),
            _ => Err(FreeError::AlreadyFree),
        }
    }

    /// A handle of this arena.
    pub(crate) fn handle(&self, kind: HandleKind, generation: u32) -> Handle {
        Handle {
            kind,
            arena: self.id,
            generation,
        }
    }

    /// Opens a run, served by `plan` if given; returns its id.
    ///
    /// `record` asks for the run's [`Recording`] (from which a plan is
    /// made): a dynamic run then logs its pool operations, and
    /// [`RawArena::finish_run`] derives the recording from them. Without
    /// it a run that starts on one wholly free region only counts, and
    /// `finish_run` returns an empty recording. A planned run records from
    /// the point where it leaves its plan either way.
    ///
    /// # Errors
    /// [`ArenaError::RunAlreadyOpen`], or the errors of drawing the plan's
    /// block.
    pub fn begin_run(&mut self, plan: Option<Arc<Plan>>, record: bool) -> Result<u64, ArenaError> {
        if self.run.is_some() {
            return Err(ArenaError::RunAlreadyOpen);
        }
        let calls = self.pool.calls;
        // A run that starts on one wholly free region is placed the same
        // way whatever that region's size (and measured in place): with
        // the front coalesced, as the simulation starts.
        self.pool.flush_front();
        let clean = match self.pool.single_region() {
            Some((rid, _)) if self.pool.in_use() == 0 => Some(rid),
            _ => None,
        };
        // By regions, with blocks of earlier runs live (outputs held), the
        // run is dynamic and recorded (docs/decisions.md, "Plans on the heap layer").
        let pinned = !self.pool.in_place() && self.pool.live_count() > 0;
        let mut record = record;
        let serve = match plan {
            Some(plan) if plan.size() > 0 && pinned && self.pool.blocks_of_runs_live() => {
                record = true;
                None
            }
            Some(plan) if plan.size() > 0 => Some(self.draw_plan_block(plan)?),
            _ => None,
        };
        let id = self.next_run;
        self.next_run += 1;
        let mut ops = core::mem::take(&mut self.spare_ops);
        ops.clear();
        let mut rec = core::mem::take(&mut self.spare_rec);
        rec.clear();
        let mut max_end = 0;
        // Memory that grows by regions ([`Heap`]) leaves the region a run
        // started on whenever it grows; its high-water mark is simulated.
        let log = record || clean.is_none() || self.trace.is_some() || !self.pool.in_place();
        if let Some(serve) = &serve {
            // The plan's block is the run's first pool allocation.
            let raw = self.plan_blocks[serve.slot as usize]
                .as_ref()
                .expect("just drawn")
                .raw;
            if clean == Some(raw.rid) {
                max_end = raw.off + raw.size;
            }
            if log {
                ops.push(RunOp::alloc(
                    raw.size,
                    serve.plan.align().max(self.pool.granule()),
                    false,
                ));
            }
            self.planned_runs += 1;
        }
        let peak = self.in_use();
        // The plan's block is the run's first pool allocation, logged or not.
        let pool_allocs = u32::from(serve.is_some());
        self.run = Some(OpenRun {
            id,
            log,
            recorded: record,
            traced: self.trace.is_some(),
            // An unlogged run is on memory that grows in place: the plan's
            // block came from its one region.
            outside: 0,
            ops,
            pool_allocs,
            allocs_at_start: self.allocs,
            frees_at_start: self.frees,
            planned_allocs_at_start: self.planned_allocs,
            live_blocks: 0,
            live_bytes: 0,
            peak,
            backing_allocs_at_start: calls.reserves,
            backing_frees_at_start: calls.releases,
            commits_at_start: calls.commits,
            decommits_at_start: calls.decommits,
            clean,
            max_end,
            rec,
            blocks: 0,
            serve,
            lens: Vec::new(),
            label: None,
        });
        Ok(id)
    }

    /// Whether a run is open.
    pub fn in_run(&self) -> bool {
        self.run.is_some()
    }

    /// Names the open run in a recorded trace.
    pub(crate) fn set_label(&mut self, label: String) {
        if let Some(run) = &mut self.run {
            run.label = Some(label);
        }
    }

    /// Makes sure `bytes` can be served with no memory-layer call; see
    /// [`Arena::reserve`](crate::Arena::reserve).
    ///
    /// # Errors
    /// As [`RawArena::alloc`].
    pub fn reserve(&mut self, bytes: usize) -> Result<(), ArenaError> {
        if bytes == 0 {
            return Ok(());
        }
        self.check();
        let size = self.pool.span_size(bytes, 1)?;
        let idle_target = self.need_since_shrink.max(size);
        self.pool.reserve(size, idle_target)
    }

    /// Starts or stops recording runs as a trace.
    pub(crate) fn record_trace(&mut self, on: bool) {
        match (on, self.trace.is_some()) {
            (true, false) => self.trace = Some(crate::trace::Trace::default()),
            (false, true) => self.trace = None,
            _ => {}
        }
    }

    pub(crate) fn is_recording_trace(&self) -> bool {
        self.trace.is_some()
    }

    pub(crate) fn take_trace(&mut self) -> crate::trace::Trace {
        match &mut self.trace {
            Some(t) => core::mem::take(t),
            None => crate::trace::Trace::default(),
        }
    }

    /// Keeps an emptied recording's capacity for the next run.
    pub(crate) fn recycle_recording(&mut self, mut rec: Recording) {
        rec.clear();
        self.spare_rec = rec;
    }

    /// Lowers `peak_in_use` to the bytes in use now.
    pub fn reset_peak(&mut self) {
        self.peak_in_use = self.pool.in_use();
    }

    /// The address of live span `span`, for the host shell's `Allocator`
    /// interface.
    pub(crate) fn span_address(&self, span: SpanId) -> Option<(M::Ptr, usize)> {
        let (size, _) = self.pool.get(span)?;
        let (rid, off): (RegionId, usize) = self.pool.position(span)?;
        Some((self.pool.address(rid, off)?, size))
    }
}

impl<M: Memory> RawArena<M> {
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

    /// Allocates a block for the caller: from the plan serving the run when
    /// the run still follows it, else from the pool.
    #[inline]
    pub(crate) fn alloc_at(
        &mut self,
        len: usize,
        align: usize,
        location: &'static Location<'static>,
    ) -> Result<RawAlloc<M::Ptr>, ArenaError> {
        if let Some(served) = self.alloc_planned(len, align) {
            return Ok(served);
        }
        if self.settle_tentative_by_alloc(len) {
            if let Some(served) = self.alloc_planned(len, align) {
                return Ok(served);
            }
        }
        if let Some(served) = self.alloc_apart(len, align) {
            return Ok(served);
        }
        if let Some(served) = self.alloc_tentative(len, align, location) {
            return served;
        }
        let beside = self.beside_plan(len);
        let in_block = !beside
            && self
                .run
                .as_ref()
                .and_then(|r| r.serve.as_ref())
                .is_some_and(|s| !s.deviated || s.loose.is_some());
        if in_block {
            // A bad request is an error, not a deviation (checked here
            // only then: `alloc_pool` checks it again).
            self.pool.span_size(len, align)?;
            if let Some(run) = &mut self.run {
                if let Some(serve) = run.serve.as_mut().filter(|s| !s.deviated) {
                    Self::leave(serve, run.blocks, &mut run.rec);
                    self.deviations += 1;
                }
            }
            // The rest of the run stays inside the plan's block while it
            // can; else the block is dissolved and the rest is served from
            // it first. A run whose blocks are all where a dynamic arena
            // would have them is left to the pool's best fit at once.
            let straight = self
                .run
                .as_ref()
                .and_then(|r| r.serve.as_ref())
                .is_some_and(|s| s.straight);
            if !straight {
                if let Some(served) = self.alloc_loose(len, align) {
                    return Ok(served);
                }
            }
            self.leave_block(len, align);
        }
        let raw = self.alloc_pool(len, align, location, !beside)?;
        Ok(self.pool_alloc_handle(raw))
    }

    /// The block and handle of pool span `raw`, just allocated.
    #[inline]
    fn pool_alloc_handle(&mut self, raw: RawBlock<M::Ptr>) -> RawAlloc<M::Ptr> {
        let i = raw.span as usize;
        if self.span_gens.len() <= i {
            self.span_gens.resize(i + 1, 0);
        }
        RawAlloc {
            ptr: raw.ptr,
            handle: self.handle(HandleKind::Pool { span: raw.span }, self.span_gens[i]),
        }
    }

    /// Allocates from the pool; `planable` blocks enter the run's recording.
    #[inline]
    pub(crate) fn alloc_pool(
        &mut self,
        len: usize,
        align: usize,
        location: &'static Location<'static>,
        planable: bool,
    ) -> Result<RawBlock<M::Ptr>, ArenaError> {
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
        let (raw, placed) = self.place_block(size, align, tag, planable)?;
        self.allocs += 1;
        let in_use = self.in_use();
        self.peak_in_use = self.peak_in_use.max(in_use);
        let granule = self.pool.granule();
        if let Some(r) = &mut self.run {
            if r.log {
                if let Some(off) = placed {
                    // Allocation 0 is the plan's block, dissolved.
                    r.ops.push(RunOp::Place { base: 0, off });
                }
                r.ops
                    .push(RunOp::alloc(size, align.max(granule), rec != NOT_PLANNED));
            }
            r.pool_allocs += 1;
            if rec != NOT_PLANNED {
                r.blocks += 1;
                // A dynamic run's recording is derived from `ops` when the
                // run ends, and only if it is wanted (`finish_run`); a
                // planned run that left its plan records from there on.
                if r.serve.is_some() {
                    r.rec.alloc(size, align.max(granule));
                }
                if self.trace.is_some() {
                    r.lens.push(len);
                }
            }
            r.live_blocks += 1;
            r.live_bytes += size;
            r.peak = r.peak.max(in_use);
            if r.clean == Some(raw.rid) {
                r.max_end = r.max_end.max(raw.off + size);
            } else {
                r.outside += size;
            }
        }
        Ok(raw)
    }

    /// Bytes live span `span` holds (0 if it is not live).
    pub(crate) fn span_capacity(&self, span: SpanId) -> usize {
        self.pool.get(span).map_or(0, |s| s.0)
    }

    #[inline]
    pub(crate) fn free_span(&mut self, span: SpanId) -> Result<(), crate::freemap::FreeError> {
        self.check();
        let (size, tag) = self.pool.free(span)?;
        if let Some(g) = self.span_gens.get_mut(span as usize) {
            *g = g.wrapping_add(1);
        }
        self.frees += 1;
        if let Some(r) = &mut self.run {
            if tag.run == r.id {
                if r.log {
                    r.ops.push(RunOp::Free { index: tag.index });
                }
                r.live_blocks -= 1;
                r.live_bytes -= size;
                let devs = &mut self.deviations;
                let rec = Self::settle_tentative_by_free(r, &mut self.pool, span, tag.rec, devs);
                if r.serve.as_ref().is_some_and(|s| s.pending.is_some()) {
                    // Another event before a pending workspace's free.
                    Self::settle_workspace(r, &mut self.deviations);
                }
                // A dynamic run's frees are in `ops` already.
                if rec != NOT_PLANNED && r.serve.is_some() {
                    Self::record_free(r, rec, &mut self.deviations);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "invariant_tests.rs"]
mod invariant_tests;
