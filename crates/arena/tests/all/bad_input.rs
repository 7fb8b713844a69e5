//! Bad input: a clear error, the arena unchanged and usable.

use crate::common::Counting;
use allocator_api2::alloc::Layout;
use tensor_arena::{Arena, ArenaConfig, ArenaError, Growth};

/// Asserts that `f` fails with `want`, leaves the stats unchanged, and that
/// a valid request succeeds afterwards.
fn refused<A: tensor_arena::HostMemory>(
    arena: &Arena<A>,
    want: ArenaError,
    f: impl FnOnce(&Arena<A>) -> Result<(), ArenaError>,
) {
    let before = arena.stats();
    assert_eq!(f(arena), Err(want));
    assert_eq!(arena.stats(), before, "stats changed by a refused request");
    let ok = arena
        .try_alloc(100)
        .expect("the arena is usable afterwards");
    assert_eq!(ok.len(), 100);
}

fn warm() -> Arena {
    let arena = Arena::new(ArenaConfig::default());
    drop(arena.try_alloc(4096).unwrap());
    arena
}

#[test]
fn zero_size_gives_an_empty_block_and_no_memory() {
    let arena = Arena::new(ArenaConfig::default());
    let b = arena.try_alloc(0).unwrap();
    assert!(b.is_empty());
    assert_eq!(b.capacity(), 0);
    assert_eq!(&b[..], &[] as &[u8]);
    let s = arena.stats();
    assert_eq!((s.reserved, s.allocs, s.in_use), (0, 0, 0));
}

#[test]
fn sizes_near_usize_max_overflow() {
    let arena = warm();
    // Past 128 TiB (more than any address space in use) is an overflow.
    for len in [
        usize::MAX,
        usize::MAX - 63,
        isize::MAX as usize,
        (1 << 47) + 1,
    ] {
        refused(
            &arena,
            ArenaError::CapacityOverflow { requested: len },
            |a| a.try_alloc(len).map(drop),
        );
    }
    // The largest size the arena serves is valid, and no reservation holds
    // it: on `Pages` that is the reservation used up (not the cap, as no cap
    // is set), ...
    let len = 1 << 47;
    refused(
        &arena,
        ArenaError::ReservationExhausted {
            requested: len,
            reservation: tensor_arena::memory::DEFAULT_RESERVATION,
        },
        |a| a.try_alloc(len).map(drop),
    );
    // ... and on `Heap` the backing allocator's refusal.
    let heap = Arena::with_backing(ArenaConfig::default(), allocator_api2::alloc::Global);
    refused(
        &heap,
        ArenaError::BackingFailed {
            requested: len,
            region: len,
        },
        |a| a.try_alloc(len).map(drop),
    );
}

#[test]
fn reservation_exhaustion_is_told_apart_from_the_cap() {
    use tensor_arena::memory::{Pages, PagesConfig};
    let small = PagesConfig {
        reservation: 8 << 20,
        ..PagesConfig::default()
    };
    let arena = Arena::with_memory(ArenaConfig::default(), Pages::new(small)).unwrap();
    let _a = arena.try_alloc(6 << 20).unwrap();
    let err = arena.try_alloc(4 << 20).unwrap_err();
    assert!(
        matches!(err, ArenaError::ReservationExhausted { reservation, .. } if reservation == 8 << 20),
        "{err:?}"
    );
    assert!(err.to_string().contains("not the memory cap"), "{err}");
    let capped = Arena::new(ArenaConfig {
        max_reserved: 8 << 20,
        ..ArenaConfig::default()
    });
    let _a = capped.try_alloc(6 << 20).unwrap();
    let err = capped.try_alloc(4 << 20).unwrap_err();
    assert!(matches!(err, ArenaError::OverCap { .. }), "{err:?}");
    assert!(err.to_string().contains("memory cap"), "{err}");
    // Both stay usable.
    assert!(arena.try_alloc(1 << 20).is_ok());
    assert!(capped.try_alloc(1 << 20).is_ok());
}

#[test]
fn bad_alignments_are_refused() {
    let arena = warm();
    for align in [0, 3, 12, 4097] {
        refused(&arena, ArenaError::InvalidAlignment { align }, |a| {
            a.try_alloc_aligned(64, align).map(drop)
        });
    }
    refused(
        &arena,
        ArenaError::AlignmentTooLarge {
            align: 8192,
            max: 4096,
        },
        |a| {
            a.try_alloc_layout(Layout::from_size_align(64, 8192).unwrap())
                .map(drop)
        },
    );
}

#[test]
fn over_the_cap_names_requested_reserved_and_limit() {
    let cfg = ArenaConfig {
        max_reserved: 1 << 20,
        ..ArenaConfig::default()
    };
    let arena = Arena::new(cfg);
    let _keep = arena.try_alloc(512 << 10).unwrap();
    let reserved = arena.stats().reserved;
    let want = ArenaError::OverCap {
        requested: 768 << 10,
        reserved,
        limit: 1 << 20,
    };
    let msg = want.to_string();
    assert!(
        msg.contains(&(768usize << 10).to_string()) && msg.contains("1048576"),
        "{msg}"
    );
    refused(&arena, want, |a| a.try_alloc(768 << 10).map(drop));
    assert!(arena.stats().reserved <= 1 << 20);
}

#[test]
fn a_cap_near_usize_max_does_not_overflow_growth() {
    let cfg = ArenaConfig {
        max_reserved: usize::MAX - 1,
        growth: Growth::PowerOfTwo {
            max_extend: usize::MAX,
        },
        initial_region: usize::MAX / 2,
        ..ArenaConfig::default()
    };
    let counting = Counting::failing_from(0);
    let arena = Arena::with_backing(cfg, &counting);
    let err = arena.try_alloc(1 << 40).unwrap_err();
    assert!(matches!(err, ArenaError::BackingFailed { .. }), "{err}");
}

#[test]
fn a_failing_backing_allocator_is_an_error_not_a_panic() {
    let counting = Counting::failing_from(1);
    let arena = Arena::with_backing(ArenaConfig::default(), &counting);
    drop(arena.try_alloc(4000).unwrap());
    let a = arena.try_alloc(1000).unwrap();
    let before = arena.stats();
    let err = arena.try_alloc(1 << 20).unwrap_err();
    assert!(matches!(err, ArenaError::BackingFailed { requested, .. } if requested == 1 << 20));
    assert!(err.to_string().contains("refused"));
    assert_eq!(arena.stats(), before);
    let b = arena.try_alloc(10).unwrap(); // served from cache
    drop((a, b));
    drop(arena);
    assert_eq!(counting.outstanding.get(), 0);
}

#[test]
fn invalid_configs_are_errors() {
    for cfg in [
        ArenaConfig {
            alignment: 48,
            ..ArenaConfig::default()
        },
        ArenaConfig {
            max_align: 32,
            ..ArenaConfig::default()
        },
        ArenaConfig {
            watermark_window: 0,
            ..ArenaConfig::default()
        },
    ] {
        assert!(matches!(
            Arena::try_new(cfg),
            Err(ArenaError::InvalidConfig(_))
        ));
    }
}
