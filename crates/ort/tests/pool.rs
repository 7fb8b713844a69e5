//! Servers as they are (issue 35): an elastic executor (tokio's blocking
//! pool) checks workers out of a bounded pool, an async task awaits runs
//! served by the arena, `session.run_async` through a worker is reported,
//! and idle workers give their memory back with no call. (A binary of its
//! own: it makes the process's environment the way a server does, and
//! compares process-wide counters.)

#[allow(dead_code)]
#[path = "all/common.rs"]
mod common;

use ort::environment::Environment;
use ort::session::builder::SessionBuilder;
use ort::session::{RunOptions, Session};
use ort::value::Tensor;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tensor_arena::{DynamicReason, PlanSource};
use tensor_arena_ort::{
    allocator_counters, arenas, ort, register, NotServed, Plans, RunKey, SessionBuilderExt, Worker,
    WorkerOptions, WorkerPool,
};

/// The tests compare process-wide counters: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn env() -> &'static Environment {
    static ENV: OnceLock<Environment> = OnceLock::new();
    ENV.get_or_init(|| {
        let env = common::environment("async-server");
        register(&env).unwrap();
        env
    })
}

fn builder(intra_threads: usize) -> SessionBuilder {
    Session::builder(env())
        .unwrap()
        .with_intra_threads(intra_threads)
        .unwrap()
}

fn rec_session(arena: bool) -> Session {
    rec_session_with(arena, 1)
}

fn rec_session_with(arena: bool, intra_threads: usize) -> Session {
    let b = builder(intra_threads);
    let mut b = if arena {
        b.with_tensor_arena().unwrap()
    } else {
        b
    };
    b.commit_from_file(common::model("ppocr_rec.onnx")).unwrap()
}

/// A deterministic PP-OCR rec input of `width`.
fn tensor(width: usize, seed: u32) -> Tensor<f32> {
    let shape = [1usize, 3, 48, width];
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n as u32)
        .map(|i| ((i.wrapping_mul(2_654_435_761) ^ seed) % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    Tensor::from_array((shape, data)).unwrap()
}

/// The bits of the first output.
fn bits(outputs: &ort::session::SessionOutputs<'_>) -> Vec<u32> {
    let (_, data) = outputs[0].try_extract_tensor::<f32>().unwrap();
    data.iter().map(|x| x.to_bits()).collect()
}

const WIDTHS: [usize; 4] = [320, 160, 640, 320];

/// What ONNX Runtime gives without the arena, per width.
fn expected() -> &'static Vec<Vec<u32>> {
    static E: OnceLock<Vec<Vec<u32>>> = OnceLock::new();
    E.get_or_init(|| {
        let mut s = rec_session(false);
        WIDTHS
            .iter()
            .map(|&w| bits(&s.run(ort::inputs![tensor(w, w as u32)]).unwrap()))
            .collect()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawn_blocking_tasks_share_a_bounded_pool() {
    let _serial = SERIAL.lock().await;
    env();
    let expected = expected();
    const POOL: usize = 3;
    let (arenas_before, _) = arenas();
    let pool = WorkerPool::with_states(
        WorkerOptions::default(),
        (0..POOL).map(|_| rec_session(true)).collect(),
    )
    .unwrap();
    let plans = Arc::new(Plans::default());
    let before = allocator_counters();
    let max_arenas = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let (pool, plans, max_arenas) = (pool.clone(), plans.clone(), max_arenas.clone());
            tokio::task::spawn_blocking(move || {
                let i = i % WIDTHS.len();
                let x = tensor(WIDTHS[i], WIDTHS[i] as u32);
                let mut c = pool.checkout();
                let (worker, session) = c.parts();
                let inputs = ort::inputs![x];
                let key = RunKey::of(&inputs);
                let out = worker.run(&plans, &key, || session.run(inputs)).unwrap();
                let got = bits(&out);
                drop(out);
                let info = worker.last_run().unwrap().clone();
                max_arenas.fetch_max(arenas().0, std::sync::atomic::Ordering::SeqCst);
                (i, got, info)
            })
        })
        .collect();
    for t in tasks {
        let (i, got, info) = t.await.unwrap();
        assert!(got == expected[i], "width {}: outputs differ", WIDTHS[i]);
        assert!(
            info.alloc_calls > 100 && info.not_served.is_none(),
            "{info:?}"
        );
        info.check().unwrap();
    }
    let after = allocator_counters();
    assert_eq!(
        after.system_allocs, before.system_allocs,
        "every tensor was an arena block"
    );
    let peak = max_arenas.load(std::sync::atomic::Ordering::SeqCst);
    // The workers' arenas and the one their large blocks share.
    assert!(
        peak - arenas_before <= POOL + 1,
        "{peak} arenas for a pool of {POOL} (before: {arenas_before})"
    );
    assert!(pool.stats().large_blocks.is_some_and(|l| l.allocs > 0));
    assert_eq!(pool.stats().checkouts, 64);
    assert_eq!(pool.stats().idle, POOL);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_awaited_run_is_served_by_the_arena() {
    let _serial = SERIAL.lock().await;
    env();
    let expected = expected();
    let pool = WorkerPool::with_states(WorkerOptions::default(), vec![rec_session(true)]).unwrap();
    let plans = Arc::new(Plans::default());
    for (i, &w) in WIDTHS.iter().enumerate() {
        let before = allocator_counters();
        let plans = plans.clone();
        let (got, info) = pool
            .run_async(move |worker, session| {
                let inputs = ort::inputs![tensor(w, w as u32)];
                let key = RunKey::of(&inputs);
                let out = worker.run(&plans, &key, || session.run(inputs)).unwrap();
                (bits(&out), worker.last_run().unwrap().clone())
            })
            .await
            .unwrap();
        let after = allocator_counters();
        assert!(got == expected[i], "width {w}: outputs differ");
        assert_eq!(
            after.system_bytes - before.system_bytes,
            0,
            "width {w}: the system allocator served tensors"
        );
        assert_eq!(info.alloc_calls, info.report.allocs, "{info:?}");
        assert!(info.alloc_calls > 100);
        // The third width is planned from the model's first two, the
        // fourth repeats the first.
        let expected_plan = match i {
            0 => PlanSource::Dynamic(DynamicReason::NewFamily),
            1 => PlanSource::Dynamic(DynamicReason::OneShape),
            2 => PlanSource::Predicted,
            _ => PlanSource::Exact,
        };
        assert_eq!(info.plan, Some(expected_plan), "width {w}");
        assert_eq!(info.report.planned, i >= 2, "width {w}");
    }
    // A run that panics is an error, and the worker goes back.
    let err = pool
        .run_async(|_, _| -> () { panic!("boom") })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("boom"), "{err}");
    assert_eq!(pool.stats().idle, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_async_through_a_worker_is_reported_never_silent() {
    let _serial = SERIAL.lock().await;
    env();
    let expected = expected();
    // `run_async` needs an intra-op pool of its own: ONNX Runtime runs it
    // there.
    let mut session = rec_session_with(true, 2);
    let mut worker = Worker::new(WorkerOptions::default()).unwrap();
    let plans = Plans::default();
    let options = RunOptions::new().unwrap();
    // A synchronous run first: the key has its plan.
    let inputs = ort::inputs![tensor(WIDTHS[0], WIDTHS[0] as u32)];
    let key = RunKey::of(&inputs);
    drop(worker.run(&plans, &key, || session.run(inputs)).unwrap());
    assert_eq!(plans.stats().plans, 1);
    let inputs = ort::inputs![tensor(WIDTHS[0], WIDTHS[0] as u32)];
    let before = allocator_counters();
    let fut = worker
        .run(&plans, &key, || session.run_async(inputs, &options))
        .unwrap();
    let info = worker.last_run().unwrap().clone();
    assert_eq!(info.not_served, Some(NotServed::AsyncRun), "{info:?}");
    // Its key had a plan, but nothing was served from it: neither planned
    // nor dynamic.
    assert_eq!(info.plan, None, "{info:?}");
    assert!(!info.report.planned && !info.report.deviated, "{info:?}");
    let err = info.check().unwrap_err();
    assert!(err.to_string().contains("run_async"), "{err}");
    assert_eq!(
        plans.stats().plans,
        1,
        "nothing learned from a run it did not see"
    );
    // The future itself still works: ONNX Runtime ran it, on the system
    // allocator, as the report says.
    let out = fut.await.unwrap();
    assert!(bits(&out) == expected[0]);
    drop(out);
    assert!(allocator_counters().system_allocs > before.system_allocs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_worker_gives_its_memory_back_with_no_call() {
    let _serial = SERIAL.lock().await;
    env();
    let expected = expected();
    let mut session = rec_session(true);
    let mut worker = Worker::new(WorkerOptions {
        decay: Some(Duration::from_millis(200)),
        ..WorkerOptions::default()
    })
    .unwrap();
    let plans = Plans::default();
    let mut run = |worker: &mut Worker, i: usize| {
        let inputs = ort::inputs![tensor(WIDTHS[i], WIDTHS[i] as u32)];
        let key = RunKey::of(&inputs);
        let out = worker.run(&plans, &key, || session.run(inputs)).unwrap();
        assert!(bits(&out) == expected[i], "run {i}: outputs differ");
    };
    run(&mut worker, 2);
    assert!(worker.stats().reserved > 1 << 20, "{:?}", worker.stats());
    // No call: the decay thread gives it back after 200 ms idle.
    let deadline = Instant::now() + Duration::from_secs(10);
    while worker.stats().reserved != 0 {
        assert!(
            Instant::now() < deadline,
            "never decayed: {:?}",
            worker.stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A run after it is correct, and commits again.
    run(&mut worker, 2);
    let info = worker.last_run().unwrap();
    assert!(info.report.planned && info.report.commits > 0, "{info:?}");
    run(&mut worker, 0);
}
