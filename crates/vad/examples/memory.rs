//! Memory of the session path against lower bounds, for the input lengths
//! of the silero-vad traces in `traces/` (L = 1, 31, 313, 938, 1875).
//!
//! `cargo run --release -p tensor-vad --example memory`
//!
//! Per length, on a fresh session: the first run (recorded, dynamic pool)
//! and the second (served from the plan), and `shrink()` after them; the plan's size and lower bound
//! (the most bytes the recorded run had live at once, sizes rounded to the
//! arena's 64-byte alignment); this crate's schedule lower bound
//! (`peak_len(L) * 4`, exact sizes); and the lower bound of ONNX Runtime's
//! own intermediate tensors for the same input (traces/REFERENCE.md). Then
//! the mixed sequence of `silero-vad-mixed.trace` on one session under
//! each shrink policy: bytes reserved after each run.

use std::sync::Arc;

use tensor_arena::ShrinkPolicy;
use tensor_session::{LoadMode, MmapAck, Session, SessionConfig, Weights};
use tensor_vad::{key, load_weights, peak_len, total_len, Detector, WINDOW};

/// `traces/REFERENCE.md`, silero-vad: exact lower bound and naive bytes of
/// ONNX Runtime's intermediate tensors for `L x 576`.
const ORT: [(usize, usize, usize); 5] = [
    (1, 9804, 39612),
    (31, 303924, 1197252),
    (313, 3068652, 12079068),
    (938, 9196152, 36196568),
    (1875, 18382500, 72353524),
];

/// Deterministic noise-like samples (the model's memory does not depend
/// on the values).
fn audio(l: usize) -> Vec<i16> {
    let mut s = 0x9e37_79b9u32;
    (0..l * WINDOW)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 20) as i16 - 2048
        })
        .collect()
}

fn run(session: &mut Session, samples: &[i16], probs: &mut [f32]) -> tensor_arena::RunReport {
    Detector::new()
        .process(session, samples, probs)
        .expect("run");
    session.stats().last_run.expect("a run")
}

fn main() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/silero_vad_16k_v6.safetensors"
    );
    // SAFETY: the committed model file is only read, never written, while this runs.
    let mmap = LoadMode::Mmap(unsafe { MmapAck::new() });
    let weights: Arc<Weights> = Arc::new(load_weights(path, mmap).expect("weights"));

    println!("Bytes per input length (fresh session per length; B = bytes):");
    println!(
        "| L | run 1 backing calls | run 1 high water | run 2 planned, backing calls | plan size | plan lower bound | schedule lower bound (peak_len x 4) | naive (total_len x 4) | reserved after run 2 | after shrink() | ORT lower bound | ORT naive | reserved / ORT lb | after shrink / ORT lb |"
    );
    println!("|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &(l, ort_lb, ort_naive) in &ORT {
        let mut session = Session::new(Arc::clone(&weights), SessionConfig::default());
        let samples = audio(l);
        let mut probs = vec![0.0; l];
        let r1 = run(&mut session, &samples, &mut probs);
        let r2 = run(&mut session, &samples, &mut probs);
        let plan = session.plans().get(&key(l)[..]).expect("plan learned");
        let reserved = session.stats().arena.reserved;
        session.shrink();
        let shrunk = session.stats().arena.reserved;
        println!(
            "| {l} | {} | {} | {}, {} | {} | {} | {} | {} | {reserved} | {shrunk} | {ort_lb} | {ort_naive} | {:.3} | {:.3} |",
            r1.backing_allocs,
            r1.high_water,
            r2.planned && !r2.deviated,
            r2.backing_allocs,
            plan.size(),
            plan.lower_bound(),
            peak_len(l) * 4,
            total_len(l) * 4,
            reserved as f64 / ort_lb as f64,
            shrunk as f64 / ort_lb as f64,
        );
    }

    let sequence = [1875usize, 31, 1, 313, 938, 1, 1875];
    println!();
    println!("Mixed sequence {sequence:?} on one session: reserved bytes after each run (backing calls in the run)");
    let policies = [
        ("manual", ShrinkPolicy::Manual),
        ("every-run", ShrinkPolicy::AfterEveryRun),
        ("below:3", ShrinkPolicy::AfterRunsBelow { runs: 3 }),
    ];
    print!("| policy |");
    for l in sequence {
        print!(" L = {l} |");
    }
    println!();
    println!("|---|{}", "---:|".repeat(sequence.len()));
    for (name, policy) in policies {
        let mut config = SessionConfig::default();
        config.arena.shrink_policy = policy;
        let mut session = Session::new(Arc::clone(&weights), config);
        print!("| {name} |");
        for &l in &sequence {
            let samples = audio(l);
            let mut probs = vec![0.0; l];
            let r = run(&mut session, &samples, &mut probs);
            print!(" {} ({}) |", r.reserved, r.backing_allocs);
        }
        println!();
    }
    print!("| ORT lower bound |");
    for &l in &sequence {
        let lb = ORT.iter().find(|o| o.0 == l).expect("known").1;
        print!(" {lb} |");
    }
    println!();
    print!("| schedule lower bound |");
    for &l in &sequence {
        print!(" {} |", peak_len(l) * 4);
    }
    println!();
}
