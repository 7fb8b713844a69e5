//! Several threads on one session: each its own arena, results identical to
//! one thread, nothing left after everything is dropped.

use crate::common::*;
use tensor_arena_ort::ort::value::DynValue;
use tensor_arena_ort::{ArenaOptions, ArenaSession, RunOutput};

#[test]
fn four_threads_share_one_session() {
    let session =
        ArenaSession::open(runtime(), model("ppocr_rec.onnx"), ArenaOptions::default()).unwrap();
    let shapes: [&[usize]; 4] = [
        &[1, 3, 48, 640],
        &[1, 3, 48, 120],
        &[1, 3, 48, 640],
        &[1, 3, 48, 320],
    ];
    let runs: Vec<_> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| inputs(session.inputs(), &[("x", s)], i as u64))
        .collect();
    let expected = plain_bits("ppocr_rec.onnx", &runs);
    let run_all = |kept: &mut Vec<RunOutput>| {
        let mut worker = session.worker().unwrap();
        let mut got = Vec::new();
        for _ in 0..2 {
            for r in &runs {
                let input: Vec<(&str, &DynValue)> =
                    r.iter().map(|(n, v)| (n.as_str(), v)).collect();
                let out = worker.run(&input).unwrap();
                assert_eq!(out.alloc_calls, out.report.allocs);
                got.push(bits(out.outputs.iter().map(|(n, v)| (n.as_str(), v))));
                kept.push(out);
            }
            // Keep only the last output of each pass alive.
            kept.drain(..kept.len() - 1);
        }
        (got, worker.stats())
    };
    let (kept, per_thread): (Vec<Vec<RunOutput>>, Vec<_>) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let mut kept = Vec::new();
                    let (got, stats) = run_all(&mut kept);
                    (kept, got, stats)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                let (kept, got, stats) = h.join().unwrap();
                for (i, g) in got.iter().enumerate() {
                    assert!(
                        *g == expected[i % runs.len()],
                        "a thread's run {i} differs from one thread's"
                    );
                }
                (kept, stats)
            })
            .unzip()
    });
    // Each thread's tensors came from its own arena.
    for st in &per_thread {
        assert_eq!(st.runs, 8);
        assert!(st.allocs > 8 * 100);
    }
    // The workers are gone; their outputs keep their arenas (and only them).
    let (each, sum) = session.arenas();
    assert_eq!(
        each.len(),
        4,
        "one arena per thread, kept by its live output"
    );
    assert_eq!(sum.live_blocks, 4);
    // Freed on this thread: each block finds its owner, and the last one
    // drops its arena.
    drop(kept);
    let (each, sum) = session.arenas();
    assert!(
        each.is_empty(),
        "arenas left after everything was dropped: {each:?}"
    );
    assert_eq!(sum.reserved, 0);
}
