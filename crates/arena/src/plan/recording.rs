//! What a run did with its blocks: [`Recording`], and the checks every
//! recording passes before a plan is made from it.

use super::{solver, PlanError};

/// One event of a recorded run: block `i` (in allocation order) allocated
/// or freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum PlanEvent {
    /// Block `i` was allocated.
    Alloc(u32),
    /// Block `i` was freed.
    Free(u32),
}

/// What a run did with its blocks: their sizes and alignments, and the
/// order of allocations and frees.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Recording {
    /// `(size, align)` of each block, in allocation order; sizes are rounded
    /// up to the arena's alignment.
    pub blocks: Vec<(usize, usize)>,
    /// The run's events in order. A block allocated but never freed in the
    /// run lives to the end.
    pub events: Vec<PlanEvent>,
}

impl Recording {
    /// An empty recording.
    pub const fn new() -> Self {
        Self {
            blocks: Vec::new(),
            events: Vec::new(),
        }
    }

    /// Appends an allocation of `size` bytes at `align`; returns its index.
    pub fn alloc(&mut self, size: usize, align: usize) -> u32 {
        let i = self.blocks.len() as u32;
        self.blocks.push((size, align));
        self.events.push(PlanEvent::Alloc(i));
        i
    }

    /// Appends the free of block `i`.
    pub fn free(&mut self, i: u32) {
        self.events.push(PlanEvent::Free(i));
    }

    /// Empties the recording, keeping its capacity.
    pub fn clear(&mut self) {
        self.blocks.clear();
        self.events.clear();
    }

    /// The most bytes of its blocks live at once (the lower bound of any
    /// plan of it), in one pass over the events: they are in time order.
    /// Equal to [`solver::lower_bound`] of [`Recording::requests`] for a
    /// valid recording (saturating, like it; an event that names no block
    /// counts nothing).
    pub fn peak_live(&self) -> usize {
        let (mut live, mut peak) = (0usize, 0usize);
        for ev in &self.events {
            match *ev {
                PlanEvent::Alloc(i) => {
                    let size = self.blocks.get(i as usize).map_or(0, |b| b.0);
                    live = live.saturating_add(size);
                    peak = peak.max(live);
                }
                PlanEvent::Free(i) => {
                    let size = self.blocks.get(i as usize).map_or(0, |b| b.0);
                    live = live.saturating_sub(size);
                }
            }
        }
        peak
    }

    /// The run without its workspaces: every block freed by the event
    /// right after its allocation (a buffer a kernel takes and gives back
    /// with nothing between, such as cuDNN's or cuBLAS's scratch, whose
    /// presence and size vary with the shape) taken out, the rest renumbered
    /// in order. `None` when there is none, or nothing else (the recording is
    /// its own core).
    ///
    /// Runs of one model at different shapes share their core where their
    /// workspaces differ, so a family predicts across them from the core
    /// alone; a run served on such a plan serves its workspaces beside it.
    pub fn core(&self) -> Option<Recording> {
        let map = self.core_indices()?;
        let mut core = Recording::new();
        let kept = |i: u32| map.get(i as usize).copied().filter(|&j| j != u32::MAX);
        for &ev in &self.events {
            match ev {
                PlanEvent::Alloc(i) => {
                    if let (Some(_), Some(&(size, align))) = (kept(i), self.blocks.get(i as usize))
                    {
                        core.alloc(size, align);
                    }
                }
                PlanEvent::Free(i) => {
                    if let Some(j) = kept(i) {
                        core.free(j);
                    }
                }
            }
        }
        Some(core)
    }

    /// Each block's index in [`Recording::core`] (`u32::MAX` for a
    /// workspace), for a valid recording; `None` as there.
    pub(crate) fn core_indices(&self) -> Option<Vec<u32>> {
        let transient = |at: usize| match (self.events[at], self.events.get(at + 1)) {
            (PlanEvent::Alloc(i), Some(&PlanEvent::Free(j))) => i == j,
            _ => false,
        };
        let mut out = vec![u32::MAX; self.blocks.len()];
        let (mut at, mut next, mut any) = (0, 0u32, false);
        while at < self.events.len() {
            if transient(at) {
                any = true;
                at += 2;
                continue;
            }
            if let PlanEvent::Alloc(i) = self.events[at] {
                if let Some(slot) = out.get_mut(i as usize) {
                    *slot = next;
                    next += 1;
                }
            }
            at += 1;
        }
        // A run of workspaces only is its own core.
        (any && next > 0).then_some(out)
    }

    /// Number of blocks.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether no block was recorded.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// The blocks as planner requests: lifetimes are half-open intervals of
    /// event indices, `[alloc, free)` (to the end for blocks never freed).
    pub fn requests(&self) -> Vec<solver::Request> {
        let end = self.events.len();
        let mut reqs: Vec<solver::Request> = self
            .blocks
            .iter()
            .map(|&(size, align)| solver::Request::new(size, align, end, end))
            .collect();
        for (t, ev) in self.events.iter().enumerate() {
            match *ev {
                PlanEvent::Alloc(i) => {
                    if let Some(r) = reqs.get_mut(i as usize) {
                        r.start = t;
                    }
                }
                PlanEvent::Free(i) => {
                    if let Some(r) = reqs.get_mut(i as usize) {
                        r.end = t;
                    }
                }
            }
        }
        reqs
    }

    /// The most bytes live at once.
    pub fn lower_bound(&self) -> usize {
        solver::lower_bound(&self.requests())
    }

    /// Checks that the recording describes a run an arena could have made:
    /// - every block is allocated exactly once, in index order (the `k`-th
    ///   `Alloc` event names block `k`), and there are as many `Alloc`
    ///   events as blocks;
    /// - every block is freed at most once, after its allocation;
    /// - every size is between 1 byte and [`MAX_BLOCK`] bytes, and every
    ///   alignment a power of two of at most [`MAX_ALIGN`];
    /// - there are at most `u32::MAX` blocks.
    ///
    /// Plans are made only from recordings that pass, so that no two blocks
    /// alive at the same time can be planned at the same bytes (a block
    /// allocated twice, say, would get one lifetime for two).
    ///
    /// # Errors
    /// [`PlanError`] naming the first violation.
    pub fn validate(&self) -> Result<(), PlanError> {
        if u32::try_from(self.blocks.len()).is_err() {
            return Err(PlanError::new(format!(
                "{} blocks: at most {} are supported",
                self.blocks.len(),
                u32::MAX
            )));
        }
        for (i, &(size, align)) in self.blocks.iter().enumerate() {
            check_block(i, size, align)?;
        }
        // Per block: allocated yet, freed yet.
        let mut freed = vec![false; self.blocks.len()];
        let mut allocated = 0usize;
        for (t, ev) in self.events.iter().enumerate() {
            match *ev {
                PlanEvent::Alloc(i) => {
                    if i as usize != allocated {
                        return Err(PlanError::new(format!(
                            "event {t}: Alloc({i}), but the next block to allocate is {allocated} \
                             (blocks are allocated once each, in index order)"
                        )));
                    }
                    if allocated == self.blocks.len() {
                        return Err(PlanError::new(format!(
                            "event {t}: Alloc({i}) of a block that is not in `blocks` ({} blocks)",
                            self.blocks.len()
                        )));
                    }
                    allocated += 1;
                }
                PlanEvent::Free(i) => {
                    let i = i as usize;
                    if i >= allocated {
                        return Err(PlanError::new(format!(
                            "event {t}: Free({i}) of a block not allocated yet"
                        )));
                    }
                    if core::mem::replace(&mut freed[i], true) {
                        return Err(PlanError::new(format!(
                            "event {t}: Free({i}) of a block already freed"
                        )));
                    }
                }
            }
        }
        if allocated != self.blocks.len() {
            return Err(PlanError::new(format!(
                "{} blocks but only {allocated} Alloc events",
                self.blocks.len()
            )));
        }
        Ok(())
    }
}

/// Block `i`'s size and alignment in range ([`Recording::validate`]; a
/// stored plan's tape is checked the same way).
pub(crate) fn check_block(i: usize, size: usize, align: usize) -> Result<(), PlanError> {
    if size == 0 || size > MAX_BLOCK {
        return Err(PlanError::new(format!(
            "block {i}: size {size} is not in 1..={MAX_BLOCK}"
        )));
    }
    if !align.is_power_of_two() || align > MAX_ALIGN {
        return Err(PlanError::new(format!(
            "block {i}: alignment {align} is not a power of two of at most {MAX_ALIGN}"
        )));
    }
    Ok(())
}

/// The largest block a recording or plan may hold: 128 TiB, as for any
/// arena block.
pub const MAX_BLOCK: usize = 1 << 47;

/// The largest alignment a recording or plan may ask for: 1 GiB, as for
/// [`ArenaConfig::max_align`](crate::ArenaConfig::max_align).
pub const MAX_ALIGN: usize = 1 << 30;
