//! What loading a plan store costs: a store of 1,000 exact plans (a
//! 240-block model, like PP-OCR's classifier, at 1,000 input shapes) and
//! its family, loaded into a fresh cache; prints the file's size, the
//! load's time (median of 9 loads) and the heap it holds after the load
//! and at its peak, counted by this program's global allocator.
//!
//! `cargo run --release -p tensor-arena --example plan_store_load`

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;
use tensor_arena::{DynamicReason, Lookup, ModelKey, PlanCache, PlanStore, Recording, RunReport};

/// The system allocator, counting the bytes held and their peak.
struct Counting;

static HELD: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is passed to `System` unchanged; the counters are
// only read.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now =
                HELD.fetch_add(layout.size() as isize, Ordering::Relaxed) + layout.size() as isize;
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Nanoseconds this thread has run on a CPU (`/proc/thread-self/schedstat`'s
/// first field): unlike wall time, not lengthened by waiting for a CPU on
/// a loaded machine. 0 where the file is missing.
fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Blocks of the model's runs.
const BLOCKS: usize = 240;
/// Plans in the store.
const PLANS: usize = 1000;

/// A run at `[batch, width]`: block `i` is allocated, and freed three
/// blocks later (the last ones live to the end); sizes proportional to
/// `batch * width` by a per-block factor, a few constant.
fn recording(batch: usize, width: usize) -> Recording {
    let mut r = Recording::new();
    let mut ids = Vec::new();
    for i in 0..BLOCKS {
        let size = if i % 17 == 0 {
            4096
        } else {
            64 * (1 + i % 7) * batch * width
        };
        ids.push(r.alloc(size, 64));
        if i >= 3 && i + 3 < BLOCKS {
            r.free(ids[i - 3]);
        }
    }
    r
}

fn main() {
    let dir = std::env::temp_dir().join(format!("plan_store_load.{}", std::process::id()));
    let store = PlanStore::new(&dir, ModelKey::new(b"bench model", "bench 1", ""));
    {
        let cache = PlanCache::<String>::new(PLANS);
        for k in 0..PLANS {
            let (batch, width) = (1 + k % 40, 8 + 8 * (k / 40));
            let key = format!("{batch}x3x48x{width}");
            let lookup = Lookup::none(DynamicReason::NewFamily);
            let rec = recording(batch, width);
            cache.after_run(key.as_str(), &lookup, &RunReport::default(), &rec, true);
        }
        assert_eq!(cache.stats().plans, PLANS);
        store.save(&cache).expect("saved");
    }
    let file = std::fs::metadata(store.path()).expect("the store").len() as isize;
    let mut times = Vec::new();
    let mut cpu = Vec::new();
    let mut held = 0;
    let mut peak = 0;
    for _ in 0..9 {
        let before = HELD.load(Ordering::Relaxed);
        PEAK.store(before, Ordering::Relaxed);
        let cache = PlanCache::<String>::new(PLANS);
        let (t, c) = (Instant::now(), cpu_ns());
        let loaded = store.load(&cache);
        cpu.push(cpu_ns() - c);
        times.push(t.elapsed());
        assert_eq!(loaded.warning, None);
        assert_eq!(loaded.plans, PLANS);
        held = HELD.load(Ordering::Relaxed) - before;
        peak = PEAK.load(Ordering::Relaxed) - before;
        drop(cache);
    }
    times.sort();
    cpu.sort();
    // Where the time goes: reading and checking the file (decode), and
    // the rest (adding plans and fitting families).
    let bytes = std::fs::read(store.path()).expect("the store");
    let mut decode = Vec::new();
    for _ in 0..9 {
        let t = Instant::now();
        let c = tensor_arena::plan::store::decode::<String>(&bytes).expect("decodes");
        decode.push(t.elapsed());
        drop(c);
    }
    decode.sort();
    println!(
        "decode alone: {:.2} ms (median of 9)",
        decode[4].as_secs_f64() * 1e3
    );
    let mib = |b: isize| b as f64 / (1 << 20) as f64;
    println!(
        "load's CPU time {:.2} ms (median of 9; min {:.2}, max {:.2})",
        cpu[4] as f64 / 1e6,
        cpu[0] as f64 / 1e6,
        cpu[8] as f64 / 1e6
    );
    println!(
        "{PLANS} plans of {BLOCKS} blocks: file {:.2} MiB; load {:.2} ms (median of 9; min {:.2}, max {:.2}); \
         heap held after the load {:.2} MiB ({:.2}x the file), at its peak {:.2} MiB ({:.2}x)",
        mib(file),
        times[4].as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3,
        times[8].as_secs_f64() * 1e3,
        mib(held),
        held as f64 / file as f64,
        mib(peak),
        peak as f64 / file as f64,
    );
    let _ = std::fs::remove_dir_all(&dir);
}
