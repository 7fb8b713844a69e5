//! The floor of an allocator that keeps its bookkeeping off the memory it
//! manages: a minimal offsets-only TLSF ([`OffsetsTlsf`]), placed as the
//! arena's free map places by default (good fit over the same size
//! classes, the region's top last, a freed span merged with its free
//! neighbours at once), over one region, with nothing else.
//!
//! The arena keeps its spans in side tables because its memory may be a
//! GPU's or pages not yet touched; `rlsf` and `talc` keep theirs in
//! headers inside the blocks. This is what the side tables alone cost:
//! no several regions to grow, cut or give back, no payload per block, no
//! counters, no exact-size front, no checked handles, no runs. Issue 23's
//! speed goals are measured against it (`BENCHMARKS.md`).

use crate::{Op, Pairs, Replay, Touch, TraceRun};
use std::hint::black_box;

/// "No span" in the links.
const NIL: u32 = u32::MAX;
/// Size classes per power of two (as the arena's free map).
const SUB_BITS: u32 = 4;
const SUBS: usize = 1 << SUB_BITS;
const CLASSES: usize = 64 * SUBS;

/// One span: a node of the address-ordered list and, when free and not the
/// top, of its class's free list.
#[derive(Clone, Copy, Debug)]
struct Span {
    off: usize,
    /// 0 for a vacant slot.
    size: usize,
    prev: u32,
    next: u32,
    prev_free: u32,
    /// For a vacant slot: the next vacant slot.
    next_free: u32,
    used: bool,
}

/// A minimal offsets-only TLSF over one region of `0..size`.
pub struct OffsetsTlsf {
    spans: Vec<Span>,
    vacant: u32,
    bins: Box<[u32; CLASSES]>,
    power_map: u64,
    sub_maps: [u16; CLASSES / SUBS],
    /// The free span that ends at the region's end, if any.
    top: u32,
    size: usize,
}

/// The size class of `size` (> 0), as the arena's free map computes it.
fn class_of(size: usize) -> usize {
    if size < SUBS {
        return size;
    }
    let log = usize::BITS - 1 - size.leading_zeros();
    let sub = (size >> (log - SUB_BITS)) & (SUBS - 1);
    ((log - SUB_BITS + 1) as usize) * SUBS + sub
}

/// The smallest size of class `class`.
fn class_min(class: usize) -> usize {
    if class < SUBS {
        return class;
    }
    (SUBS + class % SUBS) << (class / SUBS - 1)
}

impl OffsetsTlsf {
    /// A wholly free region of `size` bytes (> 0).
    ///
    /// # Panics
    /// If `size` is zero.
    pub fn new(size: usize) -> Self {
        assert!(size > 0, "an empty region");
        let first = Span {
            off: 0,
            size,
            prev: NIL,
            next: NIL,
            prev_free: NIL,
            next_free: NIL,
            used: false,
        };
        Self {
            spans: vec![first],
            vacant: NIL,
            bins: Box::new([NIL; CLASSES]),
            power_map: 0,
            sub_maps: [0; CLASSES / SUBS],
            top: 0,
            size,
        }
    }

    fn new_span(&mut self, span: Span) -> u32 {
        let id = self.vacant;
        if id == NIL {
            self.spans.push(span);
            return u32::try_from(self.spans.len() - 1).expect("fewer than u32::MAX spans");
        }
        let slot = &mut self.spans[id as usize];
        self.vacant = slot.next_free;
        *slot = span;
        id
    }

    fn drop_span(&mut self, id: u32) {
        let slot = &mut self.spans[id as usize];
        slot.size = 0;
        slot.used = false;
        slot.next_free = self.vacant;
        self.vacant = id;
    }

    fn bin(&mut self, id: u32) {
        let class = class_of(self.spans[id as usize].size);
        let head = self.bins[class];
        let s = &mut self.spans[id as usize];
        s.prev_free = NIL;
        s.next_free = head;
        if head != NIL {
            self.spans[head as usize].prev_free = id;
        }
        self.bins[class] = id;
        self.sub_maps[class / SUBS] |= 1 << (class % SUBS);
        self.power_map |= 1 << (class / SUBS);
    }

    fn unbin(&mut self, id: u32) {
        let Span {
            size,
            prev_free,
            next_free,
            ..
        } = self.spans[id as usize];
        let class = class_of(size);
        if prev_free == NIL {
            self.bins[class] = next_free;
        } else {
            self.spans[prev_free as usize].next_free = next_free;
        }
        if next_free != NIL {
            self.spans[next_free as usize].prev_free = prev_free;
        }
        if self.bins[class] == NIL {
            self.sub_maps[class / SUBS] &= !(1 << (class % SUBS));
            if self.sub_maps[class / SUBS] == 0 {
                self.power_map &= !(1 << (class / SUBS));
            }
        }
    }

    /// The first non-empty class at or after `class`.
    fn next_class(&self, class: usize) -> Option<usize> {
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

    /// Whether free span `id` holds `size` bytes at its start, aligned to `align`.
    fn holds(&self, id: u32, size: usize, align: usize) -> bool {
        let s = &self.spans[id as usize];
        s.size >= size && s.off.is_multiple_of(align)
    }

    /// Allocates `size` bytes (> 0) at an offset that is a multiple of
    /// `align` (a power of two; spans start where others end, so callers
    /// round sizes to their alignment as the arena does). Returns the
    /// offset and the span's id, or `None` when nothing holds the request.
    #[inline]
    pub fn alloc(&mut self, size: usize, align: usize) -> Option<(usize, u32)> {
        if self.power_map != 0 {
            // Good fit: the head of the first non-empty class from the next
            // class up, else the head of the request's own class.
            let class = class_of(size);
            let up = if class_min(class) == size {
                class
            } else {
                class + 1
            };
            let found = match self.next_class(up) {
                Some(c) if self.holds(self.bins[c], size, align) => Some(self.bins[c]),
                _ if up != class
                    && self.bins[class] != NIL
                    && self.holds(self.bins[class], size, align) =>
                {
                    Some(self.bins[class])
                }
                _ => None,
            };
            if let Some(id) = found {
                self.unbin(id);
                let s = self.spans[id as usize];
                if s.size > size {
                    let rest = self.new_span(Span {
                        off: s.off + size,
                        size: s.size - size,
                        prev: id,
                        next: s.next,
                        prev_free: NIL,
                        next_free: NIL,
                        used: false,
                    });
                    if s.next != NIL {
                        self.spans[s.next as usize].prev = rest;
                    }
                    self.bin(rest);
                    let f = &mut self.spans[id as usize];
                    f.next = rest;
                    f.size = size;
                }
                self.spans[id as usize].used = true;
                return Some((s.off, id));
            }
        }
        // The top, last.
        let top = self.top;
        if top == NIL || !self.holds(top, size, align) {
            return None;
        }
        let t = self.spans[top as usize];
        if t.size == size {
            self.top = NIL;
            self.spans[top as usize].used = true;
            return Some((t.off, top));
        }
        let id = self.new_span(Span {
            off: t.off,
            size,
            prev: t.prev,
            next: top,
            prev_free: NIL,
            next_free: NIL,
            used: true,
        });
        if t.prev != NIL {
            self.spans[t.prev as usize].next = id;
        }
        let t = &mut self.spans[top as usize];
        t.prev = id;
        t.off += size;
        t.size -= size;
        Some((self.spans[id as usize].off, id))
    }

    /// Frees span `id`, merging it with its free neighbours. Returns its
    /// size, or `None` if `id` names no used span.
    #[inline]
    pub fn free(&mut self, id: u32) -> Option<usize> {
        let s = *self.spans.get(id as usize)?;
        if !s.used || s.size == 0 {
            return None;
        }
        let (mut off, mut size, mut prev, mut next) = (s.off, s.size, s.prev, s.next);
        if prev != NIL && !self.spans[prev as usize].used {
            self.unbin(prev);
            let p = self.spans[prev as usize];
            off = p.off;
            size += p.size;
            self.drop_span(prev);
            prev = p.prev;
        }
        if next != NIL && next == self.top {
            // The top grows down over the span.
            let t = &mut self.spans[next as usize];
            t.off = off;
            t.size += size;
            t.prev = prev;
            if prev != NIL {
                self.spans[prev as usize].next = next;
            }
            self.drop_span(id);
            return Some(s.size);
        }
        if next != NIL && !self.spans[next as usize].used {
            self.unbin(next);
            let n = self.spans[next as usize];
            size += n.size;
            self.drop_span(next);
            next = n.next;
        }
        let me = &mut self.spans[id as usize];
        me.off = off;
        me.size = size;
        me.prev = prev;
        me.next = next;
        me.used = false;
        if prev != NIL {
            self.spans[prev as usize].next = id;
        }
        if next != NIL {
            self.spans[next as usize].prev = id;
        }
        if off + size == self.size {
            self.top = id;
        } else {
            self.bin(id);
        }
        Some(s.size)
    }

    /// Every span as `(offset, size, used)`, by address.
    #[cfg(test)]
    fn spans_in_order(&self) -> Vec<(usize, usize, bool)> {
        let mut head = self
            .spans
            .iter()
            .position(|s| s.size > 0 && s.prev == NIL)
            .expect("a region has a first span") as u32;
        let mut out = Vec::new();
        while head != NIL {
            let s = &self.spans[head as usize];
            out.push((s.off, s.size, s.used));
            head = s.next;
        }
        out
    }
}

/// The floor's region: larger than any batch or trace needs (nothing is
/// mapped: it is offsets only).
const FLOOR_REGION: usize = 1 << 40;

/// Hot-path pairs on the floor (offsets only), sizes rounded to 64 bytes
/// as the arena rounds them.
pub fn floor_pairs() -> Box<dyn Pairs> {
    Box::new(FloorPairs(OffsetsTlsf::new(FLOOR_REGION)))
}

struct FloorPairs(OffsetsTlsf);

impl Pairs for FloorPairs {
    fn pairs(&mut self, sizes: &[usize]) {
        for &len in sizes {
            let (_, id) = self
                .0
                .alloc(len.next_multiple_of(64), 64)
                .expect("the region holds any batch");
            self.0.free(black_box(id)).expect("a live span");
        }
    }
}

/// Trace replays on the floor: offsets only, so only [`Touch::Nothing`]
/// (the `trace_order` bench's) is possible.
pub fn floor_replayer() -> Box<dyn Replay> {
    Box::new(FloorReplay(OffsetsTlsf::new(FLOOR_REGION)))
}

struct FloorReplay(OffsetsTlsf);

impl Replay for FloorReplay {
    fn run_with(&mut self, run: &TraceRun, touch: Touch) {
        assert!(
            matches!(touch, Touch::Nothing),
            "the floor manages offsets, not memory: nothing to touch"
        );
        let mut live = vec![NIL; run.slots];
        for op in &run.ops {
            match *op {
                Op::Alloc { id, bytes } => {
                    let (_, span) = self
                        .0
                        .alloc(bytes.next_multiple_of(64), 64)
                        .expect("the region holds any trace");
                    live[id as usize] = span;
                }
                Op::Free { id } => {
                    self.0.free(live[id as usize]).expect("a live span");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spans tile the region, no two free spans touch, the top is the last
    /// span when free, and `live` are exactly the used spans.
    fn check(m: &OffsetsTlsf, live: &[(usize, usize, u32)]) {
        let spans = m.spans_in_order();
        let mut at = 0;
        let mut prev_free = false;
        for &(off, size, used) in &spans {
            assert_eq!(off, at, "spans tile the region");
            assert!(!prev_free || used, "two free spans touch at {off}");
            prev_free = !used;
            at += size;
        }
        assert_eq!(at, m.size);
        let mut used: Vec<(usize, usize)> =
            spans.iter().filter(|s| s.2).map(|s| (s.0, s.1)).collect();
        let mut want: Vec<(usize, usize)> = live.iter().map(|l| (l.0, l.1)).collect();
        used.sort_unstable();
        want.sort_unstable();
        assert_eq!(used, want, "the used spans are the live blocks");
    }

    #[test]
    fn random_ops_tile_the_region_and_fill_it_back() {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut m = OffsetsTlsf::new(1 << 20);
        let mut live: Vec<(usize, usize, u32)> = Vec::new();
        for step in 0..20_000 {
            if rnd() % 2 == 0 {
                let size = ((rnd() % 256) as usize + 1) * 64;
                if let Some((off, id)) = m.alloc(size, 64) {
                    assert_eq!(off % 64, 0);
                    live.push((off, size, id));
                }
            } else if !live.is_empty() {
                let i = (rnd() as usize) % live.len();
                let (_, size, id) = live.swap_remove(i);
                assert_eq!(m.free(id), Some(size), "step {step}");
                assert_eq!(m.free(id), None, "a second free is refused");
            }
            if step % 97 == 0 {
                check(&m, &live);
            }
        }
        for (_, _, id) in live.drain(..) {
            m.free(id).unwrap();
        }
        assert_eq!(m.spans_in_order(), vec![(0, 1 << 20, false)]);
    }

    #[test]
    fn good_fit_takes_the_next_class_up_then_the_top() {
        let mut m = OffsetsTlsf::new(10_000);
        let (a, ia) = m.alloc(1000, 1).unwrap();
        let (_, _) = m.alloc(10, 1).unwrap();
        let (c, ic) = m.alloc(3000, 1).unwrap();
        let (_, _) = m.alloc(10, 1).unwrap();
        m.free(ia).unwrap();
        m.free(ic).unwrap();
        // 1000 is not its class's smallest size: rounded up, it takes the
        // head of the next non-empty class, the 3000-byte span.
        assert_eq!(m.alloc(1000, 1).map(|r| r.0), Some(c));
        // 992 is its class's smallest: the 1000-byte span holds it.
        assert_eq!(class_min(class_of(1000)), 992);
        assert_eq!(m.alloc(992, 1).map(|r| r.0), Some(a));
        // Nothing binned holds 5000: the top.
        assert_eq!(m.alloc(5000, 1).map(|r| r.0), Some(4020));
    }
}
