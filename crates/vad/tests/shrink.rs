//! A long file, then many short ones, with a shrink policy on: the bytes a
//! session reserves come down to what the short files need.
//!
//! Lengths are small for the debug build: "long" is 120 windows (3.8 s),
//! "short" 2 to 5 windows; memory is linear in the length, so the ratio is
//! what matters.

mod common;

use std::sync::Arc;

use common::data_path;
use tensor_arena::ShrinkPolicy;
use tensor_session::{LoadMode, MmapAck, Session, SessionConfig};
use tensor_vad::{key, load_weights, peak_len, Detector, WINDOW};

const LONG: usize = 120;
const SHORT: [usize; 12] = [3, 5, 2, 4, 5, 3, 2, 4, 5, 3, 4, 2];

fn session(policy: ShrinkPolicy) -> Session {
    // SAFETY: the committed model file is only read, never written, by the test suite.
    let mmap = LoadMode::Mmap(unsafe { MmapAck::new() });
    let weights = load_weights(data_path("silero_vad_16k_v6.safetensors"), mmap).unwrap();
    let mut config = SessionConfig::default();
    config.arena.shrink_policy = policy;
    Session::new(Arc::new(weights), config)
}

fn run(s: &mut Session, audio: &[i16], l: usize) -> tensor_arena::RunReport {
    let mut probs = vec![0.0; l];
    Detector::new()
        .process(s, &audio[..l * WINDOW], &mut probs)
        .unwrap();
    let st = s.stats();
    assert_eq!(st.arena.in_use, 0);
    st.last_run.unwrap()
}

/// `bytes` as the session's arena commits them: rounded up to its memory
/// layer's commit step (base pages for these small sizes).
fn up(s: &Session, bytes: usize) -> usize {
    bytes.next_multiple_of(s.arena().memory_props().commit_step(bytes))
}

/// Bytes of the family's plan for `l` windows.
fn plan_size(s: &Session, l: usize) -> usize {
    s.plans().get(&key(l)[..]).unwrap().size()
}

#[test]
fn after_runs_below_follows_the_short_files() {
    let audio = tensor_vad::wav::read(data_path("speech.wav"))
        .unwrap()
        .samples;
    let mut s = session(ShrinkPolicy::AfterRunsBelow { runs: 3 });
    let long = run(&mut s, &audio, LONG);
    let long_reserved = s.stats().arena.reserved;
    assert!(long_reserved >= long.high_water);
    assert!(long_reserved >= peak_len(LONG) * 4);

    let mut reports = Vec::new();
    for &l in &SHORT {
        let r = run(&mut s, &audio, l);
        println!(
            "L = {l}: high water {} B, reserved after {} B, backing calls {}, planned {}, deviated {:?}",
            r.high_water, r.reserved, r.backing_allocs, r.planned, r.deviation
        );
        reports.push((l, r));
    }
    let st = s.stats();
    let short_need = reports.iter().map(|r| r.1.high_water).max().unwrap();
    println!(
        "long ({LONG} windows): reserved {long_reserved} B; after {} short runs: reserved {} B \
         (short files need at most {short_need} B), shrinks {}",
        SHORT.len(),
        st.arena.reserved,
        st.arena.shrinks
    );
    assert!(st.arena.shrinks >= 1, "the policy shrank");
    // Down from the long file's memory to what the short files need: at
    // most the largest short run's high-water mark (the policy shrinks to
    // the largest need among the runs below, so it may go lower and grow
    // again for a longer short file), at least the last run's.
    let last = reports.last().unwrap().1;
    assert!(
        st.arena.reserved <= up(&s, short_need),
        "{}",
        st.arena.reserved
    );
    assert!(st.arena.reserved >= last.high_water);
    assert!(st.arena.reserved * 10 < long_reserved);
    // Every run that kept to a plan sits at it: its key's own plan exactly,
    // or one predicted from the lengths seen before, which may round a few
    // blocks up a granule (within 2% of the plan later learned from the
    // run itself). A run that left its prediction (a length past a size
    // the fit did not know, such as a chunked buffer's cap) was served
    // dynamically; the probabilities are checked elsewhere.
    for (l, r) in &reports {
        if r.planned && !r.deviated {
            let plan = plan_size(&s, *l);
            assert!(
                r.high_water >= plan && r.high_water as f64 <= plan as f64 * 1.02,
                "L = {l}: {r:?}, plan {plan}"
            );
        }
    }
    // A run that left its plan is served inside the plan's block: it
    // reaches the block, not the block and the dynamic run's need side by
    // side. The one here (L = 5 predicted from lengths 120 and 3, past the
    // cap of a chunked buffer) had a plan over-sized from that fit: 70,976
    // bytes against the dynamic run's 51,584 (1.38x). Bounded at 1.5x of
    // the same run served dynamically (the first run of a fresh session).
    for (l, r) in reports.iter().filter(|r| r.1.deviated) {
        let mut fresh = session(ShrinkPolicy::AfterRunsBelow { runs: 3 });
        let dynamic = run(&mut fresh, &audio, *l);
        assert!(!dynamic.planned);
        assert!(
            r.high_water as f64 <= dynamic.high_water as f64 * 1.5,
            "L = {l}: {} over the dynamic run's {}",
            r.high_water,
            dynamic.high_water
        );
    }
    // Once three short lengths have been seen, every run keeps to a plan:
    // its key's own, or one predicted from the lengths seen.
    for (i, (l, r)) in reports.iter().enumerate().skip(3) {
        assert!(r.planned && !r.deviated, "run {i}, L = {l}: {r:?}");
    }
}

#[test]
fn after_runs_below_settles_on_one_short_length() {
    let audio = tensor_vad::wav::read(data_path("speech.wav"))
        .unwrap()
        .samples;
    let mut s = session(ShrinkPolicy::AfterRunsBelow { runs: 3 });
    run(&mut s, &audio, LONG);
    let long_reserved = s.stats().arena.reserved;
    let mut reserved = Vec::new();
    for _ in 0..8 {
        let r = run(&mut s, &audio, 3);
        reserved.push((r.reserved, r.memory_calls()));
    }
    println!("L = 3 after L = {LONG}: (reserved, backing calls) per run {reserved:?}");
    // Three runs below the reservation, then down to exactly the plan of
    // L = 3, and no backing call after that.
    let need = up(&s, plan_size(&s, 3));
    assert!(reserved[..2].iter().all(|r| r.0 == long_reserved));
    assert_eq!(reserved[2].0, need);
    assert!(
        reserved[3..].iter().all(|&r| r == (need, 0)),
        "{reserved:?}"
    );
    assert_eq!(s.stats().arena.shrinks, 1);
}

#[test]
fn after_every_run_follows_each_file() {
    let audio = tensor_vad::wav::read(data_path("speech.wav"))
        .unwrap()
        .samples;
    let mut s = session(ShrinkPolicy::AfterEveryRun);
    let long = run(&mut s, &audio, LONG);
    assert_eq!(long.reserved, up(&s, long.high_water));
    for &l in &SHORT {
        let r = run(&mut s, &audio, l);
        // Down to this run's own need after every run.
        assert_eq!(r.reserved, up(&s, r.high_water), "L = {l}: {r:?}");
        assert!(r.reserved * 10 < long.reserved);
    }
    // A planned run needs exactly its plan.
    let r = run(&mut s, &audio, 4);
    assert!(r.planned);
    assert_eq!(r.reserved, up(&s, plan_size(&s, 4)));
}

#[test]
fn manual_keeps_the_long_files_memory_until_shrink() {
    let audio = tensor_vad::wav::read(data_path("speech.wav"))
        .unwrap()
        .samples;
    let mut s = session(ShrinkPolicy::Manual);
    run(&mut s, &audio, LONG);
    let long_reserved = s.stats().arena.reserved;
    for &l in &SHORT {
        run(&mut s, &audio, l);
    }
    assert_eq!(s.stats().arena.reserved, long_reserved);
    assert_eq!(s.stats().arena.shrinks, 0);
    // Shrink gives back down to the last run's need (watermark window 1).
    let last = s.stats().last_run.unwrap();
    assert!(s.shrink() > 0);
    assert_eq!(s.stats().arena.reserved, up(&s, last.high_water));
}
