//! The ONNX Runtime library and models for the `tensor-arena ort` tests,
//! fetched by `tools/fetch-ort-assets.sh` on first use (without them the
//! tests fail; they never skip).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The command under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_tensor-arena");

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The directory holding the library and the models.
pub fn assets() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::var_os("TENSOR_ARENA_ORT_ASSETS")
            .map(PathBuf::from)
            .unwrap_or_else(|| root().join("target/ort-assets"));
        let status = Command::new("bash")
            .arg(root().join("tools/fetch-ort-assets.sh"))
            .arg(&dir)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("cannot run tools/fetch-ort-assets.sh");
        assert!(
            status.success(),
            "tools/fetch-ort-assets.sh failed: these tests need ONNX Runtime and the models"
        );
        dir
    })
}

/// The path of one asset, as an argument.
pub fn asset(name: &str) -> String {
    assets().join(name).to_string_lossy().into_owned()
}
