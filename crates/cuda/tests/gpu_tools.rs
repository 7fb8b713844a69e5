//! The GPU machine's tools (`tools/gpu-check`) where no GPU is: what of
//! them runs without one, run by `python3` (no torch; the stand-in of
//! `tools/gpu-check/fake` where a torch is needed) against the library
//! with the simulated driver. A missing interpreter fails these tests
//! rather than skipping them.

use std::path::PathBuf;
use std::process::Command;

// Links the library these tests load from Python.
use tensor_arena_cuda as _;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn text_of(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `record_traces.py`'s conversion of a snapshot's trace entries into a
/// trace v1 file (`tools/gpu-check/test_record_traces.py`, on hand-made
/// snapshots), and its "not run" path without a GPU; the trace it writes
/// parses with the crate's own parser, which checks the format's rules.
#[test]
fn record_traces_conversion_makes_valid_traces() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("hand-made.trace");
    let out = Command::new("python3")
        .arg(root().join("tools/gpu-check/test_record_traces.py"))
        .arg(&trace)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("PYTHONPATH")
        .output()
        .expect("python3 is needed for this test (no torch, no GPU)");
    let text = text_of(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("\nOK"), "{text}");
    let parsed = tensor_arena::trace::Trace::from_file(&trace).expect("a valid trace v1");
    assert_eq!(parsed.runs.len(), 2);
    assert!(parsed.runs.iter().all(|r| r.allocs() == 5), "{parsed:?}");
    // The workspace alive at the end overlaps the largest activations.
    assert_eq!(parsed.runs[0].lower_bound(), 1000 + 512 + 4096);
}
