//! The VAD client out of memory: a detector call whose buffers the system
//! refuses (under a `RLIMIT_DATA` the child process sets itself) is a
//! `VadError::Arena` that says so; the detector and the session are
//! unchanged, and the next, smaller call gives the same probabilities as a
//! detector that never saw the failed one.

#[path = "../../arena/tests/support/child.rs"]
mod child;

use child::{limit_data_to_now_plus, run_child, MIB};
use std::sync::Arc;
use tensor_session::{LoadMode, Session, SessionConfig};
use tensor_vad::{load_weights, Detector, VadError, WINDOW};

fn main() {
    child::main(
        &[(
            "a_refused_call_leaves_detector_and_session_usable",
            refused_call,
        )],
        run_case,
    );
}

fn refused_call() {
    let out = run_child("vad");
    assert!(out.contains("refused: out of memory"), "{out}");
    assert!(out.contains("same probabilities"), "{out}");
}

fn run_case(case: &str) {
    assert_eq!(case, "vad");
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/silero_vad_16k_v6.safetensors");
    let weights = load_weights(path, LoadMode::Copy).unwrap();
    let mut session = Session::new(Arc::new(weights), SessionConfig::default());
    // A tone, so the probabilities depend on the state carried over.
    let tone = |n: usize| -> Vec<f32> { (0..n).map(|i| (i as f32 * 0.05).sin() * 0.3).collect() };
    let (mut d, mut reference) = (Detector::new(), Detector::new());
    let mut probs = vec![0.0; 8];
    d.process(&mut session, &tone(8 * WINDOW), &mut probs)
        .unwrap();
    let mut ref_session = session.try_clone();
    let mut ref_probs = vec![0.0; 8];
    reference
        .process(&mut ref_session, &tone(8 * WINDOW), &mut ref_probs)
        .unwrap();
    // What one window needs, to size a call the limit cannot hold.
    let per_window = session
        .stats()
        .last_run
        .unwrap()
        .peak_in_use
        .div_ceil(8)
        .max(1);
    let windows = (512 * MIB).div_ceil(per_window);
    let big = tone(windows * WINDOW);
    let mut big_probs = vec![0.0; windows];
    let state = d.state().clone();
    limit_data_to_now_plus(128 * MIB);
    let err = d
        .process(&mut session, &big, &mut big_probs)
        .expect_err("a call the data limit cannot hold");
    match &err {
        VadError::Arena(e) if e.is_out_of_memory() => {
            println!("child: refused: out of memory: {err}")
        }
        other => panic!("expected an arena out-of-memory error, got {other:?}"),
    }
    assert_eq!(d.state(), &state, "the detector changed on error");
    assert_eq!(session.stats().arena.in_use, 0);
    // The next call, as if the failed one never happened.
    let mut p = vec![0.0; 4];
    d.process(&mut session, &tone(4 * WINDOW), &mut p).unwrap();
    let mut q = vec![0.0; 4];
    reference
        .process(&mut ref_session, &tone(4 * WINDOW), &mut q)
        .unwrap();
    assert_eq!(p, q);
    println!("child: same probabilities after the refusal: {p:?}");
}
