//! Where a run's live bytes and its plan's reach stand over the run: for
//! each run of a trace, its plan's size, when its live peak comes (the
//! share of its events before it), and the live bytes and the plan's reach
//! (the highest byte of the plan's block any block so far was placed at)
//! at each tenth of its events, in MiB; then the most huge pages (2 MiB)
//! of the plan's block that live blocks touch at once in each twentieth of
//! its events (what a run that gave back the rest would hold).
//!
//! A worker commits its plan's block for the whole run, so what runs in
//! flight together commit is the sum of their blocks, while their live
//! bytes peak at different moments (docs/decisions.md, "What runs in
//! flight together hold: each run's block for its whole length").
//!
//! `TRACES_DIR=traces/ort cargo run --release -p benches --example reach -- ppocr-det-sizes`

use benches::{Op, Trace};
use tensor_arena::{Plan, Recording};

/// Prints the table for the trace named by the first argument.
fn main() {
    let Some(name) = std::env::args().nth(1) else {
        eprintln!("usage: reach TRACE_NAME (a file NAME.trace in TRACES_DIR)");
        std::process::exit(2);
    };
    let trace = Trace::load(&name);
    let mib = |x: usize| x as f64 / 1048576.0;
    for run in &trace.runs {
        let mut rec = Recording::new();
        let mut ids = vec![0u32; run.slots];
        for op in &run.ops {
            match *op {
                Op::Alloc { id, bytes } => ids[id as usize] = rec.alloc(bytes, 64),
                Op::Free { id } => rec.free(ids[id as usize]),
            }
        }
        let plan = match Plan::from_recording(&rec) {
            Ok(plan) => plan,
            Err(e) => {
                eprintln!("{}: {e}", run.label);
                continue;
            }
        };
        let (mut live, mut reach, mut block) = (0usize, 0usize, 0usize);
        let mut sizes = vec![0usize; run.slots];
        let mut samples = Vec::with_capacity(run.ops.len());
        // Huge pages of the block touched by live blocks: a count per page.
        const PAGE: usize = 2 << 20;
        let mut per_page = vec![0u32; plan.size().div_ceil(PAGE)];
        let (mut touched, mut pages_at) = (0usize, Vec::with_capacity(run.ops.len()));
        let mut spans = vec![(0usize, 0usize); run.slots];
        for op in &run.ops {
            match *op {
                Op::Alloc { id, bytes } => {
                    let size = bytes.div_ceil(64) * 64;
                    sizes[id as usize] = size;
                    live += size;
                    let off = plan.offset(block).unwrap_or(0);
                    reach = reach.max(off + size);
                    block += 1;
                    let (a, b) = (off / PAGE, (off + size).div_ceil(PAGE));
                    spans[id as usize] = (a, b);
                    for c in &mut per_page[a..b] {
                        touched += usize::from(*c == 0);
                        *c += 1;
                    }
                }
                Op::Free { id } => {
                    live -= sizes[id as usize];
                    let (a, b) = spans[id as usize];
                    for c in &mut per_page[a..b] {
                        *c -= 1;
                        touched -= usize::from(*c == 0);
                    }
                }
            }
            samples.push((live, reach));
            pages_at.push(touched);
        }
        let n = samples.len();
        if n == 0 {
            continue;
        }
        let peak = samples.iter().map(|s| s.0).max().unwrap_or(0);
        let at = samples.iter().position(|s| s.0 == peak).unwrap_or(0);
        let tenths: Vec<String> = (1..=10)
            .map(|k| {
                let (l, r) = samples[(n * k / 10).min(n - 1)];
                format!("{:.0}/{:.0}", mib(l), mib(r))
            })
            .collect();
        let twentieths: Vec<String> = (0..20)
            .map(|k| {
                let from = (n * k / 20).min(n - 1);
                let part = &pages_at[from..(n * (k + 1) / 20).clamp(from + 1, n)];
                part.iter().max().unwrap_or(&0).to_string()
            })
            .collect();
        println!(
            "{}: plan {:.1} MiB, live peak {:.1} MiB at {:.0}% of the events; live/reach by tenths: {}; \
             huge pages of {} touched, most in each twentieth: {}",
            run.label,
            mib(plan.size()),
            mib(peak),
            100.0 * at as f64 / n as f64,
            tenths.join(" "),
            per_page.len(),
            twentieths.join(" ")
        );
    }
}
