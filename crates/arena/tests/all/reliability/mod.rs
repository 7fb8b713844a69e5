//! Adversarial cases a trusted allocator must pass: each gives a documented
//! result and leaves the arena usable.
//!
//! Related cases that live elsewhere (not repeated here):
//! - a panicking run: `basics::a_panicking_run_returns_its_blocks`, and for
//!   sessions `crates/session/tests/sessions.rs`
//!   (`a_panicking_run_returns_its_buffers_and_the_session_stays_usable`);
//! - 10,000 session clone/destroy cycles: `crates/session/tests/clone_destroy.rs`;
//! - mmap'd weights truncated or replaced by rename: `crates/session/tests/weights/`
//!   (`truncated_while_mapped_raises_sigbus`,
//!   `replaced_by_rename_while_mapped_old_bytes_stay_valid`);
//! - random operation sequences against a model: `model.rs` here, and the
//!   shared operation language in `crates/arena-ops` (also the fuzz targets).

use allocator_api2::alloc::{AllocError, Allocator, Global, Layout};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;
use tensor_arena::{Arena, ArenaConfig, ArenaError, Growth, Heap, SharedArena, SharedBlock};

/// Regions larger than this are refused, like a machine with less memory
/// (and so that no test asks the system for terabytes, which some
/// sanitizers treat as a fatal error rather than a failed allocation).
const MACHINE_LIMIT: usize = 1 << 30;

/// A backing allocator with atomic counters (usable from several threads)
/// that refuses regions over [`MACHINE_LIMIT`] and fails on demand.
#[derive(Debug)]
struct Backing {
    allocs: AtomicU64,
    frees: AtomicU64,
    calls: AtomicU64,
    outstanding: AtomicUsize,
    /// The call (counted from 0) that fails, once.
    fail_at: AtomicU64,
    /// Every call from this one on fails.
    fail_from: AtomicU64,
}

impl Backing {
    fn new() -> Self {
        Self {
            allocs: AtomicU64::new(0),
            frees: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            outstanding: AtomicUsize::new(0),
            fail_at: AtomicU64::new(u64::MAX),
            fail_from: AtomicU64::new(u64::MAX),
        }
    }

    fn failing_at(n: u64) -> Self {
        let b = Self::new();
        b.fail_at.store(n, Ordering::Relaxed);
        b
    }

    fn failing_from(n: u64) -> Self {
        let b = Self::new();
        b.fail_from.store(n, Ordering::Relaxed);
        b
    }

    fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Relaxed)
    }

    /// Asserts every region went back.
    fn assert_all_returned(&self) {
        assert_eq!(
            self.allocs.load(Ordering::Relaxed),
            self.frees.load(Ordering::Relaxed),
            "backing allocations and frees differ"
        );
        assert_eq!(
            self.outstanding(),
            0,
            "bytes still held from the backing allocator"
        );
    }
}

// SAFETY: forwards to `Global`; every block handed out is a live `Global`
// block of that layout until `deallocate` returns it, and refusing a request
// is always allowed.
unsafe impl Allocator for &Backing {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        if layout.size() > MACHINE_LIMIT
            || call >= self.fail_from.load(Ordering::Relaxed)
            || call == self.fail_at.load(Ordering::Relaxed)
        {
            return Err(AllocError);
        }
        let block = Global.allocate(layout)?;
        self.allocs.fetch_add(1, Ordering::Relaxed);
        self.outstanding.fetch_add(layout.size(), Ordering::Relaxed);
        Ok(block)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        self.frees.fetch_add(1, Ordering::Relaxed);
        self.outstanding.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `Global.allocate(layout)` in `allocate`.
        unsafe { Global.deallocate(ptr, layout) }
    }
}

/// A small deterministic generator (64-bit LCG, Knuth's constants).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() as usize) % (hi - lo + 1)
    }
}

/// Asserts that the arena still serves a request, and writes and reads it.
fn assert_usable<A: tensor_arena::HostMemory>(arena: &Arena<A>) {
    let before = arena.stats().in_use;
    let mut b = arena
        .try_alloc(1000)
        .expect("the arena is usable afterwards");
    b.fill(0xA5);
    assert!(b.iter().all(|&x| x == 0xA5));
    assert_eq!(arena.stats().in_use, before + 1024);
    drop(b);
    assert_eq!(arena.stats().in_use, before);
    arena.check_invariants();
}

/// Asserts `result` is `want` and nothing changed.
fn refused<A: tensor_arena::HostMemory>(
    arena: &Arena<A>,
    want: ArenaError,
    f: impl FnOnce(&Arena<A>) -> Result<(), ArenaError>,
) {
    let before = arena.stats();
    let got = f(arena);
    assert_eq!(got, Err(want));
    assert_eq!(arena.stats(), before, "a refused request changed the stats");
}

fn warm(backing: &Backing) -> Arena<Heap<&Backing>> {
    let arena = Arena::with_backing(ArenaConfig::default(), backing);
    drop(arena.try_alloc(4096).unwrap());
    arena
}

#[test]
fn zero_size_request() {
    let backing = Backing::new();
    {
        let arena = Arena::with_backing(ArenaConfig::default(), &backing);
        let a = arena.try_alloc(0).unwrap();
        let b = arena.try_alloc_aligned(0, 4096).unwrap();
        let c = arena.try_alloc_layout(Layout::new::<()>()).unwrap();
        let run = arena.begin_run();
        let d = run.try_alloc(0).unwrap();
        for blk in [&a, &b, &c, &d] {
            assert!(blk.is_empty());
            assert_eq!((blk.len(), blk.capacity(), &blk[..]), (0, 0, &[][..]));
        }
        // Through the `Allocator` interface: a dangling, aligned pointer and
        // no memory.
        let layout = Layout::from_size_align(0, 256).unwrap();
        let p = (&arena).allocate(layout).unwrap();
        assert_eq!(p.len(), 0);
        assert_eq!(p.cast::<u8>().as_ptr() as usize % 256, 0);
        // SAFETY: `p` was just allocated by this arena with `layout`.
        unsafe { (&arena).deallocate(p.cast(), layout) };
        let mut v = allocator_api2::vec::Vec::<u64, _>::new_in(&arena);
        v.shrink_to_fit();
        drop(v);
        let s = arena.stats();
        assert_eq!(
            (s.reserved, s.allocs, s.in_use, s.live_blocks),
            (0, 0, 0, 0)
        );
        assert_eq!(backing.calls.load(Ordering::Relaxed), 0, "no backing call");
        drop((a, b, c, d));
        assert_eq!(run.finish().allocs, 0);
        // A zero-size request still checks its alignment.
        refused(&arena, ArenaError::InvalidAlignment { align: 3 }, |a| {
            a.try_alloc_aligned(0, 3).map(drop)
        });
        assert_usable(&arena);
        let shared = SharedArena::new(ArenaConfig::default());
        assert!(shared.try_alloc(0).unwrap().is_empty());
        assert_eq!(shared.stats().reserved, 0);
    }
    backing.assert_all_returned();
}

/// An empty block is aligned as asked (at least to the arena's alignment)
/// and views as an empty slice of any element type, as `Allocator::allocate`
/// does for zero-size layouts. (Regression: empty blocks had address 1.)
#[test]
fn zero_size_block_is_aligned() {
    let arena = Arena::new(ArenaConfig::default());
    let b = arena.try_alloc_aligned(0, 4096).unwrap();
    assert_eq!(b.as_ptr() as usize % 4096, 0);
    assert_eq!(b.pod::<u64>().map(<[u64]>::len), Ok(0));
    let t = arena.try_alloc_slice::<u32>(0).unwrap();
    assert!(t.is_empty());
    let run = arena.begin_run();
    assert!(run.try_alloc_slice::<f64>(0).unwrap().is_empty());
}

/// Every way in: try_alloc, try_alloc_aligned, a run, `SharedArena` and the
/// `Allocator` interface all refuse `len` with `CapacityOverflow`.
fn refuse_huge(len: usize) {
    let backing = Backing::new();
    {
        let arena = warm(&backing);
        let want = ArenaError::CapacityOverflow { requested: len };
        refused(&arena, want, |a| a.try_alloc(len).map(drop));
        refused(&arena, want, |a| a.try_alloc_aligned(len, 64).map(drop));
        let run = arena.begin_run();
        let in_use = arena.stats().in_use;
        assert_eq!(run.try_alloc(len).map(drop), Err(want));
        assert_eq!(arena.stats().in_use, in_use);
        assert_eq!(run.finish().allocs, 0);
        if let Ok(layout) = Layout::from_size_align(len, 1) {
            refused(&arena, want, |a| a.try_alloc_layout(layout).map(drop));
            let before = arena.stats();
            assert_eq!((&arena).allocate(layout), Err(AllocError));
            assert_eq!(arena.stats().in_use, before.in_use);
        }
        // Typed: the element count times the element size overflows, or the
        // byte size is refused as above.
        assert!(matches!(
            arena.try_alloc_slice::<u64>(len),
            Err(ArenaError::CapacityOverflow { .. })
        ));
        let shared = SharedArena::new(ArenaConfig::default());
        assert_eq!(shared.try_alloc(len).map(|b| b.len()), Err(want));
        assert_eq!(shared.stats().reserved, 0);
        assert_usable(&arena);
        assert_eq!(
            arena.stats().regions,
            1,
            "no region drawn for the refused requests"
        );
    }
    backing.assert_all_returned();
}

#[test]
fn size_usize_max() {
    refuse_huge(usize::MAX);
    refuse_huge(usize::MAX - 63);
}

#[test]
fn size_isize_max() {
    refuse_huge(isize::MAX as usize);
    refuse_huge(isize::MAX as usize - 4095);
    refuse_huge(isize::MAX as usize + 1);
}

/// A size that is valid but that no machine has: the backing allocator
/// refuses it, the arena reports `BackingFailed` and stays usable.
#[test]
fn size_beyond_the_machine() {
    let backing = Backing::new();
    {
        let arena = warm(&backing);
        let len = MACHINE_LIMIT + 1;
        let before = arena.stats();
        let err = arena.try_alloc(len).unwrap_err();
        assert!(
            matches!(err, ArenaError::BackingFailed { requested, region } if requested == len && region >= len),
            "{err}"
        );
        assert_eq!(arena.stats().in_use, before.in_use);
        assert_usable(&arena);
    }
    backing.assert_all_returned();
}

fn refuse_alignment(align: usize, want: ArenaError) {
    let backing = Backing::new();
    {
        let arena = warm(&backing);
        refused(&arena, want, |a| a.try_alloc_aligned(64, align).map(drop));
        refused(&arena, want, |a| {
            a.try_alloc_aligned(1 << 20, align).map(drop)
        });
        if let Ok(layout) = Layout::from_size_align(64, align) {
            refused(&arena, want, |a| a.try_alloc_layout(layout).map(drop));
            assert_eq!((&arena).allocate(layout), Err(AllocError));
        }
        assert_usable(&arena);
    }
    backing.assert_all_returned();
}

#[test]
fn alignment_0() {
    refuse_alignment(0, ArenaError::InvalidAlignment { align: 0 });
}

#[test]
fn alignment_3() {
    refuse_alignment(3, ArenaError::InvalidAlignment { align: 3 });
}

#[test]
fn alignment_above_the_maximum() {
    for align in [8192, 1 << 20, 1 << 40, 1usize << 63] {
        refuse_alignment(align, ArenaError::AlignmentTooLarge { align, max: 4096 });
    }
    // The maximum itself is served.
    let arena = Arena::new(ArenaConfig::default());
    let b = arena.try_alloc_aligned(100, 4096).unwrap();
    assert_eq!(b.as_ptr() as usize % 4096, 0);
}

#[test]
fn request_over_the_cap() {
    let backing = Backing::new();
    {
        let cap = 1 << 20;
        let cfg = ArenaConfig {
            max_reserved: cap,
            ..ArenaConfig::default()
        };
        let arena = Arena::with_backing(cfg, &backing);
        // Alone: larger than the cap.
        refused(
            &arena,
            ArenaError::OverCap {
                requested: cap + 64,
                reserved: 0,
                limit: cap,
            },
            |a| a.try_alloc(cap + 1).map(drop),
        );
        // With blocks live: what is left under the cap is too little.
        let keep = arena.try_alloc(600 << 10).unwrap();
        let reserved = arena.stats().reserved;
        refused(
            &arena,
            ArenaError::OverCap {
                requested: 600 << 10,
                reserved,
                limit: cap,
            },
            |a| a.try_alloc(600 << 10).map(drop),
        );
        assert!(arena.stats().reserved <= cap);
        assert_usable(&arena);
        drop(keep);
        // Once nothing is live, the whole cap can be had in one block.
        let all = arena.try_alloc(cap).unwrap();
        assert_eq!(arena.stats().reserved, cap);
        drop(all);
    }
    backing.assert_all_returned();
}

#[test]
fn cap_near_usize_max() {
    let backing = Backing::new();
    {
        let cfg = ArenaConfig {
            max_reserved: usize::MAX - 1,
            growth: Growth::PowerOfTwo {
                max_extend: usize::MAX,
            },
            initial_region: usize::MAX / 2,
            ..ArenaConfig::default()
        };
        let arena = Arena::with_backing(cfg, &backing);
        // The growth policy asks for an enormous first region (saturated, no
        // overflow); the backing allocator refuses it, and the arena falls
        // back to the exact request.
        let mut a = arena.try_alloc(1 << 20).unwrap();
        a.fill(1);
        assert!(arena.stats().reserved >= 1 << 20 && arena.stats().reserved <= MACHINE_LIMIT);
        // Doubling from there stays within the arithmetic too.
        let blocks: Vec<_> = (0..8)
            .map(|i| arena.try_alloc(1 << (10 + i)).unwrap())
            .collect();
        let err = arena.try_alloc(MACHINE_LIMIT + 1).unwrap_err();
        assert!(matches!(err, ArenaError::BackingFailed { .. }), "{err}");
        let err = arena.try_alloc(usize::MAX / 2).unwrap_err();
        assert!(matches!(err, ArenaError::CapacityOverflow { .. }), "{err}");
        drop(blocks);
        drop(a);
        assert_usable(&arena);
        arena.shrink_to(0);
        assert_eq!(arena.stats().reserved, 0);
    }
    backing.assert_all_returned();
    // `Growth::Exact` and no cap at all: the same.
    let backing = Backing::new();
    {
        let cfg = ArenaConfig {
            max_reserved: usize::MAX,
            growth: Growth::Exact,
            ..ArenaConfig::default()
        };
        let arena = Arena::with_backing(cfg, &backing);
        let blocks: Vec<_> = (0..20).map(|i| arena.try_alloc(1 << i).unwrap()).collect();
        assert!(arena.try_alloc(usize::MAX - 64).is_err());
        drop(blocks);
        assert_usable(&arena);
    }
    backing.assert_all_returned();
}

/// A fixed sequence of runs, shrinks and collections that draws several
/// regions; every allocation error must be `BackingFailed`, and every
/// checked block keeps its bytes. Returns the number of failed requests.
fn backing_sequence(arena: &Arena<Heap<&Backing>>) -> usize {
    let mut failed = 0;
    let mut check = |r: Result<(), ArenaError>| match r {
        Ok(()) => {}
        Err(ArenaError::BackingFailed { .. }) => failed += 1,
        Err(e) => panic!("unexpected error {e}"),
    };
    for round in 0..6usize {
        let run = arena.begin_run();
        let mut live = Vec::new();
        for (i, &kib) in [4usize, 64, 1024, 16, 256, 2048].iter().enumerate() {
            let len = (kib << 10) << (round % 3);
            match run.try_alloc(len) {
                Ok(mut b) => {
                    b.fill(i as u8);
                    live.push((b, i as u8));
                }
                Err(e) => check(Err(e)),
            }
            if i % 2 == 1 && !live.is_empty() {
                let (b, seed) = live.remove(0);
                assert!(b.iter().all(|&x| x == seed), "block lost its bytes");
            }
        }
        for (b, seed) in &live {
            assert!(b.iter().all(|&x| x == *seed), "block lost its bytes");
        }
        drop(live);
        let report = run.finish();
        assert_eq!(report.leaked_blocks, 0);
        arena.check_invariants();
        match round {
            1 => {
                arena.shrink_to(0);
            }
            3 => {
                arena.shrink();
            }
            _ => {}
        }
        // A collection in the arena, grown through the `Allocator` interface.
        let mut v = allocator_api2::vec::Vec::<u64, _>::new_in(arena);
        for i in 0..20_000u64 {
            if v.try_reserve(1).is_err() {
                check(Err(ArenaError::BackingFailed {
                    requested: 0,
                    region: 0,
                }));
                break;
            }
            v.push(i);
        }
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64));
        drop(v);
        arena.check_invariants();
        assert_eq!(arena.stats().in_use, 0);
    }
    failed
}

/// Runs `f` on another thread and fails if it takes longer than a minute.
fn no_hang<T: Send + 'static>(what: String, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        let out = f();
        let _ = tx.send(());
        out
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(()) => handle.join().unwrap(),
        Err(mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Ok(out) => out,
            Err(p) => std::panic::resume_unwind(p),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: no result after 60 s (hang?)"),
    }
}

#[test]
fn backing_allocator_failing_on_the_nth_call() {
    let clean = no_hang("no failure".into(), || {
        let backing = Backing::new();
        let failed = {
            let arena = Arena::with_backing(ArenaConfig::default(), &backing);
            backing_sequence(&arena)
        };
        backing.assert_all_returned();
        (failed, backing.calls.load(Ordering::Relaxed))
    });
    assert_eq!(clean.0, 0);
    assert!(
        clean.1 >= 10,
        "the sequence makes {} backing calls",
        clean.1
    );
    for n in 0..10u64 {
        // Fails once, at call n.
        let failed = no_hang(format!("failing at call {n}"), move || {
            let backing = Backing::failing_at(n);
            let failed = {
                let arena = Arena::with_backing(ArenaConfig::default(), &backing);
                let failed = backing_sequence(&arena);
                assert_usable(&arena);
                failed
            };
            backing.assert_all_returned();
            failed
        });
        // The arena retries a failed growth with the exact size, so one
        // refused call fails at most one request.
        assert!(failed <= 1, "call {n}: {failed} requests failed");
        // Fails from call n on: served from the cache as far as it goes.
        no_hang(format!("failing from call {n}"), move || {
            let backing = Backing::failing_from(n);
            {
                let arena = Arena::with_backing(ArenaConfig::default(), &backing);
                let failed = backing_sequence(&arena);
                assert!(failed > 0, "call {n}: nothing failed");
                arena.check_invariants();
            }
            backing.assert_all_returned();
        });
    }
}

/// 128 blocks fill the cap; all but one are freed; a request for nearly the
/// whole cap is then refused with `OverCap`: the live block pins its region
/// and the arena does not move blocks to compact. Wholly free regions are
/// released first when that makes room, so a request that fits beside the
/// pinned region succeeds, and once the last block is freed the whole cap
/// can be had again.
#[test]
fn freeing_127_of_128_blocks_then_a_near_cap_request() {
    const BLOCK: usize = 64 << 10;
    const CAP: usize = 128 * BLOCK; // 8 MiB
    let backing = Backing::new();
    {
        let cfg = ArenaConfig {
            max_reserved: CAP,
            ..ArenaConfig::default()
        };
        let arena = Arena::with_backing(cfg, &backing);
        let mut blocks: Vec<_> = (0..128)
            .map(|i| {
                let mut b = arena.try_alloc(BLOCK).unwrap();
                b.fill(i as u8);
                b
            })
            .collect();
        let s = arena.stats();
        assert_eq!(
            (s.in_use, s.reserved),
            (CAP, CAP),
            "128 blocks fill the cap"
        );
        // Power-of-two growth drew regions of 64, 64, 128, ..., 4096 KiB: the
        // last one holds blocks 64..128.
        assert_eq!(s.regions, 8);
        // Keep one block in the largest (last) region.
        let kept = blocks.remove(100);
        drop(blocks);
        assert_eq!(arena.stats().in_use, BLOCK);
        let reserved = arena.stats().reserved;
        let before = arena.stats();
        let err = arena.try_alloc(CAP - BLOCK).unwrap_err();
        assert_eq!(
            err,
            ArenaError::OverCap {
                requested: CAP - BLOCK,
                reserved,
                limit: CAP
            }
        );
        assert_eq!(
            arena.stats(),
            before,
            "the refused request released nothing"
        );
        assert!(kept.iter().all(|&x| x == 100));
        // Beside the pinned region (half the cap) there is room for at most
        // half the cap, once the wholly free regions are given back.
        assert!(matches!(
            arena.try_alloc(CAP / 2 + BLOCK),
            Err(ArenaError::OverCap { .. })
        ));
        assert_eq!(arena.stats(), before);
        let half = arena.try_alloc(CAP / 2).unwrap();
        let s = arena.stats();
        assert_eq!((s.reserved, s.regions), (CAP, 2));
        assert_eq!(
            s.bytes_released,
            (CAP / 2) as u64,
            "the free regions were released"
        );
        assert!(kept.iter().all(|&x| x == 100));
        drop(half);
        drop(kept);
        // Nothing live: the whole cap again.
        let all = arena.try_alloc(CAP).unwrap();
        assert_eq!(all.len(), CAP);
        drop(all);
        assert_usable(&arena);
    }
    backing.assert_all_returned();
}

#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "is not a live block of this arena")]
fn double_free_through_the_allocator_interface() {
    let arena = Arena::new(ArenaConfig::default());
    let layout = Layout::from_size_align(256, 64).unwrap();
    let _neighbour = (&arena).allocate(layout).unwrap();
    let p = (&arena).allocate(layout).unwrap();
    // SAFETY: `p` is a live block of this arena with `layout`.
    unsafe { (&arena).deallocate(p.cast(), layout) };
    // SAFETY: none: this is the bug under test (the second free of `p`); in
    // debug builds the arena panics before touching anything.
    unsafe { (&arena).deallocate(p.cast(), layout) };
}

#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "is not a live block of this arena")]
fn foreign_pointer_through_the_allocator_interface() {
    let a = Arena::new(ArenaConfig::default());
    let b = Arena::new(ArenaConfig::default());
    let layout = Layout::from_size_align(256, 64).unwrap();
    let _in_b = (&b).allocate(layout).unwrap();
    let from_a = (&a).allocate(layout).unwrap();
    // SAFETY: none: `from_a` belongs to `a`, not `b` (the bug under test);
    // in debug builds `b` panics before touching anything.
    unsafe { (&b).deallocate(from_a.cast(), layout) };
}

/// After the debug panic of a double free, the arena is consistent and usable.
#[cfg(debug_assertions)]
#[test]
fn double_free_panic_leaves_the_arena_usable() {
    let backing = Backing::new();
    {
        let arena = Arena::with_backing(ArenaConfig::default(), &backing);
        let layout = Layout::from_size_align(1000, 8).unwrap();
        let keep = (&arena).allocate(layout).unwrap();
        // SAFETY: writes inside the block just allocated.
        unsafe { keep.cast::<u8>().write_bytes(0x3C, 1000) };
        let p = (&arena).allocate(layout).unwrap();
        // SAFETY: `p` is a live block of this arena with `layout`.
        unsafe { (&arena).deallocate(p.cast(), layout) };
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: none: a double free, refused with a panic in debug builds.
            unsafe { (&arena).deallocate(p.cast(), layout) };
        }));
        assert!(r.is_err(), "the double free was not detected");
        arena.check_invariants();
        assert_eq!(arena.stats().live_blocks, 1);
        // SAFETY: reads the block, still live.
        let kept = unsafe { core::slice::from_raw_parts(keep.cast::<u8>().as_ptr(), 1000) };
        assert!(kept.iter().all(|&x| x == 0x3C));
        assert_usable(&arena);
        // SAFETY: `keep` is a live block of this arena with `layout`.
        unsafe { (&arena).deallocate(keep.cast(), layout) };
        assert_eq!(arena.stats().in_use, 0);
    }
    backing.assert_all_returned();
}

mod stress;
