//! Linux: mapping lifetime, seen from /proc, and files changed under a map.

use super::*;

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
