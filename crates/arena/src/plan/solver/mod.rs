//! Offline offset planning: given the sizes and lifetimes of every buffer of
//! one recorded run, choose an offset for each so that buffers alive at the
//! same time never share a byte, and the footprint (the highest end offset)
//! is small.
//!
//! This is the dynamic storage allocation problem (NP-hard). Two solvers:
//!
//! - [`greedy_by_size`]: the classic heuristic, largest buffer first, each at
//!   the lowest offset where it fits. It is the reference the figures in
//!   `shared/traces/REFERENCE.md` were computed with, and reproduces them
//!   exactly.
//! - [`plan`]: several orderings and fits, then a local search over the
//!   placement order under a fixed work budget (deterministic: the same
//!   requests always give the same solution). Never worse than greedy.
//!
//! Times are event indices; a lifetime is the half-open interval
//! `[start, end)`, so a buffer freed at index `t` and one allocated at `t`
//! do not overlap. Requests of size 0 or with `start >= end` conflict with
//! nothing; they are placed at offset 0 (their size still counts towards the
//! footprint, so the planned block holds every buffer).
//!
//! ```
//! use tensor_arena::plan::solver::{greedy_by_size, lower_bound, plan, validate, Request};
//!
//! let requests = [
//!     Request::new(100, 64, 0, 2),
//!     Request::new(50, 64, 1, 3),
//!     Request::new(100, 64, 2, 4), // may reuse the first buffer's bytes
//! ];
//! let solution = plan(&requests);
//! validate(&requests, &solution).unwrap();
//! assert_eq!(lower_bound(&requests), 150);
//! assert!(solution.size <= greedy_by_size(&requests).size);
//! ```
//!
//! # Overflow
//! Sizes and offsets are `usize`. Sums that would overflow saturate at
//! `usize::MAX` instead of panicking: [`lower_bound`] then returns
//! `usize::MAX`, and a solution whose footprint would not fit in `usize` has
//! `size == usize::MAX` and is not valid ([`validate`] says why). No input
//! panics.

/// One buffer of a recorded run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Request {
    /// Size in bytes.
    pub size: usize,
    /// Required alignment of the offset: a power of two. 0 is taken as 1,
    /// and any other value as the next power of two.
    pub align: usize,
    /// First event index at which the buffer is live.
    pub start: usize,
    /// First event index at which the buffer is dead again (exclusive end).
    pub end: usize,
}

impl Request {
    /// A request of `size` bytes aligned to `align`, live during
    /// `[start, end)`.
    pub const fn new(size: usize, align: usize, start: usize, end: usize) -> Self {
        Request {
            size,
            align,
            start,
            end,
        }
    }

    /// Whether the two requests must not share bytes: both have a size and
    /// their lifetimes intersect.
    pub fn conflicts_with(&self, other: &Request) -> bool {
        self.size > 0
            && other.size > 0
            && self.start < other.end
            && other.start < self.end
            && self.start < self.end
            && other.start < other.end
    }

    /// The alignment actually used: `align` rounded up to a power of two
    /// (0 and 1 give 1; values above the largest power of two give it).
    pub fn effective_align(&self) -> usize {
        self.align
            .max(1)
            .checked_next_power_of_two()
            .unwrap_or(1 << (usize::BITS - 1))
    }
}

/// An offset plan: `offsets[i]` is where request `i` starts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Solution {
    /// One offset per request, in request order; each a multiple of its
    /// request's alignment.
    pub offsets: Vec<usize>,
    /// The footprint: the maximum of `offset + size` over all requests (0
    /// for no requests), saturated at `usize::MAX`.
    pub size: usize,
}

/// The lower bound of any plan: the maximum, over time, of the bytes live at
/// once (requests that conflict with nothing count for their own size, as
/// the block must hold them). Saturates at `usize::MAX`.
pub fn lower_bound(requests: &[Request]) -> usize {
    let active = requests.iter().filter(|r| is_active(r));
    let peak = peak_live(active.map(|r| (r.start, r.end, r.size as u128)));
    let alone = requests.iter().filter(|r| !is_active(r)).map(|r| r.size);
    clamp(peak).max(alone.max().unwrap_or(0))
}

/// The maximum over time of the summed sizes of the `(start, end, size)`
/// lifetimes live at once (all with `start < end`).
fn peak_live(lifetimes: impl Iterator<Item = (usize, usize, u128)>) -> u128 {
    let mut changes: Vec<(usize, bool, u128)> = Vec::new();
    for (start, end, size) in lifetimes {
        changes.push((start, true, size));
        changes.push((end, false, size));
    }
    // At equal times the ends (false) sort before the starts (true).
    changes.sort_unstable();
    let mut live: u128 = 0;
    let mut peak: u128 = 0;
    for (_, is_start, size) in changes {
        if is_start {
            live += size;
            peak = peak.max(live);
        } else {
            live -= size;
        }
    }
    peak
}

/// `value` as a `usize`, saturating.
fn clamp(value: u128) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

/// Checks `solution` against `requests`: one offset per request, every
/// offset aligned, no two conflicting requests sharing a byte, no range
/// past `usize::MAX`, and `size` equal to the highest end offset.
///
/// # Errors
/// A message naming the first violation found.
pub fn validate(requests: &[Request], solution: &Solution) -> Result<(), String> {
    if solution.offsets.len() != requests.len() {
        return Err(format!(
            "{} offsets for {} requests",
            solution.offsets.len(),
            requests.len()
        ));
    }
    let mut top = 0usize;
    for (i, (r, &offset)) in requests.iter().zip(&solution.offsets).enumerate() {
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
    if top != solution.size {
        return Err(format!(
            "size {} but the highest end is {top}",
            solution.size
        ));
    }
    check_overlaps(requests, &solution.offsets)
}

/// Sweeps over time and checks every pair of conflicting requests.
fn check_overlaps(requests: &[Request], offsets: &[usize]) -> Result<(), String> {
    let mut by_start: Vec<usize> = (0..requests.len())
        .filter(|&i| is_active(&requests[i]))
        .collect();
    by_start.sort_unstable_by_key(|&i| requests[i].start);
    let mut live: Vec<usize> = Vec::new();
    for &i in &by_start {
        let r = &requests[i];
        live.retain(|&j| requests[j].end > r.start);
        let (lo, hi) = (offsets[i], offsets[i] + r.size);
        for &j in &live {
            let (other_lo, other_hi) = (offsets[j], offsets[j] + requests[j].size);
            if lo < other_hi && other_lo < hi {
                return Err(format!(
                    "requests {j} [{other_lo}, {other_hi}) and {i} [{lo}, {hi}) overlap in \
                     memory and in time ([{}, {}) and [{}, {}))",
                    requests[j].start, requests[j].end, r.start, r.end
                ));
            }
        }
        live.push(i);
    }
    Ok(())
}

/// Whether a request takes part in planning (has bytes and a lifetime).
fn is_active(r: &Request) -> bool {
    r.size > 0 && r.start < r.end
}

/// `value` rounded up to `mask + 1` (a power of two); `usize::MAX` (not
/// aligned, so any footprint using it saturates) when that overflows.
fn align_up(value: usize, mask: usize) -> usize {
    match value.checked_add(mask) {
        Some(v) => v & !mask,
        None => usize::MAX,
    }
}

/// The plan that gives every request its own range, one after the other:
/// the fallback for more than `u32::MAX` requests.
fn stacked(requests: &[Request]) -> Solution {
    let mut top = 0usize;
    let mut offsets = Vec::with_capacity(requests.len());
    for r in requests {
        let offset = align_up(top, r.effective_align() - 1);
        offsets.push(offset);
        top = offset.saturating_add(r.size);
    }
    Solution { offsets, size: top }
}

mod bound;
mod conflicts;
mod min_table;
mod placement;
mod search;

pub(crate) use placement::Placement;
pub use search::{greedy_by_size, plan};
pub(crate) use search::{plan_hinted, run_order_start, Depth, Hint};
