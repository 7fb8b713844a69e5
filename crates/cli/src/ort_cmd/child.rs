//! One strategy, run in this (child) process: load ONNX Runtime, open the
//! session, run the sequence on `--threads` workers, print a JSON report.

use super::report::{RunRow, StrategyReport};
use super::shapes;
use super::{OrtArgs, OrtStrategy};
use std::process::ExitCode;
use std::sync::Barrier;
use std::time::Instant;
use tensor_arena_ort::ort::session::RunOptions;
use tensor_arena_ort::ort::value::DynValue;
use tensor_arena_ort::{
    make_input, open_session, run_shared, ArenaOptions, ArenaSession, InputSpec, Memory, Runtime,
    SessionOptions,
};

/// Resident and peak resident bytes of this process (`VmRSS`, `VmHWM` of
/// `/proc/self/status`; `VmHWM` is what `getrusage` reports as `ru_maxrss`).
fn rss() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// What one worker did in one run.
#[derive(Clone, Default)]
struct Step {
    nanos: u64,
    hash: u64,
    peak_in_use: usize,
    reserved: usize,
    backing_calls: u64,
    /// Why the run failed (out of memory, say); the worker goes on with the
    /// next run.
    error: Option<String>,
}

/// The session of a strategy: ONNX Runtime's own memory, or tensor-arena's.
enum Target {
    Ort {
        session: tensor_arena_ort::ort::session::Session,
        options: Option<RunOptions>,
    },
    Arena(Box<ArenaSession>),
}

pub fn main(args: &OrtArgs, strategy: OrtStrategy) -> Result<ExitCode, String> {
    let runtime = match &args.lib {
        Some(lib) => Runtime::load(lib),
        None => Runtime::from_env(),
    }
    .map_err(|e| e.to_string())?;
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
        OrtStrategy::Arena | OrtStrategy::Planned => {
            let planned = strategy == OrtStrategy::Planned;
            let options = ArenaOptions {
                plans: planned,
                intra_threads: intra,
                ..ArenaOptions::default()
            };
            Target::Arena(Box::new(
                ArenaSession::open(runtime, &args.model, options).map_err(|e| e.to_string())?,
            ))
        }
    };
    let specs = match &target {
        Target::Ort { session, .. } => InputSpec::of(session),
        Target::Arena(s) => s.inputs().to_vec(),
    };
    // Check every run's inputs before running any.
    let mut resolved = Vec::new();
    for run in &runs {
        let r = shapes::resolve(run, &specs)?;
        for (name, dims) in &r {
            match specs.iter().find(|s| s.name == *name) {
                Some(spec) => spec.check(dims).map_err(|e| e.to_string())?,
                None => {
                    return Err(tensor_arena_ort::OrtArenaError::UnknownInput {
                        name: name.clone(),
                        known: specs.iter().map(|s| s.name.clone()).collect(),
                    }
                    .to_string())
                }
            }
        }
        resolved.push(r);
    }
    let threads = args.threads as usize;
    let ready = Barrier::new(threads + 1);
    let start = Barrier::new(threads + 1);
    let end = Barrier::new(threads + 1);
    let mut rows = Vec::new();
    let session_rss = std::thread::scope(|scope| -> Result<u64, String> {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let barriers = (&ready, &start, &end);
                let (target, specs, resolved) = (&target, &specs, &resolved);
                scope.spawn(move || worker(target, specs, resolved, barriers))
            })
            .collect();
        // The session is open and the workers are created: nothing runs yet.
        ready.wait();
        let session_rss = rss().0;
        for label in &args.inputs {
            start.wait();
            end.wait();
            let (rss_now, peak) = rss();
            rows.push(RunRow {
                label: label.clone(),
                rss_bytes: rss_now,
                peak_rss_bytes: peak,
                nanos: 0,
                peak_in_use: None,
                reserved: None,
                backing_calls: None,
                output_hash: String::new(),
                error: None,
            });
        }
        let mut per_worker = Vec::new();
        for h in handles {
            per_worker.push(
                h.join()
                    .map_err(|_| "a worker thread panicked".to_string())??,
            );
        }
        for (i, row) in rows.iter_mut().enumerate() {
            let steps: Vec<Step> = per_worker
                .iter()
                .map(|w: &Vec<Step>| w[i].clone())
                .collect();
            if let Some(e) = steps.iter().find_map(|s| s.error.clone()) {
                row.error = Some(e);
                continue;
            }
            if steps.iter().any(|s| s.hash != steps[0].hash) {
                return Err(format!(
                    "run {}: workers disagree on the outputs",
                    row.label
                ));
            }
            row.nanos = steps.iter().map(|s| s.nanos).max().unwrap_or(0);
            row.output_hash = format!("{:016x}", steps[0].hash);
            if strategy.is_arena() {
                row.peak_in_use = Some(steps.iter().map(|s| s.peak_in_use as u64).sum());
                row.reserved = Some(steps.iter().map(|s| s.reserved as u64).sum());
                row.backing_calls = Some(steps.iter().map(|s| s.backing_calls).sum());
            }
        }
        Ok(session_rss)
    })?;
    let report = StrategyReport {
        strategy: strategy.name().to_string(),
        session_rss_bytes: session_rss,
        runs: rows,
    };
    println!(
        "{}",
        serde_json::to_string(&report).map_err(|e| e.to_string())?
    );
    Ok(ExitCode::SUCCESS)
}

/// One worker thread: every run of the sequence, in step with the others.
/// On an error it still takes part in every barrier, so nobody waits forever.
fn worker(
    target: &Target,
    specs: &[InputSpec],
    runs: &[Vec<(String, Vec<usize>)>],
    (ready, start, end): (&Barrier, &Barrier, &Barrier),
) -> Result<Vec<Step>, String> {
    let mut arena_worker = match target {
        Target::Arena(s) => Some(s.worker().map_err(|e| e.to_string())),
        Target::Ort { .. } => None,
    }
    .transpose();
    ready.wait();
    let mut steps = Vec::new();
    let mut error = None;
    for (i, run) in runs.iter().enumerate() {
        start.wait();
        if error.is_none() {
            match (&mut arena_worker, target) {
                (Err(e), _) => error = Some(e.clone()),
                (Ok(w), _) => match one_run(target, w.as_mut(), specs, run, i as u64) {
                    Ok(step) => steps.push(step),
                    // A failed run (out of memory, say) is reported as that
                    // run's result; the worker and the session go on.
                    Err(e) => steps.push(Step {
                        error: Some(e),
                        ..Step::default()
                    }),
                },
            }
        }
        end.wait();
    }
    match error {
        Some(e) => Err(e),
        None => Ok(steps),
    }
}

fn one_run(
    target: &Target,
    worker: Option<&mut tensor_arena_ort::SessionWorker>,
    specs: &[InputSpec],
    run: &[(String, Vec<usize>)],
    seed: u64,
) -> Result<Step, String> {
    let mut values: Vec<(String, DynValue)> = Vec::new();
    for (k, (name, dims)) in run.iter().enumerate() {
        let spec = specs
            .iter()
            .find(|s| s.name == *name)
            .ok_or_else(|| format!("no input {name}"))?;
        let v = make_input(spec, dims, seed.wrapping_mul(1000).wrapping_add(k as u64))
            .map_err(|e| e.to_string())?;
        values.push((name.clone(), v));
    }
    let inputs: Vec<(&str, &DynValue)> = values.iter().map(|(n, v)| (n.as_str(), v)).collect();
    let mut step = Step::default();
    match (target, worker) {
        (Target::Ort { session, options }, _) => {
            let t = Instant::now();
            let outputs = run_shared(session, &inputs, options.as_ref()).map_err(|e| {
                let text = e.to_string();
                // ONNX Runtime's own allocators throw `std::bad_alloc` or
                // report a failed arena allocation.
                if text.contains("bad_alloc") || text.contains("Failed to allocate memory") {
                    format!("out of memory: {text}")
                } else {
                    text
                }
            })?;
            step.nanos = t.elapsed().as_nanos() as u64;
            step.hash =
                tensor_arena_ort::hash_outputs(outputs.iter().map(|(n, v)| (n.as_str(), v)))
                    .map_err(|e| e.to_string())?;
        }
        (Target::Arena(_), Some(w)) => {
            let before = w.stats();
            let t = Instant::now();
            let out = w.run(&inputs).map_err(|e| e.to_string())?;
            step.nanos = t.elapsed().as_nanos() as u64;
            step.hash = out.hash().map_err(|e| e.to_string())?;
            step.peak_in_use = out.report.peak_in_use;
            drop(out);
            let after = w.stats();
            step.reserved = after.reserved;
            step.backing_calls = (after.backing_allocs + after.backing_frees)
                - (before.backing_allocs + before.backing_frees);
        }
        (Target::Arena(_), None) => return Err("no worker".into()),
    }
    Ok(step)
}
