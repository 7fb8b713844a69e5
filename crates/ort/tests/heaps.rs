//! Linking and registering tensor-arena-ort changes nothing process-wide:
//! threads get glibc heaps exactly as in a program without the crate, and
//! only an explicit `limit_system_heaps` limits them. (A binary of its own,
//! one test: glibc's arenas, once made, last as long as the process.)
//!
//! glibc's rule (malloc/arena.c, `arena_get2`): a thread's first `malloc`
//! takes a heap from the free list (those of exited threads) or, while the
//! process has fewer heaps than its limit, makes a new one. With no limit
//! chosen and at most 8 heaps, there is no limit yet, so every thread alive
//! at once beyond the free list gets a heap of its own: that count is what
//! a program without the crate gets.

#[allow(dead_code)]
#[path = "all/common.rs"]
mod common;

use std::num::NonZeroUsize;
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

/// `threads` threads, all alive at once, each allocating (and so each
/// needing a heap) before any ends.
fn alive_at_once(threads: usize) {
    let all_allocated = Barrier::new(threads);
    std::thread::scope(|s| {
        for t in 0..threads {
            let all_allocated = &all_allocated;
            s.spawn(move || {
                for i in 0..2_000 {
                    let v: Vec<u8> = vec![t as u8; 64 + (i % 512)];
                    std::hint::black_box(&v);
                }
                all_allocated.wait();
            });
        }
    });
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn the_crate_leaves_glibc_heaps_alone_and_an_explicit_limit_holds() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some()
        || std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("arena_max"))
    {
        eprintln!("the environment limits glibc's heaps: this test needs glibc's default");
        return;
    }
    // The crate registered on an environment, as a server does.
    let env = common::environment("heaps");
    tensor_arena_ort::register(&env).unwrap();
    let before = glibc_heaps();
    // Three threads at once, no heap free: three new heaps, as without the
    // crate (few enough that glibc's own limit is not computed yet).
    alive_at_once(3);
    let after = glibc_heaps();
    assert_eq!(
        after,
        before + 3,
        "linking and registering must leave glibc's heaps alone \
         ({before} heaps before three threads, {after} after)"
    );
    // Now the program chooses: no more heaps than there are. Six threads at
    // once: three take the exited threads' heaps, three would make new
    // ones without the limit.
    assert!(tensor_arena_ort::limit_system_heaps(NonZeroUsize::new(
        after
    )));
    alive_at_once(6);
    assert_eq!(
        glibc_heaps(),
        after,
        "the explicit limit holds: threads share the heaps there are"
    );
}
