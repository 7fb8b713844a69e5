//! Which requests are alive at the same time: the conflict lists the
//! placement walks. They depend on the lifetimes alone, so every shape of
//! one run structure shares them ([`Lifetimes`]): a plan predicted for a
//! new shape reuses its structure's lists instead of sorting and sweeping
//! again.

use std::sync::{Arc, OnceLock};

/// Conflict lists with at most this many entries (two per conflicting
/// pair) may be built up front; beyond it, or when the lists would be
/// nearly complete, placement scans the placed items instead.
const MAX_LIST_ENTRIES: usize = 1 << 23;

/// How the placement finds the already placed items that conflict with an
/// item.
#[derive(Debug)]
pub(super) enum Conflicts {
    /// `targets[first[i]..first[i + 1]]` are the conflicts of item `i`.
    Lists {
        first: Vec<usize>,
        targets: Vec<u32>,
    },
    /// Most pairs conflict: scan all placed items in offset order.
    Dense,
}

impl Conflicts {
    /// The conflicts of items living over `spans` (`[start, end)` each).
    pub(super) fn new(spans: &[(usize, usize)]) -> Conflicts {
        let mut by_start: Vec<u32> = (0..spans.len() as u32).collect();
        by_start.sort_unstable_by_key(|&i| (spans[i as usize].0, i));
        let entries = count_conflicts(spans, &by_start).saturating_mul(2);
        let n = spans.len();
        // Gathering and sorting a long list costs more than one scan of
        // every placed item (about n * n / 2 steps per placement).
        if entries > MAX_LIST_ENTRIES || entries.saturating_mul(4) > n.saturating_mul(n) / 2 {
            return Conflicts::Dense;
        }
        let mut degree = vec![0usize; n];
        sweep_pairs(spans, &by_start, |i, j| {
            degree[i as usize] += 1;
            degree[j as usize] += 1;
        });
        let mut first = Vec::with_capacity(n + 1);
        let mut total = 0;
        first.push(0);
        for d in &degree {
            total += d;
            first.push(total);
        }
        let mut fill = first.clone();
        let mut targets = vec![0u32; total];
        sweep_pairs(spans, &by_start, |i, j| {
            targets[fill[i as usize]] = j;
            fill[i as usize] += 1;
            targets[fill[j as usize]] = i;
            fill[j as usize] += 1;
        });
        Conflicts::Lists { first, targets }
    }
}

/// The lifetimes of one set of requests that take part in planning, with
/// their conflicts: what every shape of a run structure shares. A plan of
/// another shape reuses them when its active requests have the same
/// lifetimes (checked), and builds its own otherwise. Two are equal when
/// their lifetimes are (the conflicts follow from them).
#[derive(Debug)]
pub(crate) struct Lifetimes {
    /// `(request index, start, end)` of each active request, in order.
    spans: Vec<(usize, usize, usize)>,
    pub(super) conflicts: Arc<Conflicts>,
    /// [`Lifetimes::lasting`], made on first use.
    lasting: OnceLock<Lasting>,
}

/// The items a plan settles low ([`Lifetimes::lasting`]), each list in
/// the order placed: oldest first.
#[derive(Debug)]
pub(super) struct Lasting {
    /// The items live at the run's end (its outputs).
    pub(super) outputs: Vec<u32>,
    /// The outputs, and the items that enclose every item allocated after
    /// them (freed no earlier than any of those, as a stack's would be).
    pub(super) stacked: Vec<u32>,
}

impl Lifetimes {
    /// The lifetimes `(request, start, end)` of the active requests, and
    /// their conflicts.
    pub(super) fn new(spans: Vec<(usize, usize, usize)>) -> Lifetimes {
        let pairs: Vec<(usize, usize)> = spans.iter().map(|&(_, s, e)| (s, e)).collect();
        let conflicts = Arc::new(Conflicts::new(&pairs));
        Lifetimes {
            spans,
            conflicts,
            lasting: OnceLock::new(),
        }
    }

    /// Which items a plan settles low (shared by every shape, so found
    /// once per structure).
    pub(super) fn lasting(&self) -> &Lasting {
        self.lasting.get_or_init(|| {
            let spans = &self.spans;
            let last = spans.iter().map(|s| s.2).max().unwrap_or(0);
            let mut by_start: Vec<u32> = (0..spans.len() as u32).collect();
            by_start.sort_by_key(|&i| (spans[i as usize].1, i));
            let output = |i: u32| spans[i as usize].2 == last;
            // Enclosing: ending no earlier than every item (outputs aside)
            // that starts after it.
            let mut enclosing = vec![false; spans.len()];
            let mut later_end = 0usize;
            for &i in by_start.iter().rev() {
                if output(i) {
                    continue;
                }
                let end = spans[i as usize].2;
                enclosing[i as usize] = end >= later_end;
                later_end = later_end.max(end);
            }
            Lasting {
                outputs: by_start.iter().copied().filter(|&i| output(i)).collect(),
                stacked: by_start
                    .iter()
                    .copied()
                    .filter(|&i| output(i) || enclosing[i as usize])
                    .collect(),
            }
        })
    }

    /// Whether these are the lifetimes of `spans`.
    pub(super) fn matches(
        &self,
        spans: impl ExactSizeIterator<Item = (usize, usize, usize)>,
    ) -> bool {
        spans.len() == self.spans.len() && spans.zip(&self.spans).all(|(a, b)| a == *b)
    }
}

impl PartialEq for Lifetimes {
    fn eq(&self, other: &Self) -> bool {
        self.spans == other.spans
    }
}

impl Eq for Lifetimes {}

/// The number of conflicting pairs, in O(n log n).
fn count_conflicts(spans: &[(usize, usize)], by_start: &[u32]) -> usize {
    let mut ends: Vec<usize> = spans.iter().map(|s| s.1).collect();
    ends.sort_unstable();
    by_start
        .iter()
        .enumerate()
        .map(|(before, &i)| {
            // Items starting before `i` that ended by its start end before it.
            let ended = ends.partition_point(|&e| e <= spans[i as usize].0);
            before - ended.min(before)
        })
        .fold(0usize, usize::saturating_add)
}

/// Calls `f(i, j)` once for every conflicting pair.
fn sweep_pairs(spans: &[(usize, usize)], by_start: &[u32], mut f: impl FnMut(u32, u32)) {
    let mut live: Vec<u32> = Vec::new();
    for &i in by_start {
        let start = spans[i as usize].0;
        live.retain(|&j| spans[j as usize].1 > start);
        for &j in &live {
            f(i, j);
        }
        live.push(i);
    }
}
