//! `tensor-arena ort-pool`: a pool of worker threads serving an OCR
//! pipeline (RapidOCR's det, cls and rec) from one request stream, under
//! each memory configuration in its own child process, side by side.
//!
//! Every configuration serves the same requests (the stream, cycled to
//! `--requests`) with the same inputs (seeded by the request's index), so
//! their outputs must be identical: the parent compares one hash of every
//! output of every request. Each child reports its RSS when the sessions
//! are open (the baseline), its peak RSS while serving (the high-water mark
//! is reset once the sessions are open), its RSS at the end (the workers
//! still holding their memory), requests per second, latency percentiles,
//! failed requests, and for tensor-arena its arenas' largest reserved total
//! (sampled) and the budget's counters.

mod child;
mod report;
pub mod stream;

use clap::{Args, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use report::ConfigReport;

/// How the pool's memory is set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PoolConfig {
    /// ONNX Runtime's defaults: each session its own CPU arena, shared by
    /// the workers that run it, and its memory pattern.
    OrtDefault,
    /// ONNX Runtime's own arena, one for the environment, shared by the
    /// three sessions (`CreateAndRegisterAllocator`,
    /// `session.use_env_allocators`).
    OrtShared,
    /// tensor-arena, an arena per model per worker (three per worker).
    ArenaPerModel,
    /// tensor-arena, one arena per worker for the three models.
    ArenaPerWorker,
    /// tensor-arena, one arena per worker, all under one budget
    /// (`--budget`).
    Budget,
}

impl PoolConfig {
    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::OrtDefault => "ort-default",
            Self::OrtShared => "ort-shared",
            Self::ArenaPerModel => "arena-per-model",
            Self::ArenaPerWorker => "arena-per-worker",
            Self::Budget => "budget",
        }
    }

    /// Whether the memory is tensor-arena's.
    pub fn is_arena(self) -> bool {
        matches!(
            self,
            Self::ArenaPerModel | Self::ArenaPerWorker | Self::Budget
        )
    }
}

/// Options of `tensor-arena ort-pool`.
#[derive(Debug, Args)]
pub struct PoolArgs {
    /// PP-OCR det model (RapidOCR's `ch_PP-OCRv4_det_infer.onnx`).
    #[arg(long, value_name = "FILE")]
    pub det: PathBuf,

    /// PP-OCR cls model (`ch_ppocr_mobile_v2.0_cls_infer.onnx`).
    #[arg(long, value_name = "FILE")]
    pub cls: PathBuf,

    /// PP-OCR rec model (`ch_PP-OCRv4_rec_infer.onnx`).
    #[arg(long, value_name = "FILE")]
    pub rec: PathBuf,

    /// The request stream (format: `tools/ocr-stream.py`); default: the
    /// built-in one, 64 requests made from rendered images.
    #[arg(long, value_name = "FILE")]
    pub stream: Option<PathBuf>,

    /// Requests to serve (the stream cycled); default: the stream's length.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub requests: Option<u32>,

    /// Worker threads; each takes the next request when it is free.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub workers: u32,

    /// Threads of ONNX Runtime's intra-op pool per session. Default 1: the
    /// workers already fill the cores (0 is ONNX Runtime's own default,
    /// one per physical core, per session).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=256))]
    pub intra_threads: u32,

    /// Configurations to compare, in order.
    #[arg(long, value_delimiter = ',', default_values = ["ort-default", "ort-shared", "arena-per-model", "arena-per-worker", "budget"])]
    pub configs: Vec<PoolConfig>,

    /// The budget's limit (e.g. 512MiB, 1G). Default: the largest reserved
    /// total the arena-per-worker configuration reached (sampled), which
    /// must then run before it.
    #[arg(long, value_name = "BYTES", value_parser = crate::parse_bytes)]
    pub budget: Option<usize>,

    /// How long a commit over the budget waits for busy workers to give
    /// memory back at their run boundaries before it is refused, in
    /// milliseconds (0: refused at once).
    #[arg(long, value_name = "MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub budget_wait: u64,

    /// The ONNX Runtime library (1.31 or later); default: `ORT_DYLIB_PATH`.
    #[arg(long, value_name = "FILE")]
    pub lib: Option<PathBuf>,

    /// Start tensor-arena's configurations from each model's plan store in
    /// this directory (keyed by the model's bytes, ONNX Runtime's version
    /// and --intra-threads) and save what they learned there after the
    /// last request. Each configuration named starts from what the ones
    /// before it saved: name one to compare it with and without a store.
    #[arg(long, value_name = "DIR")]
    pub plans: Option<PathBuf>,

    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,

    /// Internal: serve under one configuration in this process and print
    /// its JSON report.
    #[arg(long, hide = true)]
    pub child: Option<PoolConfig>,
}

/// Runs `tensor-arena ort-pool`. Exit codes: 0 success; 1 a request failed,
/// the configurations' outputs differ, or a child failed while running; 2
/// bad input (library, models, stream, budget).
pub fn main(args: &PoolArgs) -> ExitCode {
    let code = match args.child {
        Some(config) => child::main(args, config),
        None => parent(args),
    };
    match code {
        Ok(code) => code,
        Err(message) => {
            eprintln!("tensor-arena ort-pool: error: {message}");
            ExitCode::from(2)
        }
    }
}

/// The stream's text: the file given, or the built-in one.
fn stream_text(args: &PoolArgs) -> Result<String, String> {
    match &args.stream {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the stream {}: {e}", path.display())),
        None => Ok(stream::BUILT_IN.to_string()),
    }
}

fn parent(args: &PoolArgs) -> Result<ExitCode, String> {
    for (name, path) in [("det", &args.det), ("cls", &args.cls), ("rec", &args.rec)] {
        if !path.is_file() {
            return Err(format!("{name} model file not found: {}", path.display()));
        }
    }
    stream::parse(&stream_text(args)?)?;
    if args.configs.is_empty() {
        return Err("no configuration given".into());
    }
    if args.budget == Some(0) {
        return Err("--budget must be more than 0 bytes".into());
    }
    if let Some(b) = args.configs.iter().position(|&c| c == PoolConfig::Budget) {
        let measured_before = args.configs[..b].contains(&PoolConfig::ArenaPerWorker);
        if args.budget.is_none() && !measured_before {
            return Err(
                "the budget configuration needs --budget, or arena-per-worker before it to measure one"
                    .into(),
            );
        }
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let clock = Instant::now();
    let mut reports: Vec<ConfigReport> = Vec::new();
    let mut crashed = false;
    let n = args.configs.len();
    for (k, &config) in args.configs.iter().enumerate() {
        let budget = match (config, args.budget) {
            (PoolConfig::Budget, Some(b)) => Some(b),
            (PoolConfig::Budget, None) => {
                let measured = reports
                    .iter()
                    .find(|r| r.config == PoolConfig::ArenaPerWorker.name())
                    .and_then(|r| r.peak_reserved_bytes);
                match measured {
                    Some(b) if b > 0 => Some(b as usize),
                    _ => {
                        eprintln!(
                            "tensor-arena ort-pool: no budget measured (arena-per-worker failed); budget skipped"
                        );
                        crashed = true;
                        continue;
                    }
                }
            }
            _ => None,
        };
        let mut cmd = std::process::Command::new(&exe);
        cmd.arg("ort-pool")
            .arg("--det")
            .arg(&args.det)
            .arg("--cls")
            .arg(&args.cls)
            .arg("--rec")
            .arg(&args.rec)
            .arg("--workers")
            .arg(args.workers.to_string())
            .arg("--intra-threads")
            .arg(args.intra_threads.to_string())
            .arg("--child")
            .arg(config.name());
        if let Some(s) = &args.stream {
            cmd.arg("--stream").arg(s);
        }
        if let Some(r) = args.requests {
            cmd.arg("--requests").arg(r.to_string());
        }
        if let Some(b) = budget {
            cmd.arg("--budget")
                .arg(b.to_string())
                .arg("--budget-wait")
                .arg(args.budget_wait.to_string());
        }
        if let Some(lib) = &args.lib {
            cmd.arg("--lib").arg(lib);
        }
        if let Some(dir) = &args.plans {
            cmd.arg("--plans").arg(dir);
        }
        eprintln!(
            "[{}] configuration {}/{n} started ({:.1} s)",
            config.name(),
            k + 1,
            clock.elapsed().as_secs_f64()
        );
        let out = crate::ort_cmd::passthrough::run(cmd)?;
        if !out.status.success() {
            if out.status.code() == Some(2) {
                // Bad input: every configuration would fail the same way.
                return Ok(ExitCode::from(2));
            }
            eprintln!(
                "tensor-arena ort-pool: configuration {} failed ({})",
                config.name(),
                crate::child::describe_failure(out.status)
            );
            crashed = true;
            continue;
        }
        let report: ConfigReport = serde_json::from_slice(&out.stdout).map_err(|e| {
            format!(
                "configuration {}: bad report from child: {e}",
                config.name()
            )
        })?;
        reports.push(report);
    }
    let identical = report::outputs_identical(&reports);
    if args.json {
        println!("{}", report::to_json(args, &reports, identical));
    } else {
        print!("{}", report::table(args, &reports, identical));
    }
    let failed: u64 = reports.iter().map(|r| r.failed).sum();
    for r in reports.iter().filter(|r| r.failed > 0) {
        eprintln!(
            "FAILED: {}: {} of {} requests ({})",
            r.config,
            r.failed,
            r.requests,
            r.first_error.as_deref().unwrap_or("no message")
        );
    }
    if identical == Some(false) {
        eprintln!("tensor-arena ort-pool: the configurations' outputs differ");
    }
    if identical != Some(false) && failed == 0 && !crashed {
        Ok(ExitCode::SUCCESS)
    } else {
        Ok(ExitCode::from(1))
    }
}
