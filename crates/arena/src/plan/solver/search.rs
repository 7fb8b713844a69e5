//! The search behind [`plan`](super::plan) and
//! [`greedy_by_size`](super::greedy_by_size): the problem's items and
//! conflicts, greedy decoding of a placement order, and the local search.

use super::bound::{aligned_bound, Item};
use super::conflicts::{Conflicts, Lifetimes};
use super::min_table::MinTable;
use super::placement::Placement;
use super::{align_up, is_active, stacked, Request, Solution};
use std::cmp::Reverse;
use std::sync::Arc;

/// Greedy by size: requests sorted by size, largest first (ties: earlier
/// start first, then lower index), each placed at the lowest aligned offset
/// where it overlaps no already placed request alive at the same time.
pub fn greedy_by_size(requests: &[Request]) -> Solution {
    let Some(problem) = Problem::new(requests) else {
        return stacked(requests);
    };
    let mut decoder = Decoder::new(&problem, problem.order(OrderKey::Size));
    let _ = decoder.decode(&problem, 0, Fit::First, usize::MAX);
    problem.solution(requests, &decoder.offset)
}

/// The best plan found within a fixed amount of work: never larger than
/// [`greedy_by_size`]'s, usually within a percent of [`lower_bound`](super::lower_bound) on
/// inference traces. Deterministic.
///
/// Tries greedy placement (lowest offset, and tightest gap) under several
/// orders (by size, by size times lifetime, by lifetime, by the live bytes
/// of the busiest moment a buffer spans), then improves the best order by a
/// local search that moves the buffer reaching the top of the plan (and now
/// and then a random one) earlier, re-places the buffers after it, and keeps
/// the change unless the footprint grows. It stops at the lower bound, or
/// when its work budget is spent: about 16 greedy placements, at most about
/// 200 conflict checks per buffer, and at least 4,000,000 units of work (a
/// conflict checked or a buffer placed) for a search of its own, as this
/// one is (about 5-10 ms where the bound is not met). In a release build,
/// 1,000 buffers plan in under 5 ms where they meet the bound and 10,000 in
/// well under a second.
pub fn plan(requests: &[Request]) -> Solution {
    plan_hinted(requests, None, Depth::Quick, Placement::Lowest).0
}

/// How far a search started from a hint goes where the hint leaves the
/// plan loose (more than a sixty-fourth over the bound).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Depth {
    /// The usual budget: a plan predicted for a key on its run's path.
    Quick,
    /// On to a search of its own's budget ([`FIRST_WORK`]): a key's own
    /// plan, learned from its run, which serves every later run of it.
    /// BERT-base on a GPU at 8x512, searched from 8x128's order, packed at
    /// 1.091x its bound, and a kept prediction became the key's plan so.
    Settled,
}

/// Where a search of [`plan_hinted`] ended: the placement order it ended
/// on (request indices; it places as well as the best it found) and the
/// fit that places it. Runs of one structure at other shapes have the same
/// requests in the same lifetimes at other sizes, so the order that packs
/// one shape well is a good start for the next: each search goes on from
/// where the last one stopped, so a structure planned at many shapes is
/// searched for many budgets' worth, each plan costing one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hint {
    order: Vec<u32>,
    fit: Fit,
    /// The structure's lifetimes and their conflicts, shared by its plans
    /// at every shape (used when a plan's requests live as these do).
    lifetimes: Arc<Lifetimes>,
    /// Searches so far: each draws other random moves, so that the next
    /// goes on where the last one stopped rather than repeating it.
    round: u64,
}

/// [`plan`], starting from `hint` (the order a search of the same
/// structure ended on; ignored unless it orders exactly the requests that
/// take part) as well as from its usual orders, with the same work budget.
/// Never worse than `plan` started from the hint's placement alone, nor
/// than greedy by size, nor, where `placement` has a leeway
/// ([`Placement::leeway`]), than that fraction over the plan `Lowest`
/// would find. Returns the solution and the order to start the next
/// search of the structure from.
pub(crate) fn plan_hinted(
    requests: &[Request],
    hint: Option<&Hint>,
    depth: Depth,
    placement: Placement,
) -> (Solution, Option<Hint>) {
    let Some(problem) = Problem::new_with(requests, hint.map(|h| &h.lifetimes)) else {
        return (stacked(requests), None);
    };
    let (start, round) = match hint.and_then(|h| Some((problem.items_in(&h.order)?, h))) {
        Some((order, h)) => (Some((order, h.fit)), h.round.wrapping_add(1)),
        // No hint, or one of other requests: a search of its own.
        None => (None, 0),
    };
    let mut search = Search::new(&problem);
    let hinted = search.run(&problem, start, round);
    if depth == Depth::Settled && search.best > problem.bound.saturating_add(problem.bound / 64) {
        search.budget = search.budget.max(FIRST_WORK);
        search.improve(&problem, round);
    }
    // The run's own order where it is as low (within the placement's
    // leeway, where it has one); else as long a start of it as keeps the
    // footprint; else outputs low.
    let order = problem.run_order();
    let leeway = placement.leeway();
    let within = leeway.map_or(0, |n| search.best / n);
    // With a leeway, the run's order is placed at every shape (one greedy
    // placement, stopped at the leeway): whether it is close at one shape
    // says little of the next.
    let dynamic = search.as_dynamic(&problem, &order, !hinted || leeway.is_some(), within)
        || search.dynamic_start(&problem, &order, !hinted);
    if !dynamic {
        search.settle(&problem);
    }
    let last = if search.walk.is_empty() {
        &search.best_order
    } else {
        &search.walk
    };
    let hint = Hint {
        order: last
            .iter()
            .map(|&i| problem.items[i as usize].request as u32)
            .collect(),
        fit: search.best_fit,
        round,
        lifetimes: Arc::clone(&problem.lifetimes),
    };
    if !dynamic {
        problem.lasting_low(&mut search.best_offset);
    }
    (problem.solution(requests, &search.best_offset), Some(hint))
}

/// Whether `offsets` (one per request) are the run's own order's, each
/// request in the smallest gap between those live at its start: where a
/// dynamic arena's best fit would put them.
#[cfg(test)]
pub(crate) fn is_run_order(requests: &[Request], offsets: &[usize]) -> bool {
    run_order_start(requests, offsets) == requests.len()
}

/// How many of the first requests `offsets` (one per request) place where
/// the run's own order does ([`is_run_order`]): a run that leaves its plan
/// before its allocation of that index has its live blocks where a dynamic
/// arena would have them. (Requests that take no part, placed anywhere,
/// count.) `0` where the requests cannot be planned.
pub(crate) fn run_order_start(requests: &[Request], offsets: &[usize]) -> usize {
    let Some(problem) = Problem::new(requests) else {
        return 0;
    };
    let mut decoder = Decoder::new(&problem, problem.run_order());
    if decoder.decode(&problem, 0, Fit::Best, usize::MAX).is_none() {
        return 0;
    }
    // Items are in request order, which is the run's (by start).
    problem
        .items
        .iter()
        .zip(&decoder.offset)
        .find(|(it, &at)| offsets.get(it.request) != Some(&at))
        .map_or(requests.len(), |(it, _)| it.request)
}

/// The planning problem: the active requests and their conflicts.
#[derive(Debug)]
struct Problem {
    items: Vec<Item>,
    /// The items' lifetimes and conflicts (perhaps shared with other
    /// shapes of the structure).
    lifetimes: Arc<Lifetimes>,
    /// Footprint of the inactive requests (all placed at offset 0).
    idle: usize,
    /// The lower bound over the active items.
    bound: usize,
}

impl Problem {
    /// `None` when there are too many requests to index with `u32`.
    fn new(requests: &[Request]) -> Option<Problem> {
        Self::new_with(requests, None)
    }

    /// [`Problem::new`], reusing `known` lifetimes where the active
    /// requests live as they say.
    fn new_with(requests: &[Request], known: Option<&Arc<Lifetimes>>) -> Option<Problem> {
        u32::try_from(requests.len()).ok()?;
        let mut items = Vec::with_capacity(requests.len());
        let mut idle = 0;
        for (request, r) in requests.iter().enumerate() {
            if is_active(r) {
                let mask = r.effective_align() - 1;
                let (size, start, end) = (r.size, r.start, r.end);
                items.push(Item {
                    size,
                    mask,
                    start,
                    end,
                    request,
                });
            } else {
                idle = idle.max(r.size);
            }
        }
        let spans = || items.iter().map(|it| (it.request, it.start, it.end));
        let lifetimes = match known {
            Some(known) if known.matches(spans()) => Arc::clone(known),
            _ => Arc::new(Lifetimes::new(spans().collect())),
        };
        let bound = aligned_bound(&items).max(idle);
        Some(Problem {
            items,
            lifetimes,
            idle,
            bound,
        })
    }

    fn len(&self) -> usize {
        self.items.len()
    }

    /// `order` (request indices) as an order of this problem's items, if it
    /// names each item exactly once and nothing else.
    fn items_in(&self, order: &[u32]) -> Option<Vec<u32>> {
        if order.len() != self.len() {
            return None;
        }
        // Items are in request order: the last names the most requests.
        let requests = self.items.last().map_or(0, |it| it.request + 1);
        let mut item_of = vec![u32::MAX; requests];
        for (i, it) in self.items.iter().enumerate() {
            item_of[it.request] = i as u32;
        }
        // Each request is taken out once found: a second mention fails.
        order
            .iter()
            .map(|&r| {
                let slot = item_of.get_mut(r as usize)?;
                let i = core::mem::replace(slot, u32::MAX);
                (i != u32::MAX).then_some(i)
            })
            .collect()
    }

    /// Turns per-item offsets into a solution over all requests.
    fn solution(&self, requests: &[Request], offset: &[usize]) -> Solution {
        let mut offsets = vec![0; requests.len()];
        let mut size = self.idle;
        for (item, &at) in self.items.iter().zip(offset) {
            offsets[item.request] = at;
            size = size.max(at.saturating_add(item.size));
        }
        Solution { offsets, size }
    }

    /// The items sorted by `key` (ties: earlier start, then lower index).
    fn order(&self, key: OrderKey) -> Vec<u32> {
        let mut order: Vec<u32> = (0..self.len() as u32).collect();
        let items = &self.items;
        let tie = |i: u32| (items[i as usize].start, i);
        match key {
            OrderKey::Size => order.sort_by_key(|&i| (Reverse(items[i as usize].size), tie(i))),
            OrderKey::Area => order.sort_by_key(|&i| {
                let it = &items[i as usize];
                let area = it.size as u128 * it.length() as u128;
                (Reverse(area), Reverse(it.size), tie(i))
            }),
            OrderKey::Length => order.sort_by_key(|&i| {
                let it = &items[i as usize];
                (Reverse(it.length()), Reverse(it.size), tie(i))
            }),
            OrderKey::Breadth => {
                let rank = self.breadth_ranks();
                order.sort_by_key(|&i| (rank[i as usize], Reverse(items[i as usize].size), tie(i)));
            }
        }
        order
    }

    /// For each item, the rank (0 = most bytes live) of the busiest moment
    /// of its lifetime, for the greedy-by-breadth order.
    fn breadth_ranks(&self) -> Vec<u32> {
        let mut points: Vec<usize> = self.items.iter().map(|it| it.start).collect();
        points.sort_unstable();
        points.dedup();
        let span = |it: &Item| {
            let lo = points.partition_point(|&p| p < it.start);
            let hi = points.partition_point(|&p| p < it.end);
            (lo, hi)
        };
        let mut delta = vec![0i128; points.len() + 1];
        for it in &self.items {
            let (lo, hi) = span(it);
            delta[lo] += it.size as i128;
            delta[hi] -= it.size as i128;
        }
        let mut live = 0i128;
        let sums: Vec<i128> = delta[..points.len()]
            .iter()
            .map(|d| {
                live += d;
                live
            })
            .collect();
        let mut by_sum: Vec<u32> = (0..points.len() as u32).collect();
        by_sum.sort_by_key(|&p| (Reverse(sums[p as usize]), p));
        let mut rank = vec![0u32; points.len()];
        for (r, &p) in by_sum.iter().enumerate() {
            rank[p as usize] = r as u32;
        }
        let table = MinTable::new(rank);
        self.items
            .iter()
            .map(|it| {
                let (lo, hi) = span(it);
                table.min(lo, hi)
            })
            .collect()
    }
}

/// Orders tried by [`plan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OrderKey {
    /// Largest first.
    Size,
    /// Largest size times lifetime first.
    Area,
    /// Longest lifetime first, then largest.
    Length,
    /// Items of the busiest moments first, largest first within one.
    Breadth,
}

/// Where a buffer goes among the gaps between the conflicting buffers
/// already placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fit {
    /// The lowest offset.
    First,
    /// The smallest gap that holds it (the top when none does).
    Best,
}

/// Places items in a given order, and can redo the placement from any
/// position of the order on (earlier positions keep their offsets).
#[derive(Debug, Clone)]
struct Decoder {
    /// Placement order (item indices).
    order: Vec<u32>,
    /// `pos[i]` is the position of item `i` in `order`.
    pos: Vec<u32>,
    /// Offset of each item (valid for the placed positions).
    offset: Vec<usize>,
    /// `top[k]`: footprint after placing `order[..=k]`.
    top: Vec<usize>,
    /// Scratch: the ranges of the placed conflicts of one item.
    ranges: Vec<(usize, usize)>,
    /// Placed items sorted by offset (for [`Conflicts::Dense`] only).
    by_offset: Vec<u32>,
    /// Work done so far (conflicts visited plus items placed).
    work: u64,
}

impl Decoder {
    fn new(problem: &Problem, order: Vec<u32>) -> Decoder {
        let n = problem.len();
        let mut decoder = Decoder {
            order,
            pos: vec![0; n],
            offset: vec![0; n],
            top: vec![0; n],
            ranges: Vec::new(),
            by_offset: Vec::new(),
            work: 0,
        };
        for (k, &i) in decoder.order.iter().enumerate() {
            decoder.pos[i as usize] = k as u32;
        }
        decoder
    }

    /// The footprint of the first `k` placed items.
    fn top_before(&self, k: usize) -> usize {
        if k == 0 {
            0
        } else {
            self.top[k - 1]
        }
    }

    /// Places `order[from..]`; `None` (leaving the placement partial) as
    /// soon as the footprint exceeds `limit`.
    fn decode(&mut self, problem: &Problem, from: usize, fit: Fit, limit: usize) -> Option<usize> {
        if let Conflicts::Dense = *problem.lifetimes.conflicts {
            self.by_offset.clear();
            self.by_offset.extend_from_slice(&self.order[..from]);
            let offset = &self.offset;
            self.by_offset.sort_unstable_by_key(|&j| offset[j as usize]);
        }
        let mut top = self.top_before(from);
        for k in from..self.order.len() {
            let i = self.order[k];
            let item = &problem.items[i as usize];
            let at = match &*problem.lifetimes.conflicts {
                Conflicts::Lists { first, targets } => {
                    let list = &targets[first[i as usize]..first[i as usize + 1]];
                    self.place_listed(&problem.items, list, i, k as u32, fit)
                }
                Conflicts::Dense => self.place_scanned(&problem.items, i, fit),
            };
            self.offset[i as usize] = at;
            top = top.max(at.saturating_add(item.size));
            self.top[k] = top;
            if top > limit {
                return None;
            }
        }
        Some(top)
    }

    /// The offset for item `i` at position `k`, gathering the placed
    /// conflicts from its list.
    fn place_listed(&mut self, items: &[Item], list: &[u32], i: u32, k: u32, fit: Fit) -> usize {
        let (pos, offset, ranges) = (&self.pos, &self.offset, &mut self.ranges);
        ranges.clear();
        for &j in list {
            if pos[j as usize] < k {
                let at = offset[j as usize];
                ranges.push((at, at.saturating_add(items[j as usize].size)));
            }
        }
        self.work += list.len() as u64 + 1;
        ranges.sort_unstable_by_key(|r| r.0);
        let item = &items[i as usize];
        find_gap(ranges.iter().copied(), item.size, item.mask, fit)
    }

    /// The offset for item `i`, scanning every placed item in offset order;
    /// then records `i` as placed.
    fn place_scanned(&mut self, items: &[Item], i: u32, fit: Fit) -> usize {
        let item = &items[i as usize];
        let offset = &self.offset;
        let ranges = self.by_offset.iter().filter_map(|&j| {
            let other = &items[j as usize];
            let overlaps = other.start < item.end && item.start < other.end;
            let at = offset[j as usize];
            overlaps.then(|| (at, at.saturating_add(other.size)))
        });
        let at = find_gap(ranges, item.size, item.mask, fit);
        let index = self
            .by_offset
            .partition_point(|&j| offset[j as usize] <= at);
        self.by_offset.insert(index, i);
        // A scan step costs about a quarter of a listed conflict.
        self.work += self.by_offset.len() as u64 / 4 + 1;
        at
    }
}

/// The aligned offset for `size` bytes among `ranges` (sorted by start).
fn find_gap(
    ranges: impl Iterator<Item = (usize, usize)>,
    size: usize,
    mask: usize,
    fit: Fit,
) -> usize {
    let mut floor = 0usize;
    let mut best: Option<(usize, usize)> = None; // (gap length, offset)
    for (lo, hi) in ranges {
        let at = align_up(floor, mask);
        if at <= lo && lo - at >= size {
            match fit {
                Fit::First => return at,
                Fit::Best => {
                    let gap = lo - floor;
                    if best.is_none_or(|(g, _)| gap < g) {
                        best = Some((gap, at));
                    }
                }
            }
        }
        floor = floor.max(hi);
    }
    best.map_or_else(|| align_up(floor, mask), |(_, at)| at)
}

/// A small deterministic random number generator (SplitMix64).
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Work budget of [`plan`]: this many times the work of one greedy
/// placement...
const SEARCH_ROUNDS: u64 = 16;
/// ...but at least this much (small problems are cheap)...
const MIN_WORK: u64 = 50_000;
/// ...and at most this much per buffer (a few milliseconds per 1,000).
const MAX_WORK_PER_ITEM: u64 = 200;
/// A search of its own (no hint of its requests: a structure's first, as
/// nothing searched it before) goes on to at least this much work where it
/// has not met the lower bound (about 5-10 ms, once per structure): the
/// searches of its later shapes start where it ended, with the budget
/// above. A transformer's layers (BERT-base on a GPU, 205 buffers:
/// feed-forward pairs of 48 MiB between 12 MiB blocks that span two layers)
/// packed at 1.091x the bound with 50,000, at the bound with 2,000,000 to
/// 4,000,000.
const FIRST_WORK: u64 = 4_000_000;

/// Seed of the local search's random moves (fixed: plans are
/// deterministic).
const SEED: u64 = 0x005E_ED0F_A11C_A7E5;

/// The state of [`plan`]'s search.
struct Search {
    /// Best footprint so far.
    best: usize,
    best_offset: Vec<usize>,
    best_order: Vec<u32>,
    best_fit: Fit,
    /// The order the local search ended on, when it placed as the best
    /// (empty otherwise): the next search of the structure goes on from
    /// there.
    walk: Vec<u32>,
    /// Work done so far.
    spent: u64,
    /// Work allowed.
    budget: u64,
}

impl Search {
    fn new(problem: &Problem) -> Search {
        Search {
            best: usize::MAX,
            best_offset: vec![0; problem.len()],
            best_order: Vec::new(),
            best_fit: Fit::First,
            walk: Vec::new(),
            spent: 0,
            budget: 0,
        }
    }

    fn done(&self, problem: &Problem) -> bool {
        self.spent >= self.budget || self.best <= problem.bound
    }

    /// The search: greedy by size, the other orders, then the local search
    /// from the best. With `start` (where an earlier search of the
    /// structure ended), odd rounds go on from it (it is placed first, and
    /// the local search walks on from it if it is the best); even rounds
    /// search afresh, with other random moves, and take it at the end only
    /// if it is still better: a walk that went on from a plateau can stay
    /// on it, and a fresh walk often leaves it.
    ///
    /// Whether the start alone placed it (at the lower bound: no search).
    fn run(&mut self, problem: &Problem, start: Option<(Vec<u32>, Fit)>, round: u64) -> bool {
        // A search of its own (no start) is a structure's first: a deep one.
        let deep = start.is_none();
        // Where an earlier search of the structure ended places this shape
        // at its lower bound (a structure's shapes mostly pack alike): no
        // other order can do better, so nothing else is tried. One
        // placement instead of a search, for a plan predicted on the
        // request's path.
        if let Some((order, fit)) = &start {
            let mut decoder = Decoder::new(problem, order.clone());
            if let Some(top) = decoder.decode(problem, 0, *fit, problem.bound) {
                self.keep(&decoder, top, *fit);
                self.spent = decoder.work;
                return true;
            }
        }
        // Greedy by size first, kept whatever its size.
        let mut greedy = Decoder::new(problem, problem.order(OrderKey::Size));
        let top = greedy
            .decode(problem, 0, Fit::First, usize::MAX)
            .unwrap_or(usize::MAX);
        self.keep(&greedy, top, Fit::First);
        self.spent = greedy.work;
        let most = (problem.len() as u64).saturating_mul(MAX_WORK_PER_ITEM);
        self.budget = greedy
            .work
            .saturating_mul(SEARCH_ROUNDS)
            .min(most)
            .max(if deep { FIRST_WORK } else { MIN_WORK });
        let (first, last) = match start {
            Some(start) if round % 2 == 1 => (Some(start), None),
            start => (None, start),
        };
        // (Neither is placed once the best is at the lower bound.)
        if let Some((order, fit)) = first.filter(|_| self.best > problem.bound) {
            self.try_order(problem, order, fit, self.best);
        }
        self.search(problem, round);
        if let Some((order, fit)) = last.filter(|_| self.best > problem.bound) {
            let (best, walk) = (self.best, self.walk.len());
            self.try_order(problem, order, fit, self.best.saturating_sub(1));
            if self.best < best || walk == 0 {
                self.walk.clear();
            }
        }
        false
    }

    /// Places `order` with `fit`, kept if its footprint is at most `limit`
    /// (and so at most the best's).
    fn try_order(&mut self, problem: &Problem, order: Vec<u32>, fit: Fit, limit: usize) {
        let mut decoder = Decoder::new(problem, order);
        if let Some(top) = decoder.decode(problem, 0, fit, limit) {
            self.keep(&decoder, top, fit);
        }
        self.spent += decoder.work;
    }

    /// The other orders, then the local search from the best so far.
    fn search(&mut self, problem: &Problem, round: u64) {
        let candidates = [
            (OrderKey::Size, Fit::Best),
            (OrderKey::Breadth, Fit::Best),
            (OrderKey::Area, Fit::First),
            (OrderKey::Breadth, Fit::First),
            (OrderKey::Area, Fit::Best),
            (OrderKey::Length, Fit::First),
            (OrderKey::Length, Fit::Best),
        ];
        for (key, fit) in candidates {
            if self.done(problem) {
                return;
            }
            let order = problem.order(key);
            self.try_order(problem, order, fit, self.best.saturating_sub(1));
        }
        self.improve(problem, round);
    }

    fn keep(&mut self, decoder: &Decoder, top: usize, fit: Fit) {
        self.best = top;
        self.best_offset.copy_from_slice(&decoder.offset);
        self.best_order.clone_from(&decoder.order);
        self.best_fit = fit;
    }

    /// Local search on the best order: move a buffer that reaches the top
    /// of the plan (or a random one) to an earlier position, re-place from
    /// there, keep the change if the footprint does not grow.
    fn improve(&mut self, problem: &Problem, round: u64) {
        let n = problem.len();
        if n < 2 || self.done(problem) {
            return;
        }
        let fit = self.best_fit;
        // Redo the best placement so that it can be changed from any position.
        let mut decoder = Decoder::new(problem, self.best_order.clone());
        let mut current = decoder
            .decode(problem, 0, fit, usize::MAX)
            .unwrap_or(usize::MAX);
        // Each round its own stream (the round hashed, not added: seeds a
        // multiple of the generator's step apart share their streams).
        let mut rng = Rng(SEED ^ n as u64 ^ Rng(round).next());
        let mut saved_offsets: Vec<usize> = Vec::new();
        let mut saved_top: Vec<usize> = Vec::new();
        let start = self.spent;
        while !self.done(problem) {
            let (from, to) = pick_move(&decoder, current, &mut rng);
            if from == to {
                continue;
            }
            let low = from.min(to);
            save_suffix(&decoder, low, &mut saved_offsets, &mut saved_top);
            move_item(&mut decoder, from, to);
            match decoder.decode(problem, low, fit, current) {
                Some(top) => {
                    current = top;
                    if top < self.best {
                        self.keep(&decoder, top, fit);
                    }
                }
                None => {
                    move_item(&mut decoder, to, from);
                    restore_suffix(&mut decoder, low, &saved_offsets, &saved_top);
                }
            }
            self.spent = start + decoder.work;
        }
        // The walk's order places as the best does (a move is kept only
        // if the footprint does not grow) but is where the walk stands.
        if current == self.best {
            self.walk.clone_from(&decoder.order);
        }
    }
}

/// Chooses a move `(from, to)` of one position of the order: mostly the
/// first buffer whose placement reached the footprint, sometimes a random
/// one, moved to a random earlier position.
fn pick_move(decoder: &Decoder, current: usize, rng: &mut Rng) -> (usize, usize) {
    let n = decoder.order.len();
    let from = if rng.below(4) == 0 {
        rng.below(n)
    } else {
        decoder.top.partition_point(|&t| t < current).min(n - 1)
    };
    let to = if from == 0 {
        rng.below(n)
    } else {
        rng.below(from)
    };
    (from, to)
}

/// Moves `order[from]` to position `to`, shifting the ones between.
fn move_item(decoder: &mut Decoder, from: usize, to: usize) {
    if from < to {
        decoder.order[from..=to].rotate_left(1);
    } else {
        decoder.order[to..=from].rotate_right(1);
    }
    let low = from.min(to);
    let high = from.max(to);
    for k in low..=high {
        decoder.pos[decoder.order[k] as usize] = k as u32;
    }
}

fn save_suffix(decoder: &Decoder, low: usize, offsets: &mut Vec<usize>, top: &mut Vec<usize>) {
    offsets.clear();
    offsets.extend(
        decoder.order[low..]
            .iter()
            .map(|&i| decoder.offset[i as usize]),
    );
    top.clear();
    top.extend_from_slice(&decoder.top[low..]);
}

fn restore_suffix(decoder: &mut Decoder, low: usize, offsets: &[usize], top: &[usize]) {
    for (&i, &at) in decoder.order[low..].iter().zip(offsets) {
        decoder.offset[i as usize] = at;
    }
    decoder.top[low..].copy_from_slice(top);
}

#[path = "outputs.rs"]
mod outputs;

#[cfg(test)]
#[path = "hint_tests.rs"]
mod hint_tests;
