//! The items of a planning problem and the lower bound of their footprint
//! that knows about alignment.

use super::clamp;
use std::collections::BTreeMap;

/// A request that takes part in planning.
#[derive(Debug, Clone, Copy)]
pub(super) struct Item {
    pub(super) size: usize,
    /// Alignment minus one.
    pub(super) mask: usize,
    pub(super) start: usize,
    pub(super) end: usize,
    /// Index in the caller's slice.
    pub(super) request: usize,
}

impl Item {
    pub(super) fn length(&self) -> usize {
        self.end - self.start
    }
}

/// A lower bound of the footprint of `items` that knows about alignment:
/// every offset is a multiple of the smallest alignment `m`, so of the
/// buffers live at one time, all but the topmost take their size rounded up
/// to `m`. At least the plain lower bound.
pub(super) fn aligned_bound(items: &[Item]) -> usize {
    let mask = items.iter().map(|it| it.mask).min().unwrap_or(0) as u128;
    let rounded = |size: usize| (size as u128 + mask) & !mask;
    let mut pads = Pads::new(mask);
    let (mut live, mut peak) = (0u128, 0u128);
    let mut change = |is_start: bool, it: &Item| {
        let size = rounded(it.size);
        let pad = size - it.size as u128;
        if is_start {
            live += size;
            pads.add(pad);
            peak = peak.max(live - pads.top());
        } else {
            live -= size;
            pads.remove(pad);
        }
    };
    // The changes in time order, ends before starts at the same time. The
    // order among a time's starts (or ends) does not matter: `live -
    // top_pad` only grows as its starts are added (each adds its size and
    // raises the top pad by less), so the last of them is the peak.
    let top = items
        .iter()
        .map(|it| it.end.max(it.start))
        .max()
        .unwrap_or(0);
    // (At most 2^30 items: the places, two per item, are counted in u32.)
    if items.len() <= 1 << 30 && top <= items.len().saturating_mul(4).saturating_add(64) {
        // Times within a few of the items' count (a recording's are its
        // event indices, so every plan's): counted into their places, no
        // sort. Key `2 * time + is start`, so that a time's ends come
        // before its starts. Other times (requests given to the solver
        // directly) are sorted.
        let mut at = vec![0u32; 2 * top + 3];
        for it in items {
            at[2 * it.start + 2] += 1;
            at[2 * it.end + 1] += 1;
        }
        for k in 1..at.len() {
            at[k] += at[k - 1];
        }
        let mut order = vec![(0u32, false); 2 * items.len()];
        for (i, it) in items.iter().enumerate() {
            for (key, is_start) in [(2 * it.start + 1, true), (2 * it.end, false)] {
                let slot = &mut at[key];
                order[*slot as usize] = (i as u32, is_start);
                *slot += 1;
            }
        }
        for (i, is_start) in order {
            change(is_start, &items[i as usize]);
        }
    } else {
        let mut changes: Vec<(usize, bool, usize)> = Vec::with_capacity(2 * items.len());
        for (i, it) in items.iter().enumerate() {
            changes.push((it.start, true, i));
            changes.push((it.end, false, i));
        }
        changes.sort_unstable_by_key(|&(time, is_start, _)| (time, is_start));
        for (_, is_start, i) in changes {
            change(is_start, &items[i]);
        }
    }
    clamp(peak)
}

/// The paddings of the items live at a time (each under the smallest
/// alignment), with the largest: counted per value where that alignment is
/// small (an item's bytes are rarely aligned to more than a page), else in
/// an ordered map.
enum Pads {
    Counts { counts: Vec<u32>, top: usize },
    Map(BTreeMap<u128, usize>),
}

impl Pads {
    fn new(mask: u128) -> Self {
        match usize::try_from(mask) {
            Ok(m) if m < 4096 => Pads::Counts {
                counts: vec![0; m + 1],
                top: 0,
            },
            _ => Pads::Map(BTreeMap::new()),
        }
    }

    fn add(&mut self, pad: u128) {
        match self {
            Pads::Counts { counts, top } => {
                let p = pad as usize;
                counts[p] += 1;
                *top = (*top).max(p);
            }
            Pads::Map(map) => *map.entry(pad).or_insert(0) += 1,
        }
    }

    /// Takes out one item's `pad` (added before).
    fn remove(&mut self, pad: u128) {
        match self {
            Pads::Counts { counts, top } => {
                let p = pad as usize;
                counts[p] -= 1;
                while *top > 0 && counts[*top] == 0 {
                    *top -= 1;
                }
            }
            Pads::Map(map) => {
                if let Some(count) = map.get_mut(&pad) {
                    *count -= 1;
                    if *count == 0 {
                        map.remove(&pad);
                    }
                }
            }
        }
    }

    /// The largest padding live (0 for none).
    fn top(&self) -> u128 {
        match self {
            Pads::Counts { top, .. } => *top as u128,
            Pads::Map(map) => map.last_key_value().map_or(0, |(&p, _)| p),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(size: usize, align: usize, start: usize, end: usize) -> Item {
        Item {
            size,
            mask: align - 1,
            start,
            end,
            request: 0,
        }
    }

    #[test]
    fn the_bound_is_the_same_whether_its_times_are_counted_or_sorted() {
        // Items whose times are dense are counted into place; the same
        // items shifted far (in 31 bits or past them) are sorted: one
        // bound.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..200 {
            let small: Vec<Item> = (0..1 + next(40))
                .map(|_| {
                    let start = next(50) as usize;
                    let align = [1, 8, 64, 256][next(4) as usize];
                    item(
                        1 + next(5000) as usize,
                        align,
                        start,
                        start + 1 + next(20) as usize,
                    )
                })
                .collect();
            let far: Vec<Item> = small
                .iter()
                .map(|it| {
                    item(
                        it.size,
                        it.mask + 1,
                        it.start + (1 << 40),
                        it.end + (1 << 40),
                    )
                })
                .collect();
            let shifted = |by: usize| -> Vec<Item> {
                small
                    .iter()
                    .map(|it| item(it.size, it.mask + 1, it.start + by, it.end + by))
                    .collect()
            };
            assert_eq!(aligned_bound(&small), aligned_bound(&shifted(1 << 20)));
            assert_eq!(aligned_bound(&small), aligned_bound(&far));
        }
    }

    #[test]
    fn all_but_the_topmost_buffer_take_their_rounded_size() {
        // 100 and 30 bytes live together under 64-byte alignment: the lower
        // of the two takes 128, the top one its own 30 at most.
        let items = [item(100, 64, 0, 2), item(30, 64, 1, 3)];
        assert_eq!(aligned_bound(&items), 128 + 30);
        // An alignment past the counted paddings' range (the ordered map).
        let items = [item(100, 8192, 0, 2), item(30, 8192, 1, 3)];
        assert_eq!(aligned_bound(&items), 8192 + 30);
    }
}
