//! The allocation traces PyTorch made on an H100 (`traces/gpu/`, recorded
//! by `tools/gpu-check/record_traces.py`): DenseNet-121, ResNet-50 and
//! BERT-base through the native CUDA allocator, workspaces and the first
//! run's one-time blocks included. Planned as a session would be (by input
//! shape, in the order recorded and ascending), no run reaches higher than
//! the same run on a fresh dynamic arena, plus a granule, but one: BERT's
//! second run at 8x512 in the order recorded is served on the plan its
//! first made, and that first run of the process held cuBLAS's one-time
//! workspace. The plan's block is sized for it; the second run, without
//! it, leaves the plan and reaches 177.2 MB against the dynamic run's
//! 176.2 MB (1.006x; 185.6 MB, 1.053x, before the structure's first
//! search went deep). It is held to 1% over, and every other run to the
//! granule.

use crate::common::{read_trace, TraceRun};
use std::collections::HashMap;
use std::sync::Arc;
use tensor_arena::{Arena, ArenaConfig, Block, Heap, Plan, PlanCache, RunReport};

pub(crate) type HeapArena = Arena<Heap<tensor_arena::allocator_api2::alloc::Global>>;

/// Runs `run` on `arena`, on `plan` if given (else recorded), checking
/// that no block's ends are overwritten.
pub(crate) fn replay(
    arena: &HeapArena,
    plan: Option<Arc<Plan>>,
    run: &TraceRun,
) -> (RunReport, tensor_arena::Recording) {
    let r = match plan {
        Some(p) => arena.begin_planned_run(p).unwrap(),
        None => arena.begin_recorded_run(),
    };
    let mut live: HashMap<
        usize,
        (
            Block<'_, Heap<tensor_arena::allocator_api2::alloc::Global>>,
            u8,
        ),
    > = HashMap::new();
    for &(alloc, id, bytes) in &run.events {
        if alloc {
            // Its first and last bytes marked (blocks of up to 400 MB:
            // the pages between are never touched).
            let mut b = r.try_alloc(bytes).unwrap();
            let seed = (id as u8) ^ 0x3c;
            let last = b.len() - 1;
            b[0] = seed;
            b[last] = seed.wrapping_add(1);
            live.insert(id, (b, seed));
        } else {
            let (b, seed) = live.remove(&id).unwrap();
            let last = b.len() - 1;
            assert!(
                b[0] == seed && b[last] == seed.wrapping_add(1),
                "block {id} overwritten"
            );
        }
    }
    drop(live);
    r.finish_with_recording()
}

pub(crate) fn arena() -> HeapArena {
    Arena::with_backing(
        ArenaConfig::default(),
        tensor_arena::allocator_api2::alloc::Global,
    )
}

#[test]
fn gpu_traces_planned_never_above_no_plan() {
    let granule = ArenaConfig::default().alignment;
    let mut planned_runs = 0;
    for model in ["densenet121", "resnet50", "bert"] {
        let runs = read_trace(&format!("gpu/{model}-mixed.trace"));
        assert!(runs.len() >= 5, "{model}: {} runs", runs.len());
        let mut ascending = runs.clone();
        ascending.sort_by_key(TraceRun::lower_bound);
        for (order, runs) in [("recorded", &runs), ("ascending", &ascending)] {
            let arena = arena();
            let cache: PlanCache<String> = PlanCache::new(64);
            for run in runs {
                let lookup = cache.lookup(run.label.as_str());
                let (report, rec) = replay(&arena, lookup.plan.clone(), run);
                cache.after_run(run.label.as_str(), &lookup, &report, &rec, true);
                let (dynamic, _) = replay(&arena_fresh(), None, run);
                let known = model == "bert" && order == "recorded" && report.deviated;
                let bound = if known {
                    dynamic.high_water + dynamic.high_water / 100
                } else {
                    dynamic.high_water + granule
                };
                assert!(
                    report.high_water <= bound,
                    "{model} {order} {}: {:?} (deviated: {}) high-water {} over the dynamic run's {}",
                    run.label,
                    lookup.source,
                    report.deviated,
                    report.high_water,
                    dynamic.high_water
                );
                planned_runs += usize::from(report.planned);
                arena.check_invariants();
            }
        }
    }
    assert!(planned_runs >= 8, "{planned_runs} planned runs");
}

fn arena_fresh() -> HeapArena {
    arena()
}

/// BERT-base's run at 8x512 (its second in the order recorded: no one-time
/// blocks), learned from its recording, is planned at its lower bound: the
/// structure's first search goes deep. Its layers' feed-forward pairs of
/// 48 MiB sit between 12 MiB blocks that span two layers; with the search
/// budget of the structure's later shapes it packed at 1.091x (151.0 MB
/// against 138.4). Fails when the first search is no deeper than the rest.
#[test]
fn bert_at_512_is_planned_at_its_lower_bound() {
    let runs = read_trace("gpu/bert-mixed.trace");
    let run = runs
        .iter()
        .rev()
        .find(|r| r.label == "8x512")
        .expect("a run at 8x512");
    let a = arena();
    let (_, recording) = replay(&a, None, run);
    let plan = Plan::from_recording(&recording).unwrap();
    let granule = ArenaConfig::default().alignment;
    assert!(
        plan.size() <= plan.lower_bound() + granule,
        "{} against a lower bound of {}",
        plan.size(),
        plan.lower_bound()
    );
    // And a run on it stays there.
    let (report, _) = replay(&a, Some(Arc::new(plan.clone())), run);
    assert!(!report.deviated);
    assert!(report.high_water <= plan.size().next_multiple_of(granule));
}

/// BERT-base in ascending order through a plan cache, as a process would
/// meet it: 8x64 twice, 8x128, then 8x512 (its run without the one-time
/// blocks). 8x512 is predicted at its lower bound, and so is the plan its
/// key keeps: the plans learned from the runs before it went on searching
/// where the order of the shape before left them loose. Searched only as
/// far as a prediction on the run's path is, the 8x512 prediction was laid
/// out at 1.091x (151.0 MB against 138.4) and kept as the key's plan so.
///
/// Then the trace's other 8x512 run, the one that held the process's
/// one-time cuBLAS blocks (32 MiB and 1 MiB, live to its end, where the
/// plan allocates a 12 MiB block): it keeps to the key's plan, those two
/// beside it, and reaches its own lower bound. Taken as the plan's block
/// come larger, it left the plan and reached 1.30x (222.3 MB against
/// 173.0).
#[test]
fn bert_ascending_is_predicted_and_kept_at_its_lower_bound() {
    let runs = read_trace("gpu/bert-mixed.trace");
    let find = |label: &str, last: bool| {
        let mut it = runs.iter().filter(|r| r.label == label);
        if last { it.next_back() } else { it.next() }.expect("a run of that label")
    };
    let order = [
        find("8x64", false),
        find("8x64", true),
        find("8x128", false),
        find("8x512", true),
        find("8x512", false),
    ];
    let a = arena();
    let cache: PlanCache<String> = PlanCache::new(16);
    let granule = ArenaConfig::default().alignment;
    for (i, run) in order.into_iter().enumerate() {
        let lookup = cache.lookup(run.label.as_str());
        let (report, recording) = replay(&a, lookup.plan.clone(), run);
        cache.after_run(run.label.as_str(), &lookup, &report, &recording, true);
        if i == 4 {
            assert_eq!(lookup.source, tensor_arena::PlanSource::Exact);
            assert!(!report.deviated, "{report:?}");
            assert!(
                report.high_water <= run.lower_bound() + granule,
                "{} against its lower bound of {}",
                report.high_water,
                run.lower_bound()
            );
        } else if run.label == "8x512" {
            assert_eq!(lookup.source, tensor_arena::PlanSource::Predicted);
            let plan = lookup.plan.as_ref().expect("predicted");
            assert!(!report.deviated);
            assert!(
                plan.size() <= plan.lower_bound() + plan.lower_bound() / 64 + granule,
                "predicted at {} against a lower bound of {}",
                plan.size(),
                plan.lower_bound()
            );
        }
    }
    let kept = cache.lookup("8x512");
    assert_eq!(kept.source, tensor_arena::PlanSource::Exact);
    let plan = kept.plan.expect("the key's plan");
    assert!(
        plan.size() <= plan.lower_bound() + plan.lower_bound() / 64 + granule,
        "kept at {} against a lower bound of {}",
        plan.size(),
        plan.lower_bound()
    );
}

/// ResNet-50 on a plan store, as a second replica meets it: a process
/// learns every run of the trace but the first and saves; a fresh process
/// loads the file, and the first run (batch 64, its key's plan a core plan
/// learned from a run that served cuDNN's workspaces beside it) keeps to
/// the loaded plan, serving its workspaces beside it, at its lower bound.
/// Loaded without the plan's mark, its first workspace was taken as a
/// block come larger: the run left its plan and reached 1.145x (809.2 MB
/// against 706.5).
#[test]
fn resnet_on_a_plan_store_serves_its_workspaces_beside_the_loaded_plan() {
    let runs = read_trace("gpu/resnet50-mixed.trace");
    let a = arena();
    let learner: PlanCache<String> = PlanCache::new(64);
    for run in &runs[1..] {
        let lookup = learner.lookup(run.label.as_str());
        let (report, recording) = replay(&a, lookup.plan.clone(), run);
        learner.after_run(run.label.as_str(), &lookup, &report, &recording, true);
    }
    let dir = tempfile::tempdir().unwrap();
    let key = tensor_arena::ModelKey::new(b"resnet50", "trace", "");
    tensor_arena::PlanStore::new(dir.path(), key.clone())
        .save(&learner)
        .unwrap();
    let replica: PlanCache<String> = PlanCache::new(64);
    let loaded = tensor_arena::PlanStore::new(dir.path(), key).load(&replica);
    assert_eq!(loaded.warning, None);
    let first = &runs[0];
    let lookup = replica.lookup(first.label.as_str());
    assert_eq!(lookup.source, tensor_arena::PlanSource::Exact);
    assert!(lookup.plan.as_ref().unwrap().workspaces_apart());
    let (report, _) = replay(&arena(), lookup.plan.clone(), first);
    let granule = ArenaConfig::default().alignment;
    assert!(
        report.high_water <= first.lower_bound() + granule,
        "{} against its lower bound of {}",
        report.high_water,
        first.lower_bound()
    );
}
