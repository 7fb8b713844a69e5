//! The arena's core, [`RawArena`]: blocks, runs, watermark, plans and
//! stats over a memory layer, in offsets and addresses. Nothing here reads
//! or writes the memory.

use crate::config::{ArenaConfig, Relayout, ShrinkPolicy};
use crate::freemap::{simulate_extent, FreeError, RegionId, RunOp, SpanId};
use crate::memory::Memory;
use crate::plan::{Plan, Recording};
use crate::pool::{Pool, RawBlock, Tag, NOT_PLANNED, PLAN_BLOCK};
use crate::stats::{LiveBlock, RunReport, Stats};
use crate::ArenaError;
use core::panic::Location;
use std::collections::VecDeque;
use std::sync::Arc;

/// The arena's core: blocks, runs, watermark, plans and stats over a
/// [`Memory`] layer, in offsets and the layer's addresses. It never reads
/// or writes the memory, so it serves host memory (the [`Arena`] shell
/// adds `&[u8]` views) and device memory alike.
///
/// [`Arena`]: crate::Arena
pub struct RawArena<M: Memory> {
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
    commits_at_start: u64,
    decommits_at_start: u64,
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
struct PlanBlock<P> {
    raw: RawBlock<P>,
    /// Size of each planned block served from it and still live, by block
    /// index; 0 for none (so a stale or repeated free is refused).
    served: Vec<usize>,
    /// Planned blocks of it still live, and their bytes.
    live: usize,
    live_bytes: usize,
    /// Whether its run is still open.
    open: bool,
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle(pub(crate) HandleKind);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HandleKind {
    /// A span of the pool.
    Pool { span: SpanId },
    /// Block `index` of the plan block in `slot`, `size` bytes.
    Planned { slot: u32, index: u32, size: usize },
}

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

    /// Gives a block back.
    ///
    /// # Errors
    /// [`FreeError`] when `handle` names no live block of this arena (freed
    /// already, say); nothing changes then.
    pub fn free(&mut self, handle: Handle) -> Result<(), FreeError> {
        match handle.0 {
            HandleKind::Pool { span } => self.free_span(span),
            HandleKind::Planned { slot, index, size } => self.free_planned(slot, index, size),
        }
    }

    /// Bytes the block of `handle` holds (its request rounded up to the
    /// alignment), or 0 if it is not live.
    pub fn capacity(&self, handle: Handle) -> usize {
        match handle.0 {
            HandleKind::Pool { span } => self.pool.get(span).map_or(0, |s| s.0),
            HandleKind::Planned { size, .. } => size,
        }
    }

    /// Opens a run, served by `plan` if given; returns its id.
    ///
    /// # Errors
    /// [`ArenaError::RunAlreadyOpen`], or the errors of drawing the plan's
    /// block.
    pub fn begin_run(&mut self, plan: Option<Arc<Plan>>) -> Result<u64, ArenaError> {
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
        let serve = match plan {
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
        if let Some(serve) = &serve {
            // The plan's block is the run's first pool allocation.
            let raw = self.plan_blocks[serve.slot as usize]
                .as_ref()
                .expect("just drawn")
                .raw;
            if clean == Some(raw.rid) {
                max_end = raw.off + raw.size;
            }
            ops.push(RunOp::Alloc {
                size: raw.size,
                align: serve.plan.align().max(self.pool.granule()),
                len: raw.size,
            });
            self.planned_runs += 1;
        }
        let peak = self.in_use();
        let pool_allocs = ops.len() as u32;
        self.run = Some(OpenRun {
            id,
            ops,
            pool_allocs,
            allocs: 0,
            frees: 0,
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
            planned_allocs: 0,
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

    /// Gives memory back down to the watermark; see
    /// [`Arena::shrink`](crate::Arena::shrink). Returns the bytes released.
    pub fn shrink(&mut self) -> usize {
        let target = self.watermark();
        self.shrink_inner(target)
    }

    /// Gives memory back towards `bytes`; see
    /// [`Arena::shrink_to`](crate::Arena::shrink_to).
    pub fn shrink_to(&mut self, bytes: usize) -> usize {
        self.shrink_inner(bytes)
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
        let mut served = core::mem::take(&mut self.spare_served);
        served.clear();
        served.resize(plan.len(), 0);
        let block = PlanBlock {
            raw,
            served,
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

    /// Serves the allocation from the plan of the open run, if the run still
    /// follows it and the request fits the plan's next step: one step of the
    /// compiled plan read, compared and added to the block's base. `None`
    /// leaves everything as it was.
    #[inline]
    fn alloc_planned(&mut self, len: usize, align: usize) -> Option<RawAlloc<M::Ptr>> {
        let run = self.run.as_mut()?;
        let serve = run.serve.as_mut()?;
        if serve.deviated {
            return None;
        }
        let step = *serve.plan.step(serve.pos)?;
        let granule = self.pool.granule();
        // `len <= step.size` first: then rounding cannot overflow.
        if step.is_free() || len > step.size || !align.is_power_of_two() {
            return None;
        }
        let size = (len + granule - 1) & !(granule - 1);
        let align = align.max(granule);
        if size > step.size || align > step.align as usize {
            return None;
        }
        let pb = self.plan_blocks[serve.slot as usize].as_mut()?;
        // Always checked, also in release builds: the block lies inside the
        // plan's block. A validated plan always passes; were it not to, the
        // run deviates instead of handing out memory outside the block.
        if step.offset + size > pb.raw.size {
            return None;
        }
        let index = step.index;
        debug_assert_eq!(
            index, run.blocks,
            "a validated plan allocates in index order"
        );
        if size != step.size || align != step.align as usize {
            // Served, but smaller than recorded: this run's own recording
            // differs from the plan's from here on.
            Self::materialize(serve, &mut run.rec, run.blocks);
        }
        let ptr = M::at(pb.raw.ptr, step.offset);
        pb.served[index as usize] = size;
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
        Some(RawAlloc {
            ptr,
            handle: Handle(HandleKind::Planned { slot, index, size }),
        })
    }

    /// Allocates a block for the caller: from the plan serving the run when
    /// the run still follows it, else from the pool.
    pub(crate) fn alloc_at(
        &mut self,
        len: usize,
        align: usize,
        location: &'static Location<'static>,
    ) -> Result<RawAlloc<M::Ptr>, ArenaError> {
        if let Some(served) = self.alloc_planned(len, align) {
            return Ok(served);
        }
        let size = self.pool.span_size(len, align)?;
        let raw_align = align;
        if let Some(run) = &mut self.run {
            if let Some(serve) = &mut run.serve {
                if !serve.deviated {
                    Self::materialize(serve, &mut run.rec, run.blocks);
                    serve.deviated = true;
                    self.deviations += 1;
                }
            }
        }
        debug_assert!(size > 0);
        self.alloc_pool(len, raw_align, location, true)
            .map(|raw| RawAlloc {
                ptr: raw.ptr,
                handle: Handle(HandleKind::Pool { span: raw.span }),
            })
    }

    /// Allocates from the pool; `planable` blocks enter the run's recording.
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

    pub(crate) fn free_span(&mut self, span: SpanId) -> Result<(), crate::freemap::FreeError> {
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
                    let expected = serve.plan.step(serve.pos);
                    if expected.is_some_and(|s| s.is_free() && s.index == index) {
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

    fn free_planned(&mut self, slot: u32, index: u32, size: usize) -> Result<(), FreeError> {
        self.check();
        let Some(pb) = self
            .plan_blocks
            .get_mut(slot as usize)
            .and_then(Option::as_mut)
        else {
            return Err(FreeError::NotABlock);
        };
        match pb.served.get_mut(index as usize) {
            Some(served) if *served == size => *served = 0,
            Some(0) => return Err(FreeError::AlreadyFree),
            _ => return Err(FreeError::NotABlock),
        }
        self.frees += 1;
        self.planned_live -= size;
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
        Ok(())
    }

    /// Returns plan block `slot` to the pool.
    fn release_plan_block(&mut self, slot: u32) {
        if let Some(pb) = self.plan_blocks[slot as usize].take() {
            self.plan_reserved -= pb.raw.size;
            let freed = self.pool.free(pb.raw.span);
            debug_assert!(freed.is_ok(), "plan block not live in the pool");
            if pb.served.capacity() > self.spare_served.capacity() {
                self.spare_served = pb.served;
            }
        }
    }

    fn watermark(&self) -> usize {
        self.recent.iter().copied().max().unwrap_or(0)
    }

    /// Closes the open run (if any) and reports it, with its recording.
    pub fn finish_run(&mut self) -> (RunReport, Recording) {
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
        let grew = self.pool.calls.reserves != run.backing_allocs_at_start;
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
            backing_allocs: self.pool.calls.reserves - run.backing_allocs_at_start,
            backing_frees: self.pool.calls.releases - run.backing_frees_at_start,
            commits: self.pool.calls.commits - run.commits_at_start,
            decommits: self.pool.calls.decommits - run.decommits_at_start,
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
                self.shrink_inner(target)
            }
            ShrinkPolicy::AfterRunsBelow { runs } => {
                let reserved = self.pool.reserved();
                // What the run needs committed: its high-water mark in
                // whole granules of the memory layer.
                let need = high_water.next_multiple_of(self.pool.commit_step(high_water));
                if need.saturating_add(high_water / 8) < reserved {
                    self.below = (self.below.0 + 1, self.below.1.max(high_water));
                } else {
                    self.below = (0, 0);
                }
                if self.below.0 >= runs {
                    // Down to what these runs needed, but never below what
                    // the watermark window still covers.
                    let target = self.below.1.max(self.watermark());
                    self.below = (0, 0);
                    self.shrink_inner(target)
                } else {
                    0
                }
            }
        }
    }

    fn shrink_inner(&mut self, bytes: usize) -> usize {
        self.check();
        let released = if self.pool.in_place() {
            self.pool.trim(bytes)
        } else if self.pool.in_use() == 0 {
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
            self.pool.trim(bytes)
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

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        Stats {
            in_use: self.in_use(),
            peak_in_use: self.peak_in_use,
            reserved: self.pool.reserved(),
            watermark: self.watermark(),
            allocs: self.allocs,
            frees: self.frees,
            cache_hits: self.pool.cache_hits,
            backing_allocs: self.pool.calls.reserves,
            backing_frees: self.pool.calls.releases,
            commits: self.pool.calls.commits,
            decommits: self.pool.calls.decommits,
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

    /// Every live block of the caller's, with the run it belongs to and (in
    /// debug builds) where it was allocated. Planned blocks are counted in
    /// [`Stats::live_blocks`] but not listed: they carry no tag.
    pub fn live_blocks(&self) -> Vec<LiveBlock> {
        self.pool
            .live()
            .filter(|(_, _, tag)| tag.rec != PLAN_BLOCK)
            .map(|(addr, size, tag)| LiveBlock {
                addr: addr.map_or(0, M::address),
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

    /// Walks every region, span and plan block and panics if an invariant
    /// is broken.
    #[cfg(any(test, fuzzing, feature = "check-invariants"))]
    pub fn check_invariants(&self) {
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
