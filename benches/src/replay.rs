//! Whole runs of a [`Trace`] replayed by each [`Strategy`], with one write
//! per 4 KiB page of every buffer ([`Touch::Pages`]) or none
//! ([`Touch::Nothing`]).

use crate::pages::touch_raw;
use crate::peers::{replay_pool_len, PoolHeap, TalcHeap, TlsfHeap};
use crate::{touch_pages, Counters, Op, Strategy, Trace, TraceRun, ALIGN, PAGE};
use bumpalo::Bump;
use core::alloc::{GlobalAlloc, Layout};
use core::ops::DerefMut;
use core::ptr::NonNull;
use mimalloc::MiMalloc;
use std::alloc::System;
use std::collections::HashMap;
use std::sync::Arc;
use tensor_arena::{Arena, ArenaConfig, Plan, Run, RunReport, ScopedRun, SharedArena};
use tikv_jemallocator::Jemalloc;

/// Whether a replay writes to the buffers it is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Touch {
    /// One write per 4 KiB page of every buffer ([`touch_pages`]), as a
    /// real inference call would do.
    Pages,
    /// No write: the allocator's own cost only (the trace-order hot path).
    Nothing,
}

/// Replays whole runs, with page touches or without.
pub trait Replay {
    /// Replays one run: every buffer allocated, its pages touched, freed.
    fn run(&mut self, run: &TraceRun) {
        self.run_with(run, Touch::Pages);
    }

    /// Replays one run: every buffer allocated, touched as `touch` says,
    /// freed in the traced order.
    fn run_with(&mut self, run: &TraceRun, touch: Touch);

    /// Replays every run of `trace` in order.
    fn replay(&mut self, trace: &Trace) {
        for run in &trace.runs {
            self.run(run);
        }
    }

    /// What the strategy can tell about its memory.
    fn counters(&self) -> Counters {
        Counters::default()
    }
}

/// A [`Replay`] of `strategy` ready for the runs of `trace` (the bare loop
/// sizes its block, and bumpalo its chunk, from it). Nothing is warmed up.
pub fn replayer(strategy: Strategy, trace: &Trace) -> Box<dyn Replay> {
    match strategy {
        Strategy::Arena => Box::new(ArenaReplay {
            arena: Arena::new(ArenaConfig::default()),
        }),
        Strategy::Planned => Box::new(PlannedReplay {
            arena: Arena::new(ArenaConfig::default()),
            plans: HashMap::new(),
            largest: 0,
        }),
        Strategy::Shared => Box::new(SharedReplay {
            shared: SharedArena::new(ArenaConfig::default()),
        }),
        Strategy::System => Box::new(GlobalReplay(System)),
        Strategy::Mimalloc => Box::new(GlobalReplay(MiMalloc)),
        Strategy::Jemalloc => Box::new(GlobalReplay(Jemalloc)),
        Strategy::Bumpalo => Box::new(BumpReplay {
            // One chunk as large as the largest run: the best case for a bump
            // allocator (no chunk growth after the first run).
            bump: Bump::with_capacity(
                trace.max_naive() + trace.runs.iter().map(|r| r.slots).max().unwrap_or(0) * ALIGN,
            ),
        }),
        Strategy::Rlsf => Box::new(PeerReplay(TlsfHeap::new(peer_pool_len(trace)))),
        Strategy::Talc => Box::new(PeerReplay(TalcHeap::new(peer_pool_len(trace)))),
        Strategy::Bare => bare_replayer(&make_plans(trace), trace),
    }
}

/// An arena config for `policy`, otherwise the default.
pub fn config_with(policy: tensor_arena::ShrinkPolicy) -> ArenaConfig {
    ArenaConfig {
        shrink_policy: policy,
        ..ArenaConfig::default()
    }
}

/// Replays `run` in an open arena run: allocate, touch, free as traced.
///
/// # Panics
/// If an allocation fails.
pub fn replay_in(r: &Run<'_>, run: &TraceRun, touch: Touch) {
    replay_blocks(run, touch, |bytes| {
        r.try_alloc(bytes).expect("arena allocation failed")
    });
}

/// Replays `run` with blocks from `alloc`: each touched as `touch` says and
/// dropped (freed) where the trace frees it.
#[inline(always)]
fn replay_blocks<B: DerefMut<Target = [u8]>>(
    run: &TraceRun,
    touch: Touch,
    mut alloc: impl FnMut(usize) -> B,
) {
    let mut live: Vec<Option<B>> = Vec::with_capacity(run.slots);
    live.resize_with(run.slots, || None);
    for op in &run.ops {
        match *op {
            Op::Alloc { id, bytes } => {
                let mut block = alloc(bytes);
                if touch == Touch::Pages {
                    touch_pages(&mut block);
                }
                live[id as usize] = Some(block);
            }
            Op::Free { id } => live[id as usize] = None,
        }
    }
}

/// [`Strategy::Arena`].
pub struct ArenaReplay {
    /// The arena, public for tests of its counters.
    pub arena: Arena,
}

impl ArenaReplay {
    /// A replayer over an arena made with `config`.
    pub fn with_config(config: ArenaConfig) -> Self {
        Self {
            arena: Arena::new(config),
        }
    }
}

/// Replays `run` as one run of `arena` (allocate, touch, free as traced)
/// and returns the arena's report of it.
///
/// # Panics
/// If a run is already open or an allocation fails.
pub fn arena_run(arena: &Arena, run: &TraceRun) -> RunReport {
    arena_run_with(arena, run, Touch::Pages)
}

/// [`arena_run`], touching as `touch` says.
///
/// # Panics
/// If a run is already open or an allocation fails.
pub fn arena_run_with(arena: &Arena, run: &TraceRun, touch: Touch) -> RunReport {
    let r = arena.begin_run();
    replay_in(&r, run, touch);
    r.finish()
}

impl Replay for ArenaReplay {
    fn run_with(&mut self, run: &TraceRun, touch: Touch) {
        arena_run_with(&self.arena, run, touch);
    }

    fn counters(&self) -> Counters {
        let stats = self.arena.stats();
        Counters {
            backing_allocs: Some(stats.backing_allocs),
            reserved: Some(stats.reserved),
        }
    }
}

/// A plan for each distinct run label of `trace`, each made from a run of
/// that shape on a scratch arena (dropped before returning): the plans a
/// process would load at startup from an earlier one (`PlanCache::load`).
pub fn make_plans(trace: &Trace) -> HashMap<String, Arc<Plan>> {
    let scratch = Arena::new(ArenaConfig::default());
    let mut plans = HashMap::new();
    for run in &trace.runs {
        if plans.contains_key(&run.label) {
            continue;
        }
        let r = scratch.begin_recorded_run();
        replay_in(&r, run, Touch::Nothing);
        let (_, recording) = r.finish_with_recording();
        plans.insert(
            run.label.clone(),
            Arc::new(Plan::from_recording(&recording).expect("a recorded run plans")),
        );
    }
    plans
}

/// For each distinct run label of `trace`, the plan its family predicts
/// from every other label's run (leave one out: `PlanCache::after_run` of
/// the others' recordings, then `PlanCache::lookup` of the label), or the
/// label's own plan where none is predicted: what a run of a shape never
/// seen is served from. Returns the plans and how many were predicted.
pub fn make_predicted_plans(trace: &Trace) -> (HashMap<String, Arc<Plan>>, usize) {
    let exact = make_plans(trace);
    let mut plans = HashMap::new();
    let mut predicted = 0;
    for label in exact.keys() {
        let cache: tensor_arena::PlanCache<String> = tensor_arena::PlanCache::new(64);
        for (other, plan) in &exact {
            if other != label {
                let none = tensor_arena::Lookup::none(tensor_arena::DynamicReason::NewFamily);
                let report = tensor_arena::RunReport::default();
                cache.after_run(other.as_str(), &none, &report, &plan.recording(), true);
            }
        }
        let lookup = cache.lookup(label.as_str());
        let plan = match lookup.plan {
            Some(p) if lookup.source == tensor_arena::PlanSource::Predicted => {
                predicted += 1;
                p
            }
            _ => Arc::clone(&exact[label]),
        };
        plans.insert(label.clone(), plan);
    }
    (plans, predicted)
}

/// [`Strategy::Planned`] on a fresh arena that has `plans` before its first
/// run (from [`make_plans`]), so that no run of a known shape is dynamic.
pub fn preplanned_replayer(plans: HashMap<String, Arc<Plan>>) -> Box<dyn Replay> {
    let largest = plans.values().map(|p| p.size()).max().unwrap_or(0);
    Box::new(PlannedReplay {
        arena: Arena::new(ArenaConfig::default()),
        plans,
        largest,
    })
}

/// [`Strategy::Planned`].
struct PlannedReplay {
    arena: Arena,
    /// A plan per run label (the input shape), made from its first run.
    plans: HashMap<String, Arc<Plan>>,
    /// Size of the largest plan in `plans`.
    largest: usize,
}

impl Replay for PlannedReplay {
    fn run_with(&mut self, run: &TraceRun, touch: Touch) {
        match self.plans.get(&run.label) {
            Some(plan) => {
                let r = self
                    .arena
                    .begin_planned_run(Arc::clone(plan))
                    .expect("the plan's block could not be drawn");
                replay_in(&r, run, touch);
                r.finish();
            }
            None => {
                let r = self.arena.begin_recorded_run();
                replay_in(&r, run, touch);
                let (_, recording) = r.finish_with_recording();
                let plan = Plan::from_recording(&recording).expect("a recorded run plans");
                self.largest = self.largest.max(plan.size());
                self.plans.insert(run.label.clone(), Arc::new(plan));
                // As `Session` (`PlanConfig::shrink_to_plans`) and
                // `tensor-arena replay` do: every shape seen is now served
                // from its plan's block, so no more than the largest plan
                // is needed.
                self.arena.shrink_to(self.largest);
            }
        }
    }

    fn counters(&self) -> Counters {
        let stats = self.arena.stats();
        Counters {
            backing_allocs: Some(stats.backing_allocs),
            reserved: Some(stats.reserved),
        }
    }
}

/// [`Strategy::Planned`] with every run of a known shape a
/// [`ScopedRun`] (the arena held exclusively, the
/// blocks borrowing the run); the first run of a shape is recorded, as for
/// `planned`.
pub fn scoped_replayer() -> Box<dyn Replay> {
    Box::new(ScopedReplay(PlannedReplay {
        arena: Arena::new(ArenaConfig::default()),
        plans: HashMap::new(),
        largest: 0,
    }))
}

/// [`scoped_replayer`] on a fresh arena that has `plans` before its first
/// run (from [`make_plans`] or [`make_predicted_plans`]).
pub fn preplanned_scoped_replayer(plans: HashMap<String, Arc<Plan>>) -> Box<dyn Replay> {
    let largest = plans.values().map(|p| p.size()).max().unwrap_or(0);
    Box::new(ScopedReplay(PlannedReplay {
        arena: Arena::new(ArenaConfig::default()),
        plans,
        largest,
    }))
}

/// [`scoped_replayer`].
struct ScopedReplay(PlannedReplay);

impl Replay for ScopedReplay {
    fn run_with(&mut self, run: &TraceRun, touch: Touch) {
        let Some(plan) = self.0.plans.get(&run.label) else {
            // The first run of a shape: recorded, as `planned` does.
            return self.0.run_with(run, touch);
        };
        let r = self
            .0
            .arena
            .begin_scoped_run(plan)
            .expect("the plan's block could not be drawn");
        replay_scoped(&r, run, touch);
        r.finish();
    }

    fn counters(&self) -> Counters {
        self.0.counters()
    }
}

/// Replays `run` in the scoped run `r` (allocate, touch, free as traced).
fn replay_scoped(r: &ScopedRun<'_>, run: &TraceRun, touch: Touch) {
    replay_blocks(run, touch, |bytes| {
        r.try_alloc(bytes).expect("arena allocation failed")
    });
}

/// [`Strategy::Arena`] with every run a dynamic
/// [`ScopedRun`] (the arena held exclusively, the
/// blocks borrowing the run and named by their spans, no handles).
pub fn dynamic_scoped_replayer() -> Box<dyn Replay> {
    Box::new(DynamicScopedReplay(ArenaReplay {
        arena: Arena::new(ArenaConfig::default()),
    }))
}

/// [`dynamic_scoped_replayer`].
struct DynamicScopedReplay(ArenaReplay);

impl Replay for DynamicScopedReplay {
    fn run_with(&mut self, run: &TraceRun, touch: Touch) {
        let r = self
            .0
            .arena
            .begin_scoped_dynamic_run()
            .expect("no run is open");
        replay_scoped(&r, run, touch);
        r.finish();
    }

    fn counters(&self) -> Counters {
        self.0.counters()
    }
}

/// [`Strategy::Shared`].
struct SharedReplay {
    shared: SharedArena,
}

impl Replay for SharedReplay {
    fn run_with(&mut self, run: &TraceRun, touch: Touch) {
        let shared = &self.shared;
        replay_blocks(run, touch, |bytes| {
            shared.try_alloc(bytes).expect("allocation failed")
        });
    }

    fn counters(&self) -> Counters {
        let stats = self.shared.stats();
        Counters {
            backing_allocs: Some(stats.backing_allocs),
            reserved: Some(stats.reserved),
        }
    }
}

/// A `GlobalAlloc` used directly: [`Strategy::System`], [`Strategy::Mimalloc`],
/// [`Strategy::Jemalloc`].
struct GlobalReplay<G: GlobalAlloc>(G);

impl<G: GlobalAlloc> Replay for GlobalReplay<G> {
    fn run_with(&mut self, run: &TraceRun, touch: Touch) {
        let mut live: Vec<Option<(NonNull<u8>, Layout)>> = vec![None; run.slots];
        for op in &run.ops {
            match *op {
                Op::Alloc { id, bytes } => {
                    let layout = Layout::from_size_align(bytes, ALIGN).expect("valid layout");
                    // SAFETY: `layout` has a non-zero size (traced sizes are > 0).
                    let ptr = unsafe { self.0.alloc(layout) };
                    let ptr = NonNull::new(ptr).expect("allocation failed");
                    if touch == Touch::Pages {
                        // SAFETY: `ptr` was just allocated for `bytes` bytes and
                        // nothing else refers to it.
                        unsafe { touch_raw(ptr, bytes) };
                    }
                    live[id as usize] = Some((ptr, layout));
                }
                Op::Free { id } => {
                    if let Some((ptr, layout)) = live[id as usize].take() {
                        // SAFETY: `ptr` was allocated by this allocator with
                        // `layout` and is freed once (taken out of the table).
                        unsafe { self.0.dealloc(ptr.as_ptr(), layout) };
                    }
                }
            }
        }
        for (ptr, layout) in live.into_iter().flatten() {
            // SAFETY: as above: allocated here with `layout`, freed once.
            unsafe { self.0.dealloc(ptr.as_ptr(), layout) };
        }
    }
}

/// [`Strategy::Bumpalo`].
struct BumpReplay {
    bump: Bump,
}

impl Replay for BumpReplay {
    fn run_with(&mut self, run: &TraceRun, touch: Touch) {
        for bytes in run.allocs() {
            let layout = Layout::from_size_align(bytes, ALIGN).expect("valid layout");
            let ptr = self.bump.alloc_layout(layout);
            if touch == Touch::Pages {
                // SAFETY: `alloc_layout` returned `bytes` writable bytes that
                // no one else uses until the reset below.
                unsafe { touch_raw(ptr, bytes) };
            }
        }
        self.bump.reset();
    }
}

/// The [`Strategy::Bare`] loop for `trace`, at the offsets of `plans` (from
/// [`make_plans`]): one block as large as the largest plan, made resident
/// here; each buffer's pages are written at its planned offset. No
/// allocator runs: this is what a planned run costs without the arena.
///
/// # Panics
/// If a run's label has no plan, or a plan has fewer blocks than its run.
pub fn bare_replayer(plans: &HashMap<String, Arc<Plan>>, trace: &Trace) -> Box<dyn Replay> {
    let offsets: HashMap<String, Vec<usize>> = trace
        .runs
        .iter()
        .map(|run| {
            let plan = &plans[&run.label];
            let offsets = (0..run.slots)
                .map(|i| plan.offset(i).expect("a planned block per traced block"))
                .collect();
            (run.label.clone(), offsets)
        })
        .collect();
    let size = plans.values().map(|p| p.size()).max().unwrap_or(0);
    let mut block = PageBlock::zeroed(size.next_multiple_of(PAGE).max(PAGE));
    touch_pages(block.as_mut_slice());
    Box::new(BareReplay { block, offsets })
}

/// Zeroed memory starting on a page boundary, as an arena region does (a
/// `Vec<u8>` would start 16 bytes into its first page).
struct PageBlock {
    /// Valid for `len` bytes, zero-initialized, owned by this value alone.
    ptr: NonNull<u8>,
    len: usize,
}

impl PageBlock {
    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len, PAGE).expect("a valid block layout")
    }

    /// # Panics
    /// If `len` is zero or the memory cannot be had.
    fn zeroed(len: usize) -> Self {
        assert!(len > 0, "a bare block needs at least one page");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(Self::layout(len)) };
        let ptr = NonNull::new(ptr).expect("allocation failed");
        Self { ptr, len }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is valid for `len` initialized (zeroed) bytes that
        // only this value owns, and `&mut self` makes this the only access.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for PageBlock {
    fn drop(&mut self) {
        // SAFETY: `ptr` was allocated by the global allocator with this
        // layout, and is freed once (here).
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) };
    }
}

// SAFETY: `PageBlock` owns its memory exclusively (like a `Box<[u8]>`), so
// moving it to another thread is sound.
unsafe impl Send for PageBlock {}

/// [`Strategy::Bare`]: a resident block and the planned offsets of each run
/// shape's buffers.
struct BareReplay {
    block: PageBlock,
    /// Offset of each buffer (by slot), per run label.
    offsets: HashMap<String, Vec<usize>>,
}

impl Replay for BareReplay {
    fn run_with(&mut self, run: &TraceRun, touch: Touch) {
        let offsets = &self.offsets[&run.label];
        let block = self.block.as_mut_slice();
        for op in &run.ops {
            if let Op::Alloc { id, bytes } = *op {
                let at = offsets[id as usize];
                if touch == Touch::Pages {
                    touch_pages(&mut block[at..at + bytes]);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Hot path
// ---------------------------------------------------------------------------

/// The pool of a peer heap replaying `trace`: room for its largest run
/// with nothing reused (address space only; pages fault in as used).
fn peer_pool_len(trace: &Trace) -> usize {
    let slots = trace.runs.iter().map(|r| r.slots).max().unwrap_or(0);
    replay_pool_len(trace.max_naive() + slots * ALIGN)
}

/// [`Strategy::Rlsf`] and [`Strategy::Talc`]: a pool heap, freed in the
/// traced order.
struct PeerReplay<H: PoolHeap>(H);

impl<H: PoolHeap> Replay for PeerReplay<H> {
    fn run_with(&mut self, run: &TraceRun, touch: Touch) {
        let mut live: Vec<Option<(NonNull<u8>, Layout)>> = vec![None; run.slots];
        for op in &run.ops {
            match *op {
                Op::Alloc { id, bytes } => {
                    let layout = Layout::from_size_align(bytes, ALIGN).expect("valid layout");
                    let ptr = self.0.alloc(layout).expect("the pool is exhausted");
                    if touch == Touch::Pages {
                        // SAFETY: `ptr` was just allocated for `bytes` bytes
                        // and nothing else refers to it.
                        unsafe { touch_raw(ptr, bytes) };
                    }
                    live[id as usize] = Some((ptr, layout));
                }
                Op::Free { id } => {
                    if let Some((ptr, layout)) = live[id as usize].take() {
                        // SAFETY: allocated by this heap with `layout`, freed
                        // once (taken out of the table).
                        unsafe { self.0.free(ptr, layout) };
                    }
                }
            }
        }
        for (ptr, layout) in live.into_iter().flatten() {
            // SAFETY: as above: allocated here with `layout`, freed once.
            unsafe { self.0.free(ptr, layout) };
        }
    }
}
