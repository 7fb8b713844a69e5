//! Forking while other threads use the crate's process-wide locks (make
//! and drop workers, read the arenas' stats, check workers out of a pool
//! smaller than the threads): every child finishes. Its own test binary,
//! so that no other test's threads run at the forks.
//!
//! Before the fork's locks were the standard library's, a thread of the
//! parent waiting on one at the fork was left in `parking_lot`'s queue in
//! the child; an unlock in the child then woke it instead of a thread of
//! the child, which waited forever: 1 child in 200 to 600 here (2 runs of
//! this test in 6 failed), 1 in 50 with ONNX Runtime (`test_fork.py`).
//!
//! Later a budget's members were a `parking_lot` lock taken outside the
//! fork's locks (a worker's creation joins the default budget): a child
//! hung when the parent's creating thread held it at the fork: 1 child in
//! 500 on CI; 1 in 2,500 on 16 cores kept busy by other processes; within
//! 25,000 (`TENSOR_ARENA_FORKS`) on 2 busy cores, twice in two runs. Now
//! no lock is there to be held. A thread running a model's plans (thread
//! 2) checks the plan caches' side of the fork the same way.

#![cfg(unix)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tensor_arena_ort::{arenas, fork, Plans, RunKey, Worker, WorkerOptions, WorkerPool};

/// How long one child may take: its work is 200 worker creations and
/// runs (well under a second on a loaded 2-core machine), so a child
/// still running after this is hung.
const CHILD_LIMIT: Duration = Duration::from_secs(5);

/// Forks per run: 500, or `TENSOR_ARENA_FORKS` (a longer hunt for a rare
/// hang, best with the cores kept busy by other processes).
fn forks() -> usize {
    std::env::var("TENSOR_ARENA_FORKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500)
}

fn options() -> WorkerOptions {
    WorkerOptions {
        decay: Some(Duration::from_millis(1)),
        ..WorkerOptions::default()
    }
}

/// In the child: what a worker process does first. Exits, never returns.
/// One run of a model's plans that allocates nothing: its lookup and
/// learning take the plan cache's locks.
fn run(worker: &mut Worker, plans: &Plans, n: i64) -> bool {
    let key = RunKey::from_shapes([[1i64, n % 7 + 1]]);
    worker.run(plans, &key, || Ok::<(), ()>(())).is_ok()
}

fn child(pool: WorkerPool, plans: Arc<Plans>) -> ! {
    // SAFETY: the child right after `fork()`, on the thread that forked,
    // the only one; `fork::prepare` ran just before the fork.
    unsafe { fork::child() };
    // Two threads of the child contend for the locks the parent's threads
    // waited on at the fork.
    let busy = move || {
        let mut w = Worker::new(options()).expect("a worker");
        (0..100).all(|i| {
            let made = Worker::new(options()).is_ok();
            made && arenas().0 > 0
                && run(&mut w, &plans, i)
                && plans.stats().hits + plans.stats().misses > 0
        })
    };
    let other = std::thread::spawn(busy.clone());
    let code = match pool.after_fork(options()) {
        Ok(pool) => {
            let all: Vec<_> = (0..pool.size()).map(|_| pool.try_checkout()).collect();
            if all.iter().all(Option::is_some) && busy() && other.join().unwrap_or(false) {
                0
            } else {
                3
            }
        }
        Err(_) => 4,
    };
    // SAFETY: ends the child at once, running no destructor or exit
    // handler of the parent's (the test harness's threads are not here).
    unsafe { libc::_exit(code) }
}

/// Prints where a hung child's threads wait (its threads' system calls,
/// and their stacks where gdb is installed) before it is killed: what CI's
/// log needs to tell which lock it was.
fn show_hung(pid: libc::pid_t) {
    eprintln!("child {pid} hung; its threads:");
    let script = format!(
        "for t in /proc/{pid}/task/*; do echo \"$t $(cat $t/wchan) syscall: $(cat $t/syscall)\"; done; \
         command -v gdb >/dev/null && gdb -p {pid} -batch -ex 'thread apply all bt' 2>&1 | grep '^#' | head -120"
    );
    let _ = std::process::Command::new("sh")
        .args(["-c", &script])
        .status();
}

/// Waits up to `limit` for `pid`: its exit status, or `None` if it hung
/// (then it is killed).
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
            show_hung(pid);
            // SAFETY: kills and reaps our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn forks_while_threads_take_the_crates_locks_never_hang() {
    let pool = WorkerPool::new(2, options()).unwrap();
    let plans = Arc::new(Plans::default());
    let stop = Arc::new(AtomicBool::new(false));
    let busy = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..5)
        .map(|i| {
            let (stop, busy, pool, plans) =
                (stop.clone(), busy.clone(), pool.clone(), plans.clone());
            std::thread::spawn(move || {
                let mut w = Worker::new(options()).unwrap();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    match i {
                        0 => drop(Worker::new(options()).unwrap()),
                        1 => drop(pool.checkout()),
                        2 => assert!(run(&mut w, &plans, n)),
                        _ => drop(std::hint::black_box(arenas())),
                    }
                    busy.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    // The first child that hangs or fails ends the test, with what it did:
    // a broken fork protocol hangs some children, and waiting for all of
    // them (20 s each) told nothing for minutes.
    let mut outcome = Ok(());
    for k in 0..forks() {
        fork::prepare();
        // The threads now wait for the locks (as they do while a Python
        // fork waits for the GIL): each is in the lock's queue at the fork.
        std::thread::sleep(Duration::from_millis(2));
        // SAFETY: `fork` has no precondition; the child calls only this
        // crate (after `fork::child`) and `_exit`.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            child(pool.clone(), plans.clone());
        }
        fork::parent();
        assert!(pid > 0, "fork failed");
        match wait(pid, CHILD_LIMIT) {
            Some(0) => {}
            None => {
                outcome = Err(format!(
                    "child {k} (pid {pid}) of {} hung: not done in {CHILD_LIMIT:?}",
                    forks()
                ));
                break;
            }
            Some(code) => {
                outcome = Err(format!(
                    "child {k} (pid {pid}) failed with exit code {code}"
                ));
                break;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    assert!(busy.load(Ordering::Relaxed) > 0);
    if let Err(why) = outcome {
        panic!("{why}");
    }
}
