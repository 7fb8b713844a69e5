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
    /// Process RSS after the run (outputs dropped).
    pub rss_bytes: u64,
    /// Peak process RSS so far (`VmHWM`, as `getrusage`'s `ru_maxrss`).
    pub peak_rss_bytes: u64,
    /// Time of the run call (the slowest worker's).
    pub nanos: u64,
    /// Most bytes live at once through the allocator during the run (arena
    /// strategies; summed over workers).
    pub peak_in_use: Option<u64>,
    /// Bytes the arenas hold after the run (arena strategies).
    pub reserved: Option<u64>,
    /// Backing allocations and frees the arenas made for the run (arena
    /// strategies).
    pub backing_calls: Option<u64>,
    /// Hash of the outputs (16 hex digits); empty for a failed run.
    pub output_hash: String,
    /// Why the run failed, if it did ("out of memory: ..."); the strategy
    /// went on with its next run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One strategy's report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StrategyReport {
    /// Its name (`ort-arena`, ..., `planned`).
    pub strategy: String,
    /// Process RSS once the session (and the workers) are created.
    pub session_rss_bytes: u64,
    /// The runs in order.
    pub runs: Vec<RunRow>,
}

/// Whether every strategy's run `i` has the same output hash.
pub fn hashes_agree(reports: &[StrategyReport]) -> bool {
    let Some(first) = reports.first() else {
        return true;
    };
    reports.iter().all(|r| {
        r.runs.len() == first.runs.len()
            && r.runs.iter().zip(&first.runs).all(|(a, b)| {
                a.error.is_some() || b.error.is_some() || a.output_hash == b.output_hash
            })
    })
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

/// `{"strategies": [...]}`.
pub fn to_json(reports: &[StrategyReport]) -> String {
    serde_json::json!({ "strategies": reports }).to_string()
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
        args.intra_threads
    );
    for r in reports {
        let _ = writeln!(
            out,
            "\n{}  (RSS after session creation {} MiB)",
            r.strategy,
            mib(r.session_rss_bytes)
        );
        let w = r
            .runs
            .iter()
            .map(|x| x.label.len())
            .max()
            .unwrap_or(5)
            .max(5);
        let _ = writeln!(
            out,
            "  {:<w$}  {:>9}  {:>9}  {:>9}  {:>11}  {:>12}  {:>7}  {:>16}",
            "run",
            "RSS MiB",
            "peak MiB",
            "ms",
            "in-use MiB",
            "reserved MiB",
            "backing",
            "output hash"
        );
        for x in &r.runs {
            let _ = writeln!(
                out,
                "  {:<w$}  {:>9}  {:>9}  {:>9.2}  {:>11}  {:>12}  {:>7}  {:>16}",
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
                }
            );
        }
    }
    let _ = writeln!(
        out,
        "\noutput hashes: {}",
        if hashes_agree(reports) {
            "identical across strategies"
        } else {
            "DIFFER between strategies"
        }
    );
    out
}
