//! Alternating input sizes through `tensor-arena ort` (PP-OCR det, large
//! and small images in turn, the `planned` strategy: memory following the
//! input down after each run): a small run after a large one runs on its
//! own memory. The worker gives back what the small run's plan does not
//! need before the run starts (the command measures a run's peak RSS from
//! there, and counts the give-back's time in the run's), so the small
//! run's peak RSS is below the large run's. Fails when memory goes back
//! only as the small run ends (its peak is then the large run's).

use serde_json::Value;
use std::process::Command;

#[allow(dead_code)]
#[path = "support/ort_assets.rs"]
mod ort_assets;

use ort_assets::{asset, BIN};

const MIB: u64 = 1 << 20;

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn a_small_run_after_a_large_one_peaks_below_it() {
    let (large, small) = ("1x3x640x640", "1x3x160x160");
    let out = Command::new(BIN)
        .arg("ort")
        .args(["--model", &asset("ppocr_det.onnx"), "--inputs"])
        .args([large, small, large, small, large, small])
        .args(["--strategies", "planned", "--json"])
        .env("ORT_DYLIB_PATH", asset("libonnxruntime.so"))
        .env_remove("ORT_LOG")
        .output()
        .expect("run tensor-arena");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    let s = &doc["strategies"][0];
    assert_eq!(s["peak_rss_per_run"], true, "{s}");
    let rows = s["runs"].as_array().unwrap();
    // The first pair teaches both shapes their plans; the later ones are
    // served by them.
    for pair in rows[2..].chunks(2) {
        let (l, sm) = (&pair[0], &pair[1]);
        let held = u(&l["reserved"]) - u(&sm["reserved"]);
        assert!(held > 20 * MIB, "the large run holds more: {l} {sm}");
        let (peak_l, peak_s) = (u(&l["peak_rss_bytes"]), u(&sm["peak_rss_bytes"]));
        // Below by most of what the large run held beyond the small one's
        // need (reverted: the two peaks are within a few MiB).
        assert!(
            peak_s + held / 2 < peak_l,
            "small run's peak {} MiB, the large run's {} MiB ({} MiB held for it)",
            peak_s / MIB,
            peak_l / MIB,
            held / MIB
        );
        // And the memory is gone after it too.
        let (after_l, after_s) = (u(&l["rss_bytes"]), u(&sm["rss_bytes"]));
        assert!(
            after_s + held / 2 < after_l,
            "RSS after the small run {after_s}, after the large one {after_l}"
        );
    }
}
