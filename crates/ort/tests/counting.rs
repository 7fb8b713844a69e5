//! Every allocation of a run goes through the registered allocator and
//! lands in the worker's arena: the process-wide `Alloc`/`Free` counters are
//! compared with the arena's (this binary holds this one test, so no other
//! test's calls mix in).

#[allow(dead_code)]
#[path = "all/common.rs"]
mod common;

use common::*;
use tensor_arena_ort::ort::value::DynValue;
use tensor_arena_ort::{allocator_counters, ArenaOptions, ArenaSession};

#[test]
fn every_allocation_of_a_run_is_an_arena_block() {
    for (file, shape) in [
        ("ppocr_rec.onnx", [1usize, 3, 48, 320]),
        ("densenet121_batch.onnx", [1, 3, 224, 224]),
    ] {
        let session = ArenaSession::open(runtime(), model(file), ArenaOptions::default()).unwrap();
        let name = session.inputs()[0].name.clone();
        let input = inputs(session.inputs(), &[(name.as_str(), &shape)], 0);
        let mut worker = session.worker().unwrap();
        for pass in 0..3 {
            let before = allocator_counters();
            let arena_before = worker.stats();
            let input: Vec<(&str, &DynValue)> =
                input.iter().map(|(n, v)| (n.as_str(), v)).collect();
            let out = worker.run(&input).unwrap();
            let during = allocator_counters();
            let calls = during.alloc_calls - before.alloc_calls;
            // Every call of the run, on any thread, became a block of the run.
            assert_eq!(calls, out.report.allocs, "{file} pass {pass}");
            assert_eq!(calls, out.alloc_calls, "{file} pass {pass}");
            assert_eq!(
                during.system_allocs, before.system_allocs,
                "{file}: a tensor bypassed the arena"
            );
            assert_eq!(worker.stats().allocs - arena_before.allocs, calls);
            // Intermediates were freed during the run; the outputs are the
            // run's only live blocks, freed when dropped.
            let outputs = out.outputs.len() as u64;
            assert_eq!(out.report.leaked_blocks as u64, outputs, "{file}");
            assert_eq!(
                during.free_calls - before.free_calls,
                calls - outputs,
                "{file}"
            );
            drop(out);
            let after = allocator_counters();
            assert_eq!(
                after.free_calls - before.free_calls,
                calls,
                "{file}: a block was not given back"
            );
            assert_eq!(worker.stats().in_use, 0);
            assert!(calls > 100, "{file}: {calls} allocations");
            if pass > 0 {
                assert_eq!(
                    worker.stats().planned_allocs - arena_before.planned_allocs,
                    calls
                );
            }
        }
    }
}
