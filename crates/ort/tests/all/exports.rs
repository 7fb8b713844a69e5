//! Every type a public function of tensor-arena-ort returns (or its result
//! holds) is named through tensor-arena-ort alone: a server need not depend
//! on the arena crate to write the types down. This file compiles only if
//! they are re-exported.

use tensor_arena_ort::{
    ArenaError, Deviation, DynamicReason, FamilyCounts, FamilyStats, PlanCache, PlanSource,
    PlanStats, Plans, RunInfo, RunReport, Stats, Trace, Worker, WorkerOptions,
};

/// The types as a server writes them down.
fn named(plans: &Plans, info: &RunInfo, worker: &mut Worker) -> (PlanStats, FamilyCounts) {
    let stats: PlanStats = plans.stats();
    let _families: Vec<FamilyStats> = plans.families();
    let _cache: &PlanCache<tensor_arena_ort::RunKey> = plans.cache();
    let _report: &RunReport = &info.report;
    let _deviation: Option<Deviation> = info.report.deviation;
    let _plan: Option<PlanSource> = info.plan;
    let _stats: Stats = worker.stats();
    let _trace: Trace = worker.take_trace();
    let _err: Option<&ArenaError> = None;
    (stats, stats.runs)
}

#[test]
fn returned_types_are_reexported() {
    let plans = Plans::default();
    let mut worker = Worker::new(WorkerOptions::default()).unwrap();
    let key = tensor_arena_ort::RunKey::from_shapes([[1i64, 2]]);
    worker.run(&plans, &key, || Ok::<(), ()>(())).unwrap();
    let info = worker.last_run().unwrap().clone();
    let (stats, runs) = named(&plans, &info, &mut worker);
    assert_eq!(stats.runs, runs);
    assert_eq!(
        info.plan,
        Some(PlanSource::Dynamic(DynamicReason::NewFamily)),
        "{info:?}"
    );
}
