//! The hot path: allocate-and-free pairs, one block at a time, no page
//! touched.

use crate::peers::{TalcHeap, TlsfHeap, PAIRS_POOL};
use crate::{PoolHeap, Strategy, ALIGN};
use bumpalo::Bump;
use core::alloc::{GlobalAlloc, Layout};
use core::hint::black_box;
use mimalloc::MiMalloc;
use std::alloc::System;
use std::sync::Arc;
use tensor_arena::{Arena, ArenaConfig, Plan, SharedArena};
use tikv_jemallocator::Jemalloc;

/// Allocate-and-free pairs, one block at a time, no page touched.
///
/// `Send`, so that a worker thread can own one (the contention group).
pub trait Pairs: Send {
    /// One allocation and its free for each of `sizes`, in order.
    fn pairs(&mut self, sizes: &[usize]);
}

/// A [`Pairs`] of `strategy` for the batch `sizes` (the planned strategy
/// records the batch once, dynamically, to make its plan). Returns `None`
/// for [`Strategy::Bare`], which does not allocate.
pub fn pairs(strategy: Strategy, sizes: &[usize]) -> Option<Box<dyn Pairs>> {
    Some(match strategy {
        Strategy::Arena => Box::new(ArenaPairs {
            arena: Arena::new(ArenaConfig::default()),
            in_run: true,
        }),
        Strategy::Planned => {
            let (arena, plan) = learned(sizes);
            Box::new(PlannedPairs { arena, plan })
        }
        Strategy::Shared => shared_pairs(Arc::new(SharedArena::new(ArenaConfig::default()))),
        Strategy::System => Box::new(GlobalPairs(System)),
        Strategy::Mimalloc => Box::new(GlobalPairs(MiMalloc)),
        Strategy::Jemalloc => Box::new(GlobalPairs(Jemalloc)),
        Strategy::Bumpalo => Box::new(BumpPairs { bump: Bump::new() }),
        Strategy::Rlsf => Box::new(PeerPairs(TlsfHeap::new(PAIRS_POOL))),
        Strategy::Talc => Box::new(PeerPairs(TalcHeap::new(PAIRS_POOL))),
        Strategy::Bare => return None,
    })
}

/// Arena pairs outside any run (what [`Strategy::Shared`] does, without the
/// lock).
pub fn arena_pairs_outside_runs() -> Box<dyn Pairs> {
    Box::new(ArenaPairs {
        arena: Arena::new(ArenaConfig::default()),
        in_run: false,
    })
}

/// [`Strategy::Arena`] pairs: the batch is one run (or no run at all).
struct ArenaPairs {
    arena: Arena,
    in_run: bool,
}

impl Pairs for ArenaPairs {
    fn pairs(&mut self, sizes: &[usize]) {
        if self.in_run {
            let r = self.arena.begin_run();
            for &len in sizes {
                black_box(r.try_alloc(len).expect("allocation failed"));
            }
            r.finish();
        } else {
            for &len in sizes {
                black_box(self.arena.try_alloc(len).expect("allocation failed"));
            }
        }
    }
}

/// [`Strategy::Planned`] pairs: the batch is one planned run.
struct PlannedPairs {
    arena: Arena,
    plan: Arc<Plan>,
}

impl Pairs for PlannedPairs {
    fn pairs(&mut self, sizes: &[usize]) {
        let r = self
            .arena
            .begin_planned_run(Arc::clone(&self.plan))
            .expect("the plan's block could not be drawn");
        for &len in sizes {
            black_box(r.try_alloc(len).expect("allocation failed"));
        }
        r.finish();
    }
}

/// Planned pairs through a [`ScopedRun`](tensor_arena::ScopedRun): the
/// batch is one run that holds the arena exclusively, its blocks borrowing
/// the run (the plan is recorded once, dynamically, as for
/// [`Strategy::Planned`]).
pub fn planned_scoped_pairs(sizes: &[usize]) -> Box<dyn Pairs> {
    let (arena, plan) = learned(sizes);
    Box::new(ScopedPairs { arena, plan })
}

/// A fresh arena that ran the batch `sizes` once, recorded, and its plan.
fn learned(sizes: &[usize]) -> (Arena, Arc<Plan>) {
    let arena = Arena::new(ArenaConfig::default());
    let r = arena.begin_recorded_run();
    for &len in sizes {
        black_box(r.try_alloc(len).expect("allocation failed"));
    }
    let (_, recording) = r.finish_with_recording();
    let plan = Arc::new(Plan::from_recording(&recording).expect("a recorded run plans"));
    (arena, plan)
}

/// [`planned_scoped_pairs`]: the batch is one scoped run.
struct ScopedPairs {
    arena: Arena,
    plan: Arc<Plan>,
}

impl Pairs for ScopedPairs {
    fn pairs(&mut self, sizes: &[usize]) {
        let r = self
            .arena
            .begin_scoped_run(&self.plan)
            .expect("the plan's block could not be drawn");
        for &len in sizes {
            black_box(r.try_alloc(len).expect("allocation failed"));
        }
        r.finish();
    }
}

/// Dynamic pairs through a [`ScopedRun`](tensor_arena::ScopedRun) with no
/// plan: the batch is one run that holds the arena exclusively, its blocks
/// borrowing the run.
pub fn arena_scoped_pairs() -> Box<dyn Pairs> {
    Box::new(DynamicScopedPairs {
        arena: Arena::new(ArenaConfig::default()),
    })
}

/// [`arena_scoped_pairs`].
struct DynamicScopedPairs {
    arena: Arena,
}

impl Pairs for DynamicScopedPairs {
    fn pairs(&mut self, sizes: &[usize]) {
        let r = self
            .arena
            .begin_scoped_dynamic_run()
            .expect("no run is open");
        for &len in sizes {
            black_box(r.try_alloc(len).expect("allocation failed"));
        }
        r.finish();
    }
}

/// Pairs on `shared`, which other threads may use at the same time: two
/// lock acquisitions per pair.
pub fn shared_pairs(shared: Arc<SharedArena>) -> Box<dyn Pairs> {
    Box::new(SharedPairs { shared })
}

/// [`Strategy::Shared`] pairs.
struct SharedPairs {
    shared: Arc<SharedArena>,
}

impl Pairs for SharedPairs {
    fn pairs(&mut self, sizes: &[usize]) {
        for &len in sizes {
            black_box(self.shared.try_alloc(len).expect("allocation failed"));
        }
    }
}

/// A `GlobalAlloc` used directly.
struct GlobalPairs<G: GlobalAlloc>(G);

impl<G: GlobalAlloc + Send> Pairs for GlobalPairs<G> {
    fn pairs(&mut self, sizes: &[usize]) {
        for &len in sizes {
            let layout = Layout::from_size_align(len, ALIGN).expect("valid layout");
            // SAFETY: `layout` has a non-zero size (sizes are >= 1 KiB).
            let ptr = unsafe { self.0.alloc(layout) };
            assert!(!ptr.is_null(), "allocation failed");
            // SAFETY: `ptr` was allocated by this allocator with `layout`,
            // and is freed once.
            unsafe { self.0.dealloc(black_box(ptr), layout) };
        }
    }
}

/// [`Strategy::Bumpalo`] pairs: allocations, one reset per batch (a bump
/// allocator's "free").
struct BumpPairs {
    bump: Bump,
}

impl Pairs for BumpPairs {
    fn pairs(&mut self, sizes: &[usize]) {
        for &len in sizes {
            let layout = Layout::from_size_align(len, ALIGN).expect("valid layout");
            black_box(self.bump.alloc_layout(layout));
        }
        self.bump.reset();
    }
}

/// [`Strategy::Rlsf`] and [`Strategy::Talc`] pairs over a pool of
/// [`PAIRS_POOL`] bytes.
struct PeerPairs<H: PoolHeap>(H);

impl<H: PoolHeap> Pairs for PeerPairs<H> {
    fn pairs(&mut self, sizes: &[usize]) {
        for &len in sizes {
            let layout = Layout::from_size_align(len, ALIGN).expect("valid layout");
            let ptr = self.0.alloc(layout).expect("allocation failed");
            // SAFETY: `ptr` was allocated by this heap with `layout`, and is
            // freed once.
            unsafe { self.0.free(black_box(ptr), layout) };
        }
    }
}
