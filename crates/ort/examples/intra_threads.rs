//! How many of a run's allocations, and how many bytes, ONNX Runtime makes
//! on its own intra-op pool threads (which reach the registered allocator
//! with no worker running on them), for intra-op thread counts 1, 2 and 4.
//!
//! `cargo run --release -p tensor-arena-ort --example intra_threads -- LIB MODEL SHAPE [RUNS]`
//! e.g. `... target/ort-assets/libonnxruntime.so target/ort-assets/ppocr_det.onnx 1x3x640x640`

use tensor_arena_ort::ort::value::DynValue;
use tensor_arena_ort::{allocator_counters, make_input, ArenaOptions, ArenaSession, Runtime};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        return Err("usage: intra_threads LIB MODEL SHAPE [RUNS]".into());
    }
    let runtime = Runtime::load(&args[1])?;
    let dims: Vec<usize> = args[3]
        .split('x')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let runs: usize = args.get(4).map_or(Ok(3), |s| s.parse())?;
    println!(
        "intra_threads,run,alloc_calls,arena_allocs,system_allocs,system_bytes,all_bytes,millis"
    );
    for intra in [1usize, 2, 4] {
        let options = ArenaOptions {
            intra_threads: intra,
            ..ArenaOptions::default()
        };
        let session = ArenaSession::open(runtime, &args[2], options)?;
        let spec = session.inputs()[0].clone();
        let x = make_input(&spec, &dims, 1)?;
        let mut worker = session.worker()?;
        for run in 0..runs {
            let before = allocator_counters();
            let t = std::time::Instant::now();
            let out = worker.run(&[(spec.name.as_str(), &x as &DynValue)])?;
            let millis = t.elapsed().as_secs_f64() * 1e3;
            let after = allocator_counters();
            println!(
                "{intra},{run},{},{},{},{},{},{millis:.1}",
                after.alloc_calls - before.alloc_calls,
                out.report.allocs,
                after.system_allocs - before.system_allocs,
                after.system_bytes - before.system_bytes,
                after.alloc_bytes - before.alloc_bytes,
            );
        }
    }
    Ok(())
}
