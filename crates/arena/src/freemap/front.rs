//! The exact-size front ahead of best fit: a freed span waits on a stack
//! for its exact size, and is coalesced (flushed) at the first request the
//! front does not serve.

use super::{front_slot, FreeMap, RegionId, Slot, SpanId, FRONT_DEPTH, NIL};

impl<T: Copy> FreeMap<T> {
    /// Hands out the last span freed at exactly `size` bytes, if its start
    /// is aligned to `align`.
    #[inline]
    pub(super) fn take_front(
        &mut self,
        size: usize,
        align: usize,
        tag: T,
    ) -> Option<(RegionId, usize, SpanId)> {
        if self.front_map == 0 {
            return None;
        }
        let slot = front_slot(size);
        let Slot {
            size: held,
            head: id,
            ..
        } = self.front[slot];
        if held != size || id == NIL {
            return None;
        }
        let s = &mut self.spans[id as usize];
        if s.off & (align - 1) != 0 {
            return None;
        }
        s.front = false;
        s.used = Some(tag);
        let (rid, off, next) = (s.rid, s.off, s.next_free);
        self.front[slot].head = next;
        self.front[slot].depth -= 1;
        if next == NIL {
            self.front_map &= !(1 << slot);
        }
        self.free_bytes -= size;
        self.used_count += 1;
        Some((rid, off, id))
    }

    /// Puts free span `id` (just freed) on its size's front stack; a slot
    /// held by another size, or holding [`FRONT_DEPTH`] spans already, is
    /// flushed first (so that a flush, and the front, stay bounded).
    #[inline]
    pub(super) fn push_front(&mut self, id: SpanId) {
        let size = self.spans[id as usize].size;
        // In the front from now on: a flush below must not merge it.
        self.spans[id as usize].front = true;
        let slot = front_slot(size);
        let Slot {
            size: held,
            head,
            depth,
        } = self.front[slot];
        if head != NIL && (held != size || depth == FRONT_DEPTH) {
            self.flush_slot(slot);
        }
        let Slot { head, depth, .. } = self.front[slot];
        let s = &mut self.spans[id as usize];
        s.next_free = head;
        self.front[slot] = Slot {
            size,
            head: id,
            depth: depth + 1,
        };
        self.front_map |= 1 << slot;
        self.free_bytes += size;
    }

    /// Coalesces every front span back into the free lists.
    pub(crate) fn flush_front(&mut self) {
        while self.front_map != 0 {
            let slot = self.front_map.trailing_zeros() as usize;
            self.flush_slot(slot);
        }
    }

    /// Coalesces the front spans of one slot back into the free lists.
    pub(super) fn flush_slot(&mut self, slot: usize) {
        let mut id = self.front[slot].head;
        self.front[slot].head = NIL;
        self.front[slot].depth = 0;
        self.front_map &= !(1 << slot);
        while id != NIL {
            let next = self.spans[id as usize].next_free;
            self.spans[id as usize].front = false;
            self.free_bytes -= self.spans[id as usize].size;
            self.coalesce(id);
            id = next;
        }
    }
}
