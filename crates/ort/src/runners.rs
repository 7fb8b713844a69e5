//! The threads [`WorkerPool::run_async`](crate::WorkerPool::run_async)
//! runs on: started when no idle one is left, kept for the next runs, and
//! ended when their pool is dropped. A run holds a checked-out worker, so
//! about one thread per worker of the pool is ever started (a run's thread
//! is back in the idle list a moment after its worker is back in the
//! pool). Keeping them saves a thread's start per run, and keeps ONNX
//! Runtime's own small allocations in the C library's per-thread heaps of
//! these few threads instead of a new thread's each time. A thread idle for
//! [`IDLE_END`] ends, so that what ONNX Runtime keeps per thread (its
//! matrix kernels' packing buffers, sized by the largest run) goes with it
//! before idle decay trims the heap.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How long a run thread waits for a job before it ends (shorter than the
/// default idle decay, which trims the C heap after it).
pub(crate) const IDLE_END: Duration = Duration::from_secs(1);

static NEXT_RUNNER: AtomicU64 = AtomicU64::new(1);

/// A run, which catches its own panics.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// A job and the way back to the idle list for the thread that runs it.
struct Msg {
    job: Job,
    /// The runner's own channel: the only sender left while the runner
    /// works; put back in the idle list when it is done.
    back: Sender<Msg>,
}

/// Channels of the threads waiting for a job, by thread id.
type Idle = Mutex<Vec<(u64, Sender<Msg>)>>;

/// The idle runners of one pool.
#[derive(Default)]
pub(crate) struct Runners {
    /// Dropping the list (the pool) drops the last sender of each idle
    /// thread: it ends.
    idle: Arc<Idle>,
}

impl Runners {
    /// Runs `job` on an idle runner, or on a new one.
    ///
    /// # Errors
    /// When no thread could be started.
    pub(crate) fn run(&self, job: Job) -> std::io::Result<()> {
        let mut job = job;
        // A runner whose thread is gone (it cannot be: they end only when
        // the list is dropped) is skipped.
        loop {
            let Some((_, sender)) = self.idle.lock().pop() else {
                break;
            };
            match sender.send(Msg {
                job,
                back: sender.clone(),
            }) {
                Ok(()) => return Ok(()),
                Err(mpsc::SendError(msg)) => job = msg.job,
            }
        }
        let sender = self.spawn()?;
        sender
            .send(Msg {
                job,
                back: sender.clone(),
            })
            .map_err(|_| std::io::Error::other("the run's thread ended at once"))
    }

    /// Threads started and waiting now.
    #[cfg(test)]
    pub(crate) fn idle(&self) -> usize {
        self.idle.lock().len()
    }

    fn spawn(&self) -> std::io::Result<Sender<Msg>> {
        let (tx, rx) = mpsc::channel::<Msg>();
        let idle: Weak<Idle> = Arc::downgrade(&self.idle);
        let id = NEXT_RUNNER.fetch_add(1, Ordering::Relaxed);
        std::thread::Builder::new()
            .name("tensor-arena-run".into())
            .spawn(move || loop {
                match rx.recv_timeout(IDLE_END) {
                    Ok(Msg { job, back }) => {
                        // The job catches its panics; this is a second net,
                        // so that the thread outlives any.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                        match idle.upgrade() {
                            Some(list) => list.lock().push((id, back)),
                            None => return,
                        }
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        let Some(list) = idle.upgrade() else {
                            return;
                        };
                        let mut list = list.lock();
                        match list.iter().position(|(i, _)| *i == id) {
                            // Idle: leave the list and end.
                            Some(at) => {
                                list.remove(at);
                                return;
                            }
                            // Taken: a job is on its way.
                            None => continue,
                        }
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            })?;
        Ok(tx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runners_are_kept_and_reused() {
        let runners = Runners::default();
        let (tx, rx) = mpsc::channel();
        let mut threads = Vec::new();
        for i in 0..5 {
            let tx = tx.clone();
            runners
                .run(Box::new(move || {
                    tx.send((i, std::thread::current().id())).unwrap();
                }))
                .unwrap();
            let (ran, thread) = rx.recv().unwrap();
            assert_eq!(ran, i);
            threads.push(thread);
            // Wait for the runner to be back.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while runners.idle() == 0 {
                assert!(std::time::Instant::now() < deadline);
                std::thread::yield_now();
            }
        }
        assert_eq!(runners.idle(), 1, "one thread is kept");
        assert!(
            threads.iter().all(|t| *t == threads[0]),
            "one thread served the five runs: {threads:?}"
        );
        assert_ne!(threads[0], std::thread::current().id(), "not the caller's");
        // A panicking job does not take its thread.
        runners.run(Box::new(|| panic!("boom"))).unwrap();
        let (tx2, rx2) = mpsc::channel();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while runners.idle() == 0 {
            assert!(std::time::Instant::now() < deadline);
            std::thread::yield_now();
        }
        runners.run(Box::new(move || tx2.send(7).unwrap())).unwrap();
        assert_eq!(rx2.recv().unwrap(), 7);
        // Back on the list first (the job sends before its thread is back:
        // a list still empty here is not a thread that ended).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while runners.idle() == 0 {
            assert!(std::time::Instant::now() < deadline);
            std::thread::yield_now();
        }
        // Idle for IDLE_END: the thread ends and leaves the list.
        let deadline = std::time::Instant::now() + IDLE_END * 10;
        while runners.idle() != 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the idle thread stayed"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // A new run starts a new one (thread ids are never reused).
        let (tx3, rx3) = mpsc::channel();
        runners
            .run(Box::new(move || {
                tx3.send((8, std::thread::current().id())).unwrap();
            }))
            .unwrap();
        let (ran, thread) = rx3.recv().unwrap();
        assert_eq!(ran, 8);
        assert_ne!(thread, threads[0], "the ended thread ran the new run");
    }
}
