//! Unit tests of the free map.

use super::*;

/// `(region, offset)` of an allocation, dropping the span id.
fn at(m: &mut FreeMap<u8>, size: usize, align: usize) -> Option<(RegionId, usize)> {
    m.alloc(size, align, 0).map(|(r, o, _)| (r, o))
}

#[test]
fn best_fit_prefers_the_tightest_hole_and_the_top_last() {
    let mut m = FreeMap::<u8>::new();
    let r = m.add_region(1000);
    let (_, a, ia) = m.alloc(100, 1, 0).unwrap();
    let (_, b, _) = m.alloc(50, 1, 0).unwrap();
    let (_, c, ic) = m.alloc(200, 1, 0).unwrap();
    let (_, d, _) = m.alloc(60, 1, 0).unwrap();
    assert_eq!((a, b, c, d), (0, 100, 150, 350));
    m.free(ia).unwrap(); // hole of 100 at 0
    m.free(ic).unwrap(); // hole of 200 at 150
    m.check_invariants();
    // 90 fits both holes and the top: the 100-byte hole is tightest.
    assert_eq!(at(&mut m, 90, 1), Some((r, 0)));
    // 150 only fits the 200 hole (not the top first).
    assert_eq!(at(&mut m, 150, 1), Some((r, 150)));
    // 300 fits nothing but the top.
    assert_eq!(at(&mut m, 300, 1), Some((r, 410)));
    m.check_invariants();
}

#[test]
fn frees_coalesce_both_sides_and_restore_a_whole_region() {
    let mut m = FreeMap::<u8>::new();
    let r = m.add_region(4096);
    let ids: Vec<SpanId> = (0..8).map(|_| m.alloc(64, 64, 1).unwrap().2).collect();
    for &id in ids.iter().step_by(2) {
        m.free(id).unwrap();
    }
    m.check_invariants();
    for &id in ids.iter().skip(1).step_by(2) {
        m.free(id).unwrap();
    }
    m.check_invariants();
    // Freed spans wait in the exact-size front until flushed.
    assert_eq!(m.free_bytes(), 4096);
    assert!(!m.is_region_free(r));
    m.flush_front();
    m.check_invariants();
    assert!(m.is_region_free(r));
    assert_eq!(m.free_bytes(), 4096);
    assert_eq!(m.free(12345), Err(FreeError::NotABlock));
    let whole = m.regions[r as usize].head;
    assert_eq!(m.free(whole), Err(FreeError::AlreadyFree));
}

#[test]
fn alignment_padding_stays_free() {
    let mut m = FreeMap::<u8>::new();
    let r = m.add_region(1 << 16);
    at(&mut m, 64, 64).unwrap();
    let (_, off) = at(&mut m, 64, 4096).unwrap();
    assert_eq!(off, 4096);
    m.check_invariants();
    // The 4032-byte gap is reused by a small request.
    assert_eq!(at(&mut m, 64, 64), Some((r, 64)));
    m.check_invariants();
}

#[test]
fn placement_does_not_depend_on_span_id_history() {
    // Two maps reach the same free layout through different histories;
    // the next placements must agree.
    let mut a = FreeMap::<u8>::new();
    let mut b = FreeMap::<u8>::new();
    a.add_region(1 << 20);
    b.add_region(1 << 20);
    let churn: Vec<SpanId> = (0..50)
        .map(|i| b.alloc(64 * (i + 1), 64, 0).unwrap().2)
        .collect();
    for id in churn.into_iter().rev() {
        b.free(id).unwrap();
    }
    // As the pool does before a run: the front coalesced.
    b.flush_front();
    for size in [640, 64, 128, 4096, 64, 640] {
        let pa = a.alloc(size, 64, 0).map(|x| (x.0, x.1));
        let pb = b.alloc(size, 64, 0).map(|x| (x.0, x.1));
        assert_eq!(pa, pb);
    }
}

#[test]
fn the_front_serves_the_last_span_freed_at_the_exact_size() {
    let mut m = FreeMap::<u8>::new();
    m.add_region(1 << 20);
    let a = m.alloc(4096, 64, 1).unwrap();
    let _b = m.alloc(512, 64, 1).unwrap();
    m.free(a.2).unwrap();
    m.check_invariants();
    // The same size: the same span, from the front.
    let again = m.alloc(4096, 64, 2).unwrap();
    assert_eq!((again.1, again.2), (a.1, a.2));
    m.check_invariants();
    m.free(again.2).unwrap();
    // Another size that fits nowhere else flushes the front first and
    // takes the coalesced span rather than the top.
    let other = m.alloc(1024, 64, 3).unwrap();
    assert_eq!(other.1, 0, "the freed span at 0, not the top");
    m.check_invariants();
    // A free span of the front is not a block: freeing it again fails.
    assert_eq!(m.free(a.2), Ok((1024, 3)));
    assert_eq!(m.free(a.2), Err(FreeError::AlreadyFree));
    m.check_invariants();
}

#[test]
fn classes_are_ordered_like_sizes_and_narrow() {
    let mut sizes: Vec<usize> = (1..5000)
        .chain((12..48).flat_map(|p| [(1usize << p) - 1, 1 << p, (1 << p) + 1]))
        .collect();
    sizes.sort_unstable();
    let mut last = 0;
    for size in sizes {
        let c = class_of(size);
        assert!(c >= last, "class of {size} went down");
        assert!(c < CLASSES);
        last = c;
    }
    // A class holds sizes within 1/16 of its power of two.
    assert_eq!(class_of(1 << 20), class_of((1 << 20) + (1 << 16) - 1));
    assert_ne!(class_of(1 << 20), class_of((1 << 20) + (1 << 16)));
}

#[test]
fn a_search_skips_empty_classes_and_takes_the_tightest_of_a_class() {
    let mut m = FreeMap::<u8>::new();
    m.add_region(1 << 24);
    // Holes of 64 KiB, 40 KiB and 36 KiB, kept apart by used spans.
    let mut holes = Vec::new();
    for size in [64 << 10, 40 << 10, 36 << 10] {
        holes.push(m.alloc(size, 64, 0).unwrap().2);
        m.alloc(64, 64, 0).unwrap();
    }
    for id in holes {
        m.free(id).unwrap();
    }
    m.check_invariants();
    // 33 KiB: its own class (32-34 KiB) is empty; the next non-empty
    // class holds the 36 KiB hole.
    let (_, off, _) = m.alloc(33 << 10, 64, 0).unwrap();
    assert_eq!(off, (104 << 10) + 128);
    // 39 KiB: only the 40 and 64 KiB holes fit; 40 KiB wins.
    let (_, off, _) = m.alloc(39 << 10, 64, 0).unwrap();
    assert_eq!(off, (64 << 10) + 64);
    m.check_invariants();
}

#[test]
fn simulation_matches_a_finite_region() {
    let ops = [
        RunOp::alloc(128, 64, true),
        RunOp::alloc(64, 64, true),
        RunOp::Free { index: 0 },
        RunOp::alloc(64, 64, true),
        RunOp::alloc(256, 64, true),
    ];
    assert_eq!(simulate_extent(&ops, Fit::Best, Coalesce::Lazy), 448);
    assert_eq!(simulate_extent(&[], Fit::Best, Coalesce::Lazy), 0);
    assert_eq!(simulate_extent(&[], Fit::Good, Coalesce::Lazy), 0);
}

/// Random allocations, frees and flushes over one region: the map's
/// invariants hold after every step, and the largest free span does not
/// change when the front is flushed.
#[test]
fn random_ops_keep_invariants() {
    let mut seed = 12345u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..200 {
        // Both fits, alternately.
        let fit = if round % 2 == 0 { Fit::Good } else { Fit::Best };
        let mut m = FreeMap::<u8>::with_fit(fit);
        m.add_region(1 << 20);
        let mut live: Vec<SpanId> = Vec::new();
        for step in 0..400 {
            let r = rnd();
            if r % 3 != 0 || live.is_empty() {
                let size = 64 * (1 + (rnd() % 200) as usize);
                if let Some((_, _, id)) = m.alloc(size, 64, 0) {
                    live.push(id);
                }
            } else {
                let i = (rnd() as usize) % live.len();
                let id = live.swap_remove(i);
                m.free(id).unwrap();
            }
            if r % 17 == 0 {
                let largest = m.largest_free();
                m.flush_front();
                assert_eq!(m.largest_free(), largest, "round {round} step {step}");
            }
            let res =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| m.check_invariants()));
            if res.is_err() {
                panic!("round {round} step {step}");
            }
        }
    }
}

#[test]
fn class_min_inverts_class_of() {
    for class in 1..=class_of(MAX_REGION) {
        let min = class_min(class);
        assert_eq!(class_of(min), class, "{class} {min}");
        assert_ne!(class_of(min - 1), class, "{class} {min}");
    }
}

#[test]
fn good_fit_rounds_up_then_tries_its_own_class() {
    let mut map = FreeMap::<u32>::with_fit(Fit::Good);
    map.add_region(1 << 20);
    // Free spans of 1080 bytes (class 1024..1088) and 1100 (1088..1152), kept
    // apart by used ones.
    let a = map.alloc(1080, 8, 0).unwrap().2;
    let _k1 = map.alloc(64, 8, 1).unwrap();
    let c = map.alloc(1100, 8, 2).unwrap().2;
    let _k2 = map.alloc(64, 8, 3).unwrap();
    for id in [a, c] {
        map.free(id).unwrap();
    }
    map.flush_front();
    // 1040 rounds up past its own class: the 1100 span (the next non-empty
    // class) serves it, though the 1080 one would fit better.
    let (_, off, _) = map.alloc(1040, 8, 4).unwrap();
    assert_eq!(off, 1080 + 64);
    // With no larger class left, its own class's head serves it.
    let (_, off, _) = map.alloc(1040, 8, 5).unwrap();
    assert_eq!(off, 0);
    map.check_invariants();
}

/// The front is bounded: a slot holds at most [`FRONT_DEPTH`] spans (a
/// push onto a full slot coalesces it first), so the frees of many blocks
/// of one size leave at most that many waiting, and a miss coalesces at
/// most `FRONT_SLOTS * FRONT_DEPTH` spans.
#[test]
fn the_front_holds_a_bounded_number_of_spans() {
    let mut m = FreeMap::<u8>::with_fit(Fit::Good);
    m.add_region(16 << 20);
    // 100 blocks of 128 bytes, each between two used blocks of 64.
    let mut same = Vec::new();
    for _ in 0..100 {
        m.alloc(64, 64, 0).unwrap();
        same.push(m.alloc(128, 64, 1).unwrap().2);
    }
    m.alloc(64, 64, 0).unwrap();
    for &id in &same {
        m.free(id).unwrap();
        assert!(m.front_len() <= FRONT_DEPTH as usize);
        m.check_invariants();
    }
    assert_eq!(m.front_len(), FRONT_DEPTH as usize);
    // The spans coalesced by pushes are filed: a request of another size
    // that fits them takes one, the front is flushed by the miss.
    let (_, off, _) = m.alloc(100, 64, 2).unwrap();
    assert_eq!(m.front_len(), 0);
    assert!(
        same.iter().any(|&id| m.spans[id as usize].off == off),
        "a filed 128-byte hole serves the request"
    );
    m.check_invariants();
    // Many sizes: never more than every slot full.
    let mut ids = Vec::new();
    for size in 1..=300 {
        ids.push(m.alloc(size * 64, 64, 3).unwrap().2);
        m.alloc(64, 64, 0).unwrap();
    }
    for id in ids {
        m.free(id).unwrap();
        assert!(m.front_len() <= FRONT_SLOTS * FRONT_DEPTH as usize);
    }
    m.check_invariants();
}

/// Merged at once ([`Coalesce::Immediate`]): a free leaves nothing on the
/// front, and a request larger than either of two freed neighbours takes
/// the span they make together, where a lazy map has them apart on its
/// front until it misses.
#[test]
fn an_immediate_free_merges_its_neighbours_at_once() {
    for coalesce in [Coalesce::Immediate, Coalesce::Lazy] {
        let mut m = FreeMap::<u8>::with_policy(Fit::Good, coalesce);
        m.add_region(1 << 20);
        let (_, a, ia) = m.alloc(4096, 64, 0).unwrap();
        let (_, b, ib) = m.alloc(4096, 64, 0).unwrap();
        let (_, _, _keep) = m.alloc(4096, 64, 0).unwrap();
        assert_eq!((a, b), (0, 4096));
        m.free(ia).unwrap();
        m.free(ib).unwrap();
        let on_front = m.front_len();
        match coalesce {
            Coalesce::Immediate => assert_eq!(on_front, 0),
            Coalesce::Lazy => assert_eq!(on_front, 2),
        }
        m.check_invariants();
        // Both ways the two merge before an 8 KiB request is placed.
        assert_eq!(at(&mut m, 8192, 64), Some((0, 0)), "{coalesce:?}");
        m.check_invariants();
    }
}

#[test]
fn pow2_is_is_power_of_two() {
    let mut values: Vec<usize> = vec![
        0,
        1,
        2,
        3,
        usize::MAX,
        usize::MAX - 1,
        1 << 63,
        (1 << 63) + 1,
    ];
    for b in 0..usize::BITS {
        let p = 1usize << b;
        values.extend([p, p - 1, p.wrapping_add(1), p | 1, p.wrapping_mul(3)]);
    }
    for x in values {
        assert_eq!(super::pow2(x), x.is_power_of_two(), "{x:#x}");
    }
}

/// Free spans of sizes `sizes` (oldest first) separated by used 10-byte
/// spans, in a region with no top left; returns the map and the offset of
/// each free span.
fn holes(fit: Fit, sizes: &[usize]) -> (FreeMap<u8>, Vec<usize>) {
    let mut m = FreeMap::<u8>::with_policy(fit, Coalesce::Immediate);
    m.add_region(sizes.iter().map(|s| s + 10).sum());
    let mut made = Vec::new();
    for &size in sizes {
        let (_, off, id) = m.alloc(size, 1, 0).unwrap();
        m.alloc(10, 1, 0).unwrap();
        made.push((off, id));
    }
    assert_eq!(m.alloc(1, 1, 0), None, "the region is full");
    for &(_, id) in &made {
        m.free(id).unwrap();
    }
    (m, made.into_iter().map(|(off, _)| off).collect())
}

#[test]
fn good_fit_takes_a_span_past_its_class_head_before_refusing() {
    // 100 and 102 share a class; the 100 (freed last) heads it. Good fit
    // rounds 102 up to the next class (empty) and finds the head too
    // small: the 102 further down the list must still be found.
    let (mut m, offs) = holes(Fit::Good, &[102, 100]);
    assert_eq!(class_of(100), class_of(102));
    assert_eq!(at(&mut m, 102, 1), Some((0, offs[0])));
    m.check_invariants();
}

#[test]
fn best_fit_takes_a_span_past_its_scan_before_refusing() {
    // Best fit compares the first `SCAN` spans of the class: a fitting
    // span behind them must still be found before the request is refused.
    let mut sizes = vec![103];
    sizes.extend([100; SCAN]);
    let (mut m, offs) = holes(Fit::Best, &sizes);
    assert_eq!(at(&mut m, 103, 1), Some((0, offs[0])));
    assert_eq!(at(&mut m, 101, 1), None, "no span of 101 is left");
    m.check_invariants();
}
