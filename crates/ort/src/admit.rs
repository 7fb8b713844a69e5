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
//! | runs alone of several processes go in the order they came, one at a time | a process's first runs wait behind the others' as long as they came later, no longer |
//! | a waiting run that could no longer fit even alone fails with `OutOfMemory` | the rest of the processes grew; waiting would not help |
//! | a run takes over the reservation for a run its thread holds when that covers it, without waiting again | the request's buffers and its run were admitted together (`reserve.rs`) |
//!
//! The number of workers bounds how many runs are in flight; within that,
//! memory decides: more small runs at once than large ones. Where the
//! limit is the container's (the ledger (`ledger.rs`)), the room is the limit
//! less what the other processes hold and the rest of every process, read
//! at most every [`REFRESH`] (a waiting run reads it again each time).

use crate::ledger::{Ledger, Share};
use crate::room::{Reading, RestBy};
pub(crate) use crate::room::{Room, Shared};
use crate::OrtArenaError;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
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
/// How long a run alone waits for its room before it fails: long enough
/// for the first runs of every worker process of a container to go one at
/// a time (four processes' three models on a loaded machine passed 30 s).
pub const ALONE_WAIT: Duration = Duration::from_secs(120);
/// How long a commit of a run alone under a shared limit waits for room
/// (the other processes' idle caches) before it is refused.
const ALONE_COMMIT_WAIT: Duration = Duration::from_secs(2);
/// The bit of [`Fast::gate`] a run alone in flight sets.
const ALONE: usize = 1 << (usize::BITS - 1);

pub use crate::admit_stats::AdmissionStats;

struct Waiter {
    id: u64,
    /// When it came ([`crate::ledger::monotonic_ns`]): runs alone of two
    /// processes go in this order.
    since: u64,
    need: usize,
    alone: bool,
    passed: u32,
}

/// What only the queue's side changes, under the lock.
#[derive(Default)]
struct State {
    queue: VecDeque<Waiter>,
    next_id: u64,
    /// The shared limit's figures, as last read.
    reading: Reading,
    /// The counters only waiting runs move.
    stats: AdmissionStats,
}

/// What a run admitted without waiting reads and moves: atomics, so that
/// the runs of many threads are admitted without taking a lock (a lock
/// every thread takes twice a run made 16 threads wait on each other's
/// wake-ups).
///
/// A run is admitted without the lock only while [`Fast::gate`] is 0: no
/// run waits and none runs alone. A run that counts itself in
/// [`Fast::running`] and then sees the gate closed counts itself out and
/// goes to the queue; a run alone counts itself in the gate (it queues)
/// before it reads `running`. Both are sequentially consistent, so one of
/// the two sees the other.
#[derive(Default)]
struct Fast {
    promised: AtomicUsize,
    running: AtomicUsize,
    /// Runs waiting (the queue's length), plus [`ALONE`] while a run alone
    /// is in flight.
    gate: AtomicUsize,
    admitted: AtomicU64,
    promised_peak: AtomicUsize,
    running_peak: AtomicUsize,
    /// The largest need of a run admitted beside others (what a
    /// reservation for a run adds: [`Admission::reserve_for_run`]).
    largest: AtomicUsize,
    /// A shared limit's room as last read, and when ([`Admission::epoch`]
    /// plus this many nanoseconds; 0: never, or another process waits to
    /// run alone).
    room: AtomicUsize,
    room_at: AtomicU64,
    /// The rest of this process, as last read (published with its share).
    rest: AtomicUsize,
    /// Since when the run at the head of the queue waits to run alone (0:
    /// it does not).
    head_alone: AtomicU64,
}

impl Fast {
    /// Promises `need` if it fits in `room` with what is promised; returns
    /// what was added (`need`, or less under no limit, where promises
    /// saturate).
    fn promise(&self, need: usize, room: usize) -> Option<usize> {
        let mut now = self.promised.load(SeqCst);
        loop {
            let add = if room == usize::MAX {
                need.min(usize::MAX - now)
            } else if now.checked_add(need)? <= room {
                need
            } else {
                return None;
            };
            match self
                .promised
                .compare_exchange_weak(now, now + add, SeqCst, SeqCst)
            {
                Ok(_) => return Some(add),
                Err(seen) => now = seen,
            }
        }
    }
}

/// The admission of one limit's runs (see the module docs). Shared as
/// `Arc<Admission>` by the workers of a pool, or by every pool of the
/// process's default limit.
pub struct Admission {
    room: Room,
    /// The budget's own commit wait, restored after a run alone.
    base_wait: Duration,
    fast: Fast,
    /// What [`Fast::room_at`] counts from.
    epoch: Instant,
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

impl Ticket {
    /// The ticket of a run of `need` bytes (at most its own) that takes
    /// this one over: the rest of its promise goes back now.
    pub(crate) fn keep(mut self, need: usize) -> Ticket {
        let a = &self.admission;
        a.fast.promised.fetch_sub(self.need - need, SeqCst);
        a.fast.largest.fetch_max(need, Relaxed);
        a.fast.admitted.fetch_add(1, Relaxed);
        self.need = need;
        a.publish();
        a.wake_waiters();
        self
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let a = &self.admission;
        a.fast.promised.fetch_sub(self.need, SeqCst);
        a.fast.running.fetch_sub(1, SeqCst);
        if self.alone {
            if let Room::Shared(s) = &a.room {
                s.budget.set_wait(a.base_wait);
            }
            a.fast.gate.fetch_sub(ALONE, SeqCst);
        }
        a.publish();
        a.wake_waiters();
    }
}

impl Admission {
    pub(crate) fn new(room: Room) -> Arc<Self> {
        let base_wait = match &room {
            Room::Shared(s) => s.budget.wait(),
            _ => Duration::ZERO,
        };
        Arc::new(Self {
            room,
            base_wait,
            fast: Fast::default(),
            epoch: Instant::now(),
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

    /// Wakes the runs waiting in this process, if there are any (a wake is
    /// a system call; other processes poll).
    fn wake_waiters(&self) {
        if self.fast.gate.load(SeqCst) & !ALONE != 0 {
            // Taken so that a waiter between its look at the room and its
            // wait is not missed.
            drop(self.lock());
            self.turn.notify_all();
        }
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
        let f = &self.fast;
        let mut s = st.stats;
        s.room = match &self.room {
            Room::Unlimited => usize::MAX,
            Room::Budget(b) => b.limit(),
            Room::Shared(_) => st.reading.room.map_or(0, |r| r.0),
        };
        s.promised = f.promised.load(SeqCst);
        s.promised_peak = f.promised_peak.load(Relaxed);
        s.running = f.running.load(SeqCst);
        s.running_peak = f.running_peak.load(Relaxed);
        s.admitted = f.admitted.load(Relaxed);
        s.queued = st.queue.len();
        s.processes = 1 + st.reading.others.processes;
        s
    }

    /// The most a run alone could be given: the limit, less (for a
    /// container's whole limit) the margin and the rest of the processes.
    fn most(&self, st: &State) -> usize {
        match &self.room {
            Room::Unlimited => usize::MAX,
            Room::Budget(b) => b.limit(),
            Room::Shared(s) => st.reading.base(s, RestBy::Floor),
        }
    }

    /// The room of a run alone: as [`Admission::room`], with the group's
    /// rest as it is now (the other runs are held back while it waits).
    fn room_alone(&self, st: &mut State, fresh: bool) -> usize {
        let room = self.room(st, fresh);
        match &self.room {
            Room::Shared(s) => alone_room(s, &st.reading, room),
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
        if let Some((r, at)) = st.reading.room {
            if !fresh && at.elapsed() < REFRESH {
                return r;
            }
        }
        let room = st.reading.read(s, self.fast.promised.load(SeqCst));
        let f = &self.fast;
        if f.gate.load(SeqCst) & ALONE != 0 {
            // A run alone commits up to the room it was admitted by.
            s.budget.set_limit(alone_room(s, &st.reading, room));
        }
        f.rest.store(st.reading.rest, Relaxed);
        f.room.store(room, Relaxed);
        // Another process waiting to run alone holds new runs back: none
        // is admitted without the lock until the room is read again.
        let at = if st.reading.others.alone {
            0
        } else {
            u64::try_from(self.epoch.elapsed().as_nanos())
                .unwrap_or(u64::MAX)
                .max(1)
        };
        f.room_at.store(at, SeqCst);
        self.publish();
        room
    }

    /// The room a run admitted without the lock may take: `None` where the
    /// room must be read first (a shared limit's, stale).
    fn fast_room(&self) -> Option<usize> {
        match &self.room {
            Room::Unlimited => Some(usize::MAX),
            Room::Budget(b) => Some(b.limit()),
            Room::Shared(_) => {
                let at = self.fast.room_at.load(SeqCst);
                let now = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
                let fresh = u64::try_from(REFRESH.as_nanos()).unwrap_or(u64::MAX);
                (at != 0 && now.saturating_sub(at) < fresh).then(|| self.fast.room.load(Relaxed))
            }
        }
    }

    /// Publishes this process's share to the ledger, if shared.
    fn publish(&self) {
        if let Room::Shared(s) = &self.room {
            let f = &self.fast;
            s.ledger.publish(Share {
                promised: f.promised.load(SeqCst) as u64,
                committed: s.budget.committed() as u64,
                rest: f.rest.load(Relaxed) as u64,
                // Only a run alone at the head of the queue (or running)
                // holds the other processes' new runs back: one further
                // back waits behind this process's own head, and two
                // processes whose heads waited for each other's flags
                // would wait for ever.
                alone_since: Some(f.head_alone.load(SeqCst)).filter(|&t| t != 0),
                alone_running: f.gate.load(SeqCst) & ALONE != 0,
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

    /// Whether a run of `need` fits now (nothing is promised).
    fn fits(&self, st: &mut State, need: usize, alone: bool, fresh: bool) -> bool {
        let f = &self.fast;
        if f.gate.load(SeqCst) & ALONE != 0 {
            return false;
        }
        if alone {
            // Nothing of this process runs, nothing of the others is in
            // flight or runs alone (a first run is promised nothing: its
            // need is unknown), and no other process's run alone came
            // first (runs alone go in the order they came). The run is
            // queued (counted in the gate) before it reads `running`: a
            // run admitted without the lock after this read sees the gate
            // and queues.
            let room = self.room_alone(st, fresh);
            let others = &st.reading.others;
            let mine = (st.queue.front().map_or(0, |w| w.since), std::process::id());
            let first = !others.alone_running && others.alone_first.is_none_or(|f| f > mine);
            return f.running.load(SeqCst) == 0 && others.promised == 0 && first && need <= room;
        }
        let room = self.room(st, fresh);
        !st.reading.others.alone && f.promised.load(SeqCst).saturating_add(need) <= room
    }

    /// Admits a run of `need` bytes now if it fits (queued runs aside):
    /// what was promised, or `None`.
    fn take(&self, st: &mut State, need: usize, alone: bool, fresh: bool) -> Option<usize> {
        let f = &self.fast;
        if alone {
            if !self.fits(st, need, true, fresh) {
                return None;
            }
            f.gate.fetch_add(ALONE, SeqCst);
            f.running.fetch_add(1, SeqCst);
            if let Room::Shared(s) = &self.room {
                // Its commits may take the room it was admitted by, not
                // only what runs beside others may (the rest at its peak),
                // and wait for the other processes' idle caches, which
                // they give back on seeing it ([`Reading::read`]).
                let room = st.reading.room.map_or(0, |r| r.0);
                s.budget.set_limit(alone_room(s, &st.reading, room));
                s.budget.set_wait(self.base_wait.max(ALONE_COMMIT_WAIT));
            }
            return f.promise(need, usize::MAX);
        }
        if f.gate.load(SeqCst) & ALONE != 0 {
            return None;
        }
        let room = self.room(st, fresh);
        if st.reading.others.alone {
            return None;
        }
        f.running.fetch_add(1, SeqCst);
        if f.gate.load(SeqCst) & ALONE != 0 {
            self.unrun();
            return None;
        }
        let got = f.promise(need, room);
        if got.is_none() {
            self.unrun();
        }
        got
    }

    /// Counts out a run counted in [`Fast::running`] that was not admitted.
    fn unrun(&self) {
        self.fast.running.fetch_sub(1, SeqCst);
    }

    /// Admits a run without the lock, if nothing waits, nothing runs alone
    /// and it fits.
    fn admit_fast(self: &Arc<Self>, need: usize) -> Option<Ticket> {
        let room = self.fast_room()?;
        let f = &self.fast;
        if f.gate.load(SeqCst) != 0 {
            return None;
        }
        f.running.fetch_add(1, SeqCst);
        let got = if f.gate.load(SeqCst) == 0 {
            f.promise(need, room)
        } else {
            None
        };
        let Some(got) = got else {
            self.unrun();
            // A run alone that read `running` meanwhile waits for it.
            self.wake_waiters();
            return None;
        };
        Some(self.admitted(got, false))
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
        if !alone {
            if let Some(t) = self.admit_fast(need) {
                return Ok(t);
            }
        }
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
        if !alone && st.queue.is_empty() {
            if let Some(got) = self.take(&mut st, need, false, false) {
                drop(st);
                return Ok(self.admitted(got, false));
            }
        }
        st.next_id += 1;
        let id = st.next_id;
        st.queue.push_back(Waiter {
            id,
            since: crate::ledger::monotonic_ns().max(1),
            need,
            alone,
            passed: 0,
        });
        self.fast.gate.fetch_add(1, SeqCst);
        self.sync_head(&st);
        self.publish();
        let since = Instant::now();
        let mut relieved = since;
        // A run alone looks at once (it could not before it was queued);
        // others wait first (they just looked).
        let mut look = alone;
        loop {
            if !look {
                st = self
                    .turn
                    .wait_timeout(st, POLL)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            look = false;
            let at = st.queue.iter().position(|w| w.id == id).expect("queued");
            if alone && since.elapsed() >= ALONE_WAIT {
                self.dequeue(&mut st, at);
                st.stats.refused += 1;
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
                    // What the C library's heap keeps free counts in the
                    // rest of the process, which the room is taken less:
                    // give it back too (a worker that decayed before the
                    // request's buffers were freed did not trim them).
                    crate::decay::trim_system_heap();
                }
                st = self.lock();
                self.room(&mut st, true);
                continue;
            }
            let got = if at == 0 {
                self.take(&mut st, need, alone, true)
            } else {
                let head = &st.queue[0];
                let may_pass = !alone && !head.alone && head.passed < MAX_PASSES;
                let head_need = (head.need, head.alone);
                if may_pass && !self.fits(&mut st, head_need.0, head_need.1, false) {
                    self.take(&mut st, need, false, true)
                } else {
                    None
                }
            };
            if got.is_none() && at == 0 && need > self.most(&st) {
                // The rest of the processes grew while it waited: even
                // alone it would not fit now (the least the rest held over
                // the last `REST_WINDOW`), and waiting on would wait for
                // ever where nothing else runs.
                self.dequeue(&mut st, at);
                st.stats.refused += 1;
                let most = self.most(&st);
                drop(st);
                self.turn.notify_all();
                return Err(OrtArenaError::OutOfMemory(format!(
                    "the run needs {need} bytes; the memory limit leaves a run at most {most} \
                     bytes (the limit less what the rest of the processes has held for {} s)",
                    crate::room::REST_WINDOW.as_secs()
                )));
            }
            if let Some(got) = got {
                if at != 0 {
                    st.queue[0].passed += 1;
                    st.stats.passed += 1;
                }
                self.dequeue(&mut st, at);
                let waited = since.elapsed();
                let s = &mut st.stats;
                s.waited += 1;
                s.wait_total += waited;
                s.wait_max = s.wait_max.max(waited);
                drop(st);
                let ticket = self.admitted(got, alone);
                // The next in line looks again.
                self.turn.notify_all();
                return Ok(ticket);
            }
        }
    }

    /// Takes the waiter at `at` off the queue.
    fn dequeue(&self, st: &mut State, at: usize) {
        st.queue.remove(at);
        self.fast.gate.fetch_sub(1, SeqCst);
        self.sync_head(st);
        self.publish();
    }

    /// Mirrors whether the head of the queue waits to run alone.
    fn sync_head(&self, st: &State) {
        let since = st.queue.front().filter(|w| w.alone).map_or(0, |w| w.since);
        self.fast.head_alone.store(since, SeqCst);
    }

    /// The ticket of a run admitted with `got` bytes promised (and counted
    /// in [`Fast::running`]).
    fn admitted(self: &Arc<Self>, got: usize, alone: bool) -> Ticket {
        let f = &self.fast;
        f.admitted.fetch_add(1, Relaxed);
        f.promised_peak.fetch_max(f.promised.load(SeqCst), Relaxed);
        f.running_peak.fetch_max(f.running.load(SeqCst), Relaxed);
        self.publish();
        Ticket {
            admission: Arc::clone(self),
            need: got,
            alone,
        }
    }

    /// The largest need of a run admitted beside others so far.
    pub(crate) fn largest_run(&self) -> usize {
        self.fast.largest.load(Relaxed)
    }

    /// Notes a run admitted beside others with `need` bytes.
    pub(crate) fn note_run(&self, need: usize) {
        self.fast.largest.fetch_max(need, Relaxed);
    }

    /// Bytes promised to the runs in flight now.
    pub(crate) fn promised_now(&self) -> usize {
        self.fast.promised.load(SeqCst)
    }

    /// Whether there is no limit.
    pub(crate) fn is_unlimited(&self) -> bool {
        matches!(self.room, Room::Unlimited)
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

/// The room of a run alone under a shared limit: the limit less the rest
/// of the group as it is now and what the other processes' arenas hold,
/// and at least `room` (what runs beside others get).
fn alone_room(s: &Shared, r: &Reading, room: usize) -> usize {
    r.base(s, RestBy::Now)
        .saturating_sub(r.others_held())
        .max(room)
}

#[cfg(test)]
#[path = "admit_unit.rs"]
mod tests;
