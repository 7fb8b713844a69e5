//! Whole-run replay per strategy, each in a fresh process: time per run,
//! minor page faults per run, backing allocations per run, and peak
//! resident memory against the trace's lower bound.
//!
//! Usage: `cargo run --profile bench -p benches --bin rss -- [--replays N] [--tuned] [TRACE...]`
//! (default: the three `-mixed` traces, 5 measured replays after 2 warm-up
//! replays). `--tuned` adds jemalloc and glibc with their caching tuned
//! through the environment (see [`TUNED`]); the best-baseline ratio only
//! counts the default configurations. The binary re-executes itself with
//! `--child STRATEGY TRACE N` for each strategy, so that one strategy's
//! peak cannot hide another's.
//! Peak RSS is `VmHWM` after resetting it (`/proc/self/clear_refs`) once the
//! trace is loaded, minus the RSS at that moment.
//!
//! Besides the strategies of [`Strategy::ALL`], a `preplanned` row runs the
//! planned arena with its plans made before the first run (as a process
//! that loads plans saved by an earlier one would).

use benches::{
    bare_replayer, make_plans, median, mib, minor_faults, peak_rss_bytes, preplanned_replayer,
    replayer, reset_peak_rss, rss_bytes, trim_heap, Strategy, Trace,
};
use std::process::Command;
use std::time::Instant;

/// Strategies measured beyond [`Strategy::ALL`]: the same allocator with
/// its caching tuned through the environment, to show what the defaults cost.
const TUNED: [(&str, Strategy, &str, &str); 2] = [
    (
        "jemalloc, decay off",
        Strategy::Jemalloc,
        "_RJEM_MALLOC_CONF",
        "dirty_decay_ms:-1,muzzy_decay_ms:-1",
    ),
    (
        "system, mmap/trim at 1 GiB",
        Strategy::System,
        "GLIBC_TUNABLES",
        "glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=1073741824",
    ),
];

/// What a child reports.
struct Measured {
    label: String,
    strategy: Strategy,
    /// Median time of one replay of the whole trace, in seconds.
    replay: f64,
    faults_per_run: f64,
    backing_per_run: Option<f64>,
    /// Peak resident bytes above the baseline.
    peak: usize,
    /// Resident bytes above the baseline after the last replay.
    end: usize,
}

/// The pseudo-strategy of a planned arena whose plans exist before its
/// first run (made in the child by a scratch arena, freed before measuring).
const PREPLANNED: &str = "preplanned";

fn child(strategy: &str, name: &str, replays: usize) {
    let trace = Trace::load(name);
    let runs = trace.runs.len();
    // Plans are made (on a scratch arena, freed) before the baseline.
    let plans = [PREPLANNED, Strategy::Bare.name()]
        .contains(&strategy)
        .then(|| make_plans(&trace));
    // The scratch arena's memory is free now; make sure it left the process.
    trim_heap();
    let baseline = rss_bytes().unwrap_or(0);
    let reset = reset_peak_rss();
    let mut r = match (strategy, plans) {
        (PREPLANNED, Some(plans)) => preplanned_replayer(plans),
        (_, Some(plans)) => bare_replayer(&plans, &trace),
        _ => replayer(
            Strategy::from_name(strategy).expect("a strategy name"),
            &trace,
        ),
    };
    for _ in 0..2 {
        r.replay(&trace);
    }
    let backing = r.counters().backing_allocs;
    let faults = minor_faults();
    let mut times = Vec::with_capacity(replays);
    for _ in 0..replays {
        let start = Instant::now();
        r.replay(&trace);
        times.push(start.elapsed().as_secs_f64());
    }
    let faults = minor_faults() - faults;
    let backing = r
        .counters()
        .backing_allocs
        .zip(backing)
        .map(|(now, then)| format!("{}", (now - then) as f64 / (replays * runs) as f64));
    let peak = peak_rss_bytes().unwrap_or(0).saturating_sub(baseline);
    let end = rss_bytes().unwrap_or(0).saturating_sub(baseline);
    println!(
        "RESULT {} {} {} {} {} {} {end}",
        strategy,
        median(&mut times),
        faults as f64 / (replays * runs) as f64,
        backing.unwrap_or_else(|| "-".to_owned()),
        peak,
        reset,
    );
}

fn measure(
    label: &str,
    strategy: Strategy,
    env: Option<(&str, &str)>,
    name: &str,
    replays: usize,
) -> Measured {
    let exe = std::env::current_exe().expect("own path");
    let mut cmd = Command::new(exe);
    let child_name = if label == PREPLANNED {
        PREPLANNED
    } else {
        strategy.name()
    };
    cmd.args(["--child", child_name, name, &replays.to_string()]);
    if let Some((key, value)) = env {
        cmd.env(key, value);
    }
    let out = cmd.output().expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("RESULT "))
        .unwrap_or_else(|| {
            panic!(
                "child {} {name} failed: {}\n{}",
                strategy.name(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let f: Vec<&str> = line.split(' ').collect();
    if f[6] != "true" {
        eprintln!("note: could not reset VmHWM; peak includes loading the trace");
    }
    Measured {
        label: label.to_owned(),
        strategy,
        replay: f[2].parse().expect("time"),
        faults_per_run: f[3].parse().expect("faults"),
        backing_per_run: f[4].parse().ok(),
        peak: f[5].parse().expect("peak"),
        end: f[7].parse().expect("end"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        child(&args[1], &args[2], args[3].parse().expect("a replay count"));
        return;
    }
    let mut replays = 5;
    let mut tuned = false;
    let mut traces = Vec::new();
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--replays" => replays = it.next().and_then(|n| n.parse().ok()).expect("--replays N"),
            "--tuned" => tuned = true,
            "-h" | "--help" => {
                println!(
                    "usage: rss [--replays N] [--tuned] [TRACE...]   (default: the -mixed traces)"
                );
                return;
            }
            _ => traces.push(arg),
        }
    }
    if traces.is_empty() {
        traces = ["densenet121-mixed", "ppocr-cls-mixed", "silero-vad-mixed"]
            .map(str::to_owned)
            .to_vec();
    }
    for name in &traces {
        let trace = Trace::load(name);
        let runs = trace.runs.len() as f64;
        let lb = trace.lower_bound();
        let mut results: Vec<Measured> = Strategy::ALL
            .into_iter()
            .map(|s| measure(s.name(), s, None, name, replays))
            .collect();
        results.push(measure(PREPLANNED, Strategy::Planned, None, name, replays));
        if tuned {
            for (label, s, key, value) in TUNED {
                results.push(measure(label, s, Some((key, value)), name, replays));
            }
        }
        let bare = results
            .iter()
            .find(|m| m.strategy == Strategy::Bare)
            .map_or(f64::NAN, |m| m.replay);
        let best = results
            .iter()
            .filter(|m| m.strategy.is_baseline() && m.label == m.strategy.name())
            .map(|m| m.replay)
            .fold(f64::INFINITY, f64::min);
        println!(
            "\n{name}: {} runs, lower bound {} MiB, {replays} replays measured after 2 warm-up replays, one process per strategy",
            trace.runs.len(),
            mib(lb)
        );
        println!("| strategy | ms/run (median) | x bare | x best baseline | minor faults/run | backing allocs/run | peak RSS MiB | x lower bound | RSS at end MiB |");
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for m in &results {
            println!(
                "| {} | {:.3} | {:.2} | {:.2} | {:.1} | {} | {} | {:.2} | {} |",
                m.label,
                m.replay / runs * 1e3,
                m.replay / bare,
                m.replay / best,
                m.faults_per_run,
                m.backing_per_run
                    .map_or("-".to_owned(), |b| format!("{b:.2}")),
                mib(m.peak),
                m.peak as f64 / lb as f64,
                mib(m.end),
            );
        }
    }
}
