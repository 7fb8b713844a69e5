//! Finding the library and the models: fetched on first use by
//! `tools/fetch-ort-assets.sh` (pip, PyPI only). A test that cannot get them
//! fails; it never skips.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use tensor_arena_ort::Runtime;

/// The directory holding the library and the models.
pub fn assets() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let dir = std::env::var_os("TENSOR_ARENA_ORT_ASSETS")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target/ort-assets"));
        let have_all = [
            "libonnxruntime.so",
            "ppocr_cls.onnx",
            "ppocr_rec.onnx",
            "silero_vad_16k_sequence.onnx",
            "densenet121.onnx",
            "densenet121_batch.onnx",
        ]
        .iter()
        .all(|f| dir.join(f).is_file());
        if !have_all {
            let status = std::process::Command::new("bash")
                .arg(root.join("tools/fetch-ort-assets.sh"))
                .arg(&dir)
                .status()
                .expect("cannot run tools/fetch-ort-assets.sh");
            assert!(
                status.success(),
                "tools/fetch-ort-assets.sh failed: the ONNX Runtime tests need the library and models from PyPI"
            );
        }
        dir
    })
}

/// The runtime, loaded once per test process: `ORT_DYLIB_PATH` if set, else
/// the fetched library.
pub fn runtime() -> &'static Runtime {
    let path = match std::env::var_os("ORT_DYLIB_PATH") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => assets().join("libonnxruntime.so"),
    };
    Runtime::load(&path).unwrap_or_else(|e| panic!("ONNX Runtime is needed for these tests: {e}"))
}

/// A process environment named `name` on the fetched library, made as a
/// server makes its own (not yet registered with the arena). Only the
/// binaries that make their own environment use it.
#[allow(dead_code)]
pub fn environment(name: &str) -> tensor_arena_ort::ort::environment::Environment {
    tensor_arena_ort::ort::init_from(assets().join("libonnxruntime.so"))
        .unwrap()
        .with_name(name)
        .build()
        .unwrap()
}

/// A model file from the assets.
pub fn model(name: &str) -> PathBuf {
    assets().join(name)
}

use tensor_arena_ort::ort::value::DynValue;
use tensor_arena_ort::{make_input, open_session, InputSpec, Memory, SessionOptions};

/// Inputs for `shapes` (name, dims), values from `seed`.
pub fn inputs(
    specs: &[InputSpec],
    shapes: &[(&str, &[usize])],
    seed: u64,
) -> Vec<(String, DynValue)> {
    shapes
        .iter()
        .enumerate()
        .map(|(k, (name, dims))| {
            let spec = specs.iter().find(|s| s.name == *name).expect("input name");
            (
                name.to_string(),
                make_input(spec, dims, seed * 100 + k as u64).unwrap(),
            )
        })
        .collect()
}

/// Every output's name, shape and bits (f32 outputs).
pub type Bits = Vec<(String, Vec<i64>, Vec<u32>)>;

/// The bits of named outputs.
pub fn bits<'a>(outputs: impl IntoIterator<Item = (&'a str, &'a DynValue)>) -> Bits {
    outputs
        .into_iter()
        .map(|(n, v)| {
            let (shape, data) = v.try_extract_tensor::<f32>().expect("f32 output");
            (
                n.to_string(),
                shape.to_vec(),
                data.iter().map(|x| x.to_bits()).collect(),
            )
        })
        .collect()
}

/// Outputs of a plain `ort` session (ONNX Runtime's defaults, its own
/// `Session::run`), as bits.
pub fn plain_bits(model_file: &str, runs: &[Vec<(String, DynValue)>]) -> Vec<Bits> {
    let mut session = open_session(
        runtime(),
        model(model_file),
        SessionOptions {
            memory: Memory::OrtArena,
            intra_threads: 0,
        },
    )
    .unwrap();
    let names: Vec<String> = session
        .outputs()
        .iter()
        .map(|o| o.name().to_string())
        .collect();
    runs.iter()
        .map(|inputs| {
            let input: Vec<(&str, &DynValue)> =
                inputs.iter().map(|(n, v)| (n.as_str(), v)).collect();
            let out = session.run(input).unwrap();
            bits(names.iter().map(|n| (n.as_str(), out.get(n).unwrap())))
        })
        .collect()
}
