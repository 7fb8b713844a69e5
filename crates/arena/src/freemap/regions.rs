//! Regions as the free map sees them: adding and removing them, growing
//! and cutting them at their end, and what the pool asks about them.

use super::{FreeMap, RegionId, RegionInfo, Span, SpanId, MAX_REGION, NIL};

impl<T: Copy> FreeMap<T> {
    /// Adds a wholly free region of `size` bytes and returns its id.
    pub(crate) fn add_region(&mut self, size: usize) -> RegionId {
        debug_assert!(size > 0 && size <= MAX_REGION, "bad region size {size}");
        let rid = match self.regions.iter().position(|r| r.size == 0) {
            Some(i) => i,
            None => {
                self.regions.push(RegionInfo {
                    size: 0,
                    head: NIL,
                    top: NIL,
                    top_size: 0,
                });
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
            prev_free: NIL,
            next_free: NIL,
            used: None,
            front: false,
            class: 0,
        });
        self.regions[rid as usize] = RegionInfo {
            size,
            head: id,
            top: NIL,
            top_size: 0,
        };
        self.file_free(id);
        self.total_bytes += size;
        rid
    }

    /// Removes a region, which must be wholly free; returns its size.
    pub(crate) fn remove_region(&mut self, rid: RegionId) -> usize {
        debug_assert!(self.is_region_free(rid), "region {rid} is not wholly free");
        let RegionInfo { size, head, .. } = self.regions[rid as usize];
        self.unfile_free(head);
        self.drop_span(head);
        self.regions[rid as usize] = RegionInfo {
            size: 0,
            head: NIL,
            top: NIL,
            top_size: 0,
        };
        while self.regions.last().is_some_and(|r| r.size == 0) {
            self.regions.pop();
        }
        self.total_bytes -= size;
        size
    }

    /// Where the used part of region `rid` ends: the start of its free top
    /// if it has one, else its size.
    pub(crate) fn used_end(&self, rid: RegionId) -> usize {
        let r = &self.regions[rid as usize];
        if r.top == NIL {
            r.size
        } else {
            self.spans[r.top as usize].off
        }
    }

    /// The last span of region `rid`, by address.
    fn tail(&self, rid: RegionId) -> SpanId {
        let mut id = self.regions[rid as usize].head;
        while self.spans[id as usize].next != NIL {
            id = self.spans[id as usize].next;
        }
        id
    }

    /// Grows region `rid` at its end to `new_size` bytes (more than now):
    /// its free top grows, or a new free top follows its last used span.
    pub(crate) fn extend_region(&mut self, rid: RegionId, new_size: usize) {
        let RegionInfo { size, top, .. } = self.regions[rid as usize];
        debug_assert!(size > 0 && new_size > size && new_size <= MAX_REGION);
        let extra = new_size - size;
        if top != NIL {
            self.unfile_free(top);
            self.spans[top as usize].size += extra;
            self.regions[rid as usize].size = new_size;
            self.file_free(top);
        } else {
            let tail = self.tail(rid);
            self.regions[rid as usize].size = new_size;
            let id = self.insert_after(tail, size, extra, None);
            self.file_free(id);
        }
        self.total_bytes += extra;
    }

    /// Cuts region `rid` down to `new_size` bytes (less than now, more than
    /// 0), which must not cut into a used span: the free top shrinks or
    /// goes. Returns whether it was done.
    pub(crate) fn truncate_region(&mut self, rid: RegionId, new_size: usize) -> bool {
        let RegionInfo { size, top, .. } = self.regions[rid as usize];
        if top == NIL || new_size == 0 || new_size >= size {
            return false;
        }
        let off = self.spans[top as usize].off;
        if new_size < off {
            return false;
        }
        self.unfile_free(top);
        self.regions[rid as usize].size = new_size;
        if new_size == off {
            // The span before the top is used (free spans never touch).
            self.unlink(top);
        } else {
            self.spans[top as usize].size = new_size - off;
            self.file_free(top);
        }
        self.total_bytes -= size - new_size;
        true
    }

    /// Every free span of region `rid` as `(offset, size)`, by address.
    pub(crate) fn free_spans(&self, rid: RegionId) -> impl Iterator<Item = (usize, usize)> + '_ {
        let mut id = self.regions.get(rid as usize).map_or(NIL, |r| r.head);
        std::iter::from_fn(move || loop {
            if id == NIL {
                return None;
            }
            let s = &self.spans[id as usize];
            id = s.next;
            if s.used.is_none() {
                return Some((s.off, s.size));
            }
        })
    }

    /// Size of region `rid`, or 0 if there is none.
    pub(crate) fn region_size(&self, rid: RegionId) -> usize {
        self.regions.get(rid as usize).map_or(0, |r| r.size)
    }

    /// Ids of the live regions.
    pub(crate) fn region_ids(&self) -> impl Iterator<Item = RegionId> + '_ {
        self.regions
            .iter()
            .enumerate()
            .filter(|(_, r)| r.size > 0)
            .map(|(i, _)| i as RegionId)
    }

    /// Whether region `rid` holds no used span.
    pub(crate) fn is_region_free(&self, rid: RegionId) -> bool {
        match self.regions.get(rid as usize) {
            Some(r) if r.size > 0 => {
                let s = &self.spans[r.head as usize];
                s.used.is_none() && !s.front && s.size == r.size
            }
            _ => false,
        }
    }
}
