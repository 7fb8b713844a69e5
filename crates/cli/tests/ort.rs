//! Runs `tensor-arena ort` on real models: the JSON document's schema, equal
//! outputs across strategies and threads, and bad input (exit code 2 with a
//! clear message). The library and models come from
//! `tools/fetch-ort-assets.sh` (run here when missing; without them the
//! tests fail).

use std::process::{Command, Output};

use serde_json::Value;

#[allow(dead_code)]
#[path = "support/ort_assets.rs"]
mod ort_assets;

use ort_assets::{asset, BIN};

/// Runs `tensor-arena ort` with the fetched library.
fn ort(args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("ort")
        .args(args)
        .env("ORT_DYLIB_PATH", asset("libonnxruntime.so"))
        .output()
        .expect("run tensor-arena")
}

fn json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let out = ort(&all);
    assert!(
        out.status.success(),
        "{all:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON document")
}

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    k.sort_unstable();
    k
}

#[test]
fn json_document_has_the_documented_schema_and_equal_hashes() {
    let cls = asset("ppocr_cls.onnx");
    let doc = json(&[
        "--model",
        &cls,
        "--inputs",
        "1x3x48x192",
        "2x3x48x100",
        "1x3x48x192",
        "2x3x48x100",
    ]);
    assert_eq!(
        keys(&doc),
        [
            "inputs",
            "intra_threads",
            "model",
            "outputs_identical",
            "strategies",
            "threads",
            "values"
        ]
    );
    assert_eq!(doc["model"].as_str(), Some(cls.as_str()));
    assert_eq!(doc["threads"].as_u64(), Some(1));
    assert_eq!(doc["intra_threads"].as_u64(), Some(0));
    assert_eq!(doc["outputs_identical"].as_bool(), Some(true));
    assert_eq!(doc["inputs"].as_array().unwrap().len(), 4);
    let strategies = doc["strategies"].as_array().unwrap();
    let names: Vec<&str> = strategies
        .iter()
        .map(|s| s["strategy"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "ort-arena",
            "ort-shrink",
            "ort-no-arena",
            "arena",
            "planned"
        ]
    );
    let first_hashes: Vec<&str> = strategies[0]["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["output_hash"].as_str().unwrap())
        .collect();
    assert_ne!(
        first_hashes[0], first_hashes[1],
        "different inputs, different outputs"
    );
    for s in strategies {
        assert_eq!(
            keys(s),
            [
                "peak_rss_per_run",
                "process_peak_rss_bytes",
                "runs",
                "session_rss_bytes",
                "strategy"
            ]
        );
        assert!(
            s["process_peak_rss_bytes"].as_u64().unwrap()
                >= s["session_rss_bytes"].as_u64().unwrap()
        );
        assert!(s["session_rss_bytes"].as_u64().unwrap() > 1 << 20);
        let is_arena = matches!(s["strategy"].as_str(), Some("arena" | "planned"));
        let runs = s["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 4);
        for (i, r) in runs.iter().enumerate() {
            let mut expected_keys = vec![
                "backing_calls",
                "label",
                "lazily_given_back",
                "nanos",
                "output_hash",
                "peak_in_use",
                "peak_rss_bytes",
            ];
            // Arena strategies say how each run was planned.
            if is_arena {
                expected_keys.push("plan");
            }
            expected_keys.extend(["reserved", "rss_bytes"]);
            // ... and how many of their commits found huge pages slow.
            if is_arena {
                expected_keys.push("slow_huge_commits");
                assert!(r["slow_huge_commits"].is_u64());
            }
            assert_eq!(keys(r), expected_keys);
            assert_eq!(
                r["output_hash"].as_str().unwrap(),
                first_hashes[i],
                "{} run {i}",
                s["strategy"]
            );
            assert!(r["nanos"].as_u64().unwrap() > 0);
            assert!(r["peak_rss_bytes"].as_u64().unwrap() >= r["rss_bytes"].as_u64().unwrap());
            for k in [
                "peak_in_use",
                "reserved",
                "backing_calls",
                "lazily_given_back",
            ] {
                assert_eq!(r[k].is_u64(), is_arena, "{} {k}", s["strategy"]);
                assert_eq!(r[k].is_null(), !is_arena, "{} {k}", s["strategy"]);
            }
        }
        let plans: Vec<&str> = runs.iter().filter_map(|r| r["plan"].as_str()).collect();
        match s["strategy"].as_str() {
            Some("arena") => assert_eq!(plans, ["dynamic (off)"; 4]),
            Some("planned") => assert_eq!(
                plans,
                [
                    "dynamic (new family)",
                    "dynamic (one shape)",
                    "exact",
                    "exact"
                ]
            ),
            _ => assert!(plans.is_empty()),
        }
        if s["strategy"] == "planned" {
            // A shape seen before, after a smaller one: memory followed the
            // smaller run down and is committed again, with no more calls
            // than the shape's first run made.
            let calls = |i: usize| runs[i]["backing_calls"].as_u64().unwrap();
            assert!(calls(3) <= calls(1), "{} then {}", calls(1), calls(3));
            assert!(runs[1]["peak_in_use"].as_u64().unwrap() > 0);
        }
    }
}

#[test]
fn threads_give_the_same_outputs_and_a_table() {
    let rec = asset("ppocr_rec.onnx");
    let one = json(&[
        "--model",
        &rec,
        "--inputs",
        "1x3x48x320",
        "1x3x48x100",
        "--strategies",
        "planned,ort-arena",
    ]);
    let four = json(&[
        "--model",
        &rec,
        "--inputs",
        "1x3x48x320",
        "1x3x48x100",
        "--strategies",
        "planned,ort-arena",
        "--threads",
        "4",
    ]);
    let hashes = |d: &Value| -> Vec<String> {
        d["strategies"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| {
                s["runs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r["output_hash"].as_str().unwrap().to_string())
            })
            .collect()
    };
    assert_eq!(hashes(&one), hashes(&four));
    let out = ort(&[
        "--model",
        &rec,
        "--inputs",
        "1x3x48x320",
        "--strategies",
        "planned",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    // One strategy: nothing was compared, and the text says so.
    assert!(
        text.contains("planned")
            && text.contains("output hashes: one strategy ran (planned): nothing to compare")
            && !text.contains("identical"),
        "{text}"
    );
}

/// Expects exit code 2 and `needle` in stderr, nothing on stdout.
fn refused(args: &[&str], lib: Option<&str>, needle: &str) {
    let mut cmd = Command::new(BIN);
    cmd.arg("ort").args(args).env_remove("ORT_DYLIB_PATH");
    if let Some(lib) = lib {
        cmd.env("ORT_DYLIB_PATH", lib);
    }
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(
        stderr.contains(needle),
        "{args:?}: expected {needle:?} in: {stderr}"
    );
    assert!(out.stdout.is_empty(), "{args:?}");
}

#[test]
fn bad_input_is_refused_with_exit_code_2() {
    let cls = asset("ppocr_cls.onnx");
    let lib = asset("libonnxruntime.so");
    let old = asset("libonnxruntime-1.20.so");
    let one = [
        "--model",
        cls.as_str(),
        "--inputs",
        "1x3x48x192",
        "--strategies",
        "planned",
    ];
    // The library: unset, missing, too old, not a library.
    refused(&one, None, "ORT_DYLIB_PATH is not set");
    refused(
        &one,
        Some("/nonexistent/libonnxruntime.so"),
        "not found at /nonexistent/libonnxruntime.so",
    );
    refused(
        &one,
        Some(&old),
        "expected version >= '1.31.x', but got '1.20.1'",
    );
    refused(&one, Some(&cls), "cannot use ONNX Runtime library");
    // The model: missing, corrupt.
    refused(
        &["--model", "/nonexistent.onnx", "--inputs", "1x3x48x192"],
        Some(&lib),
        "model file not found",
    );
    let dir = std::env::temp_dir().join(format!("ta-cli-ort-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let corrupt = dir.join("corrupt.onnx");
    let bytes = std::fs::read(&cls).unwrap();
    std::fs::write(&corrupt, &bytes[..bytes.len() / 2]).unwrap();
    let corrupt = corrupt.to_string_lossy().into_owned();
    refused(
        &["--model", &corrupt, "--inputs", "1x3x48x192"],
        Some(&lib),
        "cannot load model",
    );
    // The inputs: wrong rank, wrong fixed dimension, unknown name, bad syntax.
    refused(
        &["--model", &cls, "--inputs", "3x48x192"],
        Some(&lib),
        "rank 4",
    );
    refused(
        &["--model", &cls, "--inputs", "1x4x48x192"],
        Some(&lib),
        "expects rank 4",
    );
    refused(
        &["--model", &cls, "--inputs", "y=1x3x48x192"],
        Some(&lib),
        "no input named \"y\"",
    );
    refused(
        &["--model", &cls, "--inputs", "1x0x48"],
        Some(&lib),
        "a dimension is 0",
    );
    refused(
        &["--model", &cls, "--inputs", "1xfoo"],
        Some(&lib),
        "bad shape",
    );
}

/// Out of memory (issue 19): under an address-space limit the test sets
/// itself (`ulimit -v` in the shell that starts the program), a run of
/// DenseNet-121 at a batch the limit cannot hold. Every strategy, ONNX
/// Runtime's and tensor-arena's, reports that run as out of memory, by
/// name, runs the next (small) run with the same outputs as the first, and
/// the command exits 1; no strategy dies by a signal.
#[test]
fn every_strategy_reports_out_of_memory_and_goes_on() {
    let out = Command::new("sh")
        .arg("-c")
        .arg(
            "ulimit -v 4000000 && exec \"$0\" ort --model \"$1\" --lib \"$2\" \
             --inputs 1x3x224x224 512x3x224x224 1x3x224x224",
        )
        .arg(BIN)
        .arg(asset("densenet121_batch.onnx"))
        .arg(asset("libonnxruntime.so"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let text = format!("{stdout}{stderr}");
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        !stderr.contains("signal"),
        "a strategy died by a signal:\n{text}"
    );
    for strategy in [
        "ort-arena",
        "ort-shrink",
        "ort-no-arena",
        "arena",
        "planned",
    ] {
        let line = stderr
            .lines()
            .find(|l| l.starts_with(&format!("FAILED: {strategy} run 1 (512x3x224x224):")))
            .unwrap_or_else(|| panic!("no failure line for {strategy}:\n{text}"));
        assert!(line.contains("out of memory"), "{line}");
    }
    // The small runs around the refusal have the same outputs in every
    // strategy, and none failed.
    assert!(
        stdout.contains("output hashes: identical across strategies"),
        "{text}"
    );
    let small: Vec<&str> = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("1x3x224x224"))
        .collect();
    assert_eq!(small.len(), 10, "two small runs per strategy:\n{text}");
    assert!(small.iter().all(|l| !l.contains("FAILED")), "{text}");
}

#[test]
fn planned_lazy_follows_the_input_down_with_the_same_outputs() {
    let rec = asset("ppocr_rec.onnx");
    let doc = json(&[
        "--model",
        &rec,
        "--inputs",
        "1x3x48x960",
        "1x3x48x160",
        "1x3x48x960",
        "--strategies",
        "planned,planned-lazy",
    ]);
    let all = doc["strategies"].as_array().unwrap();
    assert_eq!(all.len(), 2);
    let runs = |s: &Value| s["runs"].as_array().unwrap().clone();
    let (now, lazy) = (runs(&all[0]), runs(&all[1]));
    assert_eq!(all[1]["strategy"], "planned-lazy");
    for i in 0..3 {
        assert_eq!(now[i]["output_hash"], lazy[i]["output_hash"], "run {i}");
    }
    let reserved = |r: &Value| r["reserved"].as_u64().unwrap();
    let calls = |r: &Value| r["backing_calls"].as_u64().unwrap();
    // Given back lazily, what the arena holds still follows the small run
    // down, as with the default, and the large shape again makes no more
    // memory-layer calls than its first run.
    assert_eq!(reserved(&lazy[1]), reserved(&now[1]));
    assert!(
        reserved(&lazy[1]) * 2 < reserved(&lazy[0]),
        "{} after the small run, {} after the large",
        reserved(&lazy[1]),
        reserved(&lazy[0])
    );
    assert!(calls(&lazy[2]) <= calls(&lazy[0]));
    // What was given back after the small run was given back lazily, and
    // is reported; the default gives back at once.
    let given = |r: &Value| r["lazily_given_back"].as_u64().unwrap();
    assert!(given(&lazy[1]) > 0 && given(&lazy[1]) <= reserved(&lazy[0]) - reserved(&lazy[1]));
    assert!(now.iter().all(|r| given(r) == 0));
}

/// PP-OCRv4 rec at ten widths in a random order (from `random.Random(7)`,
/// 200 to 1600, batch 2: a width larger than any seen comes fourth, so a
/// prediction is left there): planned serving, predictions and a run that
/// leaves its plan included, grows the process no more than the dynamic
/// arena does (peak RSS over the RSS with the session made, each strategy
/// in its own child process; within two 2 MiB granules: the arena's commit
/// step, and the plans' own bookkeeping), with outputs bitwise equal.
#[test]
fn planned_rec_at_random_widths_peaks_no_higher_than_the_arena() {
    let rec = asset("ppocr_rec.onnx");
    let widths = [863, 508, 1008, 1533, 298, 348, 1297, 392, 948, 1393];
    let inputs: Vec<String> = widths.iter().map(|w| format!("2x3x48x{w}")).collect();
    let mut args = vec![
        "--model",
        rec.as_str(),
        "--strategies",
        "arena,planned",
        "--inputs",
    ];
    args.extend(inputs.iter().map(String::as_str));
    let doc = json(&args);
    assert_eq!(doc["outputs_identical"].as_bool(), Some(true));
    let growth = |s: &Value| {
        s["process_peak_rss_bytes"].as_u64().unwrap() as i64
            - s["session_rss_bytes"].as_u64().unwrap() as i64
    };
    let strategies = doc["strategies"].as_array().unwrap();
    let (arena, planned) = (growth(&strategies[0]), growth(&strategies[1]));
    let plans: Vec<&str> = strategies[1]["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["plan"].as_str().unwrap_or(""))
        .collect();
    assert!(
        plans.iter().filter(|p| p.starts_with("predicted")).count() >= 5,
        "{plans:?}"
    );
    assert!(
        planned <= arena + (4 << 20),
        "planned grew {planned} bytes, the arena {arena}: {plans:?}"
    );
}

/// `ort --plans DIR` (issue 47): a second process's planned strategy starts
/// from the store the first saved, so every run is exact from the first,
/// with the same outputs as ONNX Runtime's own arena.
#[test]
fn ort_planned_starts_from_a_plan_store() {
    let dir = tempfile::tempdir().unwrap();
    let rec = asset("ppocr_rec.onnx");
    let args = |strategies: &'static str| {
        vec![
            "--model".to_string(),
            rec.clone(),
            "--strategies".to_string(),
            strategies.to_string(),
            "--plans".to_string(),
            dir.path().display().to_string(),
            "--inputs".to_string(),
            "x=1x3x48x320".to_string(),
            "x=1x3x48x640".to_string(),
        ]
    };
    let plans = |doc: &Value| -> Vec<String> {
        doc["strategies"][0]["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["plan"].as_str().unwrap().to_string())
            .collect()
    };
    let first = args("planned");
    let first = json(&first.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(plans(&first)[0].starts_with("dynamic"), "{first}");
    let second = args("planned,ort-arena");
    let second = json(&second.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(plans(&second), ["exact", "exact"], "{second}");
    assert_eq!(second["outputs_identical"].as_bool(), Some(true));
}
