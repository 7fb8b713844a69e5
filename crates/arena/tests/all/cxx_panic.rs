//! Review finding 1 (issue 35): the `cxx` feature throws a C++ exception
//! through a Rust frame, which a `panic = "abort"` build turns into a
//! process abort. Such a build is refused when it is compiled, with a
//! message that says why; an unwinding build compiles. (The guard,
//! `src/cxx_panic.rs`, is compiled alone by `rustc`, as `cxx.rs` includes
//! it.)

use std::path::Path;
use std::process::Command;

fn compile(panic: &str) -> (bool, String) {
    let guard = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cxx_panic.rs");
    let out_dir =
        std::env::temp_dir().join(format!("tensor-arena-cxx-panic-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(rustc)
        .args([
            "--edition",
            "2021",
            "--crate-type",
            "lib",
            "--crate-name",
            "guard",
        ])
        .arg("-C")
        .arg(format!("panic={panic}"))
        .arg("--out-dir")
        .arg(&out_dir)
        .arg(&guard)
        .output()
        .expect("rustc runs");
    let _ = std::fs::remove_dir_all(&out_dir);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn cxx_refuses_panic_abort() {
    let (ok, stderr) = compile("abort");
    assert!(!ok, "a panic = \"abort\" build compiled");
    assert!(
        stderr.contains("needs panic = \"unwind\"") && stderr.contains("std::bad_alloc"),
        "{stderr}"
    );
    let (ok, stderr) = compile("unwind");
    assert!(ok, "{stderr}");
}
