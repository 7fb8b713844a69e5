//! Growing and shrinking in place: one reservation committed at its top,
//! decommitted down to a target, with holes of decommitted granules
//! committed again before a block covers them.

use super::{Pool, Region};
use crate::freemap::{align_up, RegionId};
use crate::memory::{Memory, MemoryError};
use crate::ArenaError;

impl<M: Memory> Pool<M> {
    /// The error for a commit the layer refused while serving `requested`
    /// bytes: what was asked, what is committed, and the layer's code.
    pub(super) fn commit_failed(&self, requested: usize, e: MemoryError) -> ArenaError {
        ArenaError::CommitFailed {
            requested,
            bytes: e.bytes,
            committed: self.reserved,
            code: e.code,
        }
    }

    /// Commits every hole of region `rid` that `off..off + size` touches
    /// (whole granules). All or nothing: when one commit is refused, the
    /// ones made before it are decommitted again, and the holes and the
    /// reserved count are as they were.
    pub(super) fn fill_holes(
        &mut self,
        rid: RegionId,
        off: usize,
        size: usize,
    ) -> Result<(), MemoryError> {
        let g = self.props.granule;
        let lo = off & !(g - 1);
        let hi = (off + size).next_multiple_of(g);
        let region = self.regions[rid as usize].as_ref().expect("live region");
        let base = region.base;
        // The parts of holes inside `lo..hi`, in address order.
        let pieces: Vec<(usize, usize)> = region
            .holes
            .iter()
            .map(|&(h, hl)| (h.max(lo), (h + hl).min(hi)))
            .filter(|&(a, b)| a < b)
            .collect();
        for (i, &(a, b)) in pieces.iter().enumerate() {
            self.calls.commits += 1;
            if let Err(e) = self.memory.commit(base, a, b - a) {
                for &(a, b) in &pieces[..i] {
                    self.calls.decommits += 1;
                    // A decommit that fails leaves the pages committed but
                    // unused; they stay holes, and are committed again
                    // (a no-op for the pages) when a block next covers them.
                    let _ = self.memory.decommit(base, a, b - a);
                }
                return Err(e);
            }
        }
        let region = self.regions[rid as usize].as_mut().expect("live region");
        for &(a, b) in &pieces {
            let i = region
                .holes
                .iter()
                .position(|&(h, hl)| h <= a && b <= h + hl)
                .expect("each piece lies in one hole");
            let (h, hl) = region.holes[i];
            // What stays a hole: the parts before `a` and after `b`.
            let mut rest = Vec::with_capacity(2);
            if a > h {
                rest.push((h, a - h));
            }
            if b < h + hl {
                rest.push((b, h + hl - b));
            }
            region.holes.splice(i..=i, rest);
            self.reserved += b - a;
        }
        Ok(())
    }

    /// Undoes a growth at the top of region `rid` back to `committed`
    /// bytes, for an allocation that failed after the growth (its span
    /// already freed): the arena is as it was before the request.
    pub(super) fn undo_growth(&mut self, rid: RegionId, committed: usize) {
        let region = self.regions[rid as usize].as_ref().expect("live region");
        let (now, base) = (region.committed, region.base);
        if now <= committed {
            return;
        }
        // The freed span sits in the front cache: file it, merged with the
        // free top, before cutting the top.
        self.map.flush_front();
        self.calls.decommits += 1;
        if self
            .memory
            .decommit(base, committed, now - committed)
            .is_err()
        {
            // The pages stay committed and counted; the arena keeps them.
            return;
        }
        let truncated = self.map.truncate_region(rid, committed);
        debug_assert!(truncated, "the grown top is free again");
        let region = self.regions[rid as usize].as_mut().expect("live region");
        region.committed = committed;
        self.reserved -= now - committed;
    }

    /// Commits granules at the top of the one reservation (making it first
    /// if there is none) so that `size` bytes at `align` fit there.
    pub(super) fn grow_in_place(
        &mut self,
        size: usize,
        align: usize,
        requested: usize,
    ) -> Result<(), ArenaError> {
        let Some(rid) = self.map.region_ids().next() else {
            return self.first_reservation(size, requested);
        };
        let region = self.regions[rid as usize].as_ref().expect("live region");
        let (committed, len, base) = (region.committed, region.len, region.base);
        let start = align_up(self.map.used_end(rid), align).unwrap_or(usize::MAX);
        let end = start.saturating_add(size);
        if end > len {
            return Err(self.no_room(size, len));
        }
        let new_committed = end.next_multiple_of(self.props.commit_step(end)).min(len);
        let extra = new_committed - committed;
        self.calls.commits += 1;
        if let Err(e) = self.memory.commit(base, committed, extra) {
            return Err(self.commit_failed(requested, e));
        }
        self.map.extend_region(rid, new_committed);
        let region = self.regions[rid as usize].as_mut().expect("live region");
        region.committed = new_committed;
        self.reserved += extra;
        Ok(())
    }

    /// Reserves the arena's range and commits what `size` bytes need.
    pub(super) fn first_reservation(
        &mut self,
        size: usize,
        requested: usize,
    ) -> Result<(), ArenaError> {
        let g = self.props.granule;
        let mut len = self.memory.reservation_size(size, self.cap);
        if size > len {
            return Err(self.no_room(size, len));
        }
        let align = self.max_align.max(g);
        // Address space may be short (many arenas, `ulimit -v`): try
        // smaller reservations down to what this request needs.
        let base = loop {
            match self.memory.reserve(len, align) {
                Ok(base) => break base,
                Err(e) if len <= size.next_multiple_of(g) => {
                    return Err(ArenaError::ReserveFailed {
                        requested,
                        reservation: len,
                        code: e.code,
                    })
                }
                Err(_) => len = (len / 2).next_multiple_of(g).max(size.next_multiple_of(g)),
            }
        };
        self.calls.reserves += 1;
        let need = size.next_multiple_of(self.props.commit_step(size)).min(len);
        self.calls.commits += 1;
        if let Err(e) = self.memory.commit(base, 0, need) {
            self.memory.release(base, len, align);
            self.calls.releases += 1;
            return Err(self.commit_failed(requested, e));
        }
        let rid = self.map.add_region(need);
        self.put_region(
            rid,
            Region {
                base,
                len,
                align,
                committed: need,
                holes: Vec::new(),
            },
        );
        self.reserved += need;
        Ok(())
    }

    /// The error for `size` bytes that do not fit a reservation of `len`:
    /// over the cap when the reservation is the cap, else the reservation
    /// used up (no cap, or one the address space left could not hold).
    pub(super) fn no_room(&self, size: usize, len: usize) -> ArenaError {
        if self.cap == usize::MAX || len < self.cap & !(self.props.granule - 1) {
            ArenaError::ReservationExhausted {
                requested: size,
                reservation: len,
            }
        } else {
            ArenaError::OverCap {
                requested: size,
                reserved: self.reserved,
                limit: self.cap,
            }
        }
    }

    /// In place: decommits every whole free granule at or above
    /// `target` rounded up to the granule. Returns the bytes decommitted.
    pub(super) fn decommit_above(&mut self, target: usize) -> usize {
        let Some(rid) = self.map.region_ids().next() else {
            return 0;
        };
        let step = |x: usize| x.checked_next_multiple_of(self.props.commit_step(x));
        // A target past what any reservation can hold keeps everything
        // (`shrink_to(usize::MAX)` releases nothing).
        let Some(keep_from) = step(target) else {
            return 0;
        };
        // Holes below count for nothing: keep `target` committed bytes, so
        // that what was given back between live blocks (by
        // `trim_for_block`) does not make this give back more than asked.
        let keep_from = {
            let holes = &self.regions[rid as usize]
                .as_ref()
                .expect("live region")
                .holes;
            let past = holes_below(holes, keep_from);
            if past == keep_from {
                keep_from
            } else {
                match step(past) {
                    Some(x) => x,
                    None => return 0,
                }
            }
        };
        let before = self.reserved;
        // 1. The top.
        let committed = self.regions[rid as usize]
            .as_ref()
            .expect("live region")
            .committed;
        // The used end lies inside the reservation, so it rounds up without
        // overflow.
        let keep = keep_from.max(step(self.map.used_end(rid)).unwrap_or(committed));
        if keep == 0 && self.map.is_region_free(rid) {
            self.release_reservation(rid);
            self.bytes_released += (before - self.reserved) as u64;
            return before - self.reserved;
        }
        if keep < committed {
            self.cut_top(rid, keep);
        }
        // 2. Whole free granules inside the committed part, above the target
        // (whole huge pages in an arena that has reached one).
        let region = self.regions[rid as usize].as_ref().expect("live region");
        let g = self.props.commit_step(region.committed);
        let spans: Vec<(usize, usize)> = self
            .map
            .free_spans(rid)
            .filter_map(|(off, size)| {
                let lo = off.next_multiple_of(g).max(keep_from);
                let hi = (off + size) & !(g - 1);
                (lo < hi).then(|| (lo, hi - lo))
            })
            .collect();
        for (lo, len) in spans {
            self.decommit_hole(rid, lo, len);
        }
        self.bytes_released += (before - self.reserved) as u64;
        before - self.reserved
    }

    /// In place, before planned runs whose one block is `block` bytes:
    /// gives back the whole free granules of every free span between live
    /// blocks that cannot hold the block (no planned run uses them), and
    /// cuts the free top to `block` bytes (to the highest live block when a
    /// span below can hold it). Returns the bytes decommitted.
    ///
    /// What stays committed is what planned runs use: the live blocks and
    /// the place the block will take (it is placed like any request: the
    /// smallest free span that holds it, the top last). A fragment left
    /// below a block that outlived its run (PyTorch's cuBLAS workspace,
    /// allocated in the first run and kept) would otherwise stay committed
    /// and unused for good, and shrinking by a byte target cuts the top
    /// first, so the block would then grow the top again.
    pub(super) fn trim_for_block_in_place(&mut self, block: usize) -> usize {
        let Some(rid) = self.map.region_ids().next() else {
            return 0;
        };
        let before = self.reserved;
        let used_end = self.map.used_end(rid);
        let spans: Vec<(usize, usize)> = self
            .map
            .free_spans(rid)
            .filter(|&(off, _)| off < used_end)
            .collect();
        let held = spans.iter().any(|&(_, size)| size >= block);
        let keep = used_end
            .checked_add(if held { 0 } else { block })
            .and_then(|end| end.checked_next_multiple_of(self.props.commit_step(end)));
        if keep == Some(0) && self.map.is_region_free(rid) {
            self.release_reservation(rid);
            self.bytes_released += (before - self.reserved) as u64;
            return before - self.reserved;
        }
        // The top first, then the fragments in whole commit steps of what
        // is left (whole huge pages only while the arena still has one).
        let committed = self.regions[rid as usize]
            .as_ref()
            .expect("live region")
            .committed;
        if let Some(keep) = keep.filter(|&k| k < committed) {
            self.cut_top(rid, keep);
        }
        let region = self.regions[rid as usize].as_ref().expect("live region");
        let g = self.props.commit_step(region.committed);
        for (off, size) in spans.into_iter().filter(|&(_, size)| size < block) {
            let lo = off.next_multiple_of(g);
            let hi = (off + size) & !(g - 1);
            if lo < hi {
                self.decommit_hole(rid, lo, hi - lo);
            }
        }
        self.bytes_released += (before - self.reserved) as u64;
        before - self.reserved
    }

    /// Cuts the committed top of region `rid` (free above `keep`, which is
    /// a commit-step boundary at or above its used end) down to `keep`:
    /// decommits what is committed of `keep..committed` (the gaps between
    /// the holes there) and truncates the region.
    fn cut_top(&mut self, rid: RegionId, keep: usize) {
        let region = self.regions[rid as usize].as_ref().expect("live region");
        let (committed, base) = (region.committed, region.base);
        let mut gaps = Vec::new();
        let mut at = keep;
        for &(h, l) in &region.holes {
            if h + l <= at {
                continue;
            }
            if h > at {
                gaps.push((at, h - at));
            }
            at = at.max(h + l);
        }
        if at < committed {
            gaps.push((at, committed - at));
        }
        let mut ok = true;
        for &(off, n) in &gaps {
            self.calls.decommits += 1;
            if self.memory.decommit(base, off, n).is_err() {
                ok = false;
                break;
            }
            // Decommitted, whether or not the top is cut below.
            let region = self.regions[rid as usize].as_mut().expect("live region");
            let i = region.holes.partition_point(|&(h, _)| h < off);
            region.holes.insert(i, (off, n));
            self.reserved -= n;
        }
        if ok {
            let truncated = self.map.truncate_region(rid, keep);
            debug_assert!(truncated, "the top above the used end is free");
            let region = self.regions[rid as usize].as_mut().expect("live region");
            region.committed = keep;
            // Holes above the new top go with it (they are decommitted
            // already: `reserved` does not change).
            region.holes.retain_mut(|(h, l)| {
                if *h + *l > keep {
                    *l = keep.saturating_sub(*h);
                }
                *l > 0
            });
        }
        self.merge_holes(rid);
    }

    /// Decommits the parts of `lo..lo + len` (whole granules of one free
    /// span) that are not holes yet, and records them as holes.
    pub(super) fn decommit_hole(&mut self, rid: RegionId, lo: usize, len: usize) {
        let region = self.regions[rid as usize].as_mut().expect("live region");
        let mut gaps: Vec<(usize, usize)> = Vec::new();
        let mut at = lo;
        for &(h, hl) in &region.holes {
            if h + hl <= at {
                continue;
            }
            if h >= lo + len {
                break;
            }
            if h > at {
                gaps.push((at, h - at));
            }
            at = at.max(h + hl);
        }
        if at < lo + len {
            gaps.push((at, lo + len - at));
        }
        for (off, n) in gaps {
            self.calls.decommits += 1;
            if self.memory.decommit(region.base, off, n).is_ok() {
                let i = region.holes.partition_point(|&(h, _)| h < off);
                region.holes.insert(i, (off, n));
                self.reserved -= n;
            }
        }
        self.merge_holes(rid);
    }

    /// Merges touching holes of region `rid`.
    pub(super) fn merge_holes(&mut self, rid: RegionId) {
        let region = self.regions[rid as usize].as_mut().expect("live region");
        region.holes.dedup_by(|next, prev| {
            if prev.0 + prev.1 == next.0 {
                prev.1 += next.1;
                true
            } else {
                false
            }
        });
    }

    /// Releases the in-place reservation, which must be wholly free.
    pub(super) fn release_reservation(&mut self, rid: RegionId) {
        self.map.remove_region(rid);
        let region = self.regions[rid as usize]
            .take()
            .expect("the map only names live regions");
        let committed = region.committed - region.holes.iter().map(|h| h.1).sum::<usize>();
        self.reserved -= committed;
        self.calls.releases += 1;
        self.memory.release(region.base, region.len, region.align);
    }
}

/// The lowest offset below which `bytes` are committed in a prefix with
/// decommitted `holes` (sorted, disjoint): `bytes` plus every hole that
/// starts below the offset reached.
fn holes_below(holes: &[(usize, usize)], bytes: usize) -> usize {
    let mut x = bytes;
    for &(h, l) in holes {
        if h >= x {
            break;
        }
        x = x.saturating_add(l);
    }
    x
}
