//! Admission: a run starts when what it will need fits in what the memory
//! limit has not promised to the runs in flight.
//!
//! | a run's need | where it comes from |
//! |---|---|
//! | its key's plan, exact or predicted | the plan's block |
//! | no plan, the model has run before | the largest run of the model seen so far |
//! | the model's first run | unknown: it runs alone (no other run of the process beside it) |
//! | a retry after running out of memory | what the failed run reached plus the request refused, alone |
//!
//! | rule | why |
//! |---|---|
//! | first come, first served | a waiting run is never overtaken by one that came later... |
//! | ...except that a run that fits now may pass the head of the queue when the head does not fit, at most [`MAX_PASSES`] times per head | small runs use the room a large one leaves; the head waits for at most that many passes and the runs in flight |
//! | a run that needs more than the limit could ever give it is refused at once | it cannot fit alone; waiting would not help ([`OrtArenaError::OutOfMemory`] names its need and the limit) |
//! | a run alone waits for the runs in flight to end, and nothing passes it or starts beside it | a retry after running out of memory must not run out again because of its neighbours |
//!
//! The number of workers bounds how many runs are in flight; within that,
//! memory decides: more small runs at once than large ones. Where the
//! limit is the container's (the ledger (`ledger.rs`)), the room is the limit
//! less what the other processes hold and the rest of every process, read
//! at most every [`REFRESH`] (a waiting run reads it again each time).

use crate::ledger::{Ledger, Others, Share};
use crate::OrtArenaError;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tensor_arena::Budget;

/// How many later runs may pass the head of the queue (each fitting when
/// the head does not) before nothing passes it.
pub const MAX_PASSES: u32 = 8;
/// How stale the room a shared limit leaves may be when a run is admitted
/// without waiting.
pub const REFRESH: Duration = Duration::from_millis(20);
/// How long the head of the queue waits before this process's idle
/// workers give their cache back for it (and again after as long).
const RELIEVE_AFTER: Duration = Duration::from_millis(500);
/// How often a waiting run looks at the room again without being woken
/// (other processes do not wake it).
const POLL: Duration = Duration::from_millis(10);

/// Where the room comes from.
pub(crate) enum Room {
    /// No limit: every run is admitted at once (and counted).
    Unlimited,
    /// A budget of this process alone: its limit.
    Budget(Arc<Budget>),
    /// A limit shared by the processes of a container through a ledger.
    Shared(Shared),
}

/// A limit shared through a [`Ledger`].
pub(crate) struct Shared {
    /// The process's budget: its limit is set to this process's room.
    pub(crate) budget: Arc<Budget>,
    pub(crate) ledger: Ledger,
    /// The container's limit in bytes.
    pub(crate) limit: usize,
    /// Whether the limit is the container's whole memory (the rest of
    /// every process and [`Shared::margin`] come off it), or one the
    /// program set for the arenas alone.
    pub(crate) whole: bool,
    /// What is kept free under a whole limit: the kernel's own memory
    /// charged to the group, and what processes allocate between samples.
    pub(crate) margin: usize,
    /// The group's usage files, for a whole limit: what the group holds
    /// (`memory.current`, v1's `memory.usage_in_bytes`) and its
    /// `memory.stat` (page cache the kernel can drop: `inactive_file`).
    /// `None`: the processes' own figures are summed instead.
    pub(crate) usage: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// How long a sample of the group's rest counts: the rest a service's
/// requests hold outside the arenas (decoded images, preprocessing) comes
/// and goes with them, and the room follows its recent peak, not a dip.
pub const REST_WINDOW: Duration = Duration::from_secs(10);

/// Adds `now` to the samples and returns the group's rest now, its most
/// and its least within [`REST_WINDOW`].
fn recent(seen: &mut VecDeque<(Instant, usize)>, now: usize) -> GroupRest {
    let t = Instant::now();
    while seen
        .front()
        .is_some_and(|(at, _)| t.duration_since(*at) > REST_WINDOW)
    {
        seen.pop_front();
    }
    // Samples at most every REFRESH: a few hundred at most.
    seen.push_back((t, now));
    let values = seen.iter().map(|(_, v)| *v);
    GroupRest {
        now,
        peak: values.clone().max().unwrap_or(now),
        floor: values.min().unwrap_or(now),
    }
}

/// The rest of a group (all it holds but the arenas), as sampled.
#[derive(Clone, Copy, Debug)]
struct GroupRest {
    now: usize,
    /// The most over [`REST_WINDOW`]: what runs beside others are
    /// admitted against (the rest comes and goes with requests).
    peak: usize,
    /// The least over [`REST_WINDOW`]: what a run alone could have once
    /// the other requests' buffers are gone; a run that needs more than
    /// that is refused at once.
    floor: usize,
}

/// Which figure of the group's rest a room is taken with.
#[derive(Clone, Copy)]
enum RestBy {
    Peak,
    Now,
    Floor,
}

/// How long a run alone waits for its room before it fails.
pub const ALONE_WAIT: Duration = Duration::from_secs(30);

/// What a group holds that the kernel cannot simply drop: its usage less
/// its page cache, from its usage file and `memory.stat`. The margin
/// ([`crate::margin`]) covers the cache a service cannot do without (the
/// code it runs).
fn working_set(usage: &std::path::Path, stat: &std::path::Path) -> Option<usize> {
    let used: usize = std::fs::read_to_string(usage).ok()?.trim().parse().ok()?;
    let stat = std::fs::read_to_string(stat).unwrap_or_default();
    let field = |name: &str| {
        stat.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == name).then(|| v.trim().parse::<usize>().ok())?
        })
    };
    // Page cache the kernel reclaims before it kills (active or not; tmpfs
    // and shared memory are on the anonymous lists, not here): v1's
    // hierarchical figures where there are some, else the group's own.
    let file = |name: &str| field(&format!("total_{name}")).or_else(|| field(name));
    let cache = file("inactive_file")
        .unwrap_or(0)
        .saturating_add(file("active_file").unwrap_or(0));
    Some(used.saturating_sub(cache))
}

/// The admission counters of a pool (or of the process's default limit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdmissionStats {
    /// Bytes the runs may be promised together now (the limit less what
    /// other processes and the rest of the process hold); `usize::MAX`
    /// without a limit.
    pub room: usize,
    /// Bytes promised to the runs in flight now.
    pub promised: usize,
    /// The most promised at once.
    pub promised_peak: usize,
    /// Runs in flight.
    pub running: usize,
    /// The most runs in flight at once.
    pub running_peak: usize,
    /// Runs waiting to be admitted now.
    pub queued: usize,
    /// Runs admitted so far.
    pub admitted: u64,
    /// Of those, runs that waited.
    pub waited: u64,
    /// Of those, runs that passed the head of the queue.
    pub passed: u64,
    /// Total time runs waited.
    pub wait_total: Duration,
    /// The longest wait.
    pub wait_max: Duration,
    /// Runs that ran out of memory and were run again, alone.
    pub retried_alone: u64,
    /// Runs refused at once: they need more than the limit can give.
    pub refused: u64,
    /// Processes sharing the limit (this one included; 1 when not shared).
    pub processes: usize,
}

struct Waiter {
    id: u64,
    need: usize,
    alone: bool,
    passed: u32,
}

#[derive(Default)]
struct State {
    promised: usize,
    running: usize,
    /// A run admitted alone is in flight.
    alone_running: bool,
    queue: VecDeque<Waiter>,
    next_id: u64,
    /// The room, and when it was read (shared limits).
    room: Option<(usize, Instant)>,
    /// The other processes, as last read.
    others: Others,
    /// The rest of this process (its anonymous memory outside arenas).
    rest: usize,
    /// The rest of the whole group (all it holds but the arenas), where
    /// its usage can be read: the most seen over [`REST_WINDOW`].
    group_rest: Option<GroupRest>,
    /// The group's rest as sampled over the last [`REST_WINDOW`].
    rest_seen: VecDeque<(Instant, usize)>,
    stats: AdmissionStats,
}

/// The admission of one limit's runs (see the module docs). Shared as
/// `Arc<Admission>` by the workers of a pool, or by every pool of the
/// process's default limit.
pub struct Admission {
    room: Room,
    state: Mutex<State>,
    /// Waiting runs wait here (the standard library's: nothing is left
    /// behind in a forked child).
    turn: Condvar,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("stats", &self.stats())
            .finish()
    }
}

/// An admitted run: its promise is given back when dropped.
pub(crate) struct Ticket {
    admission: Arc<Admission>,
    need: usize,
    alone: bool,
}

impl Ticket {
    /// The admission it came from.
    pub(crate) fn admission(&self) -> &Arc<Admission> {
        &self.admission
    }

    /// Bytes the run was admitted for.
    pub(crate) fn need(&self) -> usize {
        self.need
    }

    /// Whether the run was admitted alone.
    pub(crate) fn alone(&self) -> bool {
        self.alone
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut st = self.admission.lock();
        st.promised -= self.need;
        st.running -= 1;
        if self.alone {
            st.alone_running = false;
        }
        self.admission.publish(&st);
        // Only runs waiting in this process are woken (a wake is a
        // system call on every run's end otherwise; other processes poll).
        let waiting = !st.queue.is_empty();
        drop(st);
        if waiting {
            self.admission.turn.notify_all();
        }
    }
}

impl Admission {
    pub(crate) fn new(room: Room) -> Arc<Self> {
        Arc::new(Self {
            room,
            state: Mutex::new(State::default()),
            turn: Condvar::new(),
        })
    }

    /// No limit.
    pub fn unlimited() -> Arc<Self> {
        Self::new(Room::Unlimited)
    }

    /// The admission of `budget`'s limit, for this process alone.
    pub fn of_budget(budget: Arc<Budget>) -> Arc<Self> {
        Self::new(Room::Budget(budget))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The budget whose limit this admission follows, if any.
    pub(crate) fn budget(&self) -> Option<&Arc<Budget>> {
        match &self.room {
            Room::Unlimited => None,
            Room::Budget(b) => Some(b),
            Room::Shared(s) => Some(&s.budget),
        }
    }

    /// The counters.
    pub fn stats(&self) -> AdmissionStats {
        let st = self.lock();
        let mut s = st.stats;
        s.room = match &self.room {
            Room::Unlimited => usize::MAX,
            Room::Budget(b) => b.limit(),
            Room::Shared(_) => st.room.map_or(0, |r| r.0),
        };
        s.promised = st.promised;
        s.running = st.running;
        s.queued = st.queue.len();
        s.processes = 1 + st.others.processes;
        s
    }

    /// The most a run alone could be given: the limit, less (for a
    /// container's whole limit) the margin and the rest of the processes.
    fn most(&self, st: &State) -> usize {
        match &self.room {
            Room::Unlimited => usize::MAX,
            Room::Budget(b) => b.limit(),
            Room::Shared(s) => base(s, st, RestBy::Floor),
        }
    }

    /// The room of a run alone: as [`Admission::room`], with the group's
    /// rest as it is now (the other runs are held back while it waits).
    fn room_alone(&self, st: &mut State, fresh: bool) -> usize {
        let room = self.room(st, fresh);
        match &self.room {
            Room::Shared(s) => {
                let held = usize::try_from(st.others.held).unwrap_or(usize::MAX);
                base(s, st, RestBy::Now).saturating_sub(held).max(room)
            }
            _ => room,
        }
    }

    /// The room for this process's runs together, read again if stale
    /// (or `fresh`).
    fn room(&self, st: &mut State, fresh: bool) -> usize {
        let s = match &self.room {
            Room::Unlimited => return usize::MAX,
            Room::Budget(b) => return b.limit(),
            Room::Shared(s) => s,
        };
        if let Some((r, at)) = st.room {
            if !fresh && at.elapsed() < REFRESH {
                return r;
            }
        }
        let committed = s.budget.committed();
        st.rest = crate::ledger::anon_resident()
            .and_then(|a| usize::try_from(a).ok())
            .map_or(0, |a| a.saturating_sub(committed));
        st.others = s.ledger.others(false);
        // Under a whole limit with the group's own figures: the rest is
        // everything the group holds but the arenas (processes that are
        // not ours, the kernel's memory, page cache in use).
        st.group_rest = s
            .usage
            .as_ref()
            .filter(|_| s.whole)
            .and_then(|(u, stat)| working_set(u, stat))
            .map(|ws| {
                let arenas = usize::try_from(st.others.committed)
                    .unwrap_or(usize::MAX)
                    .saturating_add(committed);
                ws.saturating_sub(arenas)
            })
            .map(|now| recent(&mut st.rest_seen, now));
        let held = usize::try_from(st.others.held).unwrap_or(usize::MAX);
        let room = base(s, st, RestBy::Peak).saturating_sub(held);
        // This process's commits must fit in its room too (idle workers
        // give back first; a commit that still does not fit is refused).
        s.budget.set_limit(room);
        if committed > room {
            // The rest of the group grew into what the arenas hold: idle
            // workers give their cache back now, not at their next commit.
            s.budget.relieve();
        }
        st.room = Some((room, Instant::now()));
        self.publish(st);
        room
    }

    /// Publishes this process's share to the ledger, if shared.
    fn publish(&self, st: &State) {
        if let Room::Shared(s) = &self.room {
            s.ledger.publish(Share {
                promised: st.promised as u64,
                committed: s.budget.committed() as u64,
                rest: st.rest as u64,
                // Only a run alone at the head of the queue (or running)
                // holds the other processes' new runs back: one further
                // back waits behind this process's own head, and two
                // processes whose heads waited for each other's flags
                // would wait for ever.
                alone: st.alone_running || st.queue.front().is_some_and(|w| w.alone),
            });
        }
    }

    /// Brings a shared limit's room up to date before a commit, if it is
    /// stale ([`REFRESH`]); never waits for the admission's lock (a
    /// commit made while another thread holds it goes on with the room
    /// as it is).
    fn refresh_for_commit(&self) {
        if let Room::Shared(_) = &self.room {
            if let Ok(mut st) = self.state.try_lock() {
                self.room(&mut st, false);
            }
        }
    }

    /// Makes the budget of a shared limit bring its room up to date before
    /// each commit, so that a long run's commits follow what the rest of
    /// the group holds, not what it held at the run's admission.
    pub(crate) fn follow_commits(self: &Arc<Self>) {
        if let Room::Shared(s) = &self.room {
            let me = Arc::downgrade(self);
            s.budget.set_refresh(Some(Arc::new(move || {
                if let Some(a) = me.upgrade() {
                    a.refresh_for_commit();
                }
            })));
        }
    }

    /// Publishes what this process holds now (after idle workers gave
    /// memory back, say), so that other processes see it.
    pub(crate) fn republish(&self) {
        if let Room::Shared(_) = &self.room {
            let mut st = self.lock();
            self.room(&mut st, true);
        }
    }

    /// Whether a run of `need` fits now.
    fn fits(&self, st: &mut State, need: usize, alone: bool, fresh: bool) -> bool {
        if st.alone_running {
            return false;
        }
        if alone {
            // Nothing of this process runs, nothing of the others is in
            // flight, and no other process waiting alone goes first (the
            // lowest PID does).
            let room = self.room_alone(st, fresh);
            let first = st.others.alone_pid.is_none_or(|p| p > std::process::id());
            return st.running == 0 && st.others.promised == 0 && first && need <= room;
        }
        let room = self.room(st, fresh);
        !st.others.alone && st.promised.saturating_add(need) <= room
    }

    /// Admits a run of `need` bytes (`alone`: with no other run beside
    /// it), waiting its turn.
    ///
    /// # Errors
    /// [`OrtArenaError::OutOfMemory`] at once when `need` is more than the
    /// limit could ever give one run.
    pub(crate) fn admit(
        self: &Arc<Self>,
        need: usize,
        alone: bool,
    ) -> Result<Ticket, OrtArenaError> {
        // Without a limit nothing runs out: no run needs to be alone.
        let alone = alone && !matches!(self.room, Room::Unlimited);
        let mut st = self.lock();
        let most = {
            // The room as read at most `REFRESH` ago: reading the group's
            // figures costs system calls, which a run admitted at once
            // does not pay more than every `REFRESH`.
            self.room(&mut st, false);
            self.most(&st)
        };
        if need > most {
            st.stats.refused += 1;
            return Err(OrtArenaError::OutOfMemory(format!(
                "the run needs {need} bytes; the memory limit leaves a run at most {most} \
                 bytes (the limit less what the rest of the processes holds)"
            )));
        }
        // A run alone reads the other processes' figures afresh: one of
        // theirs admitted within the last `REFRESH` is in flight.
        if st.queue.is_empty() && self.fits(&mut st, need, alone, alone) {
            return Ok(self.admitted(st, need, alone, None));
        }
        st.next_id += 1;
        let id = st.next_id;
        st.queue.push_back(Waiter {
            id,
            need,
            alone,
            passed: 0,
        });
        self.publish(&st);
        let since = Instant::now();
        let mut relieved = since;
        loop {
            st = self
                .turn
                .wait_timeout(st, POLL)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            let at = st.queue.iter().position(|w| w.id == id).expect("queued");
            if alone && since.elapsed() >= ALONE_WAIT {
                st.queue.remove(at);
                st.stats.refused += 1;
                self.publish(&st);
                drop(st);
                self.turn.notify_all();
                return Err(OrtArenaError::OutOfMemory(format!(
                    "the run needs {need} bytes alone and waited {} s without the room for it \
                     (the rest of the processes holds the limit)",
                    ALONE_WAIT.as_secs()
                )));
            }
            if at == 0 && relieved.elapsed() >= RELIEVE_AFTER {
                // The head has waited a while: this process's idle workers
                // give their cache back (and the ledger hears of it), so
                // that a run of another process waiting for that room,
                // alone or not, is not left to idle decay (which may be
                // off).
                relieved = Instant::now();
                drop(st);
                if let Some(b) = self.budget() {
                    b.relieve();
                }
                st = self.lock();
                self.room(&mut st, true);
                continue;
            }
            let go = if at == 0 {
                self.fits(&mut st, need, alone, true)
            } else {
                let head = &st.queue[0];
                let may_pass = !alone && !head.alone && head.passed < MAX_PASSES;
                let head_need = (head.need, head.alone);
                may_pass
                    && self.fits(&mut st, need, false, true)
                    && !self.fits(&mut st, head_need.0, head_need.1, false)
            };
            if go {
                if at != 0 {
                    st.queue[0].passed += 1;
                    st.stats.passed += 1;
                }
                st.queue.remove(at);
                let ticket = self.admitted(st, need, alone, Some(since.elapsed()));
                // The next in line looks again.
                self.turn.notify_all();
                return Ok(ticket);
            }
        }
    }

    fn admitted(
        self: &Arc<Self>,
        mut st: MutexGuard<'_, State>,
        need: usize,
        alone: bool,
        waited: Option<Duration>,
    ) -> Ticket {
        // A run alone is promised what it asked for, not all the room:
        // the ledger's flag already holds the other processes' new runs
        // back, and a run of theirs that was admitted in the same instant
        // keeps the room it was promised (its commits are measured against
        // what this process holds and was promised; promising all the room
        // here refused them, and a model's first run asks for nothing).
        // Saturating (a reservation under no limit may ask for anything):
        // the ticket gives back what was added.
        let need = need.min(usize::MAX - st.promised);
        st.promised += need;
        st.running += 1;
        st.alone_running |= alone;
        let (promised, running) = (st.promised, st.running);
        let s = &mut st.stats;
        s.admitted += 1;
        s.promised_peak = s.promised_peak.max(promised);
        s.running_peak = s.running_peak.max(running);
        if let Some(w) = waited {
            s.waited += 1;
            s.wait_total += w;
            s.wait_max = s.wait_max.max(w);
        }
        self.publish(&st);
        Ticket {
            admission: Arc::clone(self),
            need,
            alone,
        }
    }

    /// Bytes promised to the runs in flight now.
    pub(crate) fn promised_now(&self) -> usize {
        self.lock().promised
    }

    /// Whether the limit is shared with other processes (a ledger).
    pub(crate) fn is_shared(&self) -> bool {
        matches!(self.room, Room::Shared(_))
    }

    /// Counts a run retried alone.
    pub(crate) fn count_retry(&self) {
        self.lock().stats.retried_alone += 1;
    }

    /// The most a run alone could be given now (for an error's message).
    pub(crate) fn most_now(&self) -> usize {
        let mut st = self.lock();
        self.room(&mut st, true);
        self.most(&st)
    }

    /// This admission as a forked child has it: the same limit, no run in
    /// flight, nobody waiting (those were the parent's threads), and a slot
    /// of its own in the ledger.
    pub(crate) fn after_fork(&self) -> Arc<Self> {
        let room = match &self.room {
            Room::Unlimited => Room::Unlimited,
            Room::Budget(b) => Room::Budget(Arc::clone(b)),
            Room::Shared(s) => match Ledger::open(
                s.ledger
                    .path()
                    .parent()
                    .unwrap_or(std::path::Path::new("/")),
                s.ledger
                    .path()
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.rsplit('-').next())
                    .unwrap_or("x"),
            ) {
                Ok(ledger) => Room::Shared(Shared {
                    budget: Arc::clone(&s.budget),
                    ledger,
                    limit: s.limit,
                    whole: s.whole,
                    margin: s.margin,
                    usage: s.usage.clone(),
                }),
                Err(_) => Room::Budget(Arc::clone(&s.budget)),
            },
        };
        Self::new(room)
    }
}

/// What a shared limit leaves this process's runs before the other
/// processes' arenas: the limit, less (for a whole limit) the margin and
/// the rest of the group taken `by` one of its figures.
fn base(s: &Shared, st: &State, by: RestBy) -> usize {
    if !s.whole {
        return s.limit;
    }
    let others_rest = usize::try_from(st.others.rest).unwrap_or(usize::MAX);
    let measured = match (st.group_rest, by) {
        (Some(g), RestBy::Peak) => g.peak,
        (Some(g), RestBy::Now) => g.now,
        (Some(g), RestBy::Floor) => g.floor,
        (None, _) => st.rest.saturating_add(others_rest),
    };
    s.limit.saturating_sub(s.margin).saturating_sub(measured)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    #[test]
    fn a_groups_working_set_is_its_usage_less_inactive_page_cache() {
        let d = tempfile::tempdir().unwrap();
        let (usage, stat) = (
            d.path().join("memory.current"),
            d.path().join("memory.stat"),
        );
        std::fs::write(&usage, "1000000\n").unwrap();
        std::fs::write(&stat, "anon 5\ninactive_file 300000\nactive_file 7\n").unwrap();
        assert_eq!(working_set(&usage, &stat), Some(699_993));
        // v1: the hierarchical figures win.
        std::fs::write(
            &stat,
            "inactive_file 1\nactive_file 2\ntotal_inactive_file 400000\ntotal_active_file 100000\n",
        )
        .unwrap();
        assert_eq!(working_set(&usage, &stat), Some(500_000));
        assert_eq!(working_set(&d.path().join("none"), &stat), None);
    }

    #[test]
    fn runs_are_admitted_by_bytes_not_by_count() {
        let a = Admission::of_budget(Budget::new(100));
        let t1 = a.admit(40, false).unwrap();
        let t2 = a.admit(40, false).unwrap();
        assert_eq!(a.stats().promised, 80);
        // 30 more does not fit: it waits until one ends.
        let a2 = Arc::clone(&a);
        let started = Arc::new(AtomicUsize::new(0));
        let s2 = Arc::clone(&started);
        let h = std::thread::spawn(move || {
            let t = a2.admit(30, false).unwrap();
            s2.store(1, SeqCst);
            drop(t);
        });
        while a.stats().queued == 0 {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(started.load(SeqCst), 0, "admitted over the limit");
        drop(t1);
        h.join().unwrap();
        assert_eq!(started.load(SeqCst), 1);
        drop(t2);
        let s = a.stats();
        assert_eq!((s.promised, s.running, s.admitted, s.waited), (0, 0, 3, 1));
        assert_eq!(s.promised_peak, 80);
    }

    #[test]
    fn a_run_larger_than_the_limit_is_refused_at_once() {
        let a = Admission::of_budget(Budget::new(100));
        let t = Instant::now();
        let err = a.admit(101, false).err().expect("refused");
        assert!(t.elapsed() < Duration::from_millis(100));
        let msg = err.to_string();
        assert!(msg.contains("101") && msg.contains("100"), "{msg}");
        assert!(matches!(err, OrtArenaError::OutOfMemory(_)));
        assert_eq!(a.stats().refused, 1);
    }

    #[test]
    fn a_small_run_passes_a_large_head_a_bounded_number_of_times() {
        let a = Admission::of_budget(Budget::new(100));
        let big_in_flight = a.admit(60, false).unwrap();
        // The head needs 50: it waits for the 60.
        let a2 = Arc::clone(&a);
        let head = std::thread::spawn(move || drop(a2.admit(50, false).unwrap()));
        while a.stats().queued == 0 {
            std::thread::yield_now();
        }
        // Small runs of 10 fit beside the 60: they pass, up to MAX_PASSES.
        let mut smalls = Vec::new();
        for _ in 0..MAX_PASSES {
            smalls.push(a.admit(4, false).unwrap());
        }
        assert_eq!(a.stats().passed, u64::from(MAX_PASSES));
        // The next one may not pass any more, though it fits: it waits.
        let a3 = Arc::clone(&a);
        let late = Arc::new(AtomicUsize::new(0));
        let l2 = Arc::clone(&late);
        let after = std::thread::spawn(move || {
            let t = a3.admit(4, false).unwrap();
            l2.store(1, SeqCst);
            drop(t);
        });
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(late.load(SeqCst), 0, "the head was starved");
        drop(smalls);
        drop(big_in_flight);
        head.join().unwrap();
        after.join().unwrap();
        assert_eq!(late.load(SeqCst), 1);
    }

    #[test]
    fn a_run_alone_waits_for_the_runs_in_flight_and_nothing_starts_beside_it() {
        let a = Admission::of_budget(Budget::new(100));
        let t1 = a.admit(10, false).unwrap();
        let a2 = Arc::clone(&a);
        let alone_in = Arc::new(AtomicUsize::new(0));
        let flag = Arc::clone(&alone_in);
        let h = std::thread::spawn(move || {
            let t = a2.admit(30, true).unwrap();
            flag.store(1, SeqCst);
            std::thread::sleep(Duration::from_millis(30));
            flag.store(2, SeqCst);
            drop(t);
        });
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(alone_in.load(SeqCst), 0, "alone beside a run");
        drop(t1);
        while alone_in.load(SeqCst) == 0 {
            std::thread::yield_now();
        }
        // While it runs, a small run waits.
        let t = a.admit(1, false).unwrap();
        assert_eq!(alone_in.load(SeqCst), 2, "a run started beside one alone");
        drop(t);
        h.join().unwrap();
    }
}
