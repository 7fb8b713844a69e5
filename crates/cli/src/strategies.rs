//! The strategies `replay` compares, and how each is set up.

use tensor_arena::allocator_api2::alloc::Global;
use tensor_arena::memory::{default_memory, HostMemory, HugePages, PagesConfig};
use tensor_arena::{
    Arena, ArenaConfig, Block, Deviation, DynamicReason, Heap, Lookup, PlanCache, PlanSource,
    PlanStore, Run, RunReport, ShrinkPolicy,
};

use crate::baselines::{pool_len, BumpBackend, GlobalAllocBackend, PoolAlloc, Talc, Tlsf};
use crate::replay::{
    replay, summarize, touch_slice, Backend, EndOfRun, PlanCounts, Progress, ShrinkMode,
    StrategyResult, Timeline, Touch,
};
use crate::workload::{Ev, Workload};

/// An allocation strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// `tensor_arena::Arena`: cached regions, best fit, coalescing.
    Arena,
    /// The arena with shape-keyed offset plans (`tensor_arena::plan`).
    Planned,
    /// `std::alloc::System`, one allocation per tensor.
    System,
    /// mimalloc, one allocation per tensor.
    Mimalloc,
    /// jemalloc, one allocation per tensor.
    Jemalloc,
    /// bumpalo, reset after each run.
    Bump,
    /// rlsf's TLSF over one pool sized from the workload.
    Rlsf,
    /// talc over one pool sized from the workload.
    Talc,
}

impl Strategy {
    /// Every strategy, in the order `all` runs them.
    pub const EACH: [Strategy; 6] = [
        Strategy::Arena,
        Strategy::Planned,
        Strategy::System,
        Strategy::Mimalloc,
        Strategy::Jemalloc,
        Strategy::Bump,
    ];

    /// Every strategy that has a name: [`EACH`](Self::EACH), then the
    /// ones run only when named (`--strategy rlsf,talc`): the constant-time
    /// general allocators over one pool.
    pub const NAMED: [Strategy; 8] = [
        Strategy::Arena,
        Strategy::Planned,
        Strategy::System,
        Strategy::Mimalloc,
        Strategy::Jemalloc,
        Strategy::Bump,
        Strategy::Rlsf,
        Strategy::Talc,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Arena => "arena",
            Strategy::Planned => "planned",
            Strategy::System => "system",
            Strategy::Mimalloc => "mimalloc",
            Strategy::Jemalloc => "jemalloc",
            Strategy::Bump => "bump",
            Strategy::Rlsf => "rlsf",
            Strategy::Talc => "talc",
        }
    }

    /// The strategy named `name` (as [`Strategy::name`] spells it).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::NAMED.into_iter().find(|s| s.name() == name)
    }

    /// What `reserved` means for it.
    pub fn reserved_is(self) -> &'static str {
        match self {
            Strategy::Arena | Strategy::Planned => RESERVED_ARENA,
            Strategy::System
            | Strategy::Mimalloc
            | Strategy::Jemalloc
            | Strategy::Rlsf
            | Strategy::Talc => RESERVED_RSS,
            Strategy::Bump => RESERVED_BUMP,
        }
    }
}

/// How the strategies are run.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// How buffers are written when handed out.
    pub touch: Touch,
    /// Shrink behaviour of the arena strategies.
    pub shrink: ShrinkMode,
    /// Cap on the arena strategies' reserved bytes.
    pub max_reserved: Option<usize>,
    /// Record a timeline for `--svg`.
    pub timeline: bool,
    /// How the arena's `Pages` layer asks for transparent huge pages.
    pub huge_pages: HugePages,
    /// The arena strategies' memory layer.
    pub memory: MemoryLayer,
}

/// The memory layer of the arena strategies (`--memory`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MemoryLayer {
    /// The default of `Arena::new`: `Pages` on Linux, `Heap` elsewhere.
    Default,
    /// `Heap`: regions from the global allocator (the default off Linux).
    Heap,
}

/// What `reserved` means for the arena strategies.
pub const RESERVED_ARENA: &str = "bytes the arena holds from its backing allocator (exact)";
/// What `reserved` means for the general-purpose allocators.
pub const RESERVED_RSS: &str =
    "growth of the process's resident memory (RSS, /proc/self/statm) over its baseline";
/// What `reserved` means for bumpalo.
pub const RESERVED_BUMP: &str = "bumpalo's allocated_bytes() after the reset that ends the run";

/// Replays `workload` with strategy `s`.
///
/// `store`: the plan store the `planned` strategy starts from and saves to
/// (`replay --plans DIR`); the other strategies ignore it.
pub fn run_strategy(
    s: Strategy,
    workload: &Workload,
    settings: Settings,
    store: Option<&PlanStore>,
    progress: &Progress,
) -> StrategyResult {
    let max_ids = workload.runs.iter().map(|r| r.allocs()).max().unwrap_or(0);
    match s {
        Strategy::Arena => replay_arena(s.name(), workload, settings, progress),
        Strategy::Planned => replay_planned(workload, settings, store, progress),
        Strategy::System => {
            let mut b = GlobalAllocBackend::new(std::alloc::System, max_ids);
            replay_with(s.name(), RESERVED_RSS, &mut b, workload, settings, progress)
        }
        Strategy::Mimalloc => {
            let mut b = GlobalAllocBackend::new(mimalloc::MiMalloc, max_ids);
            replay_with(s.name(), RESERVED_RSS, &mut b, workload, settings, progress)
        }
        Strategy::Jemalloc => {
            let mut b = GlobalAllocBackend::new(tikv_jemallocator::Jemalloc, max_ids);
            replay_with(s.name(), RESERVED_RSS, &mut b, workload, settings, progress)
        }
        Strategy::Rlsf => match PoolAlloc::<Tlsf>::new(peer_pool_len(workload)) {
            Ok(heap) => {
                let mut b = GlobalAllocBackend::new(heap, max_ids);
                replay_with(s.name(), RESERVED_RSS, &mut b, workload, settings, progress)
            }
            Err(e) => failed(s, e),
        },
        Strategy::Talc => match PoolAlloc::<Talc>::new(peer_pool_len(workload)) {
            Ok(heap) => {
                let mut b = GlobalAllocBackend::new(heap, max_ids);
                replay_with(s.name(), RESERVED_RSS, &mut b, workload, settings, progress)
            }
            Err(e) => failed(s, e),
        },
        Strategy::Bump => {
            let mut b = BumpBackend::new();
            replay_with(
                s.name(),
                RESERVED_BUMP,
                &mut b,
                workload,
                settings,
                progress,
            )
        }
    }
}

/// The pool of [`Strategy::Rlsf`] and [`Strategy::Talc`]: room for the
/// workload's largest run with nothing reused (address space only).
fn peer_pool_len(workload: &Workload) -> usize {
    let (naive, ids) = workload
        .runs
        .iter()
        .map(|r| {
            let naive: usize = r
                .events
                .iter()
                .map(|e| match *e {
                    Ev::Alloc { bytes, .. } => bytes,
                    Ev::Free { .. } => 0,
                })
                .sum();
            (naive, r.allocs())
        })
        .fold((0, 0), |(n, i), (rn, ri)| (n.max(rn), i.max(ri)));
    pool_len(naive, ids)
}

/// The result of a strategy that did not run (its pool was refused, or its
/// child process failed): no runs, and why.
pub(crate) fn failed(s: Strategy, error: String) -> StrategyResult {
    StrategyResult {
        name: s.name().to_owned(),
        reserved_is: s.reserved_is().to_owned(),
        note: None,
        error: Some(error),
        baseline_rss_bytes: None,
        peak_rss_bytes: None,
        runs: Vec::new(),
        summary: summarize(&[]),
        timeline: Timeline::default(),
    }
}

/// [`replay`] with the settings unpacked.
fn replay_with<B: Backend>(
    name: &str,
    reserved_is: &'static str,
    backend: &mut B,
    workload: &Workload,
    settings: Settings,
    progress: &Progress,
) -> StrategyResult {
    replay(
        name,
        reserved_is,
        backend,
        workload,
        settings.touch,
        settings.timeline,
        progress,
    )
}

/// The arena configuration for `settings`: defaults, plus the cap and the
/// shrink policy.
pub fn arena_config(settings: Settings) -> ArenaConfig {
    ArenaConfig {
        max_reserved: settings.max_reserved.unwrap_or(usize::MAX),
        shrink_policy: match settings.shrink {
            ShrinkMode::AfterRun => ShrinkPolicy::AfterEveryRun,
            ShrinkMode::Never | ShrinkMode::ManualAfterSmaller => ShrinkPolicy::Manual,
        },
        ..ArenaConfig::default()
    }
}

/// The `arena` strategy: a fresh `tensor_arena::Arena`, one run per
/// workload run, every tensor a `Block` dropped when it dies.
pub fn replay_arena(
    name: &str,
    workload: &Workload,
    settings: Settings,
    progress: &Progress,
) -> StrategyResult {
    replay_on_arena(name, workload, settings, progress, None)
}

/// The `planned` strategy: the arena with shape-keyed offset plans
/// (`tensor_arena::plan`). The first run of each label (input shape) runs on
/// the dynamic pool and is recorded; its plan then serves every later run
/// of that label from one block. After a plan is learned, the arena is
/// shrunk to the largest plan: every shape seen needs no more than that.
pub fn replay_planned(
    workload: &Workload,
    settings: Settings,
    store: Option<&PlanStore>,
    progress: &Progress,
) -> StrategyResult {
    replay_on_arena(
        Strategy::Planned.name(),
        workload,
        settings,
        progress,
        Some(store),
    )
}

/// Replays on a fresh arena, with plans (`planned` is `Some`: from and to
/// the store if one is given) or without.
fn replay_on_arena(
    name: &str,
    workload: &Workload,
    settings: Settings,
    progress: &Progress,
    planned: Option<Option<&PlanStore>>,
) -> StrategyResult {
    let pages = PagesConfig {
        huge_pages: settings.huge_pages,
        ..PagesConfig::default()
    };
    // `arena_config` sets only the cap (any value is valid) and a shrink
    // policy on the defaults: the configuration always validates.
    match settings.memory {
        MemoryLayer::Default => {
            let arena = Arena::with_memory(arena_config(settings), default_memory(pages))
                .expect("a valid arena configuration");
            replay_on(name, &arena, workload, settings, progress, planned)
        }
        MemoryLayer::Heap => {
            let arena = Arena::with_memory(arena_config(settings), Heap::new(Global))
                .expect("a valid arena configuration");
            replay_on(name, &arena, workload, settings, progress, planned)
        }
    }
}

/// [`replay_on_arena`] on `arena`.
fn replay_on<M: HostMemory>(
    name: &str,
    arena: &Arena<M>,
    workload: &Workload,
    settings: Settings,
    progress: &Progress,
    planned: Option<Option<&PlanStore>>,
) -> StrategyResult {
    let max_ids = workload.runs.iter().map(|r| r.allocs()).max().unwrap_or(0);
    let mut backend = ArenaBackend::new(arena, settings.shrink, max_ids);
    if let Some(store) = planned {
        let cache = PlanCache::new(256);
        // As `tensor-arena-ort`'s plans: refits are left to the time
        // between runs (`Backend::between_runs`), timed apart.
        cache.set_deferred_learning(true);
        // Learned between runs, before the next lookup: first plans too.
        cache.set_deferred_first_plans(true);
        if let Some(w) = store.and_then(|s| s.load(&cache).warning) {
            eprintln!("tensor-arena: {w}");
        }
        backend.plans = Some(Planner {
            cache,
            labels: workload.runs.iter().map(|r| r.label.clone()).collect(),
            next: 0,
            largest: 0,
            lookup: Lookup::none(DynamicReason::Off),
        });
    }
    let mut result = replay_with(
        name,
        RESERVED_ARENA,
        &mut backend,
        workload,
        settings,
        progress,
    );
    if let Some(p) = &backend.plans {
        result.summary.plans = Some(PlanCounts::of(&p.cache.stats().runs));
        // Saved after the last run, off the replay's clock.
        if let Some(Some(store)) = planned {
            if let Err(e) = store.save(&p.cache) {
                eprintln!("tensor-arena: cannot save the plan store: {e}");
            }
        }
    }
    drop(backend);
    debug_assert_eq!(arena.stats().in_use, 0);
    result
}

/// Plans of the `planned` strategy, by run label.
struct Planner {
    cache: PlanCache<String>,
    /// Label of every workload run, in order.
    labels: Vec<String>,
    /// Index of the next run.
    next: usize,
    /// Size of the largest plan learned.
    largest: usize,
    /// The open run's plan and where it came from.
    lookup: Lookup,
}

/// How a run was served, in words: `exact`, `predicted`, `fell back
/// (larger)`, `dynamic (new family)`...
pub fn served_as(source: PlanSource, report: &RunReport) -> String {
    let why = |d: Option<Deviation>| match d {
        Some(Deviation::Larger) => "larger",
        Some(Deviation::Extra) => "extra",
        Some(Deviation::Order) => "order",
        Some(Deviation::Short) | None => "short",
    };
    match source {
        PlanSource::Exact | PlanSource::Predicted if !report.planned => "dynamic (off)".into(),
        PlanSource::Exact if report.deviated => format!("exact, left ({})", why(report.deviation)),
        PlanSource::Exact => "exact".into(),
        PlanSource::Predicted if report.deviated => {
            format!("fell back ({})", why(report.deviation))
        }
        PlanSource::Predicted => "predicted".into(),
        PlanSource::Dynamic(r) => format!(
            "dynamic ({})",
            match r {
                DynamicReason::NewFamily => "new family",
                DynamicReason::OneShape => "one shape",
                DynamicReason::Unfit => "unfit",
                DynamicReason::Unpredictable => "unpredictable",
                DynamicReason::Unvaried => "unvaried dimension",
                DynamicReason::Unbounded => "unbounded",
                DynamicReason::Ambiguous => "ambiguous",
                DynamicReason::Off => "off",
            }
        ),
    }
}

/// Drives an [`Arena`]: each workload run is an arena run, each tensor a
/// [`Block`] dropped when the tensor dies.
struct ArenaBackend<'a, M: HostMemory> {
    arena: &'a Arena<M>,
    /// The open run, between `begin_run` and `end_run`.
    run: Option<Run<'a, M>>,
    /// Live blocks by id.
    blocks: Vec<Option<Block<'a, M>>>,
    shrink: ShrinkMode,
    /// Backing allocs + frees when the run began.
    backing_at_run_start: u64,
    /// Shape-keyed plans (the `planned` strategy only).
    plans: Option<Planner>,
}

impl<'a, M: HostMemory> ArenaBackend<'a, M> {
    /// A backend on `arena`, with room for runs of `max_ids` tensors.
    fn new(arena: &'a Arena<M>, shrink: ShrinkMode, max_ids: usize) -> Self {
        Self {
            arena,
            run: None,
            blocks: Vec::with_capacity(max_ids),
            shrink,
            backing_at_run_start: 0,
            plans: None,
        }
    }

    /// Calls to the memory layer so far: reservations, releases, commits
    /// and decommits.
    fn backing_calls(&self) -> u64 {
        self.arena.stats().memory_calls()
    }
}

impl<M: HostMemory> Backend for ArenaBackend<'_, M> {
    fn begin_run(&mut self, ids: usize) {
        self.blocks.clear();
        self.blocks.resize_with(ids, || None);
        self.backing_at_run_start = self.backing_calls();
        let plan = self.plans.as_mut().and_then(|p| {
            let label = p.labels.get(p.next)?;
            p.next += 1;
            p.lookup = p.cache.lookup(label.as_str());
            p.lookup.plan.clone()
        });
        // Only a shape with no plan yet is recorded (its plan is learned).
        let record = self.plans.is_some() && plan.is_none();
        let run = match plan {
            Some(plan) => self.arena.begin_planned_run(plan).ok(),
            None => None,
        };
        self.run = Some(run.unwrap_or_else(|| {
            if record {
                self.arena.begin_recorded_run()
            } else {
                self.arena.begin_run()
            }
        }));
    }

    fn alloc(&mut self, id: usize, bytes: usize, touch: Touch) -> Result<(), String> {
        let run = self.run.as_ref().ok_or("no run open")?;
        let mut block = run.try_alloc(bytes).map_err(|e| e.to_string())?;
        touch_slice(&mut block, touch);
        self.blocks[id] = Some(block);
        Ok(())
    }

    fn free(&mut self, id: usize) {
        self.blocks[id] = None;
    }

    fn abort_run(&mut self) {
        self.blocks.clear();
    }

    fn end_run(&mut self, smaller: bool) -> EndOfRun {
        let (report, recording) = self
            .run
            .take()
            .map(Run::finish_with_recording)
            .unwrap_or_default();
        let mut served = None;
        if let Some(p) = &mut self.plans {
            let label = p
                .labels
                .get(p.next.wrapping_sub(1))
                .map_or("", |l| l.as_str());
            // A run that leaked keeps blocks its recording does not free:
            // it teaches nothing.
            let learned = p.cache.after_run(
                label,
                &p.lookup,
                &report,
                &recording,
                report.leaked_blocks == 0,
            );
            if let Some(plan) = learned {
                p.largest = p.largest.max(plan.size());
                // Every shape seen is now served from its plan's block.
                self.arena.shrink_to(p.largest);
            }
            served = Some(served_as(p.lookup.source, &report));
        }
        if self.shrink == ShrinkMode::ManualAfterSmaller && smaller {
            self.arena.shrink();
        }
        EndOfRun {
            peak_in_use: report.peak_in_use as u64,
            reserved: Some(self.arena.stats().reserved as u64),
            backing_calls: Some(self.backing_calls() - self.backing_at_run_start),
            plan: served,
            high_water: Some(report.high_water as u64),
        }
    }

    fn between_runs(&mut self) -> std::time::Duration {
        match &mut self.plans {
            Some(p) if p.cache.owes() => {
                let t = std::time::Instant::now();
                p.cache.learn();
                // The last run's own plan, if it was left to this.
                let label = p
                    .labels
                    .get(p.next.wrapping_sub(1))
                    .map_or("", |l| l.as_str());
                if let Some(plan) = p.cache.peek(label) {
                    if plan.size() > p.largest {
                        p.largest = plan.size();
                        self.arena.shrink_to(p.largest);
                    }
                }
                t.elapsed()
            }
            _ => std::time::Duration::ZERO,
        }
    }

    fn in_use(&self) -> u64 {
        self.arena.stats().in_use as u64
    }

    fn reserved(&self) -> Option<u64> {
        Some(self.arena.stats().reserved as u64)
    }
}
