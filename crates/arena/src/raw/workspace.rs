//! Workspaces of a planned run: a block the run frees right after it
//! allocated it (cuDNN's and cuBLAS's scratch, picked per shape) is served
//! without leaving the plan, whether the plan has it or not.
//!
//! A family predicts a run from its core (the run without such blocks,
//! [`Recording::core`](crate::plan::Recording::core)), so a predicted
//! plan has no workspaces, and the run's come where the plan expects its
//! next block. Whether a request is a workspace is known only at the next
//! event, so each is served where both answers are safe:
//!
//! - one that fits the plan's next slot is served there (the slot is free
//!   now: its block has not come yet); freed at once, the plan steps back
//!   ([`RawArena::free_apart`]) and the slot waits for its own block. Its
//!   handle is stale from then on: the block index's handles carry how
//!   many times it was taken back;
//! - one larger than that slot (or where the plan frees) is served in the
//!   lowest hole of the plan's block where nothing is live now
//!   ([`RawArena::serve_workspace`]), outside the run's recording; freed
//!   at once, the run goes on on its plan. Any other event first makes it
//!   what it was, a larger block of the run: the run leaves its plan
//!   there, that block moved to its hole, as the run would have moved it
//!   ([`RawArena::settle_workspace`]). Where no hole fits, the run leaves
//!   its plan at once, as before.
//!
//! Only on a plan that leaves workspaces apart ([`Plan::workspaces_apart`]:
//! a family's prediction for runs that differ by them); on any other, a
//! block freed out of the plan's order leaves it, as it always did.
//!
//! [`Plan::workspaces_apart`]: crate::Plan::workspaces_apart
//!
//! A run recorded as a trace keeps every block: no workspace is taken out
//! of it.

use super::loose::Loose;
use super::{Handle, HandleKind, OpenRun, RawAlloc, RawArena, Serve};
use crate::freemap::pow2;
use crate::memory::Memory;
use crate::plan::Deviation;

/// A block served in a hole of the plan's block that is a workspace if
/// freed next: its index (the run's next), offset, size and alignment.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pending {
    index: u32,
    off: usize,
    size: usize,
    align: usize,
}

/// The serving state before block `index` was served smaller than its
/// slot: restored when that block turns out to be a workspace.
#[derive(Clone, Copy, Debug)]
pub(super) struct Undo {
    pub(super) index: u32,
    pub(super) resized: bool,
    pub(super) halved: bool,
    pub(super) recording: bool,
}

impl<P> super::PlanBlock<P> {
    /// The generation the handles of block `index` carry now (bumped each
    /// time the index was taken back as a workspace).
    #[inline]
    pub(super) fn generation_of(&self, index: u32) -> u32 {
        if self.reissued.is_empty() {
            return self.generation;
        }
        let times = self.reissued.get(index as usize).copied().unwrap_or(0);
        self.generation
            .wrapping_add(times.wrapping_mul(0x9E37_79B9))
    }
}

impl<M: Memory> RawArena<M> {
    /// The free of planned block `index` of the open run, on a plan that
    /// leaves workspaces apart (the caller updated the block's table):
    /// its pending workspace's, or a workspace the plan's next slot held
    /// (the run's latest block, freed by the event right after its
    /// allocation, where the plan does not free it now), each taken back
    /// with its handle stale; else any pending workspace is settled and the
    /// free is followed in the plan. Not while a trace is recorded (its
    /// runs keep every block).
    #[cold]
    #[inline(never)]
    pub(super) fn free_apart(
        run: &mut OpenRun,
        pb: &mut super::PlanBlock<M::Ptr>,
        index: u32,
        tracing: bool,
        deviations: &mut u64,
    ) {
        let Some(serve) = run.serve.as_mut() else {
            return;
        };
        let pending = serve.pending.is_some_and(|p| p.index == index);
        let rewinds = !tracing
            && !serve.deviated
            && serve.pending.is_none()
            && index.checked_add(1) == Some(run.blocks)
            && serve.pos > 0
            && serve
                .plan
                .step(serve.pos - 1)
                .is_some_and(|s| !s.is_free() && s.index == index)
            && !serve
                .plan
                .step(serve.pos)
                .is_some_and(|s| s.is_free() && s.index == index);
        if pending || rewinds {
            // A workspace: its handle is stale from now on.
            if pb.reissued.len() <= index as usize {
                pb.reissued.resize(index as usize + 1, 0);
            }
            pb.reissued[index as usize] = pb.reissued[index as usize].wrapping_add(1);
            if pending {
                serve.pending = None;
            } else {
                Self::rewind(run, index);
            }
            return;
        }
        Self::settle_workspace(run, deviations);
        Self::record_free(run, index, deviations);
    }

    /// Takes workspace `index` (freed already) back out of the open run:
    /// the plan steps back to the allocation it took, and the run's
    /// recording and flags are as before it ([`RawArena::free_apart`]).
    #[cold]
    pub(super) fn rewind(run: &mut OpenRun, index: u32) {
        let Some(serve) = run.serve.as_mut() else {
            return;
        };
        serve.pos -= 1;
        run.blocks -= 1;
        if let Some(undo) = serve.undo.take().filter(|u| u.index == index) {
            serve.resized = undo.resized;
            serve.halved = undo.halved;
            if !undo.recording {
                // Its recording began with this block: none before it.
                run.rec.clear();
                serve.recording = false;
                return;
            }
        }
        if serve.recording {
            run.rec.events.pop();
            run.rec.blocks.pop();
        }
    }

    /// Serves the open run's next allocation (`len` bytes at `align`, which
    /// its plan's next step does not take) as a workspace, pending its
    /// free: in the lowest hole of the plan's block where nothing is live
    /// now (every live block of a run on its plan is at its planned
    /// offset). `None` where the run is off its plan (or its plan keeps
    /// its workspaces, [`Plan::workspaces_apart`]), one is pending, a trace
    /// is recorded, or no hole fits: the caller leaves the plan as before.
    /// (Past the plan's block, a workspace larger than every hole would
    /// cost its whole size over the plan: a dynamic run puts it on what
    /// is live then, often far below the run's peak.)
    ///
    /// [`Plan::workspaces_apart`]: crate::Plan::workspaces_apart
    #[cold]
    #[inline(never)]
    pub(super) fn serve_workspace(&mut self, len: usize, align: usize) -> Option<RawAlloc<M::Ptr>> {
        let granule = self.pool.granule();
        let tracing = self.trace.is_some();
        let run = self.run.as_mut()?;
        let serve = run.serve.as_mut()?;
        if !serve.plan.workspaces_apart()
            || serve.deviated
            || serve.pending.is_some()
            || tracing
            || !pow2(align)
        {
            return None;
        }
        let size = len.checked_add(granule - 1)? & !(granule - 1);
        let align = align.max(granule);
        // Offsets are aligned inside the block, whose base is aligned to
        // the plan's alignment only.
        if align > serve.plan.align() {
            return None;
        }
        let pb = self.plan_blocks.get_mut(serve.slot as usize)?.as_mut()?;
        if pb.dissolved {
            return None;
        }
        let mut taken: Vec<(usize, usize)> = pb
            .served
            .iter()
            .enumerate()
            .filter(|&(_, &bytes)| bytes > 0)
            .filter_map(|(j, &bytes)| serve.plan.offset(j).map(|o| (o, o + bytes)))
            .collect();
        taken.sort_unstable();
        let mut at = 0usize;
        for &(s, e) in &taken {
            if at.next_multiple_of(align).checked_add(size)? <= s {
                break;
            }
            at = at.max(e);
        }
        let off = at.next_multiple_of(align);
        // Inside the plan's own bytes: a run on its plan reaches no further.
        if off.checked_add(size)? > serve.plan.size().min(pb.raw.size) {
            return None;
        }
        let k = run.blocks;
        if pb.served.len() <= k as usize {
            pb.served.resize(k as usize + 1, 0);
        }
        pb.served[k as usize] = size;
        pb.live += 1;
        pb.live_bytes += size;
        serve.pending = Some(Pending {
            index: k,
            off,
            size,
            align,
        });
        let ptr = M::at(pb.raw.ptr, off);
        let generation = pb.generation_of(k);
        self.planned_live += size;
        self.planned_allocs += 1;
        self.allocs += 1;
        let in_use = self.pool.in_use() - (self.plan_reserved - self.planned_live);
        self.peak_in_use = self.peak_in_use.max(in_use);
        run.peak = run.peak.max(in_use);
        Some(RawAlloc {
            ptr,
            handle: Handle {
                kind: HandleKind::Planned {
                    slot: serve.slot,
                    index: k,
                },
                arena: self.id,
                generation,
            },
        })
    }

    /// A pending workspace that another event came before is a block of
    /// the run, larger than the plan's next (or one where it frees): it
    /// enters the run's recording as its next block, and the run leaves
    /// its plan there, that block moved to its hole (checked against every
    /// later slot, as a block the run moved itself would be).
    #[cold]
    #[inline(never)]
    pub(super) fn settle_workspace(run: &mut OpenRun, deviations: &mut u64) {
        let Some(serve) = run.serve.as_mut() else {
            return;
        };
        let Some(p) = serve.pending.take() else {
            return;
        };
        Self::leave(serve, run.blocks, &mut run.rec);
        if let Some(loose) = serve.loose.as_mut() {
            loose.moved_to(p.index, p.off, p.size);
        }
        run.rec.alloc(p.size, p.align);
        run.blocks += 1;
        *deviations += 1;
    }

    /// On a plan that leaves workspaces apart, an allocation its next step
    /// does not take: any pending workspace settled first, then this one
    /// served as a workspace if it can be ([`RawArena::serve_workspace`]).
    #[inline]
    pub(super) fn alloc_apart(&mut self, len: usize, align: usize) -> Option<RawAlloc<M::Ptr>> {
        // Only a plan that leaves workspaces apart has any pending.
        let serve = self.run.as_ref().and_then(|r| r.serve.as_ref());
        if !serve.is_some_and(|s| s.plan.workspaces_apart()) {
            return None;
        }
        self.settle_pending();
        self.serve_workspace(len, align)
    }

    /// Settles the open run's pending workspace, if any, before an event
    /// that is not its free ([`RawArena::settle_workspace`]).
    #[inline]
    pub(super) fn settle_pending(&mut self) {
        if let Some(run) = self.run.as_mut() {
            if run.serve.as_ref().is_some_and(|s| s.pending.is_some()) {
                Self::settle_workspace(run, &mut self.deviations);
            }
        }
    }

    /// The open run leaves its plan before its block `blocks` (a larger
    /// one where the plan allocates, or an extra one where it frees).
    pub(super) fn leave(serve: &mut Serve, blocks: u32, rec: &mut crate::plan::Recording) {
        serve.why = Some(match serve.plan.step(serve.pos) {
            Some(step) if !step.is_free() => Deviation::Larger,
            _ => Deviation::Extra,
        });
        Self::materialize(serve, rec, blocks);
        serve.deviated = true;
        serve.loose = Some(Loose::new(&serve.plan, serve.pos));
        serve.straight = Self::straight(&serve.plan, blocks);
    }
}
