//! With the `limit-system-heaps` feature (default), the C library's heaps
//! are limited when the program loads (`DEFAULT_SYSTEM_HEAPS`): threads that
//! contend for glibc's heap share it instead of each getting an arena of
//! their own, from the first thread on, before any registration. (A binary
//! of its own: glibc's arenas, once made, last as long as the process.)

#[allow(dead_code)]
#[path = "all/common.rs"]
mod common;

use std::sync::Barrier;

/// The number of heaps glibc reports (`malloc_info`'s `<heap nr=...>`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn glibc_heaps() -> usize {
    let mut buf: *mut libc::c_char = std::ptr::null_mut();
    let mut len: libc::size_t = 0;
    // SAFETY: `open_memstream` writes the buffer's address and length
    // through the two pointers, which live until `fclose`; the buffer is
    // read after `fclose` (its contents are final then) and freed once.
    unsafe {
        let file = libc::open_memstream(&mut buf, &mut len);
        assert!(!file.is_null(), "open_memstream failed");
        assert_eq!(libc::malloc_info(0, file), 0, "malloc_info failed");
        libc::fclose(file);
        let text = std::slice::from_raw_parts(buf.cast::<u8>(), len);
        let heaps = String::from_utf8_lossy(text).matches("<heap nr=").count();
        libc::free(buf.cast());
        heaps
    }
}

/// Sixteen threads allocating at once: without the limit, glibc gives each
/// that finds the heap locked an arena of its own (up to 8 per core).
fn contend() {
    let threads = 16;
    let start = Barrier::new(threads);
    std::thread::scope(|s| {
        for t in 0..threads {
            let start = &start;
            s.spawn(move || {
                start.wait();
                for i in 0..20_000 {
                    let v: Vec<u8> = vec![t as u8; 64 + (i % 512)];
                    std::hint::black_box(&v);
                }
            });
        }
    });
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn contending_threads_share_one_heap_from_the_start() {
    // The process's environment, where it chose, has the last word.
    let limit = std::env::var("MALLOC_ARENA_MAX")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(tensor_arena_ort::DEFAULT_SYSTEM_HEAPS);
    // Before anything of this crate is called (as tokio's threads do in a
    // server whose runtime starts first).
    contend();
    // (With the default, 1: the main heap alone.)
    assert!(glibc_heaps() <= limit);
    // And after an environment is made and registered on.
    let env = common::environment("heaps");
    tensor_arena_ort::register(&env).unwrap();
    contend();
    assert!(glibc_heaps() <= limit);
}
