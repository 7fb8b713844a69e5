//! A small request where the plan allocates: the plan's next block at a
//! smaller size, or a block the plan does not have?
//!
//! Both come as the same request: one at most half the plan's next slot
//! and at most a 64th of the plan's block. A block whose size depends
//! on the data (a key's plan made at 200 detections, a run with 2) is the
//! first; a small buffer a run makes at some inputs only is the second.
//! Served in the next slot, as the first, the second shifts every later
//! block by one: none is the plan's next by index, and the run leaves its
//! plan where no dynamic arena would have its blocks (the largest class of
//! predicted runs over their dynamic runs on random families).
//!
//! So such a request is served beside the plan's block, from the pool, and
//! the next event of the run says which it was:
//!
//! - the next allocation fits the plan's next slot (and not the one after
//!   it, or that slot's size exactly), or the next free is not the plan's
//!   next but one step: a block the plan does not have. It stays beside,
//!   outside the run's recording, and the run keeps to its plan;
//! - else the plan's block, smaller: it enters the run's recording as the
//!   plan's next block (its span tagged so, so that its free follows the
//!   plan), and the run goes on on its plan with the slot left empty.
//!
//! Either way the run reaches its plan's block and the small block beside
//! it, where before the second case left the plan. The price is the first
//! case's block beside the plan instead of in its slot: at most a 64th of
//! the plan's block, for as long as it lives.
//!
//! A request *more than twice* the plan's next slot is served beside it
//! too, pending the next event, on a plan whose sizes a run made
//! ([`Plan::sizes_seen`]): the plan's block come larger, or a block the
//! plan does not have (a process's one-time buffers: cuBLAS's workspace in
//! the first run of a GPU process, 33 MiB beside a BERT plan of 132). The
//! next event tells them apart as above, with two differences:
//!
//! - an allocation of the plan's next slot's size exactly (and not the
//!   size of the slot after it), or a smaller one neither slot takes,
//!   means a block the plan does not have; any other means the plan's
//!   block come larger, and this the block after it;
//! - the plan's block, still live, leaves the plan there (as a larger block
//!   always did), recorded as the run's; it does not keep its run on the
//!   plan beside it, which a run whose every block grew would make its
//!   whole run beside the plan. The plan's sizes then move with the data
//!   ([`Plan::mark_sizes_vary`]): later runs on it take such a block as
//!   the plan's at once, where a dynamic arena would place it.
//!
//! On a prediction no run kept to, a larger block is the prediction's
//! error, and it is the plan's at once.
//!
//! After a block the plan does not have, a small request that fits the
//! plan's next slot and the one after it exactly is taken as one more
//! (the run makes such blocks), not as the plan's block come smaller.
//!
//! Not on a plan that leaves workspaces apart ([`workspace`](super::workspace)
//! serves its small requests), nor while a trace is recorded (its runs
//! keep every block where it came).

use super::{OpenRun, RawAlloc, RawArena};
use crate::freemap::{align_up, SpanId};
use crate::memory::Memory;
use crate::plan::Plan;
use crate::pool::Pool;

use core::panic::Location;

/// A small block served beside the plan's block, pending the run's next
/// event: its span, size and alignment.
#[derive(Clone, Copy, Debug)]
pub(super) struct Tentative {
    span: SpanId,
    size: usize,
    align: usize,
    /// Whether it is more than twice the plan's next slot
    /// ([`may_be_larger`]).
    larger: bool,
}

/// The event that settles a pending small block.
#[derive(Clone, Copy, Debug)]
pub(super) enum Next {
    /// An allocation of this many bytes (rounded to the granule).
    Alloc(usize),
    /// The free of the run's recorded block of this index.
    Free(u32),
    /// The free of the pending block itself.
    FreeOfItself,
}

/// Whether a request of `size` bytes (rounded to the granule) where
/// `plan`'s next step allocates `step` bytes may be a block the plan does
/// not have: at most half the step and a 64th of the plan's block, on a
/// plan that does not leave workspaces apart.
#[inline]
pub(crate) fn may_be_extra(plan: &Plan, size: usize, step: usize) -> bool {
    !plan.workspaces_apart() && size.saturating_mul(2) <= step && size <= plan.size() / 64
}

/// Whether a request of `size` bytes (rounded to the granule) where
/// `plan`'s next step allocates `step` bytes may be a block the plan does
/// not have, larger than that step: more than twice the step (a run that
/// leaves its plan moves a block up to twice its slot inside the plan's
/// block, [`loose`](super::loose), and dissolves the block at a larger
/// one), and at most half the plan's block (what it costs beside the plan
/// where it turns out to be the plan's own: a block larger than a DenseNet
/// plan, taken so at once, is placed in the dissolved block instead, at
/// 1.20x the plan against 2.12x beside it), on a plan whose sizes a run
/// made ([`Plan::sizes_seen`]: on a prediction no run kept to, a larger
/// block is the prediction's error) that does not leave workspaces apart.
#[inline]
fn may_be_larger(plan: &Plan, size: usize, step: usize) -> bool {
    plan.sizes_seen()
        && !plan.workspaces_apart()
        && size > step.saturating_mul(2)
        && size <= plan.size() / 2
}

impl<M: Memory> RawArena<M> {
    /// Serves the open run's allocation (`len` bytes at `align`, which its
    /// plan's next step does not take) beside the plan's block, pending
    /// the next event, if it is a small request where the plan allocates
    /// ([`may_be_extra`]). `None`: the caller goes on as before.
    #[cold]
    #[inline(never)]
    pub(super) fn alloc_tentative(
        &mut self,
        len: usize,
        align: usize,
        location: &'static Location<'static>,
    ) -> Option<Result<RawAlloc<M::Ptr>, crate::ArenaError>> {
        let granule = self.pool.granule();
        let serve = self.run.as_ref()?.serve.as_ref()?;
        if serve.deviated
            || serve.pending.is_some()
            || serve.tentative.is_some()
            || self.trace.is_some()
        {
            return None;
        }
        let step = serve.plan.step(serve.pos).filter(|s| !s.is_free())?;
        let size = align_up(len, granule)?;
        // Not after a block served at most half its slot: the run's blocks
        // may be the plan's by index no longer, and a larger one is then
        // more likely a block the plan has further on.
        let larger = !serve.halved && may_be_larger(&serve.plan, size, step.size);
        if !larger && !may_be_extra(&serve.plan, size, step.size) {
            return None;
        }
        let raw = match self.alloc_pool(len, align, location, false) {
            Ok(raw) => raw,
            Err(e) => return Some(Err(e)),
        };
        if let Some(serve) = self.run.as_mut().and_then(|r| r.serve.as_mut()) {
            serve.tentative = Some(Tentative {
                span: raw.span,
                size,
                align: align.max(granule),
                larger,
            });
        }
        Some(Ok(self.pool_alloc_handle(raw)))
    }

    /// Settles the open run's pending block, if any, by the run's next
    /// event ([`Next`]): a block the plan does not have stays beside it,
    /// outside the recording; the plan's next block enters the recording
    /// and the plan steps past it, the run going on on its plan (smaller,
    /// or freed already) or leaving it there (larger and live; counted in
    /// `deviations`). Returns whether it was the plan's block and the run
    /// goes on on its plan.
    #[cold]
    #[inline(never)]
    pub(super) fn settle_tentative(
        run: &mut OpenRun,
        pool: &mut Pool<M>,
        next: Next,
        deviations: &mut u64,
    ) -> bool {
        let Some(serve) = run.serve.as_mut() else {
            return false;
        };
        let Some(t) = serve.tentative.take() else {
            return false;
        };
        if serve.deviated {
            return false;
        }
        let k = run.blocks;
        let mine = serve.plan.step(serve.pos).map(|s| s.size).unwrap_or(0);
        let after = serve.plan.step(serve.pos + 1).copied();
        // A request fits a slot it does not halve.
        let fits = |size: usize, slot: usize| size <= slot && size.saturating_mul(2) > slot;
        let the_plans = match next {
            Next::Alloc(size) => {
                let after = after.filter(|s| !s.is_free()).map(|s| s.size);
                if t.larger {
                    // The plan's next slot's block still to come: one of
                    // its size exactly and not the size of the slot after
                    // it, or a smaller one neither slot takes (another
                    // block the plan does not have). Else the plan's next
                    // block came larger, and this is the one after it: a
                    // block of both slots' size exactly too (taken the
                    // other way, a block larger than the whole plan went
                    // on beside it at 1.66x the dynamic run).
                    let exact = size == mine && after != Some(size);
                    let other =
                        size <= mine && !fits(size, mine) && !after.is_some_and(|a| fits(size, a));
                    !(exact || other)
                } else {
                    match (fits(size, mine), after.is_some_and(|a| fits(size, a))) {
                        (true, false) => false,
                        (false, true) => true,
                        // Both fit: the slot whose size it is exactly; both
                        // exactly, the plan's unless the run made a block
                        // the plan does not have already.
                        (true, true) => {
                            !(size == mine && (after != Some(size) || serve.extras > 0))
                        }
                        // Neither: the plan's next block if the plan
                        // allocates after it (as a request served in its
                        // slot would be).
                        (false, false) => after.is_some(),
                    }
                }
            }
            Next::Free(index) => after.is_some_and(|s| s.is_free() && s.index == index),
            Next::FreeOfItself => after.is_some_and(|s| s.is_free() && s.index == k),
        };
        if !the_plans {
            serve.extras += 1;
            return false;
        }
        if t.larger {
            // The plan's block came larger: its sizes move with the data,
            // and later runs on it take such a block as its own at once.
            serve.plan.mark_sizes_vary();
        }
        Self::materialize(serve, &mut run.rec, run.blocks);
        run.rec.alloc(t.size, t.align);
        serve.resized = true;
        serve.pos += 1;
        run.blocks += 1;
        if matches!(next, Next::FreeOfItself) {
            return true;
        }
        pool.retag(t.span, k);
        if !t.larger {
            return true;
        }
        // The plan's block, larger, live beside the plan: the run leaves
        // its plan here, as a larger block in its slot's place would.
        serve.beside = true;
        serve.deviated = true;
        serve.why = Some(crate::plan::Deviation::Larger);
        serve.loose = Some(super::loose::Loose::new(&serve.plan, serve.pos));
        serve.straight = Self::straight(&serve.plan, run.blocks);
        *deviations += 1;
        false
    }

    /// Before an allocation of `len` bytes its plan's next step does not
    /// take: settles the open run's pending small block, if any. Returns
    /// whether there was one (the plan may take the allocation now).
    #[inline]
    pub(super) fn settle_tentative_by_alloc(&mut self, len: usize) -> bool {
        let granule = self.pool.granule();
        let Some(run) = self
            .run
            .as_mut()
            .filter(|r| r.serve.as_ref().is_some_and(|s| s.tentative.is_some()))
        else {
            return false;
        };
        let size = align_up(len, granule).unwrap_or(usize::MAX);
        Self::settle_tentative(run, &mut self.pool, Next::Alloc(size), &mut self.deviations);
        true
    }

    /// At the free of the open run's pool span `span`, tagged as recorded
    /// block `rec`: settles its pending small block, if any (by this free
    /// where the span is a block of the recording or the pending one).
    /// Returns the block of the recording the free is (`rec`, or the
    /// pending block's index where that was the plan's).
    #[inline]
    pub(super) fn settle_tentative_by_free(
        run: &mut OpenRun,
        pool: &mut Pool<M>,
        span: SpanId,
        rec: u32,
        deviations: &mut u64,
    ) -> u32 {
        let Some(t) = run.serve.as_ref().and_then(|s| s.tentative) else {
            return rec;
        };
        if t.span == span {
            let k = run.blocks;
            if Self::settle_tentative(run, pool, Next::FreeOfItself, deviations) {
                return k;
            }
        } else if rec != crate::pool::NOT_PLANNED {
            Self::settle_tentative(run, pool, Next::Free(rec), deviations);
        }
        rec
    }
}

#[cfg(test)]
#[path = "tentative_tests.rs"]
mod tests;
