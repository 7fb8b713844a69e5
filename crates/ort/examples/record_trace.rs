//! Records ONNX Runtime's own allocation and free order for a model at one
//! or more input shapes (one run each, through a worker), as a trace file
//! for `tensor-arena replay`.
//!
//! `cargo run --release -p tensor-arena-ort --example record_trace -- LIB MODEL NAME OUT SHAPE...`
//! e.g. `... target/ort-assets/libonnxruntime.so target/ort-assets/ppocr_det.onnx ppocr-det traces/ort-ppocr-det.trace 1x3x1280x1280`

use tensor_arena_ort::ort::value::DynValue;
use tensor_arena_ort::{make_input, ArenaOptions, ArenaSession, Runtime, Shrink};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 6 {
        return Err("usage: record_trace LIB MODEL NAME OUT SHAPE...".into());
    }
    let runtime = Runtime::load(&a[1])?;
    let options = ArenaOptions {
        plans: false,
        shrink: Shrink::Never,
        ..ArenaOptions::default()
    };
    let session = ArenaSession::open(runtime, &a[2], options)?;
    let spec = session.inputs()[0].clone();
    let mut worker = session.worker()?;
    worker.worker_mut().record_trace(true);
    for (i, shape) in a[5..].iter().enumerate() {
        let dims: Vec<usize> = shape.split('x').map(str::parse).collect::<Result<_, _>>()?;
        let x = make_input(&spec, &dims, i as u64)?;
        let out = worker.run(&[(spec.name.as_str(), &x as &DynValue)])?;
        eprintln!(
            "{shape}: {} allocations, peak in use {} bytes, high water {} bytes",
            out.report.allocs, out.report.peak_in_use, out.report.high_water
        );
    }
    let mut trace = worker.worker_mut().take_trace();
    // Each run is labelled by its shape, as trace files label runs (and as
    // plan families read a key's dimensions).
    for (run, shape) in trace.runs.iter_mut().zip(&a[5..]) {
        run.label = shape.clone();
    }
    trace.model = Some(a[3].clone());
    trace.inputs = a[5..].to_vec();
    let mut file = std::io::BufWriter::new(std::fs::File::create(&a[4])?);
    trace.write(&mut file)?;
    Ok(())
}
