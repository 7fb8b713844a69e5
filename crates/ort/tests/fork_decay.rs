//! A forked child decays as a fresh process: a worker that ran in the
//! parent just before the fork gives its memory back in the child with no
//! call, on a decay thread of the child's own. `fork()` copies only the
//! forking thread, so the parent's decay thread does not exist in the
//! child; a child that kept the parent's handle would wake no one and hold
//! the worker's memory for good (`gunicorn --preload` workers at their
//! peak forever). Its own test binary, so that no other test's threads run
//! at the fork.

#![cfg(unix)]

#[allow(dead_code)]
#[path = "all/common.rs"]
mod common;

use ort::session::Session;
use ort::value::Tensor;
use std::time::{Duration, Instant};
use tensor_arena_ort::{
    fork, ort, register, Plans, RunKey, SessionBuilderExt, Worker, WorkerOptions,
};

/// The worker's idle time before it decays.
const DECAY: Duration = Duration::from_millis(300);

/// A deterministic PP-OCR rec input of `width`.
fn tensor(width: usize) -> Tensor<f32> {
    let shape = [1usize, 3, 48, width];
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n as u32)
        .map(|i| (i % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    Tensor::from_array((shape, data)).unwrap()
}

/// Waits up to `limit` for `pid`: its exit code, or `None` if it is still
/// running (then it is killed).
fn wait(pid: libc::pid_t, limit: Duration) -> Option<i32> {
    let t0 = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: `pid` is our child; `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Some(if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                -1
            });
        }
        assert!(r == 0, "waitpid failed");
        if t0.elapsed() > limit {
            // SAFETY: kills and reaps our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Polls `worker` until it reserves nothing, up to `limit`.
fn decays_within(worker: &Worker, limit: Duration) -> bool {
    let t0 = Instant::now();
    while worker.stats().reserved != 0 {
        if t0.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

#[test]
fn a_forked_child_decays_on_a_thread_of_its_own() {
    let env = common::environment("fork-decay");
    register(&env).unwrap();
    let mut session: Session = Session::builder(&env)
        .unwrap()
        .with_intra_threads(1)
        .unwrap()
        .with_tensor_arena()
        .unwrap()
        .commit_from_file(common::model("ppocr_rec.onnx"))
        .unwrap();
    let mut worker = Worker::new(WorkerOptions {
        decay: Some(DECAY),
        ..WorkerOptions::default()
    })
    .unwrap();
    let plans = Plans::default();
    let inputs = ort::inputs![tensor(640)];
    let key = RunKey::of(&inputs);
    drop(worker.run(&plans, &key, || session.run(inputs)).unwrap());
    let held = worker.stats().reserved;
    assert!(
        held > 1 << 20,
        "the run committed memory: {:?}",
        worker.stats()
    );

    // Fork at once: the worker's decay is due in DECAY, on the parent's
    // decay thread, which the child does not have.
    fork::prepare();
    // SAFETY: `fork` has no precondition; the child calls only this crate
    // (after `fork::child`), reads the worker's stats and `_exit`s.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: the child right after `fork()`, on the thread that
        // forked, the only one; `fork::prepare` ran just before the fork.
        unsafe { fork::child() };
        let code = if worker.stats().reserved == 0 {
            2 // decayed before the fork: the test proves nothing
        } else if decays_within(&worker, 10 * DECAY) {
            0
        } else {
            1
        };
        // SAFETY: ends the child at once, running no destructor or exit
        // handler of the parent's (the test harness's threads are not here).
        unsafe { libc::_exit(code) }
    }
    fork::parent();
    assert!(pid > 0, "fork failed");
    let code = wait(pid, Duration::from_secs(30));
    assert_eq!(
        code,
        Some(0),
        "the child did not give back the worker's {held} bytes within {:?} of idle \
         (1: still held; 2: decayed before the fork; None: hung)",
        10 * DECAY
    );
    // The parent decays as before.
    assert!(decays_within(&worker, 10 * DECAY), "{:?}", worker.stats());
}
