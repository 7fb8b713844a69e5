//! An existing `ort` server adopts tensor-arena: its own environment, its
//! own `SessionBuilder` with options this crate never sets (graph
//! optimization level 1, a config entry, intra-op threads), its own
//! `session.run(ort::inputs![...])`, wrapped. Outputs are bitwise those of
//! the same session without the arena, and every allocation of a run is a
//! block of the worker's arena. (A binary of its own: it makes the process's
//! environment the way a server does.)

#[allow(dead_code)]
#[path = "all/common.rs"]
mod common;

use ort::environment::Environment;
use ort::session::builder::{GraphOptimizationLevel, SessionBuilder};
use ort::session::Session;
use ort::value::Tensor;
use std::sync::{Arc, OnceLock};
use tensor_arena_ort::{
    allocator_counters, ort, register, Plans, RunKey, SessionBuilderExt, Worker, WorkerOptions,
};

/// The tests compare process-wide counters: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The server's environment, made as a server makes it. Before the
/// allocator is registered, `with_tensor_arena` refuses with a message
/// that says what to do.
fn env() -> &'static Environment {
    static ENV: OnceLock<Environment> = OnceLock::new();
    ENV.get_or_init(|| {
        let env = common::environment("existing-server");
        let refused = Session::builder(&env)
            .unwrap()
            .with_tensor_arena()
            .map(|_| ())
            .unwrap_err();
        assert!(
            refused.to_string().contains("tensor_arena_ort::register"),
            "{refused}"
        );
        register(&env).unwrap();
        register(&env).unwrap(); // again: nothing happens
        env
    })
}

/// The server's own builder: options tensor-arena does not set.
fn builder(intra_threads: usize) -> SessionBuilder {
    Session::builder(env())
        .unwrap()
        .with_optimization_level(GraphOptimizationLevel::Level1)
        .unwrap()
        .with_config_entry("session.intra_op.allow_spinning", "0")
        .unwrap()
        .with_intra_threads(intra_threads)
        .unwrap()
}

/// A deterministic input tensor of `shape`.
fn tensor(shape: [usize; 4], seed: u32) -> Tensor<f32> {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n as u32)
        .map(|i| ((i.wrapping_mul(2_654_435_761) ^ seed) % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    Tensor::from_array((shape, data)).unwrap()
}

/// The bits of every output, by name.
fn bits(outputs: &ort::session::SessionOutputs<'_>) -> Vec<(String, Vec<u32>)> {
    outputs
        .iter()
        .map(|(name, v)| {
            let (_, data) = v.try_extract_tensor::<f32>().unwrap();
            (name.to_string(), data.iter().map(|x| x.to_bits()).collect())
        })
        .collect()
}

/// The expected outputs: the same builder, no arena.
fn plain(model: &str, intra: usize, inputs: &[Tensor<f32>]) -> Vec<Vec<(String, Vec<u32>)>> {
    let mut session = builder(intra)
        .commit_from_file(common::model(model))
        .unwrap();
    inputs
        .iter()
        .map(|x| bits(&session.run(ort::inputs![x]).unwrap()))
        .collect()
}

#[test]
fn an_existing_server_runs_from_an_owned_pool_of_workers() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // The environment first: it loads ONNX Runtime, which making a tensor
    // needs.
    env();
    let shapes = [
        [1, 3, 48, 320],
        [1, 3, 48, 100],
        [2, 3, 48, 640],
        [1, 3, 48, 320],
    ];
    let inputs: Arc<Vec<Tensor<f32>>> = Arc::new(
        shapes
            .iter()
            .enumerate()
            .map(|(i, s)| tensor(*s, i as u32))
            .collect(),
    );
    let expected = Arc::new(plain("ppocr_rec.onnx", 1, &inputs));
    // The pool: four sessions built by the server's builder plus one call,
    // each with an owned worker, and one set of plans for the model.
    let plans = Arc::new(Plans::default());
    let pool: Vec<(Session, Worker)> = (0..4)
        .map(|_| {
            let session = builder(1)
                .with_tensor_arena()
                .unwrap()
                .commit_from_file(common::model("ppocr_rec.onnx"))
                .unwrap();
            (session, Worker::new(WorkerOptions::default()).unwrap())
        })
        .collect();
    let before = allocator_counters();
    let handles: Vec<_> = pool
        .into_iter()
        .enumerate()
        .map(|(t, (mut session, mut worker))| {
            let (plans, inputs, expected) = (plans.clone(), inputs.clone(), expected.clone());
            std::thread::spawn(move || {
                for pass in 0..3 {
                    for (i, x) in inputs.iter().enumerate() {
                        // The server's own call, wrapped.
                        let inputs = ort::inputs![x];
                        let key = RunKey::of(&inputs);
                        let outputs = worker.run(&plans, &key, || session.run(inputs)).unwrap();
                        assert!(
                            bits(&outputs) == expected[i],
                            "thread {t} pass {pass} run {i}: outputs differ"
                        );
                        drop(outputs);
                        let info = worker.last_run().unwrap();
                        assert!(info.succeeded);
                        assert!(info.alloc_calls > 100, "{info:?}");
                        assert_eq!(info.alloc_calls, info.report.allocs, "{info:?}");
                        assert_eq!(info.refused_allocs, 0);
                        if pass > 0 {
                            assert!(info.report.planned && !info.report.deviated);
                            assert_eq!(info.report.planned_allocs, info.report.allocs);
                        }
                    }
                }
                (session, worker)
            })
        })
        .collect();
    let pool: Vec<(Session, Worker)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let after = allocator_counters();
    // Every allocation of every run was an arena block: none went to the
    // system allocator, and everything allocated was freed.
    assert_eq!(after.system_allocs, before.system_allocs);
    assert_eq!(
        after.alloc_calls - before.alloc_calls,
        after.free_calls - before.free_calls
    );
    // Three distinct shapes: three plans shared by the four workers.
    assert_eq!(plans.stats().plans, 3);
    for (_, worker) in &pool {
        assert_eq!(worker.runs(), 12);
        assert_eq!(worker.stats().in_use, 0);
    }
}

#[test]
fn intra_op_threads_allocate_through_the_arena() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // The environment first: it loads ONNX Runtime, which making a tensor
    // needs.
    env();
    for (model, shape) in [
        ("ppocr_det.onnx", [1, 3, 320, 320]),
        ("densenet121_batch.onnx", [1, 3, 224, 224]),
    ] {
        let x = tensor(shape, 7);
        for intra in [2, 4] {
            let expected = plain(model, intra, std::slice::from_ref(&x));
            let mut session = builder(intra)
                .with_tensor_arena()
                .unwrap()
                .commit_from_file(common::model(model))
                .unwrap();
            let mut worker = Worker::new(WorkerOptions::default()).unwrap();
            let plans = Plans::default();
            for pass in 0..2 {
                let before = allocator_counters();
                let inputs = ort::inputs![&x];
                let key = RunKey::of(&inputs);
                let outputs = worker.run(&plans, &key, || session.run(inputs)).unwrap();
                assert!(
                    bits(&outputs) == expected[0],
                    "{model} intra {intra} pass {pass}"
                );
                drop(outputs);
                let after = allocator_counters();
                let info = worker.last_run().unwrap();
                assert_eq!(
                    after.system_allocs, before.system_allocs,
                    "{model} intra {intra}: an allocation on a pool thread bypassed the arena"
                );
                assert_eq!(info.alloc_calls, info.report.allocs);
                assert!(info.alloc_calls > 50, "{model}: {info:?}");
            }
        }
    }
}
