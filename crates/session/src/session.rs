//! [`Session`]: shared weights plus a private arena; [`RunContext`]: what a
//! run's closure gets.

use crate::swap::ModelHandle;
use crate::weights::Weights;
use bumpalo::Bump;
use std::cell::Cell;
use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tensor_arena::memory::{default_memory, Budgeted, PagesConfig};
use tensor_arena::plan::{DynamicReason, Lookup, PlanCache, PlanSource, PlanStats};
use tensor_arena::{
    Arena, ArenaConfig, ArenaError, Block, Budget, DefaultMemory, HostMemory, LiveBlock, Run,
    RunReport, SharedArena, SharedArenaGuard, Stats, TypedBlock,
};

/// The memory layer of a session under a [`Budget`]
/// ([`Session::with_budget`]): the default layer, its commits charged.
pub type BudgetedMemory = Budgeted<DefaultMemory>;

/// A session whose arena (and every clone's) commits under a [`Budget`].
pub type BudgetedSession = Session<BudgetedMemory>;

/// Configuration of a [`Session`] and of every clone made from it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionConfig {
    /// Configuration of each clone's private arena.
    pub arena: ArenaConfig,
    /// Its memory layer's settings (`Pages` on Linux: address space
    /// reserved per clone, huge pages); see the arena crate's "Address
    /// space" section for how many clones fit.
    pub memory: PagesConfig,
    /// Shape-keyed memory plans.
    pub plans: PlanConfig,
}

/// How a session family learns and uses memory plans.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanConfig {
    /// Whether runs are recorded and planned by key (default: yes).
    pub enabled: bool,
    /// Plans kept (least recently used out); default 64.
    pub capacity: usize,
    /// When a key has no plan yet, serve its first run from the largest
    /// plan held if it covers the run (same allocations and frees, none
    /// larger), instead of the dynamic pool; the run's own plan is learned
    /// at the same time. Default: no.
    pub serve_smaller_from_larger: bool,
    /// After learning a plan, shrink the session's arena to the largest plan
    /// it has used: every shape it has seen is then served from its plan's
    /// block, so the extra room a recorded (dynamic) run needed goes back.
    /// Default: yes.
    pub shrink_to_plans: bool,
}

impl Default for PlanConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            capacity: 64,
            serve_smaller_from_larger: false,
            shrink_to_plans: true,
        }
    }
}

/// Makes a new clone's memory layer from the family's `PagesConfig`.
type MakeMemory<M> = dyn Fn(PagesConfig) -> M + Send + Sync;

/// What clones of one session share: the model handle and live counters.
pub(crate) struct Family<M> {
    /// Clones alive (including the original).
    pub(crate) alive: AtomicUsize,
    /// Clones ever made (including the original).
    pub(crate) created: AtomicU64,
    /// Plans learned by any clone, used by all.
    pub(crate) plans: PlanCache<Box<[usize]>>,
    /// Each clone's memory layer.
    make: Box<MakeMemory<M>>,
    /// The budget the clones commit under, if any; each is its member.
    budget: Option<Arc<Budget>>,
}

/// A model ready to run: shared read-only weights and a private [`Arena`]
/// for the intermediate tensors of its runs.
///
/// | state   | how it gets there | memory |
/// |---------|-------------------|--------|
/// | created | [`Session::new`] or [`Session::try_clone`] | weights shared; arena empty (nothing allocated) |
/// | running | inside [`Session::run`] | buffers live in the arena |
/// | idle    | the run's closure returned | buffers cached in the arena for the next run |
/// | shrunk  | [`Session::shrink`] | arena down to the recent runs' watermark |
/// | dropped | `drop` | every byte the arena drew is freed; weights released with their last user |
///
/// A session is `Send` (give each worker thread its own clone) and not
/// `Sync` (one run at a time), both derived by the compiler:
///
/// ```compile_fail
/// fn shared<T: Sync>() {}
/// shared::<tensor_session::Session>();
/// ```
///
/// # Under a budget
/// [`Session::with_budget`] makes a [`BudgetedSession`]: its arena and its
/// clones' commit under one [`Budget`] shared with any other arenas, and
/// each is a member of it. An idle session (no run in progress) gives its
/// cached memory back when another member's commit needs room; a running
/// one is never waited for (its lock is only tried) and never loses a live
/// buffer. A run whose buffer the budget refuses gets
/// [`ArenaError::CommitFailed`] with the code
/// [`OverBudget`](tensor_arena::memory::ErrorCode::OverBudget); the session
/// stays usable, and a smaller run succeeds.
pub struct Session<M: HostMemory + Send + 'static = DefaultMemory> {
    model: ModelHandle,
    config: SessionConfig,
    /// Locked for each run (once, not per buffer), so that a budget's
    /// reclaim, which only tries the lock, never touches a running session.
    arena: Arc<SharedArena<M>>,
    family: Arc<Family<M>>,
    /// `Budget::pressure` when this session last gave back for it.
    pressure_seen: u64,
    /// Keeps `Session: !Sync` (one run at a time, `&mut self`).
    _not_sync: PhantomData<Cell<()>>,
    runs: u64,
    last: Option<RunReport>,
    /// Runs per key (input shape).
    keys: HashMap<Box<[usize]>, u64>,
    /// Size of the largest plan this session has learned or been served by.
    largest_plan: usize,
    /// Number of this session in its family (0 for the original).
    id: u64,
}

impl Session {
    /// A session over `weights`.
    ///
    /// # Panics
    /// If `config.arena` is inconsistent ([`ArenaConfig::validate`]).
    pub fn new(weights: Arc<Weights>, config: SessionConfig) -> Self {
        Self::with_model(ModelHandle::new(weights), config)
    }

    /// A session reading its weights from `model` at the start of every run,
    /// so that [`ModelHandle::swap`] reaches it (and its clones).
    ///
    /// # Panics
    /// If `config.arena` is inconsistent ([`ArenaConfig::validate`]).
    pub fn with_model(model: ModelHandle, config: SessionConfig) -> Self {
        Self::family(model, config, Box::new(default_memory), None)
    }
}

impl Session<BudgetedMemory> {
    /// A session over `weights` whose arena, and every clone's, commits
    /// under `budget` as one of its members; see "Under a budget" above.
    ///
    /// # Panics
    /// If `config.arena` is inconsistent ([`ArenaConfig::validate`]).
    pub fn with_budget(weights: Arc<Weights>, config: SessionConfig, budget: &Arc<Budget>) -> Self {
        Self::with_model_and_budget(ModelHandle::new(weights), config, budget)
    }

    /// [`Session::with_model`] under `budget`.
    ///
    /// # Panics
    /// If `config.arena` is inconsistent ([`ArenaConfig::validate`]).
    pub fn with_model_and_budget(
        model: ModelHandle,
        config: SessionConfig,
        budget: &Arc<Budget>,
    ) -> Self {
        let b = Arc::clone(budget);
        let make = move |pages| Budgeted::new(default_memory(pages), Arc::clone(&b));
        Self::family(model, config, Box::new(make), Some(Arc::clone(budget)))
    }
}

impl<M: HostMemory + Send + 'static> Session<M> {
    fn family(
        model: ModelHandle,
        config: SessionConfig,
        make: Box<MakeMemory<M>>,
        budget: Option<Arc<Budget>>,
    ) -> Self {
        let family = Arc::new(Family {
            alive: AtomicUsize::new(0),
            created: AtomicU64::new(0),
            plans: PlanCache::new(config.plans.capacity),
            make,
            budget,
        });
        Self::member(model, config, family)
    }

    fn member(model: ModelHandle, config: SessionConfig, family: Arc<Family<M>>) -> Self {
        let arena = Arena::with_memory(config.arena, (family.make)(config.memory))
            .unwrap_or_else(|e| panic!("{e}"));
        let arena = Arc::new(SharedArena::from_arena(arena));
        let pressure_seen = match &family.budget {
            Some(b) => {
                let member: Arc<dyn tensor_arena::Reclaim> = arena.clone();
                b.register(Arc::downgrade(&member));
                b.pressure()
            }
            None => 0,
        };
        family.alive.fetch_add(1, Ordering::Relaxed);
        let id = family.created.fetch_add(1, Ordering::Relaxed);
        Self {
            model,
            config,
            arena,
            family,
            pressure_seen,
            _not_sync: PhantomData,
            runs: 0,
            last: None,
            keys: HashMap::new(),
            largest_plan: 0,
            id,
        }
    }

    /// A clone for another worker: the same weights (shared, no byte copied)
    /// and configuration, and a new, empty arena. Its cost does not depend
    /// on the weights' size.
    pub fn try_clone(&self) -> Self {
        Self::member(self.model.clone(), self.config, Arc::clone(&self.family))
    }

    /// Runs one inference. `key` identifies the input shape (its dimensions,
    /// for instance); `f` gets a [`RunContext`] to read weights and allocate
    /// buffers, which all return to the arena when the run ends, also if
    /// `f` panics. Nothing `f` allocates can outlive the call.
    ///
    /// With plans enabled, the first run of a key is recorded and planned
    /// (by any clone: the family shares its plans), and later runs of the
    /// key get their buffers at the plan's offsets in one block.
    ///
    /// A buffer cannot leave the run that allocated it (the borrow checker
    /// refuses it), so no buffer outlives the memory the run hands back:
    ///
    /// ```compile_fail
    /// # use std::sync::Arc;
    /// # use tensor_session::{Dtype, Session, SessionConfig, Weights};
    /// # let w = Weights::from_tensors([("w", Dtype::U8, vec![1], vec![0u8])]).unwrap();
    /// let mut session = Session::new(Arc::new(w), SessionConfig::default());
    /// let escaped = session.run(&[1], |ctx| ctx.alloc(64).unwrap());
    /// ```
    pub fn run<R>(&mut self, key: &[usize], f: impl FnOnce(&RunContext<'_, M>) -> R) -> R {
        let arena = Arc::clone(&self.arena);
        let guard = arena.lock();
        let out = self.run_locked(&guard, key, f);
        self.give_under_pressure(&guard);
        out
    }

    /// At a run boundary: if memory ran short since this session last
    /// looked ([`Budget::pressure`]) while it was busy, gives back what it
    /// caches beyond its watermark.
    fn give_under_pressure(&mut self, arena: &Arena<M>) {
        if let Some(b) = &self.family.budget {
            let now = b.pressure();
            if now != self.pressure_seen {
                self.pressure_seen = now;
                arena.shrink();
            }
        }
    }

    fn run_locked<R>(
        &mut self,
        arena: &Arena<M>,
        key: &[usize],
        f: impl FnOnce(&RunContext<'_, M>) -> R,
    ) -> R {
        let weights = self.model.load();
        let plans = &self.family.plans;
        let cfg = self.config.plans;
        // The key's own plan, else one predicted from the model's earlier
        // shapes, else (if configured) the largest plan held.
        let lookup = if cfg.enabled {
            plans.lookup(key)
        } else {
            Lookup::none(DynamicReason::Off)
        };
        let (plan, own) = match &lookup.plan {
            Some(p) => (Some(Arc::clone(p)), true),
            None if cfg.enabled && cfg.serve_smaller_from_larger => (plans.largest(), false),
            None => (None, false),
        };
        let planned_size = plan.as_ref().filter(|_| own).map(|p| p.size());
        // A dynamic run is recorded only when a plan will be learned from
        // it: a key with no plan of its own or predicted (a run served from
        // a larger key's plan records from where it leaves that plan).
        let record = cfg.enabled && !own;
        let dynamic = || {
            if record {
                arena.begin_recorded_run()
            } else {
                arena.begin_run()
            }
        };
        let run = match plan {
            Some(p) => match arena.begin_planned_run(p) {
                Ok(run) => run,
                Err(_) => dynamic(),
            },
            None => dynamic(),
        };
        if arena.is_recording_trace() {
            // Label the run by its key, as trace files label runs by shape.
            let label: Vec<String> = key.iter().map(ToString::to_string).collect();
            run.set_label(&label.join("x"));
        }
        let ctx = RunContext {
            run: &run,
            weights: &weights,
            key,
            refused: Cell::new(false),
        };
        let out = f(&ctx);
        // A run whose allocation was refused (out of memory, say) ended
        // early: its recording is not the key's need, so no plan is learned
        // from it, and the session stays as it was for the next run.
        let refused = ctx.refused.get();
        if !cfg.enabled {
            self.finish(key, run.finish());
            return out;
        }
        let (report, recording) = run.finish_with_recording();
        // A run served from a larger key's plan counts as dynamic in its
        // family, and teaches its key from its own recording.
        let lookup = if own {
            lookup
        } else {
            Lookup::none(match lookup.source {
                PlanSource::Dynamic(why) => why,
                _ => DynamicReason::Off,
            })
        };
        let report_for_family = if own {
            report
        } else {
            RunReport {
                planned: false,
                deviated: false,
                ..report
            }
        };
        let learnable = !refused && report.leaked_blocks == 0;
        match plans.after_run(key, &lookup, &report_for_family, &recording, learnable) {
            Some(plan) => {
                self.largest_plan = self.largest_plan.max(plan.size());
                if cfg.shrink_to_plans {
                    // Later runs of every shape seen are served from their
                    // plan's block: no more than the largest plan is needed.
                    arena.shrink_to(self.largest_plan);
                }
            }
            None => {
                if let Some(size) = planned_size {
                    self.largest_plan = self.largest_plan.max(size);
                }
            }
        }
        self.finish(key, report);
        out
    }

    /// Books a finished run.
    fn finish(&mut self, key: &[usize], report: RunReport) {
        self.runs += 1;
        self.last = Some(report);
        match self.keys.get_mut(key) {
            Some(n) => *n += 1,
            None => {
                self.keys.insert(key.into(), 1);
            }
        }
    }

    /// Prepares this session for `key`: if the family has a plan for it,
    /// reserves a free block of the plan's size now, so that the first run
    /// of `key` makes no backing call. Returns whether a plan was found.
    ///
    /// # Errors
    /// As [`Arena::reserve`].
    pub fn warm(&mut self, key: &[usize]) -> Result<bool, ArenaError> {
        match self.family.plans.get(key) {
            Some(plan) => self.arena.lock().reserve(plan.size()).map(|()| true),
            None => Ok(false),
        }
    }

    /// The plans this session's family has learned.
    pub fn plans(&self) -> &PlanCache<Box<[usize]>> {
        &self.family.plans
    }

    /// The weights new runs will use.
    pub fn weights(&self) -> Arc<Weights> {
        self.model.load()
    }

    /// The handle new runs read their weights from; swapping it reaches
    /// every clone of this session.
    pub fn model(&self) -> &ModelHandle {
        &self.model
    }

    /// Number of this session in its family: 0 for the original, then 1, 2...
    /// for clones in the order they were made (for logs).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The configuration.
    pub fn config(&self) -> SessionConfig {
        self.config
    }

    /// Gives the arena's cached memory back down to the recent runs'
    /// watermark; returns the bytes released.
    pub fn shrink(&mut self) -> usize {
        self.arena.lock().shrink()
    }

    /// Gives cached memory back until at most `bytes` stay reserved.
    pub fn shrink_to(&mut self, bytes: usize) -> usize {
        self.arena.lock().shrink_to(bytes)
    }

    /// The session's arena (for stats, or allocations outside runs), locked
    /// while the guard lives: derefs to [`Arena`]. Locked, a session is
    /// busy for its budget (see "Under a budget").
    pub fn arena(&self) -> SharedArenaGuard<'_, M> {
        self.arena.lock()
    }

    /// The budget this session commits under, if any.
    pub fn budget(&self) -> Option<&Arc<Budget>> {
        self.family.budget.as_ref()
    }

    /// Counters of this session.
    pub fn stats(&self) -> SessionStats {
        let weights = self.model.load();
        let (mapped, copied) = if weights.is_mapped() {
            (weights.total_bytes(), 0)
        } else {
            (0, weights.total_bytes())
        };
        SessionStats {
            arena: self.arena.stats(),
            runs: self.runs,
            keys: self.keys.len(),
            clones_alive: self.family.alive.load(Ordering::Relaxed),
            clones_created: self.family.created.load(Ordering::Relaxed),
            weight_bytes_mapped: mapped,
            weight_bytes_copied: copied,
            last_run: self.last,
            plans: self.family.plans.stats(),
        }
    }

    /// How many runs used `key`.
    pub fn runs_with_key(&self, key: &[usize]) -> u64 {
        self.keys.get(key).copied().unwrap_or(0)
    }

    /// Blocks still live in the arena (none outside a run, unless a block
    /// was leaked with `mem::forget`).
    pub fn live_blocks(&self) -> Vec<LiveBlock> {
        self.arena.lock().live_blocks()
    }
}

impl<M: HostMemory + Send + 'static> Clone for Session<M> {
    /// Same as [`Session::try_clone`].
    fn clone(&self) -> Self {
        self.try_clone()
    }
}

impl<M: HostMemory + Send + 'static> Drop for Session<M> {
    fn drop(&mut self) {
        self.family.alive.fetch_sub(1, Ordering::Relaxed);
        if cfg!(debug_assertions) {
            for b in self.arena.lock().live_blocks() {
                let at = b
                    .location
                    .map_or_else(|| "an unknown place".to_string(), |l| l.to_string());
                eprintln!(
                    "tensor-session: session dropped with a live block of {} bytes (run {:?}) allocated at {at}",
                    b.len, b.run
                );
            }
        }
    }
}

impl<M: HostMemory + Send + 'static> fmt::Debug for Session<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("runs", &self.runs)
            .field("arena", &self.arena.stats())
            .finish()
    }
}

/// What the closure of [`Session::run`] gets: the weights, buffer
/// allocation from the session's arena, and per-run scratch.
pub struct RunContext<'r, M: HostMemory = DefaultMemory> {
    run: &'r Run<'r, M>,
    weights: &'r Arc<Weights>,
    key: &'r [usize],
    /// Whether an allocation of this run was refused.
    refused: Cell<bool>,
}

impl<'r, M: HostMemory> RunContext<'r, M> {
    /// The weights of this run (fixed for the whole run, even if the model
    /// is swapped meanwhile).
    pub fn weights(&self) -> &'r Weights {
        self.weights
    }

    /// The key the run was started with.
    pub fn key(&self) -> &'r [usize] {
        self.key
    }

    /// A buffer of `bytes` from the session's arena, 64-byte aligned.
    ///
    /// # Errors
    /// See [`Arena::try_alloc`].
    #[track_caller]
    pub fn alloc(&self, bytes: usize) -> Result<Block<'r, M>, ArenaError> {
        self.note(self.run.try_alloc(bytes))
    }

    /// Notes a refusal (the run then teaches no plan) and passes `r` on.
    fn note<T>(&self, r: Result<T, ArenaError>) -> Result<T, ArenaError> {
        if r.is_err() {
            self.refused.set(true);
        }
        r
    }

    /// A buffer of `len` elements of `T` from the session's arena. Its
    /// values are unspecified (whatever a previous run left): kernels that
    /// overwrite their output need no zeroing; see
    /// [`RunContext::alloc_zeroed`] otherwise.
    ///
    /// # Errors
    /// See [`Arena::try_alloc_slice`].
    #[track_caller]
    pub fn alloc_slice<T: bytemuck::Pod>(
        &self,
        len: usize,
    ) -> Result<TypedBlock<'r, T, M>, ArenaError> {
        self.note(self.run.try_alloc_slice(len))
    }

    /// Like [`RunContext::alloc_slice`], with every element zero.
    ///
    /// # Errors
    /// See [`Arena::try_alloc_slice`].
    #[track_caller]
    pub fn alloc_zeroed<T: bytemuck::Pod>(
        &self,
        len: usize,
    ) -> Result<TypedBlock<'r, T, M>, ArenaError> {
        let mut buf = self.note(self.run.try_alloc_slice(len))?;
        buf.fill(T::zeroed());
        Ok(buf)
    }

    /// Scratch memory for small per-run data, reset when the run ends.
    pub fn scratch(&self) -> &'r Bump {
        self.run.scratch()
    }

    /// The session's arena.
    pub fn arena(&self) -> &'r Arena<M> {
        self.run.arena()
    }
}

/// Counters of one session ([`Session::stats`]) or summed over a pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionStats {
    /// The arena's counters (summed over sessions for a pool).
    pub arena: Stats,
    /// Runs finished.
    pub runs: u64,
    /// Distinct keys (input shapes) seen.
    pub keys: usize,
    /// Sessions of the family alive now (the original and its clones).
    pub clones_alive: usize,
    /// Sessions of the family ever made.
    pub clones_created: u64,
    /// Bytes of weights served from a memory map (counted once, however
    /// many clones share them).
    pub weight_bytes_mapped: usize,
    /// Bytes of weights held in owned memory (counted once).
    pub weight_bytes_copied: usize,
    /// The last run's report.
    pub last_run: Option<RunReport>,
    /// The family's plan cache counters (shared by all clones).
    pub plans: PlanStats,
}
