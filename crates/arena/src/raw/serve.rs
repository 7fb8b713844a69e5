//! Serving planned runs: drawing the plan's block, the compiled fast path,
//! and following (or leaving) the plan on frees.

use super::loose::Loose;
use super::{Handle, HandleKind, OpenRun, PlanBlock, RawAlloc, RawArena, Serve};
use crate::freemap::{pow2, FreeError};
use crate::memory::Memory;
use crate::plan::{Deviation, Plan, Recording};
use crate::pool::{RawBlock, Tag, PLAN_BLOCK};
use crate::ArenaError;

use std::sync::Arc;

impl<M: Memory> RawArena<M> {
    /// Draws the block of `plan` from the pool and returns its serving state.
    pub(super) fn draw_plan_block(&mut self, plan: Arc<Plan>) -> Result<Serve, ArenaError> {
        self.check();
        let size = self.pool.span_size(plan.size(), plan.align())?;
        let tag = Tag {
            run: self.next_run,
            index: 0,
            rec: PLAN_BLOCK,
            len: size,
            #[cfg(debug_assertions)]
            location: core::panic::Location::caller(),
        };
        let raw = self.pool.alloc_plan_block(size, plan.align(), tag)?;
        let mut served = core::mem::take(&mut self.spare_served);
        served.clear();
        served.resize(plan.len(), 0);
        let generation = self.next_plan_gen;
        self.next_plan_gen = generation.wrapping_add(1);
        let block = PlanBlock {
            raw,
            generation,
            served,
            live: 0,
            live_bytes: 0,
            open: true,
            dissolved: false,
            spans: Vec::new(),
            reissued: Vec::new(),
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
            why: None,
            // A trace needs every block's requested bytes: record throughout.
            recording: self.trace.is_some(),
            loose: None,
            repair: None,
            straight: false,
            resized: false,
            halved: false,
            beside: false,
            pending: None,
            undo: None,
            tentative: None,
            extras: 0,
            past_next: false,
        })
    }

    /// Serves the allocation from the plan of the open run, if the run still
    /// follows it and the request fits the plan's next step: one step of the
    /// compiled plan read, compared and added to the block's base. `None`
    /// leaves everything as it was.
    #[inline]
    pub(super) fn alloc_planned(&mut self, len: usize, align: usize) -> Option<RawAlloc<M::Ptr>> {
        let run = self.run.as_mut()?;
        let serve = run.serve.as_mut()?;
        if serve.deviated || serve.pending.is_some() || serve.tentative.is_some() {
            return None;
        }
        let step = *serve.plan.step(serve.pos)?;
        let granule = self.pool.granule();
        // `len <= step.size` first: then rounding cannot overflow.
        if step.is_free() || len > step.size || !pow2(align) {
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
            // A small request may be a block the plan does not have: served
            // beside the plan until the next event says ([`tentative`]).
            if self.trace.is_none() && super::tentative::may_be_extra(&serve.plan, size, step.size)
            {
                return None;
            }
            // Served, but smaller than recorded: this run's own recording
            // differs from the plan's from here on (unless the block is a
            // workspace, taken back at its free).
            if serve.plan.workspaces_apart() {
                serve.undo = Some(super::workspace::Undo {
                    index,
                    resized: serve.resized,
                    halved: serve.halved,
                    recording: serve.recording,
                });
            }
            serve.resized = true;
            serve.halved |= size.saturating_mul(2) <= step.size;
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
        self.planned_live += size;
        self.planned_allocs += 1;
        self.allocs += 1;
        let in_use = self.pool.in_use() - (self.plan_reserved - self.planned_live);
        self.peak_in_use = self.peak_in_use.max(in_use);
        run.peak = run.peak.max(in_use);
        let generation = pb.generation_of(index);
        Some(RawAlloc {
            ptr,
            handle: Handle {
                kind: HandleKind::Planned { slot, index },
                arena: self.id,
                generation,
            },
        })
    }

    /// Whether the open run's next allocation (`len` bytes) is one its plan
    /// has no place for, and not the plan's next block come early: the
    /// plan's next step is a free (or it has none left), and the request
    /// is at most half the plan's next block (or it has none left) and a
    /// sixteenth of the plan's block, and no block was served in a slot
    /// twice its size or more (an extra block served in the slot of the
    /// plan's next, whose own block then comes where the plan frees, is no
    /// extra one). Such a block (a small buffer a run makes at some inputs
    /// only) is served
    /// from the pool beside the plan's block, outside the run's recording,
    /// and the run goes on following its plan: taken as a deviation, every
    /// later block would be the plan's next by index, none in its slot,
    /// and the run was served around blocks where no dynamic arena would
    /// have them (one extra block of 128 bytes put runs up to 1.5x their
    /// dynamic runs).
    #[inline]
    pub(super) fn beside_plan(&self, len: usize) -> bool {
        let Some(run) = self.run.as_ref() else {
            return false;
        };
        let Some(serve) = run.serve.as_ref().filter(|s| !s.deviated && !s.halved) else {
            return false;
        };
        if serve.plan.step(serve.pos).is_some_and(|s| !s.is_free()) {
            return false;
        }
        // No more than a sixteenth of the plan's block (as `loose` takes
        // an extra block in): a large block where the plan frees is
        // another path through the model, not a buffer beside it.
        len <= serve.plan.size() / 16
            && serve
                .plan
                .block(run.blocks as usize)
                .is_none_or(|(bytes, _)| len.saturating_mul(2) <= bytes)
    }

    /// The open run's next block, `size` bytes at `align`, at the place its
    /// repair gives it, if the pool has that place free: the block and its
    /// offset from the dissolved plan block.
    #[cold]
    #[inline(never)]
    pub(super) fn alloc_repaired(
        &mut self,
        size: usize,
        align: usize,
        tag: Tag,
    ) -> Option<(RawBlock<M::Ptr>, usize)> {
        let r = self.run.as_mut()?;
        let index = r.blocks as usize;
        let repair = r.serve.as_mut()?.repair.as_mut()?;
        let rid = repair.rid;
        let (off, rel) = repair.at(index, size, align)?;
        let raw = self.pool.alloc_range(rid, off, size, align, tag)?;
        Some((raw, rel))
    }

    /// Where the open run's pool block goes: a repaired run's planned
    /// block where the rest of the plan was placed again, if that is free
    /// ([`repair`](super::repair)); a block outside the plan of a run on
    /// one, or one the run has no room for inside its plan's block
    /// ([`RawArena::leave_block`]), past the plan's block; else where the
    /// pool places it. Returns the block and, for a repaired one, its
    /// offset from the dissolved plan block.
    #[inline]
    pub(super) fn place_block(
        &mut self,
        size: usize,
        align: usize,
        tag: Tag,
        planable: bool,
    ) -> Result<(RawBlock<M::Ptr>, Option<usize>), ArenaError> {
        let Some(serve) = self.run.as_mut().and_then(|r| r.serve.as_mut()) else {
            return Ok((self.pool.alloc(size, align, tag)?, None));
        };
        if planable && serve.repair.is_some() {
            if let Some((raw, off)) = self.alloc_repaired(size, align, tag) {
                return Ok((raw, Some(off)));
            }
        } else if !planable || core::mem::take(&mut serve.past_next) {
            if let Some(raw) = self.alloc_past_plan(size, align, tag, planable) {
                return Ok((raw, None));
            }
        }
        Ok((self.pool.alloc(size, align, tag)?, None))
    }

    /// A block outside the plan of the open run that still follows its
    /// plan ([`RawArena::beside_plan`]), or a `planable` block of a run
    /// served loosely that has no room inside the plan's block
    /// ([`RawArena::leave_block`]), `size` bytes at `align`, right past
    /// the plan's block, where a dynamic arena would put it on a fresh
    /// region, if the pool has that place free and committed: the pool's
    /// usual placement may take it from anywhere in cached memory above
    /// (24 KiB past the block for a 128-byte block, seen). `None`: the
    /// pool places it.
    #[cold]
    #[inline(never)]
    pub(super) fn alloc_past_plan(
        &mut self,
        size: usize,
        align: usize,
        tag: Tag,
        planable: bool,
    ) -> Option<RawBlock<M::Ptr>> {
        let serve = self.run.as_mut()?.serve.as_mut()?;
        if serve.deviated && serve.loose.is_none() {
            return None;
        }
        serve.beside = true;
        let pb = self.plan_blocks.get(serve.slot as usize)?.as_ref()?;
        if pb.dissolved {
            return None;
        }
        let (rid, base) = (pb.raw.rid, pb.raw.off);
        let off = base
            .checked_add(pb.raw.size)?
            .checked_next_multiple_of(align.max(1))?;
        let raw = self.pool.alloc_range(rid, off, size, align, tag)?;
        if planable {
            // A planned block of a run served loosely: in the way of the
            // rest of the plan, if it is ever placed again.
            if let Some(loose) = serve.loose.as_mut() {
                loose.went_past(tag.rec, off - base, size);
            }
        }
        Some(raw)
    }

    /// Records the free of block `index`, following it in the serving plan.
    /// A free out of the plan's order leaves the plan: the rest of the run
    /// is served inside the plan's block ([`loose`](super::loose)).
    #[inline(always)]
    pub(super) fn record_free(run: &mut OpenRun, index: u32, deviations: &mut u64) {
        match &mut run.serve {
            // A dynamic run: derived from its `ops` when it ends.
            None => {}
            Some(serve) => {
                if !serve.deviated {
                    let expected = serve.plan.step(serve.pos);
                    if expected.is_some_and(|s| s.is_free() && s.index == index) {
                        serve.pos += 1;
                    } else {
                        Self::materialize(serve, &mut run.rec, run.blocks);
                        serve.deviated = true;
                        serve.why = Some(Deviation::Order);
                        serve.loose = Some(Loose::new(&serve.plan, serve.pos));
                        serve.straight = Self::straight(&serve.plan, run.blocks);
                        *deviations += 1;
                    }
                } else if let Some(loose) = serve.loose.as_mut() {
                    loose.freed(index);
                }
                if serve.recording {
                    run.rec.free(index);
                }
            }
        }
    }

    /// Whether a run on `plan` that leaves it after `blocks` allocations
    /// has them all where a dynamic arena would ([`Serve::straight`]).
    #[cold]
    pub(super) fn straight(plan: &Plan, blocks: u32) -> bool {
        blocks as usize <= plan.run_order_start()
    }

    /// What a caller that serves the open planned run's exact steps itself
    /// (the host shell's [`ScopedRun`](crate::ScopedRun)) needs: the plan
    /// block's address and size, its slot and generation. `None` when no
    /// plan serves the run, the run left it, or the run records its own
    /// events (a trace is on): every event must then come through here.
    pub(crate) fn exact_serving(&self) -> Option<(M::Ptr, usize, u32, u32)> {
        let run = self.run.as_ref()?;
        let serve = run.serve.as_ref()?;
        if serve.deviated || serve.recording || serve.pos != 0 {
            return None;
        }
        let pb = self.plan_blocks.get(serve.slot as usize)?.as_ref()?;
        Some((pb.raw.ptr, pb.raw.size, serve.slot, pb.generation))
    }

    /// Brings the open planned run up to event `upto` of its plan: the
    /// bookkeeping of every step from where the run stands, as
    /// [`RawArena::alloc_planned`] and [`RawArena::free_planned`] would
    /// have done it had each event come through them as recorded, except
    /// the allocations listed in `smaller`: `(step, size)`, in step order,
    /// each served at `size` (a multiple of the granule, at most the
    /// step's), from which on the run keeps its own recording as
    /// `alloc_planned` does. For a caller that served those events itself
    /// ([`RawArena::exact_serving`]) and guarantees they were the plan's,
    /// but for those sizes.
    pub(crate) fn follow_steps(&mut self, upto: usize, smaller: &[(usize, usize)]) {
        let Some(run) = self.run.as_mut() else {
            return;
        };
        let Some(serve) = run.serve.as_mut().filter(|s| !s.deviated) else {
            return;
        };
        let Some(pb) = self
            .plan_blocks
            .get_mut(serve.slot as usize)
            .and_then(Option::as_mut)
        else {
            return;
        };
        let plan = Arc::clone(&serve.plan);
        let steps = plan.steps();
        let upto = upto.min(steps.len());
        if upto <= serve.pos {
            return;
        }
        serve.resized |= !smaller.is_empty();
        serve.halved |= smaller.iter().any(|&(at, size)| {
            steps
                .get(at)
                .is_some_and(|s| size.saturating_mul(2) <= s.size)
        });
        // Bytes in use outside planned blocks do not change meanwhile.
        let others = self.pool.in_use() - self.plan_reserved;
        let mut peak = run.peak;
        if serve.pos == 0 && upto == steps.len() && (smaller.is_empty() || !serve.recording) {
            let whole = plan.whole();
            let end_live_bytes = if smaller.is_empty() {
                // The whole tape as recorded: its totals at once.
                peak = peak.max(others + self.planned_live + whole.peak_live);
                for &index in &whole.end_live {
                    let (Some(served), Some((size, _))) = (
                        pb.served.get_mut(index as usize),
                        plan.block(index as usize),
                    ) else {
                        debug_assert!(false, "a validated plan names its own blocks");
                        continue;
                    };
                    *served = size;
                }
                whole.end_live_bytes
            } else {
                // Some steps served smaller: one walk for the peak and the
                // sizes live at the end, and the run's recording is the
                // plan's with those sizes (the same events, in order).
                let mut live = self.planned_live;
                let mut next = smaller.iter().peekable();
                for (pos, step) in steps.iter().enumerate() {
                    let Some(served) = pb.served.get_mut(step.index as usize) else {
                        debug_assert!(false, "a validated plan names its own blocks");
                        return;
                    };
                    if step.is_free() {
                        live -= core::mem::take(served);
                    } else {
                        *served = match next.next_if(|&&(at, _)| at <= pos) {
                            Some(&(_, size)) => size.min(step.size),
                            None => step.size,
                        };
                        live += *served;
                        peak = peak.max(others + live);
                    }
                }
                run.rec.clear();
                plan.recording_upto(steps.len(), &mut run.rec);
                for &(at, size) in smaller {
                    let Some(block) = steps
                        .get(at)
                        .and_then(|s| run.rec.blocks.get_mut(s.index as usize))
                    else {
                        debug_assert!(false, "a step served smaller is an allocation");
                        continue;
                    };
                    block.0 = size.min(block.0);
                }
                serve.recording = true;
                live - self.planned_live
            };
            pb.live += whole.end_live.len();
            pb.live_bytes += end_live_bytes;
            self.planned_live += end_live_bytes;
            self.allocs += whole.allocs;
            self.planned_allocs += whole.allocs;
            self.frees += whole.frees;
            run.blocks += whole.allocs as u32;
            serve.pos = upto;
            run.peak = peak;
            self.peak_in_use = self.peak_in_use.max(peak);
            return;
        }
        let mut smaller = smaller.iter().peekable();
        for (pos, step) in steps.iter().enumerate().take(upto).skip(serve.pos) {
            let Some(served) = pb.served.get_mut(step.index as usize) else {
                debug_assert!(false, "a validated plan names its own blocks");
                break;
            };
            if step.is_free() {
                let size = core::mem::take(served);
                debug_assert!(size > 0, "the plan frees a live block");
                self.planned_live -= size;
                pb.live -= 1;
                pb.live_bytes -= size;
                self.frees += 1;
                if serve.recording {
                    run.rec.free(step.index);
                }
            } else {
                let size = match smaller.next_if(|&&(at, _)| at <= pos) {
                    Some(&(at, size)) => {
                        debug_assert!(at == pos && size <= step.size, "a step served smaller");
                        size.min(step.size)
                    }
                    None => step.size,
                };
                if size != step.size {
                    serve.pos = pos;
                    Self::materialize(serve, &mut run.rec, run.blocks);
                }
                if serve.recording {
                    run.rec.alloc(size, step.align as usize);
                }
                *served = size;
                pb.live += 1;
                pb.live_bytes += size;
                self.planned_live += size;
                self.allocs += 1;
                self.planned_allocs += 1;
                run.blocks += 1;
                peak = peak.max(others + self.planned_live);
            }
        }
        serve.pos = upto;
        run.peak = peak;
        self.peak_in_use = self.peak_in_use.max(peak);
    }

    /// Starts keeping the run's own recording: what the run did so far is
    /// the plan's recording up to `serve.pos` (its first `blocks` blocks).
    #[cold]
    pub(super) fn materialize(serve: &mut Serve, rec: &mut Recording, blocks: u32) {
        if serve.recording {
            return;
        }
        let plan = &serve.plan;
        rec.blocks
            .extend((0..(blocks as usize).min(plan.len())).filter_map(|i| plan.block(i)));
        rec.events.extend(
            plan.steps()[..serve.pos.min(plan.event_count())]
                .iter()
                .map(|s| match s.is_free() {
                    true => crate::plan::PlanEvent::Free(s.index),
                    false => crate::plan::PlanEvent::Alloc(s.index),
                }),
        );
        serve.recording = true;
    }

    /// Frees planned block `index` of the plan block in `slot`, for a
    /// handle of this arena of `generation`.
    #[inline]
    pub(super) fn free_planned(
        &mut self,
        slot: u32,
        index: u32,
        generation: u32,
    ) -> Result<(), FreeError> {
        self.check();
        // Handles cannot be forged: one of this arena whose plan block is
        // gone, or of another generation, names a block freed already.
        let Some(pb) = self
            .plan_blocks
            .get_mut(slot as usize)
            .and_then(Option::as_mut)
            .filter(|pb| pb.generation_of(index) == generation)
        else {
            return Err(FreeError::AlreadyFree);
        };
        if pb.dissolved {
            return self.free_dissolved(slot, index);
        }
        // The handle's generation matches the plan block's, so a live entry
        // is this handle's block.
        let size = match pb.served.get_mut(index as usize) {
            Some(0) => return Err(FreeError::AlreadyFree),
            Some(served) => core::mem::take(served),
            None => return Err(FreeError::NotABlock),
        };
        self.frees += 1;
        self.planned_live -= size;
        pb.live -= 1;
        pb.live_bytes -= size;
        let orphan_done = !pb.open && pb.live == 0;
        if let Some(r) = &mut self.run {
            if r.serve
                .as_ref()
                .is_some_and(|s| s.slot == slot && s.tentative.is_some())
            {
                Self::settle_tentative(
                    r,
                    &mut self.pool,
                    super::tentative::Next::Free(index),
                    &mut self.deviations,
                );
            }
            match r.serve.as_ref() {
                Some(s) if s.slot == slot && s.plan.workspaces_apart() => {
                    let tracing = self.trace.is_some();
                    Self::free_apart(r, pb, index, tracing, &mut self.deviations);
                }
                Some(s) if s.slot == slot => Self::record_free(r, index, &mut self.deviations),
                // Another slot's block: any pending workspace is settled.
                Some(s) if s.pending.is_some() => {
                    Self::settle_workspace(r, &mut self.deviations);
                }
                _ => {}
            }
        }
        if orphan_done {
            self.release_plan_block(slot);
        }
        Ok(())
    }

    /// Returns plan block `slot` to the pool.
    pub(super) fn release_plan_block(&mut self, slot: u32) {
        if let Some(pb) = self.plan_blocks[slot as usize].take() {
            // A dissolved block is the pool's already.
            if !pb.dissolved {
                self.plan_reserved -= pb.raw.size;
                let freed = self.pool.free(pb.raw.span);
                debug_assert!(freed.is_ok(), "plan block not live in the pool");
            }
            if pb.served.capacity() > self.spare_served.capacity() {
                self.spare_served = pb.served;
            }
        }
    }
}
