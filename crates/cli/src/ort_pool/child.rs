//! One configuration, served in this (child) process: the three sessions
//! open, `--workers` threads taking requests from one counter, the main
//! thread sampling progress; then one JSON report on stdout.
//!
//! The main thread and the workers meet at barriers: `ready` once the
//! workers are made (the main thread then reads the baseline RSS and resets
//! the peak), `start` to take the first requests, `finished` after the last request (the main thread reads the RSS
//! with the workers still holding their memory), `release` to let them go.

use super::report::{AdmissionReport, BudgetReport, ConfigReport, ModelPlans};
use super::stream::{self, Request, Stage};
use super::{PoolArgs, PoolConfig};
use crate::ort_cmd::child::{load_runtime, run_error};
use crate::ort_cmd::rss;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use tensor_arena::Budget;
use tensor_arena_ort::ort::session::Session;
use tensor_arena_ort::ort::value::DynValue;
use tensor_arena_ort::{
    hash_outputs, make_input, open_session, run_shared, Admission, InputSpec, Memory, Plans,
    RunKey, SessionOptions, Worker, WorkerOptions,
};

/// The pipeline's three sessions, their one input each and their plans.
struct Models {
    sessions: [Session; 3],
    specs: [InputSpec; 3],
    plans: [Plans; 3],
}

/// A worker thread's memory.
enum Memories {
    /// ONNX Runtime's own (the session's arena, or the environment's).
    Ort,
    /// An arena per model.
    PerModel(Box<[Worker; 3]>),
    /// One arena for the three models.
    PerWorker(Box<Worker>),
}

/// What a worker did with one request.
struct Served {
    index: usize,
    nanos: u64,
    model_runs: u64,
    outcome: Result<u64, String>,
    /// tensor-arena: each model run's stage and whether it was served on a
    /// plan (its key's own or a predicted one) to its end.
    on_plan: Vec<(Stage, bool)>,
}

/// State the main thread and the workers share.
struct Shared<'a> {
    models: &'a Models,
    requests: &'a [Request],
    total: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    failed: AtomicU64,
    ready: Barrier,
    start: Barrier,
    finished: Barrier,
    release: Barrier,
}

pub fn main(args: &PoolArgs, config: PoolConfig) -> Result<ExitCode, String> {
    let runtime = load_runtime(args.lib.as_deref())?;
    let requests = stream::parse(&super::stream_text(args)?)?;
    let total = args.requests.map_or(requests.len(), |r| r as usize);
    let memory = match config {
        PoolConfig::OrtDefault => Memory::OrtArena,
        PoolConfig::OrtShared => Memory::OrtSharedArena,
        _ => Memory::TensorArena,
    };
    let open = |path| {
        open_session(
            runtime,
            path,
            SessionOptions {
                memory,
                intra_threads: args.intra_threads as usize,
            },
        )
        .map_err(|e| e.to_string())
    };
    let sessions = [open(&args.det)?, open(&args.cls)?, open(&args.rec)?];
    let specs = [0, 1, 2].map(|i| InputSpec::of(&sessions[i]));
    let specs = specs
        .into_iter()
        .zip(Stage::ALL)
        .map(|(s, stage)| match <[InputSpec; 1]>::try_from(s) {
            Ok([one]) => Ok(one),
            Err(s) => Err(format!(
                "the {} model has {} inputs; the OCR pipeline's have one",
                stage.name(),
                s.len()
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let specs: [InputSpec; 3] = specs.try_into().map_err(|_| "three models".to_string())?;
    // Every shape of the stream fits its model, before anything runs.
    for (i, q) in requests.iter().enumerate() {
        for (stage, shape) in &q.runs {
            specs[stage.index()]
                .check(shape)
                .map_err(|e| format!("request {} ({}): {e}", i + 1, stage.name()))?;
        }
    }
    let models = Models {
        sessions,
        specs,
        plans: match (&args.plans, config.is_arena()) {
            (Some(dir), true) => {
                let options = format!("intra_threads={}", args.intra_threads);
                let stored = |path: &std::path::Path| -> Result<Plans, String> {
                    let model = std::fs::read(path)
                        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                    let key = tensor_arena_ort::model_key(&model, runtime.version(), &options);
                    Ok(Plans::with_store(
                        64,
                        tensor_arena_ort::PlanStore::new(dir, key),
                    ))
                };
                [stored(&args.det)?, stored(&args.cls)?, stored(&args.rec)?]
            }
            _ => [Plans::default(), Plans::default(), Plans::default()],
        },
    };
    // tensor-arena's workers commit through one budget: the configuration's
    // limit, or an unlimited one that only counts (its peak is exact).
    let budget = config.is_arena().then(|| match (config, args.budget) {
        (PoolConfig::Budget, Some(limit)) => {
            Budget::with_wait(limit, Duration::from_millis(args.budget_wait))
        }
        _ => Budget::new(usize::MAX),
    });
    if config == PoolConfig::Budget && args.budget.is_none() {
        return Err("the budget configuration needs --budget".into());
    }
    // The budget configuration's runs are admitted by what they need
    // against its limit, shared by its workers.
    let admission = budget.as_ref().map(|b| Admission::of_budget(Arc::clone(b)));
    let memories = (0..args.workers)
        .map(|_| make_memories(config, budget.as_ref(), admission.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    let shared = Shared {
        models: &models,
        requests: &requests,
        total,
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        failed: AtomicU64::new(0),
        ready: Barrier::new(args.workers as usize + 1),
        start: Barrier::new(args.workers as usize + 1),
        finished: Barrier::new(args.workers as usize + 1),
        release: Barrier::new(args.workers as usize + 1),
    };
    let mut report = serve(args, config, &shared, memories, budget.as_ref())?;
    if config == PoolConfig::Budget {
        report.admission = admission.map(|a| AdmissionReport::of(&a.stats()));
    }
    // Saved after the last request, outside every measured one.
    for plans in &models.plans {
        if let Some(Err(e)) = plans.save() {
            eprintln!("tensor-arena: cannot save the plan store: {e}");
        }
    }
    println!(
        "{}",
        serde_json::to_string(&report).map_err(|e| e.to_string())?
    );
    Ok(ExitCode::SUCCESS)
}

fn make_memories(
    config: PoolConfig,
    budget: Option<&Arc<Budget>>,
    admission: Option<&Arc<Admission>>,
) -> Result<Memories, String> {
    let worker = || {
        let mut w = Worker::new(WorkerOptions {
            budget: budget.cloned(),
            ..WorkerOptions::default()
        })
        .map_err(|e| e.to_string())?;
        if config == PoolConfig::Budget {
            w.set_admission(admission.cloned());
        }
        Ok::<_, String>(w)
    };
    Ok(match config {
        PoolConfig::OrtDefault | PoolConfig::OrtShared => Memories::Ort,
        PoolConfig::ArenaPerModel => {
            Memories::PerModel(Box::new([worker()?, worker()?, worker()?]))
        }
        PoolConfig::ArenaPerWorker | PoolConfig::Budget => Memories::PerWorker(Box::new(worker()?)),
    })
}

/// Serves every request and measures.
fn serve(
    args: &PoolArgs,
    config: PoolConfig,
    shared: &Shared<'_>,
    memories: Vec<Memories>,
    budget: Option<&Arc<Budget>>,
) -> Result<ConfigReport, String> {
    let name = config.name();
    let mut served: Vec<Served> = Vec::with_capacity(shared.total);
    let mut baseline = 0;
    let mut peak_note = None;
    let mut end = (0, 0);
    let mut seconds = 0.0;
    let mut end_reserved = None;
    let mut baseline_malloc = None;
    let mut peak_malloc = None;
    std::thread::scope(|scope| -> Result<(), String> {
        let handles: Vec<_> = memories
            .into_iter()
            .map(|m| scope.spawn(move || worker(shared, m)))
            .collect();
        shared.ready.wait();
        baseline = rss::read().0;
        baseline_malloc = crate::os::malloc_held();
        peak_malloc = baseline_malloc;
        if let Err(e) = rss::reset_peak() {
            peak_note = Some(e);
        }
        tensor_arena_ort::reset_live_peak();
        eprintln!(
            "[{name}] sessions open ({:.1} MiB RSS); {} request(s) on {} worker(s)",
            baseline as f64 / (1024.0 * 1024.0),
            shared.total,
            args.workers
        );
        shared.start.wait();
        let t = Instant::now();
        let mut last_note = Instant::now();
        while shared.done.load(Ordering::Acquire) < shared.total {
            std::thread::sleep(Duration::from_millis(20));
            peak_malloc = peak_malloc.max(crate::os::malloc_held());
            if last_note.elapsed() >= Duration::from_secs(2) {
                last_note = Instant::now();
                eprintln!(
                    "[{name}] {}/{} requests, {} failed ({:.1} s)",
                    shared.done.load(Ordering::Relaxed),
                    shared.total,
                    shared.failed.load(Ordering::Relaxed),
                    t.elapsed().as_secs_f64()
                );
            }
        }
        seconds = t.elapsed().as_secs_f64();
        shared.finished.wait();
        end = rss::read();
        end_reserved = budget.map(|b| b.committed() as u64);
        shared.release.wait();
        for h in handles {
            served.extend(
                h.join()
                    .map_err(|_| "a worker thread panicked".to_string())?,
            );
        }
        Ok(())
    })?;
    served.sort_by_key(|s| s.index);
    let failed: Vec<&Served> = served.iter().filter(|s| s.outcome.is_err()).collect();
    let mut lat: Vec<u64> = served
        .iter()
        .filter(|s| s.outcome.is_ok())
        .map(|s| s.nanos)
        .collect();
    lat.sort_unstable();
    let pct = |p: f64| -> f64 {
        if lat.is_empty() {
            return 0.0;
        }
        let i = ((lat.len() as f64 - 1.0) * p).round() as usize;
        lat[i] as f64 / 1e6
    };
    let outputs_hash = failed.is_empty().then(|| {
        let h = served.iter().fold(0xCBF2_9CE4_8422_2325u64, |h, s| {
            mix(h, s.outcome.as_ref().copied().unwrap_or(0))
        });
        format!("{h:016x}")
    });
    eprintln!(
        "[{name}] {} requests in {seconds:.1} s, {} failed",
        served.len(),
        failed.len()
    );
    let plans = (!matches!(config, PoolConfig::OrtDefault | PoolConfig::OrtShared)).then(|| {
        Stage::ALL
            .iter()
            .map(|&stage| {
                let c = shared.models.plans[stage.index()].stats().runs;
                // Runs of the 4th request on, by whether a plan served them.
                let later: Vec<bool> = served
                    .iter()
                    .filter(|s| s.index >= 3)
                    .flat_map(|s| s.on_plan.iter().filter(|x| x.0 == stage).map(|x| x.1))
                    .collect();
                ModelPlans {
                    model: stage.name().to_string(),
                    exact: c.exact,
                    predicted: c.predicted,
                    fell_back: c.fell_back(),
                    dynamic: c.dynamic,
                    runs_from_4th: later.len() as u64,
                    on_plan_from_4th: later.iter().filter(|&&p| p).count() as u64,
                }
            })
            .collect()
    });
    Ok(ConfigReport {
        plans,
        config: name.to_string(),
        workers: args.workers,
        intra_threads: args.intra_threads,
        requests: served.len() as u64,
        failed: failed.len() as u64,
        first_error: failed
            .first()
            .and_then(|s| s.outcome.as_ref().err().cloned()),
        model_runs: served.iter().map(|s| s.model_runs).sum(),
        seconds,
        requests_per_second: if seconds > 0.0 {
            served.len() as f64 / seconds
        } else {
            0.0
        },
        latency_p50_ms: pct(0.50),
        latency_p99_ms: pct(0.99),
        baseline_rss_bytes: baseline,
        peak_rss_bytes: end.1,
        peak_rss_note: peak_note,
        end_rss_bytes: end.0,
        peak_reserved_bytes: budget.map(|b| b.stats().peak_committed as u64),
        end_reserved_bytes: end_reserved,
        peak_live_bytes: budget.map(|_| tensor_arena_ort::live_together().1 as u64),
        baseline_malloc_bytes: baseline_malloc,
        peak_malloc_bytes: peak_malloc,
        budget: budget.filter(|_| config == PoolConfig::Budget).map(|b| {
            let s = b.stats();
            BudgetReport {
                limit: s.limit as u64,
                peak_committed: s.peak_committed as u64,
                reclaimed: s.reclaimed,
                reclaims: s.reclaims,
                refusals: s.refusals,
                waited: s.waited,
                wait_ms: args.budget_wait,
            }
        }),
        outputs_hash,
        admission: None,
    })
}

/// Folds `x` into the hash `h`.
fn mix(h: u64, x: u64) -> u64 {
    (h ^ x).wrapping_mul(0x0100_0000_01B3).rotate_left(29)
}

/// One worker thread: takes the next request until none is left, then
/// holds its memory until released.
fn worker(shared: &Shared<'_>, mut memories: Memories) -> Vec<Served> {
    shared.ready.wait();
    shared.start.wait();
    let mut served = Vec::new();
    loop {
        let index = shared.next.fetch_add(1, Ordering::Relaxed);
        if index >= shared.total {
            break;
        }
        let request = &shared.requests[index % shared.requests.len()];
        // A panic serving one request fails that request: the worker goes
        // on, and meets the main thread at every barrier.
        let one = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            serve_one(shared.models, &mut memories, request, index)
        }))
        .unwrap_or_else(|_| Served {
            index,
            nanos: 0,
            model_runs: 0,
            outcome: Err("the worker panicked serving it".into()),
            on_plan: Vec::new(),
        });
        if one.outcome.is_err() {
            shared.failed.fetch_add(1, Ordering::Relaxed);
        }
        served.push(one);
        shared.done.fetch_add(1, Ordering::Release);
    }
    shared.finished.wait();
    shared.release.wait();
    drop(memories);
    served
}

/// Serves one request: its inputs made first (not timed), then det, cls
/// and rec in order; the first failing run fails the request.
fn serve_one(models: &Models, memories: &mut Memories, request: &Request, index: usize) -> Served {
    let mut served = Served {
        index,
        nanos: 0,
        model_runs: 0,
        outcome: Ok(0),
        on_plan: Vec::new(),
    };
    let inputs: Result<Vec<DynValue>, String> = request
        .runs
        .iter()
        .enumerate()
        .map(|(k, (stage, shape))| {
            let seed = (index as u64) << 8 | k as u64;
            make_input(&models.specs[stage.index()], shape, seed).map_err(|e| e.to_string())
        })
        .collect();
    let inputs = match inputs {
        Ok(v) => v,
        Err(e) => {
            served.outcome = Err(format!("making the inputs: {e}"));
            return served;
        }
    };
    let t = Instant::now();
    let mut h = 0u64;
    for ((stage, _), input) in request.runs.iter().zip(&inputs) {
        served.model_runs += 1;
        match run_model(models, memories, *stage, input) {
            Ok((x, on_plan)) => {
                h = mix(h, x);
                if let Some(p) = on_plan {
                    served.on_plan.push((*stage, p));
                }
            }
            Err(e) => {
                served.outcome = Err(format!("{}: {e}", stage.name()));
                served.nanos = t.elapsed().as_nanos() as u64;
                return served;
            }
        }
    }
    served.nanos = t.elapsed().as_nanos() as u64;
    served.outcome = Ok(h);
    served
}

/// One model run in the worker's memory; returns its outputs' hash and,
/// with tensor-arena, whether it was served on a plan to its end.
fn run_model(
    models: &Models,
    memories: &mut Memories,
    stage: Stage,
    input: &DynValue,
) -> Result<(u64, Option<bool>), String> {
    let i = stage.index();
    let session = &models.sessions[i];
    let named = [(models.specs[i].name.as_str(), input)];
    let run = || run_shared(session, &named, None);
    let key = || RunKey::of(&[input][..]);
    let outputs = match memories {
        Memories::Ort => run(),
        Memories::PerModel(w) => w[i].run(&models.plans[i], &key(), run),
        // Admitted by its need where the workers share one (the budget
        // configuration), and run again alone if it ran out beside others.
        Memories::PerWorker(w) => w.run_retrying(&models.plans[i], &key(), run),
    }
    .map_err(|e| run_error(e.to_string()))?;
    let info = match memories {
        Memories::Ort => None,
        Memories::PerModel(w) => w[i].last_run(),
        Memories::PerWorker(w) => w.last_run(),
    };
    let on_plan = info.map(|r| r.report.planned && !r.report.deviated);
    let hash =
        hash_outputs(outputs.iter().map(|(n, v)| (n.as_str(), v))).map_err(|e| e.to_string())?;
    Ok((hash, on_plan))
}
