//! A [`Plan`]'s one in-memory form, its compiled tape: one [`Step`] per
//! event (an allocation with its offset, size and alignment, or a free),
//! and where each block's allocation step is. The recording and the
//! offsets a plan is made from, or that a file holds, are read once into
//! the tape and not kept beside it: a plan weighs its tape (24 bytes an
//! event) and 4 bytes a block, less than the file that holds it.
//!
//! A tape is built only from a source that passes every check of
//! [`Plan::validate`] (what [`Recording::validate`] checks, then the
//! layout: offsets aligned, the size the highest end, no two live blocks
//! on one byte, the alignment and the lower bound), made on the source
//! where it is, so that checking never holds a copy of it.

use super::recording::check_block;
use super::{overlap, Plan, PlanError, PlanEvent, Recording, Step, TapeTotals};
use super::{PlanParts, MAX_ALIGN, MAX_BLOCK};

/// What a tape is built from: a plan's blocks, offsets and events, read
/// where they are (a recording, or a file's bytes) and checked as they
/// are read.
pub(crate) struct Source<B, O, E> {
    /// How many blocks.
    pub(crate) blocks: usize,
    /// Block `i`'s `(size, align)`.
    pub(crate) block: B,
    /// Block `i`'s offset.
    pub(crate) offset: O,
    /// The events, in time order.
    pub(crate) events: E,
    /// How many events.
    pub(crate) event_count: usize,
    /// The plan's size, alignment and lower bound, as claimed (`None`:
    /// the lower bound is the events', as a plan solved from a recording
    /// has it).
    pub(crate) size: usize,
    pub(crate) align: usize,
    pub(crate) lower_bound: Option<usize>,
}

impl<B, O, E> Source<B, O, E>
where
    B: Fn(usize) -> Result<(usize, usize), PlanError>,
    O: Fn(usize) -> Result<usize, PlanError>,
    E: Iterator<Item = PlanEvent> + Clone,
{
    /// The events, as many as claimed.
    fn events(&self) -> std::iter::Take<E> {
        self.events.clone().take(self.event_count)
    }

    /// Everything [`Plan::validate`] checks, on the source itself: its
    /// structure as [`Recording::validate`] checks a recording's, then its
    /// layout (offsets aligned, the size the highest end, no two live
    /// blocks on one byte: [`overlap::check_source`]), the alignment and
    /// the lower bound; returns the lower bound. Memory: a bit a block,
    /// and the live blocks.
    fn check(&self) -> Result<usize, PlanError> {
        if u32::try_from(self.blocks).is_err() || u32::try_from(self.event_count).is_err() {
            return Err(PlanError::new(format!(
                "{} blocks and {} events: at most {} of each are supported",
                self.blocks,
                self.event_count,
                u32::MAX
            )));
        }
        let mut needed = 1usize;
        for i in 0..self.blocks {
            let (size, align) = (self.block)(i)?;
            check_block(i, size, align)?;
            needed = needed.max(align);
        }
        let mut allocated = 0usize;
        // One bit a block: freed yet.
        let mut freed = vec![0u64; self.blocks.div_ceil(64)];
        let (mut live, mut peak) = (0usize, 0usize);
        for (t, ev) in self.events().enumerate() {
            match ev {
                PlanEvent::Alloc(i) => {
                    if i as usize != allocated {
                        return Err(PlanError::new(format!(
                            "event {t}: Alloc({i}), but the next block to allocate is \
                             {allocated} (blocks are allocated once each, in index order)"
                        )));
                    }
                    if allocated == self.blocks {
                        return Err(PlanError::new(format!(
                            "event {t}: Alloc({i}) of a block that is not in `blocks` ({} \
                             blocks)",
                            self.blocks
                        )));
                    }
                    allocated += 1;
                    live = live.saturating_add((self.block)(i as usize)?.0);
                    peak = peak.max(live);
                }
                PlanEvent::Free(i) => {
                    let i = i as usize;
                    if i >= allocated {
                        return Err(PlanError::new(format!(
                            "event {t}: Free({i}) of a block not allocated yet"
                        )));
                    }
                    let (word, bit) = (i / 64, 1u64 << (i % 64));
                    if freed[word] & bit != 0 {
                        return Err(PlanError::new(format!(
                            "event {t}: Free({i}) of a block already freed"
                        )));
                    }
                    freed[word] |= bit;
                    live = live.saturating_sub((self.block)(i)?.0);
                }
            }
        }
        drop(freed);
        if allocated != self.blocks {
            return Err(PlanError::new(format!(
                "{} blocks but only {allocated} Alloc events",
                self.blocks
            )));
        }
        overlap::check_source(
            self.blocks,
            |i| Ok::<_, PlanError>(((self.offset)(i)?, (self.block)(i)?)),
            self.events(),
            self.size,
        )?;
        if self.size > MAX_BLOCK {
            return Err(PlanError::new(format!(
                "size {} is over the largest block ({MAX_BLOCK})",
                self.size
            )));
        }
        if !self.align.is_power_of_two() || self.align < needed || self.align > MAX_ALIGN {
            return Err(PlanError::new(format!(
                "align {} must be a power of two between the blocks' largest alignment \
                 ({needed}) and {MAX_ALIGN}",
                self.align
            )));
        }
        // The events are in time order: one pass (equal to
        // `solver::lower_bound` of the requests; tested).
        match self.lower_bound {
            Some(claimed) if claimed != peak => Err(PlanError::new(format!(
                "lower_bound {claimed} but the recording's is {peak}"
            ))),
            _ => Ok(peak),
        }
    }
}

impl Plan {
    /// Checks the plan `src` describes whole (as [`Plan::validate`]
    /// would), then builds it: the checks need no copy of it, so the
    /// source (a file's bytes) and the checks' memory are never held with
    /// the tape.
    ///
    /// # Errors
    /// [`PlanError`] naming the first problem (the recording's, then the
    /// layout's); a block or offset `src` cannot read is its error.
    pub(crate) fn build<B, O, E>(src: Source<B, O, E>) -> Result<Plan, PlanError>
    where
        B: Fn(usize) -> Result<(usize, usize), PlanError>,
        O: Fn(usize) -> Result<usize, PlanError>,
        E: Iterator<Item = PlanEvent> + Clone,
    {
        let lower_bound = src.check()?;
        let mut tape = Vec::with_capacity(src.event_count);
        let mut allocs = Vec::with_capacity(src.blocks);
        for ev in src.events() {
            tape.push(match ev {
                PlanEvent::Alloc(i) => {
                    let (size, align) = (src.block)(i as usize)?;
                    allocs.push(tape.len() as u32);
                    Step {
                        offset: (src.offset)(i as usize)?,
                        size,
                        // Checked: a power of two of at most 1 GiB.
                        align: align as u32,
                        index: i,
                    }
                }
                PlanEvent::Free(i) => Step {
                    offset: 0,
                    size: 0,
                    align: 0,
                    index: i,
                },
            });
        }
        let mut plan = Plan {
            tape,
            allocs,
            size: src.size,
            align: src.align,
            lower_bound,
            whole: TapeTotals::default(),
            workspaces_apart: false,
            sizes_seen: super::SizesSeen::new(super::SEEN),
        };
        plan.whole = plan.totals();
        Ok(plan)
    }

    /// [`Plan::build`] from a recording and its offsets.
    pub(crate) fn build_from(
        recording: &Recording,
        offsets: &[usize],
        size: usize,
        align: usize,
        lower_bound: Option<usize>,
    ) -> Result<Plan, PlanError> {
        if offsets.len() != recording.blocks.len() {
            return Err(PlanError::new(format!(
                "{} offsets for {} blocks",
                offsets.len(),
                recording.blocks.len()
            )));
        }
        Plan::build(Source {
            blocks: recording.blocks.len(),
            block: |i| Ok(recording.blocks[i]),
            offset: |i| Ok(offsets[i]),
            events: recording.events.iter().copied(),
            event_count: recording.events.len(),
            size,
            align,
            lower_bound,
        })
    }

    /// Checks everything serving relies on: the tape holds a recording
    /// that passes [`Recording::validate`] (every block's allocation step
    /// where the plan says); every offset is a multiple of its block's
    /// alignment; no two blocks alive at the same time share a byte;
    /// `size` is exactly the highest end offset (so every block lies
    /// inside the plan's block); `align` is a power of two no smaller than
    /// any block's; and `lower_bound` is the recording's.
    ///
    /// # Errors
    /// [`PlanError`] naming the first problem found.
    pub fn validate(&self) -> Result<(), PlanError> {
        for (i, &at) in self.allocs.iter().enumerate() {
            match self.tape.get(at as usize) {
                Some(s) if !s.is_free() && s.index as usize == i => {}
                _ => {
                    return Err(PlanError::new(format!(
                        "block {i}: its allocation is not at step {at}"
                    )))
                }
            }
        }
        let step = |i: usize| {
            self.allocs
                .get(i)
                .and_then(|&at| self.tape.get(at as usize))
                .ok_or_else(|| PlanError::new(format!("block {i} is not on the tape")))
        };
        Source {
            blocks: self.allocs.len(),
            block: |i| step(i).map(|s| (s.size, s.align as usize)),
            offset: |i| step(i).map(|s| s.offset),
            events: self.events(),
            event_count: self.tape.len(),
            size: self.size,
            align: self.align,
            lower_bound: Some(self.lower_bound),
        }
        .check()
        .map(drop)
    }

    /// What following the whole (valid) tape adds up to.
    fn totals(&self) -> TapeTotals {
        let mut whole = TapeTotals::default();
        let mut live = 0usize;
        let mut freed = vec![false; self.allocs.len()];
        let mut sizes = 0usize;
        for step in &self.tape {
            if step.is_free() {
                whole.frees += 1;
                live -= self.step_of(step.index as usize).size;
                freed[step.index as usize] = true;
            } else {
                whole.allocs += 1;
                live += step.size;
                sizes |= step.size;
                whole.peak_live = whole.peak_live.max(live);
            }
        }
        whole.end_live = (0..self.allocs.len() as u32)
            .filter(|&i| !freed[i as usize])
            .collect();
        whole.end_live.shrink_to_fit();
        whole.end_live_bytes = live;
        whole.size_quantum = match sizes {
            0 => 0,
            s => 1 << s.trailing_zeros(),
        };
        whole
    }

    /// The allocation step of block `i` (a valid plan's: `i` names one).
    pub(super) fn step_of(&self, i: usize) -> &Step {
        &self.tape[self.allocs[i] as usize]
    }

    /// The events of the tape, in order.
    pub(super) fn events(
        &self,
    ) -> std::iter::Map<std::slice::Iter<'_, Step>, fn(&Step) -> PlanEvent> {
        fn event(s: &Step) -> PlanEvent {
            if s.is_free() {
                PlanEvent::Free(s.index)
            } else {
                PlanEvent::Alloc(s.index)
            }
        }
        self.tape.iter().map(event as fn(&Step) -> PlanEvent)
    }

    /// The plan's parts (its recording and offsets, rebuilt from the tape).
    pub fn to_parts(&self) -> PlanParts {
        PlanParts {
            recording: self.recording(),
            offsets: (0..self.len()).map(|i| self.step_of(i).offset).collect(),
            size: self.size,
            align: self.align,
            lower_bound: self.lower_bound,
        }
    }
}
