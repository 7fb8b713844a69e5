//! Shape-keyed memory plans: a run seen before gets every buffer at a
//! precomputed offset inside one block.
//!
//! 1. **Record**: a run opened with
//!    [`Arena::begin_recorded_run`](crate::Arena::begin_recorded_run) (the
//!    first of its shape) records the sizes, alignments and lifetimes of its
//!    blocks ([`Run::finish_with_recording`](crate::Run::finish_with_recording));
//!    other runs only count, which costs less per allocation.
//! 2. **Plan**: [`Plan::from_recording`] computes an offset for each block
//!    so that no two blocks alive at the same time overlap ([`solver`]).
//! 3. **Serve**: [`Arena::begin_planned_run`](crate::Arena::begin_planned_run)
//!    draws one block of the plan's size and hands out the run's blocks, by
//!    their index in the run, at their offsets: O(1), no search, no backing
//!    call. The run's events are checked against the recording as they
//!    come; at the first difference (a size or alignment larger than
//!    recorded, an extra block, frees in another order) the run *deviates*:
//!    blocks already handed out stay where they are, and the rest of the
//!    run is served by the dynamic pool. An allocation where the plan
//!    frees (or has nothing left to allocate) that is at most half the
//!    plan's next block and a sixteenth of the plan's is no deviation: it
//!    is an extra block (a small buffer a run makes at some inputs only),
//!    served from the pool right past the plan's block, and the run goes
//!    on following its plan (but after a block served in a slot twice its
//!    size or more, which may have been such a block in the slot of the
//!    plan's next).
//!    Plans may come from files, so none is trusted: every recording planned
//!    passes [`Recording::validate`], every plan built or deserialized passes
//!    [`Plan::validate`], and serving checks each offset against the plan's
//!    block once more. A malformed plan is an error, never two live blocks
//!    on the same bytes.
//!
//!    Where the caller owns the arena, [`Arena::begin_scoped_run`](crate::Arena::begin_scoped_run)
//!    serves the same blocks at a fraction of the cost: the run holds the
//!    arena exclusively and its blocks ([`ScopedBlock`](crate::ScopedBlock))
//!    borrow it, so none can outlive it or be freed twice, and while the
//!    run follows the plan an allocation is a read of the plan's next step,
//!    two comparisons and an add, with the arena's counters brought up to
//!    date when the run finishes. A request smaller than its step (a
//!    predicted plan's slots are sized on the safe side) is served from the
//!    step's slot too, its size noted for the run's recording. It hands
//!    over to the planned run above at the first other difference.
//! 4. **Cache**: [`PlanCache`] keeps plans by exact key (hash and equality,
//!    no collisions), bounded, least recently used out; lookups take no lock.
//! 5. **Families**: the runs of one model have the same structure at every
//!    input shape (which block comes when, which free releases which), and
//!    each block's size is a simple function of the input's dimensions. A
//!    key that exposes its dimensions ([`KeyDims`]) belongs to a family;
//!    [`PlanCache::after_run`] adds each shape a family sees and fits each
//!    block's size to the dimensions (constant, proportional or affine in
//!    a product of them: [`fit`](self#fits)), and [`PlanCache::lookup`]
//!    predicts the plan of a key never seen from that fit and solves it,
//!    so the run is served on the planned path from its first sight. A run
//!    that leaves its prediction (a block larger than its slot, an event
//!    the prediction did not have) is handed over to the dynamic pool as
//!    any planned run is, with nothing lost, and its recording becomes its
//!    key's plan and a new shape of its family. A family whose sizes follow
//!    no fit is served dynamically and reported so ([`FamilyStats`]).
//!
//!    Every plan of one structure, predicted or learned, is searched from
//!    the placement order the structure's previous search ended on (the
//!    same blocks in the same lifetimes, at other sizes), alternately going
//!    on from it and searching afresh with other random moves and keeping
//!    it where it is still better. So a structure planned at many shapes
//!    is searched for many budgets' worth, each plan costing one, and a
//!    plan is never worse than that order's placement; a key's plan then
//!    depends on the shapes seen before it (for one sequence of runs, it
//!    is the same every time).
//!
//! # Fits
//! How each block's size is fitted, and why, is said in full on the
//! private `fit` module; in short: the simplest monomial of the varying
//! dimensions (strided variants included, `ceil(w / 4)`) that one factor
//! explains at every shape seen, to the arena's rounding, and predicted
//! from the largest such factor, so that a block that follows its fit
//! always fits its slot.

mod cache;
mod dims;
mod family;
mod family_counts;
mod fit;
mod overlap;
mod recording;
pub mod solver;
pub mod store;
mod tape;
pub mod trace;

pub use cache::{Lookup, PlanCache, PlanStats};
pub use dims::KeyDims;
pub use family::{DynamicReason, FamilyCounts, FamilyStats, PlanSource};
pub use recording::{PlanEvent, Recording, MAX_ALIGN, MAX_BLOCK};
pub(crate) use tape::Source;

/// Why a planned run left its plan (and the rest of it was served by the
/// dynamic pool).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Deviation {
    /// A block larger (or more aligned) than its slot.
    Larger,
    /// An allocation where the plan had a free, or past the plan's end.
    /// (A block at most half the plan's next one, or any once the plan has
    /// none left, and at most a sixteenth of the plan's block, is served
    /// beside the plan's block instead, and the run keeps to its plan: see
    /// [`Plan`]'s serving.)
    Extra,
    /// A free out of the plan's order.
    Order,
    /// The run ended before the plan did (a free missing, fewer blocks).
    Short,
}

/// Offsets for every block of a recorded run, inside one block of
/// [`Plan::size`] bytes.
///
/// A `Plan` is valid by construction: [`Plan::from_recording`] and
/// deserialization (`serde`, through [`Plan::from_parts`]) both refuse
/// anything that [`Plan::validate`] would.
///
/// In memory a plan is its compiled tape only (one step per event, with
/// each allocation's offset, size and alignment) and where each block's
/// allocation is on it: its recording and offsets are read from the tape
/// when asked for ([`Plan::recording`], [`Plan::to_parts`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(try_from = "PlanParts", into = "PlanParts"))]
pub struct Plan {
    /// The plan compiled for serving: one step per event, in time order.
    tape: Vec<Step>,
    /// Where block `i`'s allocation is on the tape (block `i` is the
    /// `i`-th allocation: always an allocation step).
    allocs: Vec<u32>,
    size: usize,
    align: usize,
    lower_bound: usize,
    /// What following the whole tape adds up to (derived from the tape).
    whole: TapeTotals,
    /// Whether the plan is a run's core, predicted for runs whose
    /// workspaces differ by shape: a run on it serves the workspaces it
    /// lacks beside its blocks (kept in a plan store's file; not in
    /// [`PlanParts`], whose plans are whole runs').
    workspaces_apart: bool,
    /// Whether its sizes are a run's ([`Plan::sizes_seen`]).
    sizes_seen: SizesSeen,
}

/// Whether a plan's sizes are a run's: set from the start for a plan of a
/// run's recording or a plan loaded, and by the first run that keeps to a
/// prediction; cleared for good by a run whose block came more than twice
/// its slot (its sizes move with the data). Not part of the plan's
/// identity: two plans alike compare equal whatever it says.
struct SizesSeen(core::sync::atomic::AtomicU8);

/// [`SizesSeen`]'s states.
const UNSEEN: u8 = 0;
const SEEN: u8 = 1;
const VARY: u8 = 2;

impl SizesSeen {
    fn new(state: u8) -> Self {
        SizesSeen(core::sync::atomic::AtomicU8::new(state))
    }

    fn get(&self) -> u8 {
        self.0.load(core::sync::atomic::Ordering::Relaxed)
    }

    fn set(&self, state: u8) {
        self.0.store(state, core::sync::atomic::Ordering::Relaxed);
    }
}

impl Clone for SizesSeen {
    fn clone(&self) -> Self {
        SizesSeen::new(self.get())
    }
}

impl PartialEq for SizesSeen {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for SizesSeen {}

impl core::fmt::Debug for SizesSeen {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.get() {
            UNSEEN => f.write_str("unseen"),
            SEEN => f.write_str("seen"),
            _ => f.write_str("vary"),
        }
    }
}

#[cfg(feature = "serde")]
impl From<Plan> for PlanParts {
    fn from(plan: Plan) -> Self {
        plan.to_parts()
    }
}

/// What a run that follows a plan's whole tape does, in sum: the core
/// brings a run that served its steps itself up to date from these at once
/// instead of step by step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TapeTotals {
    pub(crate) allocs: u64,
    pub(crate) frees: u64,
    /// Most bytes of the plan's blocks live at once.
    pub(crate) peak_live: usize,
    /// The blocks never freed, and their bytes.
    pub(crate) end_live: Vec<u32>,
    pub(crate) end_live_bytes: usize,
    /// The largest power of two that divides every block's size (0 for a
    /// plan with no block).
    pub(crate) size_quantum: usize,
}

/// One event of a compiled plan ([`Plan`]'s tape): what a planned run's
/// next allocation or free must be, with everything serving it needs in one
/// load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Step {
    /// Offset of the block in the plan's block (allocations).
    pub(crate) offset: usize,
    /// The recorded size (allocations); 0 marks a free.
    pub(crate) size: usize,
    /// The recorded alignment (allocations).
    pub(crate) align: u32,
    /// The block's index.
    pub(crate) index: u32,
}

impl Step {
    /// Whether the step is a free.
    #[inline]
    pub(crate) fn is_free(&self) -> bool {
        self.size == 0
    }
}

impl Plan {
    /// The plan, marked as a core whose runs serve their workspaces
    /// beside it ([`Plan::workspaces_apart`]): what a family predicts for
    /// runs that differ by workspaces, or a caller's own plan of a run's
    /// [`Recording::core`].
    pub fn with_workspaces_apart(mut self) -> Self {
        self.workspaces_apart = true;
        self
    }

    /// Whether runs on this plan serve the workspaces it lacks (blocks
    /// freed right after their allocation) without leaving it: a plan
    /// predicted from the core of runs whose workspaces differ by shape.
    pub fn workspaces_apart(&self) -> bool {
        self.workspaces_apart
    }

    /// The plan, marked as a prediction: sizes no run has made yet
    /// ([`Plan::sizes_seen`] false until a run keeps to it).
    pub(crate) fn predicted(self) -> Self {
        self.sizes_seen.set(UNSEEN);
        self
    }

    /// Whether a run made this plan's sizes (a plan of a run's recording,
    /// one loaded from a store, or a prediction a run kept to, every block
    /// in its slot), and no run on it since made its next block more than
    /// twice the slot. A run on such a plan that asks for a block more than
    /// twice the plan's next, where the plan allocates, may be making a
    /// block the plan does not have (a process's one-time buffers: served
    /// beside the plan, pending the run's next event); on a prediction no
    /// run kept to, or a plan whose sizes moved with the data, the plan's
    /// block is taken to have come larger (the run leaves the plan there).
    pub fn sizes_seen(&self) -> bool {
        self.sizes_seen.get() == SEEN
    }

    /// Marks the plan's sizes as a run's: the run kept to it. A plan whose
    /// sizes moved stays so.
    #[inline]
    pub(crate) fn mark_sizes_seen(&self) {
        if self.sizes_seen.get() == UNSEEN {
            let _ = self.sizes_seen.0.compare_exchange(
                UNSEEN,
                SEEN,
                core::sync::atomic::Ordering::Relaxed,
                core::sync::atomic::Ordering::Relaxed,
            );
        }
    }

    /// Marks the plan's sizes as moving with the data: a run's block came
    /// more than twice its slot. For good.
    #[cold]
    pub(crate) fn mark_sizes_vary(&self) {
        self.sizes_seen.set(VARY);
    }

    /// Plans a recording with [`solver::plan`].
    ///
    /// # Errors
    /// [`PlanError`] when the recording fails [`Recording::validate`] (a
    /// block allocated twice or out of order, freed twice or before its
    /// allocation, a zero or oversized size, a bad alignment), or when its
    /// blocks add up to more than fits in `usize`.
    pub fn from_recording(recording: &Recording) -> Result<Self, PlanError> {
        Self::from_recording_hinted(
            recording,
            None,
            solver::Depth::Quick,
            solver::Placement::Lowest,
        )
        .map(|(plan, _)| plan)
    }

    /// A family's plan of a recording whose structure it does not know:
    /// [`Plan::from_recording`], but the run's own order where that is
    /// close to the lowest (`solver::Placement::Close`); `None` for a
    /// recording that fails validation.
    pub(crate) fn from_recording_close(recording: &Recording) -> Option<Self> {
        Self::from_recording_hinted(
            recording,
            None,
            solver::Depth::Quick,
            solver::Placement::Close,
        )
        .ok()
        .map(|(plan, _)| plan)
    }

    /// [`Plan::from_recording`], its search started from `hint` too (where
    /// an earlier search of the same structure ended), placed for
    /// `placement`; returns the plan and where this search ended.
    pub(crate) fn from_recording_hinted(
        recording: &Recording,
        hint: Option<&solver::Hint>,
        depth: solver::Depth,
        placement: solver::Placement,
    ) -> Result<(Self, Option<solver::Hint>), PlanError> {
        recording.validate()?;
        let requests = recording.requests();
        let (solution, hint) = solver::plan_hinted(&requests, hint, depth, placement);
        drop(requests);
        // The solver's output is checked like any other plan's: a solver
        // bug becomes an error here, not overlapping blocks later.
        let plan = Self::build_from(
            recording,
            &solution.offsets,
            solution.size,
            max_align(recording),
            // The recording's own, found as the plan is checked.
            None,
        )?;
        Ok((plan, hint))
    }

    /// A plan from its parts (as [`Plan`]'s serialized form holds them),
    /// checked with [`Plan::validate`].
    ///
    /// # Errors
    /// [`PlanError`] naming the first problem.
    pub fn from_parts(parts: PlanParts) -> Result<Self, PlanError> {
        Self::build_from(
            &parts.recording,
            &parts.offsets,
            parts.size,
            parts.align,
            Some(parts.lower_bound),
        )
    }

    /// The compiled plan: step `pos` is what event `pos` of a run that
    /// follows the plan must be.
    #[inline]
    pub(crate) fn step(&self, pos: usize) -> Option<&Step> {
        self.tape.get(pos)
    }

    /// The compiled plan's steps, all of them.
    pub(crate) fn steps(&self) -> &[Step] {
        &self.tape
    }

    /// What following the whole tape adds up to.
    pub(crate) fn whole(&self) -> &TapeTotals {
        &self.whole
    }

    /// Bytes of the one block the plan needs.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The most bytes the recorded run had live at once: no plan is smaller.
    pub fn lower_bound(&self) -> usize {
        self.lower_bound
    }

    /// How many of the first blocks are where a dynamic arena would put
    /// them (the run's own order, each block in the smallest gap free for
    /// it): all of them (`len()`) where the solver found that as low, else
    /// as many as keep the footprint. Worked out on each call (one
    /// placement of the plan's blocks), for a run that leaves the plan.
    pub(crate) fn run_order_start(&self) -> usize {
        let offsets: Vec<usize> = (0..self.len()).map(|i| self.step_of(i).offset).collect();
        solver::run_order_start(&self.recording().requests(), &offsets)
    }

    /// Alignment the plan's block needs (the largest of its blocks').
    pub fn align(&self) -> usize {
        self.align
    }

    /// Number of blocks planned.
    pub fn len(&self) -> usize {
        self.allocs.len()
    }

    /// Whether the plan holds no block.
    pub fn is_empty(&self) -> bool {
        self.allocs.is_empty()
    }

    /// `(size, align)` of block `i` as recorded.
    pub fn block(&self, i: usize) -> Option<(usize, usize)> {
        let at = *self.allocs.get(i)?;
        let step = self.tape.get(at as usize)?;
        Some((step.size, step.align as usize))
    }

    /// Offset of block `i`.
    pub fn offset(&self, i: usize) -> Option<usize> {
        let at = *self.allocs.get(i)?;
        self.tape.get(at as usize).map(|s| s.offset)
    }

    /// The recording the plan was made from, rebuilt from its tape (the
    /// plan keeps no copy of it).
    pub fn recording(&self) -> Recording {
        let mut rec = Recording {
            blocks: Vec::with_capacity(self.len()),
            events: Vec::with_capacity(self.tape.len()),
        };
        self.recording_upto(self.tape.len(), &mut rec);
        rec
    }

    /// Appends the recording of the tape's first `pos` steps to `rec`.
    pub(crate) fn recording_upto(&self, pos: usize, rec: &mut Recording) {
        for step in &self.tape[..pos.min(self.tape.len())] {
            if step.is_free() {
                rec.events.push(PlanEvent::Free(step.index));
            } else {
                rec.blocks.push((step.size, step.align as usize));
                rec.events.push(PlanEvent::Alloc(step.index));
            }
        }
    }

    /// Whether a run that did what `other` records can be served by this
    /// plan: the same events in the same order, and every block no larger
    /// and no more aligned than here.
    pub fn covers(&self, other: &Recording) -> bool {
        other.events.len() == self.tape.len()
            && other.events.iter().copied().eq(self.events())
            && other.blocks.iter().zip(&self.allocs).all(|(o, &at)| {
                let s = &self.tape[at as usize];
                o.0 <= s.size && o.1 <= s.align as usize
            })
    }

    /// Number of events recorded.
    pub(crate) fn event_count(&self) -> usize {
        self.tape.len()
    }
}

/// The largest alignment of a recording's blocks (1 for none).
fn max_align(recording: &Recording) -> usize {
    recording
        .blocks
        .iter()
        .map(|b| b.1.max(1))
        .max()
        .unwrap_or(1)
}

/// The fields of a [`Plan`], unchecked: what its serialized form holds.
/// [`Plan::from_parts`] turns them into a plan after checking them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PlanParts {
    /// The recorded run.
    pub recording: Recording,
    /// One offset per block.
    pub offsets: Vec<usize>,
    /// Bytes of the plan's block: the highest end offset.
    pub size: usize,
    /// Alignment of the plan's block.
    pub align: usize,
    /// The most bytes the recording has live at once.
    pub lower_bound: usize,
}

impl TryFrom<PlanParts> for Plan {
    type Error = PlanError;
    fn try_from(parts: PlanParts) -> Result<Self, PlanError> {
        Plan::from_parts(parts)
    }
}

/// Why a recording or plan was refused: it could not have come from a run,
/// or its offsets would put two live blocks on the same bytes or a block
/// outside the plan's block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanError {
    reason: String,
}

impl PlanError {
    pub(crate) fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
        }
    }

    /// What is wrong, in words.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl core::fmt::Display for PlanError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "invalid plan: {}", self.reason)
    }
}

impl std::error::Error for PlanError {}
