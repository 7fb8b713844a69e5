//! The memory layer's failures, injected: a refused reservation or commit is
//! a clear error, the arena is unchanged and stays usable, and nothing is
//! left reserved.

use tensor_arena::memory::{HugePages, Pages, PagesConfig};
use tensor_arena::{Arena, ArenaConfig, ArenaError};
use tensor_arena_ops::Faulty;

fn pages() -> Pages {
    Pages::new(PagesConfig {
        reservation: 64 << 20,
        huge_pages: HugePages::Never,
        ..PagesConfig::default()
    })
}

#[test]
fn a_refused_reservation_is_an_error_and_the_arena_stays_usable() {
    let (memory, ledger) = Faulty::new(pages());
    let arena = Arena::with_memory(ArenaConfig::default(), memory).unwrap();
    // One refusal: a smaller reservation is tried, down to what the request
    // needs (address space may be short), and that one is had.
    ledger.borrow_mut().fail_next = 1;
    drop(arena.try_alloc(1 << 20).unwrap());
    assert!(arena.stats().backing_allocs == 1);
    assert!(arena.shrink_to(0) > 0);
    assert_eq!(
        ledger.borrow().reservations(),
        0,
        "a wholly free arena shrunk to 0 releases its range"
    );
    // Refused every time: an error.
    ledger.borrow_mut().fail_next = 64;
    let err = arena.try_alloc(1 << 20).unwrap_err();
    ledger.borrow_mut().fail_next = 0;
    assert!(
        matches!(err, ArenaError::ReserveFailed { requested, .. } if requested == 1 << 20),
        "{err:?}"
    );
    assert!(err.to_string().contains("could not reserve"), "{err}");
    let st = arena.stats();
    assert_eq!((st.reserved, st.in_use, st.backing_allocs), (0, 0, 1));
    assert_eq!(ledger.borrow().reservations(), 0);
    // Usable afterwards.
    let mut b = arena.try_alloc(1 << 20).unwrap();
    b.fill(7);
    assert_eq!(arena.stats().backing_allocs, 2);
}

#[test]
fn a_refused_commit_is_an_error_and_changes_nothing() {
    let (memory, ledger) = Faulty::new(pages());
    let arena = Arena::with_memory(ArenaConfig::default(), memory).unwrap();
    let mut a = arena.try_alloc(64 << 10).unwrap();
    a.fill(1);
    let before = arena.stats();
    ledger.borrow_mut().fail_next = 1;
    let err = arena.try_alloc(8 << 20).unwrap_err();
    assert!(matches!(err, ArenaError::CommitFailed { .. }), "{err:?}");
    assert!(err.to_string().contains("could not commit"), "{err}");
    let after = arena.stats();
    assert_eq!(
        (after.reserved, after.in_use, after.live_blocks),
        (before.reserved, before.in_use, before.live_blocks)
    );
    assert_eq!(ledger.borrow().committed(), after.reserved);
    assert!(a.iter().all(|&x| x == 1));
    // The same request goes through once the layer commits again.
    let b = arena.try_alloc(8 << 20).unwrap();
    assert_eq!(b.len(), 8 << 20);
    drop((a, b));
    drop(arena);
    assert_eq!(ledger.borrow().reservations(), 0, "released on drop");
}

#[test]
fn a_refused_commit_of_a_hole_gives_the_span_back() {
    let (memory, ledger) = Faulty::new(pages());
    let arena = Arena::with_memory(ArenaConfig::default(), memory).unwrap();
    // A live block at the top pins the range; the middle becomes a hole.
    let low = arena.try_alloc(4096).unwrap();
    let mid = arena.try_alloc(1 << 20).unwrap();
    let top = arena.try_alloc(4096).unwrap();
    drop(mid);
    let released = arena.shrink_to(0);
    assert!(
        released >= (1 << 20) - 8192,
        "the hole was decommitted: {released}"
    );
    let before = arena.stats();
    ledger.borrow_mut().fail_next = 1;
    let err = arena.try_alloc(512 << 10).unwrap_err();
    assert!(matches!(err, ArenaError::CommitFailed { .. }), "{err:?}");
    let after = arena.stats();
    assert_eq!(
        (after.in_use, after.free_bytes, after.reserved),
        (before.in_use, before.free_bytes, before.reserved)
    );
    // Recommitted, the hole reads as zero.
    let b = arena.try_alloc(512 << 10).unwrap();
    assert!(
        b.iter().all(|&x| x == 0),
        "a recommitted hole must read as zero"
    );
    drop((low, top, b));
}

#[test]
fn error_codes_say_where_they_come_from() {
    use tensor_arena::memory::{ErrorCode, MemoryError, MemoryOp};
    let os = MemoryError {
        op: MemoryOp::Commit,
        bytes: 4096,
        code: Some(ErrorCode::Os(12)),
    };
    assert!(os.to_string().contains("memory"), "{os}");
    let driver = ArenaError::CommitFailed {
        requested: 1,
        bytes: 2 << 20,
        committed: 0,
        code: Some(ErrorCode::Driver(2)),
    };
    let text = driver.to_string();
    assert!(text.contains("driver error 2"), "{text}");
    assert!(
        !text.contains("No such file"),
        "a driver code read as errno: {text}"
    );
}
