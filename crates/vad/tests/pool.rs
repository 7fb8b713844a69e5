//! A pool of 2 workers on 20 "files" of mixed lengths: the same results as
//! one thread, bitwise; arenas empty after every run; and, on a second pass
//! over the same lengths, no backing call at all.
//!
//! The files are cut from the reference recording at 1 to 37 windows (and a
//! few samples of a partial window): small, so that the debug build stays
//! fast (the unoptimized kernels do a few hundred windows per second).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::data_path;
use tensor_session::{
    LoadMode, MmapAck, ModelHandle, Session, SessionConfig, SessionPool, SessionStats,
};
use tensor_vad::{key, load_weights, num_windows, Detector, WINDOW};

/// Windows per file; 13 distinct lengths.
const LENGTHS: [usize; 20] = [
    3, 17, 1, 9, 30, 5, 17, 2, 37, 9, 1, 24, 5, 12, 30, 3, 7, 2, 12, 24,
];

/// File `i`: `LENGTHS[i]` windows plus `i * 7` samples, read from the
/// recording from offset `i * 4099` on, wrapping around.
fn files() -> Vec<Vec<i16>> {
    let speech = tensor_vad::wav::read(data_path("speech.wav"))
        .unwrap()
        .samples;
    LENGTHS
        .iter()
        .enumerate()
        .map(|(i, &l)| {
            let n = l * WINDOW + i * 7;
            (0..n)
                .map(|k| speech[(i * 4099 + k) % speech.len()])
                .collect()
        })
        .collect()
}

fn probs_of(session: &mut Session, audio: &[i16]) -> Vec<f32> {
    let mut probs = vec![0.0; num_windows(audio.len())];
    Detector::new()
        .process_chunked(session, audio, 0, &mut probs, |_, _| {})
        .unwrap();
    probs
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// One pass of 2 workers over every file; returns each file's
/// probabilities, and each worker's session stats before and after.
fn pass(
    pool: &SessionPool,
    files: &[Vec<i16>],
) -> (Vec<Vec<u32>>, Vec<(SessionStats, SessionStats)>) {
    let next = AtomicUsize::new(0);
    let results = Mutex::new(vec![Vec::new(); files.len()]);
    let stats = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let mut session = pool.get();
                    let before = session.stats();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= files.len() {
                            break;
                        }
                        let p = probs_of(&mut session, &files[i]);
                        let st = session.stats();
                        assert_eq!(st.arena.in_use, 0, "file {i}: arena back to zero");
                        assert!(session.live_blocks().is_empty());
                        let r = st.last_run.unwrap();
                        assert_eq!(r.leaked_blocks, 0);
                        results.lock().unwrap()[i] = bits(&p);
                    }
                    (before, session.stats())
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap())
            .collect::<Vec<_>>()
    });
    (results.into_inner().unwrap(), stats)
}

#[test]
fn two_workers_match_one_thread_with_no_backing_call_in_steady_state() {
    // SAFETY: the committed model file is only read, never written, by the test suite.
    let mmap = LoadMode::Mmap(unsafe { MmapAck::new() });
    let weights = Arc::new(load_weights(data_path("silero_vad_16k_v6.safetensors"), mmap).unwrap());
    let files = files();

    // Single-threaded reference, on its own session.
    let mut single = Session::new(Arc::clone(&weights), SessionConfig::default());
    let expected: Vec<Vec<u32>> = files
        .iter()
        .map(|f| bits(&probs_of(&mut single, f)))
        .collect();

    let pool = SessionPool::new(ModelHandle::new(weights), SessionConfig::default(), 2);

    // Pass 1: lengths are new; the family learns one plan per length.
    let (got, _) = pass(&pool, &files);
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(
            g, e,
            "file {i} ({} windows) differs from one thread",
            LENGTHS[i]
        );
    }
    assert_eq!(pool.sessions(), 2);
    let mut distinct: Vec<usize> = LENGTHS.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(pool.stats().plans.plans, distinct.len());

    // Warm both clones for the lengths seen (by either clone): a clone may
    // get, in pass 2, a length only the other one ran. The largest plan
    // covers all; see `warm` below for why the arena is emptied first.
    {
        let mut a = pool.get();
        let mut b = pool.get();
        for s in [&mut *a, &mut *b] {
            warm(s, &distinct);
        }
    }

    // Pass 2: the same lengths, in whatever order the workers take them.
    let (got, stats) = pass(&pool, &files);
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(g, e, "pass 2, file {i} differs");
    }
    for (w, (before, after)) in stats.iter().enumerate() {
        let runs = after.runs - before.runs;
        assert_eq!(
            after.arena.backing_allocs - before.arena.backing_allocs,
            0,
            "worker {w}: backing calls in steady state ({runs} runs)"
        );
        assert_eq!(
            after.arena.planned_runs - before.arena.planned_runs,
            runs,
            "worker {w}: every run planned"
        );
        assert_eq!(after.arena.deviations, before.arena.deviations);
    }
    let total: u64 = stats.iter().map(|(b, a)| a.runs - b.runs).sum();
    assert_eq!(total, files.len() as u64);
}

/// Prepares an idle clone for every key in `lengths`: `Session::warm`
/// lays an idle arena out again as one region big enough for the plan (and
/// for the runs it has seen), so the next runs make no backing call.
fn warm(session: &mut Session, lengths: &[usize]) {
    for &l in lengths {
        assert!(session.warm(&key(l)).unwrap(), "the family has the plan");
    }
    assert_eq!(session.stats().arena.regions, 1);
}
