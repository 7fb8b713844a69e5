//! `tensor-arena ort`: one ONNX model over a sequence of input shapes,
//! under each memory strategy in its own child process, side by side.
//!
//! The parent parses and checks the arguments, starts this same binary once
//! per strategy with the hidden `--child STRATEGY` option, reads one JSON
//! document from each child's stdout, checks that every strategy produced
//! the same outputs, and prints a table per strategy or (`--json`) one
//! document for all. Each child's stderr (its progress, one line per run,
//! and its errors) passes through the parent once, as it comes, without
//! terminal escape codes when the parent's stderr is not a terminal.
//!
//! ONNX Runtime's own log is kept to fatal messages: the errors it logs it
//! also returns, and they are reported here (`FAILED: ...` or the error
//! that ends the command). `ORT_LOG=warning` (or `info`, `verbose`) shows
//! its log as it is, colours removed where stderr is not a terminal.

mod checks;
pub(crate) mod child;
pub(crate) mod passthrough;
mod report;
pub(crate) mod rss;
pub(crate) mod shapes;
mod values;

use clap::{Args, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use report::{Comparison, StrategyReport};

/// A memory strategy for ONNX Runtime's CPU tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OrtStrategy {
    /// ONNX Runtime's defaults: its CPU arena and memory pattern.
    OrtArena,
    /// Its arena, shrunk after every run (`memory.enable_memory_arena_shrinkage`).
    OrtShrink,
    /// No arena and no memory pattern: every tensor from malloc.
    OrtNoArena,
    /// tensor-arena, dynamic (no plans).
    Arena,
    /// tensor-arena with shape-keyed plans, memory following the input
    /// down after each smaller run (`Shrink::FollowInput { runs: 1 }`, the
    /// default of `tensor-arena-ort` before its time window: this command
    /// runs inputs back to back, where a window would hold them all).
    Planned,
    /// tensor-arena with plans, holding the largest need seen
    /// (`Shrink::KeepLargest`, the behaviour before memory followed the
    /// input).
    PlannedKeep,
    /// tensor-arena with plans, memory following the input down and given
    /// back lazily (`GiveBack::Lazily`, `madvise(MADV_FREE)`): a larger run
    /// after a smaller one commits again without page faults while the
    /// kernel has not needed the pages, which stay in RSS until it does.
    PlannedLazy,
}

impl OrtStrategy {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::OrtArena => "ort-arena",
            Self::OrtShrink => "ort-shrink",
            Self::OrtNoArena => "ort-no-arena",
            Self::Arena => "arena",
            Self::Planned => "planned",
            Self::PlannedKeep => "planned-keep",
            Self::PlannedLazy => "planned-lazy",
        }
    }

    /// Whether the strategy's memory is tensor-arena's.
    pub fn is_arena(self) -> bool {
        matches!(
            self,
            Self::Arena | Self::Planned | Self::PlannedKeep | Self::PlannedLazy
        )
    }
}

/// Options of `tensor-arena ort`.
#[derive(Debug, Args)]
pub struct OrtArgs {
    /// The ONNX model.
    #[arg(long, value_name = "FILE")]
    pub model: PathBuf,

    /// One input shape per run, in order, e.g. `1x3x48x320 1x3x48x100`. A
    /// model with several inputs takes `name=SHAPE,name=SHAPE`; inputs
    /// whose dimensions are all fixed by the model may be left out, and a
    /// bare SHAPE names the one input with free dimensions.
    #[arg(long, num_args = 1.., required = true, value_name = "SHAPE")]
    pub inputs: Vec<String>,

    /// Strategies to compare, in order.
    #[arg(long, value_delimiter = ',', default_values = ["ort-arena", "ort-shrink", "ort-no-arena", "arena", "planned"])]
    pub strategies: Vec<OrtStrategy>,

    /// Worker threads running the one session concurrently; each run of the
    /// sequence is made by every worker at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub threads: u32,

    /// Threads of ONNX Runtime's intra-op pool, per session; 0 (the
    /// default) leaves ONNX Runtime's own default (one per physical core).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=256))]
    pub intra_threads: u32,

    /// The ONNX Runtime library (1.31 or later); default: `ORT_DYLIB_PATH`.
    #[arg(long, value_name = "FILE")]
    pub lib: Option<PathBuf>,

    /// The values of an input, instead of the defaults (floats uniform in
    /// [-1, 1), integers 0 to 3): `NAME=V` (every element V) or
    /// `NAME=LOW:HIGH` (floats uniform in [LOW, HIGH), integers uniform in
    /// LOW..=HIGH). Repeat for several inputs, e.g. `--value speed=1.0
    /// --value x=-1:1`.
    #[arg(long = "value", value_name = "NAME=V|NAME=LOW:HIGH")]
    pub values: Vec<String>,

    /// Start the planned strategies from the model's plan store in this
    /// directory (keyed by the model's bytes, ONNX Runtime's version and
    /// --intra-threads) and save what they learned there after the last
    /// run. Each planned strategy named starts from what the ones before
    /// it saved: name one to compare it with and without a store.
    #[arg(long, value_name = "DIR")]
    pub plans: Option<PathBuf>,

    /// Print one JSON document instead of tables.
    #[arg(long)]
    pub json: bool,

    /// Internal: run one strategy in this process and print its JSON report.
    #[arg(long, hide = true)]
    pub child: Option<OrtStrategy>,
}

/// Runs `tensor-arena ort`. Exit codes: 0 success; 1 the strategies'
/// outputs differ, a run failed or a child failed while running; 2 bad
/// input (library, model, shapes, `--value`s, types the command cannot
/// fill or hash).
pub fn main(args: &OrtArgs) -> ExitCode {
    let code = match args.child {
        Some(strategy) => child::main(args, strategy),
        None => parent(args),
    };
    match code {
        Ok(code) => code,
        Err(message) => {
            eprintln!("tensor-arena ort: error: {message}");
            ExitCode::from(2)
        }
    }
}

fn parent(args: &OrtArgs) -> Result<ExitCode, String> {
    if !args.model.is_file() {
        return Err(format!("model file not found: {}", args.model.display()));
    }
    for s in &args.inputs {
        shapes::parse_run(s)?;
    }
    values::parse_all(&args.values)?;
    if args.strategies.is_empty() {
        return Err("no strategy given".into());
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let clock = Instant::now();
    let mut reports = Vec::new();
    let mut crashed = false;
    let n = args.strategies.len();
    for (k, &strategy) in args.strategies.iter().enumerate() {
        let mut cmd = std::process::Command::new(&exe);
        cmd.arg("ort")
            .arg("--model")
            .arg(&args.model)
            .arg("--threads")
            .arg(args.threads.to_string())
            .arg("--intra-threads")
            .arg(args.intra_threads.to_string())
            .arg("--child")
            .arg(strategy.name());
        for v in &args.values {
            cmd.arg(format!("--value={v}"));
        }
        if let Some(dir) = &args.plans {
            cmd.arg("--plans").arg(dir);
        }
        cmd.arg("--inputs").args(&args.inputs);
        if let Some(lib) = &args.lib {
            cmd.arg("--lib").arg(lib);
        }
        eprintln!(
            "[{}] strategy {}/{n} started ({:.1} s)",
            strategy.name(),
            k + 1,
            clock.elapsed().as_secs_f64()
        );
        let out = passthrough::run(cmd)?;
        if !out.status.success() {
            if out.status.code() == Some(2) {
                // Bad input (library, model, shapes, values): every strategy
                // would fail the same way. The child said why on stderr.
                return Ok(ExitCode::from(2));
            }
            // A strategy that failed while running: reported, and the
            // others still run.
            eprintln!(
                "tensor-arena ort: strategy {} failed ({})",
                strategy.name(),
                crate::child::describe_failure(out.status)
            );
            crashed = true;
            continue;
        }
        let report: StrategyReport = serde_json::from_slice(&out.stdout)
            .map_err(|e| format!("strategy {}: bad report from child: {e}", strategy.name()))?;
        reports.push(report);
    }
    let comparison = Comparison::of(&reports);
    if args.json {
        println!("{}", report::to_json(args, &reports));
    } else {
        print!("{}", report::tables(args, &reports));
    }
    let failed = report::failures(&reports);
    for (strategy, i, label, error) in &failed {
        eprintln!("FAILED: {strategy} run {i} ({label}): {error}");
    }
    if comparison.outputs_identical() == Some(false) {
        eprintln!("tensor-arena ort: the strategies' output hashes differ");
    }
    if comparison.outputs_identical() != Some(false) && failed.is_empty() && !crashed {
        Ok(ExitCode::SUCCESS)
    } else {
        Ok(ExitCode::from(1))
    }
}
