//! Checking a plan's layout from outside (a store file) in `O(n log n)`:
//! every offset aligned, no range past `usize::MAX`, the size the highest
//! end, and no two blocks alive at once sharing a byte, by a sweep over
//! time that keeps the live blocks ordered by offset (each new block is
//! compared with its two neighbours only: the live blocks never overlap
//! one another, so a block that overlaps any overlaps a neighbour).
//!
//! [`solver::validate`](super::solver::validate) compares each block with
//! every live one: quadratic where many blocks are live at once (a file of
//! 2.2 MB took 8 s to check).

#[cfg(test)]
use super::solver::Request;
use super::{PlanError, PlanEvent};
use std::collections::BTreeMap;

/// [`check`] of a valid recording's blocks (every block allocated once,
/// in order, freed at most once after: [`Recording::validate`]), read
/// where they are (`block(i)` is block `i`'s offset, size and alignment),
/// from its events, which are in time order: no request list and no sort;
/// memory for the blocks live at once only ([`Live`]).
///
/// [`Recording::validate`]: super::Recording::validate
///
/// # Errors
/// The first violation found, or `block`'s error.
pub(crate) fn check_source<B, E>(
    blocks: usize,
    block: B,
    events: impl Iterator<Item = PlanEvent>,
    size: usize,
) -> Result<(), PlanError>
where
    B: Fn(usize) -> Result<(usize, (usize, usize)), E>,
    PlanError: From<E>,
{
    let mut top = 0usize;
    for i in 0..blocks {
        let (offset, (len, align)) = block(i)?;
        let align = align.max(1);
        if offset % align != 0 {
            return Err(PlanError::new(format!(
                "block {i}: offset {offset} not aligned to {align}"
            )));
        }
        let end = offset.checked_add(len).ok_or_else(|| {
            PlanError::new(format!("block {i}: offset {offset} + size {len} overflows"))
        })?;
        top = top.max(end);
    }
    if top != size {
        return Err(PlanError::new(format!(
            "size {size} but the highest end is {top}"
        )));
    }
    let mut live = Live::Few(Vec::new());
    for (t, ev) in events.enumerate() {
        match ev {
            PlanEvent::Free(i) => {
                let (lo, _) = block(i as usize)?;
                live.remove(lo, i);
            }
            PlanEvent::Alloc(i) => {
                let (lo, (len, _)) = block(i as usize)?;
                let hi = lo + len;
                let (below, above, at) = live.neighbours(lo);
                for (other_lo, j) in below.into_iter().chain(above) {
                    let other_hi = other_lo + block(j as usize)?.1 .0;
                    if lo < other_hi && other_lo < hi {
                        return Err(PlanError::new(format!(
                            "blocks {j} [{other_lo}, {other_hi}) and {i} [{lo}, {hi}) overlap \
                             in memory while both are live (event {t})"
                        )));
                    }
                }
                live.insert(at, lo, i);
            }
        }
    }
    Ok(())
}

/// A live block: its offset, and which block it is.
type Entry = (usize, u32);

/// Most live blocks kept in a sorted vector: past them, a B-tree (an
/// insertion into the vector moves the blocks above it).
const FEW: usize = 4096;

/// The live blocks by offset (offset, block): a sorted vector while they
/// are few (a search and a short move, a fifth of the B-tree's time on
/// det's plans), a B-tree past [`FEW`] (a file with many blocks live at
/// once stays `O(n log n)`). A block's end is its offset plus its size.
enum Live {
    Few(Vec<Entry>),
    Many(BTreeMap<usize, u32>),
}

impl Live {
    /// The live blocks nearest below (or at) `lo` and at or above it, and
    /// where a block at `lo` goes ([`Live::insert`]).
    fn neighbours(&self, lo: usize) -> (Option<Entry>, Option<Entry>, usize) {
        match self {
            Live::Few(v) => {
                let at = v.partition_point(|e| e.0 < lo);
                // At `lo` itself: both neighbours (as the map's ranges).
                let below = match v.get(at) {
                    Some(&e) if e.0 == lo => Some(e),
                    _ => at.checked_sub(1).map(|k| v[k]),
                };
                (below, v.get(at).copied(), at)
            }
            Live::Many(m) => (
                m.range(..=lo).next_back().map(|(&o, &j)| (o, j)),
                m.range(lo..).next().map(|(&o, &j)| (o, j)),
                0,
            ),
        }
    }

    /// Adds block `i` at `lo`, at `at` (from [`Live::neighbours`] of
    /// `lo`, nothing added since) and overlapping no live block (so none
    /// is at `lo`: a block is at least a byte).
    fn insert(&mut self, at: usize, lo: usize, i: u32) {
        match self {
            Live::Few(v) if v.len() >= FEW => {
                let mut m: BTreeMap<usize, u32> = v.drain(..).collect();
                m.insert(lo, i);
                *self = Live::Many(m);
            }
            Live::Few(v) => v.insert(at, (lo, i)),
            Live::Many(m) => {
                m.insert(lo, i);
            }
        }
    }

    /// Removes block `i` at `lo`, if it is the one live there.
    fn remove(&mut self, lo: usize, i: u32) {
        match self {
            Live::Few(v) => {
                if let Ok(at) = v.binary_search_by_key(&lo, |e| e.0) {
                    if v[at].1 == i {
                        v.remove(at);
                    }
                }
            }
            Live::Many(m) => {
                if m.get(&lo) == Some(&i) {
                    m.remove(&lo);
                }
            }
        }
    }
}

/// Checks `offsets` (and `size`) against `requests` as
/// [`solver::validate`](super::solver::validate) does, in `O(n log n)`.
///
/// # Errors
/// A message naming the first violation found.
#[cfg(test)]
pub(crate) fn check(requests: &[Request], offsets: &[usize], size: usize) -> Result<(), String> {
    if offsets.len() != requests.len() {
        return Err(format!(
            "{} offsets for {} requests",
            offsets.len(),
            requests.len()
        ));
    }
    let mut top = 0usize;
    for (i, (r, &offset)) in requests.iter().zip(offsets).enumerate() {
        let align = r.effective_align();
        if offset % align != 0 {
            return Err(format!(
                "request {i}: offset {offset} not aligned to {align}"
            ));
        }
        let end = offset
            .checked_add(r.size)
            .ok_or_else(|| format!("request {i}: offset {offset} + size {} overflows", r.size))?;
        top = top.max(end);
    }
    if top != size {
        return Err(format!("size {size} but the highest end is {top}"));
    }
    // (time, 0 for an end / 1 for a start, request): ends first at a time,
    // as lifetimes are half-open.
    let mut changes: Vec<(usize, u8, usize)> = Vec::with_capacity(2 * requests.len());
    for (i, r) in requests.iter().enumerate() {
        if r.size > 0 && r.start < r.end {
            changes.push((r.start, 1, i));
            changes.push((r.end, 0, i));
        }
    }
    changes.sort_unstable();
    // Live blocks by offset: offset -> (end, request).
    let mut live: BTreeMap<usize, (usize, usize)> = BTreeMap::new();
    for (_, is_start, i) in changes {
        let lo = offsets[i];
        if is_start == 0 {
            live.remove(&lo);
            continue;
        }
        let hi = lo + requests[i].size;
        let below = live.range(..=lo).next_back().map(|(&o, &v)| (o, v));
        let above = live.range(lo..).next().map(|(&o, &v)| (o, v));
        for (other_lo, (other_hi, j)) in below.into_iter().chain(above) {
            if lo < other_hi && other_lo < hi {
                let (r, o) = (&requests[i], &requests[j]);
                return Err(format!(
                    "requests {j} [{other_lo}, {other_hi}) and {i} [{lo}, {hi}) overlap in \
                     memory and in time ([{}, {}) and [{}, {}))",
                    o.start, o.end, r.start, r.end
                ));
            }
        }
        live.insert(lo, (hi, i));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check;
    use crate::plan::solver::{validate, Request, Solution};

    /// Agrees with the solver's pairwise check on small cases, every
    /// placement of three blocks over a few offsets and lifetimes.
    #[test]
    fn agrees_with_the_pairwise_check() {
        let lifetimes = [(0, 2), (1, 3), (2, 4), (0, 4), (3, 3)];
        for a in lifetimes {
            for b in lifetimes {
                for c in lifetimes {
                    let reqs = [
                        Request::new(16, 8, a.0, a.1),
                        Request::new(8, 8, b.0, b.1),
                        Request::new(24, 8, c.0, c.1),
                    ];
                    for oa in [0, 8, 16] {
                        for ob in [0, 8, 16, 24] {
                            for oc in [0, 8, 16] {
                                let offsets = vec![oa, ob, oc];
                                let size = [oa + 16, ob + 8, oc + 24].into_iter().max().unwrap();
                                let want = validate(
                                    &reqs,
                                    &Solution {
                                        offsets: offsets.clone(),
                                        size,
                                    },
                                );
                                let got = check(&reqs, &offsets, size);
                                assert_eq!(
                                    got.is_ok(),
                                    want.is_ok(),
                                    "{reqs:?} {offsets:?}: {got:?} {want:?}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// The check from a tape's steps agrees with the one from its
    /// requests, on every placement of a small recording.
    #[test]
    fn the_events_check_agrees_with_the_requests_check() {
        use crate::plan::Recording;
        let mut rec = Recording::new();
        let a = rec.alloc(16, 8);
        let b = rec.alloc(8, 8);
        rec.free(a);
        let c = rec.alloc(24, 8);
        rec.free(b);
        let _d = rec.alloc(8, 8);
        rec.free(c);
        let reqs = rec.requests();
        for oa in [0, 8, 16] {
            for ob in [0, 8, 16, 24] {
                for oc in [0, 8, 16] {
                    for od in [0, 8, 24] {
                        let offsets = vec![oa, ob, oc, od];
                        let size = [oa + 16, ob + 8, oc + 24, od + 8]
                            .into_iter()
                            .max()
                            .unwrap();
                        let want = check(&reqs, &offsets, size);
                        let got = crate::plan::Plan::build_from(&rec, &offsets, size, 8, None);
                        assert_eq!(got.is_ok(), want.is_ok(), "{offsets:?}: {got:?} {want:?}");
                    }
                }
            }
        }
    }

    /// 200,000 blocks all live at once, side by side: checked by interval
    /// (the pairwise check makes 2e10 comparisons of it).
    #[test]
    fn many_blocks_live_at_once_are_checked_by_interval() {
        let n = 200_000;
        let reqs: Vec<Request> = (0..n).map(|i| Request::new(64, 64, i, n + 1)).collect();
        let offsets: Vec<usize> = (0..n).map(|i| 64 * i).collect();
        assert_eq!(check(&reqs, &offsets, 64 * n), Ok(()));
        let mut bad = offsets.clone();
        bad[n - 1] = 64 * (n / 2);
        let size = 64 * (n - 1);
        assert!(check(&reqs, &bad, size).unwrap_err().contains("overlap"));
    }

    /// The events check with 200,000 blocks live at once, each placed
    /// below the last (each would go to the front of a sorted vector): the
    /// live blocks move to a B-tree past a few thousand, and an overlap
    /// among them is still found.
    #[test]
    fn many_blocks_live_at_once_from_a_tape_are_checked_by_interval() {
        use crate::plan::{Plan, Recording};
        let n = 200_000;
        let mut rec = Recording::new();
        for _ in 0..n {
            rec.alloc(64, 64);
        }
        let offsets: Vec<usize> = (0..n).map(|i| 64 * (n - 1 - i)).collect();
        let peak = rec.peak_live();
        assert!(Plan::build_from(&rec, &offsets, 64 * n, 64, Some(peak)).is_ok());
        let mut bad = offsets.clone();
        bad[n - 1] = 64 * (n / 2);
        let err = Plan::build_from(&rec, &bad, 64 * n, 64, Some(peak)).unwrap_err();
        assert!(err.to_string().contains("overlap"), "{err}");
    }
}
