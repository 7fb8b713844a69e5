//! Offset bookkeeping for a set of regions: best fit, splitting, coalescing.
//!
//! Nothing here touches memory. A region is a range of offsets `0..size`;
//! it is tiled by spans, each free or used, in offset order. The pool (which
//! owns the real memory) and the run simulator (which computes how far one
//! run reaches into a single region) share this code, so what the simulator
//! predicts is exactly what the pool does.
//!
//! Placement is *best fit, wilderness last*: a request takes the smallest
//! free span that can hold it, and only when none can does it take a region's
//! *top* (the free span that ends at the region's end), like dlmalloc's top
//! chunk. With this rule a run that starts on one wholly free region behaves
//! the same whatever the region's size, as long as it is large enough; that is
//! what makes the watermark of a run well defined and a repeated run free of
//! backing calls.

use std::collections::BTreeMap;

/// Identifies a region inside a [`FreeMap`]; ids of released regions are reused.
pub(crate) type RegionId = u32;

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

/// "No span" in the address links.
const NIL: SpanId = SpanId::MAX;

/// One span of a region: a node of the region's address-ordered list.
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
    /// `Some(tag)` when the span is handed out, `None` when free.
    used: Option<T>,
}

/// Largest region the map handles: offsets fit in 47 bits (128 TiB, more
/// than any address space in use), so that a whole free-span key packs
/// into one `u128`.
pub(crate) const MAX_REGION: usize = 1 << 47;

/// Most regions at once (region ids fit in 16 bits).
pub(crate) const MAX_REGIONS: usize = 1 << 16;

/// Key of a free span in the search index, packed as
/// `is_top:1 | size:63 | region:16 | offset:48` so that comparing keys is
/// one integer comparison.
///
/// Ordering by `is_top` first puts every top after every other free span, so
/// a forward search finds the best non-top fit before any top; ties between
/// equal sizes go to the lowest address, never to the span id, so placement
/// does not depend on the history of the id slots.
type FreeKey = u128;

#[inline]
fn pack(is_top: bool, size: usize, rid: RegionId, off: usize) -> FreeKey {
    debug_assert!(size < 1 << 63 && off < 1 << 48 && (rid as usize) < MAX_REGIONS);
    let hi = (u64::from(is_top) << 63) | size as u64;
    let lo = (u64::from(rid) << 48) | off as u64;
    (u128::from(hi) << 64) | u128::from(lo)
}

#[inline]
fn unpack(key: FreeKey) -> (usize, usize) {
    let hi = (key >> 64) as u64;
    let lo = key as u64;
    ((hi & !(1 << 63)) as usize, (lo & ((1 << 48) - 1)) as usize)
}

/// Why a free was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FreeError {
    /// No span has that id.
    NotABlock,
    /// The span is already free.
    AlreadyFree,
}

/// Best-fit bookkeeping over a set of regions; `T` is the payload of used spans.
#[derive(Debug)]
pub(crate) struct FreeMap<T> {
    /// Span slots; vacant slots have `size == 0` and are listed in `vacant`.
    spans: Vec<Span<T>>,
    vacant: Vec<SpanId>,
    /// Every free span, keyed for best-fit search, with its id.
    free: BTreeMap<FreeKey, SpanId>,
    /// Size and first span of each region by id; size `0` for an id not in use.
    regions: Vec<(usize, SpanId)>,
    /// Sum of the sizes of free spans.
    free_bytes: usize,
    /// Sum of the sizes of live regions.
    total_bytes: usize,
    /// Number of used spans.
    used_count: usize,
}

impl<T: Copy> FreeMap<T> {
    /// An empty map with no region.
    pub(crate) const fn new() -> Self {
        Self {
            spans: Vec::new(),
            vacant: Vec::new(),
            free: BTreeMap::new(),
            regions: Vec::new(),
            free_bytes: 0,
            total_bytes: 0,
            used_count: 0,
        }
    }

    fn new_span(&mut self, span: Span<T>) -> SpanId {
        match self.vacant.pop() {
            Some(id) => {
                self.spans[id as usize] = span;
                id
            }
            None => {
                self.spans.push(span);
                SpanId::try_from(self.spans.len() - 1).expect("fewer than u32::MAX spans")
            }
        }
    }

    fn drop_span(&mut self, id: SpanId) {
        self.spans[id as usize].size = 0;
        self.spans[id as usize].used = None;
        self.vacant.push(id);
    }

    fn key(&self, id: SpanId) -> FreeKey {
        let s = &self.spans[id as usize];
        let is_top = s.off + s.size == self.regions[s.rid as usize].0;
        pack(is_top, s.size, s.rid, s.off)
    }

    /// Adds a wholly free region of `size` bytes and returns its id.
    pub(crate) fn add_region(&mut self, size: usize) -> RegionId {
        debug_assert!(size > 0 && size <= MAX_REGION, "bad region size {size}");
        let rid = match self.regions.iter().position(|r| r.0 == 0) {
            Some(i) => i,
            None => {
                self.regions.push((0, NIL));
                self.regions.len() - 1
            }
        };
        let rid = RegionId::try_from(rid).expect("more than u32::MAX regions");
        let id = self.new_span(Span {
            rid,
            off: 0,
            size,
            prev: NIL,
            next: NIL,
            used: None,
        });
        self.regions[rid as usize] = (size, id);
        self.free.insert(pack(true, size, rid, 0), id);
        self.free_bytes += size;
        self.total_bytes += size;
        rid
    }

    /// Removes a region, which must be wholly free; returns its size.
    pub(crate) fn remove_region(&mut self, rid: RegionId) -> usize {
        debug_assert!(self.is_region_free(rid), "region {rid} is not wholly free");
        let (size, head) = self.regions[rid as usize];
        self.free.remove(&pack(true, size, rid, 0));
        self.drop_span(head);
        self.regions[rid as usize] = (0, NIL);
        while self.regions.last().is_some_and(|r| r.0 == 0) {
            self.regions.pop();
        }
        self.free_bytes -= size;
        self.total_bytes -= size;
        size
    }

    /// Size of region `rid`, or 0 if there is none.
    pub(crate) fn region_size(&self, rid: RegionId) -> usize {
        self.regions.get(rid as usize).map_or(0, |r| r.0)
    }

    /// Ids of the live regions.
    pub(crate) fn region_ids(&self) -> impl Iterator<Item = RegionId> + '_ {
        self.regions
            .iter()
            .enumerate()
            .filter(|(_, r)| r.0 > 0)
            .map(|(i, _)| i as RegionId)
    }

    /// Whether region `rid` holds no used span.
    pub(crate) fn is_region_free(&self, rid: RegionId) -> bool {
        match self.regions.get(rid as usize) {
            Some(&(size, head)) if size > 0 => {
                let s = &self.spans[head as usize];
                s.used.is_none() && s.size == size
            }
            _ => false,
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
        let top = self.free.keys().next_back().map_or(0, |&k| unpack(k).0);
        let inner = self
            .free
            .range(..pack(true, 0, 0, 0))
            .next_back()
            .map_or(0, |(&k, _)| unpack(k).0);
        top.max(inner)
    }

    /// Finds a free span for `size` bytes at alignment `align` (relative to
    /// the region start, which the owner aligns to at least `align`), marks
    /// it used with `tag`, and returns `(region, offset, span)`.
    ///
    /// `size` must be non-zero. Returns `None` when no span can hold it.
    pub(crate) fn alloc(
        &mut self,
        size: usize,
        align: usize,
        tag: T,
    ) -> Option<(RegionId, usize, SpanId)> {
        debug_assert!(size > 0);
        let (key, id, start) = self.find(size, align)?;
        let (span_size, rid, off) = {
            let s = &self.spans[id as usize];
            (s.size, s.rid, s.off)
        };
        self.free.remove(&key);
        self.free_bytes -= span_size;
        let pad = start - off;
        let end = start + size;
        let span_end = off + span_size;
        // The block: the found span itself, or a new span after the padding.
        let block = if pad > 0 {
            // The leading gap stays free; it ends where the block starts, so
            // it is not a top.
            self.spans[id as usize].size = pad;
            self.free.insert(pack(false, pad, rid, off), id);
            self.free_bytes += pad;
            self.insert_after(id, start, size, Some(tag))
        } else {
            let s = &mut self.spans[id as usize];
            s.size = size;
            s.used = Some(tag);
            id
        };
        if end < span_end {
            let rest = self.insert_after(block, end, span_end - end, None);
            let key = self.key(rest);
            self.free.insert(key, rest);
            self.free_bytes += span_end - end;
        }
        self.used_count += 1;
        Some((rid, start, block))
    }

    /// Links a new span at `off` right after span `after`; returns its id.
    fn insert_after(&mut self, after: SpanId, off: usize, size: usize, used: Option<T>) -> SpanId {
        let (rid, next) = {
            let a = &self.spans[after as usize];
            (a.rid, a.next)
        };
        let id = self.new_span(Span {
            rid,
            off,
            size,
            prev: after,
            next,
            used,
        });
        self.spans[after as usize].next = id;
        if next != NIL {
            self.spans[next as usize].prev = id;
        }
        id
    }

    /// Unlinks span `id` from its region's list and frees its slot.
    fn unlink(&mut self, id: SpanId) {
        let (prev, next) = {
            let s = &self.spans[id as usize];
            (s.prev, s.next)
        };
        if prev != NIL {
            self.spans[prev as usize].next = next;
        }
        if next != NIL {
            self.spans[next as usize].prev = prev;
        }
        self.drop_span(id);
    }

    /// The best free span for the request: its key, id and the aligned
    /// start inside it.
    fn find(&self, size: usize, align: usize) -> Option<(FreeKey, SpanId, usize)> {
        for is_top in [false, true] {
            let lo = pack(is_top, size, 0, 0);
            let hi = pack(is_top, (1 << 63) - 1, RegionId::MAX >> 16, (1 << 48) - 1);
            for (&key, &id) in self.free.range(lo..=hi) {
                let (span_size, off) = unpack(key);
                if align <= 64 && off % align == 0 {
                    return Some((key, id, off));
                }
                let Some(start) = align_up(off, align) else {
                    continue;
                };
                if start - off <= span_size - size {
                    return Some((key, id, start));
                }
            }
        }
        None
    }

    /// The size and payload of used span `id`.
    pub(crate) fn get(&self, id: SpanId) -> Option<(usize, T)> {
        let span = self.spans.get(id as usize)?;
        Some((span.size, span.used?))
    }

    /// Region and offset of span `id` (used or free).
    pub(crate) fn position(&self, id: SpanId) -> Option<(RegionId, usize)> {
        let span = self.spans.get(id as usize).filter(|s| s.size > 0)?;
        Some((span.rid, span.off))
    }

    /// Frees used span `id`, merging it with free neighbours. Returns its
    /// size and payload.
    pub(crate) fn free(&mut self, id: SpanId) -> Result<(usize, T), FreeError> {
        let span = *self
            .spans
            .get(id as usize)
            .filter(|s| s.size > 0)
            .ok_or(FreeError::NotABlock)?;
        let tag = span.used.ok_or(FreeError::AlreadyFree)?;
        self.spans[id as usize].used = None;
        self.used_count -= 1;
        let mut merged = id;
        // Merge the next span into this one if it is free.
        if span.next != NIL && self.spans[span.next as usize].used.is_none() {
            let next = span.next;
            let key = self.key(next);
            self.free.remove(&key);
            let next_size = self.spans[next as usize].size;
            self.free_bytes -= next_size;
            self.spans[id as usize].size += next_size;
            self.unlink(next);
        }
        // Merge this span into the previous one if that is free.
        if span.prev != NIL && self.spans[span.prev as usize].used.is_none() {
            let prev = span.prev;
            let key = self.key(prev);
            self.free.remove(&key);
            self.free_bytes -= self.spans[prev as usize].size;
            let grown = self.spans[id as usize].size;
            self.spans[prev as usize].size += grown;
            self.unlink(id);
            merged = prev;
        }
        let key = self.key(merged);
        self.free.insert(key, merged);
        self.free_bytes += self.spans[merged as usize].size;
        Ok((span.size, tag))
    }

    /// Every used span as `(region, offset, size, payload)`.
    pub(crate) fn used_spans(&self) -> impl Iterator<Item = (RegionId, usize, usize, T)> + '_ {
        self.spans
            .iter()
            .filter(|s| s.size > 0)
            .filter_map(|s| s.used.map(|t| (s.rid, s.off, s.size, t)))
    }

    /// Walks every span and index entry and panics on any broken invariant.
    #[cfg(any(test, fuzzing, feature = "check-invariants"))]
    pub(crate) fn check_invariants(&self) {
        let mut free_bytes = 0;
        let mut used = 0;
        let mut total = 0;
        let mut free_keys = 0;
        let mut seen = 0;
        for rid in self.region_ids() {
            let (size, head) = self.regions[rid as usize];
            total += size;
            let mut expect = 0;
            let mut prev_free = false;
            let mut prev = NIL;
            let mut id = head;
            while id != NIL {
                let span = &self.spans[id as usize];
                seen += 1;
                assert_eq!(span.rid, rid);
                assert_eq!(span.prev, prev, "region {rid}: broken back link at {id}");
                assert_eq!(
                    span.off, expect,
                    "region {rid}: gap or overlap at {:#x}",
                    span.off
                );
                assert!(span.size > 0, "region {rid}: empty span at {:#x}", span.off);
                let end = span.off + span.size;
                assert!(
                    end <= size,
                    "region {rid}: span {:#x}+{} past end",
                    span.off,
                    span.size
                );
                if span.used.is_none() {
                    assert!(
                        !prev_free,
                        "region {rid}: two adjacent free spans at {:#x}",
                        span.off
                    );
                    let key = self.key(id);
                    assert_eq!(self.free.get(&key), Some(&id), "free span {id} not indexed");
                    free_bytes += span.size;
                    free_keys += 1;
                    prev_free = true;
                } else {
                    used += 1;
                    prev_free = false;
                }
                expect = end;
                prev = id;
                id = span.next;
            }
            assert_eq!(expect, size, "region {rid}: spans do not reach the end");
        }
        assert_eq!(
            seen + self.vacant.len(),
            self.spans.len(),
            "lost span slots"
        );
        for &id in self.free.values() {
            assert!(
                self.spans[id as usize].size > 0,
                "free key of a vacant span {id}"
            );
        }
        assert_eq!(free_keys, self.free.len(), "stale keys in the free index");
        assert_eq!(free_bytes, self.free_bytes);
        assert_eq!(used, self.used_count);
        assert_eq!(total, self.total_bytes);
    }
}

/// How far one run, replayed alone on a single wholly free region, reaches
/// into it: the run's *high-water mark*.
///
/// `ops` are the run's allocations `(size, align)` (sizes already rounded to
/// the arena's granule) and frees (by allocation index), in order. Frees of
/// blocks allocated before the run are not in `ops`, so they are ignored.
pub(crate) fn simulate_extent(ops: &[RunOp]) -> usize {
    let mut map = FreeMap::<()>::new();
    // A region larger than any run can need: the top never runs out.
    map.add_region(MAX_REGION);
    let mut ids: Vec<SpanId> = Vec::new();
    let mut extent = 0;
    for op in ops {
        match *op {
            RunOp::Alloc { size, align, .. } => {
                let (_, off, id) = map
                    .alloc(size, align, ())
                    .expect("the simulated region is larger than any run");
                extent = extent.max(off + size);
                ids.push(id);
            }
            RunOp::Free { index } => {
                if let Some(&id) = ids.get(index as usize) {
                    let _ = map.free(id);
                }
            }
        }
    }
    extent
}

/// One operation of a run, as the arena records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RunOp {
    /// An allocation of `size` bytes (rounded to the granule) at `align`.
    Alloc {
        /// Rounded size in bytes.
        size: usize,
        /// Alignment in bytes.
        align: usize,
        /// Bytes the caller asked for.
        len: usize,
    },
    /// The free of the run's allocation number `index`.
    Free {
        /// Index of the allocation within the run.
        index: u32,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(region, offset)` of an allocation, dropping the span id.
    fn at(m: &mut FreeMap<u8>, size: usize, align: usize) -> Option<(RegionId, usize)> {
        m.alloc(size, align, 0).map(|(r, o, _)| (r, o))
    }

    #[test]
    fn best_fit_prefers_the_tightest_hole_and_the_top_last() {
        let mut m = FreeMap::<u8>::new();
        let r = m.add_region(1000);
        let (_, a, ia) = m.alloc(100, 1, 0).unwrap();
        let (_, b, _) = m.alloc(50, 1, 0).unwrap();
        let (_, c, ic) = m.alloc(200, 1, 0).unwrap();
        let (_, d, _) = m.alloc(60, 1, 0).unwrap();
        assert_eq!((a, b, c, d), (0, 100, 150, 350));
        m.free(ia).unwrap(); // hole of 100 at 0
        m.free(ic).unwrap(); // hole of 200 at 150
        m.check_invariants();
        // 90 fits both holes and the top: the 100-byte hole is tightest.
        assert_eq!(at(&mut m, 90, 1), Some((r, 0)));
        // 150 only fits the 200 hole (not the top first).
        assert_eq!(at(&mut m, 150, 1), Some((r, 150)));
        // 300 fits nothing but the top.
        assert_eq!(at(&mut m, 300, 1), Some((r, 410)));
        m.check_invariants();
    }

    #[test]
    fn frees_coalesce_both_sides_and_restore_a_whole_region() {
        let mut m = FreeMap::<u8>::new();
        let r = m.add_region(4096);
        let ids: Vec<SpanId> = (0..8).map(|_| m.alloc(64, 64, 1).unwrap().2).collect();
        for &id in ids.iter().step_by(2) {
            m.free(id).unwrap();
        }
        m.check_invariants();
        for &id in ids.iter().skip(1).step_by(2) {
            m.free(id).unwrap();
        }
        m.check_invariants();
        assert!(m.is_region_free(r));
        assert_eq!(m.free_bytes(), 4096);
        assert_eq!(m.free(12345), Err(FreeError::NotABlock));
        let whole = m.regions[r as usize].1;
        assert_eq!(m.free(whole), Err(FreeError::AlreadyFree));
    }

    #[test]
    fn alignment_padding_stays_free() {
        let mut m = FreeMap::<u8>::new();
        let r = m.add_region(1 << 16);
        at(&mut m, 64, 64).unwrap();
        let (_, off) = at(&mut m, 64, 4096).unwrap();
        assert_eq!(off, 4096);
        m.check_invariants();
        // The 4032-byte gap is reused by a small request.
        assert_eq!(at(&mut m, 64, 64), Some((r, 64)));
        m.check_invariants();
    }

    #[test]
    fn placement_does_not_depend_on_span_id_history() {
        // Two maps reach the same free layout through different histories;
        // the next placements must agree.
        let mut a = FreeMap::<u8>::new();
        let mut b = FreeMap::<u8>::new();
        a.add_region(1 << 20);
        b.add_region(1 << 20);
        let churn: Vec<SpanId> = (0..50)
            .map(|i| b.alloc(64 * (i + 1), 64, 0).unwrap().2)
            .collect();
        for id in churn.into_iter().rev() {
            b.free(id).unwrap();
        }
        for size in [640, 64, 128, 4096, 64, 640] {
            let pa = a.alloc(size, 64, 0).map(|x| (x.0, x.1));
            let pb = b.alloc(size, 64, 0).map(|x| (x.0, x.1));
            assert_eq!(pa, pb);
        }
    }

    #[test]
    fn simulation_matches_a_finite_region() {
        let ops = [
            RunOp::Alloc {
                size: 128,
                align: 64,
                len: 100,
            },
            RunOp::Alloc {
                size: 64,
                align: 64,
                len: 64,
            },
            RunOp::Free { index: 0 },
            RunOp::Alloc {
                size: 64,
                align: 64,
                len: 1,
            },
            RunOp::Alloc {
                size: 256,
                align: 64,
                len: 256,
            },
        ];
        assert_eq!(simulate_extent(&ops), 448);
        assert_eq!(simulate_extent(&[]), 0);
    }
}
