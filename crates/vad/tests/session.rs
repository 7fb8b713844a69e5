//! The session path (weights from `Weights`, every intermediate tensor from
//! the session's arena) against onnxruntime's outputs in data/reference.json.

mod common;

use std::sync::Arc;

use common::{data_path, max_abs_diff, speech, Reference};
use tensor_session::{Dtype, LoadMode, MmapAck, Session, SessionConfig, Weights};

/// Mapped weights.
// SAFETY: the tests of this file map the committed model file, which the test suite only
// reads, and the file `misaligned_file` writes under a name unique to this process, which is
// only removed (allowed) while mapped.
const MMAP: LoadMode = LoadMode::Mmap(unsafe { MmapAck::new() });
use tensor_vad::{
    key, load_weights, num_windows, segments, Detector, LstmState, Model, ModelError,
    SegmentConfig, Stream, TENSORS, WINDOW,
};

const TOL: f32 = 1e-4;

fn session(mode: LoadMode) -> Session {
    let weights = load_weights(data_path("silero_vad_16k_v6.safetensors"), mode).unwrap();
    Session::new(Arc::new(weights), SessionConfig::default())
}

/// The committed speech as 16-bit samples.
fn pcm() -> Vec<i16> {
    tensor_vad::wav::read(data_path("speech.wav"))
        .unwrap()
        .samples
}

fn assert_idle(s: &Session) {
    let st = s.stats();
    assert_eq!(st.arena.in_use, 0, "arena back to zero in use");
    assert!(s.live_blocks().is_empty());
}

fn check_state(state: &LstmState, run: &common::RefRun) {
    let dh = max_abs_diff(&state.h, &run.hn);
    assert!(dh < TOL, "hn differs by {dh}");
    for (i, (&got, &want)) in state.c.iter().zip(&run.cn).enumerate() {
        assert!(
            (got - want).abs() < TOL * want.abs().max(1.0),
            "cn[{i}]: {got} vs {want}"
        );
    }
}

#[test]
fn whole_file_through_a_session_matches_onnxruntime() {
    let reference = Reference::load();
    for mode in [MMAP, LoadMode::Copy] {
        let mut s = session(mode);
        let audio = pcm();
        let l = num_windows(audio.len());
        assert_eq!(l, reference.num_windows);
        let mut probs = vec![f32::NAN; l];
        let mut det = Detector::new();
        det.process(&mut s, &audio[..l * WINDOW], &mut probs)
            .unwrap();
        let d = max_abs_diff(&probs, &reference.whole.probs);
        println!("session, whole file ({mode:?}), L = {l}: max |dp| {d:e}");
        assert!(d < TOL, "probabilities differ by {d}");
        check_state(det.state(), &reference.whole);
        // Speech segments: those silero-vad 6.2.3's get_speech_timestamps
        // finds in onnxruntime's probabilities (run in Python once).
        let want = [(8224, 52192), (69664, 109536), (129056, 148960)];
        for p in [&probs, &reference.whole.probs] {
            let segs = segments(p, audio.len() as u64, SegmentConfig::default());
            let got: Vec<(u64, u64)> = segs.iter().map(|s| (s.start, s.end)).collect();
            assert_eq!(got, want);
        }
        assert_idle(&s);
        let st = s.stats();
        assert_eq!((st.runs, s.runs_with_key(&key(l))), (1, 1));
        // Samples as f32 give bitwise the same result as i16.
        let mut again = vec![0.0; l];
        Detector::new()
            .process(&mut s, &speech()[..l * WINDOW], &mut again)
            .unwrap();
        assert_eq!(bits(&again), bits(&probs));
        // The second run of the key was served from its plan.
        let r = s.stats().last_run.unwrap();
        assert!(r.planned && !r.deviated, "{r:?}");
        assert_eq!(r.allocs, r.planned_allocs);
        assert_eq!(r.backing_allocs, 0);
        assert_idle(&s);
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn streaming_through_a_session_matches_onnxruntime() {
    let reference = Reference::load();
    let mut s = session(MMAP);
    let audio = pcm();
    let l = num_windows(audio.len());
    let mut det = Detector::new();
    let mut probs = Vec::with_capacity(l);
    let mut backing_after_first = 0;
    for (i, w) in audio[..l * WINDOW].chunks_exact(WINDOW).enumerate() {
        probs.push(det.process_window(&mut s, w).unwrap());
        assert_idle(&s);
        let st = s.stats();
        if i == 0 {
            backing_after_first = st.arena.backing_allocs;
        } else {
            // Every later call is planned and draws nothing new.
            let r = st.last_run.unwrap();
            assert!(r.planned && !r.deviated, "call {i}: {r:?}");
            assert_eq!(st.arena.backing_allocs, backing_after_first, "call {i}");
        }
    }
    let d = max_abs_diff(&probs, &reference.streaming.probs);
    println!("session, streaming (L = 1) x {l}: max |dp| {d:e}");
    assert!(d < TOL, "probabilities differ by {d}");
    check_state(det.state(), &reference.streaming);
    assert_eq!(det.windows(), l as u64);
    let st = s.stats();
    assert_eq!(st.runs, l as u64);
    assert_eq!(st.keys, 1);
    assert_eq!(st.arena.planned_runs, l as u64 - 1);

    // Bitwise the same as the crate's own Stream on the same weights.
    let w = s.weights();
    let model = Model::from_weights(&w).unwrap();
    let mut stream = Stream::new();
    let mut heap = tensor_vad::HeapScratch;
    let direct: Vec<f32> = audio[..l * WINDOW]
        .chunks_exact(WINDOW)
        .map(|w| stream.process(&model, w, &mut heap).unwrap())
        .collect();
    assert_eq!(bits(&direct), bits(&probs));
}

#[test]
fn chunked_through_a_session_matches_onnxruntime() {
    let reference = Reference::load();
    let mut s = session(MMAP);
    let audio = pcm();
    let l = num_windows(audio.len());
    let mut probs = vec![f32::NAN; l];
    let mut chunks = Vec::new();
    Detector::new()
        .process_chunked(&mut s, &audio, 50, &mut probs, |s, range| {
            assert_idle(s);
            chunks.push(range);
        })
        .unwrap();
    assert_eq!(chunks.len(), l.div_ceil(50));
    assert_eq!(chunks.last().unwrap().end, l);
    let d = max_abs_diff(&probs, &reference.whole.probs);
    println!("session, chunks of 50: max |dp| {d:e}");
    assert!(d < TOL, "probabilities differ by {d}");
    // Keys: [50, 576] and the remainder's.
    assert_eq!(s.runs_with_key(&key(50)), (l / 50) as u64);
    assert_eq!(s.runs_with_key(&key(l % 50)), 1);
}

#[test]
fn weights_are_borrowed_in_place() {
    for mode in [MMAP, LoadMode::Copy] {
        let w = load_weights(data_path("silero_vad_16k_v6.safetensors"), mode).unwrap();
        let model = Model::from_weights(&w).unwrap();
        let _ = model;
        for (name, _) in TENSORS {
            let view = w.get(name).unwrap();
            let slice = view.try_as_slice::<f32>().unwrap();
            assert_eq!(slice.as_ptr().cast::<u8>(), view.bytes().as_ptr(), "{name}");
        }
    }
}

/// A safetensors file with the model's tensors at offsets that are not
/// multiples of 4 (a one-byte tensor first).
fn misaligned_file() -> std::path::PathBuf {
    let good = Weights::open(data_path("silero_vad_16k_v6.safetensors"), LoadMode::Copy).unwrap();
    let mut header =
        String::from("{\"a_pad\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}");
    let mut data = vec![0u8];
    for (name, _) in TENSORS {
        let v = good.get(name).unwrap();
        let start = data.len();
        data.extend_from_slice(v.bytes());
        header.push_str(&format!(
            ",\"{name}\":{{\"dtype\":\"F32\",\"shape\":{:?},\"data_offsets\":[{start},{}]}}",
            v.shape(),
            data.len()
        ));
    }
    header.push('}');
    while (8 + header.len()) % 8 != 0 {
        header.push(' ');
    }
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend_from_slice(&data);
    let path = std::env::temp_dir().join(format!(
        "tensor-vad-misaligned-{}.safetensors",
        std::process::id()
    ));
    std::fs::write(&path, file).unwrap();
    path
}

#[test]
fn misaligned_weights_are_realigned_once_at_load() {
    let path = misaligned_file();
    let raw = Weights::open(&path, MMAP).unwrap();
    assert_eq!(raw.get("encoder.0.bias").unwrap().dtype(), Dtype::F32);
    assert!(matches!(
        Model::from_weights(&raw),
        Err(ModelError::Misaligned(_))
    ));
    let fixed = load_weights(&path, MMAP).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(!fixed.is_mapped(), "realigned into owned memory");
    let good = load_weights(data_path("silero_vad_16k_v6.safetensors"), LoadMode::Copy).unwrap();
    let (a, b) = (
        Model::from_weights(&fixed).unwrap(),
        Model::from_weights(&good).unwrap(),
    );
    // Same weights: same probabilities.
    let audio = &pcm()[..8 * WINDOW];
    let run = |m: &Model<'_>| {
        let mut p = [0.0f32; 8];
        m.forward_samples(
            audio,
            &mut [0.0; 64],
            &mut LstmState::default(),
            &mut p,
            tensor_vad::HeapScratch,
        )
        .unwrap();
        p
    };
    assert_eq!(run(&a), run(&b));
}

#[test]
fn wrong_weights_are_reported() {
    let ones: Vec<u8> = [1.0f32; 4].iter().flat_map(|x| x.to_le_bytes()).collect();
    let w = Weights::from_tensors([("x", Dtype::F32, vec![4], ones)]).unwrap();
    assert_eq!(
        Model::from_weights(&w).unwrap_err(),
        ModelError::Missing("stft.forward_basis_buffer")
    );
    // A session over them fails at the first run, and stays usable.
    let mut s = Session::new(Arc::new(w), SessionConfig::default());
    let err = Detector::new()
        .process_window(&mut s, &[0i16; WINDOW])
        .unwrap_err();
    assert!(
        err.to_string().contains("stft.forward_basis_buffer"),
        "{err}"
    );
    assert_idle(&s);
}
