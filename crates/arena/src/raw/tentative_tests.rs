//! A block more than twice the plan's next slot, on a plan whose sizes a
//! run made and on a prediction no run kept to.

use super::super::RawArena;
use crate::memory::Heap;
use crate::plan::{Deviation, Plan, Recording};
use crate::ArenaConfig;
use allocator_api2::alloc::Global;
use std::sync::Arc;

const MIB: usize = 1 << 20;

/// `a` (8 MiB) live throughout; `b` (2 MiB), `c` (3 MiB), `d` (2 MiB)
/// together, then freed.
fn plan() -> Plan {
    let mut rec = Recording::new();
    let a = rec.alloc(8 * MIB, 64);
    let b = rec.alloc(2 * MIB, 64);
    let c = rec.alloc(3 * MIB, 64);
    let d = rec.alloc(2 * MIB, 64);
    rec.free(b);
    rec.free(c);
    rec.free(d);
    rec.free(a);
    Plan::from_recording(&rec).expect("a valid recording")
}

/// The plan's events with a block of 5 MiB after `a`, live to the end:
/// the run's report.
fn run_with_a_large_block(plan: Plan) -> crate::RunReport {
    let mut core = RawArena::new(ArenaConfig::default(), Heap::new(Global)).unwrap();
    core.begin_run(Some(Arc::new(plan)), true).unwrap();
    let a = core.alloc(8 * MIB, 64).unwrap().handle;
    let x = core.alloc(5 * MIB, 64).unwrap().handle;
    let blocks: Vec<_> = [2, 3, 2]
        .iter()
        .map(|&m| core.alloc(m * MIB, 64).unwrap().handle)
        .collect();
    for h in blocks {
        core.free(h).unwrap();
    }
    core.free(a).unwrap();
    core.free(x).unwrap();
    let (report, _) = core.finish_run();
    core.check_invariants();
    report
}

/// On a plan of a run's recording, the block is one the plan does not
/// have: the plan's next block comes at its size after it, and the run
/// keeps to its plan.
#[test]
fn on_a_runs_plan_a_large_block_followed_by_the_plans_next_is_extra() {
    let report = run_with_a_large_block(plan());
    assert!(!report.deviated, "{report:?}");
}

/// On a prediction no run kept to, the same block is the prediction's
/// error: the run leaves its plan at it, as it always did (served beside
/// the plan and taken as extra, a run whose block the fit missed went on
/// one slot off and beside the plan: at 1,200 random families such runs
/// broke the envelope each run is held to).
#[test]
fn on_a_prediction_a_large_block_is_the_plans_come_larger() {
    let report = run_with_a_large_block(plan().predicted());
    assert!(report.deviated, "{report:?}");
    assert_eq!(report.deviation, Some(Deviation::Larger));
}
