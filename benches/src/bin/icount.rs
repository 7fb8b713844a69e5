//! Instructions per allocation, counted by `valgrind --tool=callgrind`: a
//! noise-free companion to the `hot_path` and `trace_order` benches on a
//! shared machine.
//!
//! Usage:
//! ```text
//! cargo build --release -p benches --bin icount
//! valgrind --tool=callgrind --collect-atstart=no --toggle-collect='icount::measure*' \
//!     target/release/icount WORKLOAD STRATEGY
//! ```
//! `WORKLOAD` is `pairs` (the `hot_path` batch: 1,024 pairs of random sizes
//! 1 KiB-50 MiB, one block live) or a trace name such as
//! `densenet121-mixed` (the `trace_order` replay: the trace's own order,
//! no page touched); `STRATEGY` is a name of [`Strategy`] (`arena`,
//! `planned`, `shared`, `rlsf`, `talc`, ...; also `planned-scoped`, the
//! planned runs through a `ScopedRun`, and `arena-scoped`, dynamic runs
//! through one; and `floor`, the offsets-only TLSF of `benches::floor`,
//! with no arena; and, for traces, `predicted` and `predicted-scoped`: the
//! planned runs served from the plan each shape's family predicts from the
//! trace's other shapes, as a shape never seen is). The warm-up (three batches,
//! or one replay) runs before collection starts; only the functions named
//! `measure*` are counted. The program prints how many allocations (each
//! with its free) were measured: callgrind's "Collected" count divided by
//! it is the instructions per allocation and free.

use benches::{
    arena_scoped_pairs, dynamic_scoped_replayer, floor_pairs, floor_replayer, hot_path_sizes,
    make_predicted_plans, pairs, planned_scoped_pairs, preplanned_replayer,
    preplanned_scoped_replayer, replayer, scoped_replayer, Pairs, Replay, Strategy, Touch, Trace,
};
use std::hint::black_box;
use std::process::ExitCode;

/// Measured batches of pairs.
const BATCHES: usize = 10;
/// Pairs per batch (as in `hot_path`).
const BATCH: usize = 1024;
/// Measured replays of a trace.
const REPLAYS: usize = 2;

#[inline(never)]
fn measure_pairs(p: &mut dyn Pairs, sizes: &[usize]) {
    for _ in 0..BATCHES {
        p.pairs(black_box(sizes));
    }
}

#[inline(never)]
fn measure_replays(r: &mut dyn Replay, trace: &Trace) {
    for _ in 0..REPLAYS {
        for run in &trace.runs {
            r.run_with(run, Touch::Nothing);
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [workload, strategy] = args.as_slice() else {
        eprintln!("usage: icount (pairs | TRACE) STRATEGY");
        return ExitCode::from(2);
    };
    // `predicted`, `predicted-scoped`: planned runs from predicted plans.
    let predicted = strategy.starts_with("predicted");
    // `planned-scoped`: planned runs through a `ScopedRun`.
    let scoped = strategy == "planned-scoped" || strategy == "predicted-scoped";
    let dynamic_scoped = strategy == "arena-scoped";
    // `floor`: the offsets-only TLSF of `benches::floor`, no arena.
    let floor = strategy == "floor";
    let Some(strategy) = Strategy::from_name(match strategy.as_str() {
        "planned-scoped" | "predicted" | "predicted-scoped" => "planned",
        "arena-scoped" => "arena",
        // Not used for the floor, which is no `Strategy`.
        "floor" => "rlsf",
        other => other,
    })
    .filter(|s| *s != Strategy::Bare) else {
        eprintln!("icount: unknown strategy {strategy:?}");
        return ExitCode::from(2);
    };
    if workload == "pairs" {
        let sizes = hot_path_sizes(BATCH);
        let made = if floor {
            Some(floor_pairs())
        } else if scoped {
            Some(planned_scoped_pairs(&sizes))
        } else if dynamic_scoped {
            Some(arena_scoped_pairs())
        } else {
            pairs(strategy, &sizes)
        };
        let Some(mut p) = made else {
            eprintln!("icount: {} does not allocate", strategy.name());
            return ExitCode::from(2);
        };
        for _ in 0..3 {
            p.pairs(&sizes);
        }
        measure_pairs(p.as_mut(), &sizes);
        println!("allocations measured: {}", BATCHES * BATCH);
    } else {
        if !benches::trace_names().iter().any(|n| n == workload) {
            eprintln!("icount: no trace named {workload:?}");
            return ExitCode::from(2);
        }
        let trace = Trace::load(workload);
        let allocs: usize = trace.runs.iter().map(|r| r.allocs().count()).sum();
        let mut r = if predicted {
            let (plans, n) = make_predicted_plans(&trace);
            eprintln!("icount: {n} of {} shapes' plans predicted", plans.len());
            if scoped {
                preplanned_scoped_replayer(plans)
            } else {
                preplanned_replayer(plans)
            }
        } else if floor {
            floor_replayer()
        } else if scoped {
            scoped_replayer()
        } else if dynamic_scoped {
            dynamic_scoped_replayer()
        } else {
            replayer(strategy, &trace)
        };
        for run in &trace.runs {
            r.run_with(run, Touch::Nothing);
        }
        measure_replays(r.as_mut(), &trace);
        println!("allocations measured: {}", REPLAYS * allocs);
    }
    ExitCode::SUCCESS
}
