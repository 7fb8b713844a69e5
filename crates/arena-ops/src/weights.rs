//! [`weights_load`]: arbitrary bytes through both load modes of
//! [`Weights::open`].
//!
//! `Weights` has no constructor from a byte slice (only from a file, or from
//! tensors already parsed), so the bytes are written to a scratch file,
//! in `/dev/shm` when there is one (memory, no disk I/O per fuzz execution).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use tensor_session::{LoadMode, MmapAck, Weights, WeightsError};

/// A fresh scratch file path, unique in this process and across processes.
fn scratch_path() -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = {
        let shm = std::path::Path::new("/dev/shm");
        if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        }
    };
    dir.join(format!(
        "tensor-arena-ops-{}-{}.safetensors",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Loads `data` as a safetensors file with [`LoadMode::Mmap`] (the file is
/// private to the call, so the mapping contract of [`MmapAck`] holds) and
/// [`LoadMode::Copy`] and checks that neither panics and that they agree:
/// both load, with the same tensors whose bytes are exactly the file's bytes
/// at their range (and the right length for their dtype and shape); or both
/// fail with the same kind of error, whose message names the file.
///
/// # Panics
/// When the two modes disagree or a loaded tensor is inconsistent (the
/// loader itself must never panic).
pub fn weights_load(data: &[u8]) {
    let path = scratch_path();
    if std::fs::write(&path, data).is_err() {
        // No scratch space: nothing to test (not the loader's fault).
        let _ = std::fs::remove_file(&path);
        return;
    }
    // SAFETY: `scratch_path` names a file unique to this process and call, which this
    // function just wrote and only removes (allowed) while it is mapped; nothing writes it
    // again.
    let mapped = Weights::open(&path, LoadMode::Mmap(unsafe { MmapAck::new() }));
    let copied = Weights::open(&path, LoadMode::Copy);
    // Unlinking a mapped file is safe: the map keeps the inode.
    let _ = std::fs::remove_file(&path);
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .expect("a UTF-8 file name");
    match (&mapped, &copied) {
        (Ok(m), Ok(c)) => {
            assert!(m.is_mapped() && !c.is_mapped());
            assert!(m.names().eq(c.names()), "the modes list different tensors");
            assert_eq!(m.total_bytes(), c.total_bytes());
            assert_eq!(m.len(), c.len());
            for w in [m, c] {
                check_loaded(w, data);
            }
            for (a, b) in m.iter().zip(c.iter()) {
                assert_eq!((a.dtype(), a.shape()), (b.dtype(), b.shape()));
                assert_eq!(a.bytes(), b.bytes(), "tensor {} differs", a.name());
                assert_eq!(a.file_range(), b.file_range());
            }
        }
        (Err(a), Err(b)) => {
            assert_eq!(
                std::mem::discriminant(a),
                std::mem::discriminant(b),
                "the modes fail differently: {a:?} vs {b:?}"
            );
            for e in [a, b] {
                let msg = e.to_string();
                assert!(
                    msg.contains(name),
                    "the error does not name the file: {msg}"
                );
                if let WeightsError::NotFound { .. } = e {
                    panic!("the file was just written: {msg}");
                }
            }
        }
        (a, b) => panic!("the modes disagree: {a:?} vs {b:?}"),
    }
}

/// The loaded tensors lie in the file, hold its bytes, have the length
/// their dtype and shape say, and can be viewed without panicking.
fn check_loaded(w: &Weights, file: &[u8]) {
    let mut total = 0usize;
    for t in w.iter() {
        let range = t.file_range().expect("loaded from a file");
        assert!(
            range.start <= range.end && range.end <= file.len(),
            "{range:?}"
        );
        assert_eq!(&file[range.clone()], t.bytes(), "tensor {}", t.name());
        let elements = t.shape().iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        assert_eq!(elements, Some(t.len_elements()), "tensor {}", t.name());
        assert_eq!(
            t.bytes().len(),
            t.len_elements() * t.dtype().size_in_bytes(),
            "tensor {}",
            t.name()
        );
        assert!(
            w.get(t.name()).is_some(),
            "tensor {} not found by name",
            t.name()
        );
        // Typed views: an error for the wrong element size, never a panic.
        let size = t.dtype().size_in_bytes();
        assert_eq!(t.as_cow::<u8>().is_ok(), size == 1);
        assert_eq!(t.to_vec_of::<u32>().is_ok(), size == 4);
        if let Ok(v) = t.as_cow::<u64>() {
            assert_eq!(v.len(), t.len_elements());
        }
        let _ = t.try_as_slice::<u16>();
        total += t.bytes().len();
    }
    assert_eq!(total, w.total_bytes());
    assert!(total <= file.len());
}
