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

/// `gpu_check.py --plans-twice`: per model, two `install()` processes, the
/// second loading the plans the first saved to the store, against the
/// stand-in torch: the first learns (its first batch unplanned), the second
/// loads every key and serves each batch from its plan at first sight.
#[test]
fn gpu_check_plans_twice_with_a_stand_in_for_torch() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("plans.json");
    let out = Command::new("python3")
        .arg(root().join("tools/gpu-check/gpu_check.py"))
        .arg("--lib")
        .arg(cdylib())
        .args(["--plans-twice", "--models", "densenet121,bert", "--json"])
        .arg(&json)
        .env("PYTHONPATH", root().join("tools/gpu-check/fake"))
        .env("TENSOR_ARENA_CUDA_DRIVER", "simulated")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("python3 is needed for this test (no torch, no GPU)");
    let text = text_of(&out);
    assert!(out.status.success(), "{text}");
    assert_eq!(
        text.matches("outputs of the second identical to the first's: True")
            .count(),
        2,
        "{text}"
    );
    let all: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for model in ["densenet121", "bert"] {
        let first = &all[model]["arena_process1"];
        let second = &all[model]["arena_process2"];
        assert_eq!(first["plans"]["loaded"], 0, "{first}");
        assert!(first["plans"]["saved_bytes"].as_u64().unwrap() > 0);
        assert!(second["plans"]["loaded"].as_u64().unwrap() >= 3, "{second}");
        let rows = second["rows"].as_array().unwrap();
        assert!(rows.iter().all(|r| r["plan_first"] == "Exact"), "{second}");
        assert_eq!(first["rows"][0]["plan_first"]["Dynamic"], "NewFamily");
        let ratio = |r: &serde_json::Value| {
            r["reserved_max"].as_f64().unwrap() / r["live_max"].as_f64().unwrap()
        };
        assert!(ratio(second) <= ratio(first), "{model}");
    }
}

/// The library file next to this test binary (`target/<profile>/deps`).
fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let name = format!(
        "{}tensor_arena_cuda{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    [deps.join(&name), deps.parent().unwrap().join(&name)]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{name} not built next to {}", deps.display()))
}
