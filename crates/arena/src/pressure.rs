//! [`PressureMonitor`]: reads the system's memory-pressure signals and asks
//! a [`Budget`]'s idle members to give cached memory back when one fires.
//!
//! Optional: nothing in the crate reads these files unless a monitor is
//! built. The signals, each on or off in [`PressureConfig`]:
//!
//! | signal | file | fires when |
//! |---|---|---|
//! | [`Signal::CgroupEvents`] | `<cgroup>/memory.events` | its `high`, `max` or `oom` counter rose since the last poll |
//! | [`Signal::NearHigh`] | `<cgroup>/memory.current`, `memory.high` | current is above a fraction of `high` |
//! | [`Signal::Psi`] | `<proc>/pressure/memory` | `some avg10` is above a threshold (percent) |
//! | [`Signal::LowAvailable`] | `<proc>/meminfo` | `MemAvailable` is below a number of bytes |
//!
//! The paths are taken from the configuration (`/proc` and `/sys/fs/cgroup`
//! by default), so a test points them at a fake tree. A file that is
//! missing or unreadable, or does not parse, makes its signal unavailable:
//! never a panic, never an error on the caller's path.
//!
//! Acting on a signal is [`Budget::relieve`]: idle members give back all
//! their cache; busy ones are not touched (they see
//! [`Budget::pressure`] rise and give at their next run boundary). A
//! runtime calls [`PressureMonitor::relieve_if_pressed`] at run boundaries,
//! or lets [`PressureMonitor::watch`] poll on a thread of its own.

use crate::budget::Budget;
use core::sync::atomic::{AtomicU64, Ordering};
use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

/// Which signals a [`PressureMonitor`] reads, where, and their thresholds.
/// A signal whose threshold is `None` (or `false`) is not read.
#[derive(Clone, Debug, PartialEq)]
pub struct PressureConfig {
    /// The `proc` file system (`/proc`): `meminfo` and `pressure/memory`.
    pub proc_root: PathBuf,
    /// The cgroup (v2) directory whose files are read: the process's own
    /// group (`/sys/fs/cgroup` inside a container). `None`: no cgroup
    /// signal.
    pub cgroup: Option<PathBuf>,
    /// [`Signal::LowAvailable`] when `MemAvailable` is below this many
    /// bytes.
    pub min_available: Option<usize>,
    /// [`Signal::NearHigh`] when `memory.current` is above this fraction of
    /// `memory.high` (a group without `high` never fires).
    pub high_fraction: Option<f64>,
    /// [`Signal::CgroupEvents`] when `memory.events`' `high`, `max` or
    /// `oom` counter rose since the last poll.
    pub events: bool,
    /// [`Signal::Psi`] when `some avg10` (the share of the last 10 seconds
    /// some task waited for memory, in percent) is above this.
    pub psi_some_avg10: Option<f64>,
}

impl Default for PressureConfig {
    /// Every signal, from `/proc` and `/sys/fs/cgroup`: `MemAvailable`
    /// under 256 MiB, `memory.current` above 90% of `memory.high`, any new
    /// `memory.events`, PSI `some avg10` above 10%.
    fn default() -> Self {
        Self {
            proc_root: PathBuf::from("/proc"),
            cgroup: Some(PathBuf::from("/sys/fs/cgroup")),
            min_available: Some(256 << 20),
            high_fraction: Some(0.9),
            events: true,
            psi_some_avg10: Some(10.0),
        }
    }
}

/// Why memory is short: the signal that fired, with what was read.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Signal {
    /// `memory.events` counters rose since the last poll by these amounts.
    CgroupEvents {
        /// Rise of `high` (the group was throttled at `memory.high`).
        high: u64,
        /// Rise of `max` (the group hit `memory.max`).
        max: u64,
        /// Rise of `oom` (the group ran out of memory).
        oom: u64,
    },
    /// `memory.current` is above the configured fraction of `memory.high`.
    NearHigh {
        /// `memory.current`, bytes.
        current: usize,
        /// `memory.high`, bytes.
        high: usize,
    },
    /// PSI `some avg10` is above its threshold.
    Psi {
        /// The value read, percent.
        some_avg10: f64,
        /// The threshold, percent.
        threshold: f64,
    },
    /// `MemAvailable` is below its threshold.
    LowAvailable {
        /// `MemAvailable`, bytes.
        available: usize,
        /// The threshold, bytes.
        threshold: usize,
    },
}

/// A monitor's counters, a snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PressureStats {
    /// Polls so far.
    pub polls: u64,
    /// Polls that found a signal.
    pub signals: u64,
    /// Bytes given back by the relieves it made.
    pub relieved: u64,
}

/// What [`PressureMonitor::relieve_if_pressed`] did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Relief {
    /// The signal that fired.
    pub signal: Signal,
    /// Bytes the budget's idle members gave back.
    pub released: usize,
}

/// `memory.events` counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Events {
    high: u64,
    max: u64,
    oom: u64,
}

/// Reads memory-pressure signals; see the module docs. Cheap to poll: a few
/// small files, only those configured. `Sync`: one monitor may serve many
/// threads.
#[derive(Debug)]
pub struct PressureMonitor {
    config: PressureConfig,
    /// `memory.events` as read last (`None`: not read yet or unreadable).
    last_events: Mutex<Option<Events>>,
    polls: AtomicU64,
    signals: AtomicU64,
    relieved: AtomicU64,
}

impl PressureMonitor {
    /// A monitor reading what `config` names. The current `memory.events`
    /// counters are read now, so only a rise after this call is a signal.
    pub fn new(config: PressureConfig) -> Self {
        let monitor = Self {
            last_events: Mutex::new(None),
            polls: AtomicU64::new(0),
            signals: AtomicU64::new(0),
            relieved: AtomicU64::new(0),
            config,
        };
        *monitor.last_events.lock() = monitor.read_events();
        monitor
    }

    /// The configuration.
    pub fn config(&self) -> &PressureConfig {
        &self.config
    }

    /// Reads the configured signals and returns the first that fires, in
    /// the order of [`Signal`]'s variants; `None` when none does (or none
    /// can be read).
    pub fn poll(&self) -> Option<Signal> {
        self.polls.fetch_add(1, Ordering::Relaxed);
        let signal = self
            .poll_events()
            .or_else(|| self.poll_near_high())
            .or_else(|| self.poll_psi())
            .or_else(|| self.poll_available());
        if signal.is_some() {
            self.signals.fetch_add(1, Ordering::Relaxed);
        }
        signal
    }

    /// [`poll`](Self::poll)s and, if a signal fires, calls
    /// [`Budget::relieve`]: idle members give back their cache, busy ones
    /// are left alone. For a runtime to call at run boundaries.
    pub fn relieve_if_pressed(&self, budget: &Budget) -> Option<Relief> {
        let signal = self.poll()?;
        let released = budget.relieve();
        self.relieved.fetch_add(released as u64, Ordering::Relaxed);
        Some(Relief { signal, released })
    }

    /// Polls on a thread of its own every `interval`, relieving `budget`
    /// when a signal fires, until the returned [`Watch`] is dropped.
    ///
    /// # Errors
    /// When the thread cannot be spawned.
    pub fn watch(
        self: &Arc<Self>,
        budget: &Arc<Budget>,
        interval: Duration,
    ) -> std::io::Result<Watch> {
        let (stop, stopped) = mpsc::channel::<()>();
        let monitor = Arc::clone(self);
        let budget = Arc::clone(budget);
        let thread = std::thread::Builder::new()
            .name("tensor-arena-pressure".into())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                    monitor.relieve_if_pressed(&budget);
                }
            })?;
        Ok(Watch {
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PressureStats {
        PressureStats {
            polls: self.polls.load(Ordering::Relaxed),
            signals: self.signals.load(Ordering::Relaxed),
            relieved: self.relieved.load(Ordering::Relaxed),
        }
    }

    fn cgroup_file(&self, name: &str) -> Option<String> {
        read(&self.config.cgroup.as_ref()?.join(name))
    }

    fn read_events(&self) -> Option<Events> {
        if !self.config.events {
            return None;
        }
        parse_events(&self.cgroup_file("memory.events")?)
    }

    fn poll_events(&self) -> Option<Signal> {
        let now = self.read_events()?;
        let before = self.last_events.lock().replace(now)?;
        let rise = |now: u64, before: u64| now.saturating_sub(before);
        let (high, max, oom) = (
            rise(now.high, before.high),
            rise(now.max, before.max),
            rise(now.oom, before.oom),
        );
        (high + max + oom > 0).then_some(Signal::CgroupEvents { high, max, oom })
    }

    fn poll_near_high(&self) -> Option<Signal> {
        let fraction = self.config.high_fraction?;
        let high: usize = self.cgroup_file("memory.high")?.trim().parse().ok()?;
        let current: usize = self.cgroup_file("memory.current")?.trim().parse().ok()?;
        (current as f64 > high as f64 * fraction).then_some(Signal::NearHigh { current, high })
    }

    fn poll_psi(&self) -> Option<Signal> {
        let threshold = self.config.psi_some_avg10?;
        let text = read(&self.config.proc_root.join("pressure/memory"))?;
        let some_avg10 = parse_psi_some_avg10(&text)?;
        (some_avg10 > threshold).then_some(Signal::Psi {
            some_avg10,
            threshold,
        })
    }

    fn poll_available(&self) -> Option<Signal> {
        let threshold = self.config.min_available?;
        let text = read(&self.config.proc_root.join("meminfo"))?;
        let available = parse_mem_available(&text)?;
        (available < threshold).then_some(Signal::LowAvailable {
            available,
            threshold,
        })
    }
}

/// The thread of [`PressureMonitor::watch`]; dropping it stops the thread
/// (at once, not after the interval) and waits for it.
#[derive(Debug)]
pub struct Watch {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        drop(self.stop.take()); // disconnects: the thread's wait ends
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// `MemAvailable` of a `/proc/meminfo`, in bytes.
fn parse_mem_available(text: &str) -> Option<usize> {
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut words = line["MemAvailable:".len()..].split_whitespace();
    let n: usize = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => n.checked_mul(1024),
        None => Some(n),
        Some(_) => None,
    }
}

/// The `high`, `max` and `oom` counters of a `memory.events`.
fn parse_events(text: &str) -> Option<Events> {
    let mut events = Events::default();
    let mut any = false;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let (Some(key), Some(value)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(value) = value.parse() else { continue };
        match key {
            "high" => events.high = value,
            "max" => events.max = value,
            "oom" => events.oom = value,
            _ => continue,
        }
        any = true;
    }
    any.then_some(events)
}

/// `some avg10` of a PSI file (`some avg10=1.23 avg60=... total=...`).
fn parse_psi_some_avg10(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("avg10="))?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_kernels_formats() {
        let meminfo = "MemTotal:       16318480 kB\nMemFree:  1 kB\nMemAvailable:    8000000 kB\n";
        assert_eq!(parse_mem_available(meminfo), Some(8_000_000 * 1024));
        assert_eq!(parse_mem_available("MemFree: 1 kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: x kB\n"), None);
        let events = "low 0\nhigh 12\nmax 3\noom 1\noom_kill 1\n";
        assert_eq!(
            parse_events(events),
            Some(Events {
                high: 12,
                max: 3,
                oom: 1
            })
        );
        assert_eq!(parse_events("garbage"), None);
        let psi = "some avg10=12.50 avg60=3.00 avg300=1.00 total=123\nfull avg10=1.00 avg60=0.00 avg300=0.00 total=1\n";
        assert_eq!(parse_psi_some_avg10(psi), Some(12.5));
        assert_eq!(parse_psi_some_avg10("full avg10=1.00\n"), None);
    }
}
