//! Arbitrary bytes as a plan store file (or as a body under a valid
//! header and checksum), loaded into a fresh cache as a new replica loads
//! its store: refused whole with one warning, or everything it adds (exact
//! plans, and the predictions of its families) validates and serves
//! planned runs with no overlap.
//!
//! Its cost is bounded too: a load and a save of the file (in a scratch
//! directory) take at most `LOAD_MS_BASE` ms plus 1 s per 10 MB of file
//! of this thread's CPU time (times `PLAN_STORE_SLOWDOWN`, default 1: set
//! it for sanitized or debug builds; wall time where Linux's `schedstat`
//! is missing: a save's `fsync` may wait for the disk far longer), and
//! the heap they reach above where they started is at
//! most `PEAK_PER_BYTE` times the file's size plus `PEAK_BASE` (the fits
//! and tables of a small file). The heap is counted by this target's
//! global allocator.
//!
//! `crates/arena-ops/tests/corpus.rs` replays `corpus/plan_store/` through
//! the same function.

#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Fixed allowance of time per input.
const LOAD_MS_BASE: u64 = 200;
/// Heap a load and save may reach per byte of file (the plan store's
/// goal: at most 3x the file).
const PEAK_PER_BYTE: usize = 3;
/// Fixed allowance of heap per input.
const PEAK_BASE: usize = 8 << 20;

/// The system allocator, counting the bytes live and their peak.
struct Peak;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; the
// counters only observe sizes.
unsafe impl GlobalAlloc for Peak {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's obligations are the system allocator's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Peak = Peak;

/// Time this thread has run on a CPU (`/proc/thread-self/schedstat`'s
/// first field, in nanoseconds), or `None` where that file is missing:
/// unlike wall time, not lengthened by waiting for a CPU on a busy
/// machine, nor by the save's `fsync` waiting for the disk.
fn cpu_time() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    Some(Duration::from_nanos(
        s.split_whitespace().next()?.parse().ok()?,
    ))
}

fn slowdown() -> u64 {
    std::env::var("PLAN_STORE_SLOWDOWN")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tensor_arena_ops::fuzz_plan_store(data);
    let Some(file) = tensor_arena_ops::plan_store_file(data) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("plan-store-fuzz-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let (start, cpu_start) = (Instant::now(), cpu_time());
    tensor_arena_ops::plan_store_load_and_save(&file, &dir);
    let took = match (cpu_start, cpu_time()) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => start.elapsed(),
    };
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    let limit =
        Duration::from_millis(LOAD_MS_BASE + file.len() as u64 / 10_000) * slowdown() as u32;
    assert!(
        took <= limit,
        "a load and save of {} bytes took {took:?} (limit {limit:?})",
        file.len()
    );
    let allowed = PEAK_PER_BYTE * file.len() + PEAK_BASE;
    assert!(
        peak <= allowed,
        "a load and save of {} bytes reached {peak} bytes of heap (limit {allowed})",
        file.len()
    );
});
