//! `tensor-vad`: speech segments of WAV files with Silero VAD v6 on
//! tensor-session, with a pool of worker threads (one session clone each).
//!
//! ```sh
//! cargo run -p tensor-vad --release -- --workers 2 crates/vad/data/speech.wav
//! ```
//!
//! For each file: its speech segments (start and end in seconds; the rule is
//! in `tensor_vad::segments`) and the worker's session stats after the file.
//! At the end: throughput and the pool's totals.
//!
//! Exit codes: 0 on success, 1 if a file could not be processed (the others
//! are), 2 on bad usage.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use tensor_arena::ShrinkPolicy;
use tensor_session::{
    LoadMode, MmapAck, ModelHandle, PlanConfig, Session, SessionConfig, SessionPool, SessionStats,
};
use tensor_vad::{
    load_weights, num_windows, wav, Detector, SegmentConfig, Segmenter, SAMPLE_RATE, WINDOW,
};

const DEFAULT_WEIGHTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/data/silero_vad_16k_v6.safetensors"
);

/// Speech segments of 16 kHz mono 16-bit WAV files with Silero VAD v6 on
/// tensor-session sessions.
#[derive(Debug, Parser)]
#[command(name = "tensor-vad", version, about)]
struct Args {
    /// WAV files: 16 kHz, mono, 16-bit PCM.
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,

    /// Worker threads; each takes one session clone from a pool and
    /// processes files from a shared queue.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    workers: u32,

    /// Process each file in runs of at most N windows (32 ms each),
    /// carrying the LSTM state, so that memory follows N rather than the
    /// file's length; 0: one run per file.
    #[arg(long, default_value_t = 0, value_name = "N")]
    chunk_windows: usize,

    /// When sessions give cached memory back on their own: `manual` (never),
    /// `every-run` (down to the run's need after each run), or `below:N`
    /// (after N consecutive runs needing at least 1/8 less than reserved).
    #[arg(long, default_value = "manual", value_parser = parse_shrink, value_name = "POLICY")]
    shrink_policy: ShrinkPolicy,

    /// Serve the first run of a new length from the largest plan learned
    /// (it covers every shorter length) instead of the dynamic pool.
    #[arg(long)]
    serve_smaller: bool,

    /// Do not plan runs by length (every run uses the dynamic pool).
    #[arg(long, conflicts_with = "serve_smaller")]
    no_plans: bool,

    /// The weights (safetensors).
    #[arg(long, default_value = DEFAULT_WEIGHTS, value_name = "FILE")]
    weights: PathBuf,

    /// How the weights are loaded.
    #[arg(long, value_enum, default_value_t = Load::Mmap)]
    load: Load,

    /// Speech threshold.
    #[arg(long, default_value_t = 0.5)]
    threshold: f64,

    /// Silence threshold in speech (default: max(threshold - 0.15, 0.01)).
    #[arg(long)]
    neg_threshold: Option<f64>,

    /// Shortest speech segment kept (longer than this), in ms.
    #[arg(long, default_value_t = 250)]
    min_speech_ms: u32,

    /// Silence that ends a segment, in ms.
    #[arg(long, default_value_t = 100)]
    min_silence_ms: u32,

    /// Padding on each side of a segment, in ms.
    #[arg(long, default_value_t = 30)]
    speech_pad_ms: u32,

    /// Process the list of files this many times (for timing).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,

    /// Print only the summary.
    #[arg(long, short)]
    quiet: bool,
}

/// How the weights file is loaded.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum Load {
    /// Memory-mapped: the file must not be written in place or truncated while the
    /// program runs (deleting it or renaming another file over it is fine).
    Mmap,
    /// Read into owned memory.
    Copy,
}

fn parse_shrink(s: &str) -> Result<ShrinkPolicy, String> {
    match s {
        "manual" => Ok(ShrinkPolicy::Manual),
        "every-run" => Ok(ShrinkPolicy::AfterEveryRun),
        _ => {
            let n = s
                .strip_prefix("below:")
                .ok_or_else(|| format!("`{s}`: expected manual, every-run or below:N"))?;
            let runs: u32 = n
                .parse()
                .map_err(|_| format!("`{n}`: expected a number of runs"))?;
            if runs == 0 {
                return Err("below:N needs N >= 1".into());
            }
            Ok(ShrinkPolicy::AfterRunsBelow { runs })
        }
    }
}

/// On-CPU time of the calling thread (Linux: `/proc/thread-self/schedstat`),
/// so that throughput can be told apart from a busy machine.
fn thread_cpu() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    Some(Duration::from_nanos(
        s.split_whitespace().next()?.parse().ok()?,
    ))
}

/// What one worker did with one file.
struct Outcome {
    text: String,
    failed: bool,
    windows: u64,
    runs: u64,
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The session's counters, on one line.
fn stats_line(worker: usize, s: &SessionStats) -> String {
    let a = &s.arena;
    let mut line = format!(
        "  session {worker}: runs {}, planned {}, backing calls {}, reserved {} B ({:.2} MiB), shrinks {}",
        s.runs,
        a.planned_runs,
        a.backing_allocs,
        a.reserved,
        mib(a.reserved),
        a.shrinks,
    );
    if let Some(r) = s.last_run {
        let _ = write!(line, "; last run high water {} B", r.high_water);
    }
    line
}

/// Runs the detector over one file on `session`.
fn process_file(
    session: &mut Session,
    worker: usize,
    path: &std::path::Path,
    args: &Args,
    config: SegmentConfig,
    probs: &mut Vec<f32>,
) -> Outcome {
    let name = path.display();
    let fail = |e: &dyn std::fmt::Display| Outcome {
        text: format!("{name}: error: {e}\n"),
        failed: true,
        windows: 0,
        runs: 0,
    };
    let audio = match wav::read(path) {
        Ok(a) => a,
        Err(e) => return fail(&e),
    };
    if audio.sample_rate != SAMPLE_RATE {
        return fail(&format_args!(
            "sample rate {} Hz; the model needs {SAMPLE_RATE} Hz (resample first)",
            audio.sample_rate
        ));
    }
    let l = num_windows(audio.samples.len());
    probs.clear();
    probs.resize(l, 0.0);
    let mut runs = 0u64;
    let mut detector = Detector::new();
    // i16 samples straight from the file: framing converts them on the fly.
    if let Err(e) = detector.process_chunked(
        session,
        &audio.samples,
        args.chunk_windows,
        probs,
        |_, _| runs += 1,
    ) {
        return fail(&e);
    }
    let mut seg = Segmenter::new(config);
    let mut found: Vec<_> = probs.iter().filter_map(|&p| seg.push(p)).collect();
    found.extend(seg.finish(audio.samples.len() as u64));

    let secs = audio.samples.len() as f64 / SAMPLE_RATE as f64;
    let mut text = format!(
        "{name}: {secs:.2} s, {l} windows in {runs} run{} (worker {worker}), {} speech segment{}\n",
        if runs == 1 { "" } else { "s" },
        found.len(),
        if found.len() == 1 { "" } else { "s" },
    );
    for s in &found {
        let _ = writeln!(
            text,
            "  speech {:8.3} s - {:8.3} s",
            s.start_secs(),
            s.end_secs()
        );
    }
    text.push_str(&stats_line(worker, &session.stats()));
    text.push('\n');
    Outcome {
        text,
        failed: false,
        windows: l as u64,
        runs,
    }
}

/// Prints finished outcomes in job order as soon as all before them are in.
struct Printer {
    next: usize,
    waiting: BTreeMap<usize, String>,
    quiet: bool,
}

impl Printer {
    fn done(&mut self, job: usize, text: String) {
        self.waiting.insert(job, text);
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        while let Some(t) = self.waiting.remove(&self.next) {
            if !self.quiet {
                let _ = out.write_all(t.as_bytes());
            }
            self.next += 1;
        }
        let _ = out.flush();
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let weights = match load_weights(
        &args.weights,
        match args.load {
            // SAFETY: `--load mmap` states the contract in `--help`: the user keeps the file
            // from being written in place or truncated while this process runs. The default
            // weights are the committed model file, which nothing writes.
            Load::Mmap => LoadMode::Mmap(unsafe { MmapAck::new() }),
            Load::Copy => LoadMode::Copy,
        },
    ) {
        Ok(w) => Arc::new(w),
        Err(e) => {
            eprintln!("tensor-vad: {}: {e}", args.weights.display());
            return ExitCode::from(2);
        }
    };
    let mut config = SessionConfig::default();
    config.arena.shrink_policy = args.shrink_policy;
    config.plans = PlanConfig {
        enabled: !args.no_plans,
        serve_smaller_from_larger: args.serve_smaller,
        ..PlanConfig::default()
    };
    let workers = args.workers as usize;
    let pool = SessionPool::new(ModelHandle::new(weights), config, workers);
    let defaults = SegmentConfig::with_threshold(args.threshold);
    let segment_config = SegmentConfig {
        neg_threshold: args.neg_threshold.unwrap_or(defaults.neg_threshold),
        min_speech_ms: args.min_speech_ms,
        min_silence_ms: args.min_silence_ms,
        speech_pad_ms: args.speech_pad_ms,
        ..defaults
    };

    let jobs = args.files.len() * args.repeat as usize;
    let next = AtomicUsize::new(0);
    let printer = Mutex::new(Printer {
        next: 0,
        waiting: BTreeMap::new(),
        quiet: args.quiet,
    });
    let start = Instant::now();
    let totals: Vec<(u64, u64, u64, Option<Duration>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|worker| {
                let (pool, next, printer, args) = (&pool, &next, &printer, &args);
                s.spawn(move || {
                    let cpu_start = thread_cpu();
                    let mut session = pool.get();
                    let mut probs = Vec::new();
                    let (mut failed, mut windows, mut runs) = (0u64, 0u64, 0u64);
                    loop {
                        let job = next.fetch_add(1, Ordering::Relaxed);
                        if job >= jobs {
                            break;
                        }
                        let path = &args.files[job % args.files.len()];
                        let o = process_file(
                            &mut session,
                            worker,
                            path,
                            args,
                            segment_config,
                            &mut probs,
                        );
                        failed += o.failed as u64;
                        windows += o.windows;
                        runs += o.runs;
                        printer.lock().expect("printer").done(job, o.text);
                    }
                    let cpu = thread_cpu().zip(cpu_start).map(|(end, start)| end - start);
                    (failed, windows, runs, cpu)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker panicked"))
            .collect()
    });
    let wall = start.elapsed().as_secs_f64();

    let failed: u64 = totals.iter().map(|t| t.0).sum();
    let windows: u64 = totals.iter().map(|t| t.1).sum();
    let runs: u64 = totals.iter().map(|t| t.2).sum();
    let audio_secs = windows as f64 * WINDOW as f64 / SAMPLE_RATE as f64;
    let p = pool.stats();
    // Write errors (a closed pipe) are ignored, as for the per-file lines.
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "{jobs} file{} ({:.1} s of audio, {windows} windows) in {runs} runs on {workers} worker{}: \
         {wall:.3} s, {:.1} runs/s, {:.0} windows/s ({:.0}x real time)",
        if jobs == 1 { "" } else { "s" },
        audio_secs,
        if workers == 1 { "" } else { "s" },
        runs as f64 / wall,
        windows as f64 / wall,
        audio_secs / wall,
    );
    let _ = writeln!(
        out,
        "pool: {} clones, runs {}, planned {}, backing calls {}, reserved {} B ({:.2} MiB), \
         shrinks {}, plans {}",
        pool.sessions(),
        p.runs,
        p.arena.planned_runs,
        p.arena.backing_allocs,
        p.arena.reserved,
        mib(p.arena.reserved),
        p.arena.shrinks,
        p.plans.plans,
    );
    let cpus: Option<Vec<Duration>> = totals.iter().map(|t| t.3).collect();
    if let Some(cpus) = cpus {
        let cpu: f64 = cpus.iter().map(Duration::as_secs_f64).sum();
        let each: Vec<String> = cpus
            .iter()
            .map(|c| format!("{:.3}", c.as_secs_f64()))
            .collect();
        let _ = writeln!(
            out,
            "workers' CPU time: {cpu:.3} s ({} s): {:.0} windows per CPU second",
            each.join(" + "),
            windows as f64 / cpu
        );
    }
    drop(out);
    if failed > 0 {
        eprintln!("tensor-vad: {failed} file(s) failed");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
