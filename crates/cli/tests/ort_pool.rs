//! `tensor-arena ort-pool` on RapidOCR's three models: every configuration
//! serves the same stream with identical outputs; one arena per worker
//! holds less than one per model; a budget measured from the pool serves
//! everything; a budget too small fails the large request alone, as out of
//! memory, with the budget's refusals counted; bad input is exit 2. The
//! library and models come from `tools/fetch-ort-assets.sh`.

use std::io::Write as _;
use std::process::{Command, Output};

use serde_json::Value;

#[allow(dead_code)]
#[path = "support/ort_assets.rs"]
mod ort_assets;

use ort_assets::{asset, BIN};

fn pool(stream: &str, args: &[&str]) -> Output {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(stream.as_bytes()).unwrap();
    Command::new(BIN)
        .arg("ort-pool")
        .args(["--det", &asset("ppocr_det.onnx")])
        .args(["--cls", &asset("ppocr_cls.onnx")])
        .args(["--rec", &asset("ppocr_rec.onnx")])
        .arg("--stream")
        .arg(file.path())
        .args(args)
        .env("ORT_DYLIB_PATH", asset("libonnxruntime.so"))
        .output()
        .expect("run tensor-arena")
}

fn doc(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "one JSON document ({e}); stderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn config<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["configs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["config"] == name)
        .unwrap_or_else(|| panic!("no {name} in {doc}"))
}

/// Small images, real crop batches (from the built-in stream's shapes,
/// scaled down in det).
const STREAM: &str = "\
# three requests
det 1x3x320x256 cls 6x3x48x192 2x3x48x192 rec 6x3x48x320 2x3x48x611
det 1x3x192x320 cls 2x3x48x192 rec 2x3x48x436
det 1x3x256x320 cls 5x3x48x192 rec 5x3x48x380
";

#[test]
fn every_configuration_serves_the_stream_with_identical_outputs() {
    let out = pool(STREAM, &["--workers", "2", "--requests", "5", "--json"]);
    assert!(
        out.status.success(),
        "{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = doc(&out);
    assert_eq!(doc["outputs_identical"], true, "{doc}");
    assert_eq!(doc["workers"], 2);
    let names = [
        "ort-default",
        "ort-shared",
        "arena-per-model",
        "arena-per-worker",
        "budget",
    ];
    for name in names {
        let c = config(&doc, name);
        assert_eq!(c["requests"], 5, "{name}: {c}");
        assert_eq!(c["failed"], 0, "{name}: {c}");
        assert!(c["outputs_hash"].is_string(), "{name}: {c}");
        assert!(c["requests_per_second"].as_f64().unwrap() > 0.0);
        let p50 = c["latency_p50_ms"].as_f64().unwrap();
        assert!(p50 > 0.0 && p50 <= c["latency_p99_ms"].as_f64().unwrap());
        assert!(c["peak_rss_bytes"].as_u64().unwrap() >= c["end_rss_bytes"].as_u64().unwrap());
        // Each request runs det, then its cls and rec batches: requests
        // 1, 2, 3, 1, 2 of the stream make 5 + 3 + 3 + 5 + 3 runs.
        assert_eq!(c["model_runs"], 19, "{name}");
        assert_eq!(
            c["peak_reserved_bytes"].is_u64(),
            name.starts_with("arena") || name == "budget"
        );
        // The live peak, counted at every alloc and free: something live,
        // and inside what was committed.
        if let Some(reserved) = c["peak_reserved_bytes"].as_u64() {
            let live = c["peak_live_bytes"].as_u64().unwrap();
            assert!(0 < live && live <= reserved, "{name}: {c}");
        }
        // glibc's malloc, sampled: it held something with the workers made,
        // and never less while serving.
        if cfg!(all(target_os = "linux", target_env = "gnu")) {
            let base = c["baseline_malloc_bytes"].as_u64().unwrap();
            assert!(base > 0, "{name}: {c}");
            assert!(
                c["peak_malloc_bytes"].as_u64().unwrap() >= base,
                "{name}: {c}"
            );
        }
    }
    // The progress of each configuration went to stderr.
    let err = String::from_utf8_lossy(&out.stderr);
    for name in names {
        assert!(err.contains(&format!("[{name}] 5 requests in")), "{err}");
    }
    // One arena per worker holds the largest model's need, not the sum.
    let per_model = config(&doc, "arena-per-model")["peak_reserved_bytes"]
        .as_u64()
        .unwrap();
    let per_worker = config(&doc, "arena-per-worker")["peak_reserved_bytes"]
        .as_u64()
        .unwrap();
    assert!(per_worker < per_model, "{per_worker} vs {per_model}");
    // The budget, measured from arena-per-worker, is never passed.
    let b = &config(&doc, "budget")["budget"];
    assert_eq!(b["limit"].as_u64().unwrap(), per_worker);
    assert!(b["peak_committed"].as_u64().unwrap() <= per_worker);
    assert_eq!(b["refusals"], 0);
}

#[test]
fn a_budget_too_small_fails_the_large_request_only() {
    // One worker: the large image first, then small ones, under a budget a
    // small request fits and the large one does not.
    let stream = "det 1x3x960x960\ndet 1x3x64x64 cls 1x3x48x192 rec 1x3x48x320\n";
    let out = pool(
        stream,
        &[
            "--workers",
            "1",
            "--requests",
            "4",
            "--configs",
            "budget",
            "--budget",
            "24MiB",
            "--json",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = doc(&out);
    let c = config(&doc, "budget");
    assert_eq!(c["requests"], 4);
    assert_eq!(c["failed"], 2, "{c}");
    assert!(
        c["first_error"].as_str().unwrap().contains("out of memory"),
        "{c}"
    );
    assert!(c["outputs_hash"].is_null());
    let b = &c["budget"];
    assert!(b["refusals"].as_u64().unwrap() >= 2, "{b}");
    assert!(b["peak_committed"].as_u64().unwrap() <= 24 << 20, "{b}");
    // Nothing is held beyond the small requests' need at the end.
    assert!(c["end_reserved_bytes"].as_u64().unwrap() <= 24 << 20);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("FAILED: budget: 2 of 4 requests"), "{err}");
}

#[test]
fn bad_input_is_exit_2_with_a_reason() {
    let out = pool("det 1x3x64\n", &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("stream line 1") && err.contains("rank-4"),
        "{err}"
    );

    let out = pool(STREAM, &["--configs", "budget"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs --budget"));

    // A shape the model refuses (det takes 3 channels) is found before
    // anything runs.
    let out = pool("det 1x4x64x64\n", &["--configs", "arena-per-worker"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("request 1 (det)"));

    let out = Command::new(BIN)
        .args([
            "ort-pool",
            "--det",
            "/nonexistent.onnx",
            "--cls",
            "x",
            "--rec",
            "y",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("det model file not found"));
}

/// `ort-pool --plans DIR` (issue 47): a second process serving the same
/// stream starts from the stores the first saved (one per model), so every
/// run is exact from its first, with the same outputs.
#[test]
fn a_pool_starts_from_the_plan_stores_an_earlier_one_saved() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let args = [
        "--configs",
        "arena-per-worker",
        "--workers",
        "1",
        "--plans",
        d.as_str(),
        "--json",
    ];
    let first = doc(&pool(STREAM, &args));
    // One store per model (each with the lock file its saves take).
    let stores = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            !name.to_string_lossy().starts_with('.')
        })
        .count();
    assert_eq!(stores, 3, "one store per model");
    let second = doc(&pool(STREAM, &args));
    let (a, b) = (
        config(&first, "arena-per-worker"),
        config(&second, "arena-per-worker"),
    );
    assert_eq!(a["outputs_hash"], b["outputs_hash"]);
    for m in b["plans"].as_array().unwrap() {
        assert_eq!(m["dynamic"], 0, "{m}");
        assert_eq!(m["predicted"], 0, "{m}");
        assert!(m["exact"].as_u64().unwrap() > 0, "{m}");
    }
}
