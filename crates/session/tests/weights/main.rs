//! `Weights`: loading safetensors files (mapped and copied), typed views, what happens to a
//! mapped file's users when the file changes, and every malformed-file case we know of.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use safetensors::tensor::TensorView as StView;
use safetensors::{Dtype as StDtype, SafeTensors};
use tensor_session::{
    Dtype, LoadMode, MmapAck, Weights, WeightsError, MAX_HEADER_LEN, OWNED_ALIGN,
};

/// `LoadMode::Mmap`, acknowledged once for the ordinary tests of this file.
// SAFETY: every file these tests map is written by the test itself, in a fresh temporary
// directory of its own, and while mapped it is at most deleted, renamed over or appended to,
// all allowed by `MmapAck::new`. The two tests that break the promise to show the hazard
// (`overwritten_in_place_...`, `truncated_while_mapped_...`) make their own acknowledgement
// and say at that call why they stay sound.
const MMAP: LoadMode = LoadMode::Mmap(unsafe { MmapAck::new() });

const MODES: [LoadMode; 2] = [MMAP, LoadMode::Copy];

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A fresh directory, unique to the caller, with its canonical path (what the kernel shows
/// in `/proc/self/maps` and `/proc/self/fd`).
fn temp_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("tensor-session-weights-")
        .tempdir()
        .expect("create temp dir");
    let canonical = dir.path().canonicalize().expect("canonicalize temp dir");
    (dir, canonical)
}

fn le_bytes_f32(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn le_bytes_f64(values: &[f64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn embed_values() -> Vec<f32> {
    (0..12).map(|i| i as f32 * 0.5 - 1.0).collect()
}

/// The tensors of the sample file: one of most kinds, including a scalar and an empty tensor.
fn sample_tensors() -> Vec<(String, StDtype, Vec<usize>, Vec<u8>)> {
    let t = |name: &str, dtype, shape: &[usize], data: Vec<u8>| {
        (name.to_owned(), dtype, shape.to_vec(), data)
    };
    vec![
        t(
            "embed",
            StDtype::F32,
            &[4, 3],
            le_bytes_f32(&embed_values()),
        ),
        t(
            "bias",
            StDtype::F64,
            &[3],
            le_bytes_f64(&[0.25, -8.0, 1e10]),
        ),
        t(
            "ids",
            StDtype::I64,
            &[2],
            [7i64, -3].iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
        t("half", StDtype::BF16, &[2, 2], vec![1, 2, 3, 4, 5, 6, 7, 8]),
        t("mask", StDtype::U8, &[5], vec![9, 8, 7, 6, 5]),
        t("flag", StDtype::BOOL, &[3], vec![1, 0, 1]),
        t("scalar", StDtype::F32, &[], le_bytes_f32(&[42.0])),
        t("empty", StDtype::F32, &[0], Vec::new()),
    ]
}

fn st_views(tensors: &[(String, StDtype, Vec<usize>, Vec<u8>)]) -> Vec<(String, StView<'_>)> {
    tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            let view = StView::new(*dtype, shape.clone(), data).expect("valid sample tensor");
            (name.clone(), view)
        })
        .collect()
}

fn sample_metadata() -> Option<HashMap<String, String>> {
    Some(HashMap::from([("format".to_owned(), "pt".to_owned())]))
}

/// Writes the sample file with the safetensors crate.
fn write_sample(path: &Path) {
    let tensors = sample_tensors();
    safetensors::serialize_to_file(st_views(&tensors), sample_metadata(), path)
        .expect("serialize_to_file");
}

/// The sample file's bytes, from the safetensors crate.
fn sample_image() -> Vec<u8> {
    let tensors = sample_tensors();
    safetensors::serialize(st_views(&tensors), sample_metadata()).expect("serialize")
}

/// A file image from a header text and a data section.
fn image(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// Replaces `from` by `to` (same length) in the header of a file image.
fn patch_header(mut img: Vec<u8>, from: &str, to: &str) -> Vec<u8> {
    assert_eq!(from.len(), to.len(), "patches keep the header length");
    let n = u64::from_le_bytes(img[..8].try_into().unwrap()) as usize;
    let header = &img[8..8 + n];
    let at = header
        .windows(from.len())
        .position(|w| w == from.as_bytes())
        .unwrap_or_else(|| panic!("`{from}` not in header {}", String::from_utf8_lossy(header)));
    img[8 + at..8 + at + to.len()].copy_from_slice(to.as_bytes());
    img
}

fn maps_mention(path: &Path) -> bool {
    let p = path.to_str().expect("UTF-8 temp path");
    let deleted = format!("{p} (deleted)");
    fs::read_to_string("/proc/self/maps")
        .expect("read /proc/self/maps")
        .lines()
        .any(|line| line.ends_with(p) || line.ends_with(&deleted))
}

fn fds_mention(path: &Path) -> bool {
    let deleted = PathBuf::from(format!("{} (deleted)", path.display()));
    fs::read_dir("/proc/self/fd")
        .expect("read /proc/self/fd")
        .filter_map(|entry| fs::read_link(entry.ok()?.path()).ok())
        .any(|target| target == path || target == deleted)
}

/// Checks a loaded `Weights` against the safetensors crate's own reading of the same bytes.
fn assert_matches_safetensors(w: &Weights, file: &[u8]) {
    let st = SafeTensors::deserialize(file).expect("the crate reads it");
    assert_eq!(w.len(), st.len());
    let mut total = 0;
    for (name, view) in st.tensors() {
        let ours = w.get(&name).unwrap_or_else(|| panic!("missing `{name}`"));
        assert_eq!(ours.name(), name);
        assert_eq!(ours.dtype().name(), view.dtype().to_string());
        assert_eq!(ours.shape(), view.shape());
        assert_eq!(ours.bytes(), view.data(), "bytes of `{name}`");
        assert_eq!(
            ours.len_elements(),
            view.shape().iter().product::<usize>(),
            "elements of `{name}`"
        );
        total += view.data().len();
    }
    assert_eq!(w.total_bytes(), total);
}

/// Writes `bytes` to a fresh file called `name`, opens it both ways, and checks that both
/// fail alike with a message naming the file. Returns the `Mmap` error.
fn open_err(bytes: &[u8], name: &str) -> WeightsError {
    let (_dir, dir) = temp_dir();
    let path = dir.join(name);
    fs::write(&path, bytes).expect("write test file");
    let errs: Vec<WeightsError> = MODES
        .iter()
        .map(|&mode| match Weights::open(&path, mode) {
            Ok(w) => panic!("{mode:?}: {name} should not load, got {w:?}"),
            Err(err) => err,
        })
        .collect();
    for err in &errs {
        let msg = err.to_string();
        assert!(msg.contains(name), "message should name the file: {msg}");
    }
    assert_eq!(
        std::mem::discriminant(&errs[0]),
        std::mem::discriminant(&errs[1]),
        "both modes should fail alike: {:?} vs {:?}",
        errs[0],
        errs[1]
    );
    errs.into_iter().next().expect("two errors")
}

mod malformed;
mod mapped;
mod properties;
mod round_trip;
