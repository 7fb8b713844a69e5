//! The `tensor-vad` command's edges: errors on stderr with the file's name
//! (also with `-q`), exit codes, options out of range, streamed WAVs and
//! stdin, the wording of the summary, and the `--json` document.

mod common;

use std::io::Write as _;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_tensor-vad");

/// Runs `tensor-vad` with `args`, stdin from `input`.
fn run_with(args: &[&str], input: &[u8]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tensor-vad");
    let mut stdin = child.stdin.take().unwrap();
    // A command that exits early closes the pipe; that is not an error here.
    let _ = stdin.write_all(input);
    drop(stdin);
    child.wait_with_output().unwrap()
}

/// `(exit code, stdout, stderr)` of `tensor-vad args`.
fn run(args: &[&str]) -> (i32, String, String) {
    let out = run_with(args, b"");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn speech() -> String {
    common::data_path("speech.wav").to_str().unwrap().to_owned()
}

/// The `  speech a - b` lines of a text report.
fn segment_lines(out: &str) -> Vec<&str> {
    out.lines().filter(|l| l.starts_with("  speech ")).collect()
}

/// The committed WAV with its `data` size field (and the RIFF size) set to
/// `size`, as ffmpeg or arecord write it to a pipe.
fn streamed_wav(size: u32) -> Vec<u8> {
    let mut bytes = std::fs::read(speech()).unwrap();
    let at = bytes.windows(4).position(|w| w == b"data").unwrap();
    bytes[at + 4..at + 8].copy_from_slice(&size.to_le_bytes());
    bytes[4..8].copy_from_slice(&size.to_le_bytes());
    bytes
}

#[test]
fn errors_go_to_stderr_with_the_file_name_even_when_quiet() {
    let missing = common::data_path("no-such.wav");
    let missing = missing.to_str().unwrap();
    let not_wav = common::data_path("reference.json");
    let not_wav = not_wav.to_str().unwrap();
    let wav = speech();
    for quiet in [false, true] {
        let mut args = vec![missing, wav.as_str(), not_wav];
        if quiet {
            args.insert(0, "-q");
        }
        let (code, out, err) = run(&args);
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains(&format!("tensor-vad: {missing}: cannot read WAV file")),
            "{err}"
        );
        assert!(
            err.contains(&format!("tensor-vad: {not_wav}: not a RIFF file")),
            "{err}"
        );
        assert!(err.contains("2 of 3 files failed"), "{err}");
        assert!(!out.contains("no-such") && !out.contains("reference.json"));
        // Failed files are not counted as processed.
        assert!(out.contains("\n1 file (10.1 s of audio") || out.starts_with("1 file (10.1 s"));
        assert!(out.contains("; 2 failed"), "{out}");
        assert_eq!(segment_lines(&out).len(), if quiet { 0 } else { 3 });
    }
}

#[test]
fn the_weights_path_is_named_once() {
    let (code, out, err) = run(&["--weights", "/no/such/weights.safetensors", &speech()]);
    assert_eq!(code, 2);
    assert!(out.is_empty());
    assert_eq!(
        err.matches("/no/such/weights.safetensors").count(),
        1,
        "{err}"
    );
    assert!(err.contains("weights file not found"), "{err}");
}

#[test]
fn options_out_of_range_are_refused_with_exit_2() {
    let wav = speech();
    for (args, needle) in [
        (&["--threshold", "7"][..], "--threshold"),
        (&["--threshold", "NaN"], "--threshold"),
        (&["--threshold=-0.1"], "--threshold"),
        (&["--threshold", "inf"], "--threshold"),
        (&["--threshold", "half"], "--threshold"),
        (&["--neg-threshold", "1.5"], "--neg-threshold"),
        (&["--neg-threshold", "nan"], "--neg-threshold"),
        (
            &["--threshold", "0.3", "--neg-threshold", "0.5"],
            "--neg-threshold",
        ),
        (&["--min-speech-ms=-5"], "--min-speech-ms"),
        (&["--workers", "0"], "--workers"),
        (&["--repeat", "0"], "--repeat"),
        (&["--probs"], "--json"),
        (&["--json", "-q"], "--quiet"),
    ] {
        let mut all = args.to_vec();
        all.push(&wav);
        let (code, out, err) = run(&all);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    // Within range: accepted.
    let (code, _, err) = run(&["--threshold", "0.6", "--neg-threshold", "0.6", &wav]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn summary_wording_counts_and_plurals() {
    let (code, out, _) = run(&[&speech()]);
    assert_eq!(code, 0);
    assert!(out.contains("316 windows in 1 run (worker 0)"), "{out}");
    assert!(
        out.contains("1 file (10.1 s of audio, 316 windows) in 1 run on 1 worker: "),
        "{out}"
    );
    assert!(out.contains("pool: 1 clone, "), "{out}");

    // Every file failing: no NaN, no rate of nothing.
    let missing = common::data_path("no-such.wav");
    let (code, out, err) = run(&[missing.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(!out.contains("NaN") && !out.contains("inf"), "{out}");
    assert!(
        out.starts_with("0 files (0.0 s of audio, 0 windows) in 0 runs"),
        "{out}"
    );
    assert!(err.contains("1 of 1 file failed"), "{err}");
}

#[test]
fn streamed_wavs_give_the_same_segments_as_a_correct_header() {
    let (code, reference, err) = run(&[&speech()]);
    assert_eq!(code, 0, "{err}");
    let expected = segment_lines(&reference);
    assert_eq!(expected.len(), 3);
    let dir = tempfile::tempdir().unwrap();
    // ffmpeg's placeholder, others', sox's.
    for size in [u32::MAX, 0, 0x7FFF_F000] {
        let path = dir.path().join(format!("streamed-{size:x}.wav"));
        std::fs::write(&path, streamed_wav(size)).unwrap();
        let (code, out, err) = run(&[path.to_str().unwrap()]);
        assert_eq!(code, 0, "size {size:#x}: {err}");
        assert_eq!(segment_lines(&out), expected, "size {size:#x}");
        assert!(out.contains("10.12 s, 316 windows"), "{out}");
    }
}

#[test]
fn a_dash_reads_the_wav_from_stdin() {
    let (_, reference, _) = run(&[&speech()]);
    let expected = segment_lines(&reference);
    for bytes in [std::fs::read(speech()).unwrap(), streamed_wav(u32::MAX)] {
        let out = run_with(&["--repeat", "2", "-"], &bytes);
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert_eq!(out.status.code(), Some(0));
        // Read once, processed twice.
        assert_eq!(
            segment_lines(&stdout),
            [&expected[..], &expected[..]].concat()
        );
        assert!(stdout.starts_with("-: 10.12 s, 316 windows"), "{stdout}");
    }
    // Not a WAV on stdin: an error naming `-`.
    let out = run_with(&["-"], b"hello");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("tensor-vad: -: not a RIFF file"), "{err}");
    // Twice is a usage error.
    let (code, out, err) = run(&["-", "-"]);
    assert_eq!(code, 2);
    assert!(out.is_empty());
    assert!(err.contains("only once"), "{err}");
}

/// Checks that `v[key]` is a number (as f64).
fn num(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("`{key}` is not a number in {v}"))
}

#[test]
fn json_document_schema() {
    let wav = speech();
    let missing = common::data_path("no-such.wav");
    let out = run_with(
        &["--json", "--probs", &wav, missing.to_str().unwrap(), "-"],
        &streamed_wav(0),
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("no-such.wav: cannot read WAV file"),
        "{stderr}"
    );
    let doc: Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON document");

    assert_eq!(doc["sample_rate"], 16000);
    assert_eq!(doc["window_samples"], 512);
    let settings = &doc["settings"];
    assert_eq!(num(settings, "threshold"), 0.5);
    assert!((num(settings, "neg_threshold") - 0.35).abs() < 1e-12);
    for key in ["min_speech_ms", "min_silence_ms", "speech_pad_ms"] {
        assert!(settings[key].is_u64(), "{key}");
    }

    let files = doc["files"].as_array().expect("files");
    assert_eq!(files.len(), 3);
    // In the order given, whatever the worker took them.
    assert_eq!(files[0]["file"], wav.as_str());
    assert_eq!(files[2]["file"], "-");
    for f in [&files[0], &files[2]] {
        assert!(f.get("error").is_none(), "{f}");
        assert_eq!(f["samples"], 161_895);
        assert_eq!(f["windows"], 316);
        assert!((num(f, "duration_secs") - 161_895.0 / 16000.0).abs() < 1e-9);
        for key in ["worker", "runs"] {
            assert!(f[key].is_u64(), "{key}");
        }
        let session = &f["session"];
        for key in [
            "runs",
            "planned_runs",
            "backing_allocs",
            "reserved_bytes",
            "shrinks",
        ] {
            assert!(session[key].is_u64(), "session.{key}: {session}");
        }
        let segs = f["segments"].as_array().expect("segments");
        let bounds: Vec<(f64, f64)> = segs
            .iter()
            .map(|s| {
                let (a, b) = (
                    s["start_sample"].as_u64().unwrap(),
                    s["end_sample"].as_u64().unwrap(),
                );
                assert_eq!(num(s, "start_secs"), a as f64 / 16000.0);
                assert_eq!(num(s, "end_secs"), b as f64 / 16000.0);
                (num(s, "start_secs"), num(s, "end_secs"))
            })
            .collect();
        assert_eq!(bounds, [(0.514, 3.262), (4.354, 6.846), (8.066, 9.310)]);
        let probs = f["probs"].as_array().expect("probs with --probs");
        assert_eq!(probs.len(), 316);
        assert!(probs
            .iter()
            .all(|p| (0.0..=1.0).contains(&p.as_f64().unwrap())));
        // Speech at 1 s, silence before 0.4 s (see the segments).
        assert!(probs[31].as_f64().unwrap() > 0.5 && probs[5].as_f64().unwrap() < 0.35);
    }
    assert_eq!(files[1]["file"], missing.to_str().unwrap());
    assert!(files[1]["error"]
        .as_str()
        .unwrap()
        .contains("cannot read WAV file"));
    assert!(files[1].get("segments").is_none());

    let summary = &doc["summary"];
    assert_eq!(summary["files"], 2);
    assert_eq!(summary["failed"], 1);
    assert_eq!(summary["windows"], 632);
    assert_eq!(summary["workers"], 1);
    assert!(summary["runs"].is_u64());
    assert!(num(summary, "audio_secs") > 20.0 && num(summary, "wall_secs") > 0.0);

    // Without --probs there are no probabilities.
    let out = run_with(&["--json", &wav], b"");
    assert_eq!(out.status.code(), Some(0));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(doc["files"][0].get("probs").is_none());
}
