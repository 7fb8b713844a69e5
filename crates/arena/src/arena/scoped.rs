//! [`ScopedRun`]: a run with the arena to itself, whose blocks cannot
//! outlive it: planned, the planned path at the cost of a tape read;
//! dynamic, the pool's path with no handle per block.

use super::{dangling_for, Arena, Shell};
use crate::freemap::SpanId;
use crate::memory::{DefaultMemory, HostMemory};
use crate::plan::{Plan, Recording};
use crate::raw::{Handle, HandleKind, RawAlloc};
use crate::stats::{RunReport, Stats};
use crate::ArenaError;
use bumpalo::Bump;
use core::cell::{Cell, RefCell};
use core::fmt;
use core::ops::{Deref, DerefMut};
use core::panic::Location;
use core::ptr::NonNull;
use std::sync::Arc;

/// `ScopedRun::pos` once the run no longer serves steps itself.
const OFF_TAPE: usize = usize::MAX;

/// A planned run that holds its [`Arena`] exclusively (`&mut`), from
/// [`Arena::begin_scoped_run`]. Its blocks ([`ScopedBlock`]) borrow the run,
/// so none can outlive it, and nothing else can touch the arena meanwhile.
///
/// That is what makes its planned path short. While the run does what the
/// plan recorded, an allocation reads the plan's next step, compares the
/// request with it and returns the block at the step's offset; a free
/// checks that it is the step the plan expects. A request smaller than its
/// step (a predicted plan's slots are sized on the safe side) is served
/// from the step's slot all the same, and its size noted aside, unless it
/// is at most half the step and a 64th of the plan's block: that may be a
/// block the plan does not have, which the arena's own planned run tells
/// apart (below). Nothing
/// else is counted per event: the arena's counters, peaks, the plan
/// block's table and, where a request was smaller, the run's own
/// recording are brought up to date from the plan in one pass when the run
/// finishes (or [`ScopedRun::stats`] is asked). At the first event that
/// differs otherwise (a larger size, another alignment, a free out of the
/// plan's order, more events than recorded) the run hands over to the arena's own planned run, which
/// serves or leaves the plan exactly as a [`Run`](crate::Run) from
/// [`Arena::begin_planned_run`] does: the same blocks at the same
/// addresses, the same report, and a recording from where it left the plan.
///
/// No handle generations are needed: a block cannot be freed twice (it is
/// freed by its drop) nor outlive the run (it borrows it).
///
/// A scoped run can also be *dynamic* ([`Arena::begin_scoped_dynamic_run`],
/// and [`Arena::begin_scoped_recorded_run`] for the first run of a shape,
/// whose recording makes the plan): the pool places every block as a
/// [`Run`](crate::Run) from [`Arena::begin_run`] would, and a block names
/// its span rather than a checked handle. So an executor that runs a graph
/// inside one function can use scoped runs, and one block type, whether a
/// plan is known yet or not.
///
/// ```
/// use std::sync::Arc;
/// use tensor_arena::{Arena, ArenaConfig, Plan};
///
/// let mut arena = Arena::new(ArenaConfig::default());
/// // Learn the plan from a first run of the shape.
/// let first = arena.begin_recorded_run();
/// let a = first.try_alloc(4096)?;
/// let b = first.try_alloc(1024)?;
/// drop(a);
/// drop(b);
/// let (_, recording) = first.finish_with_recording();
/// let plan = Arc::new(Plan::from_recording(&recording)?);
///
/// // Later runs of the shape follow it.
/// for _ in 0..3 {
///     let run = arena.begin_scoped_run(&plan)?;
///     let mut a = run.try_alloc(4096)?;
///     a[0] = 1;
///     let b = run.try_alloc(1024)?;
///     drop(a);
///     drop(b);
///     let report = run.finish();
///     assert!(report.planned && !report.deviated);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A block cannot outlive its run:
///
/// ```compile_fail
/// use std::sync::Arc;
/// use tensor_arena::{Arena, ArenaConfig, Plan, Recording};
/// let mut arena = Arena::new(ArenaConfig::default());
/// let plan = Arc::new(Plan::from_recording(&Recording::new()).unwrap());
/// let run = arena.begin_scoped_run(&plan).unwrap();
/// let block = run.try_alloc(64).unwrap();
/// run.finish();
/// drop(block);
/// ```
pub struct ScopedRun<'a, M: HostMemory = DefaultMemory> {
    /// The arena's state; borrowed only off the tape and to finish.
    shell: RefCell<&'a mut Shell<M>>,
    /// The plan serving the run; `None` for a dynamic run, whose blocks
    /// the core serves and name by their spans.
    plan: Option<&'a Arc<Plan>>,
    /// The plan's compiled steps.
    steps: &'a [crate::plan::Step],
    /// The plan block: address, slot and generation in the core.
    base: NonNull<u8>,
    slot: u32,
    generation: u32,
    granule: usize,
    /// The next step of the plan this run serves itself, or [`OFF_TAPE`]
    /// once the core serves every event.
    pos: Cell<usize>,
    /// Steps served smaller than the plan's, not yet told to the core:
    /// `(step, size rounded to the granule)`, in step order.
    smaller: RefCell<Vec<(usize, usize)>>,
    /// Handles of the blocks the core handed out, by [`Owner::Core`] slot
    /// (`None`: a vacant slot), and the vacant slots: a block carries a
    /// slot, not the 24-byte handle, so that it stays four words that the
    /// compiler keeps in registers.
    handles: RefCell<(Vec<Option<Handle>>, Vec<u32>)>,
    /// The error of the last refused allocation (kept here so that the
    /// cold path returns in registers).
    error: Cell<Option<ArenaError>>,
    id: u64,
    scratch: Bump,
    open: bool,
}

/// Who gives a [`ScopedBlock`] back.
#[derive(Clone, Copy, Debug)]
enum Owner {
    /// A zero-size block: no memory.
    Empty,
    /// Block `index` of the plan, served by the run itself or by the core.
    Planned(u32),
    /// A block the core handed out (after the run left its plan), by its
    /// slot in [`ScopedRun::handles`].
    Core(u32),
    /// A block of a dynamic run, by its span in the core's pool.
    Span(SpanId),
}

impl<M: HostMemory> Arena<M> {
    /// Opens a planned run that holds this arena exclusively (and borrows
    /// `plan`); see [`ScopedRun`]. It serves the same blocks at the same
    /// addresses as [`Arena::begin_planned_run`], with its blocks borrowing
    /// the run.
    ///
    /// # Errors
    /// As [`Arena::begin_planned_run`].
    pub fn begin_scoped_run<'a>(
        &'a mut self,
        plan: &'a Arc<Plan>,
    ) -> Result<ScopedRun<'a, M>, ArenaError> {
        let shell = self.state.get_mut();
        let id = shell.raw.begin_run(Some(Arc::clone(plan)), false)?;
        let granule = shell.raw.granule();
        // Every block of a validated plan lies inside its `size` bytes, so
        // a plan block that large holds every step; and with every size a
        // multiple of this arena's granule, a request is a step's exactly
        // when it is at most the step's size and within a granule of it.
        let quantum = plan.whole().size_quantum;
        let tape = match shell.raw.exact_serving() {
            Some((base, size, slot, generation))
                if plan.size() <= size && quantum % granule == 0 =>
            {
                (base, slot, generation, 0)
            }
            // No block to serve from (an empty plan), a trace being
            // recorded, or a plan from an arena of a coarser granule: the
            // core serves every event.
            _ => (NonNull::dangling(), 0, 0, OFF_TAPE),
        };
        Ok(ScopedRun::opened(shell, id, Some(plan), tape))
    }

    /// Opens a dynamic run (no plan) that holds this arena exclusively; see
    /// [`ScopedRun`]. It places blocks exactly as a run from
    /// [`Arena::begin_run`] does, and reports the same, with its blocks
    /// borrowing the run: a block goes back by its span, with no handle to
    /// make or check. Like `begin_run`, it keeps no recording (open the
    /// first run of a shape with [`Arena::begin_scoped_recorded_run`]).
    ///
    /// # Errors
    /// [`ArenaError::RunAlreadyOpen`] if a run is open (one whose
    /// [`Run`](crate::Run) was leaked).
    pub fn begin_scoped_dynamic_run(&mut self) -> Result<ScopedRun<'_, M>, ArenaError> {
        self.open_scoped_dynamic(false)
    }

    /// Opens a dynamic run whose [`Recording`] is kept, as
    /// [`Arena::begin_recorded_run`] does, holding this arena exclusively:
    /// the first run of a shape, whose
    /// [`ScopedRun::finish_with_recording`] gives the plan that later runs
    /// of the shape follow through [`Arena::begin_scoped_run`]. An executor
    /// can so use scoped runs, and one block type, for every run.
    ///
    /// # Errors
    /// As [`Arena::begin_scoped_dynamic_run`].
    pub fn begin_scoped_recorded_run(&mut self) -> Result<ScopedRun<'_, M>, ArenaError> {
        self.open_scoped_dynamic(true)
    }

    fn open_scoped_dynamic(&mut self, record: bool) -> Result<ScopedRun<'_, M>, ArenaError> {
        let shell = self.state.get_mut();
        let id = shell.raw.begin_run(None, record)?;
        Ok(ScopedRun::opened(
            shell,
            id,
            None,
            (NonNull::dangling(), 0, 0, OFF_TAPE),
        ))
    }
}

impl<'a, M: HostMemory> ScopedRun<'a, M> {
    /// The scoped face of run `id`, just opened on `shell`'s core, served
    /// by `plan` if any. `tape` is the plan block (address, slot and
    /// generation in the core) and the first step the run serves itself,
    /// or [`OFF_TAPE`] when the core serves every event.
    fn opened(
        shell: &'a mut Shell<M>,
        id: u64,
        plan: Option<&'a Arc<Plan>>,
        (base, slot, generation, pos): (NonNull<u8>, u32, u32, usize),
    ) -> Self {
        let scratch = shell.scratch.take().unwrap_or_default();
        let smaller = core::mem::take(&mut shell.smaller);
        let granule = shell.raw.granule();
        ScopedRun {
            shell: RefCell::new(shell),
            plan,
            steps: plan.map_or(&[], |p| p.steps()),
            base,
            slot,
            generation,
            granule,
            pos: Cell::new(pos),
            smaller: RefCell::new(smaller),
            handles: RefCell::new((Vec::new(), Vec::new())),
            error: Cell::new(None),
            id,
            scratch,
            open: true,
        }
    }

    /// The run's id, as in [`RunReport::run`].
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The plan serving the run; `None` for a dynamic run.
    pub fn plan(&self) -> Option<&'a Arc<Plan>> {
        self.plan
    }

    /// A scratch allocator for small per-run data, reset when the run
    /// finishes (as [`Run::scratch`](crate::Run::scratch)).
    pub fn scratch(&self) -> &Bump {
        &self.scratch
    }

    /// Whether every event so far was the plan's, served by the run itself
    /// (never for a dynamic run).
    pub fn on_tape(&self) -> bool {
        self.pos.get() != OFF_TAPE
    }

    /// Allocates `len` bytes at the arena's alignment; see
    /// [`Arena::try_alloc`].
    ///
    /// # Errors
    /// As [`Arena::try_alloc`].
    #[inline]
    #[track_caller]
    pub fn try_alloc(&self, len: usize) -> Result<ScopedBlock<'_, 'a, M>, ArenaError> {
        self.alloc_at(len, 1, Location::caller())
    }

    /// Allocates `len` bytes at `align` (a power of two); see
    /// [`Arena::try_alloc_aligned`].
    ///
    /// # Errors
    /// As [`Arena::try_alloc_aligned`].
    #[inline]
    #[track_caller]
    pub fn try_alloc_aligned(
        &self,
        len: usize,
        align: usize,
    ) -> Result<ScopedBlock<'_, 'a, M>, ArenaError> {
        self.alloc_at(len, align, Location::caller())
    }

    #[inline]
    fn alloc_at(
        &self,
        len: usize,
        align: usize,
        location: &'static Location<'static>,
    ) -> Result<ScopedBlock<'_, 'a, M>, ArenaError> {
        let served = match self.serve_step(len, align) {
            Some(served) => Some(served),
            None => self.pool_alloc(len, align, location),
        };
        match served {
            Some((ptr, owner)) => Ok(ScopedBlock {
                run: self,
                ptr,
                len,
                owner,
            }),
            None => Err(self
                .error
                .take()
                .unwrap_or(ArenaError::CapacityOverflow { requested: len })),
        }
    }

    /// The block of the plan's next step, if the request is that step's.
    #[inline(always)]
    fn serve_step(&self, len: usize, align: usize) -> Option<(NonNull<u8>, Owner)> {
        let pos = self.pos.get();
        let step = self.steps.get(pos)?;
        // The request is the step's exactly: its size rounded up to the
        // granule is the step's (a multiple of the granule, checked when
        // the run began: so `len` is at most it and within a granule of
        // it; a free's step has size 0, which no `len > 0` is within), and
        // its alignment raised to the granule is the step's. The block then
        // lies inside the plan block (checked when the run began).
        let exact = len != 0
            && step.size.wrapping_sub(len) < self.granule
            && crate::freemap::pow2(align)
            && align.max(self.granule) == step.align as usize;
        if !exact {
            return None;
        }
        self.pos.set(pos + 1);
        Some((M::at(self.base, step.offset), Owner::Planned(step.index)))
    }

    /// The block of the plan's next step for a request smaller than the
    /// step by a granule or more (a predicted plan's slots are sized on the
    /// safe side): served from the step's slot, its rounded size noted for
    /// the core to count when it catches up. `None` for any other request,
    /// and for a small one that may be a block the plan does not have (the
    /// core serves it beside the plan until the next event says whose it
    /// is).
    fn serve_smaller(&self, len: usize, align: usize) -> Option<(NonNull<u8>, Owner)> {
        let pos = self.pos.get();
        let step = self.steps.get(pos)?;
        // From 1 byte to less than the step's size (a free's step has size
        // 0, which no such size fits), at the step's alignment: the block
        // lies inside the step's slot, so inside the plan block.
        let fits = len != 0
            && len < step.size
            && crate::freemap::pow2(align)
            && align.max(self.granule) == step.align as usize;
        if !fits {
            return None;
        }
        // At most the step's size, a multiple of the granule (a power of
        // two): no overflow.
        let size = (len + self.granule - 1) & !(self.granule - 1);
        // A small request that may be a block the plan does not have: the
        // core serves it beside the plan, pending the next event.
        if self
            .plan
            .is_some_and(|plan| crate::raw::may_be_extra(plan, size, step.size))
        {
            return None;
        }
        self.smaller.borrow_mut().push((pos, size));
        self.pos.set(pos + 1);
        Some((M::at(self.base, step.offset), Owner::Planned(step.index)))
    }

    /// An allocation the run's tape does not serve: a dynamic run's (from
    /// the core's pool, by span), or one off a plan's tape. Out of line, so
    /// that the planned path stays a few instructions in the caller; `None`
    /// with the error in `self.error`.
    #[inline(never)]
    fn pool_alloc(
        &self,
        len: usize,
        align: usize,
        location: &'static Location<'static>,
    ) -> Option<(NonNull<u8>, Owner)> {
        if self.plan.is_some() || len == 0 {
            if let Some(served) = self.serve_smaller(len, align) {
                return Some(served);
            }
            return self.off_tape_alloc(len, align, location);
        }
        let got = self.shell.borrow_mut().raw.alloc_at(len, align, location);
        match got {
            // A dynamic run's blocks come from the pool: the block names its
            // span, and its handle is kept nowhere (the block is freed once,
            // by its drop, so no generation is needed).
            Ok(RawAlloc {
                ptr,
                handle:
                    Handle {
                        kind: HandleKind::Pool { span },
                        ..
                    },
            }) => Some((ptr, Owner::Span(span))),
            // Never for a run with no plan; kept correct all the same.
            Ok(got) => Some((got.ptr, self.hold(got.handle))),
            Err(e) => {
                self.error.set(Some(e));
                None
            }
        }
    }

    /// An allocation the run does not serve itself; `None` with the error
    /// in `self.error`.
    #[cold]
    #[inline(never)]
    fn off_tape_alloc(
        &self,
        len: usize,
        align: usize,
        location: &'static Location<'static>,
    ) -> Option<(NonNull<u8>, Owner)> {
        if len == 0 {
            if !align.is_power_of_two() {
                self.error.set(Some(ArenaError::InvalidAlignment { align }));
                return None;
            }
            return Some((dangling_for(align.max(self.granule)), Owner::Empty));
        }
        self.leave_tape();
        let got = match self.shell.borrow_mut().raw.alloc_at(len, align, location) {
            Ok(got) => got,
            Err(e) => {
                self.error.set(Some(e));
                return None;
            }
        };
        Some((got.ptr, self.hold(got.handle)))
    }

    /// Keeps the handle of a block the core handed out in the run's side
    /// table; the block carries its slot.
    #[cold]
    fn hold(&self, handle: Handle) -> Owner {
        let mut handles = self.handles.borrow_mut();
        let (table, vacant) = &mut *handles;
        let slot = match vacant.pop() {
            Some(slot) => {
                table[slot as usize] = Some(handle);
                slot
            }
            None => {
                table.push(Some(handle));
                // As many slots as live blocks, which are far fewer than
                // `u32::MAX` (each holds at least a granule).
                u32::try_from(table.len() - 1).unwrap_or(u32::MAX)
            }
        };
        Owner::Core(slot)
    }

    /// Gives a block back: the plan's next step, or through the core.
    #[inline(always)]
    fn release(&self, owner: Owner) {
        if let Owner::Planned(index) = owner {
            let pos = self.pos.get();
            if self
                .steps
                .get(pos)
                .is_some_and(|s| s.is_free() && s.index == index)
            {
                self.pos.set(pos + 1);
                return;
            }
        }
        self.pool_release(owner);
    }

    /// Gives back a block that is not the plan's next free: a dynamic
    /// run's (by span), or through the core. Out of line, as
    /// [`ScopedRun::pool_alloc`].
    #[inline(never)]
    fn pool_release(&self, owner: Owner) {
        if let Owner::Span(span) = owner {
            let result = self.shell.borrow_mut().raw.free_span(span);
            debug_assert!(result.is_ok(), "a live block was not found in its arena");
            return;
        }
        self.off_tape_release(owner);
    }

    #[cold]
    #[inline(never)]
    fn off_tape_release(&self, owner: Owner) {
        let handle = match owner {
            Owner::Empty | Owner::Span(_) => return,
            Owner::Core(slot) => {
                let mut handles = self.handles.borrow_mut();
                let (table, vacant) = &mut *handles;
                let Some(handle) = table.get_mut(slot as usize).and_then(Option::take) else {
                    debug_assert!(false, "a live block's slot is filled");
                    return;
                };
                vacant.push(slot);
                handle
            }
            Owner::Planned(index) => {
                self.leave_tape();
                let shell = self.shell.borrow();
                shell.raw.handle(
                    HandleKind::Planned {
                        slot: self.slot,
                        index,
                    },
                    self.generation,
                )
            }
        };
        let result = self.shell.borrow_mut().raw.free(handle);
        debug_assert!(result.is_ok(), "a live block was not found in its arena");
    }

    /// Hands every further event to the core, after bringing it up to
    /// where the run stands.
    fn leave_tape(&self) {
        let pos = self.pos.replace(OFF_TAPE);
        if pos != OFF_TAPE {
            self.follow(pos);
        }
    }

    /// Brings the core up to where the run stands (the run goes on serving
    /// its steps).
    fn catch_up(&self) {
        let pos = self.pos.get();
        if pos != OFF_TAPE {
            self.follow(pos);
        }
    }

    /// Tells the core the steps served up to `pos`, with the sizes of
    /// those served smaller.
    fn follow(&self, pos: usize) {
        let mut smaller = self.smaller.borrow_mut();
        self.shell.borrow_mut().raw.follow_steps(pos, &smaller);
        smaller.clear();
    }

    /// The arena's statistics now, as [`Arena::stats`] would give them
    /// (the arena itself is borrowed by the run).
    pub fn stats(&self) -> Stats {
        self.catch_up();
        self.shell.borrow().raw.stats()
    }

    /// Closes the run and reports what it did; see [`Run::finish`](crate::Run::finish).
    pub fn finish(mut self) -> RunReport {
        self.close(false).0
    }

    /// Closes the run and also returns its recording; see
    /// [`Run::finish_with_recording`](crate::Run::finish_with_recording):
    /// empty when the run followed its plan exactly, the whole run's when
    /// it left it.
    pub fn finish_with_recording(mut self) -> (RunReport, Recording) {
        self.close(true)
    }

    fn close(&mut self, keep_recording: bool) -> (RunReport, Recording) {
        self.open = false;
        self.catch_up();
        let mut scratch = core::mem::take(&mut self.scratch);
        scratch.reset();
        let mut shell = self.shell.borrow_mut();
        shell.scratch = Some(scratch);
        shell.smaller = core::mem::take(&mut *self.smaller.borrow_mut());
        if keep_recording {
            shell.raw.finish_run()
        } else {
            (shell.raw.finish_run_unrecorded(), Recording::new())
        }
    }
}

impl<M: HostMemory> Drop for ScopedRun<'_, M> {
    fn drop(&mut self) {
        if self.open {
            self.close(false);
        }
    }
}

impl<M: HostMemory> fmt::Debug for ScopedRun<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedRun")
            .field("id", &self.id)
            .field("on_tape", &self.on_tape())
            .finish()
    }
}

/// A buffer of a [`ScopedRun`]; derefs to `[u8]`, goes back when dropped,
/// and cannot outlive its run.
pub struct ScopedBlock<'r, 'a, M: HostMemory = DefaultMemory> {
    run: &'r ScopedRun<'a, M>,
    /// Valid for `len` bytes, initialized, owned by this block alone.
    ptr: NonNull<u8>,
    len: usize,
    owner: Owner,
}

impl<M: HostMemory> ScopedBlock<'_, '_, M> {
    /// Bytes requested.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the block is empty (a zero-size request).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the block holds: the request rounded up to the alignment.
    pub fn capacity(&self) -> usize {
        match self.owner {
            Owner::Empty => 0,
            // Served at its size rounded to the granule (the step's, or
            // less for a smaller request), as the core serves it.
            Owner::Planned(_) => self.len.next_multiple_of(self.run.granule),
            Owner::Span(span) => self.run.shell.borrow().raw.span_capacity(span),
            Owner::Core(slot) => {
                let handles = self.run.handles.borrow();
                match handles.0.get(slot as usize).copied().flatten() {
                    Some(handle) => self.run.shell.borrow().raw.capacity(handle),
                    None => 0,
                }
            }
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
}

impl<M: HostMemory> Deref for ScopedBlock<'_, '_, M> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` bytes: a block of the plan's
        // block at its validated offset (inside the block, checked when
        // served), with the live blocks exactly those the plan has live at
        // that step, which the validated plan never overlaps; or a block the
        // core handed out (by handle, or by span in a dynamic run: the span
        // stays used until this block's drop frees it); or dangling with
        // `len == 0`. The plan block is held until the run finishes, and
        // the block borrows the run. The bytes are initialized (the memory
        // layer's promise).
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<M: HostMemory> DerefMut for ScopedBlock<'_, '_, M> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only access.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<M: HostMemory> Drop for ScopedBlock<'_, '_, M> {
    #[inline]
    fn drop(&mut self) {
        self.run.release(self.owner);
    }
}

impl<M: HostMemory> fmt::Debug for ScopedBlock<'_, '_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedBlock")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}
