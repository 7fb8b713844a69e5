//! One strategy, run in this (child) process: load ONNX Runtime, open the
//! session, run the sequence on `--threads` workers, print a JSON report.
//!
//! The main thread and the workers move in step through barriers: before
//! each run the workers make its inputs and give back what their arenas
//! hold beyond what the run's own plan needs
//! ([`SessionWorker::prepare`], which a run does itself as it starts; its
//! time counts in the run's), then are parked (at `prepared`) while the
//! main thread resets the peak RSS; after the run they are parked again
//! (at the next `start`, or at `release` after the last run) while the
//! main thread reads the RSS and its peak, so every row is measured with
//! the workers holding their arenas. Only after the last row is measured
//! are the workers released to drop them. Progress goes to stderr, one
//! line per run.

use super::checks::{self, Resolved};
use super::report::{RunRow, StrategyReport};
use super::values::{self, ValueSpec};
use super::{rss, shapes};
use super::{OrtArgs, OrtStrategy};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};
use tensor_arena_ort::ort::logging::LogLevel;
use tensor_arena_ort::ort::session::RunOptions;
use tensor_arena_ort::ort::value::DynValue;
use tensor_arena_ort::{
    make_input, open_session, run_shared, ArenaOptions, ArenaSession, InputSpec, Memory, Runtime,
    SessionOptions,
};

/// Test hook: milliseconds the main thread waits after each run before it
/// measures the RSS, so that tests can check that the workers still hold
/// their arenas then (they are parked until it has measured). Nothing else
/// reads it.
pub const MEASURE_DELAY_HOOK: &str = "TENSOR_ARENA_TEST_ORT_MEASURE_DELAY_MS";

/// What one worker did in one run.
#[derive(Clone, Default)]
struct Step {
    nanos: u64,
    hash: u64,
    peak_in_use: usize,
    reserved: usize,
    lazily_given_back: usize,
    /// Memory-layer calls of the worker's arena during the run:
    /// reservations, releases, commits and decommits.
    memory_calls: u64,
    /// Commits of the worker's arena that took base pages because huge
    /// pages were slow to populate (`Stats::slow_huge_commits`).
    slow_huge_commits: u64,
    /// Why the run failed (out of memory, say); the worker goes on with the
    /// next run.
    error: Option<String>,
    /// How the run was planned (arena strategies).
    plan: Option<String>,
}

/// The session of a strategy: ONNX Runtime's own memory, or tensor-arena's.
enum Target {
    Ort {
        session: tensor_arena_ort::ort::session::Session,
        options: Option<RunOptions>,
    },
    Arena(Box<ArenaSession>),
}

/// The barriers the main thread and the workers meet at.
struct Barriers {
    ready: Barrier,
    start: Barrier,
    /// The workers have made the run's inputs and given back what it does
    /// not need: its peak RSS starts after this.
    prepared: Barrier,
    go: Barrier,
    end: Barrier,
    release: Barrier,
    /// Set by a worker whose run failed; read and cleared by the main
    /// thread after the run, for the progress line.
    failed: AtomicBool,
}

/// What every worker needs to run the sequence.
struct Job<'a> {
    target: &'a Target,
    specs: &'a [InputSpec],
    runs: &'a [Resolved],
    values: &'a [ValueSpec],
    barriers: &'a Barriers,
}

/// Loads ONNX Runtime (`lib`, or `ORT_DYLIB_PATH`) with its log kept to
/// fatal messages: the log repeats, in colour, every error it also returns
/// (and the commands report), unless the user asked for more with
/// `ORT_LOG`.
pub(crate) fn load_runtime(lib: Option<&std::path::Path>) -> Result<&'static Runtime, String> {
    let runtime = match lib {
        Some(lib) => Runtime::load(lib),
        None => Runtime::from_env(),
    }
    .map_err(|e| e.to_string())?;
    if std::env::var_os("ORT_LOG").is_none() {
        runtime.environment().set_log_level(LogLevel::Fatal);
    }
    Ok(runtime)
}

/// A failed run's message, said to be out of memory where it is: ONNX
/// Runtime's own allocators (and tensor-arena's, refused) throw
/// `std::bad_alloc` or report a failed arena allocation.
pub(crate) fn run_error(text: String) -> String {
    if text.contains("bad_alloc") || text.contains("Failed to allocate memory") {
        format!("out of memory: {text}")
    } else {
        text
    }
}

pub fn main(args: &OrtArgs, strategy: OrtStrategy) -> Result<ExitCode, String> {
    let runtime = load_runtime(args.lib.as_deref())?;
    let given = values::parse_all(&args.values)?;
    let runs: Vec<shapes::RunInputs> = args
        .inputs
        .iter()
        .map(|s| shapes::parse_run(s))
        .collect::<Result<_, _>>()?;
    let intra = args.intra_threads as usize;
    let target = match strategy {
        OrtStrategy::OrtArena | OrtStrategy::OrtShrink | OrtStrategy::OrtNoArena => {
            let memory = if strategy == OrtStrategy::OrtNoArena {
                Memory::OrtNoArena
            } else {
                Memory::OrtArena
            };
            let session = open_session(
                runtime,
                &args.model,
                SessionOptions {
                    memory,
                    intra_threads: intra,
                },
            )
            .map_err(|e| e.to_string())?;
            let options = if strategy == OrtStrategy::OrtShrink {
                let mut o = RunOptions::new().map_err(|e| e.to_string())?;
                o.set("memory.enable_memory_arena_shrinkage", "cpu:0")
                    .map_err(|e| e.to_string())?;
                Some(o)
            } else {
                None
            };
            Target::Ort { session, options }
        }
        OrtStrategy::Arena
        | OrtStrategy::Planned
        | OrtStrategy::PlannedKeep
        | OrtStrategy::PlannedLazy => {
            let options = ArenaOptions {
                plans: strategy != OrtStrategy::Arena,
                intra_threads: intra,
                shrink: if strategy == OrtStrategy::PlannedKeep {
                    tensor_arena_ort::Shrink::KeepLargest
                } else {
                    tensor_arena_ort::Shrink::FollowInput { runs: 1 }
                },
                pages: tensor_arena_ort::PagesConfig {
                    give_back: if strategy == OrtStrategy::PlannedLazy {
                        tensor_arena_ort::GiveBack::Lazily
                    } else {
                        tensor_arena_ort::GiveBack::Now
                    },
                    ..tensor_arena_ort::PagesConfig::default()
                },
                ..ArenaOptions::default()
            };
            let options = match &args.plans {
                Some(dir) if options.plans => {
                    let model = std::fs::read(&args.model)
                        .map_err(|e| format!("cannot read {}: {e}", args.model.display()))?;
                    let key = tensor_arena_ort::model_key(
                        &model,
                        runtime.version(),
                        &format!("intra_threads={intra}"),
                    );
                    ArenaOptions {
                        plan_store: Some(tensor_arena_ort::PlanStore::new(dir, key)),
                        ..options
                    }
                }
                _ => options,
            };
            Target::Arena(Box::new(
                ArenaSession::open(runtime, &args.model, options).map_err(|e| e.to_string())?,
            ))
        }
    };
    let (specs, outputs) = match &target {
        Target::Ort { session, .. } => (InputSpec::of(session), session.outputs()),
        Target::Arena(s) => (s.inputs().to_vec(), s.session().outputs()),
    };
    // Check every run's inputs, the values and the outputs before running.
    let resolved = checks::inputs(&args.inputs, &runs, &specs, &given)?;
    checks::outputs(outputs)?;
    let barriers = Barriers {
        ready: Barrier::new(args.threads as usize + 1),
        start: Barrier::new(args.threads as usize + 1),
        prepared: Barrier::new(args.threads as usize + 1),
        go: Barrier::new(args.threads as usize + 1),
        end: Barrier::new(args.threads as usize + 1),
        release: Barrier::new(args.threads as usize + 1),
        failed: AtomicBool::new(false),
    };
    let job = Job {
        target: &target,
        specs: &specs,
        runs: &resolved,
        values: &given,
        barriers: &barriers,
    };
    let report = run_all(args, strategy, &job)?;
    // Saved after the last run, outside every measured one.
    if let Target::Arena(s) = &target {
        if let Some(Err(e)) = s.plans().save() {
            eprintln!("tensor-arena: cannot save the plan store: {e}");
        }
    }
    println!(
        "{}",
        serde_json::to_string(&report).map_err(|e| e.to_string())?
    );
    Ok(ExitCode::SUCCESS)
}

/// Runs the sequence on `--threads` workers and measures every run.
fn run_all(args: &OrtArgs, strategy: OrtStrategy, job: &Job<'_>) -> Result<StrategyReport, String> {
    let name = strategy.name();
    let threads = args.threads as usize;
    let total = args.inputs.len();
    let delay = std::env::var(MEASURE_DELAY_HOOK)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_millis);
    let b = job.barriers;
    let mut rows = Vec::new();
    let mut peak_error = None;
    let mut process_peak = 0;
    let session_rss = std::thread::scope(|scope| -> Result<u64, String> {
        let handles: Vec<_> = (0..threads).map(|_| scope.spawn(|| worker(job))).collect();
        // The session is open and the workers are created: nothing runs yet.
        b.ready.wait();
        let (session_rss, session_peak) = rss::read();
        // Resetting the peak resets the process's own (`ru_maxrss` too):
        // its peak is the largest of the peaks read before each reset.
        process_peak = session_peak;
        eprintln!(
            "[{name}] session open ({:.1} MiB RSS); {total} run(s) on {threads} thread(s)",
            session_rss as f64 / (1024.0 * 1024.0)
        );
        for (i, label) in args.inputs.iter().enumerate() {
            b.start.wait();
            // The workers are parked at `prepared`, the run's inputs made and
            // what it does not need given back: its peak starts from here.
            b.prepared.wait();
            if let Err(e) = rss::reset_peak() {
                peak_error.get_or_insert(e);
            }
            let t = Instant::now();
            b.go.wait();
            b.end.wait();
            let wall = t.elapsed();
            if let Some(d) = delay {
                std::thread::sleep(d);
            }
            // The workers are parked again (at the next `start`, or at
            // `release`), holding their arenas.
            let (rss_now, peak) = rss::read();
            process_peak = process_peak.max(peak);
            let outcome = if b.failed.swap(false, Ordering::Relaxed) {
                "FAILED after"
            } else {
                "done in"
            };
            eprintln!(
                "[{name}] run {}/{total} ({label}) {outcome} {:.1} ms",
                i + 1,
                wall.as_secs_f64() * 1e3
            );
            rows.push(RunRow {
                label: label.clone(),
                rss_bytes: rss_now,
                peak_rss_bytes: peak,
                nanos: 0,
                peak_in_use: None,
                reserved: None,
                lazily_given_back: None,
                backing_calls: None,
                slow_huge_commits: None,
                output_hash: String::new(),
                error: None,
                plan: None,
            });
        }
        // Every row is measured: the workers may drop their arenas now.
        b.release.wait();
        let mut per_worker = Vec::new();
        for h in handles {
            per_worker.push(
                h.join()
                    .map_err(|_| "a worker thread panicked".to_string())??,
            );
        }
        for (i, row) in rows.iter_mut().enumerate() {
            let steps: Vec<&Step> = per_worker.iter().map(|w: &Vec<Step>| &w[i]).collect();
            fill_row(row, &steps, strategy);
        }
        Ok(session_rss)
    })?;
    Ok(StrategyReport {
        strategy: name.to_string(),
        session_rss_bytes: session_rss,
        peak_rss_per_run: peak_error.is_none(),
        peak_rss_note: peak_error,
        process_peak_rss_bytes: Some(process_peak).filter(|&p| p > 0),
        runs: rows,
    })
}

/// Puts the workers' results of one run into its row.
fn fill_row(row: &mut RunRow, steps: &[&Step], strategy: OrtStrategy) {
    if let Some(e) = steps.iter().find_map(|s| s.error.clone()) {
        row.error = Some(e);
        return;
    }
    if steps.iter().any(|s| s.hash != steps[0].hash) {
        row.error = Some("the workers' outputs differ".into());
        return;
    }
    row.nanos = steps.iter().map(|s| s.nanos).max().unwrap_or(0);
    row.output_hash = format!("{:016x}", steps[0].hash);
    if strategy.is_arena() {
        row.peak_in_use = Some(steps.iter().map(|s| s.peak_in_use as u64).sum());
        row.reserved = Some(steps.iter().map(|s| s.reserved as u64).sum());
        row.lazily_given_back = Some(steps.iter().map(|s| s.lazily_given_back as u64).sum());
        row.backing_calls = Some(steps.iter().map(|s| s.memory_calls).sum());
        row.slow_huge_commits = Some(steps.iter().map(|s| s.slow_huge_commits).sum());
        row.plan = steps[0].plan.clone();
    }
}

/// One worker thread: every run of the sequence, in step with the others.
/// On an error it still takes part in every barrier, so nobody waits
/// forever; it drops its arena only once released, after the last row is
/// measured.
fn worker(job: &Job<'_>) -> Result<Vec<Step>, String> {
    let b = job.barriers;
    let mut arena_worker = match job.target {
        Target::Arena(s) => Some(s.worker().map_err(|e| e.to_string())),
        Target::Ort { .. } => None,
    }
    .transpose();
    b.ready.wait();
    let mut steps = Vec::new();
    for (i, run) in job.runs.iter().enumerate() {
        b.start.wait();
        let ready = match &mut arena_worker {
            Ok(w) => Some(prepare(job, w.as_mut(), run, i as u64)),
            Err(_) => None,
        };
        b.prepared.wait();
        b.go.wait();
        if let (Ok(w), Some(ready)) = (&mut arena_worker, ready) {
            let step = ready.and_then(|ready| one_run(job, w.as_mut(), &ready));
            let step = step.unwrap_or_else(|e| {
                b.failed.store(true, Ordering::Relaxed);
                // A failed run (out of memory, say) is reported as that
                // run's result; the worker and the session go on.
                Step {
                    error: Some(e.trim_end().to_string()),
                    ..Step::default()
                }
            });
            steps.push(step);
        }
        b.end.wait();
    }
    b.release.wait();
    arena_worker.map(|_| steps)
}

/// The inputs of one run: `--value`s where given, `make_input`'s defaults
/// elsewhere.
fn inputs(
    job: &Job<'_>,
    run: &[(String, Vec<usize>)],
    seed: u64,
) -> Result<Vec<(String, DynValue)>, String> {
    let mut values = Vec::new();
    for (k, (name, dims)) in run.iter().enumerate() {
        let spec = job
            .specs
            .iter()
            .find(|s| s.name == *name)
            .ok_or_else(|| format!("no input {name}"))?;
        let seed = seed.wrapping_mul(1000).wrapping_add(k as u64);
        let v = match job.values.iter().find(|v| v.name == *name) {
            Some(v) => values::make(spec, dims, v, seed)?,
            None => make_input(spec, dims, seed).map_err(|e| e.to_string())?,
        };
        values.push((name.clone(), v));
    }
    Ok(values)
}

/// A run's inputs, made before it, and what giving back before it cost.
struct Ready {
    values: Vec<(String, DynValue)>,
    /// Nanoseconds of the give-back (counted in the run's time).
    nanos: u64,
    /// Memory-layer calls of the give-back (counted in the run's).
    memory_calls: u64,
    /// Commits of the give-back that found huge pages slow (counted in the
    /// run's).
    slow_huge_commits: u64,
}

/// Makes a run's inputs; an arena worker then gives back what its arena
/// holds beyond what the run's own plan needs, as the run would as it
/// starts.
fn prepare(
    job: &Job<'_>,
    worker: Option<&mut tensor_arena_ort::SessionWorker>,
    run: &[(String, Vec<usize>)],
    seed: u64,
) -> Result<Ready, String> {
    let values = inputs(job, run, seed)?;
    let mut ready = Ready {
        values,
        nanos: 0,
        memory_calls: 0,
        slow_huge_commits: 0,
    };
    if let Some(w) = worker {
        let named: Vec<(&str, &DynValue)> =
            ready.values.iter().map(|(n, v)| (n.as_str(), v)).collect();
        let before = w.stats();
        let t = Instant::now();
        w.prepare(&named).map_err(|e| e.to_string())?;
        ready.nanos = t.elapsed().as_nanos() as u64;
        let after = w.stats();
        ready.memory_calls = after.memory_calls() - before.memory_calls();
        // Counted by the arenas alive: one dropped between the two reads
        // takes its count with it.
        ready.slow_huge_commits = after
            .slow_huge_commits
            .saturating_sub(before.slow_huge_commits);
    }
    Ok(ready)
}

fn one_run(
    job: &Job<'_>,
    worker: Option<&mut tensor_arena_ort::SessionWorker>,
    ready: &Ready,
) -> Result<Step, String> {
    let inputs: Vec<(&str, &DynValue)> =
        ready.values.iter().map(|(n, v)| (n.as_str(), v)).collect();
    let mut step = Step::default();
    match (job.target, worker) {
        (Target::Ort { session, options }, _) => {
            let t = Instant::now();
            let outputs = run_shared(session, &inputs, options.as_ref())
                .map_err(|e| run_error(e.to_string()))?;
            step.nanos = t.elapsed().as_nanos() as u64;
            step.hash =
                tensor_arena_ort::hash_outputs(outputs.iter().map(|(n, v)| (n.as_str(), v)))
                    .map_err(|e| e.to_string())?;
        }
        (Target::Arena(_), Some(w)) => {
            let before = w.stats();
            let t = Instant::now();
            let out = w.run(&inputs).map_err(|e| e.to_string())?;
            step.nanos = t.elapsed().as_nanos() as u64 + ready.nanos;
            step.hash = out.hash().map_err(|e| e.to_string())?;
            step.peak_in_use = out.report.peak_in_use;
            step.plan = Some(out.plan.map_or_else(
                || "not served".into(),
                |p| crate::strategies::served_as(p, &out.report),
            ));
            drop(out);
            let after = w.stats();
            step.reserved = after.reserved;
            step.lazily_given_back = after.lazily_given_back;
            step.memory_calls = after.memory_calls() - before.memory_calls() + ready.memory_calls;
            step.slow_huge_commits = after
                .slow_huge_commits
                .saturating_sub(before.slow_huge_commits)
                + ready.slow_huge_commits;
        }
        (Target::Arena(_), None) => return Err("no worker".into()),
    }
    Ok(step)
}
