//! Many threads and many runs: cross-thread frees on a shared arena, a
//! soak of random shapes, and relayouts that must not be reported.

use super::*;

/// Four threads in a ring: each allocates from one `SharedArena`, fills, and
/// sends its blocks to the next thread, which checks and frees them.
#[test]
fn concurrent_stress_with_cross_thread_frees() {
    const THREADS: usize = 4;
    const PER_THREAD: usize = 3000;
    let backing = Backing::new();
    {
        let arena = SharedArena::with_backing(ArenaConfig::default(), &backing);
        std::thread::scope(|s| {
            let (txs, rxs): (Vec<_>, Vec<_>) = (0..THREADS)
                .map(|_| mpsc::sync_channel::<(SharedBlock<'_, Heap<&Backing>>, u8)>(64))
                .unzip();
            for (t, rx) in rxs.into_iter().enumerate() {
                let tx = txs[(t + 1) % THREADS].clone();
                let arena = &arena;
                s.spawn(move || {
                    let mut rng = Lcg(t as u64 + 1);
                    let mut kept = Vec::new();
                    for i in 0..PER_THREAD {
                        let len = rng.range(1, 40_000);
                        let seed = (t * 64 + i) as u8;
                        let mut b = arena.try_alloc(len).unwrap();
                        b.fill(seed);
                        if i % 5 == 0 {
                            kept.push((b, seed));
                        } else {
                            tx.send((b, seed)).unwrap();
                        }
                        while let Ok((b, seed)) = rx.try_recv() {
                            assert!(b.iter().all(|&x| x == seed), "pattern lost");
                        }
                        if kept.len() > 16 {
                            let (b, seed) = kept.swap_remove(rng.range(0, kept.len() - 1));
                            assert!(b.iter().all(|&x| x == seed), "pattern lost");
                        }
                    }
                    drop(tx);
                    for (b, seed) in kept {
                        assert!(b.iter().all(|&x| x == seed), "pattern lost");
                    }
                    // Drain until every sender is gone.
                    for (b, seed) in rx {
                        assert!(b.iter().all(|&x| x == seed), "pattern lost");
                    }
                });
            }
            drop(txs);
        });
        let s = arena.stats();
        assert_eq!((s.in_use, s.live_blocks), (0, 0), "bytes in use at the end");
        assert_eq!(s.allocs, (THREADS * PER_THREAD) as u64);
        assert_eq!(s.allocs, s.frees);
        arena.lock().check_invariants();
        assert_eq!(arena.shrink_to(0), s.reserved);
        let arena = arena.into_inner();
        assert_usable(&arena);
    }
    backing.assert_all_returned();
}

/// One run of a transformer-like layer over `batch` x `seq` tokens; returns
/// the run's lower bound (most bytes live at once, sizes rounded to 64).
fn soak_run(arena: &Arena<Heap<&Backing>>, batch: usize, seq: usize) -> usize {
    const HIDDEN: usize = 64;
    const HEADS: usize = 4;
    let run = arena.begin_run();
    let tokens = batch * seq;
    let sizes = [
        tokens * HIDDEN * 4,           // x
        3 * tokens * HIDDEN * 4,       // qkv
        batch * HEADS * seq * seq * 4, // scores
        tokens * HIDDEN * 4,           // attn
        tokens * 4 * HIDDEN * 4,       // ff
        tokens * HIDDEN * 4,           // out
    ];
    let r = |i: usize| sizes[i].next_multiple_of(64);
    // x, qkv, scores, attn live; then x, attn, ff, out.
    let lower = (r(0) + r(1) + r(2) + r(3)).max(r(0) + r(3) + r(4) + r(5));
    let take = |i: usize| {
        let mut b = run.try_alloc(sizes[i]).unwrap();
        let n = b.len();
        b[0] = i as u8;
        b[n - 1] = i as u8;
        (b, i as u8)
    };
    let check = |(b, seed): &(tensor_arena::Block<'_, Heap<&Backing>>, u8)| {
        assert_eq!((b[0], b[b.len() - 1]), (*seed, *seed), "block overwritten");
    };
    let x = take(0);
    let qkv = take(1);
    let scores = take(2);
    let attn = take(3);
    check(&qkv);
    drop(qkv);
    check(&scores);
    drop(scores);
    let ff = take(4);
    let out = take(5);
    for b in [&x, &attn, &ff, &out] {
        check(b);
    }
    drop((x, attn, ff, out));
    let report = run.finish();
    assert_eq!(report.leaked_blocks, 0);
    lower
}

/// 10,000 runs of random shapes: reserved bytes stay within the documented
/// 1.25x of the largest lower bound seen (see `footprint.rs`), and do not
/// grow once the largest shapes have been seen.
#[test]
fn soak_10000_runs_with_random_shapes() {
    const RUNS: usize = 10_000;
    let backing = Backing::new();
    {
        let arena = Arena::with_backing(ArenaConfig::default(), &backing);
        let mut rng = Lcg(0x5eed);
        let mut largest = 0usize;
        let mut reserved = Vec::with_capacity(RUNS);
        let mut backing_allocs = Vec::with_capacity(RUNS);
        for i in 0..RUNS {
            let (batch, seq) = (rng.range(1, 4), rng.range(1, 192));
            let lower = soak_run(&arena, batch, seq);
            largest = largest.max(lower);
            let s = arena.stats();
            assert!(
                s.reserved as f64 <= 1.25 * largest as f64,
                "run {i} ({batch}x{seq}): reserved {} over 1.25x the largest lower bound {largest}",
                s.reserved
            );
            assert_eq!(s.in_use, 0);
            reserved.push(s.reserved);
            backing_allocs.push(s.backing_allocs);
        }
        // No monotone growth: the second half never reserves more than the
        // first half did at its most, and makes (almost) no backing call.
        let (first, second) = reserved.split_at(RUNS / 2);
        let (max1, max2) = (first.iter().max().unwrap(), second.iter().max().unwrap());
        assert!(
            max2 <= max1,
            "reserved grew: {max1} in the first half, {max2} in the second"
        );
        let calls_second_half = backing_allocs[RUNS - 1] - backing_allocs[RUNS / 2 - 1];
        assert!(
            calls_second_half <= 2,
            "{calls_second_half} backing allocations in the second half"
        );
        println!(
            "soak: largest lower bound {largest}, reserved at most {max1} / {max2}, \
             backing allocations {} ({calls_second_half} in the second half)",
            backing_allocs[RUNS - 1]
        );
        arena.shrink();
        assert!(arena.stats().reserved <= arena.stats().watermark + 64);
        assert_usable(&arena);
    }
    backing.assert_all_returned();
}

/// When the run's need (its high-water mark, alignment padding included) is
/// over the cap, `finish_run` skips the relayout and must not report one.
/// (Regression: it reported `relaid_out: true` and counted it.)
#[test]
fn a_skipped_relayout_is_not_reported() {
    const CAP: usize = 4 << 20;
    let cfg = ArenaConfig {
        max_reserved: CAP,
        ..ArenaConfig::default()
    };
    // Relayout is `Heap`'s (`Pages` grows in place).
    let arena = Arena::with_backing(cfg, allocator_api2::alloc::Global);
    let run = arena.begin_run();
    drop(run.arena().try_alloc(1).unwrap());
    let big = run.try_alloc(CAP - 64).unwrap();
    let small = run.arena().try_alloc_aligned(1, 128).unwrap();
    drop((big, small));
    let report = run.finish();
    assert!(report.high_water > CAP, "the need is over the cap");
    let s = arena.stats();
    assert!(
        !report.relaid_out || s.regions <= 1,
        "reported relaid out, yet {} regions remain",
        s.regions
    );
}
