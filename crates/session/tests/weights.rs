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

// ---------------------------------------------------------------------------------------------
// Round trip, views, in-memory weights
// ---------------------------------------------------------------------------------------------

#[test]
fn round_trip_both_modes() {
    let (_dir, dir) = temp_dir();
    let path = dir.join("round_trip.safetensors");
    write_sample(&path);
    let file = fs::read(&path).unwrap();

    for mode in MODES {
        let w = Weights::open(&path, mode).expect("open sample");
        assert_eq!(w.is_mapped(), mode == MMAP);
        assert_eq!(w.path(), Some(path.as_path()));
        assert!(!w.is_empty());
        assert_matches_safetensors(&w, &file);

        // Names come in offset order, and file ranges point at the bytes in the file.
        let starts: Vec<usize> = w.iter().map(|t| t.file_range().unwrap().start).collect();
        assert!(starts.windows(2).all(|p| p[0] <= p[1]), "{starts:?}");
        assert_eq!(w.names().count(), sample_tensors().len());
        for t in w.iter() {
            assert_eq!(&file[t.file_range().unwrap()], t.bytes());
        }

        let embed = w.get("embed").unwrap();
        assert_eq!(embed.dtype(), Dtype::F32);
        assert_eq!(embed.shape(), &[4, 3]);
        assert_eq!(embed.len_elements(), 12);
        assert_eq!(
            embed.try_as_slice::<f32>().unwrap(),
            embed_values().as_slice()
        );
        assert_eq!(
            w.get("bias").unwrap().try_as_slice::<f64>().unwrap(),
            &[0.25, -8.0, 1e10]
        );
        assert_eq!(
            w.get("ids").unwrap().to_vec_of::<i64>().unwrap(),
            vec![7, -3]
        );
        assert_eq!(w.get("scalar").unwrap().shape(), &[] as &[usize]);
        assert_eq!(w.get("scalar").unwrap().len_elements(), 1);
        assert_eq!(
            w.get("empty").unwrap().try_as_slice::<f32>().unwrap(),
            &[] as &[f32]
        );
        assert_eq!(w.get("flag").unwrap().dtype(), Dtype::Bool);
        assert_eq!(w.get("half").unwrap().dtype(), Dtype::Bf16);
        assert!(w.get("nope").is_none());
        assert!(
            w.get("format").is_none(),
            "__metadata__ entries are not tensors"
        );
    }
}

#[test]
fn copy_mode_buffer_is_64_byte_aligned() {
    let (_dir, dir) = temp_dir();
    let path = dir.join("aligned.safetensors");
    write_sample(&path);
    let w = Weights::open(&path, LoadMode::Copy).unwrap();
    let embed = w.get("embed").unwrap();
    let file_start = embed.bytes().as_ptr() as usize - embed.file_range().unwrap().start;
    assert_eq!(file_start % OWNED_ALIGN, 0);
}

#[test]
fn empty_header_is_valid_and_empty() {
    for header in ["{}", "{}      ", r#"{"__metadata__":{"a":"b"}}"#] {
        let (_dir, dir) = temp_dir();
        let path = dir.join("empty_header.safetensors");
        fs::write(&path, image(header, &[])).unwrap();
        for mode in MODES {
            let w = Weights::open(&path, mode).unwrap();
            assert!(w.is_empty());
            assert_eq!((w.len(), w.total_bytes(), w.names().count()), (0, 0, 0));
        }
    }
}

#[test]
fn from_tensors_packs_aligned_and_keeps_order() {
    let w = Weights::from_tensors([
        ("b", Dtype::U8, vec![3], vec![1u8, 2, 3]),
        ("a", Dtype::F32, vec![2], le_bytes_f32(&[1.5, -2.0])),
        ("c", Dtype::F64, vec![1, 1], le_bytes_f64(&[9.0])),
    ])
    .unwrap();
    assert_eq!(w.names().collect::<Vec<_>>(), ["b", "a", "c"]);
    assert_eq!(w.len(), 3);
    assert_eq!(w.total_bytes(), 3 + 8 + 8);
    assert!(!w.is_mapped());
    assert_eq!(w.path(), None);
    for t in w.iter() {
        assert_eq!(t.bytes().as_ptr() as usize % OWNED_ALIGN, 0, "{}", t.name());
        assert_eq!(t.file_range(), None);
    }
    assert_eq!(
        w.get("a").unwrap().try_as_slice::<f32>().unwrap(),
        &[1.5, -2.0]
    );
    assert_eq!(w.get("c").unwrap().try_as_slice::<f64>().unwrap(), &[9.0]);
    let copy = w.to_owned_copy();
    assert_eq!(copy.get("b").unwrap().bytes(), &[1, 2, 3]);

    // Borrowed slices and arrays work as shapes and bytes too.
    let w = Weights::from_tensors([("s", Dtype::I16, [2usize], &[1u8, 0, 2, 0][..])]).unwrap();
    assert_eq!(w.get("s").unwrap().try_as_slice::<i16>().unwrap(), &[1, 2]);
}

#[test]
fn from_tensors_rejects_bad_input() {
    let err = Weights::from_tensors([
        ("x", Dtype::U8, vec![1], vec![0u8]),
        ("x", Dtype::U8, vec![1], vec![0u8]),
    ])
    .unwrap_err();
    assert!(matches!(&err, WeightsError::DuplicateName { tensor, path: None } if tensor == "x"));
    assert!(err.to_string().contains("in-memory weights"), "{err}");

    let err = Weights::from_tensors([("y", Dtype::F32, vec![3], vec![0u8; 8])]).unwrap_err();
    assert!(
        matches!(
            &err,
            WeightsError::LengthMismatch { tensor, expected: Some(12), actual: 8, .. } if tensor == "y"
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("`y`"), "{err}");

    let err =
        Weights::from_tensors([("z", Dtype::F64, vec![usize::MAX, 2], vec![0u8; 8])]).unwrap_err();
    assert!(
        matches!(err, WeightsError::LengthMismatch { expected: None, .. }),
        "{err:?}"
    );
}

#[test]
fn typed_view_wrong_element_size() {
    let (_dir, dir) = temp_dir();
    let path = dir.join("wrong_size.safetensors");
    write_sample(&path);
    for mode in MODES {
        let w = Weights::open(&path, mode).unwrap();
        let embed = w.get("embed").unwrap();
        for err in [
            embed.try_as_slice::<f64>().unwrap_err(),
            embed.as_cow::<u16>().unwrap_err(),
            embed.to_vec_of::<u8>().unwrap_err(),
        ] {
            assert!(
                matches!(&err, WeightsError::DtypeSizeMismatch { tensor, dtype: Dtype::F32, .. } if tensor == "embed"),
                "{err:?}"
            );
            assert!(err.to_string().contains("wrong_size.safetensors"), "{err}");
        }
        // Same size, other type: allowed (raw bits)...
        assert_eq!(embed.try_as_slice::<u32>().unwrap().len(), 12);
        // ...but not by the dtype-checked view.
        let err = embed.typed::<u32>().unwrap_err();
        assert!(
            matches!(
                &err,
                WeightsError::DtypeMismatch {
                    dtype: Dtype::F32,
                    requested: Dtype::U32,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("not U32"), "{err}");
        assert_eq!(embed.typed::<f32>().unwrap().len(), 12);
        assert_eq!(
            w.get("half").unwrap().try_as_slice::<u16>().unwrap(),
            &[0x0201, 0x0403, 0x0605, 0x0807]
        );
    }
}

/// Safetensors does not align data offsets. Two ways to get a misaligned F32: a U8 tensor of
/// odd length before it, or a header length that puts the data section at an odd offset.
#[test]
fn misaligned_tensor_errors_borrowed_and_copies_in_cow() {
    let values = [1.5f32, -2.25, 3.0e-7];
    let f32s = le_bytes_f32(&values);

    // (a) U8 of length 1 first; header padded so the data section starts 8-aligned.
    let mut header_a = String::from(
        r#"{"pad":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"vals":{"dtype":"F32","shape":[3],"data_offsets":[1,13]}}"#,
    );
    while (8 + header_a.len()) % 8 != 0 {
        header_a.push(' ');
    }
    let mut data_a = vec![0xEE];
    data_a.extend_from_slice(&f32s);

    // (b) Header length odd: the data section itself starts at an odd file offset.
    let mut header_b =
        String::from(r#"{"vals":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}}"#);
    if (8 + header_b.len()) % 2 == 0 {
        header_b.push(' ');
    }

    let (_dir, dir) = temp_dir();
    for (name, img) in [
        ("misaligned_a.safetensors", image(&header_a, &data_a)),
        ("misaligned_b.safetensors", image(&header_b, &f32s)),
    ] {
        let path = dir.join(name);
        fs::write(&path, &img).unwrap();
        for mode in MODES {
            let w = Weights::open(&path, mode).unwrap();
            let vals = w.get("vals").unwrap();
            assert_ne!(
                vals.bytes().as_ptr() as usize % 4,
                0,
                "test setup: misaligned"
            );

            let err = vals.try_as_slice::<f32>().unwrap_err();
            assert!(
                matches!(&err, WeightsError::Misaligned { tensor, required_align: 4, .. } if tensor == "vals"),
                "{err:?}"
            );
            assert!(err.to_string().contains(name), "{err}");

            let cow = vals.as_cow::<f32>().unwrap();
            assert!(matches!(cow, std::borrow::Cow::Owned(_)));
            assert_eq!(&*cow, &values);
            assert_eq!(vals.to_vec_of::<f32>().unwrap(), values);
            // Byte-sized views are always aligned.
            assert_eq!(vals.try_as_slice::<[u8; 4]>().unwrap().len(), 3);
        }
    }

    // Aligned tensors borrow.
    let w = Weights::from_tensors([("v", Dtype::F32, vec![3], f32s)]).unwrap();
    let cow = w.get("v").unwrap().as_cow::<f32>().unwrap();
    assert!(matches!(cow, std::borrow::Cow::Borrowed(_)));
}

#[test]
fn weights_is_send_sync_and_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Weights>();
    assert_send_sync::<Arc<Weights>>();

    let (_dir, dir) = temp_dir();
    let path = dir.join("threads.safetensors");
    write_sample(&path);
    let w = Arc::new(Weights::open(&path, MMAP).unwrap());
    let sums: Vec<f32> = (0..4)
        .map(|_| {
            let w = Arc::clone(&w);
            std::thread::spawn(move || {
                w.get("embed")
                    .unwrap()
                    .try_as_slice::<f32>()
                    .unwrap()
                    .iter()
                    .sum()
            })
        })
        .map(|h| h.join().unwrap())
        .collect();
    let want: f32 = embed_values().iter().sum();
    assert!(sums.iter().all(|&s| s == want));
}

// ---------------------------------------------------------------------------------------------
// Linux: mapping lifetime, seen from /proc, and files changed under a map
// ---------------------------------------------------------------------------------------------

#[cfg(target_os = "linux")]
#[test]
fn mmap_stays_in_proc_maps_until_last_clone_drops() {
    let (_dir, dir) = temp_dir();
    let path = dir.join("lifetime.safetensors");
    write_sample(&path);
    assert!(!maps_mention(&path));

    let w = Arc::new(Weights::open(&path, MMAP).unwrap());
    assert!(maps_mention(&path), "mapped after open");
    assert!(!fds_mention(&path), "the descriptor is closed once mapped");

    let arc2 = Arc::clone(&w);
    let handle_clone: Weights = (*w).clone();
    drop(w);
    assert!(maps_mention(&path), "an Arc clone keeps the map");
    drop(arc2);
    assert!(maps_mention(&path), "a Weights clone keeps the map");

    // The last user lives on another thread.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let worker = std::thread::spawn(move || {
        let embed = handle_clone
            .get("embed")
            .unwrap()
            .to_vec_of::<f32>()
            .unwrap();
        rx.recv().unwrap();
        drop(handle_clone);
        embed
    });
    assert!(maps_mention(&path), "the worker's clone keeps the map");
    tx.send(()).unwrap();
    assert_eq!(worker.join().unwrap(), embed_values());
    assert!(
        !maps_mention(&path),
        "unmapped after the last clone dropped"
    );
}

#[cfg(target_os = "linux")]
#[test]
fn copy_mode_holds_no_map_no_fd_and_survives_delete() {
    let (_dir, dir) = temp_dir();
    let path = dir.join("copied.safetensors");
    write_sample(&path);
    let file = fs::read(&path).unwrap();

    let w = Weights::open(&path, LoadMode::Copy).unwrap();
    assert!(!w.is_mapped());
    assert!(!maps_mention(&path), "copy mode maps nothing");
    assert!(!fds_mention(&path), "copy mode closes the file");

    fs::remove_file(&path).unwrap();
    assert_matches_safetensors(&w, &file);
    assert_eq!(
        w.get("embed").unwrap().try_as_slice::<f32>().unwrap(),
        embed_values().as_slice()
    );
}

#[cfg(target_os = "linux")]
#[test]
fn to_owned_copy_detaches_from_the_map() {
    let (_dir, dir) = temp_dir();
    let path = dir.join("detach.safetensors");
    write_sample(&path);
    let file = fs::read(&path).unwrap();

    let mapped = Weights::open(&path, MMAP).unwrap();
    let copy = mapped.to_owned_copy();
    assert!(mapped.is_mapped());
    assert!(!copy.is_mapped());
    assert_eq!(copy.path(), Some(path.as_path()));
    assert!(maps_mention(&path));

    drop(mapped);
    assert!(!maps_mention(&path), "the copy does not keep the map");
    fs::remove_file(&path).unwrap();
    assert_matches_safetensors(&copy, &file);
    // The copy keeps file offsets, so alignment is as in the file.
    for t in copy.iter() {
        assert_eq!(&file[t.file_range().unwrap()], t.bytes());
    }
}

#[cfg(target_os = "linux")]
#[test]
fn deleted_while_mapped_bytes_stay_valid() {
    let (_dir, dir) = temp_dir();
    let path = dir.join("deleted.safetensors");
    write_sample(&path);
    let file = fs::read(&path).unwrap();

    let w = Weights::open(&path, MMAP).unwrap();
    fs::remove_file(&path).unwrap();
    let deleted = format!("{} (deleted)", path.display());
    let maps = fs::read_to_string("/proc/self/maps").unwrap();
    assert!(
        maps.lines().any(|l| l.ends_with(&deleted)),
        "the map keeps the unlinked inode"
    );
    assert_matches_safetensors(&w, &file);
    drop(w);
    assert!(!maps_mention(&path));
}

#[cfg(target_os = "linux")]
#[test]
fn replaced_by_rename_while_mapped_old_bytes_stay_valid() {
    let (_dir, dir) = temp_dir();
    let path = dir.join("replaced.safetensors");
    write_sample(&path);
    let old_file = fs::read(&path).unwrap();
    let mapped = Weights::open(&path, MMAP).unwrap();
    let copied = Weights::open(&path, LoadMode::Copy).unwrap();

    // Write a different model next to it and rename it over the old one (atomic update).
    let new_values = [10.0f32, 20.0, 30.0];
    let staging = dir.join("replaced.safetensors.tmp");
    let new_data = le_bytes_f32(&new_values);
    let new_tensors = vec![("embed".to_owned(), StDtype::F32, vec![3], new_data)];
    safetensors::serialize_to_file(st_views(&new_tensors), None, &staging).unwrap();
    fs::rename(&staging, &path).unwrap();

    for old in [&mapped, &copied] {
        assert_matches_safetensors(old, &old_file);
        assert_eq!(
            old.get("embed").unwrap().try_as_slice::<f32>().unwrap(),
            embed_values().as_slice()
        );
    }
    let fresh = Weights::open(&path, MMAP).unwrap();
    assert_eq!(fresh.len(), 1);
    assert_eq!(
        fresh.get("embed").unwrap().try_as_slice::<f32>().unwrap(),
        &new_values
    );
}

/// Demonstrates the hazard the docs describe, in one thread and without holding a borrow
/// across the write: the mapped bytes follow the file, the copied ones do not.
#[cfg(target_os = "linux")]
#[test]
fn overwritten_in_place_mapped_bytes_change_copied_do_not() {
    use std::os::unix::fs::FileExt;

    let (_dir, dir) = temp_dir();
    let path = dir.join("overwritten.safetensors");
    write_sample(&path);
    // SAFETY: this test writes into the mapped file on purpose, to show the hazard. No
    // reference into the map is held across the write (each `bytes()` below is a new
    // borrow, taken after it), and no other thread reads the map meanwhile, so the change
    // is seen as a plain sequence of reads, not as a data race.
    let mapped = Weights::open(&path, LoadMode::Mmap(unsafe { MmapAck::new() })).unwrap();
    let copied = Weights::open(&path, LoadMode::Copy).unwrap();
    let range = mapped.get("mask").unwrap().file_range().unwrap();

    let new_bytes = [0xA0u8, 0xA1, 0xA2, 0xA3, 0xA4];
    let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(&new_bytes, range.start as u64).unwrap();
    drop(file);

    assert_eq!(mapped.get("mask").unwrap().bytes(), &new_bytes);
    assert_eq!(copied.get("mask").unwrap().bytes(), &[9, 8, 7, 6, 5]);
}

#[cfg(target_os = "linux")]
#[test]
fn extended_while_mapped_map_keeps_its_length() {
    use std::io::Write;

    let (_dir, dir) = temp_dir();
    let path = dir.join("extended.safetensors");
    write_sample(&path);
    let file = fs::read(&path).unwrap();
    let w = Weights::open(&path, MMAP).unwrap();
    fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(&[0xCC; 10_000])
        .unwrap();
    assert_matches_safetensors(&w, &file);
    // Reopening sees the appended bytes, which break the file's coverage rule.
    let err = Weights::open(&path, MMAP).unwrap_err();
    assert!(matches!(err, WeightsError::TrailingBytes { .. }), "{err:?}");
}

/// Set in the child process of `truncated_while_mapped_raises_sigbus`.
#[cfg(target_os = "linux")]
const SIGBUS_CHILD_FILE: &str = "TENSOR_SESSION_TEST_SIGBUS_CHILD_FILE";

/// Truncating a mapped file makes a later read past the new end raise SIGBUS. Checked in a
/// child process (this same test binary, running only this test), since the signal kills it.
#[cfg(target_os = "linux")]
#[test]
fn truncated_while_mapped_raises_sigbus() {
    use std::os::unix::process::ExitStatusExt;

    if let Some(path) = std::env::var_os(SIGBUS_CHILD_FILE) {
        let path = PathBuf::from(path);
        // SAFETY: not kept, on purpose: this child process truncates the mapped file and
        // then reads a lost page, which raises SIGBUS and kills it before the read returns
        // any byte; the parent checks exactly that.
        let w = Weights::open(&path, LoadMode::Mmap(unsafe { MmapAck::new() })).unwrap();
        let big = w.get("big").unwrap();
        let first = big.bytes()[0];
        fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        eprintln!("child: file truncated, reading the last page");
        let bytes = std::hint::black_box(big.bytes());
        let last = bytes[bytes.len() - 1];
        eprintln!("child: no SIGBUS (read {first} and {last})");
        std::process::exit(0);
    }

    let (_dir, dir) = temp_dir();
    let path = dir.join("truncated.safetensors");
    let big = vec![0x5Au8; 256 * 1024];
    let tensors = vec![("big".to_owned(), StDtype::U8, vec![big.len()], big)];
    safetensors::serialize_to_file(st_views(&tensors), None, &path).unwrap();

    // The harness names tests by their module path without the crate name.
    let test_name = match module_path!().split_once("::") {
        Some((_crate, module)) => format!("{module}::truncated_while_mapped_raises_sigbus"),
        None => "truncated_while_mapped_raises_sigbus".to_owned(),
    };
    let exe = std::env::current_exe().unwrap();
    // `ulimit -c 0`: no core file from the expected crash.
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -c 0; exec \"$0\" \"$@\"")
        .arg(&exe)
        .args(["--exact", &test_name, "--test-threads=1", "--nocapture"])
        .env(SIGBUS_CHILD_FILE, &path)
        .output()
        .unwrap();
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGBUS),
        "child should die of SIGBUS; status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("child: file truncated"));

    // Copy mode does not care: the same sequence is harmless.
    let tensors = vec![("big".to_owned(), StDtype::U8, vec![4096], vec![7u8; 4096])];
    safetensors::serialize_to_file(st_views(&tensors), None, &path).unwrap();
    let w = Weights::open(&path, LoadMode::Copy).unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
    assert!(w.get("big").unwrap().bytes().iter().all(|&b| b == 7));
}

// ---------------------------------------------------------------------------------------------
// Malformed files
// ---------------------------------------------------------------------------------------------

#[test]
fn missing_file() {
    let (_dir, dir) = temp_dir();
    let path = dir.join("missing.safetensors");
    for mode in MODES {
        let err = Weights::open(&path, mode).unwrap_err();
        assert!(
            matches!(&err, WeightsError::NotFound { path: p } if p == &path),
            "{err:?}"
        );
        assert!(err.to_string().contains("missing.safetensors"), "{err}");
    }
}

#[test]
fn directory_is_not_a_weights_file() {
    let (_dir, dir) = temp_dir();
    let sub = dir.join("a_directory.safetensors");
    fs::create_dir(&sub).unwrap();
    for mode in MODES {
        let err = Weights::open(&sub, mode).unwrap_err();
        assert!(matches!(err, WeightsError::Io { .. }), "{err:?}");
        assert!(err.to_string().contains("a_directory.safetensors"), "{err}");
    }
}

#[test]
fn empty_file() {
    let err = open_err(&[], "empty.safetensors");
    assert!(
        matches!(err, WeightsError::FileTooSmall { len: 0, .. }),
        "{err:?}"
    );
}

#[test]
fn seven_byte_file() {
    let img = sample_image();
    let err = open_err(&img[..7], "seven.safetensors");
    assert!(
        matches!(err, WeightsError::FileTooSmall { len: 7, .. }),
        "{err:?}"
    );
}

#[test]
fn header_length_past_eof() {
    let img = sample_image();
    let n = u64::from_le_bytes(img[..8].try_into().unwrap()) as usize;

    // Cut inside the header.
    let err = open_err(&img[..8 + n - 1], "cut_header.safetensors");
    assert!(
        matches!(err, WeightsError::HeaderPastEof { header_len, file_len, .. }
            if header_len == n as u64 && file_len == (8 + n - 1) as u64),
        "{err:?}"
    );

    // Header length bigger than the file, but within the limit (the limit itself included).
    for len in [img.len() as u64, MAX_HEADER_LEN] {
        let mut bad = img.clone();
        bad[..8].copy_from_slice(&len.to_le_bytes());
        let err = open_err(&bad, "long_header.safetensors");
        assert!(matches!(err, WeightsError::HeaderPastEof { .. }), "{err:?}");
    }
}

#[test]
fn header_length_over_limit() {
    for len in [u64::MAX, MAX_HEADER_LEN + 1, 1 << 40] {
        let mut bad = sample_image();
        bad[..8].copy_from_slice(&len.to_le_bytes());
        let err = open_err(&bad, "huge_header.safetensors");
        assert!(
            matches!(err, WeightsError::HeaderTooLarge { header_len, .. } if header_len == len),
            "{err:?}"
        );
        assert!(err.to_string().contains("100000000"), "{err}");
    }
    // Just the 8 bytes, nothing else.
    let err = open_err(&u64::MAX.to_le_bytes(), "only_len.safetensors");
    assert!(
        matches!(err, WeightsError::HeaderTooLarge { .. }),
        "{err:?}"
    );
}

#[test]
fn header_not_utf8() {
    let mut bad = sample_image();
    bad[9] = 0xFF;
    let err = open_err(&bad, "not_utf8.safetensors");
    assert!(matches!(err, WeightsError::HeaderNotUtf8 { .. }), "{err:?}");
}

#[test]
fn bad_json() {
    let cases: [(&str, Vec<u8>); 5] = [
        ("syntax.safetensors", {
            let mut img = sample_image();
            img[8] = b'x'; // the opening brace
            img
        }),
        ("array.safetensors", image("[]", &[])),
        ("string_entry.safetensors", image(r#"{"a":"F32"}"#, &[])),
        (
            "missing_shape.safetensors",
            image(r#"{"a":{"dtype":"U8","data_offsets":[0,1]}}"#, &[0]),
        ),
        (
            "negative_offset.safetensors",
            image(
                r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}}"#,
                &[0],
            ),
        ),
    ];
    for (name, img) in cases {
        let err = open_err(&img, name);
        assert!(
            matches!(err, WeightsError::BadJson { .. }),
            "{name}: {err:?}"
        );
    }
}

#[test]
fn unknown_dtype() {
    let bad = patch_header(sample_image(), r#""F32""#, r#""F31""#);
    let err = open_err(&bad, "unknown_dtype.safetensors");
    assert!(
        matches!(&err, WeightsError::UnknownDtype { tensor, dtype, .. }
            if dtype == "F31" && ["embed", "scalar", "empty"].contains(&tensor.as_str())),
        "{err:?}"
    );
    assert!(err.to_string().contains("F31"), "{err}");

    // Sub-byte dtypes are valid safetensors, but not supported here.
    let img = image(
        r#"{"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}}"#,
        &[0],
    );
    let err = open_err(&img, "f4.safetensors");
    assert!(
        matches!(&err, WeightsError::UnknownDtype { dtype, .. } if dtype == "F4"),
        "{err:?}"
    );
}

#[test]
fn duplicate_name_in_header() {
    let img = image(
        r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#,
        &[1, 2],
    );
    let err = open_err(&img, "duplicate.safetensors");
    assert!(
        matches!(&err, WeightsError::DuplicateName { tensor, path: Some(_) } if tensor == "a"),
        "{err:?}"
    );
}

#[test]
fn offsets_out_of_range() {
    let img = image(
        r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}"#,
        &[0; 6],
    );
    let err = open_err(&img, "out_of_range.safetensors");
    assert!(
        matches!(&err, WeightsError::OffsetsOutOfRange { tensor, start: 4, end: 8, data_len: 6, .. } if tensor == "b"),
        "{err:?}"
    );

    // Offsets near usize::MAX, chained so that every per-tensor check passes: the sum the
    // safetensors crate computes last would overflow.
    let step = 1u64 << 60;
    let entries: Vec<String> = (0..16u64)
        .map(|i| {
            let (start, end) = (i * step, if i == 15 { u64::MAX } else { (i + 1) * step });
            format!(
                r#""t{i:02}":{{"dtype":"U8","shape":[{}],"data_offsets":[{start},{end}]}}"#,
                end - start
            )
        })
        .collect();
    let img = image(&format!("{{{}}}", entries.join(",")), &[0; 16]);
    let err = open_err(&img, "near_usize_max.safetensors");
    assert!(
        matches!(err, WeightsError::OffsetsOutOfRange { .. }),
        "{err:?}"
    );
}

#[test]
fn truncated_data_section() {
    let img = sample_image();
    for cut in [1, 8, 40] {
        let err = open_err(&img[..img.len() - cut], "truncated_data.safetensors");
        assert!(
            matches!(err, WeightsError::OffsetsOutOfRange { .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("truncated"), "{err}");
    }
}

#[test]
fn trailing_bytes_after_last_tensor() {
    let mut img = sample_image();
    img.extend_from_slice(&[0; 3]);
    let err = open_err(&img, "trailing.safetensors");
    assert!(matches!(err, WeightsError::TrailingBytes { .. }), "{err:?}");
    assert!(
        err.to_string().contains("3 bytes after the last tensor"),
        "{err}"
    );
}

#[test]
fn overlapping_offsets() {
    let img = image(
        r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}"#,
        &[0; 6],
    );
    let err = open_err(&img, "overlap.safetensors");
    assert!(
        matches!(&err, WeightsError::OverlappingTensors { tensor, other, .. } if tensor == "b" && other == "a"),
        "{err:?}"
    );

    // Same bytes claimed twice.
    let img = image(
        r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#,
        &[0; 4],
    );
    let err = open_err(&img, "same_range.safetensors");
    assert!(
        matches!(err, WeightsError::OverlappingTensors { .. }),
        "{err:?}"
    );
}

#[test]
fn gap_between_tensors() {
    let img = image(
        r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}}"#,
        &[0; 6],
    );
    let err = open_err(&img, "gap.safetensors");
    assert!(
        matches!(&err, WeightsError::GapBeforeTensor { tensor, gap_start: 2, gap_end: 4, .. } if tensor == "b"),
        "{err:?}"
    );

    // A gap before the first tensor.
    let img = image(
        r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}"#,
        &[0; 4],
    );
    let err = open_err(&img, "gap_first.safetensors");
    assert!(
        matches!(
            &err,
            WeightsError::GapBeforeTensor {
                gap_start: 0,
                gap_end: 2,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn reversed_offsets() {
    let img = image(
        r#"{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,0]}}"#,
        &[0; 2],
    );
    let err = open_err(&img, "reversed.safetensors");
    assert!(
        matches!(&err, WeightsError::InvalidOffsets { tensor, start: 2, end: 0, .. } if tensor == "b"),
        "{err:?}"
    );
}

#[test]
fn dtype_shape_length_mismatch() {
    // Shape edited in a crate-written file: "embed" claims [4,4] F32 = 64 bytes, has 48.
    let bad = patch_header(sample_image(), "[4,3]", "[4,4]");
    let err = open_err(&bad, "shape_mismatch.safetensors");
    assert!(
        matches!(&err, WeightsError::LengthMismatch { tensor, dtype: Dtype::F32, expected: Some(64), actual: 48, .. }
            if tensor == "embed"),
        "{err:?}"
    );
    assert!(err.to_string().contains("`embed`"), "{err}");

    // Dtype edited: "ids" (I64, 16 bytes) claimed as I32 (8 bytes).
    let bad = patch_header(sample_image(), r#""I64""#, r#""I32""#);
    let err = open_err(&bad, "dtype_mismatch.safetensors");
    assert!(
        matches!(&err, WeightsError::LengthMismatch { tensor, expected: Some(8), actual: 16, .. } if tensor == "ids"),
        "{err:?}"
    );

    // A shape whose byte size overflows.
    let img = image(
        r#"{"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}}"#,
        &[0; 8],
    );
    let err = open_err(&img, "shape_overflow.safetensors");
    assert!(
        matches!(err, WeightsError::LengthMismatch { expected: None, .. }),
        "{err:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Property tests: no input makes the loader panic
// ---------------------------------------------------------------------------------------------

static CASE: AtomicUsize = AtomicUsize::new(0);

/// Whether the safetensors crate reads `bytes` (a panic inside it counts as no).
fn safetensors_reads(bytes: &[u8]) -> bool {
    std::panic::catch_unwind(|| SafeTensors::deserialize(bytes).is_ok()).unwrap_or(false)
}

/// Writes `bytes` to a fresh file, opens it both ways, and checks: both modes agree; a loaded
/// file's tensors lie within the file and hold its bytes; an error names the file; we accept
/// exactly what the safetensors crate accepts, except what we reject on purpose.
fn check_loader(dir: &Path, bytes: &[u8]) -> Result<(), TestCaseError> {
    let name = format!(
        "case_{:06}.safetensors",
        CASE.fetch_add(1, Ordering::Relaxed)
    );
    let path = dir.join(&name);
    fs::write(&path, bytes).expect("write case");
    let results: Vec<Result<Weights, WeightsError>> =
        MODES.iter().map(|&m| Weights::open(&path, m)).collect();
    let crate_reads = safetensors_reads(bytes);
    match (&results[0], &results[1]) {
        (Ok(mapped), Ok(copied)) => {
            // One validator, the same format: what we load, the safetensors crate loads,
            // with the same tensors.
            prop_assert!(crate_reads, "we load what the safetensors crate rejects");
            assert_matches_safetensors(mapped, bytes);
            prop_assert!(mapped.is_mapped() && !copied.is_mapped());
            prop_assert!(mapped.names().eq(copied.names()));
            for w in [mapped, copied] {
                let mut total = 0;
                for t in w.iter() {
                    let range = t.file_range().expect("loaded from a file");
                    prop_assert!(range.start <= range.end && range.end <= bytes.len());
                    prop_assert_eq!(&bytes[range.clone()], t.bytes());
                    prop_assert_eq!(
                        t.bytes().len(),
                        t.len_elements() * t.dtype().size_in_bytes()
                    );
                    prop_assert_eq!(
                        Some(t.len_elements()),
                        t.shape().iter().try_fold(1usize, |a, &d| a.checked_mul(d))
                    );
                    prop_assert!(t.as_cow::<u8>().is_ok() == (t.dtype().size_in_bytes() == 1));
                    total += t.bytes().len();
                }
                prop_assert_eq!(total, w.total_bytes());
                prop_assert!(total <= bytes.len());
            }
        }
        (Err(a), Err(b)) => {
            // We reject all the crate rejects, and more only on purpose: repeated names
            // (the crate lets the last win) and the sub-byte dtypes we do not support.
            let stricter = matches!(a, WeightsError::DuplicateName { .. })
                || matches!(a, WeightsError::UnknownDtype { dtype, .. }
                    if ["F4", "F6_E2M3", "F6_E3M2"].contains(&dtype.as_str()));
            prop_assert!(
                !crate_reads || stricter,
                "the safetensors crate loads it: {}",
                a
            );
            prop_assert_eq!(std::mem::discriminant(a), std::mem::discriminant(b));
            prop_assert!(a.to_string().contains(&name), "{}", a);
        }
        (a, b) => prop_assert!(false, "modes disagree: {:?} vs {:?}", a, b),
    }
    drop(results);
    fs::remove_file(&path).expect("remove case");
    Ok(())
}

/// How a generated header entry departs from a valid one.
#[derive(Debug, Clone)]
enum Twist {
    None,
    ShiftStart(u64),
    ShiftEnd(u64),
    HugeEnd(u64),
    HugeDim(u64),
    Malformed,
}

/// A header (and data length) built to be valid most of the time: tensors laid out
/// contiguously by their dtype and shape, then twisted: offsets shifted or huge, dimensions
/// huge, entries malformed, unknown dtypes, a data section too short or too long.
fn arb_header() -> impl Strategy<Value = (String, usize)> {
    let dtype = prop::sample::select(vec![
        "BOOL", "U8", "I8", "F16", "BF16", "F32", "I64", "F64", "F8_E4M3", "C64", "BOOL", "U8",
        "F32", "F32", "F4", "X",
    ]);
    let twist = prop_oneof![
        12 => Just(Twist::None),
        1 => (0u64..6).prop_map(Twist::ShiftStart),
        1 => (0u64..6).prop_map(Twist::ShiftEnd),
        1 => prop_oneof![Just(u64::MAX), Just(1u64 << 62), any::<u64>()].prop_map(Twist::HugeEnd),
        1 => prop_oneof![Just(u64::MAX), Just(1u64 << 32), any::<u64>()].prop_map(Twist::HugeDim),
        1 => Just(Twist::Malformed),
    ];
    let entry = (dtype, prop::collection::vec(0u64..4, 0..3), twist);
    let data_slack = prop_oneof![6 => Just(0i64), 1 => -8i64..8];
    (
        prop::collection::vec(entry, 0..5),
        data_slack,
        any::<bool>(),
    )
        .prop_map(|(entries, slack, with_metadata)| {
            let mut offset = 0u64;
            let mut parts = Vec::new();
            for (i, (dtype, mut shape, twist)) in entries.into_iter().enumerate() {
                let size = Dtype::from_name(dtype).map_or(1, |d| d.size_in_bytes() as u64);
                let len = shape.iter().product::<u64>() * size; // small: dims < 4
                let (mut start, mut end) = (offset, offset.saturating_add(len));
                match twist {
                    Twist::None => {}
                    Twist::ShiftStart(d) => start = start.saturating_add(d),
                    Twist::ShiftEnd(d) => end = end.saturating_sub(d),
                    Twist::HugeEnd(e) => end = e,
                    Twist::HugeDim(d) => shape.push(d),
                    Twist::Malformed => {
                        parts.push(format!(
                            r#""t{i}":{{"dtype":"{dtype}","data_offsets":[{start}]}}"#
                        ));
                        continue;
                    }
                }
                offset = end;
                let shape: Vec<String> = shape.iter().map(u64::to_string).collect();
                parts.push(format!(
                    r#""t{i}":{{"dtype":"{dtype}","shape":[{}],"data_offsets":[{start},{end}]}}"#,
                    shape.join(",")
                ));
            }
            if with_metadata {
                parts.push(r#""__metadata__":{"k":"v"}"#.to_owned());
            }
            let data_len = (offset.min(4096) as i64 + slack).max(0) as usize;
            (format!("{{{}}}", parts.join(",")), data_len)
        })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 200,
        // Failures print their minimal input; nothing is written into the source tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let (_dir, dir) = temp_dir();
        check_loader(&dir, &bytes)?;
    }

    #[test]
    fn arbitrary_header_after_a_plausible_length_never_panics(
        header in prop::collection::vec(any::<u8>(), 0..200),
        slack in 0usize..16,
        extra in 0u64..4,
    ) {
        let (_dir, dir) = temp_dir();
        let mut img = (header.len() as u64 + extra).to_le_bytes().to_vec();
        img.extend_from_slice(&header);
        img.extend(std::iter::repeat_n(0u8, slack));
        check_loader(&dir, &img)?;
    }

    #[test]
    fn corrupted_valid_file_never_panics(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        cut in prop::option::of(any::<prop::sample::Index>()),
        append in prop::collection::vec(any::<u8>(), 0..3),
    ) {
        let (_dir, dir) = temp_dir();
        let mut img = sample_image();
        for (at, byte) in &edits {
            let i = at.index(img.len());
            img[i] = *byte;
        }
        if let Some(cut) = cut {
            img.truncate(cut.index(img.len()));
        }
        img.extend_from_slice(&append);
        check_loader(&dir, &img)?;
    }

    #[test]
    fn generated_headers_never_panic((header, data_len) in arb_header()) {
        let (_dir, dir) = temp_dir();
        check_loader(&dir, &image(&header, &vec![0xAB; data_len]))?;
    }
}
