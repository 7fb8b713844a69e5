//! The `tensor-vad` command, end to end.

mod common;

use std::process::Command;

fn tensor_vad(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tensor-vad"))
        .args(args)
        .output()
        .expect("run tensor-vad");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn prints_segments_and_stats_per_file_in_order() {
    let wav = common::data_path("speech.wav");
    let wav = wav.to_str().unwrap();
    let (code, out, err) = tensor_vad(&[
        "--workers",
        "2",
        "--chunk-windows",
        "100",
        "--shrink-policy",
        "below:2",
        wav,
        wav,
    ]);
    assert_eq!(code, 0, "{err}");
    println!("{out}");
    // Two files, each: header, 3 segments, stats.
    let headers: Vec<&str> = out.lines().filter(|l| l.starts_with(wav)).collect();
    assert_eq!(headers.len(), 2);
    assert!(
        headers[0].contains("316 windows in 4 runs"),
        "{}",
        headers[0]
    );
    assert_eq!(out.matches("  speech ").count(), 6);
    assert!(out.contains("  speech    0.514 s -    3.262 s"), "{out}");
    assert!(out.contains("  speech    8.066 s -    9.310 s"), "{out}");
    assert_eq!(out.matches("  session ").count(), 2);
    assert!(out.contains("backing calls"));
    assert!(out.contains("2 files (20.2 s of audio, 632 windows) in 8 runs on 2 workers"));
    assert!(out
        .lines()
        .any(|l| l.starts_with("pool: 2 clones, runs 8, planned ")));
}

#[test]
fn bad_files_fail_alone_and_bad_usage_is_2() {
    let wav = common::data_path("speech.wav");
    let missing = common::data_path("no-such.wav");
    let (code, out, err) = tensor_vad(&[missing.to_str().unwrap(), wav.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("no-such.wav: cannot read WAV file"), "{err}");
    assert!(!out.contains("no-such.wav"), "{out}");
    assert_eq!(out.matches("  speech ").count(), 3);
    assert!(err.contains("1 of 2 files failed"), "{err}");

    let (code, _, err) = tensor_vad(&["--shrink-policy", "sometimes", wav.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        err.contains("expected manual, every-run or below:N"),
        "{err}"
    );
    let (code, _, _) = tensor_vad(&[]);
    assert_eq!(code, 2);
}
