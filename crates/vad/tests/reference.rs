//! The Rust forward pass against onnxruntime's outputs in data/reference.json.

mod common;

use common::{max_abs_diff, speech, OwnedWeights, Reference};
use tensor_vad::{
    frame_rows, num_windows, total_len, HeapScratch, LstmState, SliceScratch, Stream, CONTEXT, ROW,
    TENSORS, WINDOW,
};

const TOL: f32 = 1e-4;

/// `hn` lies in (-1, 1) and is compared absolutely; `cn` is unbounded (up
/// to about 22 here), so its tolerance scales with its magnitude.
fn assert_state_close(h: &[f32], c: &[f32], run: &common::RefRun) {
    let dh = max_abs_diff(h, &run.hn);
    assert!(dh < TOL, "hn differs by {dh}");
    for (i, (&got, &want)) in c.iter().zip(&run.cn).enumerate() {
        let tol = TOL * want.abs().max(1.0);
        assert!((got - want).abs() < tol, "cn[{i}]: {got} vs {want}");
    }
}

#[test]
fn weights_file_has_exactly_the_model_tensors() {
    let w = OwnedWeights::load();
    let mut names = w.names();
    names.sort_unstable();
    let mut want: Vec<&str> = TENSORS.iter().map(|t| t.0).collect();
    want.sort_unstable();
    assert_eq!(names, want);
}

#[test]
fn whole_file_matches_onnxruntime() {
    let weights = OwnedWeights::load();
    let model = weights.model();
    let reference = Reference::load();
    let audio = speech();
    assert_eq!(audio.len(), reference.num_samples);
    let l = num_windows(audio.len());
    assert_eq!(l, reference.num_windows);

    let mut rows = vec![0.0; l * ROW];
    frame_rows(&audio[..l * WINDOW], &mut [0.0; CONTEXT], &mut rows);
    let mut state = LstmState::default();
    let mut probs = vec![f32::NAN; l];
    let mut buf = vec![0.0; total_len(l)];
    model
        .forward(
            &rows,
            &mut state,
            &mut probs,
            &mut SliceScratch::new(&mut buf),
        )
        .unwrap();

    let d = max_abs_diff(&probs, &reference.whole.probs);
    let dh = max_abs_diff(&state.h, &reference.whole.hn);
    let dc = max_abs_diff(&state.c, &reference.whole.cn);
    println!("whole file, {l} windows: max |dp| {d:e}, |dh| {dh:e}, |dc| {dc:e}");
    assert!(d < TOL, "probabilities differ by {d}");
    assert_state_close(&state.h, &state.c, &reference.whole);
    // The file has speech and silence, so the test is not trivially passing.
    assert!(probs.iter().any(|&p| p > 0.9) && probs.iter().any(|&p| p < 0.1));
}

#[test]
fn streaming_matches_onnxruntime() {
    let weights = OwnedWeights::load();
    let model = weights.model();
    let reference = Reference::load();
    let audio = speech();
    let l = num_windows(audio.len());

    let mut stream = Stream::new();
    let mut scratch = HeapScratch;
    let probs: Vec<f32> = audio[..l * WINDOW]
        .chunks_exact(WINDOW)
        .map(|w| stream.process(&model, w, &mut scratch).unwrap())
        .collect();

    let d = max_abs_diff(&probs, &reference.streaming.probs);
    let dh = max_abs_diff(&stream.state.h, &reference.streaming.hn);
    let dc = max_abs_diff(&stream.state.c, &reference.streaming.cn);
    println!("streaming, {l} windows: max |dp| {d:e}, |dh| {dh:e}, |dc| {dc:e}");
    assert!(d < TOL, "probabilities differ by {d}");
    assert_state_close(&stream.state.h, &stream.state.c, &reference.streaming);
}

#[test]
fn chunked_calls_of_any_size_match_whole_file() {
    // Blocks of 7 windows (and a shorter last block), carrying state and context.
    let weights = OwnedWeights::load();
    let model = weights.model();
    let reference = Reference::load();
    let audio = speech();
    let l = num_windows(audio.len());
    let mut state = LstmState::default();
    let mut context = [0.0; CONTEXT];
    let mut probs = Vec::new();
    for block in audio[..l * WINDOW].chunks(7 * WINDOW) {
        let n = block.len() / WINDOW;
        let mut rows = vec![0.0; n * ROW];
        frame_rows(block, &mut context, &mut rows);
        let mut p = vec![0.0; n];
        model
            .forward(&rows, &mut state, &mut p, &mut HeapScratch)
            .unwrap();
        probs.extend_from_slice(&p);
    }
    assert!(max_abs_diff(&probs, &reference.whole.probs) < TOL);
}
