//! Memory-pressure signals from a fake `/proc` and cgroup tree (no root
//! needed), and what a monitor does with them: `Budget::relieve`, idle
//! members giving back, busy ones untouched, a watching thread that stops
//! when dropped.

use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use tensor_arena::{ArenaConfig, Budget, PressureConfig, PressureMonitor, SharedArena, Signal};

const MIB: usize = 1 << 20;

/// A fake tree: `proc/` and `cgroup/` under a temporary directory, every
/// file calm (no signal fires).
struct Tree {
    dir: tempfile::TempDir,
}

impl Tree {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("proc/pressure")).unwrap();
        std::fs::create_dir_all(dir.path().join("cgroup")).unwrap();
        let t = Self { dir };
        t.meminfo(8 << 30);
        t.psi(0.0);
        t.events(0, 0, 0);
        t.write("cgroup/memory.high", "max\n");
        t.write("cgroup/memory.current", "1000\n");
        t
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn write(&self, rel: &str, text: &str) {
        std::fs::write(self.path(rel), text).unwrap();
    }

    fn meminfo(&self, available: usize) {
        self.write(
            "proc/meminfo",
            &format!(
                "MemTotal:       16318480 kB\nMemFree:          123456 kB\nMemAvailable:   {:>8} kB\nBuffers:            1234 kB\n",
                available / 1024
            ),
        );
    }

    fn psi(&self, avg10: f64) {
        self.write(
            "proc/pressure/memory",
            &format!(
                "some avg10={avg10:.2} avg60=0.50 avg300=0.10 total=12345\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
            ),
        );
    }

    fn events(&self, high: u64, max: u64, oom: u64) {
        self.write(
            "cgroup/memory.events",
            &format!("low 0\nhigh {high}\nmax {max}\noom {oom}\noom_kill {oom}\n"),
        );
    }

    /// Every signal on, reading this tree.
    fn config(&self) -> PressureConfig {
        PressureConfig {
            proc_root: self.path("proc"),
            cgroup: Some(self.path("cgroup")),
            ..PressureConfig::default()
        }
    }

    /// Only the signals `f` leaves on.
    fn only(&self, f: impl FnOnce(&mut PressureConfig)) -> PressureConfig {
        let mut c = PressureConfig {
            proc_root: self.path("proc"),
            cgroup: Some(self.path("cgroup")),
            min_available: None,
            high_fraction: None,
            events: false,
            psi_some_avg10: None,
        };
        f(&mut c);
        c
    }
}

#[test]
fn a_calm_system_gives_no_signal() {
    let t = Tree::new();
    let m = PressureMonitor::new(t.config());
    assert_eq!(m.poll(), None);
    assert_eq!(m.poll(), None);
    let st = m.stats();
    assert_eq!((st.polls, st.signals), (2, 0));
}

#[test]
fn mem_available_below_the_threshold() {
    let t = Tree::new();
    let m = PressureMonitor::new(t.only(|c| c.min_available = Some(256 * MIB)));
    assert_eq!(m.poll(), None);
    t.meminfo(100 * MIB);
    assert_eq!(
        m.poll(),
        Some(Signal::LowAvailable {
            available: 100 * MIB,
            threshold: 256 * MIB
        })
    );
}

#[test]
fn a_rise_of_cgroup_memory_events_fires_once() {
    let t = Tree::new();
    t.events(5, 1, 0); // counted before the monitor: not a signal
    let m = PressureMonitor::new(t.only(|c| c.events = true));
    assert_eq!(m.poll(), None);
    t.events(8, 1, 1);
    assert_eq!(
        m.poll(),
        Some(Signal::CgroupEvents {
            high: 3,
            max: 0,
            oom: 1
        })
    );
    assert_eq!(m.poll(), None, "no rise since the last poll");
}

#[test]
fn cgroup_current_near_memory_high() {
    let t = Tree::new();
    let m = PressureMonitor::new(t.only(|c| c.high_fraction = Some(0.9)));
    assert_eq!(m.poll(), None, "memory.high is max");
    t.write("cgroup/memory.high", "1000000\n");
    t.write("cgroup/memory.current", "800000\n");
    assert_eq!(m.poll(), None);
    t.write("cgroup/memory.current", "950000\n");
    assert_eq!(
        m.poll(),
        Some(Signal::NearHigh {
            current: 950_000,
            high: 1_000_000
        })
    );
}

#[test]
fn psi_some_avg10_above_the_threshold() {
    let t = Tree::new();
    let m = PressureMonitor::new(t.only(|c| c.psi_some_avg10 = Some(10.0)));
    t.psi(9.5);
    assert_eq!(m.poll(), None);
    t.psi(12.5);
    assert_eq!(
        m.poll(),
        Some(Signal::Psi {
            some_avg10: 12.5,
            threshold: 10.0
        })
    );
}

/// Missing, empty or garbled files: the signal is unavailable, never a
/// panic; the others still work.
#[test]
fn unreadable_files_make_a_signal_unavailable() {
    let empty = tempfile::tempdir().unwrap();
    let m = PressureMonitor::new(PressureConfig {
        proc_root: empty.path().join("no-proc"),
        cgroup: Some(empty.path().join("no-cgroup")),
        ..PressureConfig::default()
    });
    assert_eq!(m.poll(), None);

    let t = Tree::new();
    t.write("proc/meminfo", "garbage\n");
    t.write("proc/pressure/memory", "");
    t.write("cgroup/memory.events", "\u{0}\u{1}");
    t.write("cgroup/memory.high", "lots\n");
    let m = PressureMonitor::new(t.config());
    assert_eq!(m.poll(), None);
    std::fs::remove_file(t.path("cgroup/memory.events")).unwrap();
    t.psi(50.0);
    assert!(matches!(m.poll(), Some(Signal::Psi { .. })));
    let none = PressureMonitor::new(PressureConfig {
        cgroup: None,
        ..t.only(|c| c.events = true)
    });
    assert_eq!(none.poll(), None);
}

/// Holds `arena`'s lock on another thread until the returned sender is
/// dropped or sent to.
fn hold(
    arena: &Arc<SharedArena<tensor_arena::memory::Budgeted<tensor_arena::DefaultMemory>>>,
) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (locked_tx, locked_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let a = Arc::clone(arena);
    let t = std::thread::spawn(move || {
        let _guard = a.lock();
        locked_tx.send(()).unwrap();
        let _ = release_rx.recv();
    });
    locked_rx.recv().unwrap();
    (release_tx, t)
}

/// A signal relieves the budget: the idle member gives its cache back, the
/// busy one (its lock held by a running thread) is not touched; no signal,
/// nothing given.
#[test]
fn a_signal_relieves_idle_members_only() {
    let t = Tree::new();
    let budget = Budget::new(256 * MIB);
    let idle = SharedArena::with_budget(ArenaConfig::default(), &budget).unwrap();
    let busy = SharedArena::with_budget(ArenaConfig::default(), &budget).unwrap();
    let mut live = idle.try_alloc(MIB).unwrap();
    live.fill(7);
    drop(idle.try_alloc(16 * MIB).unwrap());
    drop(busy.try_alloc(16 * MIB).unwrap());
    let (idle_before, busy_before) = (idle.stats().reserved, busy.stats().reserved);
    assert!(idle_before >= 17 * MIB && busy_before >= 16 * MIB);

    let m = PressureMonitor::new(t.only(|c| c.psi_some_avg10 = Some(10.0)));
    assert_eq!(m.relieve_if_pressed(&budget), None);
    assert_eq!(
        idle.stats().reserved,
        idle_before,
        "no signal, nothing given"
    );
    let pressure = budget.pressure();

    let (release, holder) = hold(&busy);
    t.psi(40.0);
    let relief = m.relieve_if_pressed(&budget).expect("a signal");
    assert!(matches!(relief.signal, Signal::Psi { .. }));
    let idle_after = idle.stats().reserved;
    assert_eq!(relief.released, idle_before - idle_after);
    // The live block stays, in whole commit steps (2 MiB with huge pages).
    assert!(idle_after <= 4 * MIB, "the idle member kept {idle_after}");
    assert!(live.iter().all(|&b| b == 7), "a live block was touched");
    assert_eq!(budget.pressure(), pressure + 1, "busy members are told");
    drop(release);
    holder.join().unwrap();
    assert_eq!(
        busy.stats().reserved,
        busy_before,
        "the busy member was touched"
    );
    assert_eq!(budget.committed(), idle_after + busy_before);
    assert_eq!(m.stats().relieved, relief.released as u64);
}

/// The watching thread relieves on its own, and stops at once when its
/// handle is dropped (not after its interval).
#[test]
fn the_watch_thread_relieves_and_stops_on_drop() {
    let t = Tree::new();
    let budget = Budget::new(256 * MIB);
    let a = SharedArena::with_budget(ArenaConfig::default(), &budget).unwrap();
    drop(a.try_alloc(16 * MIB).unwrap());
    assert!(budget.committed() >= 16 * MIB);
    let m = Arc::new(PressureMonitor::new(
        t.only(|c| c.min_available = Some(256 * MIB)),
    ));
    let watch = m.watch(&budget, Duration::from_millis(5)).unwrap();
    t.meminfo(64 * MIB);
    let start = Instant::now();
    while budget.committed() > 0 {
        assert!(start.elapsed() < Duration::from_secs(20), "never relieved");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(watch);
    let polls = m.stats().polls;
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(m.stats().polls, polls, "the thread still polls after drop");

    let slow = m.watch(&budget, Duration::from_secs(3600)).unwrap();
    let start = Instant::now();
    drop(slow);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "drop waited for the interval"
    );
}
