//! A harness for tests that must run in a child process under limits they
//! set themselves (`setrlimit`): the out-of-memory cases of the arena,
//! session and VAD crates (their `tests/exhaustion.rs`, `harness = false`,
//! include this file by path).
//!
//! The test binary runs each case's parent; the parent runs the binary
//! again with `EXHAUSTION_CHILD=<case>`, and the child does the work under
//! its limit and prints what it saw. The children are not tests, so no test
//! passes by doing nothing. Prints libtest-like lines and a closing
//! "N passed, N failed"; exits non-zero when a case failed.

#![allow(dead_code)]

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
use std::process::Command;

pub const CHILD: &str = "EXHAUSTION_CHILD";
pub const MIB: usize = 1 << 20;
pub const GIB: usize = 1 << 30;

/// Runs the child named in `EXHAUSTION_CHILD` (then prints `child: done`),
/// or else every parent case whose name contains a command-line filter.
pub fn main(cases: &[(&str, fn())], child: fn(&str)) {
    if let Ok(case) = std::env::var(CHILD) {
        child(&case);
        println!("child: done");
        return;
    }
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let (mut passed, mut failed) = (0, 0);
    for (name, case) in cases {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        match std::panic::catch_unwind(case) {
            Ok(()) => {
                println!("test {name} ... ok");
                passed += 1;
            }
            Err(_) => {
                println!("test {name} ... FAILED");
                failed += 1;
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(101);
    }
}

/// Runs `case` in a child process; returns its stdout, asserting it exited
/// normally (no signal) with success and reached its end.
pub fn run_child(case: &str) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .env(CHILD, case)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let text = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "child {case} ended with {:?}:\n{text}",
        out.status
    );
    assert!(stdout.contains("child: done"), "{text}");
    stdout
}

/// A field of `/proc/self/status` or `/proc/meminfo` (in KiB there), in
/// bytes.
pub fn kib_field(file: &str, key: &str) -> usize {
    let text = std::fs::read_to_string(file).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("{key} in {file}"));
    let kib: usize = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    kib * 1024
}

/// Sets this process's soft limit of `resource` to `bytes`.
pub fn set_limit(resource: Resource, bytes: usize) {
    let old = getrlimit(resource);
    setrlimit(
        resource,
        Rlimit {
            current: Some(bytes as u64),
            maximum: old.maximum,
        },
    )
    .expect("setrlimit");
}

/// Limits this process's data segment (private writable memory: heap,
/// arenas' commits) to what it uses now plus `extra` bytes.
pub fn limit_data_to_now_plus(extra: usize) {
    let data = kib_field("/proc/self/status", "VmData:");
    set_limit(Resource::Data, data + extra);
}
