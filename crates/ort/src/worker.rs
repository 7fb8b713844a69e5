//! A thread's arena for ONNX Runtime runs: owned, `Send`, any number of
//! models, wrapped around the caller's own `session.run(...)`.

use crate::admit::{Admission, Ticket};
use crate::decay::Decay;
use crate::follow::{Follow, Shrink};
use crate::key::RunKey;
use crate::large::{Flight, LargeBlocks};
use crate::plans::Plans;
use crate::served::{NotServed, Watch};
use crate::slot::{self, Slot};
use crate::OrtArenaError;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tensor_arena::memory::PagesConfig;
use tensor_arena::{ArenaConfig, Budget, DynamicReason, Lookup, PlanSource, RunReport, Stats};

/// How a [`Worker`] manages its arena.
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// The arena (cap, growth). Its own `shrink_policy` applies too; leave
    /// it `Manual` (the default) and let [`WorkerOptions::shrink`] decide.
    pub arena: ArenaConfig,
    /// Whether runs are planned by their keys (default: yes).
    pub plans: bool,
    /// When cached memory is given back after a run (default
    /// [`Shrink::default`]: [`Shrink::Window`] of 1 s; idle decay, below,
    /// gives the rest back when traffic stops).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tensor_arena_ort::{Shrink, WorkerOptions};
    /// let window = Shrink::Window { time: Duration::from_secs(1) };
    /// assert_eq!(WorkerOptions::default().shrink, window);
    /// assert_eq!(Shrink::default(), window);
    /// ```
    pub shrink: Shrink,
    /// The memory layer's settings: address space per arena, huge pages,
    /// and how memory given back goes to the kernel
    /// ([`GiveBack`](tensor_arena::memory::GiveBack): at once, the
    /// default, or lazily, so that a large run after a small one commits
    /// again without page faults while the kernel has not needed the
    /// pages). Default [`PagesConfig::default`].
    pub pages: PagesConfig,
    /// A budget shared with other arenas of the process (other workers,
    /// sessions, shared arenas): the worker's commits are charged to it,
    /// and when a commit would pass the limit, idle members give their
    /// cached memory back first. A request the budget still refuses fails
    /// the run (ONNX Runtime is refused it with `std::bad_alloc`:
    /// [`RunInfo::out_of_memory`]); the worker stays usable. A worker that
    /// was running when memory ran short (it could give nothing then) gives
    /// back, at its run's end, what it holds for its other models: down to
    /// that run's need ([`Budget::pressure`]). Default `None`: the
    /// process's default budget ([`default_budget`](crate::default_budget):
    /// a share of the cgroup's limit or of the machine's memory, set by
    /// `TENSOR_ARENA_MEMORY_LIMIT` or
    /// [`set_default_memory_limit`](crate::set_default_memory_limit), or
    /// none if turned off), shared by every worker made without a budget.
    pub budget: Option<Arc<Budget>>,
    /// Idle decay: when the worker has not run for this long, its cached
    /// memory goes back to the kernel (all of it, what was given back
    /// lazily included; live outputs keep their blocks), with no call from
    /// the server: a thread of the process does it, never waiting for a
    /// busy worker (`BENCHMARKS.md`, "Servers", says how). The next run
    /// commits again. `None`: memory stays until the shrink policy or
    /// [`Worker::shrink`] gives it back. Default
    /// [`DEFAULT_DECAY`](crate::DEFAULT_DECAY) (2 s).
    pub decay: Option<Duration>,
    /// In a [`WorkerPool`](crate::WorkerPool) of more than one worker,
    /// blocks of this many bytes or more come from one arena the pool's
    /// workers share, not from each worker's own: what one run frees at its
    /// spike, another run in flight reuses, so the runs in flight hold
    /// about what they use together instead of each its own largest
    /// moment (docs/decisions.md, "Large blocks shared by the runs in
    /// flight"). The smaller blocks stay on each worker's plan. A run's
    /// admission counts both. `None`: each worker serves all its blocks.
    /// A worker made alone ([`Worker::new`]) serves all its blocks.
    /// Default [`SHARE_LARGE_BLOCKS`] (1 MiB).
    pub share_large_blocks: Option<usize>,
}

/// The default of [`WorkerOptions::share_large_blocks`]: blocks of 1 MiB or
/// more come from the arena a pool's workers share.
pub const SHARE_LARGE_BLOCKS: usize = 1 << 20;

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            arena: ArenaConfig::default(),
            plans: true,
            shrink: Shrink::default(),
            pages: PagesConfig::default(),
            budget: None,
            decay: Some(crate::DEFAULT_DECAY),
            share_large_blocks: Some(SHARE_LARGE_BLOCKS),
        }
    }
}

/// What the last [`Worker::run`] did.
#[derive(Clone, Debug, Default)]
pub struct RunInfo {
    /// The arena's report of the run.
    pub report: RunReport,
    /// `Alloc` calls made on the worker's thread during the run.
    pub alloc_calls: u64,
    /// Of those, requests the arena refused (over its cap, over a budget),
    /// served by the system allocator instead.
    pub refused_allocs: u64,
    /// Requests nothing could serve, refused to ONNX Runtime with
    /// `std::bad_alloc` (the run then failed: its error names the
    /// exception).
    pub failed_allocs: u64,
    /// The largest request the budget refused during the run (0: none).
    pub refused_bytes: usize,
    /// Bytes the run was admitted for (0: no admission; see
    /// [`WorkerPool`](crate::WorkerPool)).
    pub admitted: usize,
    /// Whether the run was admitted alone (a model's first run, or a retry
    /// after running out of memory).
    pub alone: bool,
    /// The most bytes the run's blocks held at once in the arena its pool's
    /// workers share for large blocks
    /// ([`WorkerOptions::share_large_blocks`]; 0 without one). `report`
    /// counts the worker's own arena only.
    pub large_peak: usize,
    /// Whether the closure returned `Ok`.
    pub succeeded: bool,
    /// Whether this run taught its key a plan.
    pub learned: bool,
    /// How the arena served the run: from its key's own plan
    /// (`Some(PlanSource::Exact)`), from a plan predicted from the model's
    /// earlier shapes (`Some(PlanSource::Predicted)`), or dynamically
    /// (`Some(PlanSource::Dynamic(why))`). `None` when the arena did not
    /// serve the run at all ([`RunInfo::not_served`]): such a run is
    /// neither planned nor dynamic (`report.planned` and `report.deviated`
    /// are false, and the model's plans learn and count nothing from it).
    /// Whether
    /// a planned run kept to its plan is in `report` (`deviated`,
    /// `deviation`).
    pub plan: Option<PlanSource>,
    /// Bytes given back by the shrink policy: before the run, when its
    /// key's own plan needs less than the worker held, and after it.
    pub released: usize,
    /// The run's key.
    pub key: RunKey,
    /// Set when the run's tensors did not come from the arena: the closure
    /// returned `session.run_async`'s future, or made no allocation on this
    /// thread while the system allocator served tensors
    /// ([`RunInfo::check`]).
    pub not_served: Option<NotServed>,
}

impl RunInfo {
    /// Whether the run failed because memory ran out.
    pub fn out_of_memory(&self) -> bool {
        !self.succeeded && self.failed_allocs > 0
    }

    /// `Err` when the run was not served by the arena
    /// ([`RunInfo::not_served`]): for a server that refuses such runs,
    /// `worker.last_run().map_or(Ok(()), RunInfo::check)?`.
    ///
    /// # Errors
    /// [`OrtArenaError::NotServed`], saying why and what to do instead.
    pub fn check(&self) -> Result<(), OrtArenaError> {
        self.not_served.map_or(Ok(()), |n| Err(n.into()))
    }
}

/// One thread's arena for ONNX Runtime: keep one per thread of a pool whose
/// threads are fixed, or check one out of a [`WorkerPool`](crate::WorkerPool)
/// per request. **Not in a `thread_local!` on an elastic executor** (tokio's
/// `spawn_blocking`, rayon's global pool, any pool that grows threads
/// under load): every thread it grows makes an arena of its own (65 arenas,
/// 280 to 349 MiB peak, measured on the HTTP example), where a pool's
/// arenas follow the server's chosen concurrency. When a process holds
/// more workers than [`worker_warning_limit`](crate::worker_warning_limit)
/// (4 per core, at least 16), one line on stderr says so, once.
///
/// While [`Worker::run`] calls the
/// closure, every tensor ONNX Runtime allocates on this thread through the
/// registered allocator (see [`register`](crate::register) and
/// [`SessionBuilderExt`](crate::SessionBuilderExt)) is a block of this
/// arena, taken with no lock, planned by the run's key.
///
/// Owned and `Send`: keep one per thread (a `thread_local!`, a pool's
/// per-thread state), move it into `spawn_blocking`, or check it out of a
/// pool per request. One worker runs any number of models, one at a time:
/// each model keeps its [`Plans`], and the arena holds the largest model's
/// need, not the sum. Outputs are blocks of the arena; they may outlive
/// the run, the worker and the session, and may be dropped on any thread.
/// Dropping the worker gives back its cached memory.
pub struct Worker {
    slot: Arc<Slot>,
    options: WorkerOptions,
    follow: Follow,
    runs: u64,
    last: Option<RunInfo>,
    /// The budget's [`Budget::pressure`] when this worker last looked.
    pressure_seen: u64,
    /// Idle decay, if on.
    decay: Option<Arc<Decay>>,
    /// The budget its commits are charged to: its options', else the
    /// process's default, if any.
    budget: Option<Arc<Budget>>,
    /// Where its runs are admitted, when it belongs to a pool
    /// ([`Admission`](crate::Admission)).
    admission: Option<Arc<Admission>>,
    /// The arena its pool's workers share for their large blocks, if any.
    large: Option<Arc<LargeBlocks>>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("id", &self.slot.id)
            .field("runs", &self.runs)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Workers alive in the process.
static WORKERS: AtomicUsize = AtomicUsize::new(0);
/// Whether the process was told it holds too many workers.
static WARNED: AtomicBool = AtomicBool::new(false);

/// The number of workers alive at once past which the process is told,
/// once, on stderr, that it holds many arenas (a [`Worker`] per thread of
/// an elastic executor, typically): 4 per core the process may use, at
/// least 16. A server with a fixed pool or a [`WorkerPool`](crate::WorkerPool)
/// sized to its concurrency stays under it.
pub fn worker_warning_limit() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (4 * cores).max(16)
}

/// Counts a new worker; says once when there are too many.
fn count_worker() {
    let alive = WORKERS.fetch_add(1, Ordering::Relaxed) + 1;
    let limit = worker_warning_limit();
    if alive > limit && !WARNED.swap(true, Ordering::Relaxed) {
        eprintln!(
            "tensor-arena-ort: {alive} workers (arenas) alive, over {limit} (4 per core): \
             a Worker per thread of an elastic executor (thread_local!, spawn_blocking, \
             rayon) makes an arena per thread; check workers out of a bounded WorkerPool \
             instead (said once)"
        );
    }
}

impl Worker {
    /// Whether no thread holds any of the worker's locks (after a fork:
    /// see [`WorkerPool::after_fork`](crate::WorkerPool::after_fork)).
    pub(crate) fn is_free(&self) -> bool {
        self.slot.is_free() && self.large.as_ref().is_none_or(|l| l.is_free())
    }

    /// Serves this worker's large blocks from `large` from now on, in runs
    /// that start while another run of a worker sharing it is in flight
    /// (`None`: from its own arena, as a worker made alone does). A
    /// [`WorkerPool`](crate::WorkerPool) sets its own on its workers. Set
    /// it between runs; runs of the same `Plans` on workers sharing it
    /// plan their sharing runs apart ([`Plans::sharing`]).
    pub fn set_large_blocks(&mut self, large: Option<Arc<LargeBlocks>>) {
        self.slot.share_large(large.as_ref().map(|l| l.target()));
        self.large = large;
    }

    /// A run of `model` starts: whether it shares its large blocks (another
    /// run of the pool in flight), and the model's plans for such runs if
    /// so; the flight ends when the returned guard drops.
    fn enter<'p>(&self, model: &'p Plans) -> (Option<Flight>, bool, &'p Plans) {
        let flight = self.large.as_ref().map(LargeBlocks::enter);
        let share = flight.as_ref().is_some_and(|f| f.shared);
        (flight, share, if share { model.sharing() } else { model })
    }

    /// The budget the worker's commits are charged to.
    pub(crate) fn budget(&self) -> Option<&Arc<Budget>> {
        self.budget.as_ref()
    }

    /// A worker with an empty arena (nothing is reserved until its first
    /// run).
    ///
    /// # Errors
    /// [`OrtArenaError::Arena`] if `options.arena` is invalid.
    pub fn new(options: WorkerOptions) -> Result<Self, OrtArenaError> {
        options.arena.validate()?;
        let budget = match &options.budget {
            Some(b) => Some(Arc::clone(b)),
            None => crate::limit::default_budget()?,
        };
        let slot = Slot::new(options.arena, options.pages, budget.as_ref())?;
        count_worker();
        Ok(Self {
            decay: options.decay.map(|idle| Decay::register(&slot, idle)),
            slot,
            follow: Follow::new(options.shrink),
            pressure_seen: budget.as_ref().map_or(0, |b| b.pressure()),
            budget,
            admission: None,
            large: None,
            options,
            runs: 0,
            last: None,
        })
    }

    /// Runs `f` (the caller's own `session.run(...)`) with this worker's
    /// arena serving the tensors ONNX Runtime allocates on this thread,
    /// keyed by `key` in `plans` (the model's). Returns what `f` returned.
    ///
    /// The first run of a key is served from a plan predicted from the
    /// model's earlier shapes (once its family has seen two), else recorded;
    /// if it succeeds its plan is learned, and later runs of the key get
    /// every tensor at its planned offset in one block
    /// ([`RunInfo::plan`] says which). After the run the shrink policy gives cached memory back
    /// ([`WorkerOptions::shrink`]); a run its key's own plan says needs
    /// less is given it back before it starts ([`Worker::prepare`]). A failed run (`Err`) teaches no plan.
    /// [`Worker::last_run`] tells what the run did.
    ///
    /// `f` runs on this thread. Calling another worker's `run` inside it is
    /// allowed (the inner worker serves until it returns); a panic in `f`
    /// propagates after the arena is restored.
    pub fn run<T, E>(
        &mut self,
        plans: &Plans,
        key: &RunKey,
        f: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        let (_flight, share, plans) = self.enter(plans);
        let lookup = self.lookup(plans, key);
        // A run the limit could never hold is run all the same (its
        // allocations are refused and it fails as before): `run` cannot
        // return an error of its own. `run_retrying` refuses it at once.
        let ticket = match &self.admission {
            Some(a) => {
                let (need, alone) = need_of(plans, key, &lookup);
                a.admit_run(need, alone).ok()
            }
            None => None,
        };
        self.run_once(plans, key, lookup, ticket, share, f)
    }

    /// [`Worker::run`] for a worker of a [`WorkerPool`](crate::WorkerPool),
    /// whose runs are admitted by what they will need ([`Admission`](crate::Admission)),
    /// with the retry a memory limit calls for: a run that runs out of
    /// memory beside others is run again once, alone (no other run of the
    /// process beside it), if it could fit alone; `f` is called again then.
    ///
    /// # Errors
    /// `f`'s error; [`OrtArenaError::OutOfMemory`] at once, without
    /// calling `f`, when the run's plan needs more than the limit can give
    /// a run alone, and after the run when it ran out of memory and needs
    /// more than that (the message names the need and the limit).
    pub fn run_retrying<T>(
        &mut self,
        plans: &Plans,
        key: &RunKey,
        mut f: impl FnMut() -> Result<T, OrtArenaError>,
    ) -> Result<T, OrtArenaError> {
        let model = plans;
        let (flight, share, plans) = self.enter(model);
        let lookup = self.lookup(plans, key);
        let (need, alone) = need_of(plans, key, &lookup);
        let ticket = match &self.admission {
            Some(a) => Some(a.admit_run(need, alone)?),
            None => None,
        };
        let out = self.run_once(plans, key, lookup, ticket, share, &mut f);
        drop(flight);
        let Some(admission) = self.admission.clone() else {
            return out;
        };
        let Some(info) = self.last.as_ref().filter(|i| i.out_of_memory()) else {
            return out;
        };
        if out.is_ok() {
            return out;
        }
        // What the run reached, and the request it was refused.
        let demand = info
            .report
            .high_water
            .saturating_add(info.large_peak)
            .saturating_add(info.refused_bytes)
            .max(need);
        let most = admission.most_now();
        if demand > most || info.alone {
            return Err(OrtArenaError::OutOfMemory(format!(
                "the run needs at least {demand} bytes; the memory limit leaves a run at most \
                 {most} bytes{}",
                if info.alone { " (it ran alone)" } else { "" }
            )));
        }
        admission.count_retry();
        // Alone: its large blocks are its own again, unless a run of the
        // pool is in flight still (one of another limit's admission).
        let (_flight, share, plans) = self.enter(model);
        let lookup = self.lookup(plans, key);
        let again = need_of(plans, key, &lookup).0.max(demand);
        let ticket = admission.admit_run(again, true)?;
        self.run_once(plans, key, lookup, Some(ticket), share, f)
    }

    /// The plan for `key`'s run, if any.
    fn lookup(&self, plans: &Plans, key: &RunKey) -> Lookup {
        if self.options.plans {
            let _section = crate::learn::section();
            plans.cache.lookup(key)
        } else {
            Lookup::none(DynamicReason::Off)
        }
    }

    /// Sets where this worker's runs are admitted by what they will need
    /// ([`Admission`]; `None`: not admitted, as a worker made alone). A
    /// [`WorkerPool`](crate::WorkerPool) sets its own on its workers; a
    /// server that keeps workers itself (one per thread of a fixed pool)
    /// shares one among them, typically [`Admission::of_budget`] of their
    /// budget.
    pub fn set_admission(&mut self, admission: Option<Arc<Admission>>) {
        self.admission = admission;
    }

    /// Runs `f` as [`Worker::run`] describes, `lookup` and `ticket` (its
    /// admission, held until the run's memory is given back) made.
    fn run_once<T, E>(
        &mut self,
        plans: &Plans,
        key: &RunKey,
        lookup: Lookup,
        ticket: Option<Ticket>,
        share: bool,
        f: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        let planned_size = lookup.plan.as_ref().map(|p| p.size());
        // A run with no plan (its key's own, or one predicted from its
        // family) is recorded: its plan is learned.
        let record = self.options.plans && lookup.plan.is_none();
        let slot = Arc::clone(&self.slot);
        let mut core = slot.lock();
        let admitted = ticket.as_ref().map_or(0, |t| t.need());
        let alone = ticket.as_ref().is_some_and(Ticket::alone);
        if let Some(t) = &ticket {
            // What the arenas hold follows the runs in flight: where the
            // limit's members hold more than the runs in flight were
            // promised (by a fifth and a granule), this worker does not
            // carry its cache beyond this run's need into the run.
            if let Some(b) = t.admission().budget() {
                let promised = t.admission().promised_now();
                let slack = promised / 5 + (2 << 20);
                let reserved = core.arena_stats().reserved;
                if b.committed() > promised.saturating_add(slack) && reserved > admitted {
                    core.shrink_to(admitted);
                }
            }
        }
        let mut released = self.give_back_before(&mut core, plans, &lookup);
        crate::raw::take_refused_bytes();
        core.begin_run(lookup.plan.clone(), record, share);
        let calls_before = crate::raw::thread_alloc_calls();
        let failed_before = crate::raw::thread_failed_allocs();
        let watch = Watch::start();
        let result = {
            let _entered = slot::enter(&slot, &mut core);
            f()
        };
        let calls = crate::raw::thread_alloc_calls();
        let failed_allocs = crate::raw::thread_failed_allocs() - failed_before;
        let refused_bytes = crate::raw::take_refused_bytes();
        let (report, recording) = core.finish_run().unwrap_or_default();
        let large_peak = core.large_peak();
        let succeeded = result.is_ok();
        let not_served = watch.finish::<T>(calls.0 - calls_before.0);
        // A run the arena did not serve (ONNX Runtime allocated elsewhere)
        // is neither planned nor dynamic: the plan it opened served
        // nothing, and it teaches the model's plans nothing.
        let report = match not_served {
            Some(_) => RunReport {
                planned: false,
                deviated: false,
                deviation: None,
                ..report
            },
            None => report,
        };
        // What this model needs for this key: its plan's block, or what the
        // run reached.
        let mut need = planned_size.unwrap_or(report.high_water);
        // A run the arena did not serve needed nothing of it.
        plans.note_run(if not_served.is_none() {
            report.high_water.saturating_add(large_peak)
        } else {
            0
        });
        if not_served.is_none() {
            plans.note_large(key, large_peak);
        }
        let mut learned = false;
        if self.options.plans && not_served.is_none() {
            let _section = crate::learn::section();
            if let Some(plan) = plans
                .cache
                .after_run(key, &lookup, &report, &recording, succeeded)
            {
                need = plan.size();
                learned = true;
            }
        }
        let target = if succeeded {
            self.follow.after_run(plans.id(), need)
        } else {
            // A failed run (memory ran short, say): give back what it left
            // cached, down to what the models need.
            self.follow.held()
        };
        // Memory ran short under the budget since the last run (another
        // member's commit had to reclaim, or `relieve` was called) while
        // this worker was busy and could give nothing: give back what it
        // holds for its other models now, down to this run's need.
        let target = match &self.budget {
            Some(b) if b.pressure() != self.pressure_seen => {
                self.pressure_seen = b.pressure();
                Some(target.map_or(need, |t| t.min(need)))
            }
            _ => target,
        };
        if let Some(bytes) = target.filter(|&b| core.arena_stats().reserved > b) {
            released += core.shrink_to(bytes);
        }
        self.runs += 1;
        slot.publish(&core);
        drop(core);
        if let Some(l) = &self.large {
            released += l.after_run();
        }
        // The promise ends with the run's memory given back.
        drop(ticket);
        if let Some(d) = &self.decay {
            d.used();
        }
        // A refit this run asked for is made off its path.
        {
            let _section = crate::learn::section();
            if plans.cache.owes() {
                crate::learn::owe(&plans.cache);
                if !crate::decay::wake() {
                    plans.cache.learn();
                }
            }
        }
        let plan = not_served.is_none().then_some(lookup.source);
        self.last = Some(RunInfo {
            not_served,
            report,
            alloc_calls: calls.0 - calls_before.0,
            refused_allocs: calls.1 - calls_before.1,
            failed_allocs,
            refused_bytes,
            admitted,
            alone,
            large_peak,
            succeeded,
            learned,
            plan,
            released,
            key: key.clone(),
        });
        result
    }

    /// Gives back, before a run of `key`, what the worker holds beyond what
    /// the shrink policy will hold after it, when the key's own plan says
    /// what the run needs ([`PlanSource::Exact`]): a smaller run after a
    /// larger one then runs on its own memory, not the larger run's (under
    /// [`Shrink::FollowInput`]; a [`Shrink::Window`] holds the larger need
    /// through its window). Returns the bytes released. [`Worker::run`]
    /// does this itself as the run starts; call it earlier to give the
    /// memory back as soon as the next run is known (a request taken from
    /// a queue while its inputs are decoded). A run whose plan is
    /// predicted or unknown gives nothing back before it (a prediction may
    /// be wrong); it is not counted as a run.
    pub fn prepare(&mut self, plans: &Plans, key: &RunKey) -> usize {
        let lookup = self.lookup(plans, key);
        let slot = Arc::clone(&self.slot);
        let mut core = slot.lock();
        let released = self.give_back_before(&mut core, plans, &lookup);
        slot.publish(&core);
        released
    }

    /// [`Worker::prepare`] with the lookup made and the core locked.
    fn give_back_before(&self, core: &mut slot::Core, plans: &Plans, lookup: &Lookup) -> usize {
        let (Some(plan), PlanSource::Exact) = (&lookup.plan, lookup.source) else {
            return 0;
        };
        match self.follow.before_run(plans.id(), plan.size()) {
            Some(bytes) if core.arena_stats().reserved > bytes => core.shrink_to(bytes),
            _ => 0,
        }
    }

    /// What the last run did (`None` before the first).
    pub fn last_run(&self) -> Option<&RunInfo> {
        self.last.as_ref()
    }

    /// Gives cached memory back down to what the recent runs of each model
    /// need (as the shrink policy counts them), or all of it with
    /// `everything`; returns the bytes released. Live outputs keep their
    /// blocks. With `everything`, memory given back lazily
    /// ([`GiveBack::Lazily`](crate::GiveBack::Lazily)) also leaves the
    /// process at once ([`Worker::give_back_now`]).
    pub fn shrink(&mut self, everything: bool) -> usize {
        let mut core = self.slot.lock();
        let target = if everything {
            0
        } else {
            self.follow.held().unwrap_or(0)
        };
        let released = core.shrink_to(target);
        if everything {
            core.give_back_now();
        }
        self.slot.publish(&core);
        released
    }

    /// Gives the memory this worker's arena gave back lazily
    /// ([`GiveBack::Lazily`](crate::GiveBack::Lazily)) back to the system at
    /// once, so that RSS comes down by it (for a server going idle, say);
    /// returns the bytes. What the worker holds for its models stays.
    pub fn give_back_now(&mut self) -> usize {
        let mut core = self.slot.lock();
        let done = core.give_back_now();
        self.slot.publish(&core);
        done
    }

    /// This worker's arena stats (also counting blocks freed from other
    /// threads so far).
    pub fn stats(&self) -> Stats {
        let core = self.slot.lock();
        self.slot.publish(&core);
        core.arena_stats()
    }

    /// Runs made.
    pub fn runs(&self) -> u64 {
        self.runs
    }

    /// Starts (or stops) recording this worker's runs as an allocation
    /// trace: ONNX Runtime's own allocation and free order, to replay
    /// elsewhere (`tensor-arena replay`). See
    /// [`Arena::record_trace`](tensor_arena::Arena::record_trace).
    pub fn record_trace(&mut self, on: bool) {
        self.slot.lock().record_trace(on);
    }

    /// The runs recorded since recording started or the last call.
    pub fn take_trace(&mut self) -> tensor_arena::trace::Trace {
        self.slot.lock().take_trace()
    }

    /// The options the worker was made with.
    pub fn options(&self) -> &WorkerOptions {
        &self.options
    }

    pub(crate) fn slot(&self) -> &Arc<Slot> {
        &self.slot
    }
}

/// What a run of `key` (`lookup` made) is admitted for: its plan's block
/// and what its blocks hold in the arena the pool's workers share
/// ([`Plans::large_need`]); with no plan, the largest run of the model
/// seen so far; for the model's first run, nothing known: alone.
fn need_of(plans: &Plans, key: &RunKey, lookup: &Lookup) -> (usize, bool) {
    match &lookup.plan {
        Some(p) => (p.size().saturating_add(plans.large_need(key)), false),
        None if plans.has_run() => (plans.largest_run(), false),
        None => (0, true),
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        WORKERS.fetch_sub(1, Ordering::Relaxed);
        self.slot.retire();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>() {}
    fn assert_sync<T: Sync>() {}

    #[test]
    fn workers_move_between_threads_and_plans_are_shared() {
        assert_send::<Worker>();
        assert_sync::<Plans>();
        assert_send::<Plans>();
    }

    #[test]
    fn a_run_with_no_allocation_learns_nothing() {
        let mut w = Worker::new(WorkerOptions::default()).unwrap();
        let plans = Plans::default();
        let key = RunKey::from_shapes([[1i64, 2]]);
        let out: Result<u32, ()> = w.run(&plans, &key, || Ok(7));
        assert_eq!(out, Ok(7));
        let info = w.last_run().unwrap();
        assert!(info.succeeded && !info.learned);
        assert_eq!(info.alloc_calls, 0);
        assert_eq!(plans.stats().plans, 0);
        let err: Result<(), &str> = w.run(&plans, &key, || Err("no"));
        assert_eq!(err, Err("no"));
        assert!(!w.last_run().unwrap().succeeded);
        assert_eq!(w.runs(), 2);
    }

    #[test]
    fn too_many_workers_are_reported_once() {
        let limit = worker_warning_limit();
        assert!(limit >= 16);
        let many: Vec<Worker> = (0..=limit)
            .map(|_| Worker::new(WorkerOptions::default()).unwrap())
            .collect();
        assert!(WORKERS.load(Ordering::Relaxed) > limit);
        assert!(WARNED.load(Ordering::Relaxed), "more than the limit alive");
        drop(many);
    }

    #[test]
    fn an_invalid_arena_config_is_an_error() {
        let options = WorkerOptions {
            arena: ArenaConfig {
                alignment: 3,
                ..ArenaConfig::default()
            },
            ..WorkerOptions::default()
        };
        assert!(matches!(Worker::new(options), Err(OrtArenaError::Arena(_))));
    }
}
