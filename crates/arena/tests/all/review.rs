//! Regressions of the third round's soundness review (issue 19), one test
//! per finding of the arena crate. (The CUDA driver's forged handles are
//! `tensor-arena-cuda`'s tests.)

use std::sync::{mpsc, Arc};
use std::time::Duration;
use tensor_arena::memory::{Heap, Pages, PagesConfig};
use tensor_arena::{Arena, ArenaConfig, FreeError, Plan, RawArena, SharedArena};

fn raw() -> RawArena<Pages> {
    RawArena::new(ArenaConfig::default(), Pages::new(PagesConfig::default())).unwrap()
}

/// Finding 2: `shrink_to(usize::MAX)` keeps everything ("at most `bytes`
/// stay reserved"), with and without live blocks, on both memory layers;
/// it neither panics nor wraps to 0.
#[test]
fn shrink_to_usize_max_releases_nothing() {
    let pages = Arena::new(ArenaConfig::default());
    let heap = Arena::with_backing(ArenaConfig::default(), allocator_api2::alloc::Global);
    for arena in [&pages as &dyn Shrinks, &heap as &dyn Shrinks] {
        arena.churn();
        let reserved = arena.reserved();
        assert!(reserved > 0);
        assert_eq!(arena.shrink_max(), 0);
        assert_eq!(arena.reserved(), reserved, "nothing may be released");
    }
    // With a block live.
    let live = pages.try_alloc(3 << 20).unwrap();
    let reserved = pages.stats().reserved;
    assert_eq!(pages.shrink_to(usize::MAX), 0);
    assert_eq!(pages.stats().reserved, reserved);
    drop(live);
    let mut core = raw();
    let a = core.alloc(5 << 20, 64).unwrap();
    core.free(a.handle).unwrap();
    let reserved = core.stats().reserved;
    assert_eq!(core.shrink_to(usize::MAX), 0);
    assert_eq!(core.stats().reserved, reserved);
}

trait Shrinks {
    fn churn(&self);
    fn reserved(&self) -> usize;
    fn shrink_max(&self) -> usize;
}

impl<M: tensor_arena::HostMemory> Shrinks for Arena<M> {
    fn churn(&self) {
        let blocks: Vec<_> = (1..6).map(|i| self.try_alloc(i << 20).unwrap()).collect();
        drop(blocks);
    }
    fn reserved(&self) -> usize {
        self.stats().reserved
    }
    fn shrink_max(&self) -> usize {
        self.shrink_to(usize::MAX)
    }
}

/// Finding 3: a freed handle whose span now holds another block is refused,
/// and the new block stays live.
#[test]
fn a_stale_pool_handle_is_refused() {
    let mut core = raw();
    let a = core.alloc(4096, 64).unwrap();
    core.free(a.handle).unwrap();
    // The same size again takes the same place (the exact-size front), and
    // may take the same span id.
    let b = core.alloc(4096, 64).unwrap();
    assert_eq!(core.free(a.handle), Err(FreeError::AlreadyFree));
    assert_eq!(core.capacity(a.handle), 0);
    assert!(
        core.capacity(b.handle) >= 4096,
        "the new block is still live"
    );
    assert_eq!(core.stats().live_blocks, 1);
    core.free(b.handle).unwrap();
    assert_eq!(core.free(b.handle), Err(FreeError::AlreadyFree));
    assert_eq!(core.stats().in_use, 0);
}

/// Finding 3: another arena's handle is refused, even when its span id
/// exists here.
#[test]
fn a_foreign_handle_is_refused() {
    let mut one = raw();
    let mut two = RawArena::new(
        ArenaConfig::default(),
        Heap::new(allocator_api2::alloc::Global),
    )
    .unwrap();
    assert_ne!(one.id(), two.id());
    let a = one.alloc(4096, 64).unwrap();
    let b = two.alloc(4096, 64).unwrap();
    assert_eq!(two.free(a.handle), Err(FreeError::Foreign));
    assert_eq!(one.free(b.handle), Err(FreeError::Foreign));
    assert_eq!(two.capacity(a.handle), 0);
    assert_eq!((one.stats().live_blocks, two.stats().live_blocks), (1, 1));
    one.free(a.handle).unwrap();
    two.free(b.handle).unwrap();
}

/// Finding 3: a planned handle of an earlier run is refused when a later
/// run of the same plan serves the same block index from the same slot.
#[test]
fn a_stale_planned_handle_is_refused() {
    let mut core = raw();
    core.begin_run(None, true).unwrap();
    let x = core.alloc(10_000, 64).unwrap();
    let y = core.alloc(20_000, 64).unwrap();
    core.free(x.handle).unwrap();
    core.free(y.handle).unwrap();
    let (_, rec) = core.finish_run();
    let plan = Arc::new(Plan::from_recording(&rec).unwrap());
    core.begin_run(Some(Arc::clone(&plan)), false).unwrap();
    let old = core.alloc(10_000, 64).unwrap();
    let old2 = core.alloc(20_000, 64).unwrap();
    core.free(old.handle).unwrap();
    core.free(old2.handle).unwrap();
    let (report, _) = core.finish_run();
    assert!(
        report.planned && !report.deviated,
        "the run was served by its plan"
    );
    assert_eq!(report.planned_allocs, 2);
    core.begin_run(Some(plan), false).unwrap();
    let new = core.alloc(10_000, 64).unwrap();
    assert_eq!(core.free(old.handle), Err(FreeError::AlreadyFree));
    assert!(core.capacity(new.handle) >= 10_000, "the new block is live");
    assert_eq!(core.capacity(old.handle), 0);
    let new2 = core.alloc(20_000, 64).unwrap();
    core.free(new.handle).unwrap();
    core.free(new2.handle).unwrap();
    let (report, _) = core.finish_run();
    assert_eq!(report.leaked_blocks, 0);
}

/// Runs `f` on another thread; fails (instead of hanging the test run) if
/// it does not finish in 20 s.
fn within_time(f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("deadlocked (or panicked) on re-entry");
}

/// Finding 4: a thread that holds a shared arena's lock may drop its blocks
/// and call its methods; nothing waits for itself.
#[test]
fn a_shared_arena_can_be_reentered_by_its_lock_holder() {
    within_time(|| {
        let shared = SharedArena::new(ArenaConfig::default());
        let block = shared.try_alloc(4096).unwrap();
        let guard = shared.lock();
        let inner = guard.try_alloc(100).unwrap();
        drop(block); // a `SharedBlock` dropped under the lock
        let again = shared.try_alloc(64).unwrap();
        let nested = shared.lock();
        assert_eq!(nested.stats().live_blocks, 2);
        drop(nested);
        let _ = shared.stats();
        let _ = shared.shrink();
        let _ = shared.shrink_to(0);
        drop(again);
        drop(inner);
        drop(guard);
        assert_eq!(shared.stats().in_use, 0);
    });
}

/// Finding 4: other threads still wait for the holder (the lock still
/// excludes them), and proceed once it is released.
#[test]
fn a_shared_arenas_lock_still_excludes_other_threads() {
    within_time(|| {
        let shared = Arc::new(SharedArena::new(ArenaConfig::default()));
        let guard = shared.lock();
        let (tx, rx) = mpsc::channel();
        let other = Arc::clone(&shared);
        let t = std::thread::spawn(move || {
            let b = other.try_alloc(64).unwrap();
            tx.send(b.len()).unwrap();
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "another thread got in while the lock was held"
        );
        drop(guard);
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 64);
        t.join().unwrap();
    });
}

/// Finding 5: a slice of zero-sized elements has the length asked for.
#[test]
fn a_slice_of_zero_sized_elements_has_its_length() {
    let arena = Arena::new(ArenaConfig::default());
    let s = arena.try_alloc_slice::<()>(3).unwrap();
    assert_eq!(s.len(), 3);
    assert_eq!(s.iter().count(), 3);
    let run = arena.begin_run();
    let mut t = run.try_alloc_slice::<()>(1 << 40).unwrap();
    assert_eq!(t.len(), 1 << 40);
    assert_eq!(t[..].len(), 1 << 40);
    let elems: &mut [()] = &mut t;
    assert_eq!(elems.len(), 1 << 40);
    drop(t);
    drop(run);
    assert_eq!(arena.stats().in_use, 0);
}
