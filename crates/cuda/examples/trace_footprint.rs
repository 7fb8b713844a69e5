//! Device footprint on a recorded allocation trace, against the simulated
//! driver (2 MiB granules, as on an H100): replays the trace's runs as
//! runs keyed by their label, three passes (first sight, seen before,
//! planned), then once more shrinking after every run smaller than the one
//! before. Prints, per run, the run's lower bound (most bytes live at once,
//! rounded to 512-byte blocks), the most bytes mapped during the run (over the largest need so far), or
//! right after a shrink the bytes left (over the run's own need), and the
//! driver calls.
//!
//! `cargo run --release -p tensor-arena-cuda --example trace_footprint -- traces/densenet121-mixed.trace`

use std::collections::HashMap;
use std::sync::Arc;
use tensor_arena::trace::{Event, Trace, TraceRun};
use tensor_arena_cuda::{DeviceArena, DeviceConfig, SimConfig, SimDriver, Stream, DEVICE_ALIGN};

const MIB: f64 = (1 << 20) as f64;

/// Most bytes live at once in `run`, each block rounded as the arena rounds.
fn need(run: &TraceRun) -> usize {
    let mut sizes = HashMap::new();
    let (mut live, mut peak) = (0usize, 0usize);
    for e in &run.events {
        match *e {
            Event::Alloc { id, bytes } => {
                let n = (bytes as usize).next_multiple_of(DEVICE_ALIGN);
                sizes.insert(id, n);
                live += n;
                peak = peak.max(live);
            }
            Event::Free { id } => live -= sizes.remove(&id).unwrap_or(0),
        }
    }
    peak
}

fn replay(a: &mut DeviceArena, run: &TraceRun) -> Result<(), Box<dyn std::error::Error>> {
    let s = Stream::DEFAULT;
    let mut live = HashMap::new();
    a.begin_run(run.label.as_bytes())?;
    for e in &run.events {
        match *e {
            Event::Alloc { id, bytes } => {
                live.insert(id, a.alloc(bytes as usize, s)?);
            }
            Event::Free { id } => {
                if let Some(p) = live.remove(&id) {
                    a.free(p, s)?;
                }
            }
        }
    }
    for (_, p) in live {
        a.free(p, s)?;
    }
    a.end_run()?;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: trace_footprint TRACE_FILE");
        std::process::exit(2);
    };
    let trace = Trace::from_file(&path)?;
    let sim = SimDriver::new(SimConfig {
        memory: 64 << 30,
        ..SimConfig::default()
    });
    let mut a = DeviceArena::new(Arc::new(sim.clone()), DeviceConfig::default())?;
    println!("{path}: {} runs, 2 MiB granules", trace.runs.len());
    println!(
        "{:>6} {:>18} {:>10} {:>12} {:>7} {:>12} {:>8}",
        "pass", "run", "need MiB", "mapped MiB", "ratio", "driver calls", "planned"
    );
    let mut max_need = 0;
    let mut worst = [0f64; 4];
    for pass in 0..4 {
        for (i, run) in trace.runs.iter().enumerate() {
            let calls = sim.calls().total();
            replay(&mut a, run)?;
            let n = need(run);
            max_need = max_need.max(n);
            let shrunk = pass == 3 && i > 0 && n < need(&trace.runs[i - 1]);
            if shrunk {
                a.shrink();
            }
            let st = a.stats();
            // The run's peak, or what is left after the shrink.
            let mapped = if shrunk {
                st.arena.reserved
            } else {
                st.last_run_peak_mapped
            };
            let ratio = if shrunk {
                mapped as f64 / n as f64
            } else {
                mapped as f64 / max_need as f64
            };
            if pass < 3 || shrunk {
                worst[pass] = worst[pass].max(ratio);
            }
            let name = ["first", "seen", "plan", "shrink"][pass];
            println!(
                "{:>6} {:>18} {:>10.2} {:>12.2} {:>7.3} {:>12} {:>8}",
                name,
                run.label,
                n as f64 / MIB,
                mapped as f64 / MIB,
                ratio,
                sim.calls().total() - calls,
                a.last_run().is_some_and(|r| r.planned && !r.deviated),
            );
        }
    }
    println!(
        "worst mapped / need: first sight {:.3}, seen before {:.3}, planned {:.3}, after shrink {:.3} (of that run's need)",
        worst[0], worst[1], worst[2], worst[3]
    );
    drop(a);
    assert_eq!(sim.mapped_bytes(), 0);
    Ok(())
}
