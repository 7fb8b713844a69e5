//! The decay thread trims the C library's heap after a pass that only
//! learned: a refit's scratch lives in that thread's own glibc heap, which
//! glibc keeps resident once freed (5 MiB over det's 20 sizes through ONNX
//! Runtime; rec's planned peak 154.6 MiB without the trim against 136.8
//! with it). No worker here decays (their decay is off), so a trim counted
//! is the learning pass's. Its own test binary: the count is process-wide.

#![cfg(all(target_os = "linux", target_env = "gnu"))]

#[allow(dead_code)]
#[path = "all/common.rs"]
mod common;

use ort::session::Session;
use ort::value::Tensor;
use std::time::{Duration, Instant};
use tensor_arena_ort::{
    ort, register, system_heap_trims, Plans, RunKey, SessionBuilderExt, Worker, WorkerOptions,
};

/// A deterministic PP-OCR rec input of `width`.
fn tensor(width: usize) -> Tensor<f32> {
    let shape = [1usize, 3, 48, width];
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n as u32)
        .map(|i| (i % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    Tensor::from_array((shape, data)).unwrap()
}

#[test]
fn a_pass_that_only_learned_trims_the_c_heap() {
    let env = common::environment("trims");
    register(&env).unwrap();
    let mut session: Session = Session::builder(&env)
        .unwrap()
        .with_intra_threads(1)
        .unwrap()
        .with_tensor_arena()
        .unwrap()
        .commit_from_file(common::model("ppocr_rec.onnx"))
        .unwrap();
    // No decay: the only passes of the background thread are learning ones.
    let mut worker = Worker::new(WorkerOptions {
        decay: None,
        ..WorkerOptions::default()
    })
    .unwrap();
    let plans = Plans::default();
    let before = system_heap_trims();
    // Two widths teach the family; wider ones are predicted and widen the
    // range seen, which owes refits, made by the background thread.
    for width in [320, 160, 640, 1280] {
        let inputs = ort::inputs![tensor(width)];
        let key = RunKey::of(&inputs);
        drop(worker.run(&plans, &key, || session.run(inputs)).unwrap());
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while plans.cache().owes() || plans.stats().refits_learned == 0 {
        assert!(
            Instant::now() < deadline,
            "the runs left no refit to the thread"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The pass that made them trims after it (the count moves once the
    // pass ends, just after the refits).
    let deadline = Instant::now() + Duration::from_secs(5);
    while system_heap_trims() == before {
        assert!(
            Instant::now() < deadline,
            "no trim after a pass that made {} refits",
            plans.stats().refits_learned
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
