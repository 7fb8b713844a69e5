//! A `libcuda.so` that lacks the functions of CUDA 13.0 (an old driver) is
//! a clear `Err`, not a panic: the test builds a stand-in library with one
//! function and opens a device with it on the loader's path, in a child
//! process (the loader reads `LD_LIBRARY_PATH` at start-up).

use std::process::Command;
use tensor_arena_cuda::{CudaError, DeviceArena, DeviceConfig};

const CHILD: &str = "TENSOR_ARENA_CUDA_TEST_OLD_DRIVER";

#[test]
fn an_old_driver_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("cuda.c");
    std::fs::write(&src, "int cuInit(unsigned int flags) { return flags; }\n").unwrap();
    let lib = dir.path().join("libcuda.so");
    let cc = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .expect("a C compiler (cc) is needed to build the stand-in libcuda.so");
    assert!(cc.success());
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_opens_a_device",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("LD_LIBRARY_PATH", dir.path())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("child: DriverNotFound"), "{text}");
    assert!(text.contains("lacks functions of CUDA 13.0"), "{text}");
}

/// Runs only as the child of the test above.
#[test]
fn child_opens_a_device() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    match DeviceArena::cuda(0, DeviceConfig::default()) {
        Err(e @ CudaError::DriverNotFound { .. }) => println!("child: DriverNotFound: {e}"),
        Err(e) => panic!("child: unexpected error: {e}"),
        Ok(_) => panic!("child: a device opened on the stand-in library"),
    }
}
