//! Memory following the input down, measured: one model over an alternating
//! sequence of a large and a small input, under one strategy in this
//! process (run each strategy in a process of its own; `tools/bench_follow.py`
//! does, and makes the table of `BENCHMARKS.md`).
//!
//! `cargo run --release -p tensor-arena-ort --example follow -- LIB MODEL STRATEGY LARGE SMALL PAIRS`
//!
//! STRATEGY: `ort-arena` (ONNX Runtime's defaults), `ort-shrink` (its arena
//! shrunk after every run), `follow1`, `follow2` (`Shrink::FollowInput`
//! with 1 or 2 runs), `keep` (`Shrink::KeepLargest`), `default`
//! (`Shrink::default()`, with the default idle decay); an arena strategy
//! with `-lazy` after it (`follow1-lazy`) gives memory back lazily
//! (`GiveBack::Lazily`). LARGE and SMALL are
//! shapes like `1x3x1280x1280`. Prints one line per run: `i label millis
//! rss_after peak_in_use input_bytes high_water sys_millis minor_faults
//! lazy_free peak_rss`
//! (peak and high water 0 for ONNX Runtime's strategies; `peak_rss` the
//! process's peak RSS during the run, `VmHWM` reset before it and after
//! the worker gave back what the run's plan does not need
//! (`SessionWorker::prepare`, timed into the run), 0 where it cannot be
//! reset; system CPU time
//! and minor page faults of the whole process during the run, which tell
//! the kernel's part of a run apart) and first `session rss`. RSS is read
//! after the run's outputs are dropped.
//!
//! STRATEGY may also be a comma-separated list (`follow1,ort-arena,keep`):
//! then every strategy gets its own session in this one process, and each
//! pair is run by each strategy in turn (large then small; the order turns
//! from pair to pair), so the machine's load falls on all of them alike. This is for time only (RSS is the
//! process's): lines are `strategy i label millis sys_millis minor_faults
//! cpu_millis` (CPU time of the whole process, user and system, during the
//! run), and a summary gives each strategy's median large-run time over the
//! pairs after the first and the median, over those pairs, of its large
//! run's time (and CPU time) divided by the first strategy's in the same
//! pair. With `small-first` after PAIRS, each strategy runs its small input
//! first in each pair, so its large run follows its own small one at once
//! (as in one stream of alternating requests); by default the other
//! strategies' runs come between. Idle decay is off in this mode: the other strategies' runs would
//! be idle time to it (a large det run takes more than its 2 s on a busy
//! machine), and each strategy would commit again as if after idle.

use std::time::Instant;
use tensor_arena::memory::{GiveBack, PagesConfig};
use tensor_arena_ort::ort::session::{RunOptions, Session};
use tensor_arena_ort::ort::value::DynValue;
use tensor_arena_ort::{
    make_input, open_session, ArenaOptions, ArenaSession, Memory, Runtime, SessionOptions, Shrink,
};

/// Bytes of `field` (a line `field: N kB`) in `/proc/self/<file>`, 0 if
/// it cannot be read.
fn proc_bytes(file: &str, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/self/{file}"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |k| k * 1024)
}

fn rss() -> u64 {
    proc_bytes("status", "VmRSS:")
}

/// Bytes of this process's memory given back with `MADV_FREE` that the
/// kernel has not taken yet (`LazyFree` of `/proc/self/smaps_rollup`): in
/// RSS, but the first memory the kernel reclaims.
fn lazy_free() -> u64 {
    proc_bytes("smaps_rollup", "LazyFree:")
}

/// System CPU time (ms), minor page faults and CPU time, user and system
/// (ms), of this process so far.
fn kernel() -> (f64, i64, f64) {
    // SAFETY: `getrusage` writes the struct it is given; a zeroed `rusage`
    // is a valid value of this plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a live, writable `rusage`; RUSAGE_SELF is valid.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return (0.0, 0, 0.0);
    }
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    let sys = ms(ru.ru_stime);
    (sys, ru.ru_minflt, sys + ms(ru.ru_utime))
}

fn dims(s: &str) -> Result<Vec<usize>, std::num::ParseIntError> {
    s.split('x').map(str::parse).collect()
}

enum Target {
    Ort(Session, Option<RunOptions>),
    Arena(Box<tensor_arena_ort::SessionWorker>),
}

fn open(
    runtime: &Runtime,
    model: &str,
    strategy: &str,
    decay: bool,
) -> Result<Target, Box<dyn std::error::Error>> {
    let (strategy, give_back) = match strategy.strip_suffix("-lazy") {
        Some(s) => (s, GiveBack::Lazily),
        None => (strategy, GiveBack::Now),
    };
    let shrink = match strategy {
        "follow1" => Some(Shrink::FollowInput { runs: 1 }),
        "follow2" => Some(Shrink::FollowInput { runs: 2 }),
        "keep" => Some(Shrink::KeepLargest),
        // The default (a window of 1 s, idle decay after 2 s).
        "default" => Some(Shrink::default()),
        "ort-arena" | "ort-shrink" if give_back == GiveBack::Now => None,
        s => return Err(format!("unknown strategy {s}").into()),
    };
    Ok(match shrink {
        Some(shrink) => {
            let options = ArenaOptions {
                shrink,
                pages: PagesConfig {
                    give_back,
                    ..PagesConfig::default()
                },
                ..ArenaOptions::default()
            };
            let options = match decay {
                true => options,
                false => ArenaOptions {
                    decay: None,
                    ..options
                },
            };
            let session = ArenaSession::open(runtime, model, options)?;
            Target::Arena(Box::new(session.worker()?))
        }
        None => {
            let session = open_session(
                runtime,
                model,
                SessionOptions {
                    memory: Memory::OrtArena,
                    intra_threads: 0,
                },
            )?;
            let options = if strategy == "ort-shrink" {
                let mut o = RunOptions::new()?;
                o.set("memory.enable_memory_arena_shrinkage", "cpu:0")?;
                Some(o)
            } else {
                None
            };
            Target::Ort(session, options)
        }
    })
}

/// One run: its time (ms), and the run's peak in use and high water (0 for
/// ONNX Runtime's strategies).
fn run(
    target: &mut Target,
    inputs: &[(&str, &DynValue)],
) -> Result<(f64, usize, usize), Box<dyn std::error::Error>> {
    let t = Instant::now();
    let (peak, high_water) = match target {
        Target::Ort(s, o) => {
            drop(tensor_arena_ort::run_shared(s, inputs, o.as_ref())?);
            (0, 0)
        }
        Target::Arena(w) => {
            let out = w.run(inputs)?;
            let r = (out.report.peak_in_use, out.report.high_water);
            drop(out);
            r
        }
    };
    Ok((t.elapsed().as_secs_f64() * 1e3, peak, high_water))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 7 {
        return Err(
            "usage: follow LIB MODEL STRATEGY[,STRATEGY...] LARGE SMALL PAIRS [small-first]".into(),
        );
    }
    let small_first = a.get(7).is_some_and(|s| s == "small-first");
    let runtime = Runtime::load(&a[1])?;
    let (large, small, pairs) = (dims(&a[4])?, dims(&a[5])?, a[6].parse::<usize>()?);
    let names: Vec<&str> = a[3].split(',').collect();
    let mut targets = Vec::with_capacity(names.len());
    for name in &names {
        targets.push(open(runtime, &a[2], name, names.len() == 1)?);
    }
    let spec = match &targets[0] {
        Target::Ort(s, _) => tensor_arena_ort::InputSpec::of(s),
        Target::Arena(w) => w.session().inputs().to_vec(),
    }
    .remove(0);
    let xl = make_input(&spec, &large, 1)?;
    let xs = make_input(&spec, &small, 2)?;
    let bytes = |d: &[usize]| d.iter().product::<usize>() * 4;
    if let [target] = targets.as_mut_slice() {
        println!("session {}", rss());
        for i in 0..2 * pairs {
            let (x, label, input_bytes) = if i % 2 == 0 {
                (&xl, &a[4], bytes(&large))
            } else {
                (&xs, &a[5], bytes(&small))
            };
            let inputs: [(&str, &DynValue); 1] = [(spec.name.as_str(), x)];
            // What the worker gives back before the run (as the run would
            // as it starts), timed into the run: its peak starts after.
            let k0 = kernel();
            let t = Instant::now();
            if let Target::Arena(w) = target {
                w.prepare(&inputs)?;
            }
            let prepared = t.elapsed().as_secs_f64() * 1e3;
            // `5` resets the peak RSS (`VmHWM`) to the RSS now (Linux 4.0).
            let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
            let (millis, peak, high_water) = run(target, &inputs)?;
            let millis = millis + prepared;
            let k1 = kernel();
            let peak_rss = if reset {
                proc_bytes("status", "VmHWM:")
            } else {
                0
            };
            println!(
                "{i} {label} {millis:.2} {} {peak} {input_bytes} {high_water} {:.2} {} {} {peak_rss}",
                rss(),
                k1.0 - k0.0,
                k1.1 - k0.1,
                lazy_free()
            );
        }
        return Ok(());
    }
    if pairs < 2 {
        return Err("several strategies need at least 2 pairs (the first is warm-up)".into());
    }
    // Interleaved: large[s][pair] is strategy s's large-run time in a pair.
    let mut large_ms = vec![Vec::with_capacity(pairs); targets.len()];
    let mut large_cpu = vec![Vec::with_capacity(pairs); targets.len()];
    let n = targets.len();
    for pair in 0..pairs {
        // The order turns each pair, so that no strategy always runs first
        // (after another model's small run) or last.
        for k in 0..n {
            let s = (pair + k) % n;
            let target = &mut targets[s];
            let mut runs = [(2 * pair, &xl, &a[4]), (2 * pair + 1, &xs, &a[5])];
            if small_first {
                runs.reverse();
            }
            for (i, x, label) in runs {
                let inputs: [(&str, &DynValue); 1] = [(spec.name.as_str(), x)];
                let k0 = kernel();
                let (millis, _, _) = run(target, &inputs)?;
                let k1 = kernel();
                println!(
                    "{} {i} {label} {millis:.2} {:.2} {} {:.2}",
                    names[s],
                    k1.0 - k0.0,
                    k1.1 - k0.1,
                    k1.2 - k0.2
                );
                if i % 2 == 0 {
                    large_ms[s].push(millis);
                    large_cpu[s].push(k1.2 - k0.2);
                }
            }
        }
    }
    // The first pair warms every strategy up; it is left out.
    for (s, name) in names.iter().enumerate() {
        let own = median(large_ms[s][1..].to_vec());
        let paired = |v: &[Vec<f64>]| {
            median(
                v[s][1..]
                    .iter()
                    .zip(&v[0][1..])
                    .map(|(x, y)| x / y)
                    .collect(),
            )
        };
        let (ratio, cpu) = (paired(&large_ms), paired(&large_cpu));
        println!(
            "summary {name}: large run median {own:.2} ms, {ratio:.3}x {} in the same pair, CPU time {cpu:.3}x (medians of {} pairs)",
            names[0],
            pairs - 1
        );
    }
    Ok(())
}
