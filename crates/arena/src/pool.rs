//! Regions of real memory carved into blocks. All pointer arithmetic of the
//! crate lives here.
//!
//! The bookkeeping (which offsets are free) is [`FreeMap`]; this layer owns
//! the memory behind it: it grows by the configured policy, keeps every byte
//! it hands out initialized, and releases wholly free regions on shrink.

use crate::backing::Backing;
use crate::config::{ArenaConfig, Growth};
use crate::freemap::{align_up, FreeError, FreeMap, RegionId, SpanId, MAX_REGION, MAX_REGIONS};
use crate::ArenaError;
use allocator_api2::alloc::{Allocator, Layout};
use core::ptr::NonNull;
use std::collections::HashMap;

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

/// One region of backing memory.
#[derive(Debug)]
struct Region {
    /// Start of the region; aligned to `max_align`.
    ptr: NonNull<u8>,
    /// Its layout, as given to the backing allocator.
    layout: Layout,
    /// Bytes `0..init` have been written at least once (zeroed when first
    /// handed out), so they are initialized; always `<= layout.size()`.
    init: usize,
}

// SAFETY: a `Region` owns its memory exclusively (nothing else points into it
// except blocks, which borrow the arena), and that memory has no affinity to
// the thread that allocated it.
unsafe impl Send for Region {}

/// A block handed out by the pool.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawBlock {
    /// Start of the block; valid for `size` bytes, initialized.
    pub(crate) ptr: NonNull<u8>,
    /// Region it lies in.
    pub(crate) rid: RegionId,
    /// Offset in that region.
    pub(crate) off: usize,
    /// The span holding it.
    pub(crate) span: SpanId,
    /// Size of the span (the request rounded up to the granule).
    pub(crate) size: usize,
}

// SAFETY: a `RawBlock` is an address inside a region the pool owns; moving
// it to another thread along with its arena (it is stored in the arena's
// state) gives no access the arena's own `Send` does not.
unsafe impl Send for RawBlock {}

/// Memory regions and the blocks carved from them.
#[derive(Debug)]
pub(crate) struct Pool<A: Allocator> {
    backing: Backing<A>,
    /// Regions by id (the ids of `map`); `None` for released ids.
    regions: Vec<Option<Region>>,
    map: FreeMap<Tag>,
    /// Spans handed out through the `Allocator` trait, by address: that
    /// interface gives back a pointer, not a span id.
    by_addr: HashMap<usize, SpanId>,
    granule: usize,
    max_align: usize,
    growth: Growth,
    initial_region: usize,
    cap: usize,
    /// Sum of live block sizes (spans, not requests); always `<= reserved`.
    in_use: usize,
    /// Sum of region sizes.
    reserved: usize,
    /// Allocations served from cached memory with no backing call.
    pub(crate) cache_hits: u64,
    /// Bytes returned to the backing allocator by shrink or relayout.
    pub(crate) bytes_released: u64,
}

impl<A: Allocator> Pool<A> {
    /// An empty pool; allocates nothing.
    pub(crate) fn new(config: &ArenaConfig, alloc: A) -> Self {
        Self {
            backing: Backing::new(alloc),
            regions: Vec::new(),
            map: FreeMap::new(),
            by_addr: HashMap::new(),
            granule: config.alignment,
            max_align: config.max_align,
            growth: config.growth,
            initial_region: config.initial_region,
            cap: config.max_reserved,
            in_use: 0,
            reserved: 0,
            cache_hits: 0,
            bytes_released: 0,
        }
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
    pub(crate) fn largest_free(&self) -> usize {
        self.map.largest_free()
    }
    pub(crate) fn free_bytes(&self) -> usize {
        self.map.free_bytes()
    }
    pub(crate) fn backing_allocs(&self) -> u64 {
        self.backing.allocs
    }
    pub(crate) fn backing_frees(&self) -> u64 {
        self.backing.frees
    }
    pub(crate) fn granule(&self) -> usize {
        self.granule
    }

    /// The span size for a request of `len` bytes at `align`, after checking
    /// both. `len` must be non-zero.
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
        match align_up(len, self.granule) {
            // No region is larger than `MAX_REGION` (128 TiB, beyond any
            // address space in use; it keeps offsets in 47 bits).
            Some(size) if size <= MAX_REGION => Ok(size),
            _ => Err(ArenaError::CapacityOverflow { requested: len }),
        }
    }

    /// Hands out a block of `size` bytes (a multiple of the granule, from
    /// [`Pool::span_size`]) at `align`, growing if no cached span fits.
    pub(crate) fn alloc(
        &mut self,
        size: usize,
        align: usize,
        tag: Tag,
    ) -> Result<RawBlock, ArenaError> {
        let align = align.max(self.granule);
        let (rid, off, span) = match self.map.alloc(size, align, tag) {
            Some(found) => {
                self.cache_hits += 1;
                found
            }
            None => {
                let rid = self.grow(size, tag.len)?;
                // A fresh region is aligned to `max_align >= align` and at
                // least `size` long, so its top span fits.
                self.map
                    .alloc(size, align, tag)
                    .inspect(|found| debug_assert_eq!(found.0, rid))
                    .expect("a fresh region fits the request it was sized for")
            }
        };
        self.in_use += size;
        Ok(self.block_at(rid, off, span, size))
    }

    /// Builds the block at `(rid, off)`, first initializing any byte of it
    /// never handed out before.
    fn block_at(&mut self, rid: RegionId, off: usize, span: SpanId, size: usize) -> RawBlock {
        let region = self.regions[rid as usize]
            .as_mut()
            .expect("the map only names live regions");
        let end = off + size;
        debug_assert!(end <= region.layout.size());
        if end > region.init {
            // SAFETY: 1. `init..end` lies inside the region (`end <= size`): one allocation;
            // 2. no live block holds those bytes (spans do not overlap, and bytes past `init`
            // were never handed out), so writing them races with nothing.
            unsafe {
                region
                    .ptr
                    .add(region.init)
                    .write_bytes(0, end - region.init)
            };
            region.init = end;
        }
        // SAFETY: `off < end <= region size`, so the result is in bounds of
        // the region's allocation.
        let ptr = unsafe { region.ptr.add(off) };
        debug_assert!(
            ptr.as_ptr() as usize % self.granule == 0,
            "{ptr:p} should be aligned to {:#x}",
            self.granule
        );
        RawBlock {
            ptr,
            rid,
            off,
            span,
            size,
        }
    }

    /// Makes sure a free span of `size` bytes (a multiple of the granule)
    /// exists, adding one region if none does.
    /// With no live block, the memory is laid out again as one region of
    /// `idle_target` (at least `size`) instead; otherwise a region of exactly
    /// `size` is added.
    pub(crate) fn reserve(&mut self, size: usize, idle_target: usize) -> Result<(), ArenaError> {
        if self.map.largest_free() >= size {
            return Ok(());
        }
        if self.map.used_count() == 0 {
            self.relayout(idle_target.max(size));
            if self.map.largest_free() >= size {
                return Ok(());
            }
        }
        self.grow_by(size, size, true).map(drop)
    }

    /// Adds a region able to hold `size` bytes; returns its id.
    fn grow(&mut self, size: usize, requested: usize) -> Result<RegionId, ArenaError> {
        self.grow_by(size, requested, false)
    }

    /// [`Pool::grow`], or a region of exactly `size` bytes with `exact`.
    fn grow_by(
        &mut self,
        size: usize,
        requested: usize,
        exact_only: bool,
    ) -> Result<RegionId, ArenaError> {
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
            let layout = Layout::from_size_align(region, self.max_align)
                .map_err(|_| ArenaError::CapacityOverflow { requested })?;
            if let Some(ptr) = self.backing.allocate(layout) {
                return Ok(self.add_region(ptr, layout));
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

    fn add_region(&mut self, ptr: NonNull<u8>, layout: Layout) -> RegionId {
        let rid = self.map.add_region(layout.size());
        let slot = rid as usize;
        if self.regions.len() <= slot {
            self.regions.resize_with(slot + 1, || None);
        }
        debug_assert!(self.regions[slot].is_none());
        self.regions[slot] = Some(Region {
            ptr,
            layout,
            init: 0,
        });
        self.reserved += layout.size();
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

    /// `size` rounded up to the granule, saturating at the largest valid region.
    fn round_region(&self, size: usize) -> usize {
        align_up(size, self.granule).map_or(MAX_REGION, |s| s.min(MAX_REGION))
    }

    /// Frees live span `span`; returns its size and tag.
    pub(crate) fn free(&mut self, span: SpanId) -> Result<(usize, Tag), FreeError> {
        let (size, tag) = self.map.free(span)?;
        self.in_use -= size;
        Ok((size, tag))
    }

    /// Remembers the address of a block handed out through the `Allocator`
    /// trait, so that [`Pool::take_by_addr`] finds it.
    pub(crate) fn track_addr(&mut self, raw: &RawBlock) {
        self.by_addr.insert(raw.ptr.as_ptr() as usize, raw.span);
    }

    /// The span of a block handed out through the `Allocator` trait at
    /// `ptr`, forgetting the address.
    pub(crate) fn take_by_addr(&mut self, ptr: NonNull<u8>) -> Option<SpanId> {
        self.by_addr.remove(&(ptr.as_ptr() as usize))
    }

    /// The size and tag of live span `span`.
    pub(crate) fn get(&self, span: SpanId) -> Option<(usize, Tag)> {
        self.map.get(span)
    }

    /// Zeroes live span `span`, so that bytes a typed user may have left
    /// uninitialized (padding) never reach a later `&[u8]` view.
    pub(crate) fn zero_block(&mut self, span: SpanId) {
        let (Some((size, _)), Some((rid, off))) = (self.map.get(span), self.map.position(span))
        else {
            return;
        };
        let region = self.regions[rid as usize]
            .as_ref()
            .expect("the map only names live regions");
        // SAFETY: the span is live, `size` bytes at `off` inside this
        // region; the caller (the `Allocator::deallocate` path) owns it and
        // is giving it back, so nothing else reads or writes it.
        unsafe { region.ptr.add(off).write_bytes(0, size) };
    }

    /// Every live block as `(address, span size, tag)`.
    pub(crate) fn live(&self) -> impl Iterator<Item = (usize, usize, Tag)> + '_ {
        self.map.used_spans().map(|(rid, off, size, tag)| {
            let base = self.regions[rid as usize]
                .as_ref()
                .map_or(0, |r| r.ptr.as_ptr() as usize);
            (base + off, size, tag)
        })
    }

    /// Releases wholly free regions, largest first, until reserved bytes are
    /// at most `target`. Returns the bytes released.
    pub(crate) fn release_free_regions(&mut self, target: usize) -> usize {
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

    /// Returns one wholly free region to the backing allocator.
    fn release_region(&mut self, rid: RegionId) {
        let size = self.map.remove_region(rid);
        // Detach the region before freeing it: a panic in the backing
        // allocator then leaks it rather than freeing it twice.
        let region = self.regions[rid as usize]
            .take()
            .expect("the map only names live regions");
        self.reserved -= size;
        self.bytes_released += size as u64;
        // SAFETY: 1. `region.ptr` came from `self.backing.allocate` with `region.layout` and is
        // released once (just taken out of `self.regions`); 2. the region is wholly free, so
        // no live block points into it.
        unsafe { self.backing.deallocate(region.ptr, region.layout) };
    }

    /// With no live block, replaces every region by a single region of
    /// `target` bytes (rounded up to the granule; none if `target` is 0).
    /// Returns the bytes released (which may be less than those freed, as
    /// the new region counts against them). If the new region cannot be
    /// allocated the pool is left empty, which is still consistent.
    pub(crate) fn relayout(&mut self, target: usize) -> usize {
        self.try_relayout(target).unwrap_or(0)
    }

    /// [`Pool::relayout`], or `None` (nothing done) when a block is live or
    /// `target` is over the cap.
    pub(crate) fn try_relayout(&mut self, target: usize) -> Option<usize> {
        if self.map.used_count() != 0 {
            return None;
        }
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
        // Everything else is returned *before* the new region is drawn:
        // resizing through the backing allocator is no better, as `Global`
        // reallocates a 4096-aligned block by allocate + copy + free, which
        // holds both regions (and writes every byte) at once.
        let keep = ids
            .iter()
            .copied()
            .find(|&rid| target > 0 && self.map.region_size(rid) == target);
        for &rid in &ids {
            if Some(rid) != keep {
                self.release_region(rid);
            }
        }
        if keep.is_some() {
            return Some(before.saturating_sub(self.reserved));
        }
        if target > 0 {
            if let Ok(layout) = Layout::from_size_align(target, self.max_align) {
                if let Some(ptr) = self.backing.allocate(layout) {
                    self.add_region(ptr, layout);
                }
            }
        }
        // Bytes handed back net of the new region.
        Some(before.saturating_sub(self.reserved))
    }

    /// Size of the only region, if there is exactly one.
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
        for rid in self.map.region_ids() {
            let r = self.regions[rid as usize]
                .as_ref()
                .expect("map region without memory");
            assert_eq!(r.layout.size(), self.map.region_size(rid));
            assert!(r.init <= r.layout.size());
            assert_eq!(r.ptr.as_ptr() as usize % self.max_align, 0);
            reserved += r.layout.size();
        }
        let live_regions = self.regions.iter().filter(|r| r.is_some()).count();
        assert_eq!(live_regions, self.map.region_ids().count());
        assert_eq!(reserved, self.reserved);
        let in_use: usize = self.map.used_spans().map(|s| s.2).sum();
        assert_eq!(in_use, self.in_use);
        assert!(self.in_use <= self.reserved);
        assert!(self.reserved <= self.cap);
        assert_eq!(self.reserved - self.in_use, self.map.free_bytes());
    }
}

impl<A: Allocator> Drop for Pool<A> {
    fn drop(&mut self) {
        for slot in &mut self.regions {
            // Detach before freeing: a panicking backing allocator leaks the
            // rest rather than freeing anything twice.
            if let Some(region) = slot.take() {
                // SAFETY: 1. the region came from `self.backing.allocate` with this layout and
                // is freed once (just taken out); 2. the pool drops only with its arena, and
                // blocks borrow the arena, so none is live.
                unsafe { self.backing.deallocate(region.ptr, region.layout) };
            }
        }
    }
}
