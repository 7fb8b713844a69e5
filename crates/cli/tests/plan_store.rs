//! `replay --plans DIR` and `plans show FILE` (issue 47): a fresh process
//! started from an earlier one's store serves every shape seen before on
//! its exact plan from the first run (high water = lower bound); a bad
//! store is one warning and a replay with no plans; `plans show` lists a
//! store and refuses a bad one with exit status 2.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_tensor-arena");

fn trace(name: &str) -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../traces")).join(name)
}

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("run tensor-arena")
}

/// `replay --json --strategy planned --plans DIR --trace FILE`: the
/// planned strategy's report and stderr.
fn replay(dir: &Path, file: &str) -> (Value, String) {
    let t = trace(file);
    let out = run(&[
        "replay",
        "--json",
        "--strategy",
        "planned",
        "--plans",
        dir.to_str().unwrap(),
        "--trace",
        t.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{}\n{stderr}", out.status);
    let doc: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    (doc["strategies"][0].clone(), stderr)
}

fn store_file(dir: &Path) -> PathBuf {
    // The store, not the lock file its saves take beside it.
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "plans"))
        .collect();
    assert_eq!(files.len(), 1, "one store file: {files:?}");
    files[0].clone()
}

#[test]
fn a_fresh_replay_from_a_store_is_exact_from_its_first_run() {
    let dir = tempfile::tempdir().unwrap();
    let (first, _) = replay(dir.path(), "ppocr-cls-mixed.trace");
    assert!(first["summary"]["plans"]["dynamic"].as_u64().unwrap() > 0);
    let (second, stderr) = replay(dir.path(), "ppocr-cls-mixed.trace");
    assert!(!stderr.contains("plan store"), "{stderr}");
    let runs = second["runs"].as_array().unwrap();
    for r in runs {
        assert_eq!(r["plan"], "exact", "{r}");
        // The exact plan's block: the solver's, within a few granules of
        // the lower bound (not the dynamic arena's 1.09 to 1.20x).
        let (hw, lb) = (
            r["high_water"].as_f64().unwrap(),
            r["lower_bound"].as_f64().unwrap(),
        );
        assert!(hw <= lb * 1.01, "{r}");
    }
    let out = run(&["plans", "show", store_file(dir.path()).to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("32x3x48x192") && text.contains("families"),
        "{text}"
    );
}

#[test]
fn a_bad_store_is_one_warning_and_a_replay_with_no_plans() {
    let dir = tempfile::tempdir().unwrap();
    replay(dir.path(), "ppocr-cls-mixed.trace");
    let file = store_file(dir.path());
    let mut bytes = std::fs::read(&file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x10;
    std::fs::write(&file, &bytes).unwrap();

    let out = run(&["plans", "show", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("checksum"));

    let (report, stderr) = replay(dir.path(), "ppocr-cls-mixed.trace");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("plan store"))
        .collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(warnings[0].contains("checksum"), "{stderr}");
    assert_eq!(report["runs"][0]["plan"], "dynamic (new family)");
    // The save after it replaced the corrupt file.
    let out = run(&["plans", "show", file.to_str().unwrap()]);
    assert!(out.status.success());
}
