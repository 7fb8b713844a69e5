//! The process's default memory limit (`TENSOR_ARENA_MEMORY_LIMIT`,
//! `set_default_memory_limit`): a run that would pass it fails alone with
//! an out-of-memory error, and the next run succeeds. The limit's source is
//! the test's own small value, never the machine's memory. (A binary of its
//! own: the default is the process's.)

#[allow(dead_code)]
#[path = "all/common.rs"]
mod common;

use common::*;
use tensor_arena::Budget;
use tensor_arena_ort::ort::value::DynValue;
use tensor_arena_ort::{
    default_budget, default_memory_limit, run_shared, set_default_memory_limit, ArenaOptions,
    ArenaSession, LimitSource, MemoryLimit, RunKey, Worker, WorkerOptions, MEMORY_LIMIT_ENV,
};

fn run_on(
    worker: &mut Worker,
    session: &ArenaSession,
    inputs: &[(String, DynValue)],
) -> Result<Bits, String> {
    let input: Vec<(&str, &DynValue)> = inputs.iter().map(|(n, v)| (n.as_str(), v)).collect();
    let key = RunKey::of(input.as_slice());
    let outputs = worker.run(session.plans(), &key, || {
        run_shared(session.session(), &input, None).map_err(|e| e.to_string())
    })?;
    Ok(bits(outputs.iter().map(|(n, v)| (n.as_str(), v))))
}

#[test]
fn a_run_over_the_default_limit_fails_alone_and_the_next_succeeds() {
    // The environment's word, read while no worker exists.
    std::env::set_var(MEMORY_LIMIT_ENV, "24M");
    assert_eq!(
        default_memory_limit().unwrap(),
        Some(MemoryLimit {
            bytes: 24 << 20,
            source: LimitSource::Environment
        })
    );
    std::env::set_var(MEMORY_LIMIT_ENV, "a lot");
    let err = default_memory_limit().unwrap_err();
    assert!(err.to_string().contains(MEMORY_LIMIT_ENV), "{err}");
    std::env::remove_var(MEMORY_LIMIT_ENV);

    let det = ArenaSession::open(
        runtime(),
        model("ppocr_det.onnx"),
        ArenaOptions {
            budget: Some(Budget::new(usize::MAX)),
            ..ArenaOptions::default()
        },
    )
    .unwrap();
    let large = inputs(det.inputs(), &[("x", &[1, 3, 640, 640])], 1);
    let small = inputs(det.inputs(), &[("x", &[1, 3, 160, 160])], 2);
    let expected = plain_bits(
        "ppocr_det.onnx",
        &[inputs(det.inputs(), &[("x", &[1, 3, 160, 160])], 2)],
    );
    // What each run needs, on a worker with a budget of its own (the
    // default is not made yet).
    let need = |x: &[(String, DynValue)]| {
        let mut probe = Worker::new(WorkerOptions {
            budget: Some(Budget::new(usize::MAX)),
            ..WorkerOptions::default()
        })
        .unwrap();
        run_on(&mut probe, &det, x).unwrap();
        probe.stats().reserved
    };
    let (large_need, small_need) = (need(&large), need(&small));
    assert!(large_need > 2 * small_need, "{large_need} {small_need}");
    // The code's word wins over the environment's, before the first
    // worker without a budget: room for the small run, not the large.
    let limit = (large_need + small_need) / 2;
    set_default_memory_limit(Some(limit)).unwrap();
    assert_eq!(default_memory_limit().unwrap().unwrap().bytes, limit);

    let mut worker = Worker::new(WorkerOptions::default()).unwrap();
    let budget = default_budget().unwrap().expect("a default budget");
    assert_eq!(budget.limit(), limit);
    let t = std::time::Instant::now();
    let Err(err) = run_on(&mut worker, &det, &large) else {
        panic!("the run over the limit succeeded");
    };
    assert!(err.contains("bad_alloc"), "{err}");
    assert!(t.elapsed().as_secs() < 30);
    let info = worker.last_run().unwrap();
    assert!(info.out_of_memory(), "{info:?}");
    let st = budget.stats();
    assert!(st.refusals > 0 && st.peak_committed <= limit, "{st:?}");
    assert_eq!(worker.stats().in_use, 0, "a failed run left blocks live");
    // The next run succeeds, with the right outputs, and memory follows it
    // down.
    assert_eq!(run_on(&mut worker, &det, &small).unwrap(), expected[0]);
    let reserved = worker.stats().reserved;
    assert!(
        reserved <= small_need + (2 << 20),
        "reserved {reserved}, the small run needs {small_need}"
    );
    // Too late to change it now; and a limit of 0 is no limit.
    assert!(set_default_memory_limit(Some(1 << 30)).is_err());
    assert!(set_default_memory_limit(Some(0)).is_err());
    assert_eq!(default_budget().unwrap().unwrap().limit(), limit);
}
