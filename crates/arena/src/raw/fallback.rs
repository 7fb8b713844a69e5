//! A run that leaves its plan keeps to the plan's block: the block is
//! dissolved into the pool, its live planned blocks becoming ordinary live
//! blocks where the plan put them and the rest free memory that serves the
//! rest of the run. Only what does not fit there grows the arena.

use super::loose::Loose;
use super::repair::Repair;
use super::RawArena;
use crate::freemap::{align_up, FreeError, RunOp, SpanId};
use crate::memory::Memory;
use crate::plan::Plan;
use crate::pool::Tag;
use std::sync::Arc;

impl<M: Memory> RawArena<M> {
    /// Dissolves plan block `slot`, laid out by `plan`: each planned block
    /// still live becomes a span of the pool at its place in the block,
    /// tagged as an allocation of `run` (the open run's, when it is the one
    /// being served: it then counts and logs them as its own); the rest of
    /// the block becomes free memory of the pool, merged with its free
    /// neighbours. Nothing moves and no memory-layer call is made. A block
    /// dissolved already is left alone.
    /// Where the run was served loosely, `loose` says where each block is.
    pub(super) fn dissolve(&mut self, slot: u32, plan: &Plan, loose: Option<&Loose>, run: u64) {
        let Some(pb) = self
            .plan_blocks
            .get_mut(slot as usize)
            .and_then(Option::as_mut)
        else {
            return;
        };
        if pb.dissolved {
            return;
        }
        // The open run's pool allocations are numbered on (its log names
        // them so).
        let open = self.run.as_mut().filter(|r| r.id == run);
        let mut next_index = open.as_ref().map_or(0, |r| r.pool_allocs);
        let mut pieces: Vec<(usize, usize, Tag)> = Vec::with_capacity(pb.live);
        let mut indices: Vec<u32> = Vec::with_capacity(pb.live);
        for (index, &size) in pb.served.iter().enumerate() {
            if size == 0 {
                continue;
            }
            let off = match loose {
                Some(l) => l.offset(index),
                None => plan.offset(index),
            };
            let Some(off) = off else {
                debug_assert!(false, "a live planned block is one of its plan's");
                continue;
            };
            pieces.push((
                off,
                size,
                Tag {
                    run,
                    index: 0,
                    rec: index as u32,
                    len: size,
                    #[cfg(debug_assertions)]
                    location: core::panic::Location::caller(),
                },
            ));
            indices.push(index as u32);
        }
        // By offset, as the pool takes them; numbered in that order.
        let mut order: Vec<usize> = (0..pieces.len()).collect();
        order.sort_by_key(|&i| pieces[i].0);
        let pieces: Vec<(usize, usize, Tag)> = order
            .iter()
            .map(|&i| {
                let mut p = pieces[i];
                p.2.index = next_index;
                next_index += 1;
                p
            })
            .collect();
        let indices: Vec<u32> = order.iter().map(|&i| indices[i]).collect();
        let mut spans: Vec<SpanId> = Vec::with_capacity(pieces.len());
        if self
            .pool
            .dissolve(pb.raw.span, &pieces, &mut spans)
            .is_err()
        {
            debug_assert!(false, "a plan's block holds its planned blocks");
            return;
        }
        let block_size = pb.raw.size;
        let live_bytes = pb.live_bytes;
        let mut by_index = core::mem::take(&mut pb.spans);
        by_index.clear();
        by_index.resize(pb.served.len(), SpanId::MAX);
        for (&index, &span) in indices.iter().zip(&spans) {
            by_index[index as usize] = span;
        }
        pb.spans = by_index;
        pb.dissolved = true;
        pb.live_bytes = 0;
        self.plan_reserved -= block_size;
        self.planned_live -= live_bytes;
        if let Some(&max) = spans.iter().max() {
            if self.span_gens.len() <= max as usize {
                self.span_gens.resize(max as usize + 1, 0);
            }
        }
        if let Some(r) = self.run.as_mut().filter(|r| r.id == run) {
            r.live_blocks += pieces.len();
            r.live_bytes += live_bytes;
            if r.log {
                // The plan's block is the run's allocation 0.
                r.ops.push(RunOp::Dissolve { index: 0 });
                for &(off, size, tag) in &pieces {
                    r.ops.push(RunOp::Place { base: 0, off });
                    r.ops
                        .push(RunOp::alloc(size, tag_align(plan, tag.rec), true));
                }
            }
            r.pool_allocs = next_index;
        }
        self.check();
    }

    /// The open run, served loosely inside its plan's block, can be no
    /// longer, at its next block of `len` bytes at `align`: the block is
    /// dissolved, and the rest of the run is served from the pool (the
    /// block's free memory first), each later planned block offered the
    /// place the rest of the plan, placed again, gives it
    /// ([`repair`](super::repair)); unless every block the run allocated
    /// is where a dynamic arena would have it ([`Plan::run_order_start`]),
    /// which the pool then goes on with.
    ///
    /// The run's first block off its slot, at most twice it, goes past the
    /// plan's block instead, and the rest of the run stays inside the
    /// block, where that reaches less far than the rest placed again: the
    /// live blocks keep the places the plan gave them, and a block the
    /// data grew may find room only above the highest of them, while past
    /// the block it costs its own bytes (over the random families, a run
    /// 1.12x its dynamic run so came within 3% of it).
    #[cold]
    pub(super) fn leave_block(&mut self, len: usize, align: usize) {
        let granule = self.pool.granule();
        let Some(run) = self.run.as_mut() else {
            return;
        };
        let (id, k) = (run.id, run.blocks as usize);
        let Some(serve) = run.serve.as_mut() else {
            return;
        };
        let Some(loose) = serve.loose.as_ref() else {
            return;
        };
        let (slot, plan, straight) = (serve.slot, Arc::clone(&serve.plan), serve.straight);
        let Some(size) = align_up(len, granule) else {
            return;
        };
        let placed = self
            .plan_blocks
            .get(slot as usize)
            .and_then(Option::as_ref)
            // A run whose blocks are where a dynamic arena would have them
            // is best left to the pool's best fit: it goes on as that arena
            // would.
            .filter(|pb| !pb.dissolved && !straight)
            .and_then(|pb| {
                let (fixed, items) =
                    loose.repair(&plan, &pb.served, k, size, align.max(granule))?;
                let r = Repair::new(pb.raw.rid, pb.raw.off, k, &fixed, &items);
                Some((r, pb.raw.size))
            });
        if let Some((r, block)) = &placed {
            // The block past the plan's, the rest kept inside it, reaches
            // less far than the rest placed again around what is live.
            let past = block
                .checked_next_multiple_of(align.max(granule))
                .and_then(|b| b.checked_add(size));
            // Only for a block its place takes (at most twice it): the
            // placement of a larger one is not followed.
            let placeable = plan
                .block(k)
                .is_some_and(|(b, _)| size <= b.saturating_mul(2));
            if placeable
                && past.is_some_and(|p| p < r.extent())
                && serve.loose.as_mut().is_some_and(|l| l.may_go_past())
            {
                serve.past_next = true;
                return;
            }
        }
        let Some(loose) = serve.loose.take() else {
            return;
        };
        self.dissolve(slot, &plan, Some(&loose), id);
        if let Some(serve) = self.run.as_mut().and_then(|r| r.serve.as_mut()) {
            serve.repair = placed.map(|(r, _)| Box::new(r));
        }
    }

    /// Frees planned block `index` of dissolved plan block `slot`: its span
    /// of the pool. The slot goes once its run is over and nothing of it
    /// is live.
    pub(super) fn free_dissolved(&mut self, slot: u32, index: u32) -> Result<(), FreeError> {
        let Some(pb) = self
            .plan_blocks
            .get_mut(slot as usize)
            .and_then(Option::as_mut)
        else {
            return Err(FreeError::AlreadyFree);
        };
        let span = match pb.served.get_mut(index as usize) {
            Some(0) => return Err(FreeError::AlreadyFree),
            Some(served) => {
                *served = 0;
                pb.spans[index as usize]
            }
            None => return Err(FreeError::NotABlock),
        };
        pb.live -= 1;
        if !pb.open && pb.live == 0 {
            // Nothing of it is left: the slot goes first.
            self.release_plan_block(slot);
        }
        let freed = self.free_span(span);
        debug_assert!(freed.is_ok(), "a dissolved block's span is live");
        freed
    }
}

/// The alignment planned block `index` of `plan` was served at.
fn tag_align(plan: &Plan, index: u32) -> usize {
    plan.block(index as usize).map_or(1, |(_, align)| align)
}
