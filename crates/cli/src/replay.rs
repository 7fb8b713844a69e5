//! Replaying a [`Workload`] through one allocation strategy and measuring it.
//!
//! Every strategy implements [`Backend`]; [`replay`] drives it run by run,
//! with the same events, the same buffer touching and the same measurements
//! (wall time, minor page faults, and optionally a timeline of bytes in use
//! and reserved after every event).

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::os;
use crate::workload::{Ev, Workload};

/// Bytes per page for `--touch pages`.
pub const PAGE: usize = 4096;

/// Alignment every strategy is asked for (a cache line, as the arena's
/// default and onnxruntime's CPU allocator use).
pub const ALIGN: usize = 64;

/// How a buffer is written when it is handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Touch {
    /// One write per 4 KiB page the buffer spans, so first use of memory
    /// page-faults as it would when a kernel writes its output.
    Pages,
    /// Every byte written.
    Full,
    /// Not written at all.
    None,
}

/// When the arena strategies give memory back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ShrinkMode {
    /// Never: the arena keeps what it grew to.
    Never,
    /// `ShrinkPolicy::AfterEveryRun`: down to the watermark after each run.
    AfterRun,
    /// Call `Arena::shrink()` after a run whose lower bound is smaller than
    /// the previous run's (what a runtime does when traffic moves to smaller
    /// inputs).
    ManualAfterSmaller,
}

/// Writes to the first byte of every `PAGE`-sized page that the buffer at
/// address `addr` of `len` bytes overlaps; returns the offsets to write.
pub fn page_offsets(addr: usize, len: usize) -> impl Iterator<Item = usize> {
    let first_boundary = (PAGE - addr % PAGE) % PAGE;
    let rest = (first_boundary..len).step_by(PAGE).filter(|&o| o != 0);
    (len > 0).then_some(0).into_iter().chain(rest)
}

/// Writes `buf` as `touch` says (for strategies that hand out initialized
/// memory, like the arena).
pub fn touch_slice(buf: &mut [u8], touch: Touch) {
    match touch {
        Touch::None => {}
        Touch::Pages => {
            let addr = buf.as_ptr() as usize;
            for off in page_offsets(addr, buf.len()) {
                buf[off] = 1;
            }
        }
        Touch::Full => buf.fill(0xA5),
    }
    std::hint::black_box(buf);
}

/// What a strategy reports at the end of a run.
#[derive(Clone, Debug, Default)]
pub struct EndOfRun {
    /// Highest bytes in use during the run, as the strategy counts them.
    pub peak_in_use: u64,
    /// Bytes held after the run (see the strategy's `reserved` meaning).
    pub reserved: Option<u64>,
    /// Calls to the backing allocator during the run (and its end).
    pub backing_calls: Option<u64>,
    /// How a planning strategy served the run (exact plan, predicted,
    /// fell back and why, dynamic and why); `None` for the others.
    pub plan: Option<String>,
    /// The run's high-water mark in the arena (how far into one free
    /// region its blocks reached); arena strategies only.
    pub high_water: Option<u64>,
}

/// One allocation strategy, driven by [`replay`].
pub trait Backend {
    /// Opens a run that allocates ids `0..ids`.
    fn begin_run(&mut self, ids: usize);
    /// Allocates buffer `id` of `bytes` bytes and writes it as `touch` says.
    ///
    /// # Errors
    /// A message when the strategy cannot serve it (over the cap, out of
    /// memory); the run is then aborted.
    fn alloc(&mut self, id: usize, bytes: usize, touch: Touch) -> Result<(), String>;
    /// Frees buffer `id`, which is live.
    fn free(&mut self, id: usize);
    /// Frees every live buffer (after a failed allocation).
    fn abort_run(&mut self);
    /// Closes the run; `smaller` says its lower bound was below the previous
    /// run's.
    fn end_run(&mut self, smaller: bool) -> EndOfRun;
    /// What a server does between runs, off the runs' clock: the
    /// planner's refits, which `tensor-arena-ort` leaves to its background
    /// thread. Returns how long it took (nothing by default).
    fn between_runs(&mut self) -> Duration {
        Duration::ZERO
    }
    /// Bytes in use now, as the strategy counts them.
    fn in_use(&self) -> u64;
    /// Bytes reserved now, if known.
    fn reserved(&self) -> Option<u64>;
}

/// What one run of one strategy did. Field names are part of the `--json`
/// output: scripts rely on them.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunResult {
    /// The run's label (input shape).
    pub label: String,
    /// Allocations in the run.
    pub allocs: u64,
    /// Most bytes live at once (no strategy can hold less during the run).
    pub lower_bound: u64,
    /// Highest bytes in use during the run, as the strategy counts them
    /// (the arena rounds to its alignment; bump never reuses).
    pub peak_in_use: u64,
    /// Bytes held after the run (meaning per strategy: see `reserved_is`).
    pub reserved: Option<u64>,
    /// Calls to the backing allocator during the run.
    pub backing_calls: Option<u64>,
    /// How the run was served on a plan (planning strategies only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    /// The run's high-water mark (arena strategies only): with the lower
    /// bound, what placement cost at first sight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_water: Option<u64>,
    /// Minor page faults of the process during the run.
    pub minor_faults: Option<u64>,
    /// Resident memory of the process after the run (`/proc/self/statm`),
    /// baseline included.
    pub rss_bytes: Option<u64>,
    /// Wall time of the run in nanoseconds.
    pub nanos: u64,
    /// Why the run was aborted, if it was (an allocation failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Totals of one strategy over the whole replay.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Summary {
    /// Sum of the runs' wall times.
    pub total_nanos: u64,
    /// Largest `reserved` after any run.
    pub max_reserved: Option<u64>,
    /// Largest lower bound of any run.
    pub max_lower_bound: u64,
    /// `max_reserved / max_lower_bound`.
    pub reserved_over_lower_bound: Option<f64>,
    /// Sum of the runs' minor page faults.
    pub minor_faults: Option<u64>,
    /// Sum of the runs' backing calls.
    pub backing_calls: Option<u64>,
    /// Runs aborted because an allocation failed.
    pub failed_runs: u64,
    /// Planning strategies: runs by how they were served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plans: Option<PlanCounts>,
    /// Planning strategies: the time of the refits the runs left, made
    /// between runs (not in `total_nanos`: `tensor-arena-ort` makes them
    /// on its background thread, off the runs' threads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learn_nanos: Option<u64>,
}

/// Runs of a planning strategy by how they were served.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PlanCounts {
    /// Served by their own key's plan.
    pub exact: u64,
    /// Served by a plan predicted from their family (including those that
    /// fell back).
    pub predicted: u64,
    /// Predicted runs that left the prediction.
    pub fell_back: u64,
    /// Served dynamically.
    pub dynamic: u64,
}

impl PlanCounts {
    /// The counts of a plan cache's families.
    pub fn of(c: &tensor_arena::FamilyCounts) -> Self {
        Self {
            exact: c.exact,
            predicted: c.predicted,
            fell_back: c.fell_back(),
            dynamic: c.dynamic,
        }
    }

    /// `exact / predicted / fell back / dynamic`, for tables.
    pub fn cell(&self) -> String {
        format!(
            "{}/{}/{}/{}",
            self.exact, self.predicted, self.fell_back, self.dynamic
        )
    }
}

/// The timeline of one strategy: bytes after each event, for `--svg`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Timeline {
    /// `(event index over the whole replay, in use, reserved)`.
    pub samples: Vec<(u64, u64, Option<u64>)>,
}

/// What one strategy did over the whole replay.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StrategyResult {
    /// The strategy's name (`arena`, `system`, ...).
    pub name: String,
    /// What `reserved` means for it.
    pub reserved_is: String,
    /// A remark (e.g. a fallback), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Why the strategy has no (or not all) results: its child process
    /// failed (killed by a signal, exited with an error, sent no report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Resident memory of the process just before the strategy's first
    /// allocation (`/proc/self/statm`): the binary, the workload and the
    /// replay's own bookkeeping.
    pub baseline_rss_bytes: Option<u64>,
    /// Highest resident memory of the strategy's child process over its
    /// life (`ru_maxrss` from `wait4`), baseline included; `None` with
    /// `--in-process`, where the process's peak is shared by every strategy.
    pub peak_rss_bytes: Option<u64>,
    /// One entry per run, in order.
    pub runs: Vec<RunResult>,
    /// Totals.
    pub summary: Summary,
    /// Samples for the SVG (not in the JSON).
    #[serde(skip)]
    pub timeline: Timeline,
}

/// Prints `[strategy] run i/n` lines on stderr once a replay has taken more
/// than a second.
#[derive(Debug)]
pub struct Progress {
    start: Instant,
}

impl Progress {
    /// Starts the clock.
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
        }
    }

    /// Reports that `strategy`, the `k`-th of `n`, started in child process
    /// `pid`.
    pub fn child_started(&self, strategy: &str, pid: u32, k: usize, n: usize) {
        let elapsed = self.start.elapsed();
        if elapsed > Duration::from_secs(1) {
            eprintln!(
                "[{strategy}] child process {pid} started ({k}/{n} strategies, {:.1} s)",
                elapsed.as_secs_f64()
            );
        }
    }

    /// Reports that `strategy` finished run `done` of `total`.
    pub fn run_done(&self, strategy: &str, done: usize, total: usize) {
        let elapsed = self.start.elapsed();
        if elapsed > Duration::from_secs(1) {
            eprintln!(
                "[{strategy}] run {done}/{total} ({:.1} s)",
                elapsed.as_secs_f64()
            );
        }
    }
}

/// Replays `workload` through `backend`; `timeline` records a sample after
/// every event (not counted in the times).
pub fn replay<B: Backend>(
    name: &str,
    reserved_is: &'static str,
    backend: &mut B,
    workload: &Workload,
    touch: Touch,
    timeline: bool,
    progress: &Progress,
) -> StrategyResult {
    let mut runs = Vec::with_capacity(workload.runs.len());
    let mut samples = Vec::new();
    if timeline {
        samples.reserve(workload.events() + workload.runs.len());
    }
    let mut x = 0u64;
    let mut between = Duration::ZERO;
    let mut previous_lb: Option<usize> = None;
    let rss = os::Rss::new();
    let baseline_rss_bytes = rss.bytes();
    for (i, run) in workload.runs.iter().enumerate() {
        let lower_bound = run.lower_bound();
        let allocs = run.allocs();
        let run_start = x;
        let mut sampling = Duration::ZERO;
        let mut error = None;
        between += backend.between_runs();
        let faults_before = os::minor_faults();
        let start = Instant::now();
        backend.begin_run(allocs);
        for ev in &run.events {
            match *ev {
                Ev::Alloc { id, bytes } => {
                    if let Err(e) = backend.alloc(id as usize, bytes, touch) {
                        error = Some(e);
                        break;
                    }
                }
                Ev::Free { id } => backend.free(id as usize),
            }
            x += 1;
            if timeline {
                let t = Instant::now();
                samples.push((x, backend.in_use(), backend.reserved()));
                sampling += t.elapsed();
            }
        }
        if error.is_some() {
            backend.abort_run();
        }
        let smaller = previous_lb.is_some_and(|p| lower_bound < p);
        let end = backend.end_run(smaller);
        let elapsed = start.elapsed().saturating_sub(sampling);
        let faults_after = os::minor_faults();
        let rss_bytes = rss.bytes();
        // An aborted run skips its remaining events on the timeline too.
        x = run_start + run.events.len() as u64;
        if timeline {
            samples.push((x, backend.in_use(), backend.reserved()));
        }
        previous_lb = Some(lower_bound);
        runs.push(RunResult {
            label: run.label.clone(),
            allocs: allocs as u64,
            lower_bound: lower_bound as u64,
            peak_in_use: end.peak_in_use,
            reserved: end.reserved,
            backing_calls: end.backing_calls,
            plan: end.plan,
            high_water: end.high_water,
            minor_faults: faults_before
                .zip(faults_after)
                .map(|(a, b)| b.saturating_sub(a)),
            rss_bytes,
            nanos: u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX),
            error,
        });
        progress.run_done(name, i + 1, workload.runs.len());
    }
    let mut summary = summarize(&runs);
    summary.learn_nanos =
        (!between.is_zero()).then(|| u64::try_from(between.as_nanos()).unwrap_or(u64::MAX));
    StrategyResult {
        name: name.to_owned(),
        reserved_is: reserved_is.to_owned(),
        note: None,
        error: None,
        baseline_rss_bytes,
        peak_rss_bytes: None,
        runs,
        summary,
        timeline: Timeline { samples },
    }
}

/// Totals over `runs`.
pub fn summarize(runs: &[RunResult]) -> Summary {
    let sum = |f: fn(&RunResult) -> Option<u64>| -> Option<u64> { runs.iter().map(f).sum() };
    let max_reserved = runs
        .iter()
        .map(|r| r.reserved)
        .try_fold(0u64, |m, r| r.map(|r| m.max(r)));
    let max_lower_bound = runs.iter().map(|r| r.lower_bound).max().unwrap_or(0);
    Summary {
        total_nanos: runs.iter().map(|r| r.nanos).sum(),
        max_reserved,
        max_lower_bound,
        reserved_over_lower_bound: max_reserved
            .filter(|_| max_lower_bound > 0)
            .map(|r| r as f64 / max_lower_bound as f64),
        minor_faults: sum(|r| r.minor_faults),
        backing_calls: sum(|r| r.backing_calls),
        failed_runs: runs.iter().filter(|r| r.error.is_some()).count() as u64,
        plans: None,
        learn_nanos: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_offsets_hit_every_page_once() {
        let v: Vec<usize> = page_offsets(0, 1).collect();
        assert_eq!(v, [0]);
        let v: Vec<usize> = page_offsets(4096, 8192).collect();
        assert_eq!(v, [0, 4096]);
        let v: Vec<usize> = page_offsets(4000, 200).collect();
        assert_eq!(v, [0, 96]);
        let v: Vec<usize> = page_offsets(4000, 96).collect();
        assert_eq!(v, [0]);
        let v: Vec<usize> = page_offsets(100, 0).collect();
        assert!(v.is_empty());
        let v: Vec<usize> = page_offsets(64, 8192).collect();
        assert_eq!(v, [0, 4032, 8128]);
    }
}
