//! Review finding 2 (issue 35): the C++ runtime that throws
//! `std::bad_alloc` must be the one the catching library uses. Two small
//! C++ libraries are built here: one linked with the shared
//! `libstdc++.so.6`, one with `-static-libstdc++` and its runtime hidden.
//! `tensor_arena::cxx::runtime_for` finds the first one's runtime and
//! refuses to name one for the second, where the process-wide answer
//! (`runtime()`: whichever `libstdc++.so.6` is loaded) would be a runtime
//! that library does not use. ONNX Runtime's own is found at registration.
//! (A binary of its own: it loads libraries into the process.)

#[allow(dead_code)]
#[path = "all/common.rs"]
mod common;

use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};
use std::process::Command;
use tensor_arena::cxx::{runtime, runtime_for};

const SOURCE: &str = r#"
#include <stdexcept>
extern "C" int probe(int x) {
    try {
        if (x < 0) throw std::runtime_error("negative");
        return x;
    } catch (const std::exception&) {
        return -1;
    }
}
"#;

fn build(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let src = dir.join("probe.cpp");
    std::fs::write(&src, SOURCE).unwrap();
    let out = dir.join(name);
    let status = Command::new(std::env::var("CXX").unwrap_or_else(|_| "c++".into()))
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&out)
        .arg(&src)
        .args(extra)
        .status()
        .expect("a C++ compiler (c++) is needed for this test");
    assert!(status.success(), "c++ failed for {name}");
    out
}

/// Loads `path` (locally, as `ort` loads ONNX Runtime) and returns the
/// address of its `probe`.
fn load(path: &Path) -> *const c_void {
    let c = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path of a library just built; loading runs
    // only its C++ static initialisers.
    let lib = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!lib.is_null(), "cannot load {}", path.display());
    // SAFETY: a live handle and a C string.
    let f = unsafe { libc::dlsym(lib, c"probe".as_ptr()) };
    assert!(!f.is_null());
    f.cast_const()
}

#[test]
fn the_runtime_that_throws_is_the_one_the_catcher_uses() {
    let dir = std::env::temp_dir().join(format!("tensor-arena-cxx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let shared = build(&dir, "libprobe_shared.so", &[]);
    let hidden = build(
        &dir,
        "libprobe_static.so",
        &["-static-libstdc++", "-Wl,--exclude-libs,ALL"],
    );
    let shared_fn = load(&shared);
    let hidden_fn = load(&hidden);
    let _ = std::fs::remove_dir_all(&dir);

    // The shared one binds to the process's libstdc++.so.6.
    let process_wide = runtime().expect("libstdc++.so.6 is loaded (by the first library)");
    let rt = runtime_for(shared_fn).expect("the shared library's runtime");
    assert_eq!(rt.throw_address(), process_wide.throw_address());
    // The one with a hidden runtime of its own: none can be proven, so none
    // is named (the process-wide answer would be the wrong runtime).
    assert!(runtime_for(hidden_fn).is_none());
    // A library with no C++ runtime in its scope (libc).
    assert!(runtime_for(libc::malloc as *const c_void).is_none());

    // ONNX Runtime: registration finds the runtime it binds to.
    let env = common::environment("cxx-runtime");
    assert!(!tensor_arena_ort::bad_alloc_available());
    tensor_arena_ort::register(&env).unwrap();
    assert!(tensor_arena_ort::bad_alloc_available());
}
