//! Memory following the input down, measured: one model over an alternating
//! sequence of a large and a small input, under one strategy in this
//! process (run each strategy in a process of its own; `tools/bench_follow.py`
//! does, and makes the table of `BENCHMARKS.md`).
//!
//! `cargo run --release -p tensor-arena-ort --example follow -- LIB MODEL STRATEGY LARGE SMALL PAIRS`
//!
//! STRATEGY: `ort-arena` (ONNX Runtime's defaults), `ort-shrink` (its arena
//! shrunk after every run), `follow1`, `follow2` (`Shrink::FollowInput`
//! with 1 or 2 runs), `keep` (`Shrink::KeepLargest`). LARGE and SMALL are
//! shapes like `1x3x1280x1280`. Prints one line per run: `i label millis
//! rss_after peak_in_use input_bytes high_water sys_millis minor_faults`
//! (peak and high water 0 for ONNX Runtime's strategies; system CPU time
//! and minor page faults of the whole process during the run, which tell
//! the kernel's part of a run apart) and first `session rss`. RSS is read
//! after the run's outputs are dropped.

use std::time::Instant;
use tensor_arena_ort::ort::session::{RunOptions, Session};
use tensor_arena_ort::ort::value::DynValue;
use tensor_arena_ort::{
    make_input, open_session, ArenaOptions, ArenaSession, Memory, Runtime, SessionOptions, Shrink,
};

fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |k| k * 1024)
}

/// System CPU time (ms) and minor page faults of this process so far.
fn kernel() -> (f64, i64) {
    // SAFETY: `getrusage` writes the struct it is given; a zeroed `rusage`
    // is a valid value of this plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a live, writable `rusage`; RUSAGE_SELF is valid.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return (0.0, 0);
    }
    let sys = ru.ru_stime.tv_sec as f64 * 1e3 + ru.ru_stime.tv_usec as f64 / 1e3;
    (sys, ru.ru_minflt)
}

fn dims(s: &str) -> Result<Vec<usize>, std::num::ParseIntError> {
    s.split('x').map(str::parse).collect()
}

enum Target {
    Ort(Session, Option<RunOptions>),
    Arena(Box<tensor_arena_ort::SessionWorker>),
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 7 {
        return Err("usage: follow LIB MODEL STRATEGY LARGE SMALL PAIRS".into());
    }
    let runtime = Runtime::load(&a[1])?;
    let (large, small, pairs) = (dims(&a[4])?, dims(&a[5])?, a[6].parse::<usize>()?);
    let shrink = match a[3].as_str() {
        "follow1" => Some(Shrink::FollowInput { runs: 1 }),
        "follow2" => Some(Shrink::FollowInput { runs: 2 }),
        "keep" => Some(Shrink::KeepLargest),
        "ort-arena" | "ort-shrink" => None,
        s => return Err(format!("unknown strategy {s}").into()),
    };
    let mut target = match shrink {
        Some(shrink) => {
            let options = ArenaOptions {
                shrink,
                ..ArenaOptions::default()
            };
            let session = ArenaSession::open(runtime, &a[2], options)?;
            Target::Arena(Box::new(session.worker()?))
        }
        None => {
            let session = open_session(
                runtime,
                &a[2],
                SessionOptions {
                    memory: Memory::OrtArena,
                    intra_threads: 0,
                },
            )?;
            let options = if a[3] == "ort-shrink" {
                let mut o = RunOptions::new()?;
                o.set("memory.enable_memory_arena_shrinkage", "cpu:0")?;
                Some(o)
            } else {
                None
            };
            Target::Ort(session, options)
        }
    };
    let spec = match &target {
        Target::Ort(s, _) => tensor_arena_ort::InputSpec::of(s),
        Target::Arena(w) => w.session().inputs().to_vec(),
    }
    .remove(0);
    let xl = make_input(&spec, &large, 1)?;
    let xs = make_input(&spec, &small, 2)?;
    let bytes = |d: &[usize]| d.iter().product::<usize>() * 4;
    println!("session {}", rss());
    for i in 0..2 * pairs {
        let (x, label, input_bytes) = if i % 2 == 0 {
            (&xl, &a[4], bytes(&large))
        } else {
            (&xs, &a[5], bytes(&small))
        };
        let inputs: [(&str, &DynValue); 1] = [(spec.name.as_str(), x)];
        let k0 = kernel();
        let t = Instant::now();
        let (peak, high_water) = match &mut target {
            Target::Ort(s, o) => {
                drop(tensor_arena_ort::run_shared(s, &inputs, o.as_ref())?);
                (0, 0)
            }
            Target::Arena(w) => {
                let out = w.run(&inputs)?;
                let r = (out.report.peak_in_use, out.report.high_water);
                drop(out);
                r
            }
        };
        let millis = t.elapsed().as_secs_f64() * 1e3;
        let k1 = kernel();
        println!(
            "{i} {label} {millis:.2} {} {peak} {input_bytes} {high_water} {:.2} {}",
            rss(),
            k1.0 - k0.0,
            k1.1 - k0.1
        );
    }
    Ok(())
}
