//! The `tensor-arena` command.
//!
//! `tensor-arena replay` drives the arena and the allocators it is meant to
//! replace with the same workload, each in its own child process (or, with
//! `--in-process`, in turn in this one), and reports per run what each held,
//! how often it called its backing allocator, the page faults, the resident
//! memory and the time. The workload is a built-in BERT-style encoder over a
//! sequence of input lengths, or trace files of real ONNX models
//! (`--trace`).
//!
//! Exit codes: 0 on success; 1 when a run failed (an allocation was refused,
//! e.g. over `--max-reserved`) or a strategy's child process failed (the
//! report is still complete); 2 on bad input or usage (nothing is printed on
//! stdout).
//!
//! `unsafe` is denied in the whole crate and allowed only in `baselines.rs`
//! (calling `GlobalAlloc` and writing to the memory it returns) and `os.rs`
//! (`getrusage`, `wait4`, `sysconf`).
#![deny(unsafe_code)]
#![deny(missing_docs)]

mod baselines;
mod child;
mod model;
mod ort_cmd;
mod ort_pool;
mod os;
mod plans_cmd;
mod replay;
mod report;
mod strategies;
mod svg;
mod workload;

use std::ffi::OsString;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::model::{ModelSpec, MODELS};
use crate::replay::{Progress, ShrinkMode, StrategyResult, Touch};
use crate::report::{Report, WorkloadInfo};
use crate::strategies::{run_strategy, MemoryLayer, Settings, Strategy};
use crate::workload::Workload;
use tensor_arena::memory::HugePages;

/// Replay tensor allocation workloads through tensor-arena and the
/// allocators it replaces, side by side.
#[derive(Debug, Parser)]
#[command(name = "tensor-arena", version, arg_required_else_help = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
enum Command {
    /// Replay a workload through each allocation strategy in turn and report
    /// memory held, backing-allocator calls, page faults and time per run.
    ///
    /// With no arguments: a BERT-base encoder (f32, batch 1) over sequence
    /// lengths 512, 128, 64, 64, 512, through every strategy.
    #[command(
        after_help = "Exit status: 0 success; 1 a run failed (an allocation was refused, e.g. over \
                      --max-reserved) or a strategy's child process failed (the report is complete); \
                      2 bad input or usage (nothing on stdout)."
    )]
    Replay(ReplayArgs),
    /// Run an ONNX model over a sequence of input shapes under ONNX
    /// Runtime's memory strategies and tensor-arena's, each in its own
    /// process, and compare memory, time and outputs run by run.
    #[command(
        after_help = "Exit status: 0 success; 1 the strategies' outputs differ or a strategy failed \
                      while running; 2 bad input (library, model, shapes, --value, input or output types)."
    )]
    Ort(ort_cmd::OrtArgs),
    /// Serve an OCR pipeline (RapidOCR's det, cls and rec) from a pool of
    /// worker threads, one request stream, under ONNX Runtime's memory and
    /// tensor-arena's (an arena per model, one per worker, one budget), each
    /// in its own process: RSS, throughput, latency, failures.
    #[command(
        name = "ort-pool",
        after_help = "Exit status: 0 success; 1 a request failed, the configurations' outputs differ \
                      or a configuration's process failed; 2 bad input (library, models, stream, budget)."
    )]
    OrtPool(ort_pool::PoolArgs),
    /// Inspect plan stores (`replay --plans DIR`, crates/ort's and the
    /// Python package's stores).
    #[command(
        subcommand,
        after_help = "Exit status: 0 success; 2 the file cannot be read or is refused (why on stderr)."
    )]
    Plans(plans_cmd::PlansCommand),
}

/// Options of `tensor-arena replay`.
#[derive(Debug, Args)]
struct ReplayArgs {
    /// Replay these trace files (format: traces/README.md) instead of the
    /// built-in model; their runs are replayed in order.
    #[arg(long, num_args = 1.., value_name = "FILE")]
    trace: Vec<PathBuf>,

    /// Built-in model to replay.
    #[arg(long, default_value = "bert-base", value_parser = model_names(), conflicts_with = "trace")]
    model: String,

    /// Batch size of the built-in model.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..), conflicts_with = "trace")]
    batch: u32,

    /// Sequence lengths of the built-in model's runs, in order.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "512,128,64,64,512",
        value_parser = clap::value_parser!(u32).range(1..),
        conflicts_with = "trace"
    )]
    seq_lens: Vec<u32>,

    /// Strategies to run, in turn (comma separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "all")]
    strategy: Vec<StrategyArg>,

    /// How each buffer is written when handed out.
    #[arg(long, value_enum, default_value_t = Touch::Pages)]
    touch: Touch,

    /// When the arena strategies give memory back.
    #[arg(long, value_enum, default_value_t = ShrinkMode::Never)]
    shrink: ShrinkMode,

    /// Cap on the arena strategies' reserved bytes (e.g. 100000000, 64MiB,
    /// 1G); an allocation over it fails its run.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    max_reserved: Option<usize>,

    /// Whether the arena strategies' memory layer (`Pages`) asks for
    /// transparent huge pages: `auto` where the system offers them without
    /// compacting memory on the run's thread, `advise` for every commit
    /// (faults may compact), `never` for base pages only.
    #[arg(long, value_enum, default_value_t = HugePagesArg::Auto)]
    huge_pages: HugePagesArg,

    /// The arena strategies' memory layer: `default` (`Pages` on Linux,
    /// `Heap` elsewhere, as `Arena::new`), or `heap` (regions from the
    /// global allocator, to measure on Linux what other systems run).
    #[arg(long, value_enum, default_value_t = MemoryLayer::Default)]
    memory: MemoryLayer,

    /// Print one JSON document instead of the table.
    #[arg(long)]
    json: bool,

    /// Also write a timeline of bytes live and reserved to this SVG file.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,

    /// Start the `planned` strategy from the plan store in this directory
    /// (one file per model: the trace's `model=`, or the built-in model and
    /// batch) and save what it learned there after the last run, merged
    /// with what the file holds. A store that cannot be used is reported
    /// in one line and the replay starts with no plans.
    #[arg(long, value_name = "DIR")]
    plans: Option<PathBuf>,

    /// Run the strategies one after another in this process instead of each
    /// in a fresh child process (for profiling). Each strategy then starts
    /// from the heap and page tables the previous ones left, so memory and
    /// fault figures depend on the order.
    #[arg(long)]
    in_process: bool,

    /// Internal: run only this strategy and send its result as JSON on
    /// stdout (what each child process of `replay` does).
    #[arg(long, hide = true, value_name = "STRATEGY", value_parser = child_names(), conflicts_with_all = ["json", "in_process"])]
    child: Option<String>,
}

/// `--strategy` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum StrategyArg {
    /// tensor_arena::Arena (dynamic pool).
    Arena,
    /// The arena with shape-keyed plans.
    Planned,
    /// std::alloc::System, one allocation per tensor.
    System,
    /// mimalloc, one allocation per tensor.
    Mimalloc,
    /// jemalloc, one allocation per tensor.
    Jemalloc,
    /// bumpalo, reset after each run.
    Bump,
    /// rlsf (TLSF) over one pool sized from the workload; only when named.
    Rlsf,
    /// talc over one pool sized from the workload; only when named.
    Talc,
    /// All of the above but rlsf and talc, in that order.
    All,
}

impl StrategyArg {
    /// The strategies this value stands for.
    fn expand(self) -> &'static [Strategy] {
        match self {
            StrategyArg::Arena => &[Strategy::Arena],
            StrategyArg::Planned => &[Strategy::Planned],
            StrategyArg::System => &[Strategy::System],
            StrategyArg::Mimalloc => &[Strategy::Mimalloc],
            StrategyArg::Jemalloc => &[Strategy::Jemalloc],
            StrategyArg::Bump => &[Strategy::Bump],
            StrategyArg::Rlsf => &[Strategy::Rlsf],
            StrategyArg::Talc => &[Strategy::Talc],
            StrategyArg::All => &Strategy::EACH,
        }
    }
}

/// The `--model` choices.
fn model_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(MODELS.map(|m| m.name))
}

/// The `--child` choices: one strategy each.
fn child_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(Strategy::NAMED.map(Strategy::name))
}

/// The arguments a child process gets to rebuild the same workload and
/// settings (its strategy is added by `child::run_in_children`). `--svg`
/// only tells it to record the timeline; the parent writes the file.
fn child_args(args: &ReplayArgs) -> Vec<OsString> {
    let mut v: Vec<OsString> = vec!["replay".into()];
    let mut flag = |name: &str, value: OsString| {
        let mut a = OsString::from(format!("--{name}="));
        a.push(value);
        v.push(a);
    };
    if args.trace.is_empty() {
        flag("model", args.model.clone().into());
        flag("batch", args.batch.to_string().into());
        let lens: Vec<String> = args.seq_lens.iter().map(u32::to_string).collect();
        flag("seq-lens", lens.join(",").into());
    }
    for t in &args.trace {
        flag("trace", t.clone().into_os_string());
    }
    flag("touch", serde_plain(&args.touch).into());
    flag("shrink", serde_plain(&args.shrink).into());
    if let Some(cap) = args.max_reserved {
        flag("max-reserved", cap.to_string().into());
    }
    match args.huge_pages {
        HugePagesArg::Auto => {}
        HugePagesArg::Advise => flag("huge-pages", "advise".into()),
        HugePagesArg::Never => flag("huge-pages", "never".into()),
    }
    if args.memory == MemoryLayer::Heap {
        flag("memory", "heap".into());
    }
    if let Some(svg) = &args.svg {
        flag("svg", svg.clone().into_os_string());
    }
    if let Some(dir) = &args.plans {
        flag("plans", dir.clone().into_os_string());
    }
    v
}

/// `--huge-pages`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum HugePagesArg {
    /// Where the system offers transparent huge pages without compacting
    /// memory on the run's thread (`HugePages::Auto`).
    Auto,
    /// Every commit advised `MADV_HUGEPAGE`, whatever THP's `defrag`
    /// setting (`HugePages::Advise`).
    Advise,
    /// Base pages only.
    Never,
}

/// Parses a byte count: an integer with an optional binary suffix (K, KiB,
/// M, MiB, G, GiB, T, TiB; case-insensitive).
fn parse_bytes(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let num: u64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a byte count (e.g. 1048576, 64MiB, 2G)"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        "t" | "tib" => 40,
        _ => {
            return Err(format!(
                "unknown unit in `{s}` (use K, M, G or T, powers of 1024)"
            ))
        }
    };
    num.checked_mul(1 << shift)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| format!("`{s}` is too large"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Replay(args) => match replay_command(&args) {
            Ok(code) => code,
            Err(message) => {
                eprintln!("tensor-arena: error: {message}");
                ExitCode::from(2)
            }
        },
        Command::Ort(args) => ort_cmd::main(&args),
        Command::OrtPool(args) => ort_pool::main(&args),
        Command::Plans(cmd) => plans_cmd::main(&cmd),
    }
}

/// Builds the workload `args` asks for.
fn build_workload(args: &ReplayArgs) -> Result<Workload, String> {
    if !args.trace.is_empty() {
        return workload::from_trace_files(&args.trace).map_err(|e| e.to_string());
    }
    let model =
        ModelSpec::find(&args.model).ok_or_else(|| format!("unknown model `{}`", args.model))?;
    let batch = args.batch as usize;
    let seq_lens: Vec<usize> = args.seq_lens.iter().map(|&s| s as usize).collect();
    if seq_lens.is_empty() {
        return Err("--seq-lens needs at least one length".into());
    }
    // The largest tensors are the attention scores and the FFN activations;
    // keep every size (and sums of a few dozen of them) far from overflow.
    for &s in &seq_lens {
        let largest = [model.heads * s, model.ffn]
            .iter()
            .map(|&w| batch.checked_mul(s)?.checked_mul(w)?.checked_mul(4))
            .try_fold(0usize, |m, t| t.map(|t| m.max(t)));
        if largest.is_none_or(|t| t > 1 << 40) {
            return Err(format!(
                "batch {batch} at sequence length {s} needs tensors over 1 TiB; use smaller shapes"
            ));
        }
    }
    Ok(model::workload(model, batch, &seq_lens))
}

/// `tensor-arena replay`: returns the exit code, or a message for exit 2.
fn replay_command(args: &ReplayArgs) -> Result<ExitCode, String> {
    let workload = build_workload(args)?;
    let settings = Settings {
        touch: args.touch,
        shrink: args.shrink,
        max_reserved: args.max_reserved,
        timeline: args.svg.is_some(),
        huge_pages: match args.huge_pages {
            HugePagesArg::Auto => HugePages::Auto,
            HugePagesArg::Advise => HugePages::Advise,
            HugePagesArg::Never => HugePages::Never,
        },
        memory: args.memory,
    };
    let store = match &args.plans {
        Some(dir) => Some(plans_cmd::replay_store(
            dir,
            &args.trace,
            &args.model,
            args.batch,
        )?),
        None => None,
    };
    if let Some(name) = &args.child {
        let strategy =
            Strategy::from_name(name).ok_or_else(|| format!("unknown strategy `{name}`"))?;
        return Ok(child::child_main(
            strategy,
            &workload,
            settings,
            store.as_ref(),
        ));
    }
    // Open the SVG first, so a bad path fails before the replay.
    let svg_file = match &args.svg {
        Some(path) => Some(
            std::fs::File::create(path)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?,
        ),
        None => None,
    };
    let mut strategies: Vec<Strategy> = Vec::new();
    for s in args.strategy.iter().flat_map(|a| a.expand()) {
        if !strategies.contains(s) {
            strategies.push(*s);
        }
    }
    let progress = Progress::new();
    let results: Vec<StrategyResult> = if args.in_process {
        strategies
            .iter()
            .map(|&s| run_strategy(s, &workload, settings, store.as_ref(), &progress))
            .collect()
    } else {
        child::run_in_children(&strategies, &child_args(args), &progress)
    };

    let report = Report {
        workload: WorkloadInfo::of(&workload),
        touch: args.touch,
        shrink: args.shrink,
        max_reserved: args.max_reserved,
        in_process: args.in_process,
        strategies: &results,
    };
    if let (Some(path), Some(mut file)) = (&args.svg, svg_file) {
        let subtitle = format!(
            "{}; touch {}, arena shrink {}; {}",
            workload.description,
            serde_plain(&args.touch),
            serde_plain(&args.shrink),
            if args.in_process {
                "all strategies in one process"
            } else {
                "one process per strategy"
            }
        );
        file.write_all(svg::timeline(&workload, &results, &subtitle).as_bytes())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    let text = if args.json {
        let mut doc = report::json(&report).map_err(|e| e.to_string())?;
        doc.push('\n');
        doc
    } else {
        report::plain(&report)
    };
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("tensor-arena: error: cannot write the report: {e}");
            return Ok(ExitCode::FAILURE);
        }
    }
    let mut code = ExitCode::SUCCESS;
    for r in &results {
        if let Some(e) = &r.error {
            eprintln!("tensor-arena: {}: {e}", r.name);
            code = ExitCode::FAILURE;
        }
    }
    let failed: u64 = results.iter().map(|r| r.summary.failed_runs).sum();
    if failed > 0 {
        eprintln!(
            "tensor-arena: {failed} run(s) failed (an allocation was refused); see the report"
        );
        code = ExitCode::FAILURE;
    }
    Ok(code)
}

/// A unit enum's serde name (`manual-after-smaller`).
fn serde_plain<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts() {
        assert_eq!(parse_bytes("1234"), Ok(1234));
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("2g"), Ok(2 << 30));
        assert_eq!(parse_bytes("3K"), Ok(3072));
        assert!(parse_bytes("1.5G").is_err());
        assert!(parse_bytes("12 apples").is_err());
        assert!(parse_bytes("").is_err());
    }

    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
