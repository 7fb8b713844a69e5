//! The admission's rules, one at a time, on a budget of this process.

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

#[test]
fn runs_are_admitted_by_bytes_not_by_count() {
    let a = Admission::of_budget(Budget::new(100));
    let t1 = a.admit(40, false).unwrap();
    let t2 = a.admit(40, false).unwrap();
    assert_eq!(a.stats().promised, 80);
    // 30 more does not fit: it waits until one ends.
    let a2 = Arc::clone(&a);
    let started = Arc::new(AtomicUsize::new(0));
    let s2 = Arc::clone(&started);
    let h = std::thread::spawn(move || {
        let t = a2.admit(30, false).unwrap();
        s2.store(1, SeqCst);
        drop(t);
    });
    while a.stats().queued == 0 {
        std::thread::yield_now();
    }
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(started.load(SeqCst), 0, "admitted over the limit");
    drop(t1);
    h.join().unwrap();
    assert_eq!(started.load(SeqCst), 1);
    drop(t2);
    let s = a.stats();
    assert_eq!((s.promised, s.running, s.admitted, s.waited), (0, 0, 3, 1));
    assert_eq!(s.promised_peak, 80);
}

#[test]
fn a_run_larger_than_the_limit_is_refused_at_once() {
    let a = Admission::of_budget(Budget::new(100));
    let t = Instant::now();
    let err = a.admit(101, false).err().expect("refused");
    assert!(t.elapsed() < Duration::from_millis(100));
    let msg = err.to_string();
    assert!(msg.contains("101") && msg.contains("100"), "{msg}");
    assert!(matches!(err, OrtArenaError::OutOfMemory(_)));
    assert_eq!(a.stats().refused, 1);
}

#[test]
fn a_small_run_passes_a_large_head_a_bounded_number_of_times() {
    let a = Admission::of_budget(Budget::new(100));
    let big_in_flight = a.admit(60, false).unwrap();
    // The head needs 50: it waits for the 60.
    let a2 = Arc::clone(&a);
    let head = std::thread::spawn(move || drop(a2.admit(50, false).unwrap()));
    while a.stats().queued == 0 {
        std::thread::yield_now();
    }
    // Small runs of 10 fit beside the 60: they pass, up to MAX_PASSES.
    let mut smalls = Vec::new();
    for _ in 0..MAX_PASSES {
        smalls.push(a.admit(4, false).unwrap());
    }
    assert_eq!(a.stats().passed, u64::from(MAX_PASSES));
    // The next one may not pass any more, though it fits: it waits.
    let a3 = Arc::clone(&a);
    let late = Arc::new(AtomicUsize::new(0));
    let l2 = Arc::clone(&late);
    let after = std::thread::spawn(move || {
        let t = a3.admit(4, false).unwrap();
        l2.store(1, SeqCst);
        drop(t);
    });
    std::thread::sleep(Duration::from_millis(40));
    assert_eq!(late.load(SeqCst), 0, "the head was starved");
    drop(smalls);
    drop(big_in_flight);
    head.join().unwrap();
    after.join().unwrap();
    assert_eq!(late.load(SeqCst), 1);
}

#[test]
fn a_run_alone_waits_for_the_runs_in_flight_and_nothing_starts_beside_it() {
    let a = Admission::of_budget(Budget::new(100));
    let t1 = a.admit(10, false).unwrap();
    let a2 = Arc::clone(&a);
    let alone_in = Arc::new(AtomicUsize::new(0));
    let flag = Arc::clone(&alone_in);
    let h = std::thread::spawn(move || {
        let t = a2.admit(30, true).unwrap();
        flag.store(1, SeqCst);
        std::thread::sleep(Duration::from_millis(30));
        flag.store(2, SeqCst);
        drop(t);
    });
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(alone_in.load(SeqCst), 0, "alone beside a run");
    drop(t1);
    while alone_in.load(SeqCst) == 0 {
        std::thread::yield_now();
    }
    // While it runs, a small run waits.
    let t = a.admit(1, false).unwrap();
    assert_eq!(alone_in.load(SeqCst), 2, "a run started beside one alone");
    drop(t);
    h.join().unwrap();
}

/// Many threads admitted without the lock beside runs alone and runs
/// that wait: nothing runs beside a run alone, the promises never pass
/// the limit, and every promise is given back.
#[test]
fn runs_admitted_without_the_lock_keep_every_rule() {
    let a = Admission::of_budget(Budget::new(100));
    let held = Arc::new(AtomicUsize::new(0));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let alone_in = Arc::new(AtomicUsize::new(0));
    let start = std::sync::Barrier::new(7);
    std::thread::scope(|s| {
        for t in 0..6usize {
            let (a, held, in_flight, alone_in) = (&a, &held, &in_flight, &alone_in);
            let start = &start;
            s.spawn(move || {
                start.wait();
                for i in 0..5000usize {
                    let need = (t * 7 + i * 13) % 45 + 1;
                    let ticket = a.admit(need, false).unwrap();
                    in_flight.fetch_add(1, SeqCst);
                    assert_eq!(alone_in.load(SeqCst), 0, "a run beside one alone");
                    let now = held.fetch_add(need, SeqCst) + need;
                    assert!(now <= 100, "{now} promised under a limit of 100");
                    std::hint::spin_loop();
                    held.fetch_sub(need, SeqCst);
                    in_flight.fetch_sub(1, SeqCst);
                    drop(ticket);
                }
            });
        }
        let (a, in_flight, alone_in, start) = (&a, &in_flight, &alone_in, &start);
        s.spawn(move || {
            start.wait();
            for _ in 0..300 {
                let ticket = a.admit(30, true).unwrap();
                alone_in.store(1, SeqCst);
                for _ in 0..200 {
                    assert_eq!(in_flight.load(SeqCst), 0, "a run beside one alone");
                    std::hint::spin_loop();
                }
                alone_in.store(0, SeqCst);
                drop(ticket);
                std::thread::yield_now();
            }
        });
    });
    let st = a.stats();
    assert_eq!((st.promised, st.running, st.queued), (0, 0, 0));
    assert_eq!(st.admitted, 6 * 5000 + 300);
    assert!(st.promised_peak <= 100, "{st:?}");
    assert_eq!(a.fast.gate.load(SeqCst), 0);
}
