//! Windows per second of the forward pass on data/speech.wav, whole file in
//! one call and streaming one window per call, with no allocation per call;
//! then the same through a `tensor_session::Session` (`Detector`: one
//! session run per call, tensors from the session's arena), and the cost of
//! building the model from `Weights` (done at the start of every run).
//!
//! `cargo run --release -p tensor-vad --example throughput [SECONDS]`

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use std::sync::Arc;

use tensor_session::{LoadMode, MmapAck, Session, SessionConfig};
use tensor_vad::{
    frame_rows, load_weights, num_windows, total_len, Detector, LstmState, Model, SliceScratch,
    Stream, CONTEXT, ROW, WINDOW,
};

/// Runs `f` (which processes `windows` windows) for about `secs` in trials of
/// about 0.1 s, and returns the best trial's windows/s (the machine is
/// shared: the best trial is the least disturbed one).
fn rate(windows: usize, secs: f64, mut f: impl FnMut()) -> f64 {
    f(); // warm up
    let start = Instant::now();
    let mut best = 0.0f64;
    while start.elapsed() < Duration::from_secs_f64(secs) {
        let t = Instant::now();
        let mut runs = 0u64;
        while t.elapsed() < Duration::from_millis(100) {
            f();
            runs += 1;
        }
        best = best.max(runs as f64 * windows as f64 / t.elapsed().as_secs_f64());
    }
    best
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .map_or(3.0, |s| s.parse().expect("SECONDS"));
    let weights = common::OwnedWeights::load();
    let model = weights.model();
    let audio = common::speech();
    let l = num_windows(audio.len());
    let audio = &audio[..l * WINDOW];
    let realtime = tensor_vad::SAMPLE_RATE as f64 / WINDOW as f64;

    let mut rows = vec![0.0; l * ROW];
    frame_rows(audio, &mut [0.0; CONTEXT], &mut rows);
    let mut probs = vec![0.0; l];
    let mut buf = vec![0.0; total_len(l)];
    let whole = rate(l, secs, || {
        let mut state = LstmState::default();
        model
            .forward(
                &rows,
                &mut state,
                &mut probs,
                &mut SliceScratch::new(&mut buf),
            )
            .unwrap();
    });
    println!(
        "whole file (L = {l}):   {whole:>9.0} windows/s  ({:.0}x real time)",
        whole / realtime
    );

    let mut buf1 = vec![0.0; total_len(1)];
    let stream = rate(l, secs, || {
        let mut s = Stream::new();
        for w in audio.chunks_exact(WINDOW) {
            s.process(&model, w, &mut SliceScratch::new(&mut buf1))
                .unwrap();
        }
    });
    println!(
        "streaming (L = 1):      {stream:>9.0} windows/s  ({:.0}x real time)",
        stream / realtime
    );

    // SAFETY: the committed model file is only read, never written, while this runs.
    let mmap = LoadMode::Mmap(unsafe { MmapAck::new() });
    let weights = Arc::new(
        load_weights(common::data_path("silero_vad_16k_v6.safetensors"), mmap).expect("weights"),
    );
    let mut session = Session::new(Arc::clone(&weights), SessionConfig::default());
    let whole = rate(l, secs, || {
        Detector::new()
            .process(&mut session, audio, &mut probs)
            .unwrap();
    });
    println!(
        "session, whole file:    {whole:>9.0} windows/s  ({:.0}x real time)",
        whole / realtime
    );
    let stream = rate(l, secs, || {
        let mut d = Detector::new();
        for w in audio.chunks_exact(WINDOW) {
            d.process_window(&mut session, w).unwrap();
        }
    });
    println!(
        "session, streaming:     {stream:>9.0} windows/s  ({:.0}x real time, {:.2} us per run)",
        stream / realtime,
        1e6 / stream
    );
    let n = 100_000;
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(Model::from_weights(std::hint::black_box(&weights)).unwrap());
    }
    println!(
        "Model::from_weights:    {:>9.3} us",
        t.elapsed().as_secs_f64() * 1e6 / n as f64
    );
    let st = session.stats();
    println!(
        "session: runs {}, planned {}, backing calls {}, reserved {} B",
        st.runs, st.arena.planned_runs, st.arena.backing_allocs, st.arena.reserved
    );
}
