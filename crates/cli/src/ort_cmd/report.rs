//! The report of `tensor-arena ort`: one JSON document, or a table per
//! strategy.

use super::OrtArgs;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// One run of the sequence under one strategy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRow {
    /// The `--inputs` argument of the run.
    pub label: String,
    /// Process RSS after the run: outputs dropped, the workers (parked)
    /// still holding their arenas.
    pub rss_bytes: u64,
    /// Peak process RSS during the run (`VmHWM`, reset before the run), or
    /// the process's peak so far where it cannot be reset (see
    /// [`StrategyReport::peak_rss_per_run`]).
    pub peak_rss_bytes: u64,
    /// Time of the run call (the slowest worker's).
    pub nanos: u64,
    /// Most bytes live at once through the allocator during the run (arena
    /// strategies; summed over workers).
    pub peak_in_use: Option<u64>,
    /// Bytes the arenas hold after the run (arena strategies).
    pub reserved: Option<u64>,
    /// Of the bytes the arenas gave back, those given back lazily
    /// (`planned-lazy`: `MADV_FREE`) and not committed since: still in
    /// `rss_bytes` until the kernel needs them (arena strategies; 0 for
    /// the others).
    pub lazily_given_back: Option<u64>,
    /// Calls the arenas made to their memory layer for the run:
    /// reservations, releases, commits and decommits (arena strategies;
    /// `Stats::memory_calls`, as `replay` counts them).
    pub backing_calls: Option<u64>,
    /// Of the arenas' commits for the run, those that took base pages
    /// because huge pages were slow to populate: a guest whose free memory
    /// went back to its host (arena strategies; `Stats::slow_huge_commits`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slow_huge_commits: Option<u64>,
    /// Hash of the outputs (16 hex digits); empty for a failed run.
    pub output_hash: String,
    /// Why the run failed, if it did ("out of memory: ..."); the strategy
    /// went on with its next run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// How an arena strategy planned the run (the first worker's): exact,
    /// predicted from the model's earlier shapes, fell back (and why) or
    /// dynamic (and why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
}

/// Runs by how they were planned, in words: `exact 3, predicted 5 (1 fell
/// back), dynamic 2`.
pub fn plan_counts(runs: &[RunRow]) -> String {
    let count = |prefix: &str| {
        runs.iter()
            .filter(|r| r.plan.as_deref().is_some_and(|p| p.starts_with(prefix)))
            .count()
    };
    let fell = count("fell back");
    format!(
        "exact {}, predicted {} ({fell} fell back), dynamic {}",
        count("exact"),
        count("predicted") + fell,
        count("dynamic")
    )
}

/// One strategy's report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StrategyReport {
    /// Its name (`ort-arena`, ..., `planned`).
    pub strategy: String,
    /// Process RSS once the session (and the workers) are created.
    pub session_rss_bytes: u64,
    /// Whether each run's `peak_rss_bytes` is that run's own peak (the
    /// peak was reset before every run); `false`: the process's peak so
    /// far, and `peak_rss_note` says why.
    pub peak_rss_per_run: bool,
    /// Why the peak could not be reset, if it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rss_note: Option<String>,
    /// Peak RSS of the strategy's child process from its start to its
    /// last run, session creation included (the largest `VmHWM` read before
    /// each reset and after each run), if known.
    #[serde(default)]
    pub process_peak_rss_bytes: Option<u64>,
    /// The runs in order.
    pub runs: Vec<RunRow>,
}

/// How the strategies' outputs compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Comparison {
    /// Strategies that reported.
    pub strategies: usize,
    /// Runs that succeeded under at least two strategies (those compared).
    pub compared: usize,
    /// Runs in the sequence.
    pub runs: usize,
    /// Whether every compared run has the same hash everywhere it succeeded.
    pub identical: bool,
}

impl Comparison {
    /// Compares run by run, leaving failed runs out.
    pub fn of(reports: &[StrategyReport]) -> Self {
        let runs = reports.iter().map(|r| r.runs.len()).max().unwrap_or(0);
        let mut compared = 0;
        let mut identical = true;
        for i in 0..runs {
            let hashes: Vec<&str> = reports
                .iter()
                .filter_map(|r| r.runs.get(i))
                .filter(|x| x.error.is_none())
                .map(|x| x.output_hash.as_str())
                .collect();
            if hashes.len() >= 2 {
                compared += 1;
                identical &= hashes.iter().all(|h| *h == hashes[0]);
            }
        }
        Self {
            strategies: reports.len(),
            compared,
            runs,
            identical,
        }
    }

    /// `Some(identical)` when at least one run was compared, `None` when
    /// there was nothing to compare (one strategy, or no run succeeded
    /// under two).
    pub fn outputs_identical(&self) -> Option<bool> {
        (self.compared > 0).then_some(self.identical)
    }

    /// One line saying what was compared and how it came out.
    pub fn line(&self, reports: &[StrategyReport]) -> String {
        match (self.strategies, self.outputs_identical()) {
            (0, _) => "output hashes: no strategy reported".into(),
            (1, _) => format!(
                "output hashes: one strategy ran ({}): nothing to compare",
                reports[0].strategy
            ),
            (_, None) => {
                "output hashes: nothing to compare (no run succeeded under two strategies)".into()
            }
            (n, Some(same)) => {
                let runs = if self.compared == self.runs {
                    format!("every run compared across {n} strategies")
                } else {
                    format!(
                        "{} of {} runs compared across {n} strategies; failed runs left out",
                        self.compared, self.runs
                    )
                };
                if same {
                    format!("output hashes: identical across strategies ({runs})")
                } else {
                    format!("output hashes: DIFFER between strategies ({runs})")
                }
            }
        }
    }
}

/// Every failed run: `(strategy, run index, label, error)`.
pub fn failures(reports: &[StrategyReport]) -> Vec<(&str, usize, &str, &str)> {
    reports
        .iter()
        .flat_map(|r| {
            r.runs.iter().enumerate().filter_map(|(i, x)| {
                x.error
                    .as_deref()
                    .map(|e| (r.strategy.as_str(), i, x.label.as_str(), e))
            })
        })
        .collect()
}

/// The whole document: the model, the settings, whether the outputs agree
/// (`null`: nothing compared) and the strategies.
pub fn to_json(args: &OrtArgs, reports: &[StrategyReport]) -> String {
    serde_json::json!({
        "model": args.model.display().to_string(),
        "inputs": args.inputs,
        "values": args.values,
        "threads": args.threads,
        "intra_threads": args.intra_threads,
        "outputs_identical": Comparison::of(reports).outputs_identical(),
        "strategies": reports,
    })
    .to_string()
}

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / (1024.0 * 1024.0))
}

fn opt_mib(b: Option<u64>) -> String {
    b.map_or_else(|| "-".into(), mib)
}

/// A table per strategy, then a line on the hashes.
pub fn tables(args: &OrtArgs, reports: &[StrategyReport]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "model {}  runs {}  threads {}  intra-op threads {}",
        args.model.display(),
        args.inputs.len(),
        args.threads,
        if args.intra_threads == 0 {
            "ONNX Runtime's default".to_string()
        } else {
            args.intra_threads.to_string()
        }
    );
    if !args.values.is_empty() {
        let _ = writeln!(out, "values {}", args.values.join("  "));
    }
    for r in reports {
        let process_peak = r
            .process_peak_rss_bytes
            .map_or_else(String::new, |p| format!(", process peak {} MiB", mib(p)));
        let _ = writeln!(
            out,
            "\n{}  (RSS after session creation {} MiB{process_peak})",
            r.strategy,
            mib(r.session_rss_bytes)
        );
        let peak_head = if r.peak_rss_per_run {
            "run peak"
        } else {
            "peak*"
        };
        let w = r
            .runs
            .iter()
            .map(|x| x.label.len())
            .max()
            .unwrap_or(5)
            .max(5);
        let _ = writeln!(
            out,
            "  {:<w$}  {:>9}  {:>9}  {:>9}  {:>11}  {:>12}  {:>12}  {:>16}  plan",
            "run",
            "RSS MiB",
            peak_head,
            "ms",
            "in-use MiB",
            "reserved MiB",
            "memory calls",
            "output hash"
        );
        let lazy: Vec<String> = r
            .runs
            .iter()
            .filter(|x| x.lazily_given_back.is_some_and(|b| b > 0))
            .map(|x| format!("{} {}", x.label, opt_mib(x.lazily_given_back)))
            .collect();
        for x in &r.runs {
            let _ = writeln!(
                out,
                "  {:<w$}  {:>9}  {:>9}  {:>9.2}  {:>11}  {:>12}  {:>12}  {:>16}  {}",
                x.label,
                mib(x.rss_bytes),
                mib(x.peak_rss_bytes),
                x.nanos as f64 / 1e6,
                opt_mib(x.peak_in_use),
                opt_mib(x.reserved),
                x.backing_calls
                    .map_or_else(|| "-".into(), |c| c.to_string()),
                if x.error.is_some() {
                    "FAILED"
                } else {
                    x.output_hash.as_str()
                },
                x.plan.as_deref().unwrap_or("-")
            );
        }
        if r.runs.iter().any(|x| x.plan.is_some()) {
            let _ = writeln!(out, "  plans: {}", plan_counts(&r.runs));
        }
        if !lazy.is_empty() {
            let _ = writeln!(
                out,
                "  given back lazily, in RSS until the kernel needs it (MiB after the run): {}",
                lazy.join(", ")
            );
        }
        let slow: Vec<String> = r
            .runs
            .iter()
            .filter_map(|x| {
                x.slow_huge_commits
                    .filter(|&n| n > 0)
                    .map(|n| format!("{} {n}", x.label))
            })
            .collect();
        if !slow.is_empty() {
            let _ = writeln!(
                out,
                "  commits in base pages, huge pages slow to populate (the host backing them anew): {}",
                slow.join(", ")
            );
        }
        if !r.peak_rss_per_run {
            let _ = writeln!(
                out,
                "  * the process's peak so far, not the run's: {}",
                r.peak_rss_note
                    .as_deref()
                    .unwrap_or("the peak could not be reset")
            );
        }
    }
    let _ = writeln!(out, "\n{}", Comparison::of(reports).line(reports));
    out
}
