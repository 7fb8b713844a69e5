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

/// A model file from the assets.
pub fn model(name: &str) -> PathBuf {
    assets().join(name)
}
