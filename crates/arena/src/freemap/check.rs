//! The free map's invariants, walked in full (tests, fuzzing and the
//! `check-invariants` feature).

#[cfg(any(test, fuzzing, feature = "check-invariants"))]
use super::{class_of, front_slot, FreeMap, RegionInfo, Slot, FRONT_DEPTH, NIL, SUBS};

#[cfg(any(test, fuzzing, feature = "check-invariants"))]
impl<T: Copy> FreeMap<T> {
    /// Walks every span, list and bitmap and panics on any broken invariant.
    #[cfg(any(test, fuzzing, feature = "check-invariants"))]
    pub(crate) fn check_invariants(&self) {
        let mut free_bytes = 0;
        let mut used = 0;
        let mut total = 0;
        let mut binned = 0;
        let mut seen = 0;
        let mut fronted = 0;
        for rid in self.region_ids() {
            let RegionInfo {
                size,
                head,
                top,
                top_size,
            } = self.regions[rid as usize];
            total += size;
            let mut expect = 0;
            let mut prev_free = false;
            let mut prev = NIL;
            let mut id = head;
            let mut found_top = NIL;
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
                if span.front {
                    assert!(span.used.is_none(), "a used span in the front");
                    free_bytes += span.size;
                    fronted += 1;
                    prev_free = false;
                } else if span.used.is_none() {
                    assert!(
                        !prev_free,
                        "region {rid}: two adjacent free spans at {:#x}",
                        span.off
                    );
                    free_bytes += span.size;
                    if end == size {
                        found_top = id;
                    } else {
                        let class = class_of(span.size);
                        assert!(
                            self.free_list(class).any(|f| f == id),
                            "free span {id} not in its class list {class}"
                        );
                        binned += 1;
                    }
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
            assert_eq!(top, found_top, "region {rid}: wrong top");
            let found_size = if top == NIL {
                0
            } else {
                self.spans[top as usize].size
            };
            assert_eq!(top_size, found_size, "region {rid}: wrong top size");
        }
        let mut vacant = 0;
        let mut id = self.vacant;
        while id != NIL {
            let s = &self.spans[id as usize];
            assert_eq!(s.size, 0, "span {id} is listed vacant but in use");
            vacant += 1;
            assert!(vacant <= self.spans.len(), "the vacant slots loop");
            id = s.next_free;
        }
        assert_eq!(seen + vacant, self.spans.len(), "lost span slots");
        let mut listed = 0;
        for class in 0..self.bins.len() {
            let mut prev = NIL;
            for id in self.free_list(class) {
                let s = &self.spans[id as usize];
                assert!(
                    s.size > 0 && s.used.is_none(),
                    "class {class} lists span {id}"
                );
                assert_eq!(class_of(s.size), class, "span {id} in the wrong class");
                assert_eq!(usize::from(s.class), class, "span {id}: stale class");
                assert_eq!(s.prev_free, prev, "class {class}: broken back link");
                prev = id;
                listed += 1;
            }
            let bit = self.sub_maps[class / SUBS] & (1 << (class % SUBS)) != 0;
            assert_eq!(
                bit,
                self.bins[class] != NIL,
                "class {class}: bitmap out of date"
            );
        }
        for power in 0..self.sub_maps.len() {
            let bit = self.power_map & (1 << power) != 0;
            assert_eq!(
                bit,
                self.sub_maps[power] != 0,
                "power {power}: bitmap out of date"
            );
        }
        assert_eq!(listed, binned, "class lists hold spans that are not free");
        let mut stacked = 0;
        for (slot, &Slot { size, head, depth }) in self.front.iter().enumerate() {
            assert_eq!(
                self.front_map & (1 << slot) != 0,
                head != NIL,
                "front slot {slot} out of the map"
            );
            let mut on_stack = 0;
            let mut id = head;
            while id != NIL {
                let sp = &self.spans[id as usize];
                assert!(sp.front && sp.size == size, "front stack of {size}");
                assert_eq!(
                    front_slot(size),
                    self.front.iter().position(|f| f.head == head).unwrap()
                );
                stacked += 1;
                on_stack += 1;
                id = sp.next_free;
            }
            assert_eq!(on_stack, depth, "front stack of {size}: depth");
            assert!(depth <= FRONT_DEPTH, "front stack of {size} too deep");
        }
        assert_eq!(stacked, fronted, "front spans off their stacks");
        assert_eq!(free_bytes, self.free_bytes);
        assert_eq!(used, self.used_count);
        assert_eq!(total, self.total_bytes);
    }

    /// Spans waiting in the front.
    #[cfg(test)]
    pub(crate) fn front_len(&self) -> usize {
        self.front.iter().map(|s| s.depth as usize).sum()
    }
}
