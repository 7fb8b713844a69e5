//! The default limit on the memory the process's workers commit: one
//! [`Budget`] shared by every worker made without a budget of its own, so
//! that a request too large for the machine fails alone, with an
//! out-of-memory error, instead of the kernel's OOM killer taking the
//! server.
//!
//! | where the limit comes from (first that applies) | limit |
//! |---|---|
//! | [`set_default_memory_limit`], called before the first worker | what it says (`None`: no limit) |
//! | `TENSOR_ARENA_MEMORY_LIMIT` in the environment | bytes (`512M`, `4GiB`, `1073741824`), or `off` |
//! | the process's cgroup: `memory.max`, `memory.high` (v2), `memory.limit_in_bytes` (v1), the smallest up the hierarchy | [`CGROUP_PERCENT`] % of it |
//! | `MemTotal` in `/proc/meminfo` | [`MEMTOTAL_PERCENT`] % of it |
//!
//! Why those fractions: in a container the limit is the server's own, and
//! what the arenas do not hold is the rest of the process (weights, ONNX
//! Runtime's own allocations, the input tensors, stacks) and page cache
//! charged to the group: a quarter is left to those. Without a group,
//! `MemTotal` is the whole machine, shared with other processes and the
//! kernel: half. Either way the limit only refuses a commit that would
//! pass it; idle workers first give their cache back (the budget asks
//! them), so a busy server keeps its memory and only a request that cannot
//! fit fails. It applies to memory this crate owns (every worker's arena),
//! not to the rest of the process.
//!
//! The limit is read once, when the first worker without a budget of its
//! own is made; a worker given [`WorkerOptions::budget`](crate::WorkerOptions::budget)
//! uses that budget instead.

use crate::forklock::{hold, ForkMutex};
use crate::OrtArenaError;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tensor_arena::Budget;

/// The environment variable that sets the default limit: bytes, with an
/// optional suffix `K`, `M`, `G`, `T` (or `KiB`... : powers of 1024), or
/// `off` for none.
pub const MEMORY_LIMIT_ENV: &str = "TENSOR_ARENA_MEMORY_LIMIT";
/// The share of the process's cgroup limit the default limit takes, in
/// percent (see the module docs for why).
pub const CGROUP_PERCENT: usize = 75;
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
    /// [`CGROUP_PERCENT`] % of this control group file's limit.
    Cgroup(PathBuf),
    /// [`MEMTOTAL_PERCENT`] % of `MemTotal`.
    MemTotal,
}

/// The default limit of the process's workers' memory, and its source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryLimit {
    /// Bytes all workers without a budget of their own may commit together.
    pub bytes: usize,
    /// Where the number came from.
    pub source: LimitSource,
}

/// What the process's default is: not chosen yet, chosen (a limit or
/// none), or made (the shared budget, if any).
enum Default {
    Unchosen,
    Chosen(Option<MemoryLimit>),
    Made(Option<(MemoryLimit, Arc<Budget>)>),
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
/// was made already (the limit in force then stays), or if `bytes` is 0.
pub fn set_default_memory_limit(bytes: Option<usize>) -> Result<(), OrtArenaError> {
    if bytes == Some(0) {
        return Err(OrtArenaError::MemoryLimit(
            "a limit of 0 bytes; use None for no limit".into(),
        ));
    }
    let mut d = DEFAULT.lock();
    if let Default::Made(_) = *d {
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
        Default::Made(m) => Ok(m.as_ref().map(|(l, _)| l.clone())),
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
    let mut d = DEFAULT.lock();
    let limit = match &*d {
        Default::Made(m) => return Ok(m.as_ref().map(|(_, b)| Arc::clone(b))),
        Default::Chosen(l) => l.clone(),
        Default::Unchosen => from_environment_or_system()?,
    };
    let made = limit.map(|l| {
        let b = Budget::new(l.bytes);
        (l, b)
    });
    let budget = made.as_ref().map(|(_, b)| Arc::clone(b));
    *d = Default::Made(made);
    Ok(budget)
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
    let v = value.trim();
    if v.eq_ignore_ascii_case("off") || v.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    let bad = || {
        OrtArenaError::MemoryLimit(format!(
            "{MEMORY_LIMIT_ENV}={value:?}: not a size (bytes, or with K, M, G, T; or off)"
        ))
    };
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
    if bytes == 0 {
        return Err(bad());
    }
    Ok(Some(bytes))
}

/// The limit from the system: the process's cgroup (`cgroup_root`, the
/// text of `/proc/self/cgroup`), else `MemTotal` (the text of
/// `/proc/meminfo`).
fn system_limit(cgroup_root: &Path, self_cgroup: &str, meminfo: &str) -> Option<MemoryLimit> {
    if let Some((bytes, file)) = cgroup_limit(cgroup_root, self_cgroup) {
        return Some(MemoryLimit {
            bytes: percent(bytes, CGROUP_PERCENT),
            source: LimitSource::Cgroup(file),
        });
    }
    let kib: usize = meminfo.lines().find_map(|l| {
        l.strip_prefix("MemTotal:")?
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()
    })?;
    Some(MemoryLimit {
        bytes: percent(kib.checked_mul(1024)?, MEMTOTAL_PERCENT),
        source: LimitSource::MemTotal,
    })
}

/// `share` % of `bytes`, rounded down (exact: 75 % of 4 GiB is 3 GiB, not
/// the 3 GiB less 72 bytes that dividing first gives).
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
        for bad in ["", "lots", "12X", "0", "-5M", "99999999999999999999T"] {
            let err = parse_env(bad).unwrap_err();
            assert!(err.to_string().contains(MEMORY_LIMIT_ENV), "{bad}: {err}");
        }
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
        // Three quarters of the 4 GiB limit, in bytes.
        assert_eq!(l.bytes, 3 << 30);
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
        assert_eq!(l.bytes, 768 << 20);
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
