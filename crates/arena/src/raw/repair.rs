//! A run that leaves its plan's block (the block dissolved, see
//! [`fallback`](super::fallback)) is not left to place the rest of its
//! blocks one at a time, blind to what comes: the plan still says which
//! blocks come and when each is freed. At the dissolution the rest of the
//! plan is placed again around what is live, the block that did not fit at
//! its own size, with no cap: the smallest extent greedy placement finds
//! ([`place`]). Each later block of the run is then offered that place
//! ([`Repair::at`]; a block a little larger than planned keeps its place
//! grown, or goes past the whole placement); the pool takes it when it is
//! free, and places the block as usual otherwise. A place is a hint: what
//! the pool hands out is checked against what is live there, never
//! trusted.
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
/// first block that comes out of order, more than twice what it was placed
/// for (or larger, with no room, [`Repair::at`]) or under half of it ends
/// it (placing the rest again around each guess that
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
    /// Their lives in plan steps (`start..end`, as [`Item`]'s).
    lives: Vec<(usize, usize)>,
    /// The next block expected, from `first`; `usize::MAX` once the run
    /// left the repair.
    next: usize,
    /// Where the placement ends (from `base`): blocks larger than their
    /// places go past it, one after another (`past` bytes so far).
    extent: usize,
    past: usize,
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
        let (offsets, extent) = place(fixed, items);
        let slots = offsets
            .into_iter()
            .zip(items.iter().map(|it| it.bytes))
            .collect();
        let lives = items.iter().map(|it| (it.start, it.end)).collect();
        Repair {
            rid,
            base,
            first,
            slots,
            lives,
            next: 0,
            extent,
            past: 0,
        }
    }

    /// Where the placement ends, from the plan's block's start.
    pub(super) fn extent(&self) -> usize {
        self.extent
    }

    /// Where block `index` of `size` bytes at `align` goes, as `(offset in
    /// the region, offset from the plan's block)`: its place, when it is
    /// no larger and at least half. A block larger than its place (up to
    /// twice it: a size predicted a little short) keeps its place grown
    /// where that meets no other block placed to live with it; else, when
    /// it is at most a sixteenth of the placement, it goes past the whole
    /// placement (after any placed there before), where it is in no later
    /// block's place: the pool's best fit could put it in one, and push
    /// that block past everything (a run of random families 1.39x its
    /// dynamic run so, for a block 128 bytes over its place). `None`, and
    /// none for the rest of the run, otherwise: not the next block
    /// placed, under half its place, more than twice it, or a large one
    /// with no room in its place. The caller allocates block `index` next,
    /// here or elsewhere (a place is a hint the pool checks).
    pub(super) fn at(&mut self, index: usize, size: usize, align: usize) -> Option<(usize, usize)> {
        let slot = index
            .checked_sub(self.first)
            .filter(|&i| i == self.next)
            .and_then(|i| self.slots.get(i));
        match slot {
            Some(&(off, bytes)) if size <= bytes && size >= bytes / 2 => {
                self.next += 1;
                Some((self.base + off, off))
            }
            Some(&(off, bytes)) if size > bytes && size <= bytes.saturating_mul(2) => {
                let i = self.next;
                let (start, end) = self.lives[i];
                let meets = |j: usize| {
                    let (o, b) = self.slots[j];
                    let (s, e) = self.lives[j];
                    j != i && s < end && start < e && o < off.saturating_add(size) && off < o + b
                };
                if !(0..self.slots.len()).any(meets) {
                    // Its place, grown, meets no block live with it.
                    self.next += 1;
                    return Some((self.base + off, off));
                }
                if size > self.extent / 16 {
                    self.next = usize::MAX;
                    return None;
                }
                let at = self
                    .base
                    .checked_add(self.extent)?
                    .checked_add(self.past)?
                    .checked_next_multiple_of(align.max(1))?;
                let off = at - self.base;
                self.past = off.checked_add(size)? - self.extent;
                self.next += 1;
                Some((at, off))
            }
            _ => {
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
/// byte with another while both are live: each at the lowest offset free
/// for its life, the larger blocks first (ties: the earlier first) or in
/// the run's order, whichever reaches less far (the fixed blocks are where
/// no dynamic arena would have them, and in the run's order the blocks
/// freed first fill the room beneath them: over the random families, two
/// more runs that left their plans came within 3% of their dynamic runs).
/// Returns the offsets, by item, and the extent they reach (with the fixed
/// blocks).
pub(super) fn place(fixed: &[Held], items: &[Item]) -> (Vec<usize>, usize) {
    let live_with = live_with(items);
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|&a, &b| {
        items[b]
            .bytes
            .cmp(&items[a].bytes)
            .then(items[a].start.cmp(&items[b].start))
    });
    let by_size = place_in(fixed, items, &order, &live_with);
    order.sort_by_key(|&a| items[a].start);
    let by_start = place_in(fixed, items, &order, &live_with);
    if by_start.1 < by_size.1 {
        by_start
    } else {
        by_size
    }
}

/// [`place`]'s offsets and extent with the items taken in `order`.
fn place_in(
    fixed: &[Held],
    items: &[Item],
    order: &[usize],
    live_with: &LiveWith,
) -> (Vec<usize>, usize) {
    let mut offsets = vec![0usize; items.len()];
    let mut placed = vec![false; items.len()];
    let mut extent = fixed.iter().map(|f| f.0 + f.1).max().unwrap_or(0);
    let mut busy: Vec<(usize, usize)> = Vec::new();
    for &i in order {
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
    fn the_rest_is_placed_in_its_order_where_that_reaches_less_far() {
        // A live block at 128..320 until step 3. Largest first puts the
        // late block at 0 and the early one past the live block (extent
        // 384); in the run's order the early one goes below the live block
        // and the late one on it once it is freed (extent 320).
        let fixed = [(128, 192, 3)];
        let items = [item(128, 3, 5), item(64, 1, 5)];
        let (offsets, extent) = place(&fixed, &items);
        disjoint(&fixed, &items, &offsets);
        assert_eq!((offsets, extent), (vec![64, 0], 320));
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
        assert_eq!(r.at(3, 1024, 64), Some((4096, 0)));
        assert_eq!(r.at(4, 64, 64), Some((4096 + 1024, 1024)));
        assert_eq!(r.at(5, 64, 64), None, "past the plan");
        // A block larger than its place, whose place grown meets a block
        // live with it, and more than a sixteenth of the placement, ends
        // the repair.
        let mut r = Repair::new(0, 4096, 3, &[], &items);
        assert_eq!(r.at(3, 2048, 64), None);
        assert_eq!(r.at(4, 64, 64), None);
        // So does one under half its place (another path through the
        // model).
        let mut r = Repair::new(0, 4096, 3, &[], &items);
        assert_eq!(r.at(3, 448, 64), None);
        assert_eq!(r.at(4, 64, 64), None);
        // So does one out of order.
        let mut r = Repair::new(0, 4096, 3, &[], &items);
        assert_eq!(r.at(4, 64, 64), None);
        assert_eq!(r.at(3, 1024, 64), None);
    }

    #[test]
    fn a_block_a_little_larger_than_its_place_keeps_the_rest_in_theirs() {
        // 4096 bytes, then two of 64, all three live to the end.
        let items = [item(4096, 0, 9), item(64, 1, 9), item(64, 2, 9)];
        let (offsets, extent) = place(&[], &items);
        assert_eq!((offsets.clone(), extent), (vec![0, 4096, 4160], 4224));
        let mut r = Repair::new(0, 1 << 20, 3, &[], &items);
        assert_eq!(r.at(3, 4096, 64), Some((1 << 20, 0)));
        // Block 4 at 128 bytes: its place grown meets block 5's, so it goes
        // past the placement (a sixteenth of it is 264 bytes)...
        assert_eq!(r.at(4, 128, 64), Some(((1 << 20) + 4224, 4224)));
        // ...and block 5 keeps its place; the repair goes on.
        assert_eq!(r.at(5, 64, 64), Some(((1 << 20) + 4160, 4160)));
        // Where nothing lives with it, a larger block keeps its place grown.
        let items = [item(1024, 0, 2), item(1024, 3, 5)];
        let mut r = Repair::new(0, 0, 3, &[], &items);
        assert_eq!(r.at(3, 1536, 64), Some((0, 0)));
        assert_eq!(r.at(4, 1024, 64), Some((0, 0)));
        // A second block past the placement goes after the first, aligned.
        let items = [
            item(4096, 0, 9),
            item(64, 1, 9),
            item(64, 2, 9),
            item(64, 3, 9),
        ];
        let mut r = Repair::new(0, 0, 0, &[], &items);
        assert_eq!(r.at(0, 4096, 64), Some((0, 0)));
        assert_eq!(r.at(1, 100, 64), Some((4288, 4288)));
        assert_eq!(r.at(2, 100, 64), Some((4416, 4416)));
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
