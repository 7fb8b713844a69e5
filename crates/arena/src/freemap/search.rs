//! The placement search: which free span a request takes (best fit or
//! good fit among the size classes, else the smallest region top), found
//! through the two-level bitmap of non-empty classes.

use super::{align_up, class_min, class_of, FreeMap, SpanId, CLASSES, NIL, SCAN, SUBS};
use crate::config::Fit;

impl<T: Copy> FreeMap<T> {
    /// Where `size` bytes at `align` fit in span `id`: the aligned start.
    #[inline]
    pub(super) fn fit(&self, id: SpanId, size: usize, align: usize) -> Option<usize> {
        let s = &self.spans[id as usize];
        let start = align_up(s.off, align)?;
        (s.size >= size && start - s.off <= s.size - size).then_some(start)
    }

    /// The best of the first [`SCAN`] spans of `class` for the request.
    pub(super) fn best_in(
        &self,
        class: usize,
        size: usize,
        align: usize,
    ) -> Option<(SpanId, usize)> {
        let mut best: Option<(SpanId, usize)> = None;
        for id in self.free_list(class).take(SCAN) {
            if let Some(start) = self.fit(id, size, align) {
                let smaller = best.is_none_or(|(b, _)| {
                    self.spans[id as usize].size < self.spans[b as usize].size
                });
                if smaller {
                    best = Some((id, start));
                    if self.spans[id as usize].size == size {
                        break;
                    }
                }
            }
        }
        best
    }

    /// The span for a request and the aligned start inside it: the best fit
    /// in the request's own class, else in the next non-empty classes, else
    /// the smallest top that fits (wilderness last).
    pub(super) fn find_binned(&self, size: usize, align: usize) -> Option<(SpanId, usize)> {
        if self.power_map == 0 {
            return None;
        }
        if self.fit == Fit::Good {
            return self.find_good(size, align);
        }
        let mut class = class_of(size);
        if let Some(found) = self.best_in(class, size, align) {
            return Some(found);
        }
        // Every span of a higher class is larger than the request.
        loop {
            class += 1;
            let next = self.next_class(class)?;
            if let Some(found) = self.best_in(next, size, align) {
                return Some(found);
            }
            class = next;
        }
    }

    /// TLSF's good fit: the head of the first non-empty class whose every
    /// span holds `size` (the request rounded up to the next class), else
    /// the head of the request's own class if it holds it. Two bit-scans
    /// and at most two spans looked at.
    pub(super) fn find_good(&self, size: usize, align: usize) -> Option<(SpanId, usize)> {
        let class = class_of(size);
        let up = if class_min(class) == size {
            class
        } else {
            class + 1
        };
        if let Some(next) = self.next_class(up) {
            let head = self.bins[next];
            if let Some(start) = self.fit(head, size, align) {
                return Some((head, start));
            }
        }
        let head = self.bins[class];
        if up != class && head != NIL {
            if let Some(start) = self.fit(head, size, align) {
                return Some((head, start));
            }
        }
        None
    }

    /// The first span, in class order then newest first, that holds the
    /// request: every free span of the request's class and above is looked
    /// at (the last resort before a request is refused).
    pub(super) fn find_any(&self, size: usize, align: usize) -> Option<(SpanId, usize)> {
        let mut class = class_of(size);
        while let Some(next) = self.next_class(class) {
            if let Some(found) = self
                .free_list(next)
                .find_map(|id| self.fit(id, size, align).map(|start| (id, start)))
            {
                return Some(found);
            }
            class = next + 1;
        }
        None
    }

    /// The smallest region top that holds the request (regions are few).
    pub(super) fn find_top(&self, size: usize, align: usize) -> Option<(SpanId, usize)> {
        if let [r] = self.regions.as_slice() {
            if r.top == NIL || r.top_size < size {
                return None;
            }
            return self.fit(r.top, size, align).map(|start| (r.top, start));
        }
        let mut best: Option<(SpanId, usize, usize)> = None;
        for r in &self.regions {
            if r.top == NIL || r.top_size < size || best.is_some_and(|b| b.2 <= r.top_size) {
                continue;
            }
            if let Some(start) = self.fit(r.top, size, align) {
                best = Some((r.top, start, r.top_size));
            }
        }
        best.map(|(id, start, _)| (id, start))
    }

    /// The first non-empty class at or after `class`.
    pub(super) fn next_class(&self, class: usize) -> Option<usize> {
        if class >= CLASSES {
            return None;
        }
        let (power, sub) = (class / SUBS, class % SUBS);
        let subs = u32::from(self.sub_maps[power]) & (u32::MAX << sub);
        if subs != 0 {
            return Some(power * SUBS + subs.trailing_zeros() as usize);
        }
        let powers = self.power_map & u64::MAX.checked_shl(power as u32 + 1).unwrap_or(0);
        if powers == 0 {
            return None;
        }
        let power = powers.trailing_zeros() as usize;
        Some(power * SUBS + self.sub_maps[power].trailing_zeros() as usize)
    }
}
