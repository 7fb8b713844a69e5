//! The default limit on the memory the process's workers commit: one
//! [`Budget`] shared by every worker made without a budget of its own, and
//! one limit shared by every process of the container, so that a request
//! too large for the machine fails alone, with an out-of-memory error,
//! instead of the kernel's OOM killer taking the server.
//!
//! | where the limit comes from (first that applies) | what it limits |
//! |---|---|
//! | [`set_default_memory_limit`], called before the first worker | the arenas of every process that sets the same limit in the same container, together (`None`: no limit) |
//! | `TENSOR_ARENA_MEMORY_LIMIT` in the environment | the same: bytes (`512M`, `4GiB`, `1073741824`), or `off` |
//! | the process's cgroup: `memory.max`, `memory.high` (v2), `memory.limit_in_bytes` (v1), the smallest up the hierarchy | the whole container: its processes' arenas get what the rest of those processes (measured as they run) and a margin ([`margin`]) leave |
//! | `MemTotal` in `/proc/meminfo` | [`MEMTOTAL_PERCENT`] % of it, for the arenas of the processes of this cgroup together |
//!
//! One limit per container: the processes that share a limit (a server's
//! workers, forked or spawned; replicas on one node) meet in a ledger in
//! shared memory (the ledger (`ledger.rs`)): each says what its runs were
//! promised, what its arenas hold and what the rest of it holds, and each
//! admits its runs into what the others leave ([`Admission`](crate::Admission)). No
//! daemon: a process killed mid-run gives its share back within about a
//! second. `TENSOR_ARENA_LEDGER_DIR=off` makes the limit this process's
//! alone.
//!
//! Why a whole limit less what the processes measure, not a fixed share:
//! the rest of a process (sessions, the application's buffers, the
//! interpreter) differs from one service to the next, and every worker
//! process has one; a fixed share per process promised 150% of a 1 GiB
//! container to two workers. Without a group, `MemTotal` is the whole
//! machine, shared with other processes and the kernel: half, for the
//! arenas. The limit only refuses a commit that would pass it; idle
//! workers first give their cache back (the budget asks them), so a busy
//! server keeps its memory and only a request that cannot fit fails.
//!
//! The limit is read once, when the first worker without a budget of its
//! own is made; a worker given [`WorkerOptions::budget`](crate::WorkerOptions::budget)
//! uses that budget instead.

use crate::admit::{Admission, Room, Shared};
use crate::forklock::{hold, ForkMutex};
use crate::OrtArenaError;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tensor_arena::Budget;

/// The environment variable that sets the default limit: bytes, with an
/// optional suffix `K`, `M`, `G`, `T` (or `KiB`... : powers of 1024), or
/// `off` for none.
pub const MEMORY_LIMIT_ENV: &str = "TENSOR_ARENA_MEMORY_LIMIT";
/// What a container's whole limit keeps free besides the rest of its
/// processes: the page cache a service cannot do without (the code it
/// runs, which the rest does not count), the kernel's memory charged to
/// the group, and what a process allocates between two samples: a
/// sixteenth of the limit, at least 64 MiB.
pub fn margin(limit: usize) -> usize {
    (limit / 16).max(64 << 20)
}
/// The share of `MemTotal` the default limit takes when the process has no
/// cgroup limit, in percent.
pub const MEMTOTAL_PERCENT: usize = 50;

/// Where a [`MemoryLimit`] came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LimitSource {
    /// [`set_default_memory_limit`].
    Code,
    /// [`MEMORY_LIMIT_ENV`].
    Environment,
    /// This control group file's limit: the container's whole memory,
    /// shared by its processes (arenas and the rest).
    Cgroup(PathBuf),
    /// [`MEMTOTAL_PERCENT`] % of `MemTotal`.
    MemTotal,
}

/// The default limit of the process's workers' memory, and its source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryLimit {
    /// Bytes: for [`LimitSource::Cgroup`], the container's whole limit
    /// (the arenas get what the rest of its processes leave); otherwise
    /// what the arenas of every process sharing the limit may commit
    /// together.
    pub bytes: usize,
    /// Where the number came from.
    pub source: LimitSource,
}

/// What the process's default is: not chosen yet, chosen (a limit or
/// none), or made (the shared budget, if any).
enum Default {
    Unchosen,
    Chosen(Option<MemoryLimit>),
    Made(Option<(MemoryLimit, Arc<Budget>)>, Arc<Admission>),
}

static DEFAULT: ForkMutex<Default> = ForkMutex::new(Default::Unchosen);

/// [`crate::fork::prepare`]: the default budget's lock (a worker's
/// creation), kept until [`crate::forklock::release`].
pub(crate) fn prepare_fork() {
    hold(DEFAULT.lock());
}

/// Sets the default limit of the process's workers (`None`: no limit), in
/// place of the environment's and the system's. Call it before the first
/// worker is made.
///
/// # Errors
/// [`OrtArenaError::MemoryLimit`] if a worker without a budget of its own
/// was made already (the limit in force then stays), or if `bytes` is 0
/// or more than the machine's memory.
pub fn set_default_memory_limit(bytes: Option<usize>) -> Result<(), OrtArenaError> {
    if let Some(b) = bytes {
        check_bytes(b)?;
    }
    let mut d = DEFAULT.lock();
    if let Default::Made(..) = *d {
        return Err(OrtArenaError::MemoryLimit(
            "the default limit is set before the first worker is made; it is in force already"
                .into(),
        ));
    }
    *d = Default::Chosen(bytes.map(|bytes| MemoryLimit {
        bytes,
        source: LimitSource::Code,
    }));
    Ok(())
}

/// The default limit of the process's workers: the one in force if a
/// worker was made, else the one that would be (`None`: no limit).
///
/// # Errors
/// [`OrtArenaError::MemoryLimit`] if [`MEMORY_LIMIT_ENV`] holds no size.
pub fn default_memory_limit() -> Result<Option<MemoryLimit>, OrtArenaError> {
    match &*DEFAULT.lock() {
        Default::Made(m, _) => Ok(m.as_ref().map(|(l, _)| l.clone())),
        Default::Chosen(l) => Ok(l.clone()),
        Default::Unchosen => from_environment_or_system(),
    }
}

/// The budget every worker without one of its own commits under (made the
/// first time; `None` when there is no limit). Its stats say what the
/// process's workers hold and how many commits it refused.
///
/// # Errors
/// [`OrtArenaError::MemoryLimit`] if [`MEMORY_LIMIT_ENV`] holds no size
/// (nothing is made then; the next call reads it again).
pub fn default_budget() -> Result<Option<Arc<Budget>>, OrtArenaError> {
    Ok(made()?.0)
}

/// The admission of the default limit's runs ([`Admission`](crate::Admission)): shared
/// by every pool whose workers commit under the default budget.
///
/// # Errors
/// As [`default_budget`].
pub(crate) fn default_admission() -> Result<Arc<Admission>, OrtArenaError> {
    Ok(made()?.1)
}

/// The default budget and admission, made the first time.
fn made() -> Result<(Option<Arc<Budget>>, Arc<Admission>), OrtArenaError> {
    let mut d = DEFAULT.lock();
    let limit = match &*d {
        Default::Made(m, a) => return Ok((m.as_ref().map(|(_, b)| Arc::clone(b)), Arc::clone(a))),
        Default::Chosen(l) => l.clone(),
        Default::Unchosen => from_environment_or_system()?,
    };
    let (made, admission) = match limit {
        None => (None, Admission::unlimited()),
        Some(l) => {
            let budget = Budget::new(l.bytes);
            let admission = shared(&l, &budget);
            admission.follow_commits();
            (Some((l, budget)), admission)
        }
    };
    let budget = made.as_ref().map(|(_, b)| Arc::clone(b));
    *d = Default::Made(made, Arc::clone(&admission));
    Ok((budget, admission))
}

/// The admission of `limit`, shared with the container's other processes
/// through a ledger where one can be opened (else this process's alone,
/// said once on stderr).
fn shared(limit: &MemoryLimit, budget: &Arc<Budget>) -> Arc<Admission> {
    let dir = match std::env::var(crate::ledger::LEDGER_DIR_ENV) {
        Ok(v) if v.trim().eq_ignore_ascii_case("off") => {
            return Admission::of_budget(Arc::clone(budget))
        }
        Ok(v) if !v.trim().is_empty() => PathBuf::from(v.trim()),
        _ => PathBuf::from("/dev/shm"),
    };
    let whole = matches!(limit.source, LimitSource::Cgroup(_));
    let identity = format!(
        "{:?} {} {} {}",
        limit.source,
        limit.bytes,
        crate::ledger::pid_namespace(),
        std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default()
    );
    let key = crate::ledger::key_of(&identity);
    match crate::ledger::Ledger::open(&dir, &key) {
        Ok(ledger) => Admission::new(Room::Shared(Shared {
            budget: Arc::clone(budget),
            ledger,
            limit: limit.bytes,
            whole,
            margin: if whole { margin(limit.bytes) } else { 0 },
            usage: match &limit.source {
                LimitSource::Cgroup(file) => file.parent().and_then(|dir| {
                    let usage = ["memory.current", "memory.usage_in_bytes"]
                        .iter()
                        .map(|f| dir.join(f))
                        .find(|p| p.exists())?;
                    Some((usage, dir.join("memory.stat")))
                }),
                _ => None,
            },
        })),
        Err(e) => {
            eprintln!(
                "tensor-arena-ort: the memory limit is counted for this process alone: \
                 its ledger in {} cannot be opened ({e})",
                dir.display()
            );
            Admission::of_budget(Arc::clone(budget))
        }
    }
}

/// In a forked child: the default limit's admission as the child has it
/// (no run in flight, a ledger slot of its own). Called by
/// [`crate::fork::child`] with the default's lock free.
pub(crate) fn child_after_fork() {
    let mut d = DEFAULT.lock();
    if let Default::Made(_, a) = &mut *d {
        *a = a.after_fork();
        a.follow_commits();
    }
}

/// Makes the default limit (if not made) and says this process is one of
/// its processes: a service calls it when it opens its sessions, before
/// its first run, so that the other processes of its container count what
/// it holds while it loads (the Python package does, for every session).
/// A no-op without a limit.
///
/// # Errors
/// As [`default_budget`].
pub fn join_default_limit() -> Result<(), OrtArenaError> {
    made()?.1.republish();
    Ok(())
}

/// Waits until this process may load a session under the default limit,
/// and holds that turn until the returned guard is dropped: loading a
/// model (ONNX Runtime's graph optimisation, its weights) takes hundreds
/// of MiB outside any arena, so the processes of a container load one at
/// a time, with no run in flight beside the load (it is admitted as a run
/// alone: [`Admission`](crate::Admission)). Without a limit shared with other processes,
/// the guard is had at once.
///
/// Four rapidocr workers loading their sessions at once in a 1 GiB
/// container were killed by the kernel before their first run (each held
/// 260-280 MiB while loading).
///
/// # Errors
/// As [`default_budget`]; [`OrtArenaError::OutOfMemory`] if the turn did
/// not come within [`ALONE_WAIT`](crate::ALONE_WAIT).
pub fn load_turn() -> Result<LoadTurn, OrtArenaError> {
    let admission = made()?.1;
    if !admission.is_shared() {
        return Ok(LoadTurn { _ticket: None });
    }
    let ticket = admission.admit(0, true)?;
    Ok(LoadTurn {
        _ticket: Some(ticket),
    })
}

/// A process's turn to load a session ([`load_turn`]); the next process
/// (or run) goes when it is dropped.
pub struct LoadTurn {
    _ticket: Option<crate::admit::Ticket>,
}

impl std::fmt::Debug for LoadTurn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadTurn").finish_non_exhaustive()
    }
}

/// Publishes what the process holds to the default limit's ledger (after
/// idle workers gave memory back), if the default is made.
pub(crate) fn republish() {
    let admission = match &*DEFAULT.lock() {
        Default::Made(_, a) => Arc::clone(a),
        _ => return,
    };
    admission.republish();
}

fn from_environment_or_system() -> Result<Option<MemoryLimit>, OrtArenaError> {
    match std::env::var(MEMORY_LIMIT_ENV) {
        Ok(v) => parse_env(&v).map(|b| {
            b.map(|bytes| MemoryLimit {
                bytes,
                source: LimitSource::Environment,
            })
        }),
        Err(std::env::VarError::NotUnicode(_)) => Err(OrtArenaError::MemoryLimit(format!(
            "{MEMORY_LIMIT_ENV} is not text"
        ))),
        Err(std::env::VarError::NotPresent) => Ok(system_limit(
            Path::new("/sys/fs/cgroup"),
            &std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default(),
            &std::fs::read_to_string("/proc/meminfo").unwrap_or_default(),
        )),
    }
}

/// [`MEMORY_LIMIT_ENV`]'s value: `Ok(None)` for `off`.
fn parse_env(value: &str) -> Result<Option<usize>, OrtArenaError> {
    parse_memory_limit(value).map_err(|e| match e {
        OrtArenaError::MemoryLimit(m) => {
            OrtArenaError::MemoryLimit(format!("{MEMORY_LIMIT_ENV}: {m}"))
        }
        e => e,
    })
}

/// A memory limit as text, as [`MEMORY_LIMIT_ENV`] takes it and the
/// Python package's `set_memory_limit` too: bytes (`1073741824`), with a
/// suffix `K`, `M`, `G`, `T` (`KB`, `KiB`, ...: powers of 1024), or
/// `off`/`none` (`Ok(None)`: no limit). The value is checked against the
/// machine: more than its memory (`MemTotal`) is an error, not a limit
/// that never applies.
///
/// # Errors
/// [`OrtArenaError::MemoryLimit`] naming the value: not a size, 0 (use
/// `off`), negative, too large to count, or over the machine's memory.
pub fn parse_memory_limit(value: &str) -> Result<Option<usize>, OrtArenaError> {
    let v = value.trim();
    if v.eq_ignore_ascii_case("off") || v.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    let bad = || {
        OrtArenaError::MemoryLimit(format!(
            "{value:?}: not a size (bytes, or with K, M, G, T; or off)"
        ))
    };
    if v.starts_with('-') {
        return Err(OrtArenaError::MemoryLimit(format!(
            "{value:?}: a limit is not negative (off: no limit)"
        )));
    }
    let digits = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let n: usize = v[..digits].parse().map_err(|_| bad())?;
    let shift = match v[digits..].trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(bad()),
    };
    let bytes = n.checked_mul(1usize << shift).ok_or_else(bad)?;
    check_bytes(bytes).map(Some)
}

/// `bytes` as a limit: not 0, not over the machine's memory.
///
/// # Errors
/// [`OrtArenaError::MemoryLimit`] saying which.
pub fn check_memory_limit(bytes: usize) -> Result<usize, OrtArenaError> {
    check_bytes(bytes)
}

fn check_bytes(bytes: usize) -> Result<usize, OrtArenaError> {
    if bytes == 0 {
        return Err(OrtArenaError::MemoryLimit(
            "a limit of 0 bytes; use off (None) for no limit".into(),
        ));
    }
    if let Some(total) = mem_total(&std::fs::read_to_string("/proc/meminfo").unwrap_or_default()) {
        if bytes > total {
            return Err(OrtArenaError::MemoryLimit(format!(
                "a limit of {bytes} bytes is more than this machine's memory ({total} bytes): \
                 it would never apply; use off (None) for no limit"
            )));
        }
    }
    Ok(bytes)
}

/// `MemTotal` of `/proc/meminfo`'s text, in bytes.
fn mem_total(meminfo: &str) -> Option<usize> {
    let kib: usize = meminfo.lines().find_map(|l| {
        l.strip_prefix("MemTotal:")?
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()
    })?;
    kib.checked_mul(1024)
}

/// The limit from the system: the process's cgroup (`cgroup_root`, the
/// text of `/proc/self/cgroup`), else `MemTotal` (the text of
/// `/proc/meminfo`).
fn system_limit(cgroup_root: &Path, self_cgroup: &str, meminfo: &str) -> Option<MemoryLimit> {
    if let Some((bytes, file)) = cgroup_limit(cgroup_root, self_cgroup) {
        return Some(MemoryLimit {
            bytes,
            source: LimitSource::Cgroup(file),
        });
    }
    Some(MemoryLimit {
        bytes: percent(mem_total(meminfo)?, MEMTOTAL_PERCENT),
        source: LimitSource::MemTotal,
    })
}

/// `share` % of `bytes`, rounded down (exact: 50 % of 4 GiB is 2 GiB,
/// whatever the order of the operations).
fn percent(bytes: usize, share: usize) -> usize {
    (bytes as u128 * share as u128 / 100) as usize
}

/// The smallest memory limit of the process's cgroup and its ancestors,
/// and the file it was read from.
fn cgroup_limit(root: &Path, self_cgroup: &str) -> Option<(usize, PathBuf)> {
    // v2: `0::/path`; v1: `N:memory:/path` (or `N:...,memory,...:/path`).
    let mut dirs = Vec::new();
    for line in self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            dirs.push((root.to_path_buf(), path, &["memory.max", "memory.high"][..]));
        } else if controllers.split(',').any(|c| c == "memory") {
            dirs.push((root.join("memory"), path, &["memory.limit_in_bytes"][..]));
        }
    }
    let mut best: Option<(usize, PathBuf)> = None;
    for (base, path, files) in dirs {
        // The group's directory and every ancestor up to the mount (a
        // container often sees only its own group, mounted as the root).
        let mut rel = PathBuf::from(path.trim_start_matches('/'));
        loop {
            for f in files {
                let file = base.join(&rel).join(f);
                if let Some(bytes) = read_limit(&file) {
                    if best.as_ref().is_none_or(|(b, _)| bytes < *b) {
                        best = Some((bytes, file));
                    }
                }
            }
            if !rel.pop() {
                break;
            }
        }
    }
    best
}

/// A cgroup limit file's value (`None`: no limit, unreadable, or 0).
fn read_limit(file: &Path) -> Option<usize> {
    tensor_arena::cgroup_limit_file(file).filter(|&l| l > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_bad_ones_are_errors() {
        assert_eq!(parse_env("1048576").unwrap(), Some(1 << 20));
        assert_eq!(parse_env("512M").unwrap(), Some(512 << 20));
        assert_eq!(parse_env(" 4GiB ").unwrap(), Some(4 << 30));
        assert_eq!(parse_env("64 kb").unwrap(), Some(64 << 10));
        assert_eq!(parse_env("off").unwrap(), None);
        for bad in [
            "",
            "lots",
            "12X",
            "0",
            "-5M",
            "-1",
            "99999999999999999999T",
            "1024T",
        ] {
            let err = parse_env(bad).unwrap_err();
            assert!(err.to_string().contains(MEMORY_LIMIT_ENV), "{bad}: {err}");
        }
        // Each says what is wrong with it.
        let zero = parse_memory_limit("0").unwrap_err().to_string();
        assert!(zero.contains("0 bytes") && zero.contains("off"), "{zero}");
        let neg = parse_memory_limit("-1").unwrap_err().to_string();
        assert!(neg.contains("negative"), "{neg}");
        let huge = parse_memory_limit("1024T").unwrap_err().to_string();
        assert!(huge.contains("machine's memory"), "{huge}");
        assert!(set_default_memory_limit(Some(usize::MAX / 2)).is_err());
    }

    fn tree(files: &[(&str, &str)]) -> PathBuf {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let root = std::env::temp_dir().join(format!(
            "tensor-arena-limit-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        for (path, text) in files {
            let p = root.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        root
    }

    const MEMINFO: &str = "MemTotal:       24684084 kB\nMemFree: 1 kB\n";

    #[test]
    fn the_smallest_cgroup_limit_up_the_tree_wins() {
        let root = tree(&[
            ("memory.max", "max\n"),
            ("app/memory.max", "8589934592\n"),
            ("app/server/memory.max", "max\n"),
            ("app/server/memory.high", "4294967296\n"),
        ]);
        let l = system_limit(&root, "0::/app/server\n", MEMINFO).unwrap();
        // The 4 GiB limit, whole: the processes' rest comes off it as
        // measured.
        assert_eq!(l.bytes, 4 << 30);
        assert_eq!(
            l.source,
            LimitSource::Cgroup(root.join("app/server/memory.high"))
        );
        // v1, and "unlimited" is no limit.
        let root = tree(&[
            ("memory/memory.limit_in_bytes", "9223372036854771712\n"),
            ("memory/grp/memory.limit_in_bytes", "1073741824\n"),
        ]);
        let l = system_limit(&root, "4:memory:/grp\n0::/\n", MEMINFO).unwrap();
        assert_eq!(l.bytes, 1 << 30);
    }

    #[test]
    fn without_a_cgroup_limit_memtotal_is_used() {
        let root = tree(&[("memory.max", "max\n")]);
        let l = system_limit(&root, "0::/\n", MEMINFO).unwrap();
        // Half of 24 684 084 KiB, in bytes.
        assert_eq!(l.bytes, 12_638_251_008);
        assert_eq!(l.source, LimitSource::MemTotal);
        assert_eq!(system_limit(&root, "garbage", "nothing"), None);
    }
}
