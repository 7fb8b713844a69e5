//! A small `ort` server that adopted tensor-arena: its environment, its
//! session builder and its run call, each with one addition (marked
//! `tensor-arena:`). Worker threads take requests from a channel; each owns
//! a session and a worker, and all share the model's plans.
//!
//! `cargo run --release -p tensor-arena-ort --example server -- LIB MODEL [THREADS] [REQUESTS]`
//! e.g. `... target/ort-assets/libonnxruntime.so target/ort-assets/ppocr_rec.onnx 2 64`

use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;
use ort::value::Tensor;
use std::sync::{mpsc, Arc, Mutex};
use tensor_arena_ort::{ort, Plans, RunKey, SessionBuilderExt, Worker, WorkerOptions};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// A request: an image width for PP-OCR rec (a 48-pixel-high text line).
struct Request {
    width: usize,
    reply: mpsc::Sender<Result<usize, String>>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        return Err("usage: server LIB MODEL [THREADS] [REQUESTS]".into());
    }
    let threads: usize = args.get(3).map_or(Ok(2), |s| s.parse())?;
    let requests: usize = args.get(4).map_or(Ok(64), |s| s.parse())?;
    let env = ort::init_from(&args[1])?.with_name("server").build()?;
    tensor_arena_ort::register(&env)?; // tensor-arena: the allocator on this environment
    let plans = Arc::new(Plans::default()); // tensor-arena: the model's plans
    let (tx, rx) = mpsc::channel::<Request>();
    let rx = Arc::new(Mutex::new(rx));
    let mut pool = Vec::new();
    for _ in 0..threads {
        let mut session = Session::builder(&env)?
            .with_optimization_level(GraphOptimizationLevel::Level3)?
            .with_intra_threads(1)?
            .with_tensor_arena()? // tensor-arena: CPU tensors from the arena
            .commit_from_file(&args[2])?;
        let mut worker = Worker::new(WorkerOptions::default())?; // tensor-arena: this thread's arena
        let (rx, plans) = (rx.clone(), plans.clone());
        pool.push(std::thread::spawn(move || loop {
            let Ok(request) = rx
                .lock()
                .map_err(|_| ())
                .and_then(|r| r.recv().map_err(|_| ()))
            else {
                return worker;
            };
            let answer = (|| -> Result<usize, Error> {
                let shape = [1usize, 3, 48, request.width];
                let x = Tensor::from_array((shape, vec![0.5f32; shape.iter().product()]))?;
                let inputs = ort::inputs![x];
                let key = RunKey::of(&inputs); // tensor-arena: keyed by the input shapes
                let outputs = worker.run(&plans, &key, || session.run(inputs))?; // tensor-arena: wrapped
                let (shape, _) = outputs[0].try_extract_tensor::<f32>()?;
                Ok(shape.iter().product::<i64>() as usize)
            })();
            let _ = request.reply.send(answer.map_err(|e| e.to_string()));
        }));
    }
    let (reply, replies) = mpsc::channel();
    let t = std::time::Instant::now();
    for i in 0..requests {
        let width = [320, 100, 640, 320][i % 4];
        tx.send(Request {
            width,
            reply: reply.clone(),
        })?;
    }
    drop((tx, reply));
    let answered: Vec<Result<usize, String>> = replies.iter().collect();
    let elapsed = t.elapsed();
    let failed = answered.iter().filter(|a| a.is_err()).count();
    for w in pool {
        let worker = w.join().map_err(|_| "a worker thread panicked")?;
        let st = worker.stats();
        println!(
            "worker: {} runs, {} planned, reserved {} KiB",
            worker.runs(),
            st.planned_runs,
            st.reserved / 1024
        );
    }
    println!(
        "{} requests, {failed} failed, {:.1} ms, plans {:?}",
        answered.len(),
        elapsed.as_secs_f64() * 1e3,
        plans.stats()
    );
    if failed > 0 {
        return Err(format!("{failed} requests failed").into());
    }
    Ok(())
}
