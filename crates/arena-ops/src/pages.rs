//! [`run_pages`]: the operation language on the [`Pages`] memory layer
//! (one reservation, committed in place), through a [`Faulty`] layer that
//! checks every call and keeps its own map of committed granules.
//!
//! Where [`run`](crate::run) knows the `Heap` layer's growth policy exactly,
//! this model checks what holds for any layer that grows in place:
//!
//! - live blocks do not overlap, are aligned, keep their patterns;
//! - a granule that was decommitted reads as zero when a block next covers
//!   it whole;
//! - `reserved` equals the bytes the layer holds committed, and the stats'
//!   call counters equal the layer's;
//! - a request the committed free spans can serve makes no reservation, and
//!   no call at all when nothing is decommitted inside;
//! - every refusal is the documented one (bad size or alignment; over the
//!   cap or past the reservation only when no free span fits; a failed
//!   reserve or commit only when one was injected) and changes no live block;
//! - after a shrink, no whole free granule at or above the target (rounded
//!   up to granules) stays committed, unless a plan's block may pin it;
//! - at the end every reservation went back, with nothing committed.

use crate::checks;
use crate::faulty::{Faulty, Ledger};
use crate::op::{align_from_log2, Op, CAP, GRANULE, MAX_ALIGN, MAX_PLANS, MAX_REQUEST};
use crate::pattern;
use std::cell::RefCell;
use std::sync::Arc;
use tensor_arena::memory::{GiveBack, HugePages, Pages, PagesConfig};
use tensor_arena::plan::Plan;
use tensor_arena::{Arena, ArenaConfig, ArenaError, Block, Coalesce, Run};

type Mem = Faulty<Pages>;

/// A live block of the model.
struct Live<'a> {
    block: Block<'a, Mem>,
    seed: u8,
    planned: bool,
}

/// Runs `ops` twice on `Pages`: capped at [`CAP`] with base pages (4 KiB
/// granules: many holes) and the default policy (freed spans merged at
/// once), and uncapped in an 8 MiB reservation with huge pages where the
/// system offers them (reservation exhaustion), freed spans merged lazily
/// ([`Coalesce::Lazy`]) and decommitted memory given back lazily
/// ([`GiveBack::Lazily`]: its pages come back with what they held, so a
/// commit that wrote into a live block would show in its seed).
///
/// # Panics
/// On the first broken invariant, with the step and operation.
pub fn run_pages(ops: &[Op]) {
    let capped = (
        ArenaConfig {
            max_reserved: CAP,
            ..ArenaConfig::default()
        },
        PagesConfig {
            huge_pages: HugePages::Never,
            ..PagesConfig::default()
        },
    );
    let reserved = (
        ArenaConfig {
            coalesce: Coalesce::Lazy,
            ..ArenaConfig::default()
        },
        PagesConfig {
            reservation: 2 * CAP,
            // Advice whatever the system's defrag setting: the huge page
            // paths are checked wherever THP is on.
            huge_pages: HugePages::Advise,
            give_back: GiveBack::Lazily,
        },
    );
    for (config, pages) in [capped, reserved] {
        let (memory, ledger) = Faulty::new(Pages::new(pages));
        {
            let arena = Arena::with_memory(config, memory).expect("a valid configuration");
            let mut m = Model {
                arena: &arena,
                ledger: &ledger,
                capped: config.max_reserved != usize::MAX,
                live: Vec::new(),
                run: None,
                plans: Vec::new(),
            };
            for (step, op) in ops.iter().enumerate() {
                let at = format!("pages ({}), step {step} ({op:?})", m.mode());
                m.apply(&at, op);
                m.check(&at);
            }
            m.live.clear();
            if let Some((run, ..)) = m.run.take() {
                run.finish();
            }
            assert_eq!(arena.stats().in_use, 0, "pages: bytes in use at the end");
        }
        let l = ledger.borrow();
        assert_eq!(
            l.reservations(),
            0,
            "pages: a reservation outlived the arena"
        );
        assert_eq!(
            l.reserves, l.releases,
            "pages: reserves and releases differ"
        );
    }
}

struct Model<'a> {
    arena: &'a Arena<Mem>,
    ledger: &'a RefCell<Ledger>,
    capped: bool,
    live: Vec<Live<'a>>,
    /// The open run, whether it is planned, and the layer's commit and
    /// decommit counts when it began.
    run: Option<(Run<'a, Mem>, bool, u64, u64)>,
    plans: Vec<Arc<Plan>>,
}

impl<'a> Model<'a> {
    fn mode(&self) -> &'static str {
        if self.capped {
            "capped"
        } else {
            "reservation"
        }
    }

    /// Whether a plan's block may be held (its place is not known here).
    fn plan_block_held(&self) -> bool {
        self.live.iter().any(|l| l.planned) || self.run.as_ref().is_some_and(|r| r.1)
    }

    fn apply(&mut self, at: &str, op: &Op) {
        match *op {
            Op::Alloc { size, align_log2 } => self.alloc(at, size.0, align_from_log2(align_log2)),
            Op::Free { index } => {
                if !self.live.is_empty() {
                    let l = self.live.swap_remove(index as usize % self.live.len());
                    if let Some(i) = pattern::first_mismatch(&l.block, l.seed) {
                        panic!("{at}: pattern lost at +{i} of a block being freed");
                    }
                }
            }
            Op::BeginRun { .. } | Op::BeginPlannedRun { .. } => {
                if self.run.is_some() {
                    return;
                }
                let plan = match *op {
                    Op::BeginPlannedRun { plan } if !self.plans.is_empty() => {
                        Some(Arc::clone(&self.plans[plan as usize % self.plans.len()]))
                    }
                    _ => None,
                };
                let planned = plan.is_some();
                let (commits, decommits) = {
                    let l = self.ledger.borrow();
                    (l.commits, l.decommits)
                };
                let got = match (plan, op) {
                    (Some(p), _) => self.arena.begin_planned_run(p),
                    (None, Op::BeginRun { recorded: false }) => self.arena.try_begin_run(),
                    // A planned run with no plan kept is recorded, as the
                    // first run of a shape is.
                    (None, _) => self.arena.try_begin_recorded_run(),
                };
                match got {
                    Ok(run) => self.run = Some((run, planned, commits, decommits)),
                    Err(e) => assert!(
                        planned
                            && matches!(
                                e,
                                ArenaError::OverCap { .. }
                                    | ArenaError::ReservationExhausted { .. }
                                    | ArenaError::ReserveFailed { .. }
                                    | ArenaError::CommitFailed { .. }
                            ),
                        "{at}: a run refused with {e}"
                    ),
                }
            }
            Op::EndRun => {
                if let Some((run, _, commits, decommits)) = self.run.take() {
                    let (report, rec) = run.finish_with_recording();
                    let l = self.ledger.borrow();
                    assert_eq!(
                        (report.commits, report.decommits),
                        (l.commits - commits, l.decommits - decommits),
                        "{at}: the run's memory calls"
                    );
                    drop(l);
                    if report.leaked_blocks == 0 && !rec.is_empty() {
                        let plan = Plan::from_recording(&rec)
                            .unwrap_or_else(|e| panic!("{at}: the run's recording: {e}"));
                        if self.plans.len() == MAX_PLANS {
                            self.plans.remove(0);
                        }
                        self.plans.push(Arc::new(plan));
                    }
                }
            }
            Op::Shrink => {
                let target = self.arena.stats().watermark;
                self.shrink(at, target, |a| a.shrink());
                // Given back lazily (the second configuration), the pages
                // then leave at once: nothing else changes.
                let before = self.arena.stats();
                let done = self.arena.give_back_now();
                let after = self.arena.stats();
                assert_eq!(done, before.lazily_given_back, "{at}: give_back_now");
                assert_eq!(after.lazily_given_back, 0, "{at}: left lazily given back");
                assert_eq!(
                    (after.reserved, after.in_use, after.live_blocks),
                    (before.reserved, before.in_use, before.live_blocks),
                    "{at}: give_back_now changed the arena"
                );
            }
            Op::ShrinkTo { kib } => {
                let target = kib as usize * 1024;
                self.shrink(at, target, |a| a.shrink_to(target));
            }
            Op::ShrinkForPlans { plan } => {
                let block = match self.plans.len() {
                    0 => 0,
                    n => self.plans[plan as usize % n].size(),
                };
                self.shrink_for_plans(at, block);
            }
            Op::FailBacking { calls } => {
                self.ledger.borrow_mut().fail_next += u64::from(calls % 4);
            }
            Op::Collection { len } => {
                let mut v = tensor_arena::allocator_api2::vec::Vec::<u32, _>::new_in(self.arena);
                for i in 0..u32::from(len % 2048) {
                    if v.try_reserve(1).is_err() {
                        break;
                    }
                    v.push(i ^ 0x5a5a);
                }
                if v.capacity() > 0 {
                    // What the collection wrote is no longer zero.
                    self.ledger
                        .borrow_mut()
                        .take_zero_granules(v.as_ptr() as usize, v.capacity() * 4);
                }
                for (i, &x) in v.iter().enumerate() {
                    assert_eq!(x, i as u32 ^ 0x5a5a, "{at}: collection element {i}");
                }
            }
            // Sessions and shared arenas run on `Heap` in `run`.
            Op::SessionClone | Op::SessionDrop { .. } | Op::SessionRun { .. } => {}
            // The core's handles are checked once, in `run`.
            Op::Shared { .. } | Op::Raw { .. } => {}
        }
    }

    fn alloc(&mut self, at: &str, len: usize, align: usize) {
        let before = self.arena.stats();
        // Whether the arena may hold decommitted holes (`Stats::free_bytes`
        // leaves them out, so the layer's map says).
        let no_holes = self.ledger.borrow().uncommitted_below_high_mark() == 0;
        let fail_pending = self.ledger.borrow().fail_next > 0;
        let got = self.arena.try_alloc_aligned(len, align);
        let after = self.arena.stats();
        let rounded = len.checked_next_multiple_of(GRANULE).unwrap_or(usize::MAX);
        let fits_cache = align <= GRANULE && rounded <= before.largest_free_block;
        match got {
            Ok(block) if len == 0 => {
                assert!(block.is_empty(), "{at}");
                assert_eq!(after, before, "{at}: an empty block changed stats");
            }
            Ok(mut block) => {
                assert!(align.is_power_of_two() && align <= MAX_ALIGN, "{at}");
                assert_eq!(block.capacity(), rounded, "{at}: block size");
                assert_eq!(after.in_use, before.in_use + rounded, "{at}: in_use");
                let planned = after.planned_allocs > before.planned_allocs;
                if fits_cache || planned {
                    assert_eq!(
                        after.backing_allocs, before.backing_allocs,
                        "{at}: reserved again"
                    );
                    if !self.plan_block_held() && no_holes {
                        assert_eq!(
                            after.memory_calls(),
                            before.memory_calls(),
                            "{at}: a memory call for a request committed memory could serve"
                        );
                    }
                }
                // Granules decommitted since last written read as zero
                // (given back lazily, they may hold what they held).
                let addr = block.as_ptr() as usize;
                let zero = self
                    .ledger
                    .borrow_mut()
                    .take_zero_granules(addr, block.len());
                let zeroed = self.arena.memory_props().zeroed;
                for (g, n) in zero.into_iter().filter(|_| zeroed) {
                    let from = g - addr;
                    if let Some(i) = block[from..from + n].iter().position(|&b| b != 0) {
                        panic!(
                            "{at}: a recommitted granule at {g:#x} reads {:#x} at +{i}",
                            block[from + i]
                        );
                    }
                }
                let seed = (at.len() as u8)
                    .wrapping_mul(31)
                    .wrapping_add(rounded as u8)
                    | 1;
                pattern::fill(&mut block, seed);
                self.live.push(Live {
                    block,
                    seed,
                    planned,
                });
            }
            Err(e) => {
                let ok = match e {
                    ArenaError::InvalidAlignment { .. } => !align.is_power_of_two(),
                    ArenaError::AlignmentTooLarge { .. } => align > MAX_ALIGN,
                    ArenaError::CapacityOverflow { .. } => rounded > MAX_REQUEST,
                    ArenaError::OverCap { limit, .. } => self.capped && limit == CAP && !fits_cache,
                    // Capped, the reservation is the cap unless reserving
                    // it failed (an injected failure halves it): then a
                    // request past the smaller reservation is this.
                    ArenaError::ReservationExhausted { reservation, .. } => {
                        (!self.capped || reservation < CAP) && !fits_cache
                    }
                    ArenaError::ReserveFailed { .. } | ArenaError::CommitFailed { .. } => {
                        fail_pending
                    }
                    _ => false,
                };
                assert!(
                    ok,
                    "{at}: unexpected {e:?} (largest free {})",
                    before.largest_free_block
                );
                assert_eq!(
                    (
                        after.in_use,
                        after.live_blocks,
                        after.allocs,
                        after.reserved
                    ),
                    (
                        before.in_use,
                        before.live_blocks,
                        before.allocs,
                        before.reserved
                    ),
                    "{at}: a refused request changed the arena"
                );
            }
        }
    }

    /// The free gaps between live blocks, as offsets from `base` in
    /// address order, and where the highest live block ends.
    fn free_gaps(&self, base: usize) -> (Vec<(usize, usize)>, usize) {
        let mut live: Vec<(usize, usize)> = self
            .live
            .iter()
            .filter(|l| !l.block.is_empty())
            .map(|l| (l.block.as_ptr() as usize - base, l.block.capacity()))
            .collect();
        live.sort_unstable();
        let mut gaps = Vec::new();
        let mut used_end = 0;
        for (a, n) in live {
            if a > used_end {
                gaps.push((used_end, a));
            }
            used_end = used_end.max(a + n);
        }
        (gaps, used_end)
    }

    /// `shrink_for_plans(block)`: what stays committed is the live
    /// blocks' granules, the free spans between them that can hold the
    /// block, and the top up to the block (none of it when a span below
    /// holds the block): no whole granule of a smaller free span between
    /// live blocks, and none past that top.
    fn shrink_for_plans(&mut self, at: &str, block: usize) {
        let before = self.arena.stats();
        let base = self.ledger.borrow().bases().first().copied();
        let released = self.arena.shrink_for_plans(block);
        let after = self.arena.stats();
        checks::shrink_accounting(&at, &before, &after, released);
        let (Some(base), false) = (base, self.plan_block_held()) else {
            return;
        };
        if after.reserved == 0 {
            assert_eq!(after.in_use, 0, "{at}: released with blocks live");
            return;
        }
        let props = self.arena.memory_props();
        let up = |x: usize| x.next_multiple_of(props.commit_step(x));
        let block = block.next_multiple_of(self.arena.config().alignment);
        let (gaps, used_end) = self.free_gaps(base);
        let held = gaps.iter().any(|&(a, b)| b - a >= block);
        let keep_top = up(used_end + if held { 0 } else { block });
        let committed = self.ledger.borrow().committed_granules();
        let prefix = committed
            .iter()
            .map(|&(a, n)| a + n - base)
            .max()
            .unwrap_or(0);
        let hs = props.commit_step(prefix);
        for (addr, _) in committed {
            let o = addr - base;
            assert!(
                o < keep_top,
                "{at}: granule at +{o:#x} committed past the top kept for a block of \
                 {block:#x} ({keep_top:#x})"
            );
            for &(fa, fb) in gaps.iter().filter(|&&(a, b)| b - a < block) {
                let (lo, hi) = (fa.next_multiple_of(hs), fb / hs * hs);
                assert!(
                    !(lo <= o && o < hi),
                    "{at}: granule at +{o:#x} of the free span {fa:#x}..{fb:#x}, too small \
                     for a block of {block:#x}, is committed"
                );
            }
        }
    }

    fn shrink(&mut self, at: &str, target: usize, f: impl FnOnce(&Arena<Mem>) -> usize) {
        let before = self.arena.stats();
        let base = self.ledger.borrow().bases().first().copied();
        // The committed prefix: up to the end of the highest committed
        // granule (decommitted holes never reach the top).
        let prefix = |m: &Self, base: usize| {
            m.ledger
                .borrow()
                .committed_granules()
                .iter()
                .map(|&(a, n)| a + n - base)
                .max()
                .unwrap_or(0)
        };
        let prefix_before = base.map_or(0, |b| prefix(self, b));
        // The decommitted holes below the prefix, as offsets, in order.
        let holes_before: Vec<(usize, usize)> = base.map_or_else(Vec::new, |b| {
            let mut granules = self.ledger.borrow().committed_granules();
            granules.sort_unstable();
            let mut holes = Vec::new();
            let mut at = 0;
            for (a, n) in granules {
                if a - b > at {
                    holes.push((at, a - b - at));
                }
                at = a - b + n;
            }
            holes
        });
        let released = f(self.arena);
        let after = self.arena.stats();
        checks::shrink_accounting(&at, &before, &after, released);
        if self.plan_block_held() {
            return;
        }
        let Some(base) = base else {
            assert_eq!(after.reserved, 0, "{at}: reserved with no reservation");
            return;
        };
        // What the arena promises, in offsets: the top is cut to the target
        // (or the highest live block) in commit steps, and every whole
        // step-aligned part of a free gap between live blocks at or above
        // the target is decommitted. Holes below count for nothing: the
        // target is where `target` committed bytes end.
        let props = self.arena.memory_props();
        let up = |x: usize| x.next_multiple_of(props.commit_step(x));
        let (gaps, used_end) = self.free_gaps(base);
        let keep_from = {
            let mut x = up(target);
            for &(h, l) in &holes_before {
                if h >= x {
                    break;
                }
                x += l;
            }
            if x == up(target) {
                x
            } else {
                up(x)
            }
        };
        let keep_top = keep_from.max(up(used_end));
        assert!(
            after.reserved >= before.reserved.min(up(target)),
            "{at}: {} committed after a shrink to {target:#x} (from {}): more given back \
             than asked",
            after.reserved,
            before.reserved
        );
        let hs = props.commit_step(prefix_before.min(keep_top));
        for (addr, _) in self.ledger.borrow().committed_granules() {
            let o = addr - base;
            assert!(
                o < keep_top,
                "{at}: granule at +{o:#x} committed above the kept top {keep_top:#x}"
            );
            for &(fa, fb) in &gaps {
                let (lo, hi) = (fa.next_multiple_of(hs).max(keep_from), fb / hs * hs);
                assert!(
                    !(lo <= o && o < hi),
                    "{at}: granule at +{o:#x} is free (gap {fa:#x}..{fb:#x}), above the \
                     target {target:#x}, and committed"
                );
            }
        }
    }

    fn check(&self, at: &str) {
        #[cfg(any(fuzzing, feature = "check-invariants"))]
        self.arena.check_invariants();
        let st = self.arena.stats();
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        for l in &self.live {
            if l.block.is_empty() {
                continue;
            }
            let addr = l.block.as_ptr() as usize;
            assert_eq!(addr % GRANULE, 0, "{at}: block at {addr:#x} misaligned");
            if let Some(i) = pattern::first_mismatch(&l.block, l.seed) {
                panic!("{at}: pattern lost at {addr:#x}+{i}");
            }
            ranges.push((addr, addr + l.block.capacity()));
        }
        let sum = checks::disjoint(&at, "blocks", &mut ranges);
        assert_eq!(st.in_use, sum, "{at}: in_use is not the sum of live blocks");
        assert!(st.in_use <= st.reserved, "{at}: in_use over reserved");
        checks::free_bytes(&at, &st);
        if self.capped {
            assert!(st.reserved <= CAP, "{at}: reserved over the cap");
        }
        let l = self.ledger.borrow();
        assert_eq!(
            l.committed(),
            st.reserved,
            "{at}: committed bytes vs reserved"
        );
        assert_eq!(
            (
                st.backing_allocs,
                st.backing_frees,
                st.commits,
                st.decommits
            ),
            (l.reserves, l.releases, l.commits, l.decommits),
            "{at}: memory calls"
        );
        assert!(l.reservations() <= 1, "{at}: more than one reservation");
        assert_eq!(st.regions, l.reservations(), "{at}: regions");
    }
}
