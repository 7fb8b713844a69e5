//! Shared helpers for the benchmarks: traces (read by [`tensor_arena::trace`],
//! renumbered for fast replay), page touches,
//! fault and resident-memory counters, and the allocation strategies every
//! group compares.
//!
//! The strategies ([`Strategy`]) are driven two ways:
//!
//! - [`Pairs`]: allocate-and-free pairs, one block at a time (the hot path);
//! - [`Replay`]: whole runs of a [`Trace`], with one write per 4 KiB page of
//!   every buffer ([`touch_pages`]), as a real inference call would do, or
//!   with none ([`Touch::Nothing`], the trace-order hot path).
//!
//! All unsafe code of the benchmarks is in this crate: the libc calls
//! (`getrusage`, `malloc_trim`, `mmap`), the raw-pointer allocators (the
//! `GlobalAlloc` implementations, bumpalo, rlsf and talc in [`peers`]) and
//! the bare loop's page-aligned block.
//!
//! One module per concept: [`trace`], [`pages`], [`strategy`], [`replay`],
//! [`pairs`](mod@pairs), [`peers`].

pub mod floor;
pub mod pages;
pub mod pairs;
pub mod peers;
pub mod replay;
pub mod strategy;
pub mod trace;

pub use floor::{floor_pairs, floor_replayer, OffsetsTlsf};
pub use pages::{
    minor_faults, peak_rss_bytes, proc_status_bytes, reset_peak_rss, rss_bytes, touch_pages,
    trim_heap, PAGE,
};
pub use pairs::{
    arena_pairs_outside_runs, arena_scoped_pairs, pairs, planned_scoped_pairs, shared_pairs, Pairs,
};
pub use peers::PoolHeap;
pub use replay::{
    arena_run, arena_run_with, bare_replayer, config_with, dynamic_scoped_replayer, make_plans,
    make_predicted_plans, preplanned_replayer, preplanned_scoped_replayer, replay_in, replayer,
    scoped_replayer, ArenaReplay, Replay, Touch,
};
pub use strategy::{Counters, Strategy, ALIGN};
pub use trace::{hot_path_sizes, trace_names, traces_dir, Op, Trace, TraceRun};

// ---------------------------------------------------------------------------
// Reporting
// ---------------------------------------------------------------------------

/// The criterion configuration of every group: no HTML plots (drawing them
/// with the plotters backend costs seconds per benchmark on this machine,
/// more than most measurements). Pass `--plotting-backend plotters` (or
/// `gnuplot`) after `--` to get them back.
pub fn criterion() -> criterion::Criterion {
    criterion::Criterion::default().without_plots()
}

/// Bytes as MiB with two decimals.
pub fn mib(bytes: usize) -> String {
    format!("{:.2}", bytes as f64 / (1024.0 * 1024.0))
}

/// The median of `values` (sorted in place); 0 for none.
pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_bounds_match_reference() {
        let t = Trace::load("densenet121-mixed");
        assert_eq!(t.runs.len(), 6);
        assert_eq!(t.runs[0].label, "16x3x224x224");
        // traces/REFERENCE.md: exact lower bounds per shape.
        assert_eq!(t.runs[0].lower_bound(), 134_873_088);
        assert_eq!(t.runs[1].lower_bound(), 8_429_568);
        assert_eq!(t.runs[0].naive(), 5_127_715_328);
        assert_eq!(t.lower_bound(), 134_873_088);
    }

    #[test]
    fn hot_path_sizes_are_in_range_and_fixed() {
        let a = hot_path_sizes(256);
        assert_eq!(a, hot_path_sizes(256));
        assert!(a.iter().all(|&s| (1024..=50 << 20).contains(&s)));
    }

    #[test]
    fn touch_writes_one_byte_per_page() {
        let mut buf = vec![0u8; 3 * PAGE + 1];
        touch_pages(&mut buf);
        assert_eq!(buf.iter().filter(|&&b| b == 1).count(), 4);
    }

    #[test]
    fn every_strategy_replays_a_small_trace() {
        let t = Trace::load("silero-vad-mixed");
        for s in Strategy::ALL {
            let mut r = replayer(s, &t);
            r.replay(&t);
            r.replay(&t);
        }
        for s in Strategy::ALLOCATORS {
            let sizes = hot_path_sizes(16);
            let mut p = pairs(s, &sizes).unwrap();
            p.pairs(&sizes);
        }
        assert!(minor_faults() > 0);
    }
}
