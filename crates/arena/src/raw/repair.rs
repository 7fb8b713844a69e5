//! A run that leaves its plan's block (the block dissolved, see
//! [`fallback`](super::fallback)) is not left to place the rest of its
//! blocks one at a time, blind to what comes: the plan still says which
//! blocks come and when each is freed. At the dissolution the rest of the
//! plan is placed again around what is live, the block that did not fit at
//! its own size, with no cap: the smallest extent greedy placement finds
//! ([`place`]). Each later block of the run is then offered that place
//! ([`Repair::at`]); the pool takes it when it is free and the block is no
//! larger than planned, and places the block as usual otherwise. A place is
//! a hint: what the pool hands out is checked against what is live there,
//! never trusted.
//!
//! Why: the live planned blocks keep the places the plan gave them, which
//! are no dynamic arena's. Placing the rest one by one at the first free
//! range (the pool's best fit) around them fragments what comes after.
//! Over random families (`first_sight::fell_back_runs_against_no_plan`)
//! placing the rest whole put 130 of 293 fell-back runs below the same
//! run's dynamic high-water (117 before) and cut their bytes past it by 6%
//! (BENCHMARKS.md, "A run that leaves its plan"; docs/decisions.md, "A
//! dissolved block's run: the rest of the plan placed again, as hints"). A run that left its plan at its first block (a plan of
//! another shape) is not placed again: its blocks would be pinned where the
//! plan's were (a GPU trace served on the plan of another batch peaked 37
//! MiB higher so), nor is a block under half its place.

use crate::freemap::RegionId;

/// A block's life where it has no planned free.
pub(super) const NEVER: usize = usize::MAX;

/// Blocks past which the rest of a run is not placed again: the placement
/// grows with them and the pairs live together, on the run's thread.
pub(super) const MAX_BLOCKS: usize = 1024;

/// Where the rest of a run that left its plan's block goes: for each of its
/// planned blocks from `first`, an offset from where the block was, and the
/// bytes it was placed for. Followed while the run follows the plan: the
/// first block that comes out of order, larger than it was placed for or
/// under half of it ends it (placing the rest again around each guess that
/// failed, up to 100 times a run, left the random families' fell-back runs
/// 1.29 times the bytes past their dynamic runs that dissolving alone
/// leaves; stopping, 0.94 times).
pub(super) struct Repair {
    /// Region of the pool the plan's block lay in, and its offset there.
    pub(super) rid: RegionId,
    pub(super) base: usize,
    /// Index of the first block placed.
    first: usize,
    /// `(offset from base, bytes)` of blocks `first..`.
    slots: Vec<(usize, usize)>,
    /// The next block expected, from `first`; `usize::MAX` once the run
    /// left the repair.
    next: usize,
}

impl Repair {
    /// Places blocks `items` (the plan's from `first`) around `fixed`
    /// ([`place`]), for a plan's block that was at `base` of region `rid`.
    pub(super) fn new(
        rid: RegionId,
        base: usize,
        first: usize,
        fixed: &[Held],
        items: &[Item],
    ) -> Self {
        let (offsets, _) = place(fixed, items);
        let slots = offsets
            .into_iter()
            .zip(items.iter().map(|it| it.bytes))
            .collect();
        Repair {
            rid,
            base,
            first,
            slots,
            next: 0,
        }
    }

    /// Where block `index` of `size` bytes goes, as `(offset in the region,
    /// offset from the plan's block)`: `None`, and none for the rest of
    /// the run, when it is not the next block placed or is larger than it
    /// was placed for. The caller allocates block `index` next, here or
    /// elsewhere.
    pub(super) fn at(&mut self, index: usize, size: usize) -> Option<(usize, usize)> {
        let slot = index
            .checked_sub(self.first)
            .filter(|&i| i == self.next)
            .and_then(|i| self.slots.get(i))
            .filter(|s| size <= s.1 && size >= s.1 / 2);
        match slot {
            Some(&(off, _)) => {
                self.next += 1;
                Some((self.base + off, off))
            }
            None => {
                self.next = usize::MAX;
                None
            }
        }
    }
}

/// A block live when the rest is placed: `(offset, bytes, planned free)`
/// (the free a step of the plan, or [`NEVER`]).
pub(super) type Held = (usize, usize, usize);

/// One block to place: `bytes` at `align` (a power of two), live in plan
/// steps `start..end` (`end` [`NEVER`]: to the end of the run).
#[derive(Clone, Copy, Debug)]
pub(super) struct Item {
    pub(super) bytes: usize,
    pub(super) align: usize,
    pub(super) start: usize,
    pub(super) end: usize,
}

/// Offsets for `items` around `fixed` (`(offset, bytes, end)`: blocks live
/// now, from before every item's start, until step `end`), none sharing a
/// byte with another while both are live: the larger blocks first, each at
/// the lowest offset free for its life (ties: the earlier first). Returns
/// the offsets, by item, and the extent they reach (with the fixed blocks).
pub(super) fn place(fixed: &[Held], items: &[Item]) -> (Vec<usize>, usize) {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|&a, &b| {
        items[b]
            .bytes
            .cmp(&items[a].bytes)
            .then(items[a].start.cmp(&items[b].start))
    });
    let live_with = live_with(items);
    let mut offsets = vec![0usize; items.len()];
    let mut placed = vec![false; items.len()];
    let mut extent = fixed.iter().map(|f| f.0 + f.1).max().unwrap_or(0);
    let mut busy: Vec<(usize, usize)> = Vec::new();
    for i in order {
        let it = items[i];
        busy.clear();
        // The fixed blocks are live from before every item's start.
        busy.extend(
            fixed
                .iter()
                .filter(|f| it.start < f.2)
                .map(|&(off, bytes, _)| (off, off + bytes)),
        );
        busy.extend(
            live_with
                .of(i)
                .iter()
                .map(|&j| j as usize)
                .filter(|&j| placed[j])
                .map(|j| (offsets[j], offsets[j] + items[j].bytes)),
        );
        busy.sort_unstable();
        let mut at = 0usize;
        for &(s, e) in &busy {
            let off = at.next_multiple_of(it.align);
            if off + it.bytes <= s {
                break;
            }
            at = at.max(e);
        }
        let off = at.next_multiple_of(it.align);
        offsets[i] = off;
        placed[i] = true;
        extent = extent.max(off + it.bytes);
    }
    (offsets, extent)
}

/// For each item, the items live with it (their lives overlap), as lists
/// `targets[first[i]..first[i + 1]]`: two sweeps in start order (one to
/// count, one to fill), in time linear in the pairs found.
pub(super) struct LiveWith {
    first: Vec<usize>,
    targets: Vec<u32>,
}

impl LiveWith {
    fn of(&self, i: usize) -> &[u32] {
        &self.targets[self.first[i]..self.first[i + 1]]
    }
}

fn live_with(items: &[Item]) -> LiveWith {
    let mut by_start: Vec<u32> = (0..items.len() as u32).collect();
    by_start.sort_unstable_by_key(|&i| items[i as usize].start);
    // Calls `pair` for each pair live together.
    let sweep = |pair: &mut dyn FnMut(u32, u32)| {
        // Started and not yet ended, as the sweep reaches each start.
        let mut open: Vec<u32> = Vec::new();
        for &i in &by_start {
            let start = items[i as usize].start;
            open.retain(|&j| items[j as usize].end > start);
            for &j in &open {
                pair(i, j);
            }
            open.push(i);
        }
    };
    let mut degree = vec![0usize; items.len() + 1];
    sweep(&mut |i, j| {
        degree[i as usize] += 1;
        degree[j as usize] += 1;
    });
    let mut first = Vec::with_capacity(items.len() + 1);
    let mut total = 0;
    for d in &degree[..items.len()] {
        first.push(total);
        total += d;
    }
    first.push(total);
    let mut fill = first.clone();
    let mut targets = vec![0u32; total];
    sweep(&mut |i, j| {
        targets[fill[i as usize]] = j;
        fill[i as usize] += 1;
        targets[fill[j as usize]] = i;
        fill[j as usize] += 1;
    });
    LiveWith { first, targets }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(bytes: usize, start: usize, end: usize) -> Item {
        Item {
            bytes,
            align: 64,
            start,
            end,
        }
    }

    /// No two blocks live at once share a byte, fixed ones included.
    fn disjoint(fixed: &[(usize, usize, usize)], items: &[Item], offsets: &[usize]) {
        let mut all: Vec<(usize, usize, usize, usize)> =
            fixed.iter().map(|&(o, b, e)| (o, o + b, 0, e)).collect();
        for (it, &o) in items.iter().zip(offsets) {
            assert_eq!(o % it.align, 0);
            all.push((o, o + it.bytes, it.start, it.end));
        }
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                let live = a.2 < b.3 && b.2 < a.3;
                let meet = a.0 < b.1 && b.0 < a.1;
                assert!(!(live && meet), "{a:?} meets {b:?}");
            }
        }
    }

    #[test]
    fn the_rest_goes_around_what_is_live_and_reuses_what_it_frees() {
        // A live block at 1024..2048 until step 5; below it 1024 bytes free.
        let fixed = [(1024, 1024, 5)];
        let items = [item(1024, 1, 4), item(2048, 3, 8), item(1024, 6, 9)];
        let (offsets, extent) = place(&fixed, &items);
        disjoint(&fixed, &items, &offsets);
        // The large block goes above the live one; the first small one
        // below it; the last one into the fixed block's place, freed.
        assert_eq!(offsets, vec![0, 2048, 0]);
        assert_eq!(extent, 4096);
    }

    #[test]
    fn blocks_live_to_the_end_stay_in_the_way() {
        let fixed = [(0, 4096, NEVER)];
        let items = [item(64, 10, NEVER)];
        let (offsets, extent) = place(&fixed, &items);
        disjoint(&fixed, &items, &offsets);
        assert_eq!(offsets, vec![4096]);
        assert_eq!(extent, 4160);
    }

    #[test]
    fn places_are_offered_while_the_run_follows_the_plan() {
        // Blocks 3 and 4 live at once.
        let items = [item(1024, 0, 4), item(64, 1, 4)];
        let mut r = Repair::new(0, 4096, 3, &[], &items);
        assert_eq!(r.at(3, 1024), Some((4096, 0)));
        assert_eq!(r.at(4, 64), Some((4096 + 1024, 1024)));
        assert_eq!(r.at(5, 64), None, "past the plan");
        // A block larger than its place ends the repair.
        let mut r = Repair::new(0, 4096, 3, &[], &items);
        assert_eq!(r.at(3, 2048), None);
        assert_eq!(r.at(4, 64), None);
        // So does one under half its place (another path through the
        // model).
        let mut r = Repair::new(0, 4096, 3, &[], &items);
        assert_eq!(r.at(3, 448), None);
        assert_eq!(r.at(4, 64), None);
        // So does one out of order.
        let mut r = Repair::new(0, 4096, 3, &[], &items);
        assert_eq!(r.at(4, 64), None);
        assert_eq!(r.at(3, 1024), None);
    }

    proptest::proptest! {
        /// The sweep finds exactly the pairs whose lives overlap.
        #[test]
        fn the_sweep_finds_every_pair_live_together(
            lives in proptest::collection::vec((0usize..30, 1usize..20, proptest::bool::ANY), 0..40),
        ) {
            let items: Vec<Item> = lives
                .iter()
                .map(|&(s, l, never)| item(64, s, if never { NEVER } else { s + l }))
                .collect();
            let lists = live_with(&items);
            for (i, a) in items.iter().enumerate() {
                let mut want: Vec<u32> = (0..items.len())
                    .filter(|&j| j != i && items[j].start < a.end && a.start < items[j].end)
                    .map(|j| j as u32)
                    .collect();
                let mut got = lists.of(i).to_vec();
                want.sort_unstable();
                got.sort_unstable();
                proptest::prop_assert_eq!(got, want, "item {}", i);
            }
        }
    }

    proptest::proptest! {
        /// Random fixed blocks and items: never two live blocks on one
        /// byte, every offset aligned.
        #[test]
        fn placements_never_overlap(
            fixed in proptest::collection::vec((0usize..64, 1usize..16, 1usize..40), 0..6),
            items in proptest::collection::vec((1usize..32, 0u32..3, 0usize..30, 1usize..20, proptest::bool::ANY), 0..24),
        ) {
            // Fixed blocks may overlap one another (as places a plan gave
            // blocks live at other times): only the items are checked
            // against them and each other.
            let fixed: Vec<(usize, usize, usize)> =
                fixed.into_iter().map(|(o, b, e)| (o * 64, b * 64, e)).collect();
            let items: Vec<Item> = items
                .into_iter()
                .map(|(b, a, s, l, never)| Item {
                    bytes: b * 64,
                    align: 64 << a,
                    start: s,
                    end: if never { NEVER } else { s + l },
                })
                .collect();
            let (offsets, _) = place(&fixed, &items);
            let mut all: Vec<(usize, usize, usize, usize, bool)> =
                fixed.iter().map(|&(o, b, e)| (o, o + b, 0, e, true)).collect();
            for (it, &o) in items.iter().zip(&offsets) {
                proptest::prop_assert_eq!(o % it.align, 0);
                all.push((o, o + it.bytes, it.start, it.end, false));
            }
            for (i, a) in all.iter().enumerate() {
                for b in &all[i + 1..] {
                    if a.4 && b.4 {
                        continue;
                    }
                    let live = a.2 < b.3 && b.2 < a.3;
                    let meet = a.0 < b.1 && b.0 < a.1;
                    proptest::prop_assert!(!(live && meet), "{:?} meets {:?}", a, b);
                }
            }
        }
    }
}
