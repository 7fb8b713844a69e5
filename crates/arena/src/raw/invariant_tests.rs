//! [`RawArena::check_invariants`] against states that break an invariant
//! it checks, made by hand (no public path makes them): each must panic.

use super::RawArena;
use crate::memory::Heap;
use crate::plan::{Plan, Recording};
use crate::ArenaConfig;
use allocator_api2::alloc::Global;
use std::sync::Arc;

/// A plan of one block of 4 KiB.
fn plan() -> Arc<Plan> {
    let mut rec = Recording::new();
    let a = rec.alloc(4096, 64);
    rec.free(a);
    Arc::new(Plan::from_recording(&rec).expect("a valid recording"))
}

/// At most one plan's block is whole at a time (the open run's): moving to
/// a larger plan grows the held block, never draws a second beside it.
/// Two whole plan blocks, drawn by hand, fail the invariants (and nothing
/// else does: with one, they hold).
#[test]
#[should_panic]
fn two_whole_plan_blocks_break_the_invariants() {
    let mut core = RawArena::new(ArenaConfig::default(), Heap::new(Global)).unwrap();
    core.begin_run(Some(plan()), false).unwrap();
    // The open run's block, whole: the invariants hold.
    core.check_invariants();
    // A second block drawn beside it, whole too.
    let _second = core.draw_plan_block(plan()).unwrap();
    core.check_invariants();
}
