//! `SharedArena` under concurrent use.

use std::sync::mpsc;
use tensor_arena::{ArenaConfig, SharedArena, SharedBlock};

#[test]
fn threads_allocate_and_free_concurrently_with_patterns_intact() {
    for threads in [2usize, 4, 8] {
        let arena = SharedArena::new(ArenaConfig::default());
        std::thread::scope(|s| {
            for t in 0..threads {
                let arena = &arena;
                s.spawn(move || {
                    let mut mine: Vec<(SharedBlock<'_>, u8)> = Vec::new();
                    for i in 0..2000usize {
                        let seed = (t * 31 + i) as u8;
                        let mut b = arena
                            .try_alloc(64 + (i * 7919 + t * 104_729) % 50_000)
                            .unwrap();
                        b.fill(seed);
                        mine.push((b, seed));
                        if i % 3 != 0 {
                            let (b, seed) = mine.swap_remove((i * 13) % mine.len());
                            assert!(b.iter().all(|&x| x == seed), "pattern lost");
                        }
                    }
                    for (b, seed) in mine {
                        assert!(b.iter().all(|&x| x == seed), "pattern lost");
                    }
                });
            }
        });
        let s = arena.stats();
        assert_eq!((s.in_use, s.live_blocks), (0, 0), "{threads} threads");
        assert_eq!(s.allocs, s.frees);
    }
}

#[test]
fn blocks_freed_on_another_thread_than_their_allocator() {
    let arena = SharedArena::new(ArenaConfig::default());
    std::thread::scope(|s| {
        let (tx, rx) = mpsc::channel::<(SharedBlock<'_>, u8)>();
        let producer = &arena;
        s.spawn(move || {
            for i in 0..5000usize {
                let mut b = producer.try_alloc(1 + i % 9000).unwrap();
                b.fill(i as u8);
                tx.send((b, i as u8)).unwrap();
            }
        });
        s.spawn(move || {
            for (b, seed) in rx {
                assert!(b.iter().all(|&x| x == seed));
            }
        });
    });
    let s = arena.stats();
    assert_eq!(s.in_use, 0);
    assert_eq!(s.allocs, 5000);
    assert_eq!(arena.shrink_to(0), s.reserved);
}

#[test]
fn shared_collections_and_locked_runs() {
    let arena = SharedArena::new(ArenaConfig::default());
    let mut v = allocator_api2::vec::Vec::new_in(&arena);
    v.extend(0..1000u32);
    assert_eq!(v[999], 999);
    drop(v);
    {
        let guard = arena.lock();
        let run = guard.begin_run();
        let b = run.try_alloc(100).unwrap();
        drop(b);
        assert_eq!(run.finish().leaked_blocks, 0);
    }
    assert_eq!(arena.stats().in_use, 0);
}
