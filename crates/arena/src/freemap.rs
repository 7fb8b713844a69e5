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

use std::collections::{BTreeMap, BTreeSet};

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

/// One span of a region.
#[derive(Clone, Copy, Debug)]
struct Span<T> {
    /// Bytes in the span; never zero.
    size: usize,
    /// `Some(tag)` when the span is handed out, `None` when free.
    used: Option<T>,
}

/// Key of a free span in the search index: `(is_top, size, region, offset)`.
///
/// Ordering by `is_top` first puts every top after every other free span, so a
/// forward search finds the best non-top fit before any top.
type FreeKey = (bool, usize, RegionId, usize);

/// Why a free was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FreeError {
    /// No span starts at that offset of that region.
    NotABlock,
    /// The span at that offset is already free.
    AlreadyFree,
}

/// Best-fit bookkeeping over a set of regions; `T` is the payload of used spans.
#[derive(Debug)]
pub(crate) struct FreeMap<T> {
    /// Every span of every region, keyed by `(region, offset)`; the spans of a
    /// region tile `0..region size` with no gap and no two adjacent free spans.
    spans: BTreeMap<(RegionId, usize), Span<T>>,
    /// Every free span, keyed for best-fit search.
    free: BTreeSet<FreeKey>,
    /// Size of each region by id; `0` for an id not in use.
    region_sizes: Vec<usize>,
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
            spans: BTreeMap::new(),
            free: BTreeSet::new(),
            region_sizes: Vec::new(),
            free_bytes: 0,
            total_bytes: 0,
            used_count: 0,
        }
    }

    /// Adds a wholly free region of `size` bytes and returns its id.
    pub(crate) fn add_region(&mut self, size: usize) -> RegionId {
        debug_assert!(size > 0, "a region must not be empty");
        let rid = match self.region_sizes.iter().position(|&s| s == 0) {
            Some(i) => i,
            None => {
                self.region_sizes.push(0);
                self.region_sizes.len() - 1
            }
        };
        let rid = RegionId::try_from(rid).expect("more than u32::MAX regions");
        self.region_sizes[rid as usize] = size;
        self.spans.insert((rid, 0), Span { size, used: None });
        self.free.insert((true, size, rid, 0));
        self.free_bytes += size;
        self.total_bytes += size;
        rid
    }

    /// Removes a region, which must be wholly free; returns its size.
    pub(crate) fn remove_region(&mut self, rid: RegionId) -> usize {
        let size = self.region_sizes[rid as usize];
        debug_assert!(self.is_region_free(rid), "region {rid} is not wholly free");
        self.spans.remove(&(rid, 0));
        self.free.remove(&(true, size, rid, 0));
        self.region_sizes[rid as usize] = 0;
        while self.region_sizes.last() == Some(&0) {
            self.region_sizes.pop();
        }
        self.free_bytes -= size;
        self.total_bytes -= size;
        size
    }

    /// Size of region `rid`, or 0 if there is none.
    pub(crate) fn region_size(&self, rid: RegionId) -> usize {
        self.region_sizes.get(rid as usize).copied().unwrap_or(0)
    }

    /// Ids of the live regions.
    pub(crate) fn region_ids(&self) -> impl Iterator<Item = RegionId> + '_ {
        self.region_sizes
            .iter()
            .enumerate()
            .filter(|(_, &s)| s > 0)
            .map(|(i, _)| i as RegionId)
    }

    /// Whether region `rid` holds no used span.
    pub(crate) fn is_region_free(&self, rid: RegionId) -> bool {
        let size = self.region_size(rid);
        size > 0 && self.free.contains(&(true, size, rid, 0))
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
        let top = self.free.iter().next_back().map_or(0, |k| k.1);
        let inner = self
            .free
            .range(..(true, 0, 0, 0))
            .next_back()
            .map_or(0, |k| k.1);
        top.max(inner)
    }

    /// Finds a free span for `size` bytes at alignment `align` (relative to
    /// the region start, which the owner aligns to at least `align`), marks
    /// it used with `tag`, and returns `(region, offset)`.
    ///
    /// `size` must be non-zero. Returns `None` when no span can hold it.
    pub(crate) fn alloc(&mut self, size: usize, align: usize, tag: T) -> Option<(RegionId, usize)> {
        debug_assert!(size > 0);
        let (key, start) = self.find(size, align)?;
        let (_, span_size, rid, off) = key;
        self.free.remove(&key);
        self.free_bytes -= span_size;
        let pad = start - off;
        let end = start + size;
        let span_end = off + span_size;
        if pad > 0 {
            // The leading gap stays free; it ends where the block starts, so it is not a top.
            self.spans.insert(
                (rid, off),
                Span {
                    size: pad,
                    used: None,
                },
            );
            self.free.insert((false, pad, rid, off));
            self.free_bytes += pad;
        } else {
            self.spans.remove(&(rid, off));
        }
        self.spans.insert(
            (rid, start),
            Span {
                size,
                used: Some(tag),
            },
        );
        if end < span_end {
            let rest = span_end - end;
            let is_top = span_end == self.region_sizes[rid as usize];
            self.spans.insert(
                (rid, end),
                Span {
                    size: rest,
                    used: None,
                },
            );
            self.free.insert((is_top, rest, rid, end));
            self.free_bytes += rest;
        }
        self.used_count += 1;
        Some((rid, start))
    }

    /// The best free span for the request and the aligned start inside it.
    fn find(&self, size: usize, align: usize) -> Option<(FreeKey, usize)> {
        for is_top in [false, true] {
            let lo = (is_top, size, 0, 0);
            let hi = (is_top, usize::MAX, RegionId::MAX, usize::MAX);
            for &key in self.free.range(lo..=hi) {
                let (_, span_size, _, off) = key;
                let Some(start) = align_up(off, align) else {
                    continue;
                };
                if start - off <= span_size - size {
                    return Some((key, start));
                }
            }
        }
        None
    }

    /// The payload and size of the used span at `(rid, off)`.
    pub(crate) fn get(&self, rid: RegionId, off: usize) -> Option<(usize, T)> {
        let span = self.spans.get(&(rid, off))?;
        Some((span.size, span.used?))
    }

    /// Frees the used span at `(rid, off)`, merging it with free neighbours.
    /// Returns its size and payload.
    pub(crate) fn free(&mut self, rid: RegionId, off: usize) -> Result<(usize, T), FreeError> {
        let span = *self.spans.get(&(rid, off)).ok_or(FreeError::NotABlock)?;
        let tag = span.used.ok_or(FreeError::AlreadyFree)?;
        let region_size = self.region_sizes[rid as usize];
        let mut start = off;
        let mut end = off + span.size;
        self.spans.remove(&(rid, off));

        // Merge with the previous span if it is free (spans tile the region,
        // so the previous span of the same region ends at `off`).
        if let Some((&(prid, poff), prev)) = self.spans.range(..(rid, off)).next_back() {
            if prid == rid && prev.used.is_none() {
                debug_assert_eq!(poff + prev.size, off, "spans must tile the region");
                self.free.remove(&(false, prev.size, rid, poff));
                self.free_bytes -= prev.size;
                self.spans.remove(&(rid, poff));
                start = poff;
            }
        }
        // Merge with the next span if it is free.
        if let Some(next) = self.spans.get(&(rid, end)).copied() {
            if next.used.is_none() {
                let next_is_top = end + next.size == region_size;
                self.free.remove(&(next_is_top, next.size, rid, end));
                self.free_bytes -= next.size;
                self.spans.remove(&(rid, end));
                end += next.size;
            }
        }
        let size = end - start;
        self.spans.insert((rid, start), Span { size, used: None });
        self.free.insert((end == region_size, size, rid, start));
        self.free_bytes += size;
        self.used_count -= 1;
        Ok((span.size, tag))
    }

    /// Every used span as `(region, offset, size, payload)`, in address order.
    pub(crate) fn used_spans(&self) -> impl Iterator<Item = (RegionId, usize, usize, T)> + '_ {
        self.spans
            .iter()
            .filter_map(|(&(rid, off), s)| s.used.map(|t| (rid, off, s.size, t)))
    }

    /// Walks every span and index entry and panics on any broken invariant.
    #[cfg(any(test, fuzzing, feature = "check-invariants"))]
    pub(crate) fn check_invariants(&self) {
        let mut free_bytes = 0;
        let mut used = 0;
        let mut total = 0;
        let mut free_keys = 0;
        for rid in self.region_ids() {
            let size = self.region_sizes[rid as usize];
            total += size;
            let mut expect = 0;
            let mut prev_free = false;
            for (&(r, off), span) in self.spans.range((rid, 0)..=(rid, usize::MAX)) {
                assert_eq!(r, rid);
                assert_eq!(off, expect, "region {rid}: gap or overlap at {off:#x}");
                assert!(span.size > 0, "region {rid}: empty span at {off:#x}");
                let end = off + span.size;
                assert!(
                    end <= size,
                    "region {rid}: span {off:#x}+{} past end",
                    span.size
                );
                if span.used.is_none() {
                    assert!(
                        !prev_free,
                        "region {rid}: two adjacent free spans at {off:#x}"
                    );
                    let key = (end == size, span.size, rid, off);
                    assert!(self.free.contains(&key), "free span {key:?} not indexed");
                    free_bytes += span.size;
                    free_keys += 1;
                    prev_free = true;
                } else {
                    used += 1;
                    prev_free = false;
                }
                expect = end;
            }
            assert_eq!(expect, size, "region {rid}: spans do not reach the end");
        }
        for &(_, _, rid, _) in &self.free {
            assert!(
                self.region_size(rid) > 0,
                "free key in released region {rid}"
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
    let mut map = FreeMap::<u32>::new();
    // A region larger than any run can need: the top never runs out.
    let rid = map.add_region(isize::MAX as usize);
    let mut offsets: Vec<usize> = Vec::new();
    let mut extent = 0;
    for op in ops {
        match *op {
            RunOp::Alloc { size, align, .. } => {
                let idx = offsets.len() as u32;
                let (_, off) = map
                    .alloc(size, align, idx)
                    .expect("the simulated region is larger than any run");
                extent = extent.max(off + size);
                offsets.push(off);
            }
            RunOp::Free { index } => {
                if let Some(&off) = offsets.get(index as usize) {
                    let _ = map.free(rid, off);
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

    #[test]
    fn best_fit_prefers_the_tightest_hole_and_the_top_last() {
        let mut m = FreeMap::<u8>::new();
        let r = m.add_region(1000);
        let (_, a) = m.alloc(100, 1, 0).unwrap();
        let (_, b) = m.alloc(50, 1, 0).unwrap();
        let (_, c) = m.alloc(200, 1, 0).unwrap();
        let (_, d) = m.alloc(60, 1, 0).unwrap();
        assert_eq!((a, b, c, d), (0, 100, 150, 350));
        m.free(r, a).unwrap(); // hole of 100 at 0
        m.free(r, c).unwrap(); // hole of 200 at 150
        m.check_invariants();
        // 90 fits both holes and the top: the 100-byte hole is tightest.
        assert_eq!(m.alloc(90, 1, 0), Some((r, 0)));
        // 150 only fits the 200 hole (not the top first).
        assert_eq!(m.alloc(150, 1, 0), Some((r, 150)));
        // 300 fits nothing but the top.
        assert_eq!(m.alloc(300, 1, 0), Some((r, 410)));
        m.check_invariants();
    }

    #[test]
    fn frees_coalesce_both_sides_and_restore_a_whole_region() {
        let mut m = FreeMap::<u8>::new();
        let r = m.add_region(4096);
        let offs: Vec<usize> = (0..8).map(|_| m.alloc(64, 64, 1).unwrap().1).collect();
        for &o in offs.iter().step_by(2) {
            m.free(r, o).unwrap();
        }
        m.check_invariants();
        for &o in offs.iter().skip(1).step_by(2) {
            m.free(r, o).unwrap();
        }
        m.check_invariants();
        assert!(m.is_region_free(r));
        assert_eq!(m.free_bytes(), 4096);
        assert_eq!(m.free(r, 64), Err(FreeError::NotABlock));
        assert_eq!(m.free(r, 0), Err(FreeError::AlreadyFree));
    }

    #[test]
    fn alignment_padding_stays_free() {
        let mut m = FreeMap::<u8>::new();
        let r = m.add_region(1 << 16);
        m.alloc(64, 64, 0).unwrap();
        let (_, off) = m.alloc(64, 4096, 0).unwrap();
        assert_eq!(off, 4096);
        m.check_invariants();
        // The 4032-byte gap is reused by a small request.
        assert_eq!(m.alloc(64, 64, 0), Some((r, 64)));
        m.check_invariants();
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
