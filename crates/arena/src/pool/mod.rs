//! Regions of a memory layer carved into blocks: offsets only.
//!
//! The bookkeeping (which offsets are free) is [`FreeMap`]; this layer owns
//! the regions behind it and asks the [`Memory`] layer to reserve, commit,
//! decommit and release them. It never reads or writes the memory: a block
//! is a region and an offset, and its address comes from [`Memory::at`].
//!
//! Two ways to grow, chosen by the layer ([`MemoryProps::committed_on_reserve`]):
//! - **in place** ([`Pages`](crate::memory::Pages), device memory): one
//!   reservation; the free map's region is its committed prefix, and grows
//!   at its top by committing granules. Shrinking decommits the top down to
//!   the target, and whole free granules above the target inside the
//!   region (*holes*), which are committed again before a block covers
//!   them.
//! - **by regions** ([`Heap`](crate::memory::Heap)): each growth adds a
//!   region sized by the [`Growth`] policy; shrinking returns wholly free
//!   regions, and with nothing live the regions may be laid out again as one.

use crate::config::{ArenaConfig, Growth};
use crate::freemap::{align_up, FreeError, FreeMap, RegionId, SpanId, MAX_REGION, MAX_REGIONS};
use crate::memory::{Memory, MemoryProps};
use crate::ArenaError;

mod in_place;

/// The payload of a live block, kept in its span.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tag {
    /// The run the block was allocated in (0: outside any run).
    pub(crate) run: u64,
    /// Index of the allocation among the run's pool allocations.
    pub(crate) index: u32,
    /// Index among the run's planable blocks ([`NOT_PLANNED`] if none).
    pub(crate) rec: u32,
    /// Bytes the caller asked for (the span may be larger).
    pub(crate) len: usize,
    /// Where the block was allocated (debug builds only).
    #[cfg(debug_assertions)]
    pub(crate) location: &'static core::panic::Location<'static>,
}

/// [`Tag::rec`] of a block that is not part of the run's recording.
pub(crate) const NOT_PLANNED: u32 = u32::MAX;

/// [`Tag::rec`] of the block a planned run draws for its plan: not a block
/// of the caller's, so not listed or counted as one.
pub(crate) const PLAN_BLOCK: u32 = u32::MAX - 1;

/// One range from the memory layer.
#[derive(Debug)]
struct Region<P> {
    /// Start of the range; aligned to the arena's `max_align` and the
    /// layer's granule.
    base: P,
    /// Bytes of address space reserved (`base..base + len`).
    len: usize,
    /// Alignment it was reserved with.
    align: usize,
    /// Bytes `0..committed` are committed, except `holes`; always the free
    /// map's size of this region, and `<= len`.
    committed: usize,
    /// Decommitted granule-aligned ranges `(offset, len)` inside
    /// `0..committed`, sorted, disjoint, each inside one free span.
    holes: Vec<(usize, usize)>,
}

/// A block handed out by the pool.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawBlock<P> {
    /// Address of the block: `size` bytes, committed.
    pub(crate) ptr: P,
    /// Region it lies in.
    pub(crate) rid: RegionId,
    /// Offset in that region.
    pub(crate) off: usize,
    /// The span holding it.
    pub(crate) span: SpanId,
    /// Size of the span (the request rounded up to the arena's alignment).
    pub(crate) size: usize,
}

/// Calls made to the memory layer, each counted once.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Calls {
    /// Ranges reserved.
    pub(crate) reserves: u64,
    /// Ranges released.
    pub(crate) releases: u64,
    /// Commit calls.
    pub(crate) commits: u64,
    /// Decommit calls.
    pub(crate) decommits: u64,
}

/// Memory regions and the blocks carved from them.
#[derive(Debug)]
pub(crate) struct Pool<M: Memory> {
    memory: M,
    props: MemoryProps,
    /// Regions by id (the ids of `map`); `None` for released ids.
    regions: Vec<Option<Region<M::Ptr>>>,
    map: FreeMap<Tag>,
    /// The arena's alignment: every span is a multiple of it.
    align: usize,
    max_align: usize,
    growth: Growth,
    initial_region: usize,
    cap: usize,
    /// Sum of live block sizes (spans, not requests); always `<= reserved`.
    in_use: usize,
    /// Committed bytes: the regions' committed prefixes less their holes.
    reserved: usize,
    pub(crate) calls: Calls,
    /// Allocations served from cached memory with no memory-layer call.
    pub(crate) cache_hits: u64,
    /// Bytes given back to the memory layer (decommitted or released).
    pub(crate) bytes_released: u64,
}

impl<M: Memory> Pool<M> {
    /// An empty pool; reserves nothing.
    pub(crate) fn new(config: &ArenaConfig, memory: M) -> Self {
        let props = memory.props();
        Self {
            memory,
            props,
            regions: Vec::new(),
            map: FreeMap::with_policy(config.fit, config.coalesce),
            align: config.alignment,
            max_align: config.max_align,
            growth: config.growth,
            initial_region: config.initial_region,
            cap: config.max_reserved,
            in_use: 0,
            reserved: 0,
            calls: Calls::default(),
            cache_hits: 0,
            bytes_released: 0,
        }
    }

    pub(crate) fn memory(&self) -> &M {
        &self.memory
    }
    pub(crate) fn memory_mut(&mut self) -> &mut M {
        &mut self.memory
    }
    pub(crate) fn in_use(&self) -> usize {
        self.in_use
    }
    pub(crate) fn reserved(&self) -> usize {
        self.reserved
    }
    pub(crate) fn region_count(&self) -> usize {
        self.map.region_ids().count()
    }
    pub(crate) fn live_count(&self) -> usize {
        self.map.used_count()
    }
    /// Whether a block allocated in a run (not outside any) is live: a
    /// walk over the spans.
    pub(crate) fn blocks_of_runs_live(&self) -> bool {
        self.map.used_spans().any(|(_, _, _, tag)| tag.run != 0)
    }
    pub(crate) fn largest_free(&self) -> usize {
        self.map.largest_free()
    }
    /// Committed free bytes: the map's free spans less the decommitted
    /// holes inside them (which are not reserved), so `reserved - in_use`.
    pub(crate) fn free_bytes(&self) -> usize {
        let holes: usize = self
            .regions
            .iter()
            .flatten()
            .flat_map(|r| &r.holes)
            .map(|h| h.1)
            .sum();
        self.map.free_bytes().saturating_sub(holes)
    }
    pub(crate) fn granule(&self) -> usize {
        self.align
    }
    /// The memory layer's commit step for an arena of `bytes`.
    pub(crate) fn commit_step(&self, bytes: usize) -> usize {
        self.props.commit_step(bytes)
    }
    /// Whether the pool grows in place (one reservation, commit at its top).
    pub(crate) fn in_place(&self) -> bool {
        !self.props.committed_on_reserve
    }

    /// The span size for a request of `len` bytes at `align`, after checking
    /// both. `len` must be non-zero.
    #[inline]
    pub(crate) fn span_size(&self, len: usize, align: usize) -> Result<usize, ArenaError> {
        if !align.is_power_of_two() {
            return Err(ArenaError::InvalidAlignment { align });
        }
        if align > self.max_align {
            return Err(ArenaError::AlignmentTooLarge {
                align,
                max: self.max_align,
            });
        }
        match align_up(len, self.align) {
            // No region is larger than `MAX_REGION` (128 TiB, beyond any
            // address space in use; it keeps offsets in 47 bits).
            Some(size) if size <= MAX_REGION => Ok(size),
            _ => Err(ArenaError::CapacityOverflow { requested: len }),
        }
    }

    /// Hands out a block of `size` bytes (a multiple of the alignment, from
    /// [`Pool::span_size`]) at `align`, growing if no cached span fits.
    #[inline]
    pub(crate) fn alloc(
        &mut self,
        size: usize,
        align: usize,
        tag: Tag,
    ) -> Result<RawBlock<M::Ptr>, ArenaError> {
        let align = align.max(self.align);
        let Some((rid, off, span)) = self.map.alloc(size, align, tag) else {
            return self.alloc_grown(size, align, tag);
        };
        let region = self.regions[rid as usize]
            .as_ref()
            .expect("the map only names live regions");
        self.cache_hits += 1;
        if !region.holes.is_empty() {
            return self.cover_holes(rid, off, span, size, tag, None);
        }
        self.in_use += size;
        Ok(RawBlock {
            ptr: M::at(region.base, off),
            rid,
            off,
            span,
            size,
        })
    }

    /// [`Pool::alloc`] for a plan's block. In place, once memory between
    /// live blocks has been given back (holes), the block is taken from the
    /// committed top when that holds it: the top is what
    /// [`Pool::trim_for_block`] keeps for the largest plan, and best fit
    /// would rather commit a smaller free span below again, so that both
    /// stay committed.
    pub(crate) fn alloc_plan_block(
        &mut self,
        size: usize,
        align: usize,
        tag: Tag,
    ) -> Result<RawBlock<M::Ptr>, ArenaError> {
        if !self.in_place() {
            self.make_room_for_plan_block(size);
            return self.alloc(size, align, tag);
        }
        let holes = self.regions.iter().flatten().any(|r| !r.holes.is_empty());
        if !holes {
            return self.alloc(size, align, tag);
        }
        let align = align.max(self.align);
        let Some((rid, off, span)) = self.map.alloc_top_first(size, align, tag) else {
            return self.alloc_grown(size, align, tag);
        };
        self.cache_hits += 1;
        self.cover_holes(rid, off, span, size, tag, None)
    }

    /// By regions, before a plan's block of `size` bytes that no free span
    /// holds, with no block live: the block is one span, so regions too
    /// small for it would stay beside the region grown for it (a growing
    /// decoder's plans held twice what its dynamic runs did). The memory
    /// is laid out again first, as one region of the block and a quarter:
    /// room past it for a run that leaves its plan (docs/decisions.md:
    /// the power of two, the block alone, an eighth). A failure leaves the
    /// pool empty, and the block's allocation then grows as usual or
    /// reports the error. (With blocks of earlier runs live, the run does
    /// not draw its plan's block: `RawArena::begin_run`.)
    fn make_room_for_plan_block(&mut self, size: usize) {
        self.map.flush_front();
        if self.map.largest_free() < size && self.map.used_count() == 0 {
            let grown = self.round_region(size.saturating_add(size / 4));
            self.relayout(grown);
        }
    }

    /// Takes the `size` bytes at offset `off` of region `rid` (a place the
    /// caller chose: a repaired run's, [`crate::raw`]), when they are free
    /// and committed there. `None` when the range is not free, not
    /// `align`ed, past the committed top or over memory given back: nothing
    /// changed then, and the caller places the block as usual. A chosen
    /// place never commits memory (nor asks a budget for it) that the
    /// usual placement would not.
    pub(crate) fn alloc_range(
        &mut self,
        rid: RegionId,
        off: usize,
        size: usize,
        align: usize,
        tag: Tag,
    ) -> Option<RawBlock<M::Ptr>> {
        let region = self.regions.get(rid as usize)?.as_ref()?;
        let end = off.checked_add(size)?;
        if end > region.committed
            || M::address(M::at(region.base, off)) % align.max(self.align) != 0
            || region.holes.iter().any(|&(h, hl)| h < end && off < h + hl)
        {
            return None;
        }
        let base = region.base;
        self.map.flush_front();
        let span = self.map.take_range(rid, off, size, tag)?;
        self.cache_hits += 1;
        self.in_use += size;
        Some(RawBlock {
            ptr: M::at(base, off),
            rid,
            off,
            span,
            size,
        })
    }

    /// [`Pool::alloc`] when no cached span fits: grows, then places.
    #[cold]
    #[inline(never)]
    fn alloc_grown(
        &mut self,
        size: usize,
        align: usize,
        tag: Tag,
    ) -> Result<RawBlock<M::Ptr>, ArenaError> {
        // In place, the committed top before a growth: a refusal after it
        // (a hole under the new block) gives the growth back too.
        let grown_from = if self.in_place() {
            self.map.region_ids().next().map(|rid| {
                let r = self.regions[rid as usize].as_ref().expect("live region");
                (rid, r.committed)
            })
        } else {
            None
        };
        self.grow(size, align, tag.len)?;
        let (rid, off, span) = self
            .map
            .alloc(size, align, tag)
            .expect("the pool grew to fit the request");
        self.cover_holes(rid, off, span, size, tag, grown_from)
    }

    /// Turns live block `span` into the live blocks `pieces` inside it
    /// (`(offset in the block, size, tag)`, sorted by offset, disjoint,
    /// each a multiple of the arena's alignment and inside the block), and
    /// the rest of it into free memory merged with its free neighbours.
    /// Pushes each piece's span to `out`, in order. No memory-layer call:
    /// the block was committed, and so are its parts.
    pub(crate) fn dissolve(
        &mut self,
        span: SpanId,
        pieces: &[(usize, usize, Tag)],
        out: &mut Vec<SpanId>,
    ) -> Result<(), FreeError> {
        let (rid, base) = self.map.position(span).ok_or(FreeError::NotABlock)?;
        let (size, _) = self.map.get(span).ok_or(FreeError::AlreadyFree)?;
        // Checked before anything changes: every piece lies inside.
        let mut end = 0;
        for &(off, len, _) in pieces {
            if off < end || len == 0 || off.checked_add(len).is_none_or(|e| e > size) {
                return Err(FreeError::NotABlock);
            }
            end = off + len;
        }
        self.map.free_merged(span)?;
        self.in_use -= size;
        for &(off, len, tag) in pieces {
            let id = self
                .map
                .take_range(rid, base + off, len, tag)
                .expect("a piece of a block just freed is free");
            self.in_use += len;
            out.push(id);
        }
        Ok(())
    }

    /// Ends [`Pool::alloc`] for the block in `span` at `off` of region
    /// `rid`: commits the holes under it first, if any. On a refusal the
    /// block is freed again and a growth from `grown_from` is undone.
    fn cover_holes(
        &mut self,
        rid: RegionId,
        off: usize,
        span: SpanId,
        size: usize,
        tag: Tag,
        grown_from: Option<(RegionId, usize)>,
    ) -> Result<RawBlock<M::Ptr>, ArenaError> {
        if self.regions[rid as usize]
            .as_ref()
            .is_some_and(|r| !r.holes.is_empty())
        {
            if let Err(e) = self.fill_holes(rid, off, size) {
                let freed = self.map.free(span);
                debug_assert!(freed.is_ok());
                if let Some((grown, committed)) = grown_from {
                    self.undo_growth(grown, committed);
                }
                return Err(self.commit_failed(tag.len, e));
            }
        }
        self.in_use += size;
        let base = self.regions[rid as usize]
            .as_ref()
            .expect("the map only names live regions")
            .base;
        Ok(RawBlock {
            ptr: M::at(base, off),
            rid,
            off,
            span,
            size,
        })
    }

    /// The address of `off` in region `rid`.
    pub(crate) fn address(&self, rid: RegionId, off: usize) -> Option<M::Ptr> {
        let r = self.regions.get(rid as usize)?.as_ref()?;
        Some(M::at(r.base, off))
    }

    /// Makes room for `size` bytes at `align`: commits at the top of the
    /// reservation (in place), or adds a region.
    fn grow(&mut self, size: usize, align: usize, requested: usize) -> Result<(), ArenaError> {
        if self.in_place() {
            self.grow_in_place(size, align, requested)
        } else {
            self.grow_by(size, requested, false).map(drop)
        }
    }

    fn put_region(&mut self, rid: RegionId, region: Region<M::Ptr>) {
        let slot = rid as usize;
        if self.regions.len() <= slot {
            self.regions.resize_with(slot + 1, || None);
        }
        debug_assert!(self.regions[slot].is_none());
        self.regions[slot] = Some(region);
    }

    /// Makes sure a free span of `size` bytes (a multiple of the alignment)
    /// exists. In place: commits at the top. By regions: with no live
    /// block, the memory is laid out again as one region of `idle_target`
    /// (at least `size`); otherwise a region of exactly `size` is added.
    pub(crate) fn reserve(&mut self, size: usize, idle_target: usize) -> Result<(), ArenaError> {
        self.map.flush_front();
        if self.map.largest_free() >= size {
            return Ok(());
        }
        if self.in_place() {
            return self.grow_in_place(size, self.align, size);
        }
        if self.map.used_count() == 0 {
            self.relayout(idle_target.max(size));
            if self.map.largest_free() >= size {
                return Ok(());
            }
        }
        self.grow_by(size, size, true).map(drop)
    }

    /// Adds a region able to hold `size` bytes (exactly `size` with
    /// `exact_only`, else as the growth policy says); returns its id.
    fn grow_by(
        &mut self,
        size: usize,
        requested: usize,
        exact_only: bool,
    ) -> Result<RegionId, ArenaError> {
        self.map.flush_front();
        let exact = self.round_region(size);
        let mut want = if exact_only {
            exact
        } else {
            self.region_size_for(size).max(exact)
        };
        if want > self.cap.saturating_sub(self.reserved) {
            want = exact;
        }
        if exact > self.cap.saturating_sub(self.reserved) {
            // Wholly free regions that could not serve the request only take
            // room under the cap: give them back if that makes room, and
            // otherwise change nothing.
            let idle: usize = self
                .map
                .region_ids()
                .filter(|&rid| self.map.is_region_free(rid))
                .map(|rid| self.map.region_size(rid))
                .sum();
            if exact > self.cap.saturating_sub(self.reserved - idle) {
                return Err(ArenaError::OverCap {
                    requested: size,
                    reserved: self.reserved,
                    limit: self.cap,
                });
            }
            self.release_free_regions(0);
            want = exact;
        }
        if self.map.region_ids().count() >= MAX_REGIONS - 1 {
            return Err(ArenaError::BackingFailed {
                requested,
                region: exact,
            });
        }
        for region in [want, exact] {
            if let Ok(base) = self.memory.reserve(region, self.max_align) {
                self.calls.reserves += 1;
                return Ok(self.add_region(base, region));
            }
            if region == exact {
                break;
            }
        }
        Err(ArenaError::BackingFailed {
            requested,
            region: exact,
        })
    }

    fn add_region(&mut self, base: M::Ptr, len: usize) -> RegionId {
        let rid = self.map.add_region(len);
        self.put_region(
            rid,
            Region {
                base,
                len,
                align: self.max_align,
                committed: len,
                holes: Vec::new(),
            },
        );
        self.reserved += len;
        rid
    }

    /// Region size the growth policy picks for a request of `size` bytes.
    fn region_size_for(&self, size: usize) -> usize {
        let first = if self.reserved == 0 {
            self.initial_region
        } else {
            0
        };
        let picked = match self.growth {
            Growth::Exact => size,
            Growth::PowerOfTwo { max_extend } => {
                let pow2 = |x: usize| x.checked_next_power_of_two().unwrap_or(x);
                let doubled = pow2(size).max(pow2(self.reserved));
                doubled.min(size.saturating_add(max_extend)).max(size)
            }
        };
        self.round_region(picked.max(first))
    }

    /// `size` rounded up to the alignment, saturating at the largest region.
    fn round_region(&self, size: usize) -> usize {
        align_up(size, self.align).map_or(MAX_REGION, |s| s.min(MAX_REGION))
    }

    /// Frees live span `span`; returns its size and tag.
    #[inline]
    pub(crate) fn free(&mut self, span: SpanId) -> Result<(usize, Tag), FreeError> {
        let (size, tag) = self.map.free(span)?;
        self.in_use -= size;
        Ok((size, tag))
    }

    /// The size and tag of live span `span`.
    pub(crate) fn get(&self, span: SpanId) -> Option<(usize, Tag)> {
        self.map.get(span)
    }

    /// Makes live span `span` block `rec` of its run's recording.
    pub(crate) fn retag(&mut self, span: SpanId, rec: u32) {
        if let Some(tag) = self.map.payload_mut(span) {
            tag.rec = rec;
        }
    }

    /// Region and offset of live span `span`.
    pub(crate) fn position(&self, span: SpanId) -> Option<(RegionId, usize)> {
        self.map.position(span)
    }

    /// Every live block as `(address, span size, tag)`.
    pub(crate) fn live(&self) -> impl Iterator<Item = (Option<M::Ptr>, usize, Tag)> + '_ {
        self.map
            .used_spans()
            .map(|(rid, off, size, tag)| (self.address(rid, off), size, tag))
    }

    /// Gives committed memory back until at most `target` bytes stay
    /// committed, as far as live blocks allow. In place: decommits above
    /// the target (the top, and whole free granules between live blocks).
    /// By regions: releases wholly free regions, largest first. Returns the
    /// bytes given back.
    pub(crate) fn trim(&mut self, target: usize) -> usize {
        self.map.flush_front();
        if self.in_place() {
            self.decommit_above(target)
        } else {
            self.release_free_regions(target)
        }
    }

    /// In place: gives back what planned runs whose one block is `block`
    /// bytes do not use: every fragment (whole free granules between live
    /// blocks) that cannot hold the block, and the top beyond the block
    /// (beyond the used end when a fragment holds it). Returns the bytes
    /// given back.
    pub(crate) fn trim_for_block(&mut self, block: usize) -> usize {
        debug_assert!(self.in_place());
        self.map.flush_front();
        self.trim_for_block_in_place(block)
    }

    /// Releases wholly free regions, largest first, until reserved bytes are
    /// at most `target`. Returns the bytes released.
    pub(crate) fn release_free_regions(&mut self, target: usize) -> usize {
        self.map.flush_front();
        let mut free: Vec<(usize, RegionId)> = self
            .map
            .region_ids()
            .filter(|&rid| self.map.is_region_free(rid))
            .map(|rid| (self.map.region_size(rid), rid))
            .collect();
        free.sort_unstable_by(|a, b| b.cmp(a));
        let mut released = 0;
        for (size, rid) in free {
            if self.reserved <= target {
                break;
            }
            self.release_region(rid);
            released += size;
        }
        released
    }

    /// Returns one wholly free region (by regions) to the memory layer.
    fn release_region(&mut self, rid: RegionId) {
        let size = self.map.remove_region(rid);
        // Detach the region before releasing it: a panic in the layer then
        // leaks it rather than releasing it twice.
        let region = self.regions[rid as usize]
            .take()
            .expect("the map only names live regions");
        self.reserved -= size;
        self.bytes_released += size as u64;
        self.calls.releases += 1;
        self.memory.release(region.base, region.len, region.align);
    }

    /// By regions, with no live block: replaces every region by a single
    /// region of `target` bytes (rounded up to the alignment; none if
    /// `target` is 0). Returns the bytes released (net of the new region).
    /// If the new region cannot be had the pool is left empty, which is
    /// still consistent.
    pub(crate) fn relayout(&mut self, target: usize) -> usize {
        self.try_relayout(target).unwrap_or(0)
    }

    /// [`Pool::relayout`], or `None` (nothing done) when the pool grows in
    /// place, a block is live, or `target` is over the cap.
    pub(crate) fn try_relayout(&mut self, target: usize) -> Option<usize> {
        if self.in_place() || self.map.used_count() != 0 {
            return None;
        }
        self.map.flush_front();
        let target = if target == 0 {
            0
        } else {
            self.round_region(target)
        };
        let before = self.reserved;
        if target > self.cap {
            return None;
        }
        let ids: Vec<RegionId> = self.map.region_ids().collect();
        // A region of exactly the target stays (its pages stay resident).
        // Everything else is returned *before* the new region is drawn, so
        // the two are never held at once.
        let keep = ids
            .iter()
            .copied()
            .find(|&rid| target > 0 && self.map.region_size(rid) == target);
        for &rid in &ids {
            if Some(rid) != keep {
                self.release_region(rid);
            }
        }
        if keep.is_none() && target > 0 {
            if let Ok(base) = self.memory.reserve(target, self.max_align) {
                self.calls.reserves += 1;
                self.add_region(base, target);
            }
        }
        Some(before.saturating_sub(self.reserved))
    }

    /// Coalesces the free map's exact-size front, so that whole regions
    /// show as free.
    pub(crate) fn flush_front(&mut self) {
        self.map.flush_front();
    }

    /// The only region and its size, if there is exactly one.
    pub(crate) fn single_region(&self) -> Option<(RegionId, usize)> {
        let mut ids = self.map.region_ids();
        let rid = ids.next()?;
        ids.next()
            .is_none()
            .then(|| (rid, self.map.region_size(rid)))
    }

    #[cfg(any(test, fuzzing, feature = "check-invariants"))]
    pub(crate) fn check_invariants(&self) {
        self.map.check_invariants();
        let mut reserved = 0;
        let g = self.props.granule;
        for rid in self.map.region_ids() {
            let r = self.regions[rid as usize]
                .as_ref()
                .expect("map region without memory");
            assert_eq!(r.committed, self.map.region_size(rid));
            assert!(r.committed <= r.len);
            // Whether `h..h + l` lies in one run of adjacent free spans
            // (front spans are not merged with their neighbours). No heap
            // allocation: some tests count them, with this check on.
            let in_free_memory = |h: usize, l: usize| {
                let mut run = (0, 0);
                for (o, n) in self.map.free_spans(rid) {
                    run = if run.1 == o && run.1 > run.0 {
                        (run.0, o + n)
                    } else {
                        (o, o + n)
                    };
                    if run.0 <= h && h + l <= run.1 {
                        return true;
                    }
                }
                false
            };
            let mut prev_end = 0;
            for &(h, l) in &r.holes {
                assert!(l > 0 && h % g == 0 && l % g == 0, "hole {h:#x}+{l:#x}");
                assert!(h >= prev_end && h + l <= r.committed, "hole {h:#x}+{l:#x}");
                prev_end = h + l;
                // A hole lies inside free memory only.
                assert!(
                    in_free_memory(h, l),
                    "hole {h:#x}+{l:#x} under a live block"
                );
            }
            reserved += r.committed - r.holes.iter().map(|h| h.1).sum::<usize>();
        }
        let live_regions = self.regions.iter().filter(|r| r.is_some()).count();
        assert_eq!(live_regions, self.map.region_ids().count());
        assert_eq!(reserved, self.reserved);
        let in_use: usize = self.map.used_spans().map(|s| s.2).sum();
        assert_eq!(in_use, self.in_use);
        assert!(self.in_use <= self.reserved);
        assert!(self.reserved <= self.cap);
        if self.in_place() {
            assert!(self.regions.iter().flatten().count() <= 1);
        }
    }
}

impl<M: Memory> Drop for Pool<M> {
    fn drop(&mut self) {
        for slot in &mut self.regions {
            // Detach before releasing: a panicking layer leaks the rest
            // rather than releasing anything twice.
            if let Some(region) = slot.take() {
                self.calls.releases += 1;
                self.memory.release(region.base, region.len, region.align);
            }
        }
    }
}
