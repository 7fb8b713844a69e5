//! Printing results: a plain table, or one JSON document.

use std::fmt::Write as _;

use serde::Serialize;

use crate::replay::{ShrinkMode, StrategyResult, Touch};
use crate::workload::Workload;

/// Everything `replay` found; serialises to the `--json` document.
#[derive(Debug, Serialize)]
pub struct Report<'a> {
    /// What was replayed.
    pub workload: WorkloadInfo,
    /// How buffers were written.
    pub touch: Touch,
    /// Shrink mode of the arena strategies.
    pub shrink: ShrinkMode,
    /// Cap on the arena strategies' reserved bytes, if any.
    pub max_reserved: Option<usize>,
    /// Whether the strategies ran in one process (`--in-process`) rather than
    /// each in its own child process.
    pub in_process: bool,
    /// One entry per strategy, in the order they ran.
    pub strategies: &'a [StrategyResult],
}

/// What was replayed.
#[derive(Debug, Serialize)]
pub struct WorkloadInfo {
    /// One line: the model and its shapes, or the trace files.
    pub description: String,
    /// Number of runs.
    pub runs: usize,
    /// Allocations over all runs.
    pub allocs: usize,
    /// The largest lower bound of any run.
    pub max_lower_bound: usize,
}

impl WorkloadInfo {
    /// Describes `w`.
    pub fn of(w: &Workload) -> Self {
        Self {
            description: w.description.clone(),
            runs: w.runs.len(),
            allocs: w.allocs(),
            max_lower_bound: w.runs.iter().map(|r| r.lower_bound()).max().unwrap_or(0),
        }
    }
}

/// `bytes` in a short human unit (B, KiB, MiB, GiB).
pub fn bytes(b: u64) -> String {
    const KIB: f64 = 1024.0;
    let f = b as f64;
    if b < 1024 {
        format!("{b} B")
    } else if f < KIB * KIB {
        format!("{:.1} KiB", f / KIB)
    } else if f < KIB * KIB * KIB {
        format!("{:.2} MiB", f / (KIB * KIB))
    } else {
        format!("{:.2} GiB", f / (KIB * KIB * KIB))
    }
}

/// Nanoseconds in a short human unit.
pub fn duration(nanos: u64) -> String {
    let f = nanos as f64;
    if nanos < 1_000_000 {
        format!("{:.0} µs", f / 1e3)
    } else if nanos < 1_000_000_000 {
        format!("{:.1} ms", f / 1e6)
    } else {
        format!("{:.2} s", f / 1e9)
    }
}

/// A count with thousands separators.
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `value - baseline`, when both are known.
fn growth(value: Option<u64>, baseline: Option<u64>) -> Option<u64> {
    Some(value?.saturating_sub(baseline?))
}

/// `-` for an unknown value.
fn or_dash(v: Option<String>) -> String {
    v.unwrap_or_else(|| "-".to_owned())
}

/// Lays out `rows` under `header`; columns listed in `left` are left-aligned,
/// the others right-aligned.
fn table(out: &mut String, header: &[&str], rows: &[Vec<String>], left: &[usize]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |out: &mut String, cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            let pad = w - cell.chars().count();
            if left.contains(&i) {
                s.push_str(cell);
                s.extend(std::iter::repeat_n(' ', pad));
            } else {
                s.extend(std::iter::repeat_n(' ', pad));
                s.push_str(cell);
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(out, &mut header.iter().copied());
    for row in rows {
        line(out, &mut row.iter().map(String::as_str));
    }
}

/// The plain-text report: the header, one row per strategy and run, one
/// summary row per strategy, and the legend.
pub fn plain(report: &Report<'_>) -> String {
    let mut out = String::new();
    let w = &report.workload;
    let _ = writeln!(out, "tensor-arena replay: {}", w.description);
    let touch = match report.touch {
        Touch::Pages => "pages (one write per 4 KiB page of each buffer)",
        Touch::Full => "full (every byte written)",
        Touch::None => "none",
    };
    let shrink = match report.shrink {
        ShrinkMode::Never => "never",
        ShrinkMode::AfterRun => "after-run",
        ShrinkMode::ManualAfterSmaller => "manual-after-smaller",
    };
    let cap = report
        .max_reserved
        .map_or("none".to_owned(), |c| bytes(c as u64));
    let _ = writeln!(
        out,
        "{} runs, {} allocations; touch: {touch}; arena shrink: {shrink}; arena max reserved: {cap}",
        w.runs,
        count(w.allocs as u64)
    );
    let _ = writeln!(
        out,
        "{}\n",
        if report.in_process {
            "all strategies in this process, one after another (--in-process)"
        } else {
            "each strategy in its own child process"
        }
    );

    let mut rows = Vec::new();
    for s in report.strategies {
        for (i, r) in s.runs.iter().enumerate() {
            let ratio = r
                .reserved
                .filter(|_| r.lower_bound > 0)
                .map(|res| format!("{:.2}", res as f64 / r.lower_bound as f64));
            rows.push(vec![
                if i == 0 {
                    s.name.clone()
                } else {
                    String::new()
                },
                i.to_string(),
                r.label.clone(),
                count(r.allocs),
                bytes(r.lower_bound),
                bytes(r.peak_in_use),
                or_dash(r.reserved.map(bytes)),
                or_dash(ratio),
                or_dash(
                    r.high_water
                        .filter(|_| r.lower_bound > 0)
                        .map(|h| format!("{:.3}", h as f64 / r.lower_bound as f64)),
                ),
                or_dash(r.plan.clone()),
                or_dash(r.backing_calls.map(count)),
                or_dash(r.minor_faults.map(count)),
                or_dash(growth(r.rss_bytes, s.baseline_rss_bytes).map(bytes)),
                if r.error.is_some() {
                    "FAILED".to_owned()
                } else {
                    duration(r.nanos)
                },
            ]);
        }
    }
    table(
        &mut out,
        &[
            "strategy",
            "run",
            "label",
            "allocs",
            "lower bound",
            "peak in use",
            "reserved",
            "res/lb",
            "hw/lb",
            "plan",
            "backing",
            "minor faults",
            "rss growth",
            "time",
        ],
        &rows,
        &[0, 2, 9],
    );

    out.push('\n');
    let rows: Vec<Vec<String>> = report
        .strategies
        .iter()
        .map(|s| {
            let m = &s.summary;
            vec![
                s.name.clone(),
                match m.learn_nanos {
                    Some(l) => format!("{} (+{} learning)", duration(m.total_nanos), duration(l)),
                    None => duration(m.total_nanos),
                },
                or_dash(m.max_reserved.map(bytes)),
                bytes(m.max_lower_bound),
                or_dash(m.reserved_over_lower_bound.map(|r| format!("{r:.2}"))),
                or_dash(m.minor_faults.map(count)),
                or_dash(m.backing_calls.map(count)),
                or_dash(m.plans.map(|p| p.cell())),
                or_dash(s.baseline_rss_bytes.map(bytes)),
                or_dash(growth(s.peak_rss_bytes, s.baseline_rss_bytes).map(bytes)),
                if s.error.is_some() {
                    "FAILED (child process)".to_owned()
                } else if m.failed_runs > 0 {
                    format!("{} FAILED", m.failed_runs)
                } else {
                    String::new()
                },
            ]
        })
        .collect();
    table(
        &mut out,
        &[
            "summary",
            "total time",
            "max reserved",
            "max lower bound",
            "max res/lb",
            "minor faults",
            "backing calls",
            "plans ex/pred/fell/dyn",
            "baseline rss",
            "peak rss growth",
            "",
        ],
        &rows,
        &[0, 10],
    );

    out.push('\n');
    out.push_str(&legend(report.strategies));
    out
}

/// Explains the columns, naming the strategies each meaning applies to.
fn legend(strategies: &[StrategyResult]) -> String {
    let mut out = String::new();
    out.push_str("lower bound: the most bytes live at once in the run; nothing can hold less.\n");
    out.push_str(
        "peak in use: the most bytes in use during the run as the strategy counts them \
         (the arena rounds each block to 64 B; bump never reuses, so it counts every allocation since its reset).\n",
    );
    // Group strategies by what their `reserved` means, in order of first use.
    let mut groups: Vec<(&str, Vec<&str>)> = Vec::new();
    for s in strategies {
        match groups.iter_mut().find(|(m, _)| *m == s.reserved_is) {
            Some((_, names)) => names.push(&s.name),
            None => groups.push((&s.reserved_is, vec![&s.name])),
        }
    }
    for (i, (meaning, names)) in groups.iter().enumerate() {
        let lead = if i == 0 {
            "reserved (after the run): "
        } else {
            "                          "
        };
        let _ = writeln!(out, "{lead}{}: {meaning}.", names.join(", "));
    }
    out.push_str(
        "res/lb: reserved / lower bound. backing: calls to the backing allocator in the run \
         (arena: memory-layer calls, i.e. reservations, releases, commits and decommits; system, mimalloc, jemalloc: alloc + free calls; bump: chunks drawn + freed).\n",
    );
    out.push_str(
        "hw/lb: the run's high-water mark in the arena (how far into one free region its blocks reach) / lower bound. \
         plan: how a planning strategy served the run: exact (its shape's own plan), predicted (a plan predicted from its family's earlier shapes), \
         fell back (left the prediction: a block larger than its slot, an extra allocation, frees in another order, a short run), \
         dynamic (no plan: a new family, one shape seen, sizes that follow no fit). plans ex/pred/fell/dyn: those counts over the replay.\n",
    );
    out.push_str("minor faults: getrusage(RUSAGE_SELF) ru_minflt during the run. time: wall time of the run.\n");
    out.push_str(
        "rss growth: resident memory after the run (/proc/self/statm) minus the baseline. \
         baseline rss: resident memory before the strategy's first allocation (the program and the workload). \
         peak rss growth: the peak resident memory of the strategy's child process (ru_maxrss from wait4) minus the baseline; \
         '-' with --in-process, where the process's peak is shared.\n",
    );
    for s in strategies {
        if let Some(e) = &s.error {
            let _ = writeln!(out, "FAILED: {}: {e}", s.name);
        }
        if let Some(note) = &s.note {
            let _ = writeln!(out, "note: {}: {note}.", s.name);
        }
        for (i, r) in s.runs.iter().enumerate() {
            if let Some(e) = &r.error {
                let _ = writeln!(out, "FAILED: {} run {i} ({}): {e}", s.name, r.label);
            }
        }
    }
    out
}

/// The `--json` document.
///
/// # Errors
/// Only if serialisation fails (it does not for these types).
pub fn json(report: &Report<'_>) -> serde_json::Result<String> {
    serde_json::to_string_pretty(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(9804), "9.6 KiB");
        assert_eq!(bytes(134_873_088), "128.62 MiB");
        assert_eq!(bytes(5 << 30), "5.00 GiB");
        assert_eq!(count(0), "0");
        assert_eq!(count(1234567), "1,234,567");
        assert_eq!(count(123), "123");
        assert_eq!(duration(1_500), "2 µs");
        assert_eq!(duration(12_345_678), "12.3 ms");
    }
}
