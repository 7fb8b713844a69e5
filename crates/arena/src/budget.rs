//! [`Budget`]: one limit on the memory many arenas commit together.
//!
//! Arenas join a budget through their memory layer
//! ([`Budgeted`](crate::memory::Budgeted)): every commit is charged to the
//! budget and every decommit or release credits it, so the budget is
//! consulted only when an arena commits or decommits, never on an
//! allocation served from memory the arena has committed already. The
//! charge is one compare-and-swap on an atomic counter: no lock.
//!
//! A commit that would take the budget over its limit first asks the
//! members ([`Reclaim`]) to give back cached memory (committed but free):
//! idle arenas (no run open) first, then busy ones down to what they use.
//! Each member is only ever tried, never waited for (a member whose lock is
//! held gives nothing), so no arena blocks on another. A budget made with
//! [`Budget::with_wait`] then waits a bounded time for busy members to
//! reach a run boundary, where they give back what they hold beyond their
//! run's need ([`Budget::pressure`]) or, idle, everything: it polls, and
//! never takes a member's lock. Only then is the commit refused: an [`ArenaError::CommitFailed`](crate::ArenaError) whose
//! code is [`ErrorCode::OverBudget`](crate::memory::ErrorCode::OverBudget).
//! Whatever is reclaimed is free memory, never a live block.
//!
//! No lock is held anywhere in a budget: the members are an atomically
//! swapped list (a registration copies it), so a process forked while
//! another thread was registering or reclaiming finds nothing held in the
//! child (a held lock there would stay held forever: its holder is a thread
//! the child does not have).

use arc_swap::ArcSwap;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use core::time::Duration;
use std::path::Path;
use std::sync::{Arc, Weak};

/// A member of a budget that can give cached memory back: a lockable arena
/// ([`SharedArena`](crate::SharedArena), or a runtime's own per-worker
/// arena behind its lock).
///
/// # Re-entry
/// `try_reclaim` runs on the thread whose commit went over the limit, in
/// the middle of that arena's call (its state is borrowed). A member
/// written by hand must therefore not call into the arena whose commit is
/// in progress, even through a [`SharedArena`](crate::SharedArena), whose
/// re-entrant lock lets the call through to an arena that is mid-call: any
/// method but [`SharedArena::try_stats`](crate::SharedArena::try_stats) /
/// [`Arena::try_stats`](crate::Arena::try_stats) panics there ("already
/// mutably borrowed"). `try_stats` answers `None` instead, and is the one
/// call such a member may make on any arena of the budget.
pub trait Reclaim: Send + Sync {
    /// Gives back cached memory without waiting: decommits committed free
    /// memory (never a live block) if the member's lock can be taken at
    /// once and, when `idle_only`, no run is open on it. Returns the bytes
    /// given back (0 when busy or when it holds no cache). See the trait's
    /// re-entry rule.
    fn try_reclaim(&self, idle_only: bool) -> usize;
}

/// The budget's counters, a snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BudgetStats {
    /// The limit in bytes.
    pub limit: usize,
    /// Bytes its members have committed now.
    pub committed: usize,
    /// The most they have had committed at once.
    pub peak_committed: usize,
    /// Bytes members gave back because another member's commit needed room.
    pub reclaimed: u64,
    /// Times a commit asked members to give memory back.
    pub reclaims: u64,
    /// Commits refused (over the limit after reclaiming).
    pub refusals: u64,
    /// Commits that waited for busy members ([`Budget::with_wait`]) and
    /// then fitted.
    pub waited: u64,
    /// Members registered for reclaim and still alive.
    pub members: usize,
}

/// One memory limit shared by any number of arenas; see the module docs.
/// Shared as `Arc<Budget>`.
pub struct Budget {
    /// The limit in bytes; adjusted by [`Budget::set_limit`] (a limit
    /// shared with other processes follows what they hold).
    limit: AtomicUsize,
    /// How long a commit over the limit waits for busy members to give
    /// memory back at their run boundaries, in nanoseconds (zero: not at
    /// all); [`Budget::set_wait`].
    wait: AtomicU64,
    waited: AtomicU64,
    committed: AtomicUsize,
    peak: AtomicUsize,
    reclaimed: AtomicU64,
    reclaims: AtomicU64,
    refusals: AtomicU64,
    /// Times memory ran short: a commit had to reclaim, or `relieve()` was
    /// called. Members that cannot give while busy read it at their next
    /// run boundary and give back what they hold for other work.
    pressure: AtomicU64,
    /// Members that can give memory back; read to reclaim (over the limit,
    /// never on a commit that fits), copied to register one. Never locked
    /// (see the module's docs on `fork()`).
    members: ArcSwap<Vec<Weak<dyn Reclaim>>>,
    /// Called before each commit is charged, for a limit that moves
    /// ([`Budget::set_refresh`]); swapped, never locked.
    refresh: ArcSwap<Option<Arc<dyn Fn() + Send + Sync>>>,
}

impl std::fmt::Debug for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budget")
            .field("stats", &self.stats())
            .field("wait", &self.wait())
            .finish_non_exhaustive()
    }
}

/// The headroom [`Budget::from_cgroup`] leaves under a cgroup's limit by
/// default: 10% of the limit, at least 64 MiB, for the rest of the process
/// (the runtime's own allocations, weights, stacks, page cache charged to
/// the group).
pub fn default_headroom(limit: usize) -> usize {
    (limit / 10).max(64 << 20)
}

impl Budget {
    /// A budget of `limit` bytes. A commit over it that reclaiming from
    /// the members cannot fit is refused at once.
    pub fn new(limit: usize) -> Arc<Self> {
        Self::with_wait(limit, Duration::ZERO)
    }

    /// A budget of `limit` bytes whose commits, when reclaiming at once
    /// cannot make room, wait up to `wait` for busy members to give memory
    /// back at their run boundaries (a worker pool's members end a run
    /// every few milliseconds to a second): it polls every half
    /// millisecond, asking the members again each time, and takes no
    /// member's lock, so two members waiting for each other only wait out
    /// the bound. Only then is the commit refused. The wait is the price
    /// of a limit that holds the pool's live need rather than the sum of
    /// its caches.
    pub fn with_wait(limit: usize, wait: Duration) -> Arc<Self> {
        Arc::new(Self {
            limit: AtomicUsize::new(limit),
            wait: AtomicU64::new(u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX)),
            waited: AtomicU64::new(0),
            committed: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            reclaimed: AtomicU64::new(0),
            reclaims: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
            pressure: AtomicU64::new(0),
            members: ArcSwap::from_pointee(Vec::new()),
            refresh: ArcSwap::from_pointee(None),
        })
    }

    /// The budget of the control group at `cgroup` (a directory: the
    /// group's own, e.g. `/sys/fs/cgroup` inside a container): its limit
    /// (`memory.max` in cgroup v2, `memory.limit_in_bytes` in v1) less
    /// `headroom(limit)` ([`default_headroom`] is 10%, at least 64 MiB).
    /// `None` when the group has no limit (`max`, or v1's huge "unlimited"
    /// value), no such file, or the limit is below the headroom.
    pub fn from_cgroup(cgroup: &Path, headroom: impl Fn(usize) -> usize) -> Option<Arc<Self>> {
        let limit = cgroup_limit(cgroup)?;
        let budget = limit.checked_sub(headroom(limit)).filter(|&b| b > 0)?;
        Some(Self::new(budget))
    }

    /// The limit in bytes.
    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    /// Sets the limit to `bytes`: for a caller whose limit moves (a limit
    /// shared with other processes, which follows what they hold). Memory
    /// committed over a lowered limit stays; only new commits must fit
    /// under it (idle members give back first, as always).
    pub fn set_limit(&self, bytes: usize) {
        self.limit.store(bytes, Ordering::Relaxed);
    }

    /// Bytes committed by the members now.
    pub fn committed(&self) -> usize {
        self.committed.load(Ordering::Relaxed)
    }

    /// Starts [`BudgetStats::peak_committed`] again from what is committed
    /// now (a tool's window, Python's `reset_peak_stats`).
    pub fn reset_peak(&self) {
        self.peak.store(self.committed(), Ordering::Relaxed);
    }

    /// Registers `member` as one that can give memory back when another
    /// member's commit needs room. Held weakly: a dropped member leaves.
    pub fn register(&self, member: Weak<dyn Reclaim>) {
        self.members.rcu(|members| {
            let mut next: Vec<Weak<dyn Reclaim>> = members
                .iter()
                .filter(|m| m.strong_count() > 0)
                .cloned()
                .collect();
            next.push(member.clone());
            next
        });
    }

    /// How many times memory has run short so far: each commit that had to
    /// reclaim from the members, and each [`Budget::relieve`]. A member
    /// that was busy then (it could give nothing at once) compares it with
    /// the value it saw last, at its next run boundary, and gives back the
    /// cache it holds beyond that run's need. Monotonic.
    pub fn pressure(&self) -> u64 {
        self.pressure.load(Ordering::Relaxed)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> BudgetStats {
        BudgetStats {
            limit: self.limit(),
            committed: self.committed(),
            peak_committed: self.peak.load(Ordering::Relaxed),
            reclaimed: self.reclaimed.load(Ordering::Relaxed),
            reclaims: self.reclaims.load(Ordering::Relaxed),
            refusals: self.refusals.load(Ordering::Relaxed),
            waited: self.waited.load(Ordering::Relaxed),
            members: self
                .members
                .load()
                .iter()
                .filter(|m| m.strong_count() > 0)
                .count(),
        }
    }

    /// Asks every idle member (no run open) to give back its cached memory
    /// now: for a caller that knows memory is short (a pressure signal).
    /// Busy members are left alone. Returns the bytes given back.
    pub fn relieve(&self) -> usize {
        self.pressure.fetch_add(1, Ordering::Relaxed);
        self.reclaim(usize::MAX, &[true])
    }

    /// How long a commit over the limit waits ([`Budget::with_wait`]).
    pub fn wait(&self) -> Duration {
        Duration::from_nanos(self.wait.load(Ordering::Relaxed))
    }

    /// Sets how long a commit over the limit waits for room from now on
    /// ([`Budget::with_wait`]): for a caller whose commits may wait for a
    /// while (a run alone, while other processes give their caches back).
    pub fn set_wait(&self, wait: Duration) {
        let ns = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
        self.wait.store(ns, Ordering::Relaxed);
    }

    /// Sets what is called before each commit is charged: for a limit
    /// that moves with what other processes hold, a caller that brings it
    /// up to date there ([`Budget::set_limit`]) when it is stale. It runs
    /// on the committing thread, in the middle of that arena's call: the
    /// [`Reclaim`] re-entry rule applies to it. `None` removes it.
    pub fn set_refresh(&self, refresh: Option<Arc<dyn Fn() + Send + Sync>>) {
        self.refresh.store(Arc::new(refresh));
    }

    /// Charges `bytes` if they fit under the limit, reclaiming from the
    /// members first if they do not. Returns whether they were charged.
    pub(crate) fn charge(&self, bytes: usize) -> bool {
        if let Some(f) = self.refresh.load().as_ref() {
            f();
        }
        if self.try_charge(bytes) {
            return true;
        }
        self.reclaims.fetch_add(1, Ordering::Relaxed);
        self.pressure.fetch_add(1, Ordering::Relaxed);
        let wait = self.wait();
        let deadline = (!wait.is_zero()).then(|| std::time::Instant::now() + wait);
        let mut polls = 0u64;
        loop {
            if polls > 0 {
                // A limit that moves with other processes may have moved
                // while this commit waited.
                if let Some(f) = self.refresh.load().as_ref() {
                    f();
                }
            }
            let need = self
                .committed()
                .saturating_add(bytes)
                .saturating_sub(self.limit());
            self.reclaim(need, &[true, false]);
            if self.try_charge(bytes) {
                if polls > 0 {
                    self.waited.fetch_add(1, Ordering::Relaxed);
                }
                return true;
            }
            match deadline {
                Some(d) if std::time::Instant::now() < d => {
                    polls += 1;
                    std::thread::sleep(Duration::from_micros(500));
                }
                _ => break,
            }
        }
        self.refusals.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// Credits `bytes` given back.
    pub(crate) fn credit(&self, bytes: usize) {
        let before = self.committed.fetch_sub(bytes, Ordering::Relaxed);
        debug_assert!(before >= bytes, "credited more than was charged");
    }

    fn try_charge(&self, bytes: usize) -> bool {
        let mut cur = self.committed.load(Ordering::Relaxed);
        let limit = self.limit();
        loop {
            let Some(new) = cur.checked_add(bytes).filter(|&n| n <= limit) else {
                return false;
            };
            match self.committed.compare_exchange_weak(
                cur,
                new,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    self.peak.fetch_max(new, Ordering::Relaxed);
                    return true;
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Asks members for `need` bytes, one pass per entry of `passes`
    /// (`true`: idle members only). Returns the bytes they gave.
    fn reclaim(&self, need: usize, passes: &[bool]) -> usize {
        // The members alive now (a snapshot: a member's reclaim may
        // register another meanwhile).
        let members: Vec<Arc<dyn Reclaim>> = self
            .members
            .load()
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        let mut got = 0usize;
        for &idle_only in passes {
            for m in &members {
                if got >= need {
                    break;
                }
                got = got.saturating_add(m.try_reclaim(idle_only));
            }
        }
        self.reclaimed.fetch_add(got as u64, Ordering::Relaxed);
        got
    }
}

/// The memory limit of the cgroup at `dir`, if it has one.
fn cgroup_limit(dir: &Path) -> Option<usize> {
    // v2's file where there is one, else v1's.
    let v2 = dir.join("memory.max");
    if v2.exists() {
        cgroup_limit_file(&v2)
    } else {
        cgroup_limit_file(&dir.join("memory.limit_in_bytes"))
    }
}

/// The bytes a cgroup memory limit file (`memory.max`, `memory.high`,
/// v1's `memory.limit_in_bytes`) sets: `None` where it sets no limit
/// (`max`, or v1's page-rounded `i64::MAX`) or cannot be read.
pub fn cgroup_limit_file(file: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(file).ok()?;
    let text = text.trim();
    if text == "max" {
        return None;
    }
    let limit: u64 = text.parse().ok()?;
    // cgroup v1 writes "unlimited" as a page-rounded i64::MAX.
    if limit >= (i64::MAX as u64) & !0xfff {
        return None;
    }
    usize::try_from(limit).ok()
}
