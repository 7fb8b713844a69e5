//! Idle decay: memory a worker has not used for a while goes back to the
//! kernel with no call from the server, as jemalloc's decay does. The same
//! thread makes the plan refits runs left to it (`crate::learn`), first in
//! each pass.
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
//! The give-back holds the worker's core, so a run that starts meanwhile
//! waits for it: measured at 22 us for 1 MiB resident, 0.14 ms for 64 MiB
//! and 0.59 ms for 256 MiB (`decay_hold_time`, `BENCHMARKS.md`), where
//! that run then commits and faults the same memory again, which costs far
//! more; so it stays under the lock.
//!
//! | worker state       | `Decay::last`              | the thread                  |
//! |--------------------|----------------------------|-----------------------------|
//! | never ran, decayed | 0                          | ignores it                  |
//! | ran at `t`         | `t` (ns since start, >0)   | decays it at `t + idle`     |
//! | running again      | `t` of its previous run    | `try_lock` fails; re-armed by the run's end |

use crate::forklock::{hold, ForkMutex};
use crate::slot::Slot;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// The decay default: memory a worker has not used for 2 s goes back
/// (`BENCHMARKS.md`, "Servers", says why; `docs/decisions.md`).
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

static ENTRIES: ForkMutex<Vec<Entry>> = ForkMutex::new(Vec::new());
/// The decay thread, once started (`None` inside: it could not be); reset
/// in a forked child, where it does not exist ([`crate::fork`]).
static THREAD: ForkMutex<Option<Option<Thread>>> = ForkMutex::new(None);
/// Held for each pass of the decay thread, so that a fork
/// ([`crate::fork::prepare`]) never copies a pass midway (a worker's
/// core locked by a thread the child does not have).
static PASS: ForkMutex<()> = ForkMutex::new(());
/// Workers decayed by the thread (for tests and stats).
pub(crate) static DECAYED: AtomicU64 = AtomicU64::new(0);
/// Passes of the thread that trimmed the C library's heap.
static TRIMS: AtomicU64 = AtomicU64::new(0);

/// How many times the decay thread has trimmed the C library's heap
/// (glibc's `malloc_trim`, after a pass that decayed a worker or made a
/// refit): for tests and stats. 0 where the C library is not glibc.
pub fn system_heap_trims() -> u64 {
    TRIMS.load(Ordering::Relaxed)
}

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
            let _ = wake();
        }
    }
}

/// Wakes the decay thread, starting it the first time; whether it runs. A
/// thread that cannot be started leaves decay off (memory then follows the
/// shrink policy only) and refits to the run's thread; nothing else
/// depends on it.
pub(crate) fn wake() -> bool {
    let mut thread = THREAD.lock();
    let thread = thread.get_or_insert_with(|| {
        std::thread::Builder::new()
            .name("tensor-arena-decay".into())
            .spawn(run)
            .ok()
            .map(|h| h.thread().clone())
    });
    if let Some(t) = thread {
        t.unpark();
    }
    thread.is_some()
}

/// [`crate::fork::prepare`]: the pass, then the registry, kept until
/// [`crate::forklock::release`].
pub(crate) fn prepare_fork() {
    hold(PASS.lock());
    hold(ENTRIES.lock());
}

/// [`crate::fork::prepare`]: the thread's handle (taken last: `wake` is
/// called with no other lock of this crate held).
pub(crate) fn prepare_fork_thread() {
    hold(THREAD.lock());
}

/// In a forked child, once the fork's locks are released and before any
/// other thread of the child runs: the parent's decay thread does not
/// exist here; forgets it (the next worker waiting to decay starts one).
pub(crate) fn child_after_fork() {
    *THREAD.lock() = None;
}

/// Starts (or wakes) the decay thread if a worker is waiting to decay: in
/// a forked child, workers that ran in the parent shortly before the fork.
pub(crate) fn wake_if_due() {
    let due = ENTRIES
        .lock()
        .iter()
        .any(|e| e.decay.last.load(Ordering::Acquire) != 0 && e.slot.strong_count() > 0);
    if due || crate::learn::is_owed() {
        let _ = wake();
    }
}

/// Whether a pass gave memory back since the decay thread last told the
/// default limit's ledger.
static REPUBLISH: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The decay thread: decays what is due, then sleeps until the next
/// deadline, or until woken.
fn run() {
    loop {
        let due = decay_due();
        // What the workers gave back is the container's again: said to
        // the ledger of the default limit (outside the pass's lock, which
        // a fork takes after the default limit's).
        if REPUBLISH.swap(false, Ordering::AcqRel) {
            crate::limit::republish();
        }
        match due {
            Some(wait) => std::thread::park_timeout(wait),
            None => std::thread::park(),
        }
    }
}

/// Decays every worker whose idle time has passed; returns how long until
/// the next deadline (`None`: no worker is waiting to decay).
fn decay_due() -> Option<Duration> {
    let _pass = PASS.lock();
    // The refits runs left (`crate::learn`) first: a run is waiting for
    // them (its next prediction), none waits for a decay.
    let learned = crate::learn::pass() > 0;
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
        #[cfg(test)]
        tests::between_collect_and_decay(&decay);
        match slot.try_decay() {
            // Decayed: disarmed, unless a run ended meanwhile.
            Some(_) => {
                decayed_any = true;
                match decay
                    .last
                    .compare_exchange(last, 0, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => {
                        DECAYED.fetch_add(1, Ordering::Relaxed);
                    }
                    // A run ended between the collection and the decay:
                    // its `used` saw a deadline armed and did not wake this
                    // thread, so its new deadline is this thread's to keep
                    // (without it, with no other worker due, the thread
                    // would park with no deadline and the worker never
                    // decay again).
                    Err(ended) => {
                        let again = ended.saturating_add(decay.idle.as_nanos() as u64);
                        next = Some(next.map_or(again, |n| n.min(again)));
                    }
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
    // A refit's scratch lives in this thread's own C heap, which glibc
    // keeps resident once freed (5 MiB over det's 20 sizes through ONNX
    // Runtime): given back with the rest.
    if decayed_any || learned {
        trim_system_heap();
    }
    if decayed_any {
        REPUBLISH.store(true, Ordering::Release);
    }
    next.map(|n| Duration::from_nanos(n.saturating_sub(now_ns())))
}

/// Gives the free memory of the C library's heap back to the kernel too
/// (glibc's `malloc_trim`): ONNX Runtime's own small allocations (kernel
/// scratch, shapes, thread state) and the system-allocator blocks of
/// session creation live there, and glibc keeps what they freed in its
/// per-thread arenas. Called once after workers decayed, on the decay
/// thread (no server thread waits for it), and by a run that has waited
/// for room at the head of its queue ([`crate::Admission`]); elsewhere a
/// no-op.
pub(crate) fn trim_system_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `malloc_trim` only returns free heap memory to the
        // kernel; it takes glibc's own locks and touches no memory in use.
        unsafe {
            libc::malloc_trim(0);
        }
        TRIMS.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use tensor_arena::ArenaConfig;

    type Hook = (usize, Box<dyn FnOnce() + Send>);
    /// Called by the decay thread between collecting a due worker and
    /// decaying it, once, for the worker whose `Decay` is at the address.
    static BETWEEN: Mutex<Option<Hook>> = Mutex::new(None);

    /// The decay tests one at a time: a test's runs wake the one decay
    /// thread, which would hide another test's lost deadline.
    static SERIAL: Mutex<()> = Mutex::new(());

    pub(super) fn between_collect_and_decay(decay: &Arc<Decay>) {
        let mut hook = BETWEEN.lock();
        if hook
            .as_ref()
            .is_some_and(|(at, _)| *at == Arc::as_ptr(decay) as usize)
        {
            let (_, f) = hook.take().expect("checked");
            drop(hook);
            f();
        }
    }

    /// One run of `bytes` on the slot, as `Worker::run` makes it: the core
    /// held for the run, `used` after.
    fn run_once(slot: &Arc<Slot>, decay: &Decay, bytes: usize) {
        {
            let mut core = slot.lock();
            core.begin_run(None, false, false);
            let b = core.test_alloc(slot, bytes);
            core.test_free(b);
            core.finish_run();
            slot.publish(&core);
        }
        decay.used();
    }

    fn new_slot() -> Arc<Slot> {
        Slot::new(ArenaConfig::default(), Default::default(), None).unwrap()
    }

    fn wait_decayed(slot: &Slot, decay: &Decay, within: Duration, what: &str) {
        let deadline = Instant::now() + within;
        while decay.last.load(Ordering::Acquire) != 0 || slot.stats().reserved != 0 {
            assert!(
                Instant::now() < deadline,
                "{what}: never decayed ({} bytes reserved)",
                slot.stats().reserved
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn an_idle_slot_decays_and_a_busy_one_waits() {
        let _serial = SERIAL.lock();
        let busy = new_slot();
        let idle = new_slot();
        // Registered first: the thread meets the busy one first, and must
        // not wait for it before it decays the idle one.
        let busy_decay = Decay::register(&busy, Duration::from_millis(50));
        let idle_decay = Decay::register(&idle, Duration::from_millis(50));
        run_once(&busy, &busy_decay, 3 << 20);
        let held = busy.lock();
        assert!(held.arena_stats().reserved >= 3 << 20);
        run_once(&idle, &idle_decay, 3 << 20);
        // The idle one decays while the busy one is held.
        wait_decayed(&idle, &idle_decay, Duration::from_secs(10), "the idle slot");
        assert!(
            held.arena_stats().reserved >= 3 << 20,
            "a busy worker is never touched"
        );
        assert_ne!(busy_decay.last.load(Ordering::Acquire), 0);
        drop(held);
        wait_decayed(
            &busy,
            &busy_decay,
            Duration::from_secs(10),
            "the busy slot once free",
        );
    }

    #[test]
    fn a_run_ending_during_a_decay_keeps_its_deadline() {
        let _serial = SERIAL.lock();
        let slot = new_slot();
        let decay = Decay::register(&slot, Duration::from_millis(20));
        // Between the thread's collection of the slot and its decay, a run
        // starts and ends: its `used` finds a deadline armed and does not
        // wake the thread; the decay then finds `last` changed.
        let (s2, d2) = (Arc::clone(&slot), Arc::clone(&decay));
        let (tx, rx) = std::sync::mpsc::channel();
        *BETWEEN.lock() = Some((
            Arc::as_ptr(&decay) as usize,
            Box::new(move || {
                run_once(&s2, &d2, 1 << 20);
                let _ = tx.send(());
            }),
        ));
        run_once(&slot, &decay, 1 << 20);
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the decay thread collected the slot");
        // That decay gave the memory back; the run after it must decay in
        // its turn (it does not wake the thread either: a deadline is
        // armed).
        let deadline = Instant::now() + Duration::from_secs(10);
        while slot.stats().reserved != 0 {
            assert!(Instant::now() < deadline, "the first decay never came");
            std::thread::sleep(Duration::from_millis(2));
        }
        run_once(&slot, &decay, 1 << 20);
        assert!(slot.stats().reserved >= 1 << 20);
        wait_decayed(
            &slot,
            &decay,
            Duration::from_secs(3),
            "the run after the race",
        );
    }

    /// Bursts of short runs with gaps around the idle time, so that runs
    /// end while the thread decays; after each burst the worker must decay.
    fn stress(total: Duration) -> u64 {
        let _serial = SERIAL.lock();
        let slot = new_slot();
        let idle = Duration::from_micros(200);
        let decay = Decay::register(&slot, idle);
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut runs = 0;
        let end = Instant::now() + total;
        while Instant::now() < end {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            for _ in 0..1 + rng % 64 {
                run_once(&slot, &decay, 1 << 20);
                runs += 1;
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let gap = Instant::now() + Duration::from_micros(rng % 400);
                while Instant::now() < gap {
                    std::hint::spin_loop();
                }
            }
            wait_decayed(
                &slot,
                &decay,
                Duration::from_secs(2),
                &format!("after {runs} runs"),
            );
        }
        runs
    }

    #[test]
    fn no_decay_is_lost_under_runs_ending_during_decays() {
        stress(Duration::from_millis(1500));
    }

    /// The 60 s stress (`BENCHMARKS.md`): `cargo test -p tensor-arena-ort
    /// --lib decay::tests::stress_60s -- --ignored --nocapture`.
    #[test]
    #[ignore = "60 s; run by hand"]
    fn stress_60s() {
        let runs = stress(Duration::from_secs(60));
        println!("60 s: {runs} runs, every burst decayed");
    }

    /// How long a decay holds the core (a run that starts then waits that
    /// long), by reserved size: `cargo test -p tensor-arena-ort --release
    /// --lib decay::tests::decay_hold_time -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement"]
    fn decay_hold_time() {
        for mib in [1usize, 16, 64, 256] {
            let slot = new_slot();
            let mut times = Vec::new();
            for _ in 0..9 {
                {
                    let mut core = slot.lock();
                    core.begin_run(None, false, false);
                    let b = core.test_alloc(&slot, mib << 20);
                    // SAFETY: `b` is a live block of `mib` MiB, written
                    // once so that its pages are resident, as a run's are.
                    unsafe { std::ptr::write_bytes(b as *mut u8, 1, mib << 20) };
                    core.test_free(b);
                    core.finish_run();
                }
                let t = Instant::now();
                slot.try_decay().expect("idle");
                times.push(t.elapsed());
            }
            times.sort();
            println!(
                "{mib} MiB: decay holds the core {:?} (median of 9)",
                times[4]
            );
        }
    }

    #[test]
    fn memory_given_back_lazily_leaves_at_once_on_decay() {
        let _serial = SERIAL.lock();
        let pages = tensor_arena::memory::PagesConfig {
            give_back: tensor_arena::memory::GiveBack::Lazily,
            ..Default::default()
        };
        let slot = Slot::new(ArenaConfig::default(), pages, None).unwrap();
        {
            let mut core = slot.lock();
            core.begin_run(None, false, false);
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
