//! Offset bookkeeping for a set of regions: good or best fit, splitting,
//! coalescing.
//!
//! Nothing here touches memory. A region is a range of offsets `0..size`;
//! it is tiled by spans, each free or used, in offset order. The pool (which
//! owns the real memory) and the run simulator (which computes how far one
//! run reaches into a single region) share this code, so what the simulator
//! predicts is exactly what the pool does.
//!
//! Placement is *segregated fit, wilderness last*, in one of two ways
//! ([`Fit`]). *Best fit*: a request takes the smallest of the first few
//! free spans of its size class that can hold it, or else the first span of
//! the next non-empty class (1/16 of a power of two wide, so within about
//! 6% of the best). *Good fit* (TLSF's): the request is rounded up to the
//! next class and takes the head of the first non-empty class from there,
//! which always holds it (two bit-scans, no list walked), else the head of
//! its own class if that holds it. Only when no span can does a request
//! take a region's *top* (the free span that ends at the region's end),
//! like dlmalloc's top chunk. A request that neither holds is tried
//! against every free span of its class and above before it is refused
//! (the owner would grow or fail next): not constant time, but no request
//! fails while a free span holds it.
//!
//! When a span is freed ([`Coalesce`]): by default it is merged at once
//! with its free neighbours (at most two) and filed, as TLSF does. With
//! [`Coalesce::Lazy`] an **exact-size front** sits ahead of either fit: a
//! freed span is not coalesced but kept on a stack for its exact size (a
//! small table indexed by size), and a request of that size takes the last
//! one freed, in a few instructions. Front spans are coalesced back
//! (*flushed*) at the first request the front does not serve, so every
//! other request sees the free spans as the fit would; also when a slot is
//! wanted by another size or already holds [`FRONT_DEPTH`] spans, and by
//! the pool before it inspects whole regions (a run's start, shrink,
//! relayout). The front is bounded, so the work of one request is too: a
//! free coalesces at most `FRONT_DEPTH` spans, a miss at most
//! `FRONT_SLOTS * FRONT_DEPTH` (128), whatever the heap holds. Merging at
//! once is the tighter of the two with good fit on every trace measured
//! (DenseNet-121 in graph order 1.048x its lower bound against 1.095x,
//! PP-OCR det in ONNX Runtime's order 1.013x against 1.228x); the front is
//! faster where sizes repeat.
//!
//! With these rules a run that starts on one wholly free region behaves
//! the same whatever the region's size, as long as it is large enough; that is
//! what makes the watermark of a run well defined and a repeated run free of
//! backing calls.

pub(crate) use crate::config::{Coalesce, Fit};

/// Identifies a region inside a [`FreeMap`]; ids of released regions are reused.
pub(crate) type RegionId = u32;

/// Whether `x` is a power of two: the same as `usize::is_power_of_two`,
/// for the planned path. There, LLVM shared one bit count between that
/// check and the pool's (`Pool::span_size`) and, without `popcnt` in the
/// target (the x86-64 baseline has none), expanded it in software: about
/// 20 instructions on every planned allocation (`x & (x - 1) == 0` is
/// turned into the same count). A bit scan and a shift stay a few.
#[inline(always)]
pub(crate) const fn pow2(x: usize) -> bool {
    match 1usize.checked_shl(x.trailing_zeros()) {
        Some(p) => p == x,
        None => false,
    }
}

/// `x` rounded up to a multiple of `align` (a power of two), or `None` on overflow.
#[inline]
pub(crate) fn align_up(x: usize, align: usize) -> Option<usize> {
    debug_assert!(
        align.is_power_of_two(),
        "{align:#x} should be a power of two"
    );
    Some(x.checked_add(align - 1)? & !(align - 1))
}

/// Identifies a span; ids of merged or released spans are reused.
pub(crate) type SpanId = u32;

/// "No span" in the links.
const NIL: SpanId = SpanId::MAX;

/// Largest region the map handles (128 TiB, more than any address space in
/// use).
pub(crate) const MAX_REGION: usize = 1 << 47;

/// Most regions at once.
pub(crate) const MAX_REGIONS: usize = 1 << 16;

/// Slots of the exact-size front (a power of two).
const FRONT_SLOTS: usize = 64;

/// Most spans one front slot holds: pushing onto a full slot flushes it
/// first, so a flush coalesces at most `FRONT_SLOTS * FRONT_DEPTH` spans.
const FRONT_DEPTH: u32 = 2;

/// One slot of the exact-size front: the size it holds, the last span
/// freed at that size (a stack linked through `next_free`), and how many
/// spans the stack holds.
#[derive(Clone, Copy, Debug)]
struct Slot {
    size: usize,
    head: SpanId,
    depth: u32,
}

/// The front slot of `size`.
#[inline]
fn front_slot(size: usize) -> usize {
    // Sizes are multiples of the arena's alignment: mix the bits above it.
    ((size as u64 >> 6).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - FRONT_SLOTS.trailing_zeros()))
        as usize
}

/// Size classes per power of two: a class spans at most 1/16 of its sizes.
const SUB_BITS: u32 = 4;
const SUBS: usize = 1 << SUB_BITS;
/// Size classes in all: sizes below `SUBS` get one class each, then `SUBS`
/// classes per power of two up to `MAX_REGION`.
const CLASSES: usize = 64 * SUBS;
/// How many spans of one class a search compares for the best fit.
const SCAN: usize = 8;

/// The size class of `size` (> 0): `(power, sub)`, flattened as
/// `power * SUBS + sub`. Classes are ordered as the sizes they hold.
#[inline]
fn class_of(size: usize) -> usize {
    if size < SUBS {
        return size;
    }
    let log = usize::BITS - 1 - size.leading_zeros();
    let sub = (size >> (log - SUB_BITS)) & (SUBS - 1);
    ((log - SUB_BITS + 1) as usize) * SUBS + sub
}

/// The smallest size of class `class` (the inverse of [`class_of`] on a
/// class's first size).
#[inline]
fn class_min(class: usize) -> usize {
    if class < SUBS {
        return class;
    }
    let (power, sub) = (class / SUBS, class % SUBS);
    (SUBS + sub) << (power - 1)
}

/// One span of a region: a node of the region's address-ordered list and,
/// when free and not the region's top, of its size class's free list.
#[derive(Clone, Copy, Debug)]
struct Span<T> {
    rid: RegionId,
    /// Offset in the region.
    off: usize,
    /// Bytes in the span; never zero (0 marks a vacant slot).
    size: usize,
    /// The previous and next spans of the same region, by address.
    prev: SpanId,
    next: SpanId,
    /// The previous and next free spans of the same class (free, non-top
    /// spans only).
    prev_free: SpanId,
    next_free: SpanId,
    /// `Some(tag)` when the span is handed out, `None` when free.
    used: Option<T>,
    /// Whether the free span sits in the exact-size front (then it is in no
    /// class list, is not the top, and is not merged with its neighbours).
    front: bool,
    /// The size class whose list holds the span (free, binned spans only):
    /// taking it out needs no class computed.
    class: u16,
}

/// Why [`RawArena::free`](crate::RawArena::free) refused a handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreeError {
    /// The handle names no block of this arena.
    NotABlock,
    /// The block was freed already (its memory may serve another block
    /// now: a stale handle).
    AlreadyFree,
    /// The handle comes from another arena.
    Foreign,
}

/// One region as the map sees it.
#[derive(Clone, Copy, Debug)]
struct RegionInfo {
    /// Size in bytes; `0` for an id not in use.
    size: usize,
    /// First span, by address.
    head: SpanId,
    /// The free span that reaches the region's end, if any, and its size.
    top: SpanId,
    top_size: usize,
}

/// Segregated-fit bookkeeping over a set of regions; `T` is the payload of
/// used spans.
///
/// Free spans other than tops sit in one list per size class (newest
/// first), with a two-level bitmap of the non-empty classes: finding,
/// taking and giving back a span are O(1) apart from a bounded scan for the
/// best fit among the first [`SCAN`] spans of a class. Decisions depend on
/// the free spans and the order they were freed in, never on span ids, so a
/// run that starts on one wholly free region is placed the same way every
/// time, in the pool and in the simulator alike.
#[derive(Debug)]
pub(crate) struct FreeMap<T> {
    /// Span slots; vacant slots have `size == 0` and form a stack from
    /// `vacant`, linked through their `next_free` (no side vector to grow).
    spans: Vec<Span<T>>,
    vacant: SpanId,
    /// First span of each class's free list (kept in the map itself, like
    /// the bitmaps and the front, so that no step checks for a table).
    bins: [SpanId; CLASSES],
    /// Bit `p` set when some class of power `p` is non-empty.
    power_map: u64,
    /// Bit `s` of entry `p` set when class `(p, s)` is non-empty.
    sub_maps: [u16; CLASSES / SUBS],
    regions: Vec<RegionInfo>,
    /// Sum of the sizes of free spans.
    free_bytes: usize,
    /// Sum of the sizes of live regions.
    total_bytes: usize,
    /// Number of used spans.
    used_count: usize,
    /// The exact-size front: per slot, the size it holds and the last span
    /// freed (a stack linked through `next_free`) and the stack's depth.
    front: [Slot; FRONT_SLOTS],
    /// Bit `i` set when front slot `i` holds a span.
    front_map: u64,
    /// How a request that the front does not serve picks its span.
    fit: Fit,
    /// Whether freed spans wait on the front ([`Coalesce::Lazy`]) rather
    /// than merging at once.
    lazy: bool,
}

impl<T: Copy> FreeMap<T> {
    /// An empty map with no region, best fit; allocates nothing.
    #[cfg(test)]
    pub(crate) const fn new() -> Self {
        Self::with_fit(Fit::Best)
    }

    /// An empty map with no region that places requests by `fit`, freed
    /// spans on the front ([`Coalesce::Lazy`]).
    #[cfg(test)]
    pub(crate) const fn with_fit(fit: Fit) -> Self {
        Self::with_policy(fit, Coalesce::Lazy)
    }

    /// An empty map with no region that places requests by `fit` and
    /// merges freed spans as `coalesce` says; allocates nothing (its fixed
    /// tables, about 5 KiB, are inline).
    pub(crate) const fn with_policy(fit: Fit, coalesce: Coalesce) -> Self {
        Self {
            spans: Vec::new(),
            vacant: NIL,
            bins: [NIL; CLASSES],
            power_map: 0,
            sub_maps: [0; CLASSES / SUBS],
            regions: Vec::new(),
            free_bytes: 0,
            total_bytes: 0,
            used_count: 0,
            front: [Slot {
                size: 0,
                head: NIL,
                depth: 0,
            }; FRONT_SLOTS],
            front_map: 0,
            fit,
            lazy: matches!(coalesce, Coalesce::Lazy),
        }
    }

    #[inline]
    fn new_span(&mut self, span: Span<T>) -> SpanId {
        let id = self.vacant;
        if id == NIL {
            self.spans.push(span);
            return SpanId::try_from(self.spans.len() - 1).expect("fewer than u32::MAX spans");
        }
        let slot = &mut self.spans[id as usize];
        self.vacant = slot.next_free;
        *slot = span;
        id
    }

    #[inline]
    fn drop_span(&mut self, id: SpanId) {
        let slot = &mut self.spans[id as usize];
        slot.size = 0;
        slot.used = None;
        slot.next_free = self.vacant;
        self.vacant = id;
    }

    /// Files free span `id` as its region's top, or in its class's list.
    #[inline(always)]
    fn file_free(&mut self, id: SpanId) {
        let s = &self.spans[id as usize];
        let (rid, off, size) = (s.rid, s.off, s.size);
        self.free_bytes += size;
        let r = &mut self.regions[rid as usize];
        if off + size == r.size {
            r.top = id;
            r.top_size = size;
            return;
        }
        self.file_binned(id);
    }

    /// Files free span `id`, not a top, in its class's list.
    fn file_binned(&mut self, id: SpanId) {
        let class = class_of(self.spans[id as usize].size);
        let head = self.bins[class];
        {
            let s = &mut self.spans[id as usize];
            s.prev_free = NIL;
            s.next_free = head;
            s.class = class as u16;
        }
        if head != NIL {
            self.spans[head as usize].prev_free = id;
        }
        self.bins[class] = id;
        self.sub_maps[class / SUBS] |= 1 << (class % SUBS);
        self.power_map |= 1 << (class / SUBS);
    }

    /// Takes free span `id` out of its list (or out of its region's top).
    #[inline(always)]
    fn unfile_free(&mut self, id: SpanId) {
        let (rid, size) = {
            let s = &self.spans[id as usize];
            (s.rid, s.size)
        };
        self.free_bytes -= size;
        let r = &mut self.regions[rid as usize];
        if r.top == id {
            r.top = NIL;
            r.top_size = 0;
            return;
        }
        self.unfile_binned(id);
    }

    /// Takes free span `id`, not a top, out of its class's list.
    fn unfile_binned(&mut self, id: SpanId) {
        let (class, prev, next) = {
            let s = &self.spans[id as usize];
            // A filed class is below `CLASSES` (a power of two): the
            // remainder changes nothing and spares the bounds checks below.
            (s.class as usize % CLASSES, s.prev_free, s.next_free)
        };
        if prev == NIL {
            self.bins[class] = next;
        } else {
            self.spans[prev as usize].next_free = next;
        }
        if next != NIL {
            self.spans[next as usize].prev_free = prev;
        }
        if self.bins[class] == NIL {
            self.sub_maps[class / SUBS] &= !(1 << (class % SUBS));
            if self.sub_maps[class / SUBS] == 0 {
                self.power_map &= !(1 << (class / SUBS));
            }
        }
    }

    /// Sum of the sizes of free spans.
    pub(crate) fn free_bytes(&self) -> usize {
        self.free_bytes
    }

    /// Number of used spans.
    pub(crate) fn used_count(&self) -> usize {
        self.used_count
    }

    /// Size of the largest free span (0 if none).
    pub(crate) fn largest_free(&self) -> usize {
        let tops = self.regions.iter().map(|r| r.top_size).max().unwrap_or(0);
        let inner = match self.power_map {
            0 => 0,
            map => {
                let power = 63 - map.leading_zeros() as usize;
                let sub = 15 - self.sub_maps[power].leading_zeros() as usize;
                self.free_list(power * SUBS + sub)
                    .map(|id| self.spans[id as usize].size)
                    .max()
                    .unwrap_or(0)
            }
        };
        // A front span counts as the free span it coalesces into, so the
        // figure does not change when the front is flushed.
        let mut front = 0;
        for &Slot { head, .. } in &self.front {
            let mut id = head;
            while id != NIL {
                front = front.max(self.free_run(id));
                id = self.spans[id as usize].next_free;
            }
        }
        tops.max(inner).max(front)
    }

    /// Bytes of the run of free spans (front or filed) around free span `id`.
    fn free_run(&self, id: SpanId) -> usize {
        let mut bytes = self.spans[id as usize].size;
        let mut at = self.spans[id as usize].prev;
        while at != NIL && self.spans[at as usize].used.is_none() {
            bytes += self.spans[at as usize].size;
            at = self.spans[at as usize].prev;
        }
        let mut at = self.spans[id as usize].next;
        while at != NIL && self.spans[at as usize].used.is_none() {
            bytes += self.spans[at as usize].size;
            at = self.spans[at as usize].next;
        }
        bytes
    }

    /// The spans of one class's free list, newest first.
    fn free_list(&self, class: usize) -> impl Iterator<Item = SpanId> + '_ {
        let mut id = self.bins.get(class).copied().unwrap_or(NIL);
        std::iter::from_fn(move || {
            if id == NIL {
                return None;
            }
            let this = id;
            id = self.spans[this as usize].next_free;
            Some(this)
        })
    }

    /// Unlinks span `id` from its region's list and frees its slot.
    #[inline(always)]
    fn unlink(&mut self, id: SpanId) {
        let (rid, prev, next) = {
            let s = &self.spans[id as usize];
            (s.rid, s.prev, s.next)
        };
        if prev == NIL {
            self.regions[rid as usize].head = next;
        } else {
            self.spans[prev as usize].next = next;
        }
        if next != NIL {
            self.spans[next as usize].prev = prev;
        }
        self.drop_span(id);
    }

    /// The size and payload of used span `id`.
    pub(crate) fn get(&self, id: SpanId) -> Option<(usize, T)> {
        let span = self.spans.get(id as usize)?;
        Some((span.size, span.used?))
    }

    /// The payload of used span `id`, for changing in place; `None` for a
    /// span that is not used.
    pub(crate) fn payload_mut(&mut self, id: SpanId) -> Option<&mut T> {
        self.spans.get_mut(id as usize)?.used.as_mut()
    }

    /// Region and offset of span `id` (used or free).
    pub(crate) fn position(&self, id: SpanId) -> Option<(RegionId, usize)> {
        let span = self.spans.get(id as usize).filter(|s| s.size > 0)?;
        Some((span.rid, span.off))
    }

    /// Frees used span `id`, merging it with free neighbours. Returns its
    /// size and payload.
    #[inline]
    pub(crate) fn free(&mut self, id: SpanId) -> Result<(usize, T), FreeError> {
        let span = self
            .spans
            .get_mut(id as usize)
            .filter(|s| s.size > 0)
            .ok_or(FreeError::NotABlock)?;
        let tag = span.used.take().ok_or(FreeError::AlreadyFree)?;
        let size = span.size;
        self.used_count -= 1;
        if self.lazy {
            self.push_front(id);
        } else {
            self.coalesce(id);
        }
        Ok((size, tag))
    }

    /// Files free span `id` (out of the front), merged with its free
    /// neighbours that are not in the front.
    #[inline]
    fn coalesce(&mut self, id: SpanId) {
        let (rid, off, size, prev, next) = {
            let s = &self.spans[id as usize];
            (s.rid, s.off, s.size, s.prev, s.next)
        };
        let mut merged = id;
        if next != NIL && self.regions[rid as usize].top == next {
            // The region's top grows down over this span (and a free span
            // before it): the same spans as merging them, without taking
            // the top out and filing it back.
            let top = next;
            let (mut off, mut bytes) = (off, size);
            if prev != NIL && self.is_filed_free(prev) {
                self.unfile_free(prev);
                off = self.spans[prev as usize].off;
                bytes += self.spans[prev as usize].size;
                self.unlink(prev);
            }
            self.unlink(id);
            let t = &mut self.spans[top as usize];
            t.off = off;
            t.size += bytes;
            let size = t.size;
            self.regions[rid as usize].top_size = size;
            self.free_bytes += bytes;
            return;
        }
        // Merge the next span into this one if it is free.
        if next != NIL && self.is_filed_free(next) {
            self.unfile_free(next);
            self.spans[id as usize].size += self.spans[next as usize].size;
            self.unlink(next);
        }
        // Merge this span into the previous one if that is free.
        if prev != NIL && self.is_filed_free(prev) {
            self.unfile_free(prev);
            let grown = self.spans[id as usize].size;
            self.spans[prev as usize].size += grown;
            self.unlink(id);
            merged = prev;
        }
        self.file_free(merged);
    }

    /// Whether span `id` is free and in a class list or a top (not in the
    /// front).
    #[inline]
    fn is_filed_free(&self, id: SpanId) -> bool {
        let s = &self.spans[id as usize];
        s.used.is_none() && !s.front
    }

    /// Every used span as `(region, offset, size, payload)`.
    pub(crate) fn used_spans(&self) -> impl Iterator<Item = (RegionId, usize, usize, T)> + '_ {
        self.spans
            .iter()
            .filter(|s| s.size > 0)
            .filter_map(|s| s.used.map(|t| (s.rid, s.off, s.size, t)))
    }
}

/// How far one run, replayed alone on a single wholly free region, reaches
/// into it: the run's *high-water mark*.
///
/// `ops` are the run's allocations `(size, align)` (sizes already rounded to
/// the arena's granule) and frees (by allocation index), in order. Frees of
/// blocks allocated before the run are not in `ops`, so they are ignored.
pub(crate) fn simulate_extent(ops: &[RunOp], fit: Fit, coalesce: Coalesce) -> usize {
    let mut map = FreeMap::<()>::with_policy(fit, coalesce);
    // A region larger than any run can need: the top never runs out.
    let rid = map.add_region(MAX_REGION);
    // Each allocation's span and offset, by index.
    let mut ids: Vec<(SpanId, usize)> = Vec::new();
    let mut extent = 0;
    // Where the next allocation goes, when a `Place` named it.
    let mut placed: Option<usize> = None;
    for op in ops {
        match *op {
            RunOp::Alloc {
                size, align_log2, ..
            } => {
                let at = placed
                    .take()
                    .and_then(|off| Some((off, map.take_range(rid, off, size, ())?)));
                let (off, id) = match at {
                    Some(found) => found,
                    None => {
                        let (_, off, id) = map
                            .alloc(size, 1 << align_log2, ())
                            .expect("the simulated region is larger than any run");
                        (off, id)
                    }
                };
                extent = extent.max(off + size);
                ids.push((id, off));
            }
            RunOp::Free { index } => {
                if let Some(&(id, _)) = ids.get(index as usize) {
                    let _ = map.free(id);
                }
            }
            RunOp::Dissolve { index } => {
                if let Some(&(id, _)) = ids.get(index as usize) {
                    let _ = map.free_merged(id);
                }
            }
            RunOp::Place { base, off } => {
                placed = ids.get(base as usize).map(|&(_, start)| start + off);
            }
        }
    }
    extent
}

/// One operation of a run, as the arena records it (16 bytes: the log is
/// written on every allocation and free of a dynamic run).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RunOp {
    /// An allocation of `size` bytes (rounded to the granule) at alignment
    /// `1 << align_log2`.
    Alloc {
        /// Rounded size in bytes.
        size: usize,
        /// Log2 of the alignment in bytes (a power of two).
        align_log2: u8,
        /// Whether the block enters the run's [`Recording`](crate::plan::Recording)
        /// (not the plan's own block, nor a block outside plans).
        planable: bool,
    },
    /// The free of the run's allocation number `index`.
    Free {
        /// Index of the allocation within the run.
        index: u32,
    },
    /// Allocation number `index` (a plan's block its run left) freed and
    /// merged with its free neighbours at once ([`FreeMap::free_merged`]).
    Dissolve {
        /// Index of the allocation within the run.
        index: u32,
    },
    /// The next allocation is placed at `off` bytes into where allocation
    /// number `base` started (a planned block that stays where its plan
    /// put it when the plan's block is dissolved).
    Place {
        /// Index of the allocation whose start is the base.
        base: u32,
        /// Offset from that start.
        off: usize,
    },
}

#[cfg(target_pointer_width = "64")]
const _: () = assert!(core::mem::size_of::<RunOp>() == 16);

impl RunOp {
    /// An allocation of `size` bytes at `align` (a power of two).
    #[inline]
    pub(crate) fn alloc(size: usize, align: usize, planable: bool) -> Self {
        debug_assert!(align.is_power_of_two());
        RunOp::Alloc {
            size,
            align_log2: align.trailing_zeros() as u8,
            planable,
        }
    }
}

mod check;
mod front;
mod regions;
mod search;
mod take;
#[cfg(test)]
mod tests;
