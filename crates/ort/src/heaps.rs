//! How many heaps the C library keeps for the rest of the process's memory:
//! the program's choice, never this crate's.
//!
//! With the arena serving ONNX Runtime's tensors, what is left in the system
//! allocator is ONNX Runtime's small allocations: kernel scratch, shapes,
//! thread state. glibc gives each thread that needs a heap an arena of its
//! own, up to 8 per core, and a server's elastic thread pool makes many.
//! The small allocations that outlive a request then stay spread over many
//! arenas, and idle decay's `malloc_trim` cannot return a page that holds
//! one: on the HTTP example at 16 and 64 clients, 22 MiB of three thread
//! arenas stayed resident when the server went idle (`BENCHMARKS.md`,
//! "Servers"). Fewer arenas keep them together, and the trim
//! can then return the rest.
//!
//! But one heap is one lock for every thread's `malloc` and `free`: a
//! malloc-heavy server whose threads pass blocks to each other loses most
//! of its throughput to it (`BENCHMARKS.md`, "glibc's heaps: what one heap
//! costs a malloc-heavy server"). Which matters more is the server's to say, so
//! linking or using this crate changes nothing process-wide: glibc keeps
//! its own default unless the program chooses, in its environment
//! (`MALLOC_ARENA_MAX=N` or `GLIBC_TUNABLES=glibc.malloc.arena_max=N`, read
//! when the process starts: the way for a deployment) or in code with
//! [`limit_system_heaps`], first thing in `main` (glibc fixes its arena
//! count once a thread has needed an arena of its own, so a later call may
//! do nothing). Elsewhere than glibc it does nothing.

use std::num::NonZeroUsize;

/// The heap count measured for an idle server's RSS on the HTTP example:
/// one, the main heap (`BENCHMARKS.md`, "Servers": RSS 15 s
/// after the last request at 16 and 64 clients, glibc's default 124 and
/// 111 MiB, two heaps 90 to 100 MiB, one heap 80 MiB). Nothing applies it
/// unless the program passes it to [`limit_system_heaps`] (or sets
/// `MALLOC_ARENA_MAX=1`); a malloc-heavy server pays for it in throughput
/// (`BENCHMARKS.md`, "glibc's heaps: what one heap costs a malloc-heavy server").
pub const IDLE_RSS_SYSTEM_HEAPS: usize = 1;

/// Limits the C library to `max` heaps for the rest of the process
/// (glibc's `M_ARENA_MAX`), for a program that chose fewer heaps (less
/// idle RSS) over throughput under contention. `None` changes nothing and
/// returns `false`: glibc keeps its default (8 per core), as it does when
/// this function is never called; nothing else in this crate touches the
/// setting.
///
/// Call it first thing in `main`, before any thread allocates: glibc fixes
/// its arena count once it has made more than 8 arenas, or once a limit
/// was in force when a thread first needed one. Returns whether glibc
/// accepted the limit: `false` for `None`, where the C library is not
/// glibc, or for a `max` over `i32::MAX`.
pub fn limit_system_heaps(max: Option<NonZeroUsize>) -> bool {
    max.is_some_and(|max| mallopt(Param::ArenaMax, max.get()))
}

/// The glibc malloc parameters this crate sets, when asked.
#[derive(Clone, Copy)]
enum Param {
    ArenaMax,
    MmapThreshold,
}

/// Sets glibc's malloc parameter `param` to `value`; whether glibc
/// accepted it (`false` for a value over a C `int`, and elsewhere than
/// glibc).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn mallopt(param: Param, value: usize) -> bool {
    let Ok(value) = libc::c_int::try_from(value) else {
        return false;
    };
    let param = match param {
        Param::ArenaMax => libc::M_ARENA_MAX,
        Param::MmapThreshold => libc::M_MMAP_THRESHOLD,
    };
    // SAFETY: `mallopt` only sets one of glibc's malloc parameters; it takes
    // glibc's own lock and touches no memory in use.
    unsafe { libc::mallopt(param, value) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn mallopt(_param: Param, _value: usize) -> bool {
    false
}

/// The largest block glibc serves from its heaps under the setting of
/// [`map_large_blocks`] on 64-bit targets: half a thread heap's 64 MiB (a
/// larger threshold is refused).
pub const MAX_MMAP_THRESHOLD: usize = 32 << 20;

/// Makes glibc serve every block of `threshold` bytes or more with a
/// mapping of its own, given back to the kernel at its `free` (glibc's
/// `M_MMAP_THRESHOLD`, `MALLOC_MMAP_THRESHOLD_`), for a program that
/// chose a process that returns to its sessions' RSS over the page faults
/// of mapping large blocks anew. `None` changes nothing and returns
/// `false`; nothing else in this crate touches the setting.
///
/// glibc's default starts at 128 KiB but raises itself to the size of each
/// mapped block freed, up to 32 MiB. ONNX Runtime's own large scratch (the
/// blocks it takes from `malloc`, not from the arena) then lands in the
/// heaps of the threads that ran, where it stays: 16 Python threads on
/// PP-OCR det and rec peaked at 724-770 MiB with the default and 546-622
/// MiB with 128 KiB fixed, at the same requests/s, and a uvicorn worker of
/// ppocr_rec idled at 133-165 MiB against 106 (`BENCHMARKS.md`, "glibc's
/// moving mmap threshold"). Setting it also turns off glibc's moving trim
/// threshold. May be called at any time; it applies to later `malloc`s.
/// Returns whether glibc accepted it: `false` for `None`, where the C
/// library is not glibc, or for a threshold over [`MAX_MMAP_THRESHOLD`].
pub fn map_large_blocks(threshold: Option<NonZeroUsize>) -> bool {
    threshold
        .filter(|t| t.get() <= MAX_MMAP_THRESHOLD)
        .is_some_and(|t| mallopt(Param::MmapThreshold, t.get()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_keeps_the_default_and_an_impossible_limit_is_refused() {
        assert!(!limit_system_heaps(None));
        let huge = NonZeroUsize::new(usize::MAX).unwrap();
        assert!(!limit_system_heaps(Some(huge)));
        assert!(!map_large_blocks(None));
        let over = NonZeroUsize::new(MAX_MMAP_THRESHOLD + 1).unwrap();
        assert!(!map_large_blocks(Some(over)));
    }
}
