//! Clone and destroy sessions many times: the process returns to its
//! baseline bytes. One test in this binary, so the counting global allocator
//! sees nothing but it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use tensor_session::{Dtype, ModelHandle, Session, SessionConfig, SessionPool, Weights};

struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to `System`, only counting live bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// Live bytes once they stop changing. A scoped thread counts as joined once
/// its closure returns, but its thread-local destructors (arc-swap's and
/// parking_lot's per-thread records) may still be running.
fn settled() -> isize {
    let mut last = live();
    for _ in 0..400 {
        std::thread::sleep(std::time::Duration::from_millis(5));
        let now = live();
        if now == last {
            return now;
        }
        last = now;
    }
    last
}

/// The process's mappings: how many, and their total size (Linux).
fn mappings() -> (usize, usize) {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    let mut count = 0;
    let mut bytes = 0;
    for line in maps.lines() {
        let range = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = range.split_once('-') {
            let (a, b) = (
                usize::from_str_radix(a, 16).unwrap(),
                usize::from_str_radix(b, 16).unwrap(),
            );
            count += 1;
            bytes += b - a;
        }
    }
    (count, bytes)
}

/// A 64x256 f32 matrix `w` and its expected products.
fn weights() -> Arc<Weights> {
    let w: Vec<u8> = (0..64 * 256)
        .flat_map(|i| ((i % 7) as f32).to_le_bytes())
        .collect();
    Arc::new(Weights::from_tensors([("w", Dtype::F32, vec![64, 256], w)]).unwrap())
}

/// y = W x for x = [1; cols], computed in arena buffers.
fn run_once(session: &mut Session, scale: usize) -> f32 {
    session.run(&[scale], |ctx| {
        let w = ctx.weights().get("w").unwrap();
        let w = w.try_as_slice::<f32>().unwrap();
        let mut x = ctx.alloc_slice::<f32>(256 * scale).unwrap();
        x.fill(1.0);
        let mut y = ctx.alloc_slice::<f32>(64).unwrap();
        let (xs, ys) = (&x[..], &mut y[..]);
        for (r, out) in ys.iter_mut().enumerate() {
            *out = w[r * 256..(r + 1) * 256]
                .iter()
                .zip(xs)
                .map(|(a, b)| a * b)
                .sum();
        }
        ys.iter().sum()
    })
}

#[test]
fn clone_destroy_10000_times_returns_to_baseline() {
    let weights = weights();
    let weight_bytes = weights.total_bytes();
    let mut original = Session::new(Arc::clone(&weights), SessionConfig::default());
    let expect = run_once(&mut original, 1);
    // Warm up anything lazily allocated once per process (thread locals...).
    // Warm up what persists by design: the family's plans for every key the
    // loop uses (learned once, shared by all clones).
    for scale in 1..=4 {
        let mut c = original.try_clone();
        run_once(&mut c, scale);
        run_once(&mut c, scale);
    }
    let baseline = settled();
    let maps_baseline = mappings();
    let mut peak_clone_cost = 0isize;
    for i in 0..10_000 {
        let before = live();
        let mut clone = original.try_clone();
        peak_clone_cost = peak_clone_cost.max(live() - before);
        assert_eq!(original.stats().clones_alive, 2);
        if i % 10 == 0 {
            assert_eq!(run_once(&mut clone, 1 + i % 4), expect);
            assert_eq!(clone.stats().arena.in_use, 0);
            // The clone's arena holds its one reservation of address space.
            assert_eq!(clone.stats().arena.backing_allocs, 1);
            if i == 0 {
                assert!(
                    mappings().1 > maps_baseline.1,
                    "the clone's reservation is mapped"
                );
            }
        }
        drop(clone);
    }
    assert_eq!(settled(), baseline, "bytes leaked by clone/destroy cycles");
    // Every clone's reservation went with it: the same mappings as before,
    // not 1,000 reservations of address space left behind.
    assert_eq!(
        mappings(),
        maps_baseline,
        "address space left reserved by clones"
    );
    // Weight bytes are shared, not copied: a clone costs far less than them.
    assert!(
        (peak_clone_cost as usize) < weight_bytes / 8,
        "a clone cost {peak_clone_cost} bytes with {weight_bytes} bytes of weights"
    );
    let s = original.stats();
    assert_eq!(s.weight_bytes_copied, weight_bytes, "counted once");
    assert_eq!(s.clones_created, 10_005);

    // A pool of workers: nothing leaked once the pool drops. The first passes
    // warm up what the process keeps for good once threads have existed
    // (parking_lot's table of parked threads grows with their count).
    // arc-swap likewise keeps a per-thread node list for good, sized by the
    // most threads that ever loaded at once; three passes saturate both.
    let mut pool_baseline = 0;
    {
        // Make arc-swap's node list and parking_lot's table of parked
        // threads as large as they will get: 8 threads loading and parking
        // at the same time.
        let handle = ModelHandle::new(Arc::clone(&weights));
        let barrier = std::sync::Barrier::new(8);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let w = handle.load();
                    barrier.wait();
                    let lock = parking_lot::Mutex::new(());
                    let parked = parking_lot::Condvar::new();
                    parked.wait_for(&mut lock.lock(), std::time::Duration::from_millis(1));
                    barrier.wait();
                    drop(w);
                    barrier.wait();
                });
            }
        });
    }
    for pass in 0..5 {
        if pass == 3 {
            pool_baseline = settled();
        }
        let pool = SessionPool::new(
            ModelHandle::new(Arc::clone(&weights)),
            SessionConfig::default(),
            4,
        );
        std::thread::scope(|s| {
            for t in 0..4 {
                let pool = &pool;
                s.spawn(move || {
                    for i in 0..50 {
                        let mut session = pool.get();
                        assert_eq!(run_once(&mut session, 1 + (i + t) % 5), expect);
                        assert_eq!(session.stats().arena.in_use, 0);
                    }
                });
            }
        });
        assert_eq!(pool.stats().runs, 200);
    }
    assert_eq!(settled(), pool_baseline, "bytes leaked by the pool");
}
