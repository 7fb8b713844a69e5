//! How many heaps the C library keeps for the rest of the process's memory.
//!
//! With the arena serving ONNX Runtime's tensors, what is left in the system
//! allocator is ONNX Runtime's small allocations: kernel scratch, shapes,
//! thread state. glibc gives each thread that contends for its heap an
//! arena of its own, up to 8 per core, and a server's elastic thread pool
//! contends a lot. The small allocations that outlive a request then stay
//! spread over many arenas, and idle decay's `malloc_trim` cannot return a
//! page that holds one: on the HTTP example at 16 and 64 clients, 22 MiB of
//! three thread arenas stayed resident when the server went idle
//! (`BENCHMARKS.md`, "Servers as they are"). Fewer arenas keep them
//! together, and the trim can then return the rest.
//!
//! glibc fixes its arena count the first time a thread needs an arena of
//! its own, so a limit set later (at [`register`](crate::register), after
//! tokio's threads have allocated) does nothing: on the HTTP example it
//! left 100 MiB idle where the same limit from the process's start left
//! 80. So with the `limit-system-heaps` feature (on by default), the limit
//! is set when the program loads, before `main` and before any thread:
//! glibc is limited to [`DEFAULT_SYSTEM_HEAPS`] arenas, unless the process
//! chose otherwise in its environment (`MALLOC_ARENA_MAX`, or a
//! `glibc.malloc.arena_max` tunable, which glibc then applies). Without the
//! feature, or to choose in code, call [`limit_system_heaps`] first thing
//! in `main`; [`register`](crate::register) applies the default too, where
//! nothing chose before (too late where threads have allocated already).
//! It changes where the C library puts small blocks, nothing about what
//! any code may allocate. Elsewhere than glibc it does nothing.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, Ordering};

/// The number of C library heaps (glibc arenas) [`register`](crate::register)
/// allows the process by default: one, the main heap. The tensors are the
/// arena's, so the threads share that heap's lock only for ONNX Runtime's
/// small blocks. Measured on the HTTP example (`BENCHMARKS.md`, "Servers as
/// they are"), RSS 15 s after the last request at 16 and 64 clients: glibc's
/// default 124 and 111 MiB, two heaps 90 to 100 MiB, one heap 80 MiB, with
/// the sessions made 81 to 86 MiB; requests per second and p99 within the
/// machine's noise of ONNX Runtime's defaults with one heap.
pub const DEFAULT_SYSTEM_HEAPS: usize = 1;

/// Whether the process's heap count has been chosen (by the environment, a
/// call, or the default once applied).
static CHOSEN: AtomicBool = AtomicBool::new(false);

/// Limits the C library to `max` heaps for the rest of the process (glibc's
/// `M_ARENA_MAX`), or, with `None`, keeps its default (8 per core); either
/// way [`register`](crate::register) then leaves it alone. Returns whether
/// the limit is in force: `false` for `None`, where the C library is not
/// glibc, or if glibc refused it (a `max` over `i32::MAX`).
pub fn limit_system_heaps(max: Option<NonZeroUsize>) -> bool {
    CHOSEN.store(true, Ordering::Release);
    max.is_some_and(set_arena_max)
}

/// Runs [`default_system_heaps`] when the program loads (glibc runs the
/// functions of `.init_array` before `main`, on the one thread there is).
#[cfg(all(
    target_os = "linux",
    target_env = "gnu",
    feature = "limit-system-heaps"
))]
#[used]
#[link_section = ".init_array"]
static AT_LOAD: extern "C" fn() = at_load;

#[cfg(all(
    target_os = "linux",
    target_env = "gnu",
    feature = "limit-system-heaps"
))]
extern "C" fn at_load() {
    // Never unwinds into the C runtime that called it.
    let _ = std::panic::catch_unwind(default_system_heaps);
}

/// Applies [`DEFAULT_SYSTEM_HEAPS`] once per process, unless the process
/// chose its heap count already.
pub(crate) fn default_system_heaps() {
    if CHOSEN.swap(true, Ordering::AcqRel) || chosen_by_environment() {
        return;
    }
    if let Some(max) = NonZeroUsize::new(DEFAULT_SYSTEM_HEAPS) {
        set_arena_max(max);
    }
}

/// Whether the process's environment sets glibc's arena count.
fn chosen_by_environment() -> bool {
    std::env::var_os("MALLOC_ARENA_MAX").is_some()
        || std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc.arena_max"))
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_arena_max(max: NonZeroUsize) -> bool {
    let Ok(max) = libc::c_int::try_from(max.get()) else {
        return false;
    };
    // SAFETY: `mallopt` only sets one of glibc's malloc parameters; it takes
    // glibc's own lock and touches no memory in use.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, max) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_arena_max(_max: NonZeroUsize) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_is_applied_and_keeping_is_no_limit() {
        // One test per process state: both calls mark the count chosen.
        assert!(!limit_system_heaps(None));
        assert!(CHOSEN.load(Ordering::Acquire));
        let two = NonZeroUsize::new(2).unwrap();
        assert_eq!(
            limit_system_heaps(Some(two)),
            cfg!(all(target_os = "linux", target_env = "gnu"))
        );
        let huge = NonZeroUsize::new(usize::MAX).unwrap();
        assert!(!limit_system_heaps(Some(huge)));
        // Chosen: the default no longer applies.
        default_system_heaps();
    }
}
