//! One memory limit for every process of a container: a ledger in shared
//! memory where each process says what its runs were promised and what
//! its arenas hold, so that the processes of one cgroup (a server's
//! workers, forked or spawned; replicas on one node) admit runs against
//! one limit, not one each.
//!
//! | piece | what it is |
//! |---|---|
//! | the file | `/dev/shm/tensor-arena-<uid>-<key>`: [`SLOTS`] slots of 64 bytes, mapped shared by every process that uses the same limit (`key`: the limit, its source and the PID namespace) |
//! | a slot | one process: its PID and start time (which tell a dead process from a live one), the bytes its runs in flight were promised, its arenas' committed bytes, what the rest of the process holds, whether a run waits to run alone (and since when) or runs alone |
//! | claiming | compare-and-swap of the PID word from 0; a slot whose process is gone is freed by whoever notices (a reader checks `/proc/<pid>/stat` at most once a second), through a sentinel so that only one freer clears it |
//! | reading | a sum over the slots: atomic loads, no lock |
//!
//! No daemon, no lock held across processes: each process writes only its
//! own slot (atomic stores), and reads the others'. A process killed
//! mid-run (SIGKILL, the OOM killer) leaves its slot behind; the next
//! process to read the ledger after a second frees it, so its share comes
//! back within about a second of its death.
//!
//! What the ledger cannot see, and what that costs, is in
//! `docs/decisions.md` ("One budget per container"): two processes reading
//! at once may both admit a run into the same free bytes (each promise is
//! published before the run allocates, so the window is one read), and a
//! process's memory outside its arenas is sampled, not tracked.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Slots in a ledger: processes that can share one limit. A process that
/// finds none free counts alone (and says so once on stderr).
pub const SLOTS: usize = 256;
/// Bytes of one slot (a cache line: two processes never write one line).
const SLOT_BYTES: usize = 64;
/// Bytes of the header (magic and version).
const HEADER_BYTES: usize = 64;
const MAGIC: u64 = 0x7465_6e73_6172_656e; // "tensaren"
const VERSION: u64 = 1;
/// The PID word of a slot being freed by one reader.
const FREEING: u32 = u32::MAX;
/// How often a reader checks that the processes of the slots are alive.
const LIVENESS_EVERY: Duration = Duration::from_secs(1);

/// The ledger's environment variable: the directory of its file (default
/// `/dev/shm`), or `off` for a limit counted by this process alone.
pub const LEDGER_DIR_ENV: &str = "TENSOR_ARENA_LEDGER_DIR";

/// What one process says in its slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Share {
    /// Bytes promised to its runs in flight.
    pub promised: u64,
    /// Bytes its arenas hold (committed).
    pub committed: u64,
    /// Bytes the rest of the process holds (its anonymous resident memory
    /// less its arenas').
    pub rest: u64,
    /// Since when a run of it waits at the head of its queue to run alone
    /// ([`monotonic_ns`]; `None`: none waits).
    pub alone_since: Option<u64>,
    /// Whether a run of it runs alone now.
    pub alone_running: bool,
}

/// A slot's `alone` word: a run waits alone at the head of its queue
/// (since the time in the word's upper bits).
const WAITS_ALONE: u64 = 1;
/// A slot's `alone` word: a run runs alone.
const RUNS_ALONE: u64 = 2;

/// The `alone` word of `share`: since when its run waits alone (shifted
/// past the two flags), and the flags.
fn alone_word(share: &Share) -> u64 {
    let waits = share
        .alone_since
        .map_or(0, |t| (t.min(u64::MAX >> 2) << 2) | WAITS_ALONE);
    waits | (u64::from(share.alone_running) * RUNS_ALONE)
}

/// The system's monotonic clock in nanoseconds (`CLOCK_MONOTONIC`): one
/// clock for every process of the machine, so that runs waiting alone in
/// two processes go in the order they came.
pub(crate) fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid `timespec` to write; CLOCK_MONOTONIC is
    // always supported on Linux.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) } == 0;
    if !ok {
        return 0;
    }
    u64::try_from(t.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(t.tv_nsec).unwrap_or(0))
}

/// The other processes of the ledger, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Others {
    /// Live processes other than this one.
    pub processes: usize,
    /// What their arenas need: for each, the larger of its promises and
    /// its committed bytes.
    pub held: u64,
    /// What their arenas hold (committed).
    pub committed: u64,
    /// What the rest of those processes holds.
    pub rest: u64,
    /// Whether one of them waits to run a run alone, or runs one.
    pub alone: bool,
    /// Whether one of them runs a run alone now: no run alone of another
    /// process starts beside it, whatever its PID.
    pub alone_running: bool,
    /// The first of those that wait to run a run alone: since when, and
    /// its PID (two processes waiting so go in the order they came, the
    /// lower PID first at the same instant).
    pub alone_first: Option<(u64, u32)>,
    /// What their runs in flight were promised.
    pub promised: u64,
}

/// A process's view of a ledger file.
pub struct Ledger {
    map: memmap2::MmapMut,
    path: PathBuf,
    /// This process's slot, and the PID it was claimed for (a forked child
    /// claims its own).
    mine: std::sync::Mutex<Option<(usize, u32)>>,
    /// `mine` as one word read without the lock: the PID in the high 32
    /// bits, the slot plus one in the low (0: none).
    mine_word: AtomicU64,
    /// When the slots' processes were last checked.
    checked: std::sync::Mutex<Option<Instant>>,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// The words of one slot.
struct Slot<'a> {
    pid: &'a AtomicU32,
    start: &'a AtomicU64,
    promised: &'a AtomicU64,
    committed: &'a AtomicU64,
    rest: &'a AtomicU64,
    alone: &'a AtomicU64,
}

impl Ledger {
    /// Opens (creating it if needed) the ledger named `key` in `dir`.
    ///
    /// # Errors
    /// The I/O error, or `InvalidData` for a file that is not a ledger of
    /// this version (another program's, or a future version's).
    pub fn open(dir: &Path, key: &str) -> std::io::Result<Self> {
        // SAFETY: `getuid` has no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
        let path = dir.join(format!("tensor-arena-{uid}-{key}"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)?;
        let meta = file.metadata()?;
        if !meta.file_type().is_file() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: not a regular file", path.display()),
            ));
        }
        let len = (HEADER_BYTES + SLOTS * SLOT_BYTES) as u64;
        if meta.len() < len {
            // Every process sets the same length: idempotent, and the new
            // bytes read as zero (free slots).
            file.set_len(len)?;
        } else if meta.len() > len {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: not a ledger of this version", path.display()),
            ));
        }
        // SAFETY: the file is this user's, opened without following links
        // and of the ledger's length; other processes change it only
        // through the atomic words below (never through references to
        // plain memory), and none shortens it (its length is fixed).
        let map = unsafe { memmap2::MmapMut::map_mut(&file) }?;
        let ledger = Self {
            map,
            path,
            mine: std::sync::Mutex::new(None),
            mine_word: AtomicU64::new(0),
            checked: std::sync::Mutex::new(None),
        };
        let magic = ledger.word(0);
        match magic.compare_exchange(0, MAGIC, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => ledger.word(8).store(VERSION, Ordering::Release),
            Err(m) if m == MAGIC => {}
            Err(_) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: not a ledger", ledger.path.display()),
                ))
            }
        }
        let v = ledger.word(8).load(Ordering::Acquire);
        if v != VERSION && v != 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{}: ledger version {v}, not {VERSION}",
                    ledger.path.display()
                ),
            ));
        }
        Ok(ledger)
    }

    /// The ledger's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The 8-byte word at byte `at` of the mapping.
    fn word(&self, at: usize) -> &AtomicU64 {
        assert!(at % 8 == 0 && at + 8 <= self.map.len());
        // SAFETY: 1. `at` is in bounds and 8-aligned (asserted; the mapping
        // is page-aligned); 2. the mapping lives as long as `self`; 3. every
        // access to these bytes, in every process, is atomic (shared memory
        // atomics are address-free on the targets this crate runs on).
        unsafe { &*self.map.as_ptr().add(at).cast::<AtomicU64>() }
    }

    fn slot(&self, i: usize) -> Slot<'_> {
        let at = HEADER_BYTES + i * SLOT_BYTES;
        // SAFETY: as in `word`: the PID word is the low 4 bytes of the
        // slot's first 8 (4-aligned, in bounds), accessed only atomically.
        let pid = unsafe { &*self.map.as_ptr().add(at).cast::<AtomicU32>() };
        Slot {
            pid,
            start: self.word(at + 8),
            promised: self.word(at + 16),
            committed: self.word(at + 24),
            rest: self.word(at + 32),
            alone: self.word(at + 40),
        }
    }

    /// This process's slot, claiming one if it has none (or had one before
    /// a fork). `None` when every slot is taken.
    fn own(&self) -> Option<usize> {
        let pid = std::process::id();
        let word = self.mine_word.load(Ordering::Acquire);
        if word >> 32 == u64::from(pid) && word & 0xffff_ffff != 0 {
            return usize::try_from((word & 0xffff_ffff) - 1).ok();
        }
        let mut mine = self.mine.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((i, p)) = *mine {
            if p == pid {
                return Some(i);
            }
        }
        let start = start_time(pid).unwrap_or(1).max(1);
        for i in 0..SLOTS {
            let s = self.slot(i);
            if s.pid
                .compare_exchange(0, pid, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                s.promised.store(0, Ordering::Relaxed);
                s.committed.store(0, Ordering::Relaxed);
                s.rest.store(0, Ordering::Relaxed);
                s.alone.store(0, Ordering::Relaxed);
                s.start.store(start, Ordering::Release);
                *mine = Some((i, pid));
                self.mine_word
                    .store(u64::from(pid) << 32 | (i as u64 + 1), Ordering::Release);
                return Some(i);
            }
        }
        None
    }

    /// Publishes this process's share. Returns whether it has a slot.
    pub fn publish(&self, share: Share) -> bool {
        let Some(i) = self.own() else {
            return false;
        };
        let s = self.slot(i);
        s.promised.store(share.promised, Ordering::Relaxed);
        s.committed.store(share.committed, Ordering::Relaxed);
        s.rest.store(share.rest, Ordering::Relaxed);
        // Sequentially consistent with the loads in `others`: two
        // processes that each publish a wait alone and then read the other
        // do not both miss each other's flag.
        s.alone.store(alone_word(&share), Ordering::SeqCst);
        true
    }

    /// Gives this process's slot back (its runs and arenas are gone).
    pub fn leave(&self) {
        let pid = std::process::id();
        let mut mine = self.mine.lock().unwrap_or_else(|e| e.into_inner());
        self.mine_word.store(0, Ordering::Release);
        if let Some((i, p)) = mine.take() {
            if p == pid {
                let s = self.slot(i);
                s.start.store(0, Ordering::Relaxed);
                s.pid.store(0, Ordering::Release);
            }
        }
    }

    /// The other live processes' shares, summed. Frees the slots of
    /// processes that are gone (checked at most once a second, or at once
    /// with `check_now`).
    pub fn others(&self, check_now: bool) -> Others {
        let me = self.own();
        let check = {
            let mut c = self.checked.lock().unwrap_or_else(|e| e.into_inner());
            let due = check_now || c.is_none_or(|t| t.elapsed() >= LIVENESS_EVERY);
            if due {
                *c = Some(Instant::now());
            }
            due
        };
        let mut out = Others::default();
        for i in 0..SLOTS {
            if Some(i) == me {
                continue;
            }
            let s = self.slot(i);
            let pid = s.pid.load(Ordering::Acquire);
            if pid == 0 || pid == FREEING {
                continue;
            }
            let start = s.start.load(Ordering::Acquire);
            // A start of 0: the slot is being claimed; its words are zero.
            if check && start != 0 && start_time(pid).is_none_or(|t| t.max(1) != start) {
                self.free(i, pid);
                continue;
            }
            out.processes += 1;
            out.committed = out
                .committed
                .saturating_add(s.committed.load(Ordering::Relaxed));
            out.held = out.held.saturating_add(
                s.promised
                    .load(Ordering::Relaxed)
                    .max(s.committed.load(Ordering::Relaxed)),
            );
            out.rest = out.rest.saturating_add(s.rest.load(Ordering::Relaxed));
            out.promised = out
                .promised
                .saturating_add(s.promised.load(Ordering::Relaxed));
            let alone = s.alone.load(Ordering::SeqCst);
            if alone != 0 {
                out.alone = true;
            }
            if alone & RUNS_ALONE != 0 {
                out.alone_running = true;
            }
            if alone & WAITS_ALONE != 0 {
                let me = (alone >> 2, pid);
                out.alone_first = Some(out.alone_first.map_or(me, |f| f.min(me)));
            }
        }
        out
    }

    /// Writes a slot for process `pid` (another process of the container,
    /// in a test), with its real start time.
    #[cfg(test)]
    pub(crate) fn pretend(&self, pid: u32, share: Share) {
        for i in 0..SLOTS {
            let s = self.slot(i);
            if s.pid
                .compare_exchange(0, pid, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                s.promised.store(share.promised, Ordering::Relaxed);
                s.committed.store(share.committed, Ordering::Relaxed);
                s.rest.store(share.rest, Ordering::Relaxed);
                s.alone.store(alone_word(&share), Ordering::Relaxed);
                let start = start_time(pid).expect("a live process").max(1);
                s.start.store(start, Ordering::Release);
                return;
            }
        }
    }

    /// Frees slot `i`, whose process `pid` is gone: only the reader whose
    /// swap to [`FREEING`] succeeds clears it.
    fn free(&self, i: usize, pid: u32) {
        let s = self.slot(i);
        if s.pid
            .compare_exchange(pid, FREEING, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            s.start.store(0, Ordering::Relaxed);
            s.promised.store(0, Ordering::Relaxed);
            s.committed.store(0, Ordering::Relaxed);
            s.rest.store(0, Ordering::Relaxed);
            s.alone.store(0, Ordering::Relaxed);
            s.pid.store(0, Ordering::Release);
        }
    }
}

impl Drop for Ledger {
    /// Gives this process's slot back (a forked child's copy leaves the
    /// parent's slot alone).
    fn drop(&mut self) {
        self.leave();
    }
}

/// When process `pid` started (field 22 of `/proc/<pid>/stat`, clock ticks
/// since boot): with its PID, it names one process (a PID is reused, a
/// start time with it is not). `None`: no such process.
fn start_time(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces.
    let after = &text[text.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// The anonymous memory this process has resident (`/proc/self/statm`:
/// resident less file-backed and shared pages), in bytes.
pub(crate) fn anon_resident() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/statm").ok()?;
    let mut f = text.split_whitespace().map(|v| v.parse::<u64>().ok());
    let (_size, resident, shared) = (f.next()??, f.next()??, f.next()??);
    // SAFETY: `sysconf` has no preconditions.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
    Some(resident.saturating_sub(shared).saturating_mul(page))
}

/// The identity of this process's PID namespace (`/proc/self/ns/pid`):
/// processes of two namespaces never share a ledger (their PIDs cannot be
/// checked across).
pub(crate) fn pid_namespace() -> String {
    std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

/// A short stable hash (FNV-1a, 64 bits) of `text`, in hex, for file names.
pub(crate) fn key_of(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn two_views_of_one_file_see_each_other_and_a_dead_process_is_freed() {
        let d = dir();
        let a = Ledger::open(d.path(), "k").unwrap();
        assert!(a.publish(Share {
            promised: 10,
            committed: 30,
            rest: 5,
            alone_since: None,
            alone_running: false,
        }));
        // Another process's slot, written by hand: a live one (PID 1, its
        // real start time) and a dead one.
        let b = Ledger::open(d.path(), "k").unwrap();
        let live = b.slot(7);
        live.pid.store(1, Ordering::Relaxed);
        live.start
            .store(start_time(1).unwrap().max(1), Ordering::Relaxed);
        live.promised.store(100, Ordering::Relaxed);
        live.rest.store(7, Ordering::Relaxed);
        let dead = b.slot(9);
        dead.pid.store(u32::MAX - 1, Ordering::Relaxed);
        dead.start.store(12345, Ordering::Relaxed);
        dead.committed.store(1 << 30, Ordering::Relaxed);
        let o = a.others(true);
        assert_eq!(o.processes, 1, "the dead one is freed: {o:?}");
        assert_eq!(o.held, 100);
        assert_eq!(o.rest, 7);
        assert_eq!(b.slot(9).pid.load(Ordering::Relaxed), 0);
        assert_eq!(b.slot(9).committed.load(Ordering::Relaxed), 0);
        a.leave();
    }

    #[test]
    fn a_file_that_is_not_a_ledger_is_refused() {
        let d = dir();
        let a = Ledger::open(d.path(), "x").unwrap();
        let path = a.path().to_path_buf();
        drop(a);
        std::fs::write(&path, vec![1u8; 9000]).unwrap();
        let err = Ledger::open(d.path(), "x").unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{err}");
    }

    #[test]
    fn helpers_read_this_process() {
        assert!(start_time(std::process::id()).is_some());
        assert!(anon_resident().unwrap() > 0);
        assert_ne!(key_of("a"), key_of("b"));
    }
}
