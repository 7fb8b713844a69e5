//! What a plan store file of hostile content costs to load and save: the
//! heap a load and the next save reach is at most a few times the file's
//! size (counted by this binary's global allocator), and each takes at
//! most 0.2 s and 1 s per 10 MB (twenty times that in a debug build), for
//! the files that cost most before: a plan whose blocks are all live at
//! once, a file of many small plans, shapes whose blocks no model
//! explains, a plan of alloc-free pairs (whose tape outweighs its file
//! most). Each case runs alone (one test: the counter is process-wide).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use tensor_arena::plan::store::{seal, ModelKey, PlanStore};
use tensor_arena::PlanCache;

struct Peak;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call goes to the system allocator unchanged; the counters
// only observe sizes.
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

fn put(b: &mut Vec<u8>, v: &[u8]) {
    b.extend_from_slice(&(v.len() as u32).to_le_bytes());
    b.extend_from_slice(v);
}
fn u32b(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}
fn u64b(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}

/// A body's model key, key kind and this build's family probe (read from
/// a file this build saved).
fn head(store: &PlanStore, key: &ModelKey) -> Vec<u8> {
    store.save(&PlanCache::<String>::new(4)).unwrap();
    let f = std::fs::read(store.path()).unwrap();
    let mut body = Vec::new();
    u64b(&mut body, key.model);
    put(&mut body, key.runtime.as_bytes());
    put(&mut body, key.options.as_bytes());
    put(&mut body, b"text");
    let at = 32 + body.len();
    body.extend_from_slice(&f[at..at + 8]);
    body
}

/// One plan of `n` blocks all live at once, side by side.
fn all_live(body: &mut Vec<u8>, n: u64) {
    u32b(body, 1);
    put(body, b"k");
    u32b(body, n as u32);
    for _ in 0..n {
        u64b(body, 64);
        u64b(body, 64);
    }
    u32b(body, n as u32);
    for i in 0..n {
        u32b(body, i as u32);
    }
    for i in 0..n {
        u64b(body, 64 * i);
    }
    for v in [64 * n, 64, 64 * n] {
        u64b(body, v);
    }
    u32b(body, 0); // flags
    u32b(body, 0);
}

/// One plan of `n` blocks, each freed before the next is allocated (two
/// events a block: the plan's tape outweighs its file most).
fn pairs(body: &mut Vec<u8>, n: u64) {
    u32b(body, 1);
    put(body, b"k");
    u32b(body, n as u32);
    for _ in 0..n {
        u64b(body, 64);
        u64b(body, 64);
    }
    u32b(body, 2 * n as u32);
    for i in 0..n {
        u32b(body, i as u32);
        u32b(body, i as u32 | 1 << 31);
    }
    for _ in 0..n {
        u64b(body, 0);
    }
    for v in [64, 64, 64] {
        u64b(body, v);
    }
    u32b(body, 0); // flags
    u32b(body, 0);
}

/// `n` plans of one block each.
fn many_plans(body: &mut Vec<u8>, n: u32) {
    u32b(body, n);
    for i in 0..n {
        put(body, i.to_string().as_bytes());
        u32b(body, 1);
        u64b(body, 64);
        u64b(body, 64);
        u32b(body, 2);
        u32b(body, 0);
        u32b(body, 1 << 31);
        for v in [0u64, 64, 64, 64] {
            u64b(body, v);
        }
        u32b(body, 0); // flags
    }
    u32b(body, 0);
}

/// Families of shapes whose block sizes follow no model of their two
/// dimensions.
fn data_dependent(body: &mut Vec<u8>) {
    u32b(body, 0);
    let (families, structures, blocks, shapes) = (64u32, 8u32, 24u32, 16u32);
    u32b(body, families);
    let mut seed = 12345u64;
    let mut rnd = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        seed >> 33
    };
    for f in 0..families {
        u64b(body, 1000 + f as u64);
        put(body, b"family");
        u32b(body, structures);
        for s in 0..structures {
            u32b(body, blocks);
            for _ in 0..blocks {
                u64b(body, 64);
            }
            // Structures differ by where the first block is freed.
            u32b(body, 2 * blocks);
            u32b(body, 0);
            for b in 1..blocks {
                if b == s + 1 {
                    u32b(body, 1 << 31);
                }
                u32b(body, b);
                u32b(body, b | 1 << 31);
            }
            if s + 1 >= blocks {
                u32b(body, 1 << 31);
            }
            u32b(body, shapes);
            for sh in 0..shapes {
                u32b(body, 2);
                u64b(body, 1 + sh as u64);
                u64b(body, 7 + (3 * sh as u64) % 11);
                let sizes: Vec<u64> = (0..blocks).map(|_| 64 * (1 + rnd() % 1000)).collect();
                for &x in &sizes {
                    u64b(body, x);
                }
                // Block 0 is live with the others until its free.
                let first = sizes[0];
                let peak = sizes[1..]
                    .iter()
                    .enumerate()
                    .map(|(i, &x)| if i < s as usize { x + first } else { x })
                    .max()
                    .unwrap_or(0)
                    .max(first);
                u64b(body, peak);
            }
        }
    }
}

/// The most seconds a load or a save of `len` bytes may take: 0.2 s and
/// 1 s per 10 MB (as the `plan_store` fuzz target asserts), twenty times
/// that in a debug build.
fn time_limit(len: usize) -> f64 {
    let slowdown = if cfg!(debug_assertions) { 20.0 } else { 1.0 };
    (0.2 + len as f64 / 1e7) * slowdown
}

/// The heap a load of `file` reaches above where it started, the heap
/// the next save reaches above where it started; the plans and shapes
/// loaded. Fails if either takes longer than [`time_limit`].
fn cost(store: &PlanStore, file: &[u8]) -> (usize, usize, usize, usize) {
    std::fs::write(store.path(), file).unwrap();
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let cache = PlanCache::<String>::new(64);
    let t = std::time::Instant::now();
    let loaded = store.load(&cache);
    let load_s = t.elapsed().as_secs_f64();
    assert_eq!(loaded.warning, None);
    let load = PEAK.load(Ordering::Relaxed) - base;
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let t = std::time::Instant::now();
    store.save(&cache).unwrap();
    let save_s = t.elapsed().as_secs_f64();
    eprintln!("  load {load_s:.3} s, save {save_s:.3} s");
    let limit = time_limit(file.len());
    assert!(
        load_s <= limit && save_s <= limit,
        "{} bytes: load {load_s:.3} s, save {save_s:.3} s (limit {limit:.3} s)",
        file.len()
    );
    let save = PEAK.load(Ordering::Relaxed) - base;
    (load, save, loaded.plans, loaded.shapes)
}

/// Each case's file, and the most heap per byte of it its load and its
/// save may reach.
type Case = (&'static str, Box<dyn Fn(&mut Vec<u8>)>, f64, f64);

#[test]
fn a_load_and_a_save_reach_a_few_times_the_files_size_at_most() {
    let dir = tempfile::tempdir().unwrap();
    let key = ModelKey::new(b"model", "rt", "options");
    let store = PlanStore::new(dir.path(), key.clone());
    let head = head(&store, &key);
    // At most 3x the file at load and at save (the plan store's goal).
    // The load of one plan holds the file and, while checking it, the
    // blocks live at once, then the file and the plan's tape (24 bytes an
    // event, 4 a block): never the file, the check and the tape at once.
    let cases: [Case; 4] = [
        ("all live", Box::new(|b| all_live(b, 40_000)), 3.0, 3.0),
        ("alloc-free pairs", Box::new(|b| pairs(b, 40_000)), 3.0, 3.0),
        ("many plans", Box::new(|b| many_plans(b, 200_000)), 1.5, 1.5),
        ("data-dependent", Box::new(data_dependent), 3.0, 3.0),
    ];
    for (what, make, load_per_byte, save_per_byte) in cases {
        let mut body = head.clone();
        make(&mut body);
        let file = seal(&body);
        drop(body);
        let (load, save, plans, shapes) = cost(&store, &file);
        let len = file.len() as f64;
        eprintln!(
            "{what}: {} bytes, {plans} plans, {shapes} shapes: load {load} bytes ({:.2}x), \
             save {save} bytes ({:.2}x)",
            file.len(),
            load as f64 / len,
            save as f64 / len
        );
        assert!(plans + shapes > 0, "{what}: nothing loaded");
        assert!(
            load as f64 <= load_per_byte * len,
            "{what}: load {load} for {len}"
        );
        assert!(
            save as f64 <= save_per_byte * len,
            "{what}: save {save} for {len}"
        );
    }
}
