//! Handing out spans: where a request goes (the exact-size front, a size
//! class, else a region's top) and how the span it takes is split.

use super::{Fit, FreeMap, RegionId, Span, SpanId, NIL};

impl<T: Copy> FreeMap<T> {
    /// Finds a free span for `size` bytes at alignment `align` (relative to
    /// the region start, which the owner aligns to at least `align`), marks
    /// it used with `tag`, and returns `(region, offset, span)`.
    ///
    /// `size` must be non-zero. Returns `None` when no span can hold it.
    #[inline]
    pub(crate) fn alloc(
        &mut self,
        size: usize,
        align: usize,
        tag: T,
    ) -> Option<(RegionId, usize, SpanId)> {
        debug_assert!(size > 0);
        if let Some(found) = self.take_front(size, align, tag) {
            return Some(found);
        }
        // A miss: the front is coalesced first, so that every other request
        // sees the free spans as plain best fit would.
        if self.front_map != 0 {
            self.flush_front();
        }
        // No class holds a span (the common case of a heap that merges
        // back into its top): skip the search's call.
        if self.power_map != 0 {
            let binned = if self.fit == Fit::Good {
                self.find_good(size, align)
            } else {
                self.find_binned(size, align)
            };
            if let Some((id, start)) = binned {
                return Some(self.take(id, start, size, tag));
            }
        }
        if let Some((id, start)) = self.find_top(size, align) {
            return Some(self.take_top(id, start, size, tag));
        }
        // Refused so far: the owner would now grow (a system call) or fail
        // the request. Good fit looks at two list heads and best fit at a
        // few spans per class, so a span that holds the request may be
        // further down a list; every one is tried before the request is
        // refused, so that nothing fails while a free span holds it. Not
        // constant time, but only on the way to a growth or an error.
        let (id, start) = self.find_any(size, align)?;
        Some(self.take(id, start, size, tag))
    }

    /// Hands out `size` bytes at `start` of region top `id` (found to hold
    /// them): the block is cut from the start of the top, which stays the
    /// top, smaller (the same spans as a split, without taking the top out
    /// and filing the rest back); else as [`FreeMap::take`].
    #[inline(always)]
    pub(super) fn take_top(
        &mut self,
        id: SpanId,
        start: usize,
        size: usize,
        tag: T,
    ) -> (RegionId, usize, SpanId) {
        let s = &self.spans[id as usize];
        let (span_size, rid, off, prev) = (s.size, s.rid, s.off, s.prev);
        if start == off && size < span_size {
            let block = self.new_span(Span {
                rid,
                off,
                size,
                prev,
                next: id,
                prev_free: NIL,
                next_free: NIL,
                used: Some(tag),
                front: false,
                class: 0,
            });
            let rest = span_size - size;
            let top = &mut self.spans[id as usize];
            top.prev = block;
            top.off = off + size;
            top.size = rest;
            let r = &mut self.regions[rid as usize];
            r.top_size = rest;
            if prev == NIL {
                r.head = block;
            } else {
                self.spans[prev as usize].next = block;
            }
            self.free_bytes -= size;
            self.used_count += 1;
            return (rid, start, block);
        }
        self.take(id, start, size, tag)
    }

    /// Like [`FreeMap::alloc`], but from the smallest region top that holds
    /// the request when one does (wilderness first), else as `alloc`. For a
    /// plan's block: the top is where the largest plan's block is kept
    /// committed, where a smaller free span below may have been given back.
    pub(crate) fn alloc_top_first(
        &mut self,
        size: usize,
        align: usize,
        tag: T,
    ) -> Option<(RegionId, usize, SpanId)> {
        debug_assert!(size > 0);
        if self.front_map != 0 {
            self.flush_front();
        }
        match self.find_top(size, align) {
            Some((id, start)) => Some(self.take_top(id, start, size, tag)),
            None => self.alloc(size, align, tag),
        }
    }

    /// Hands out `size` bytes at `start` of free span `id` (found to hold
    /// them), splitting off what is left before and after.
    #[inline(always)]
    pub(super) fn take(
        &mut self,
        id: SpanId,
        start: usize,
        size: usize,
        tag: T,
    ) -> (RegionId, usize, SpanId) {
        let (span_size, rid, off) = {
            let s = &self.spans[id as usize];
            (s.size, s.rid, s.off)
        };
        let pad = start - off;
        let end = start + size;
        let span_end = off + span_size;
        self.unfile_free(id);
        // The block: the found span itself, or a new span after the padding.
        let block = if pad > 0 {
            // The leading gap stays free; it ends where the block starts, so
            // it is not a top.
            self.spans[id as usize].size = pad;
            self.file_free(id);
            self.insert_after(id, start, size, Some(tag))
        } else {
            let s = &mut self.spans[id as usize];
            s.size = size;
            s.used = Some(tag);
            id
        };
        if end < span_end {
            let rest = self.insert_after(block, end, span_end - end, None);
            self.file_free(rest);
        }
        self.used_count += 1;
        (rid, start, block)
    }

    /// Links a new span at `off` right after span `after`; returns its id.
    #[inline]
    pub(super) fn insert_after(
        &mut self,
        after: SpanId,
        off: usize,
        size: usize,
        used: Option<T>,
    ) -> SpanId {
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
            prev_free: NIL,
            next_free: NIL,
            used,
            front: false,
            class: 0,
        });
        self.spans[after as usize].next = id;
        if next != NIL {
            self.spans[next as usize].prev = id;
        }
        id
    }
}

impl<T: Copy> FreeMap<T> {
    /// Frees used span `id` and merges it with its free neighbours at once,
    /// never onto the front: its bytes are open to every request that
    /// follows, best fit included (a plan's block that its run left). The
    /// front is coalesced first, so that the merge sees every free
    /// neighbour. Returns its size and payload.
    pub(crate) fn free_merged(&mut self, id: SpanId) -> Result<(usize, T), super::FreeError> {
        if self.front_map != 0 {
            self.flush_front();
        }
        let span = self
            .spans
            .get_mut(id as usize)
            .filter(|s| s.size > 0)
            .ok_or(super::FreeError::NotABlock)?;
        let tag = span.used.take().ok_or(super::FreeError::AlreadyFree)?;
        let size = span.size;
        self.used_count -= 1;
        self.coalesce(id);
        Ok((size, tag))
    }

    /// Hands out exactly `off..off + size` of region `rid` (`size > 0`), if
    /// that range lies inside one free span out of the front; `None`
    /// changes nothing. A walk of the region's spans: for the cold path
    /// that turns a plan's live blocks into blocks of the map.
    pub(crate) fn take_range(
        &mut self,
        rid: RegionId,
        off: usize,
        size: usize,
        tag: T,
    ) -> Option<SpanId> {
        let end = off.checked_add(size)?;
        let mut id = self.regions.get(rid as usize).filter(|r| r.size > 0)?.head;
        while id != NIL {
            let s = &self.spans[id as usize];
            if s.off <= off && end <= s.off + s.size {
                if s.used.is_some() || s.front || size == 0 {
                    return None;
                }
                return Some(self.take(id, off, size, tag).2);
            }
            if s.off > off {
                return None;
            }
            id = s.next;
        }
        None
    }
}
