//! Idle decay: memory a worker has not used for a while goes back to the
//! kernel with no call from the server, as jemalloc's decay does.
//!
//! One thread per process (started with the first worker that decays)
//! sleeps until the earliest deadline among workers that ran since they
//! last decayed, and sleeps without a deadline when there are none: an
//! idle server's decay thread does not wake. At a deadline it takes the
//! worker's arena only if no run holds it (`try_lock`: a busy worker is
//! never waited for, and its run's end sets a new deadline), gives all its
//! cached memory back (live outputs keep their blocks), and gives back at
//! once what was given back lazily
//! ([`GiveBack::Lazily`](crate::GiveBack::Lazily)).
//!
//! | worker state       | `Decay::last`              | the thread                  |
//! |--------------------|----------------------------|-----------------------------|
//! | never ran, decayed | 0                          | ignores it                  |
//! | ran at `t`         | `t` (ns since start, >0)   | decays it at `t + idle`     |
//! | running again      | `t` of its previous run    | `try_lock` fails; re-armed by the run's end |

use crate::slot::Slot;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// The decay default: memory a worker has not used for 2 s goes back
/// (`BENCHMARKS.md`, issue 35, says why).
pub const DEFAULT_DECAY: Duration = Duration::from_secs(2);

/// One worker's decay state, shared by the worker and the decay thread.
pub(crate) struct Decay {
    idle: Duration,
    /// When the worker last finished a run, in nanoseconds since [`epoch`]
    /// (at least 1); 0 once decayed (nothing to do).
    last: AtomicU64,
}

struct Entry {
    slot: Weak<Slot>,
    decay: Arc<Decay>,
}

static ENTRIES: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
static THREAD: OnceLock<Option<Thread>> = OnceLock::new();
/// Workers decayed by the thread (for tests and stats).
pub(crate) static DECAYED: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ns() -> u64 {
    (epoch().elapsed().as_nanos() as u64).max(1)
}

impl Decay {
    /// Registers `slot` with the decay thread (started now if it is not
    /// running) to give its memory back after `idle` without a run.
    pub(crate) fn register(slot: &Arc<Slot>, idle: Duration) -> Arc<Self> {
        let decay = Arc::new(Self {
            idle,
            last: AtomicU64::new(0),
        });
        let mut entries = ENTRIES.lock();
        entries.retain(|e| e.slot.strong_count() > 0);
        entries.push(Entry {
            slot: Arc::downgrade(slot),
            decay: Arc::clone(&decay),
        });
        drop(entries);
        let _ = epoch();
        decay
    }

    /// Notes the end of a run: the worker's memory decays `idle` from now.
    /// Wakes the thread only when the worker was not already waiting to
    /// decay (once per busy spell, not once per run).
    pub(crate) fn used(&self) {
        if self.last.swap(now_ns(), Ordering::AcqRel) == 0 {
            wake();
        }
    }
}

/// Wakes the decay thread, starting it the first time. A thread that
/// cannot be started leaves decay off (memory then follows the shrink
/// policy only); nothing else depends on it.
fn wake() {
    let thread = THREAD.get_or_init(|| {
        std::thread::Builder::new()
            .name("tensor-arena-decay".into())
            .spawn(run)
            .ok()
            .map(|h| h.thread().clone())
    });
    if let Some(t) = thread {
        t.unpark();
    }
}

/// The decay thread: decays what is due, then sleeps until the next
/// deadline, or until woken.
fn run() {
    loop {
        match decay_due() {
            Some(wait) => std::thread::park_timeout(wait),
            None => std::thread::park(),
        }
    }
}

/// Decays every worker whose idle time has passed; returns how long until
/// the next deadline (`None`: no worker is waiting to decay).
fn decay_due() -> Option<Duration> {
    let now = now_ns();
    let mut next: Option<u64> = None;
    // Collected under the lock, decayed outside it (a worker's arena is
    // taken with `try_lock` only, but `Decay::register` must not wait for
    // a shrink).
    let mut due = Vec::new();
    {
        let mut entries = ENTRIES.lock();
        entries.retain(|e| e.slot.strong_count() > 0);
        for e in entries.iter() {
            let last = e.decay.last.load(Ordering::Acquire);
            if last == 0 {
                continue;
            }
            let deadline = last.saturating_add(e.decay.idle.as_nanos() as u64);
            if now >= deadline {
                if let Some(slot) = e.slot.upgrade() {
                    due.push((slot, Arc::clone(&e.decay), last));
                }
            } else {
                next = Some(next.map_or(deadline, |n: u64| n.min(deadline)));
            }
        }
    }
    let mut decayed_any = false;
    for (slot, decay, last) in due {
        match slot.try_decay() {
            // Decayed: disarmed, unless a run ended meanwhile.
            Some(_) => {
                decayed_any = true;
                if decay
                    .last
                    .compare_exchange(last, 0, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    DECAYED.fetch_add(1, Ordering::Relaxed);
                }
            }
            // Running now: look again after its idle time (its run's end
            // will have set a later deadline).
            None => {
                let again = now.saturating_add(decay.idle.as_nanos() as u64);
                next = Some(next.map_or(again, |n| n.min(again)));
            }
        }
    }
    if decayed_any {
        trim_system_heap();
    }
    next.map(|n| Duration::from_nanos(n.saturating_sub(now_ns())))
}

/// Gives the free memory of the C library's heap back to the kernel too
/// (glibc's `malloc_trim`): ONNX Runtime's own small allocations (kernel
/// scratch, shapes, thread state) and the system-allocator blocks of
/// session creation live there, and glibc keeps what they freed in its
/// per-thread arenas. Called once after workers decayed, on the decay
/// thread (no server thread waits for it); elsewhere a no-op.
fn trim_system_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only returns free heap memory to the kernel;
    // it takes glibc's own locks and touches no memory in use.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensor_arena::ArenaConfig;

    #[test]
    fn an_idle_slot_decays_and_a_busy_one_waits() {
        let slot = Slot::new(ArenaConfig::default(), Default::default(), None).unwrap();
        {
            let mut core = slot.lock();
            core.begin_run(None, false);
            let b = core.test_alloc(&slot, 3 << 20);
            core.test_free(b);
            core.finish_run();
        }
        assert!(slot.lock().arena_stats().reserved >= 3 << 20);
        let decay = Decay::register(&slot, Duration::from_millis(50));
        // Busy: the thread cannot take the arena.
        let held = slot.lock();
        decay.used();
        std::thread::sleep(Duration::from_millis(150));
        assert!(
            held.arena_stats().reserved >= 3 << 20,
            "a busy worker is never touched"
        );
        assert_ne!(decay.last.load(Ordering::Acquire), 0);
        drop(held);
        let deadline = Instant::now() + Duration::from_secs(10);
        while decay.last.load(Ordering::Acquire) != 0 {
            assert!(Instant::now() < deadline, "the idle worker never decayed");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(slot.lock().arena_stats().reserved, 0);
    }

    #[test]
    fn memory_given_back_lazily_leaves_at_once_on_decay() {
        let pages = tensor_arena::memory::PagesConfig {
            give_back: tensor_arena::memory::GiveBack::Lazily,
            ..Default::default()
        };
        let slot = Slot::new(ArenaConfig::default(), pages, None).unwrap();
        {
            let mut core = slot.lock();
            core.begin_run(None, false);
            let b = core.test_alloc(&slot, 8 << 20);
            core.test_free(b);
            core.finish_run();
            // A shrink policy's give-back down to a smaller need: lazily,
            // still in the process.
            core.shrink_to(2 << 20);
            let st = core.arena_stats();
            assert!(st.lazily_given_back >= 4 << 20, "{st:?}");
        }
        let decay = Decay::register(&slot, Duration::from_millis(30));
        decay.used();
        let deadline = Instant::now() + Duration::from_secs(10);
        while decay.last.load(Ordering::Acquire) != 0 {
            assert!(Instant::now() < deadline, "never decayed");
            std::thread::sleep(Duration::from_millis(10));
        }
        let st = slot.lock().arena_stats();
        assert_eq!((st.reserved, st.lazily_given_back), (0, 0), "{st:?}");
    }
}
