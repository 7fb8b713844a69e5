//! What each configuration's child reports, and the table and JSON the
//! parent prints.

use super::PoolArgs;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// The budget's counters at the end of serving.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct BudgetReport {
    /// The limit in bytes.
    pub limit: u64,
    /// The most the workers had committed at once.
    pub peak_committed: u64,
    /// Bytes workers gave back because another's commit needed room.
    pub reclaimed: u64,
    /// Times a commit asked the others for memory.
    pub reclaims: u64,
    /// Commits refused over the limit (each fails its request).
    pub refusals: u64,
    /// Commits that waited for busy workers to give memory back, then fitted.
    pub waited: u64,
    /// The longest a commit waits (`--budget-wait`), ms.
    pub wait_ms: u64,
}

/// How the budget configuration's runs were admitted by what they need.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AdmissionReport {
    /// Runs admitted.
    pub admitted: u64,
    /// Of those, runs that waited for room.
    pub waited: u64,
    /// Runs that fitted and went ahead of a larger one.
    pub passed: u64,
    /// Total time runs waited, ms.
    pub wait_total_ms: f64,
    /// The longest wait, ms.
    pub wait_max_ms: f64,
    /// The most bytes promised to runs in flight at once.
    pub promised_peak: u64,
    /// The most runs in flight at once.
    pub running_peak: u64,
    /// Runs that ran out of memory beside others and ran again alone.
    pub retried_alone: u64,
    /// Runs refused: they could not fit alone.
    pub refused: u64,
}

impl AdmissionReport {
    /// The report of these counters.
    pub fn of(s: &tensor_arena_ort::AdmissionStats) -> Self {
        Self {
            admitted: s.admitted,
            waited: s.waited,
            passed: s.passed,
            wait_total_ms: s.wait_total.as_secs_f64() * 1e3,
            wait_max_ms: s.wait_max.as_secs_f64() * 1e3,
            promised_peak: s.promised_peak as u64,
            running_peak: s.running_peak as u64,
            retried_alone: s.retried_alone,
            refused: s.refused,
        }
    }
}

/// One configuration's results.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ConfigReport {
    /// The configuration's name.
    pub config: String,
    /// Worker threads.
    pub workers: u32,
    /// ONNX Runtime's intra-op threads per session (0: its default).
    pub intra_threads: u32,
    /// Requests served (failed ones included).
    pub requests: u64,
    /// Requests that failed (a model run returned an error).
    pub failed: u64,
    /// The first failure's message.
    pub first_error: Option<String>,
    /// Model runs made (det, cls and rec batches).
    pub model_runs: u64,
    /// Seconds from the first request taken to the last finished.
    pub seconds: f64,
    /// Requests per second over that time.
    pub requests_per_second: f64,
    /// Median latency of a successful request (its model runs, from det's
    /// start to rec's end; making the inputs is not counted), ms.
    pub latency_p50_ms: f64,
    /// 99th percentile of the same, ms.
    pub latency_p99_ms: f64,
    /// RSS once the three sessions are open and the workers made, before
    /// the first request.
    pub baseline_rss_bytes: u64,
    /// Peak RSS while serving (the high-water mark is reset at the
    /// baseline; `peak_rss_note` says when it could not be).
    pub peak_rss_bytes: u64,
    /// Why the peak is the process's since it started, if it is.
    pub peak_rss_note: Option<String>,
    /// RSS after the last request, the workers still holding their memory.
    pub end_rss_bytes: u64,
    /// tensor-arena: the most the workers' arenas had committed at once
    /// (exact: every arena commits through one budget, unlimited but for
    /// the budget configuration).
    pub peak_reserved_bytes: Option<u64>,
    /// tensor-arena: what they had committed after the last request.
    pub end_reserved_bytes: Option<u64>,
    /// tensor-arena: the most bytes live in the workers' arenas at once,
    /// counted at each alloc and free (`tensor_arena_ort::live_together`):
    /// what the reserved peak is set against.
    #[serde(default)]
    pub peak_live_bytes: Option<u64>,
    /// glibc's malloc: what it held from the system with the workers made
    /// (`None` off glibc).
    pub baseline_malloc_bytes: Option<u64>,
    /// glibc's malloc: the most it held while serving (sampled every 20
    /// ms): the requests' tensors the server makes itself, ONNX Runtime's
    /// heap and, without tensor-arena, its arenas. Memory no tensor-arena
    /// budget governs.
    pub peak_malloc_bytes: Option<u64>,
    /// The budget configuration's counters.
    pub budget: Option<BudgetReport>,
    /// The budget configuration's admission by predicted need.
    #[serde(default)]
    pub admission: Option<AdmissionReport>,
    /// A hash of every output of every request, in request order; `None`
    /// when a request failed.
    pub outputs_hash: Option<String>,
    /// tensor-arena: each model's runs by how they were planned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plans: Option<Vec<ModelPlans>>,
}

/// One model's runs under a tensor-arena configuration, by how they were
/// planned (the model's [`Plans`](tensor_arena_ort::Plans) counters).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelPlans {
    /// `det`, `cls` or `rec`.
    pub model: String,
    /// Runs served by their key's own plan.
    pub exact: u64,
    /// Runs served by a plan predicted from the model's earlier shapes
    /// (including those that fell back).
    pub predicted: u64,
    /// Predicted runs that left the prediction.
    pub fell_back: u64,
    /// Runs served dynamically.
    pub dynamic: u64,
    /// Runs of the 4th request on...
    pub runs_from_4th: u64,
    /// ... and of those, the ones served on a plan to their end.
    pub on_plan_from_4th: u64,
}

/// Whether the configurations that served every request produced the same
/// outputs (`None` with fewer than two to compare).
pub fn outputs_identical(reports: &[ConfigReport]) -> Option<bool> {
    let hashes: Vec<&str> = reports
        .iter()
        .filter_map(|r| r.outputs_hash.as_deref())
        .collect();
    (hashes.len() >= 2).then(|| hashes.iter().all(|h| *h == hashes[0]))
}

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / (1024.0 * 1024.0))
}

/// The JSON document of the whole comparison.
pub fn to_json(args: &PoolArgs, reports: &[ConfigReport], identical: Option<bool>) -> String {
    let doc = serde_json::json!({
        "models": {
            "det": args.det.display().to_string(),
            "cls": args.cls.display().to_string(),
            "rec": args.rec.display().to_string(),
        },
        "stream": args.stream.as_ref().map_or("built-in".to_string(), |p| p.display().to_string()),
        "workers": args.workers,
        "intra_threads": args.intra_threads,
        "outputs_identical": identical,
        "configs": reports,
    });
    doc.to_string()
}

/// The table of the whole comparison.
pub fn table(args: &PoolArgs, reports: &[ConfigReport], identical: Option<bool>) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "OCR pool: {} workers, {} intra-op thread(s) per session, stream {}",
        args.workers,
        args.intra_threads,
        args.stream
            .as_ref()
            .map_or("built-in".to_string(), |p| p.display().to_string())
    );
    let _ = writeln!(
        s,
        "{:<17} {:>8} {:>7} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9} {:>10} {:>9}",
        "config",
        "requests",
        "failed",
        "req/s",
        "p50 ms",
        "p99 ms",
        "base MiB",
        "peak MiB",
        "end MiB",
        "reserved",
        "live",
        "malloc",
        "reclaimed",
        "refusals"
    );
    for r in reports {
        let (reclaimed, refusals) = match &r.budget {
            Some(b) => (mib(b.reclaimed), b.refusals.to_string()),
            None => ("-".into(), "-".into()),
        };
        let _ = writeln!(
            s,
            "{:<17} {:>8} {:>7} {:>8.2} {:>8.1} {:>8.1} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9} {:>10} {:>9}",
            r.config,
            r.requests,
            r.failed,
            r.requests_per_second,
            r.latency_p50_ms,
            r.latency_p99_ms,
            mib(r.baseline_rss_bytes),
            mib(r.peak_rss_bytes),
            mib(r.end_rss_bytes),
            r.peak_reserved_bytes.map_or("-".into(), mib),
            r.peak_live_bytes.map_or("-".into(), mib),
            r.peak_malloc_bytes.map_or("-".into(), mib),
            reclaimed,
            refusals
        );
    }
    if let Some(b) = reports.iter().find_map(|r| r.budget.as_ref()) {
        let _ = writeln!(
            s,
            "budget: limit {} MiB, peak committed {} MiB, {} reclaim(s), {} commit(s) waited (up to {} ms each)",
            mib(b.limit),
            mib(b.peak_committed),
            b.reclaims,
            b.waited,
            b.wait_ms
        );
    }
    if let Some(a) = reports.iter().find_map(|r| r.admission.as_ref()) {
        let _ = writeln!(
            s,
            "admission: {} run(s), {} waited ({:.1} ms in all, longest {:.1} ms), {} went ahead of a larger one, \
             at most {} at once and {} MiB promised, {} retried alone, {} refused",
            a.admitted,
            a.waited,
            a.wait_total_ms,
            a.wait_max_ms,
            a.passed,
            a.running_peak,
            mib(a.promised_peak),
            a.retried_alone,
            a.refused
        );
    }
    for r in reports {
        for m in r.plans.iter().flatten() {
            let _ = writeln!(
                s,
                "plans {:<17} {}: exact {}, predicted {} ({} fell back), dynamic {}; on a plan from the 4th request: {}/{} ({:.1}%)",
                r.config,
                m.model,
                m.exact,
                m.predicted,
                m.fell_back,
                m.dynamic,
                m.on_plan_from_4th,
                m.runs_from_4th,
                if m.runs_from_4th > 0 {
                    100.0 * m.on_plan_from_4th as f64 / m.runs_from_4th as f64
                } else {
                    0.0
                }
            );
        }
    }
    let _ = writeln!(
        s,
        "reserved: the arenas' largest committed total (MiB); live: the most bytes live in them at once (MiB); peak: RSS high-water while serving; malloc: the most glibc's malloc held while serving (sampled)"
    );
    let _ = writeln!(
        s,
        "outputs: {}",
        match identical {
            Some(true) => "identical across the configurations that served every request",
            Some(false) => "DIFFER between configurations",
            None => "not compared (fewer than two configurations served every request)",
        }
    );
    s
}
