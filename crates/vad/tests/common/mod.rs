//! Shared test helpers: load the committed weights and reference data.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;

use safetensors::{Dtype, SafeTensors};

/// `crates/vad/data/NAME`.
pub fn data_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("data")
        .join(name)
}

/// Every tensor of the committed safetensors file, as owned `f32` data and shape.
pub struct OwnedWeights {
    tensors: HashMap<String, (Vec<f32>, Vec<usize>)>,
}

impl OwnedWeights {
    /// Loads `data/silero_vad_16k_v6.safetensors`.
    pub fn load() -> Self {
        let bytes =
            std::fs::read(data_path("silero_vad_16k_v6.safetensors")).expect("read weights");
        let st = SafeTensors::deserialize(&bytes).expect("parse safetensors");
        let mut tensors = HashMap::new();
        for (name, view) in st.tensors() {
            assert_eq!(view.dtype(), Dtype::F32, "{name}");
            let data = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            tensors.insert(name, (data, view.shape().to_vec()));
        }
        OwnedWeights { tensors }
    }

    /// The model borrowing these weights.
    pub fn model(&self) -> tensor_vad::Model<'_> {
        tensor_vad::Model::from_tensors(|name| {
            self.tensors
                .get(name)
                .map(|(d, s)| (d.as_slice(), s.as_slice()))
        })
        .expect("model from tensors")
    }

    /// Names of the tensors in the file.
    pub fn names(&self) -> Vec<&str> {
        self.tensors.keys().map(|s| s.as_str()).collect()
    }
}

/// One run of `reference.json`.
pub struct RefRun {
    pub probs: Vec<f32>,
    pub hn: Vec<f32>,
    pub cn: Vec<f32>,
}

/// `data/reference.json`.
pub struct Reference {
    pub num_samples: usize,
    pub num_windows: usize,
    pub whole: RefRun,
    pub streaming: RefRun,
}

fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

impl Reference {
    pub fn load() -> Self {
        let text = std::fs::read_to_string(data_path("reference.json")).expect("read reference");
        let v: serde_json::Value = serde_json::from_str(&text).expect("parse reference");
        let run = |k: &str| RefRun {
            probs: floats(&v[k]["probs"]),
            hn: floats(&v[k]["hn"]),
            cn: floats(&v[k]["cn"]),
        };
        assert_eq!(v["window"], 512);
        assert_eq!(v["context"], 64);
        assert_eq!(v["sample_rate"], 16000);
        Reference {
            num_samples: v["num_samples"].as_u64().unwrap() as usize,
            num_windows: v["num_windows"].as_u64().unwrap() as usize,
            whole: run("whole"),
            streaming: run("streaming"),
        }
    }
}

/// The committed speech, as f32 samples.
pub fn speech() -> Vec<f32> {
    let wav = tensor_vad::wav::read(data_path("speech.wav")).expect("read speech.wav");
    assert_eq!(wav.sample_rate, tensor_vad::SAMPLE_RATE);
    wav.to_f32()
}

/// Largest absolute difference.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
