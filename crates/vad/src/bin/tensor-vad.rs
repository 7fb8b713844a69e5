//! `tensor-vad`: speech segments of WAV files with Silero VAD v6 on
//! tensor-session, with a pool of worker threads (one session clone each).
//!
//! ```sh
//! cargo run -p tensor-vad --release -- --workers 2 crates/vad/data/speech.wav
//! ```
//!
//! For each file: its speech segments (start and end in seconds; the rule is
//! in `tensor_vad::segments`) and the worker's session stats after the file.
//! At the end: throughput and the pool's totals. With `--json`: one JSON
//! document instead, with each file's segments (and, with `--probs`, the
//! probability of every 32 ms window). `-` reads a WAV from stdin; streamed
//! WAVs (data size unknown) are read to their end.
//!
//! Errors go to stderr, always (`-q` too), each with the file's name.
//! Exit codes: 0 on success, 1 if a file could not be processed (the others
//! are), 2 on bad usage (an option out of range, an unreadable weights file).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use serde::Serialize;
use tensor_arena::ShrinkPolicy;
use tensor_session::{
    LoadMode, MmapAck, ModelHandle, PlanConfig, Session, SessionConfig, SessionPool, SessionStats,
};
use tensor_vad::{
    load_weights, num_windows, wav, Detector, Segment, SegmentConfig, Segmenter, VadError,
    SAMPLE_RATE, WINDOW,
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
    /// WAV files: 16 kHz, mono, 16-bit PCM; `-` reads one from stdin.
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

    /// Speech threshold: a window with a probability at least this is
    /// speech (0 to 1).
    #[arg(long, default_value_t = 0.5, value_parser = parse_probability)]
    threshold: f64,

    /// Silence threshold in speech, at most --threshold (default:
    /// max(threshold - 0.15, 0.01)).
    #[arg(long, value_parser = parse_probability)]
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

    /// Print only the summary (errors still go to stderr).
    #[arg(long, short, conflicts_with = "json")]
    quiet: bool,

    /// Print one JSON document on stdout instead of text: per file its
    /// segments (or its error), then the totals.
    #[arg(long)]
    json: bool,

    /// With --json: also each file's probability per 32 ms window (window
    /// `i` is samples `512 i .. 512 (i + 1)`).
    #[arg(long, requires = "json")]
    probs: bool,
}

/// Parses a probability: a number from 0 to 1 (not NaN).
fn parse_probability(s: &str) -> Result<f64, String> {
    let p: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number"))?;
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(format!("`{s}` is outside 0..1 (a probability)"))
    }
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

/// What one worker found in one file.
struct FileReport {
    /// The file's name as given (`-` for stdin).
    name: String,
    worker: usize,
    samples: usize,
    windows: usize,
    runs: u64,
    segments: Vec<Segment>,
    /// Per-window probabilities, with `--probs`.
    probs: Option<Vec<f32>>,
    /// The worker's session after the file.
    stats: SessionStats,
}

/// What one worker did with one file.
enum Outcome {
    Done(Box<FileReport>),
    Failed { name: String, error: String },
}

/// Where a file's bytes come from.
#[derive(Clone, Copy)]
enum Source<'a> {
    /// A path to open.
    Path(&'a Path),
    /// Stdin, read once before the workers start (or why it could not be).
    Stdin(&'a Result<Vec<u8>, String>),
}

/// `s` when `n` is not 1.
fn plural(n: impl Into<u64>) -> &'static str {
    if n.into() == 1 {
        ""
    } else {
        "s"
    }
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
    source: Source<'_>,
    args: &Args,
    config: SegmentConfig,
    probs: &mut Vec<f32>,
) -> Outcome {
    let name = match source {
        Source::Path(p) => p.display().to_string(),
        Source::Stdin(_) => "-".to_owned(),
    };
    let fail = |e: &dyn std::fmt::Display| Outcome::Failed {
        name: name.clone(),
        error: e.to_string(),
    };
    let audio = match source {
        Source::Path(p) => wav::read(p),
        Source::Stdin(Ok(bytes)) => wav::parse(bytes),
        Source::Stdin(Err(e)) => return fail(e),
    };
    let audio = match audio {
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
    let mut segments: Vec<_> = probs.iter().filter_map(|&p| seg.push(p)).collect();
    segments.extend(seg.finish(audio.samples.len() as u64));
    Outcome::Done(Box::new(FileReport {
        name,
        worker,
        samples: audio.samples.len(),
        windows: l,
        runs,
        segments,
        probs: args.probs.then(|| probs.clone()),
        stats: session.stats(),
    }))
}

/// The text lines of one file: header, segments, session stats.
fn file_text(r: &FileReport) -> String {
    let secs = r.samples as f64 / SAMPLE_RATE as f64;
    let n = r.segments.len() as u64;
    let mut text = format!(
        "{}: {secs:.2} s, {} windows in {} run{} (worker {}), {n} speech segment{}\n",
        r.name,
        r.windows,
        r.runs,
        plural(r.runs),
        r.worker,
        plural(n),
    );
    for s in &r.segments {
        let _ = writeln!(
            text,
            "  speech {:8.3} s - {:8.3} s",
            s.start_secs(),
            s.end_secs()
        );
    }
    text.push_str(&stats_line(r.worker, &r.stats));
    text.push('\n');
    text
}

/// Reports finished outcomes: errors on stderr at once; results on stdout
/// in job order as soon as all before them are in (text), or kept for the
/// document at the end (`--json`).
struct Printer {
    next: usize,
    /// Text of finished jobs not yet printed (`None`: the job failed).
    waiting: BTreeMap<usize, Option<String>>,
    quiet: bool,
    /// With `--json`: every outcome, by job.
    json: Option<Vec<(usize, Outcome)>>,
}

impl Printer {
    fn done(&mut self, job: usize, outcome: Outcome) {
        if let Outcome::Failed { name, error } = &outcome {
            eprintln!("tensor-vad: {name}: {error}");
        }
        if let Some(all) = &mut self.json {
            all.push((job, outcome));
            return;
        }
        let text = match &outcome {
            Outcome::Done(r) if !self.quiet => Some(file_text(r)),
            _ => None,
        };
        self.waiting.insert(job, text);
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        while let Some(t) = self.waiting.remove(&self.next) {
            if let Some(t) = t {
                let _ = out.write_all(t.as_bytes());
            }
            self.next += 1;
        }
        let _ = out.flush();
    }
}

/// Totals of one worker.
#[derive(Default)]
struct Tally {
    done: u64,
    failed: u64,
    windows: u64,
    runs: u64,
    cpu: Option<Duration>,
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
            report_weights_error(&args.weights, &e);
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
    let segment_config = match segment_config(&args) {
        Ok(c) => c,
        Err(e) => return usage_error(&e),
    };
    let stdin_count = args.files.iter().filter(|f| is_stdin(f)).count();
    if stdin_count > 1 {
        return usage_error("`-` (stdin) can be given only once");
    }
    // Stdin is read once, before the workers start, so that `--repeat`
    // can process it again.
    let stdin: Result<Vec<u8>, String> = if stdin_count == 1 {
        let mut bytes = Vec::new();
        std::io::stdin()
            .lock()
            .read_to_end(&mut bytes)
            .map(|_| bytes)
            .map_err(|e| format!("cannot read stdin: {e}"))
    } else {
        Ok(Vec::new())
    };

    let jobs = args.files.len() * args.repeat as usize;
    let next = AtomicUsize::new(0);
    let printer = Mutex::new(Printer {
        next: 0,
        waiting: BTreeMap::new(),
        quiet: args.quiet,
        json: args.json.then(Vec::new),
    });
    let start = Instant::now();
    let totals: Vec<Tally> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|worker| {
                let (pool, next, printer, args, stdin) = (&pool, &next, &printer, &args, &stdin);
                s.spawn(move || {
                    let cpu_start = thread_cpu();
                    let mut session = pool.get();
                    let mut probs = Vec::new();
                    let mut tally = Tally::default();
                    loop {
                        let job = next.fetch_add(1, Ordering::Relaxed);
                        if job >= jobs {
                            break;
                        }
                        let path = &args.files[job % args.files.len()];
                        let source = if is_stdin(path) {
                            Source::Stdin(stdin)
                        } else {
                            Source::Path(path)
                        };
                        let o = process_file(
                            &mut session,
                            worker,
                            source,
                            args,
                            segment_config,
                            &mut probs,
                        );
                        match &o {
                            Outcome::Done(r) => {
                                tally.done += 1;
                                tally.windows += r.windows as u64;
                                tally.runs += r.runs;
                            }
                            Outcome::Failed { .. } => tally.failed += 1,
                        }
                        printer.lock().expect("printer").done(job, o);
                    }
                    tally.cpu = thread_cpu().zip(cpu_start).map(|(end, start)| end - start);
                    tally
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker panicked"))
            .collect()
    });
    let wall = start.elapsed().as_secs_f64();

    let done: u64 = totals.iter().map(|t| t.done).sum();
    let failed: u64 = totals.iter().map(|t| t.failed).sum();
    let windows: u64 = totals.iter().map(|t| t.windows).sum();
    let runs: u64 = totals.iter().map(|t| t.runs).sum();
    let audio_secs = windows as f64 * WINDOW as f64 / SAMPLE_RATE as f64;
    let summary = Summary {
        files: done,
        failed,
        audio_secs,
        windows,
        runs,
        workers: workers as u64,
        wall_secs: wall,
    };
    let printer = printer.into_inner().expect("printer");
    // Write errors (a closed pipe) are ignored, as for the per-file lines.
    let mut out = std::io::stdout().lock();
    if let Some(mut outcomes) = printer.json {
        outcomes.sort_by_key(|(job, _)| *job);
        match json_document(outcomes, summary, segment_config) {
            Ok(doc) => {
                let _ = writeln!(out, "{doc}");
            }
            Err(e) => {
                eprintln!("tensor-vad: error: cannot write the JSON document: {e}");
                return ExitCode::from(1);
            }
        }
    } else {
        let _ = out.write_all(summary_text(&summary, &pool, &totals).as_bytes());
    }
    let _ = out.flush();
    drop(out);
    if failed > 0 {
        eprintln!(
            "tensor-vad: {failed} of {} file{} failed",
            done + failed,
            plural(done + failed)
        );
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

/// Whether `path` means stdin.
fn is_stdin(path: &Path) -> bool {
    path.as_os_str() == "-"
}

/// Prints a usage error; exit code 2.
fn usage_error(message: &str) -> ExitCode {
    eprintln!("tensor-vad: error: {message}");
    ExitCode::from(2)
}

/// Says why the weights could not be loaded, naming the file once (the
/// weights errors name it themselves).
fn report_weights_error(path: &Path, e: &VadError) {
    match e {
        VadError::Weights(_) => eprintln!("tensor-vad: {e}"),
        _ => eprintln!("tensor-vad: {}: {e}", path.display()),
    }
}

/// The segmentation rule from the options.
///
/// # Errors
/// `--neg-threshold` above `--threshold`.
fn segment_config(args: &Args) -> Result<SegmentConfig, String> {
    let defaults = SegmentConfig::with_threshold(args.threshold);
    let neg_threshold = args.neg_threshold.unwrap_or(defaults.neg_threshold);
    if args.neg_threshold.is_some() && neg_threshold > args.threshold {
        return Err(format!(
            "--neg-threshold {neg_threshold} is above --threshold {}; it must be at most that",
            args.threshold
        ));
    }
    Ok(SegmentConfig {
        neg_threshold,
        min_speech_ms: args.min_speech_ms,
        min_silence_ms: args.min_silence_ms,
        speech_pad_ms: args.speech_pad_ms,
        ..defaults
    })
}

/// Totals of the whole command (also the `summary` of `--json`).
#[derive(Serialize)]
struct Summary {
    /// Files processed (not counting failed ones).
    files: u64,
    /// Files that could not be processed.
    failed: u64,
    /// Seconds of audio in the processed files (whole windows).
    audio_secs: f64,
    windows: u64,
    runs: u64,
    workers: u64,
    wall_secs: f64,
}

/// The closing lines: throughput, the pool's totals, the workers' CPU time.
fn summary_text(sum: &Summary, pool: &SessionPool, totals: &[Tally]) -> String {
    let mut out = String::new();
    let wall = sum.wall_secs;
    let _ = write!(
        out,
        "{} file{} ({:.1} s of audio, {} windows) in {} run{} on {} worker{}: {wall:.3} s",
        sum.files,
        plural(sum.files),
        sum.audio_secs,
        sum.windows,
        sum.runs,
        plural(sum.runs),
        sum.workers,
        plural(sum.workers),
    );
    if sum.windows > 0 && wall > 0.0 {
        let _ = write!(
            out,
            ", {:.1} runs/s, {:.0} windows/s ({:.0}x real time)",
            sum.runs as f64 / wall,
            sum.windows as f64 / wall,
            sum.audio_secs / wall,
        );
    }
    if sum.failed > 0 {
        let _ = write!(out, "; {} failed", sum.failed);
    }
    out.push('\n');
    let p = pool.stats();
    let _ = writeln!(
        out,
        "pool: {} clone{}, runs {}, planned {}, backing calls {}, reserved {} B ({:.2} MiB), \
         shrinks {}, plans {}",
        pool.sessions(),
        plural(pool.sessions() as u64),
        p.runs,
        p.arena.planned_runs,
        p.arena.backing_allocs,
        p.arena.reserved,
        mib(p.arena.reserved),
        p.arena.shrinks,
        p.plans.plans,
    );
    let cpus: Option<Vec<Duration>> = totals.iter().map(|t| t.cpu).collect();
    if let Some(cpus) = cpus {
        let cpu: f64 = cpus.iter().map(Duration::as_secs_f64).sum();
        let each: Vec<String> = cpus
            .iter()
            .map(|c| format!("{:.3}", c.as_secs_f64()))
            .collect();
        let _ = write!(
            out,
            "workers' CPU time: {cpu:.3} s ({} s)",
            each.join(" + ")
        );
        if sum.windows > 0 && cpu > 0.0 {
            let _ = write!(
                out,
                ": {:.0} windows per CPU second",
                sum.windows as f64 / cpu
            );
        }
        out.push('\n');
    }
    out
}

/// One file in the `--json` document.
#[derive(Serialize)]
#[serde(untagged)]
enum FileJson {
    /// Processed.
    Done {
        file: String,
        worker: usize,
        samples: usize,
        duration_secs: f64,
        windows: usize,
        runs: u64,
        segments: Vec<SegmentJson>,
        #[serde(skip_serializing_if = "Option::is_none")]
        probs: Option<Vec<f32>>,
        session: SessionJson,
    },
    /// Not processed.
    Failed { file: String, error: String },
}

/// A speech segment in the `--json` document.
#[derive(Serialize)]
struct SegmentJson {
    start_secs: f64,
    end_secs: f64,
    start_sample: u64,
    end_sample: u64,
}

/// The worker's session after a file, in the `--json` document.
#[derive(Serialize)]
struct SessionJson {
    runs: u64,
    planned_runs: u64,
    backing_allocs: u64,
    reserved_bytes: usize,
    shrinks: u64,
}

/// The segmentation settings, in the `--json` document.
#[derive(Serialize)]
struct SettingsJson {
    threshold: f64,
    neg_threshold: f64,
    min_speech_ms: u32,
    min_silence_ms: u32,
    speech_pad_ms: u32,
}

/// The whole `--json` document.
#[derive(Serialize)]
struct Document {
    sample_rate: u32,
    /// Samples per window (one probability each).
    window_samples: usize,
    settings: SettingsJson,
    files: Vec<FileJson>,
    summary: Summary,
}

/// The `--json` document of `outcomes` (in job order).
///
/// # Errors
/// Only if serialisation fails (it does not for these plain types).
fn json_document(
    outcomes: Vec<(usize, Outcome)>,
    summary: Summary,
    c: SegmentConfig,
) -> serde_json::Result<String> {
    let files = outcomes
        .into_iter()
        .map(|(_, o)| match o {
            Outcome::Failed { name, error } => FileJson::Failed { file: name, error },
            Outcome::Done(r) => FileJson::Done {
                duration_secs: r.samples as f64 / SAMPLE_RATE as f64,
                segments: r
                    .segments
                    .iter()
                    .map(|s| SegmentJson {
                        start_secs: s.start_secs(),
                        end_secs: s.end_secs(),
                        start_sample: s.start,
                        end_sample: s.end,
                    })
                    .collect(),
                session: SessionJson {
                    runs: r.stats.runs,
                    planned_runs: r.stats.arena.planned_runs,
                    backing_allocs: r.stats.arena.backing_allocs,
                    reserved_bytes: r.stats.arena.reserved,
                    shrinks: r.stats.arena.shrinks,
                },
                file: r.name,
                worker: r.worker,
                samples: r.samples,
                windows: r.windows,
                runs: r.runs,
                probs: r.probs,
            },
        })
        .collect();
    let doc = Document {
        sample_rate: SAMPLE_RATE,
        window_samples: WINDOW,
        settings: SettingsJson {
            threshold: c.threshold,
            neg_threshold: c.neg_threshold,
            min_speech_ms: c.min_speech_ms,
            min_silence_ms: c.min_silence_ms,
            speech_pad_ms: c.speech_pad_ms,
        },
        files,
        summary,
    };
    serde_json::to_string_pretty(&doc)
}
