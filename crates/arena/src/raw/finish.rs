//! The end of a run (high-water mark, relayout, shrink policies), shrink,
//! and what the core reports (stats, live blocks, invariants).

use super::RawArena;
use crate::config::{Relayout, ShrinkPolicy};
use crate::freemap::{simulate_extent, RunOp};
use crate::memory::Memory;
use crate::plan::{Deviation, Recording};
use crate::pool::PLAN_BLOCK;
use crate::stats::{LiveBlock, RunReport, Stats};

/// Appends to `rec` the recording of a dynamic run whose operation log
/// is `ops`: its planable blocks, their frees, in order.
fn derive_recording(ops: &[RunOp], rec: &mut Recording) {
    // The recording's index of each pool allocation of the run, or `NONE`.
    const NONE: u32 = u32::MAX;
    let mut index: Vec<u32> = Vec::with_capacity(ops.len() / 2 + 1);
    for op in ops {
        match *op {
            RunOp::Alloc {
                size,
                align_log2,
                planable,
            } => index.push(if planable {
                rec.alloc(size, 1 << align_log2)
            } else {
                NONE
            }),
            RunOp::Free { index: i } => {
                if let Some(&r) = index.get(i as usize).filter(|&&r| r != NONE) {
                    rec.free(r);
                }
            }
            // A dynamic run has no plan's block to dissolve.
            RunOp::Dissolve { .. } | RunOp::Place { .. } => {}
        }
    }
}

impl<M: Memory> RawArena<M> {
    pub(super) fn watermark(&self) -> usize {
        self.recent.iter().copied().max().unwrap_or(0)
    }

    /// Closes the open run (if any) and reports it, with its recording: a
    /// dynamic run's if it was opened with `record`
    /// ([`RawArena::begin_run`]), else an empty one; a planned run's from
    /// where it left its plan (empty if it never did).
    pub fn finish_run(&mut self) -> (RunReport, Recording) {
        self.finish(true)
    }

    /// Closes the open run (if any) and reports it, without its recording:
    /// nothing is derived for a plan that no one will learn.
    pub fn finish_run_unrecorded(&mut self) -> RunReport {
        self.finish(false).0
    }

    /// Closes the open run; a dynamic run's recording is derived from its
    /// operation log only when it was asked for at both ends (or a trace is
    /// on).
    fn finish(&mut self, want_recording: bool) -> (RunReport, Recording) {
        self.check();
        // A workspace still pending outlives its run: a block of the run.
        self.settle_pending();
        // A small block still pending is one the plan does not have: the
        // plan's next step never came.
        if let Some(serve) = self.run.as_mut().and_then(|r| r.serve.as_mut()) {
            serve.tentative = None;
        }
        let Some(mut run) = self.run.take() else {
            return (RunReport::default(), Recording::new());
        };
        let dynamic = run.serve.is_none();
        let mut planned = false;
        let mut deviated = false;
        let mut deviation = None;
        let mut left_as_dynamic = false;
        if let Some(mut serve) = run.serve.take() {
            planned = true;
            if !serve.deviated && serve.pos != serve.plan.event_count() {
                // The run did less than recorded (or kept blocks past its end).
                Self::materialize(&mut serve, &mut run.rec, run.blocks);
                self.deviations += 1;
                deviated = true;
                serve.why = Some(Deviation::Short);
            }
            deviated |= serve.deviated;
            deviation = serve.why;
            if !deviated {
                // Every block in its slot: the plan's sizes are a run's.
                serve.plan.mark_sizes_seen();
            }
            left_as_dynamic = serve.deviated && serve.straight && !serve.resized && !serve.beside;
            let slot = serve.slot;
            let pb = self.plan_blocks[slot as usize]
                .as_mut()
                .expect("the serving plan's block is live");
            pb.open = false;
            // Planned blocks still live are the run's leaks too (a
            // dissolved block's are counted as the pool's).
            if !pb.dissolved {
                run.live_blocks += pb.live;
                run.live_bytes += pb.live_bytes;
            }
            if pb.live == 0 {
                let dissolved = pb.dissolved;
                self.release_plan_block(slot);
                if run.log && !dissolved {
                    run.ops.push(RunOp::Free { index: 0 });
                }
            } else if !pb.dissolved {
                // Blocks that outlive the run keep their places; the rest
                // of the plan's block is free memory from now on, not held
                // until the last of them goes.
                self.dissolve(slot, &serve.plan, serve.loose.as_deref(), run.id);
            }
        }
        let grew = self.pool.calls.reserves != run.backing_allocs_at_start;
        let high_water = match run.clean {
            Some(rid) if !grew && self.pool.single_region().map(|r| r.0) == Some(rid) => {
                run.max_end
            }
            _ if run.log => simulate_extent(&run.ops, self.config.fit, self.config.coalesce),
            // A run on memory that grows in place, which started on its one
            // wholly free region and kept no log, but whose region went
            // (given back by a shrink inside the run while nothing was live,
            // then made again): its need is estimated as its extent there
            // plus every byte it placed elsewhere, erring high (shrink
            // policies read it; keeping too much is the safe side).
            _ => (run.max_end + run.outside).max(run.peak),
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
            allocs: self.allocs - run.allocs_at_start,
            frees: self.frees - run.frees_at_start,
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
            deviation,
            left_as_dynamic,
            planned_allocs: self.planned_allocs - run.planned_allocs_at_start,
        };
        let traced = run.traced && self.trace.is_some();
        if dynamic && run.log && ((want_recording && run.recorded) || traced) {
            derive_recording(&run.ops, &mut run.rec);
        }
        run.ops.clear();
        self.spare_ops = core::mem::take(&mut run.ops);
        if let Some(trace) = self.trace.as_mut().filter(|_| traced) {
            let label = run.label.take().unwrap_or_else(|| format!("run{}", run.id));
            trace.runs.push(crate::trace::TraceRun::from_recording(
                label, &run.rec, &run.lens,
            ));
        }
        if want_recording && (run.recorded || !dynamic) {
            (report, run.rec)
        } else {
            self.recycle_recording(run.rec);
            (report, Recording::new())
        }
    }

    pub(super) fn apply_policy(&mut self, high_water: usize) -> usize {
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

    /// Gives back what planned runs whose one block is `block` bytes (the
    /// largest plan's) do not use, as far as live blocks allow: in place,
    /// every fragment between live blocks (whole free granules) too small
    /// to hold the block, and the free top beyond the block; by regions,
    /// the wholly free regions beyond what is live and the block. Returns
    /// the bytes released. (By regions it is
    /// [`shrink_to`](RawArena::shrink_to) of what is live and the block.)
    ///
    /// For an arena that will serve planned runs: shrinking to a byte
    /// target ([`RawArena::shrink_to`]) cuts the top first, keeping
    /// fragments that no plan's block fits (such as the one below a block
    /// that outlived the run it was allocated in) and leaving the block to
    /// grow the top again.
    pub fn shrink_for_plans(&mut self, block: usize) -> usize {
        let block = crate::freemap::align_up(block, self.pool.granule()).unwrap_or(usize::MAX);
        if !self.pool.in_place() {
            return self.shrink_inner(self.pool.in_use().saturating_add(block));
        }
        self.check();
        let released = self.pool.trim_for_block(block);
        self.after_shrink(released)
    }

    pub(super) fn shrink_inner(&mut self, bytes: usize) -> usize {
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
        self.after_shrink(released)
    }

    /// Counts a shrink that gave `released` bytes back; returns them.
    pub(super) fn after_shrink(&mut self, released: usize) -> usize {
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
            lazily_given_back: self.pool.memory().lazily_given_back(),
            slow_huge_commits: self.pool.memory().slow_huge_commits(),
        }
    }

    /// Gives the memory decommitted lazily back at once
    /// ([`Memory::give_back_now`]): the process's resident memory comes
    /// down by it. Returns the bytes. Nothing else changes: the bytes were
    /// out of `reserved` already.
    pub fn give_back_now(&mut self) -> usize {
        self.pool.memory_mut().give_back_now()
    }

    /// Live blocks of the caller's: pool blocks other than plan blocks, and
    /// planned blocks.
    pub(super) fn live_count(&self) -> usize {
        // A dissolved block's live blocks are spans of the pool.
        let whole = self.plan_blocks.iter().flatten().filter(|b| !b.dissolved);
        let planned: usize = whole.clone().map(|b| b.live).sum();
        self.pool.live_count() - whole.count() + planned
    }

    /// Every live block of the caller's, with the run it belongs to and (in
    /// debug builds) where it was allocated. Planned blocks are counted in
    /// [`Stats::live_blocks`] but not listed: they carry no tag.
    pub fn live_blocks(&self) -> Vec<LiveBlock> {
        // Planned blocks of dissolved plan blocks are spans of the pool
        // now, but planned all the same: not listed either.
        let planned: std::collections::HashSet<usize> = self
            .plan_blocks
            .iter()
            .flatten()
            .filter(|pb| pb.dissolved)
            .flat_map(|pb| pb.served.iter().zip(&pb.spans))
            .filter(|(&size, _)| size > 0)
            .filter_map(|(_, &span)| self.span_address(span))
            .map(|(addr, _)| M::address(addr))
            .collect();
        self.pool
            .live()
            .filter(|(_, _, tag)| tag.rec != PLAN_BLOCK)
            .filter(|(addr, _, _)| addr.is_none_or(|a| !planned.contains(&M::address(a))))
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
        let plan_blocks: usize = self
            .plan_blocks
            .iter()
            .flatten()
            .filter(|b| !b.dissolved)
            .map(|b| b.raw.size)
            .sum();
        assert_eq!(plan_blocks, self.plan_reserved);
        assert!(self.planned_live <= self.plan_reserved);
        for pb in self.plan_blocks.iter().flatten() {
            assert!(
                pb.open || pb.live > 0,
                "a finished plan block with nothing live"
            );
            assert!(pb.open || pb.dissolved, "a finished plan block still whole");
            if pb.dissolved {
                let live = pb.served.iter().filter(|&&s| s > 0).count();
                assert_eq!(live, pb.live);
                for (i, &size) in pb.served.iter().enumerate() {
                    if size > 0 {
                        let span = pb.spans[i];
                        assert_eq!(self.pool.get(span).map(|s| s.0), Some(size));
                    }
                }
            } else {
                assert!(self.pool.get(pb.raw.span).is_some());
            }
        }
        // Never two plans' blocks whole at once: only the open run's.
        assert!(
            self.plan_blocks
                .iter()
                .flatten()
                .filter(|b| !b.dissolved)
                .count()
                <= 1
        );
        assert!(self.recent.len() <= self.config.watermark_window);
    }
}
