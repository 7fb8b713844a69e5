//! Shared helpers for the benchmarks: traces (read by [`tensor_arena::trace`],
//! renumbered for fast replay), page touches,
//! fault and resident-memory counters, and the allocation strategies every
//! group compares.
//!
//! The strategies ([`Strategy`]) are driven two ways:
//!
//! - [`Pairs`]: allocate-and-free pairs, one block at a time (the hot path);
//! - [`Replay`]: whole runs of a [`Trace`], with one write per 4 KiB page of
//!   every buffer ([`touch_pages`]), as a real inference call would do.
//!
//! All unsafe code of the benchmarks is here: the libc calls
//! (`getrusage`, `malloc_trim`), the raw-pointer allocators (the
//! `GlobalAlloc` implementations and bumpalo) and the bare loop's
//! page-aligned block.

use bumpalo::Bump;
use core::alloc::{GlobalAlloc, Layout};
use core::hint::black_box;
use core::ptr::NonNull;
use mimalloc::MiMalloc;
use std::alloc::System;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tensor_arena::{Arena, ArenaConfig, Block, Plan, Run, RunReport, SharedArena, SharedBlock};
use tikv_jemallocator::Jemalloc;

// ---------------------------------------------------------------------------
// Traces
// ---------------------------------------------------------------------------

/// One event of a traced run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Tensor `id` is created with `bytes` bytes.
    Alloc {
        /// Slot of the tensor: ids are renumbered `0..slots` in allocation order.
        id: u32,
        /// Size in bytes (> 0).
        bytes: usize,
    },
    /// Tensor `id` is dead.
    Free {
        /// An id allocated earlier in the same run.
        id: u32,
    },
}

/// One inference call of a trace.
#[derive(Clone, Debug, Default)]
pub struct TraceRun {
    /// The `run` line's label: the main input's shape.
    pub label: String,
    /// The run's allocations and frees, in order.
    pub ops: Vec<Op>,
    /// Number of tensors; ids are `0..slots`.
    pub slots: usize,
}

impl TraceRun {
    /// The most bytes live at once: no allocator can use less.
    pub fn lower_bound(&self) -> usize {
        let mut sizes = vec![0usize; self.slots];
        let (mut live, mut peak) = (0usize, 0usize);
        for op in &self.ops {
            match *op {
                Op::Alloc { id, bytes } => {
                    sizes[id as usize] = bytes;
                    live += bytes;
                    peak = peak.max(live);
                }
                Op::Free { id } => live -= sizes[id as usize],
            }
        }
        peak
    }

    /// The sum of all allocation sizes (nothing reused).
    pub fn naive(&self) -> usize {
        self.allocs().sum()
    }

    /// The sizes allocated, in order.
    pub fn allocs(&self) -> impl Iterator<Item = usize> + '_ {
        self.ops.iter().filter_map(|op| match *op {
            Op::Alloc { bytes, .. } => Some(bytes),
            Op::Free { .. } => None,
        })
    }

    /// Page writes a replay of the run does ([`touch_pages`] on each buffer).
    pub fn page_touches(&self) -> usize {
        self.allocs().map(|b| b.div_ceil(PAGE)).sum()
    }
}

/// A trace file: several runs of one model (format in `traces/README.md`).
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// The file name without `.trace`.
    pub name: String,
    /// The runs in file order.
    pub runs: Vec<TraceRun>,
}

impl Trace {
    /// The runs of a trace parsed by [`tensor_arena::trace`], with ids
    /// renumbered densely per run (in allocation order) for table lookups.
    ///
    /// # Panics
    /// If a run holds more than `u32::MAX` allocations.
    pub fn from_parsed(name: &str, parsed: &tensor_arena::trace::Trace) -> Trace {
        use tensor_arena::trace::Event;
        let runs = parsed
            .runs
            .iter()
            .map(|run| {
                let mut slots: HashMap<u64, u32> = HashMap::new();
                let ops = run
                    .events
                    .iter()
                    .map(|event| match *event {
                        Event::Alloc { id, bytes } => {
                            let slot = u32::try_from(slots.len()).expect("fewer than 2^32 tensors");
                            slots.insert(id, slot);
                            Op::Alloc {
                                id: slot,
                                bytes: usize::try_from(bytes).expect("a size that fits usize"),
                            }
                        }
                        // A parsed trace frees only live ids.
                        Event::Free { id } => Op::Free { id: slots[&id] },
                    })
                    .collect();
                TraceRun {
                    label: run.label.clone(),
                    ops,
                    slots: slots.len(),
                }
            })
            .collect();
        Trace {
            name: name.to_owned(),
            runs,
        }
    }

    /// Loads `<name>.trace` from [`traces_dir`] with [`tensor_arena::trace`].
    ///
    /// # Panics
    /// If the file cannot be read or is malformed: the traces are checked
    /// inputs, and a bench should stop loudly rather than measure garbage.
    pub fn load(name: &str) -> Trace {
        let path = traces_dir().join(format!("{name}.trace"));
        let parsed = tensor_arena::trace::Trace::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
        Trace::from_parsed(name, &parsed)
    }

    /// The lower bound of the trace: the largest lower bound of its runs.
    pub fn lower_bound(&self) -> usize {
        self.runs
            .iter()
            .map(TraceRun::lower_bound)
            .max()
            .unwrap_or(0)
    }

    /// The largest naive footprint of its runs.
    pub fn max_naive(&self) -> usize {
        self.runs.iter().map(TraceRun::naive).max().unwrap_or(0)
    }
}

/// Where the traces are: `$TRACES_DIR`, else the workspace's `traces/`.
pub fn traces_dir() -> PathBuf {
    match std::env::var_os("TRACES_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces"),
    }
}

/// The names of every trace file, sorted.
///
/// # Panics
/// If the traces directory cannot be read.
pub fn trace_names() -> Vec<String> {
    let dir = traces_dir();
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".trace").map(str::to_owned)
        })
        .collect();
    names.sort();
    names
}

/// `n` allocation sizes drawn from every single-shape trace (the `-mixed`
/// files repeat them), between 1 KiB and 50 MiB, in a fixed pseudo-random
/// order (the same on every call).
pub fn hot_path_sizes(n: usize) -> Vec<usize> {
    let pool: Vec<usize> = trace_names()
        .iter()
        .filter(|name| !name.ends_with("-mixed"))
        .flat_map(|name| {
            let trace = Trace::load(name);
            trace
                .runs
                .iter()
                .flat_map(|r| r.allocs().collect::<Vec<_>>())
                .collect::<Vec<_>>()
        })
        .filter(|&b| (1 << 10..=50 << 20).contains(&b))
        .collect();
    assert!(!pool.is_empty(), "no trace sizes in 1 KiB..50 MiB");
    // A fixed LCG (Knuth's MMIX constants): deterministic, no dependency.
    let mut state: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) as usize
    };
    let len = pool.len();
    (0..n).map(|_| pool[next() % len]).collect()
}

// ---------------------------------------------------------------------------
// Pages, faults, resident memory
// ---------------------------------------------------------------------------

/// The page size the benches touch at (x86-64 Linux base pages).
pub const PAGE: usize = 4096;

/// Writes one byte in every 4 KiB of `buf` (at offsets 0, 4096, ...), as a
/// kernel writing its output would first touch each page. The writes are
/// volatile, so the compiler cannot drop them before a free.
pub fn touch_pages(buf: &mut [u8]) {
    for byte in buf.iter_mut().step_by(PAGE) {
        // SAFETY: `byte` is a valid, exclusive `&mut u8`.
        unsafe { core::ptr::write_volatile(byte, 1) };
    }
}

/// [`touch_pages`] on raw memory.
///
/// # Safety
/// - `ptr` must be valid for writes of `len` bytes;
/// - no other reference may access those bytes during the call.
unsafe fn touch_raw(ptr: NonNull<u8>, len: usize) {
    // SAFETY: the caller guarantees `ptr..ptr+len` is writable and not
    // aliased; `u8` has no invalid values, so a slice over it is sound even if
    // the bytes were never initialized by Rust (they are only written).
    let buf = unsafe { core::slice::from_raw_parts_mut(ptr.as_ptr(), len) };
    touch_pages(buf);
}

/// Minor page faults of this process so far (`getrusage(RUSAGE_SELF)`).
///
/// # Panics
/// If `getrusage` fails (it cannot with these arguments).
pub fn minor_faults() -> u64 {
    let mut usage = core::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `RUSAGE_SELF` is a valid `who`, and `usage` points to writable
    // memory of the right type and size for the call to fill.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    assert_eq!(rc, 0, "getrusage failed");
    // SAFETY: `getrusage` returned 0, so it filled the struct (which was also
    // zero-initialized, a valid value for this plain C struct).
    let usage = unsafe { usage.assume_init() };
    u64::try_from(usage.ru_minflt).unwrap_or(0)
}

/// A field of `/proc/self/status` in bytes (`VmRSS`, `VmHWM`...), or
/// `None` off Linux.
pub fn proc_status_bytes(field: &str) -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status
        .lines()
        .find(|l| l.split(':').next() == Some(field))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Resident memory now (`VmRSS`).
pub fn rss_bytes() -> Option<usize> {
    proc_status_bytes("VmRSS")
}

/// Peak resident memory (`VmHWM`) since the process started or the last
/// [`reset_peak_rss`].
pub fn peak_rss_bytes() -> Option<usize> {
    proc_status_bytes("VmHWM")
}

/// Gives the C heap's free memory back to the OS (glibc `malloc_trim(0)`),
/// so that memory freed earlier is not counted in a later RSS baseline and
/// then silently reused. Returns whether anything was released.
pub fn trim_heap() -> bool {
    // SAFETY: `malloc_trim` only walks glibc's own heap state; it has no
    // preconditions and may be called at any time.
    unsafe { libc::malloc_trim(0) != 0 }
}

/// Resets `VmHWM` to the current RSS (writes `5` to `/proc/self/clear_refs`);
/// returns whether the kernel allowed it.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

// ---------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------

/// Alignment every strategy is asked for (the arena's default granule).
pub const ALIGN: usize = 64;

/// An allocation strategy under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// [`Arena`] with the default configuration, blocks inside runs.
    Arena,
    /// [`Arena`] with a [`Plan`] per run shape: the first run of a shape is
    /// dynamic and recorded; later runs of it are served by the plan. After
    /// learning a plan the arena shrinks to the largest plan, as `Session`
    /// does by default.
    Planned,
    /// [`SharedArena`], one thread: every allocation and free takes the lock.
    /// `SharedArena` has no run API, so its blocks are outside runs.
    Shared,
    /// `std::alloc::System` (glibc malloc) through `GlobalAlloc`.
    System,
    /// `mimalloc::MiMalloc` through `GlobalAlloc` (not as the global allocator).
    Mimalloc,
    /// `tikv_jemallocator::Jemalloc` through `GlobalAlloc`.
    Jemalloc,
    /// `bumpalo::Bump`, reset after each run (it cannot free single blocks).
    Bumpalo,
    /// Not an allocator: the same page writes into one block that stays
    /// resident, each buffer at the offset the planner gives it. The
    /// physical limit of a replay ([`bare_replayer`]).
    Bare,
}

impl Strategy {
    /// Every strategy, baselines after the arena's.
    pub const ALL: [Strategy; 8] = [
        Strategy::Arena,
        Strategy::Planned,
        Strategy::Shared,
        Strategy::System,
        Strategy::Mimalloc,
        Strategy::Jemalloc,
        Strategy::Bumpalo,
        Strategy::Bare,
    ];

    /// The allocators (every strategy but [`Strategy::Bare`]).
    pub const ALLOCATORS: [Strategy; 7] = [
        Strategy::Arena,
        Strategy::Planned,
        Strategy::Shared,
        Strategy::System,
        Strategy::Mimalloc,
        Strategy::Jemalloc,
        Strategy::Bumpalo,
    ];

    /// Short name, as in benchmark ids.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Arena => "arena",
            Strategy::Planned => "planned",
            Strategy::Shared => "shared",
            Strategy::System => "system",
            Strategy::Mimalloc => "mimalloc",
            Strategy::Jemalloc => "jemalloc",
            Strategy::Bumpalo => "bumpalo",
            Strategy::Bare => "bare",
        }
    }

    /// The strategy called `name`.
    pub fn from_name(name: &str) -> Option<Strategy> {
        Strategy::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Whether this is one of the general-purpose baselines the arena must
    /// beat (system, mimalloc, jemalloc, bumpalo).
    pub fn is_baseline(self) -> bool {
        matches!(
            self,
            Strategy::System | Strategy::Mimalloc | Strategy::Jemalloc | Strategy::Bumpalo
        )
    }
}

/// Counters a strategy can report after replays.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Regions drawn from the backing allocator so far (arena strategies).
    pub backing_allocs: Option<u64>,
    /// Bytes reserved now (arena strategies).
    pub reserved: Option<usize>,
}

/// Replays whole runs with page touches.
pub trait Replay {
    /// Replays one run: every buffer allocated, its pages touched, freed.
    fn run(&mut self, run: &TraceRun);

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
fn replay_in<'a>(r: &Run<'a>, run: &TraceRun) {
    let mut live: Vec<Option<Block<'a>>> = Vec::with_capacity(run.slots);
    live.resize_with(run.slots, || None);
    for op in &run.ops {
        match *op {
            Op::Alloc { id, bytes } => {
                let mut block = r.try_alloc(bytes).expect("arena allocation failed");
                touch_pages(&mut block);
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
    let r = arena.begin_run();
    replay_in(&r, run);
    r.finish()
}

impl Replay for ArenaReplay {
    fn run(&mut self, run: &TraceRun) {
        arena_run(&self.arena, run);
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
        let r = scratch.begin_run();
        replay_in(&r, run);
        let (_, recording) = r.finish_with_recording();
        plans.insert(
            run.label.clone(),
            Arc::new(Plan::from_recording(&recording).expect("a recorded run plans")),
        );
    }
    plans
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
    fn run(&mut self, run: &TraceRun) {
        match self.plans.get(&run.label) {
            Some(plan) => {
                let r = self
                    .arena
                    .begin_planned_run(Arc::clone(plan))
                    .expect("the plan's block could not be drawn");
                replay_in(&r, run);
                r.finish();
            }
            None => {
                let r = self.arena.begin_run();
                replay_in(&r, run);
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

/// [`Strategy::Shared`].
struct SharedReplay {
    shared: SharedArena,
}

impl Replay for SharedReplay {
    fn run(&mut self, run: &TraceRun) {
        let mut live: Vec<Option<SharedBlock<'_>>> = Vec::with_capacity(run.slots);
        live.resize_with(run.slots, || None);
        for op in &run.ops {
            match *op {
                Op::Alloc { id, bytes } => {
                    let mut block = self.shared.try_alloc(bytes).expect("allocation failed");
                    touch_pages(&mut block);
                    live[id as usize] = Some(block);
                }
                Op::Free { id } => live[id as usize] = None,
            }
        }
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
    fn run(&mut self, run: &TraceRun) {
        let mut live: Vec<Option<(NonNull<u8>, Layout)>> = vec![None; run.slots];
        for op in &run.ops {
            match *op {
                Op::Alloc { id, bytes } => {
                    let layout = Layout::from_size_align(bytes, ALIGN).expect("valid layout");
                    // SAFETY: `layout` has a non-zero size (traced sizes are > 0).
                    let ptr = unsafe { self.0.alloc(layout) };
                    let ptr = NonNull::new(ptr).expect("allocation failed");
                    // SAFETY: `ptr` was just allocated for `bytes` bytes and
                    // nothing else refers to it.
                    unsafe { touch_raw(ptr, bytes) };
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
    fn run(&mut self, run: &TraceRun) {
        for bytes in run.allocs() {
            let layout = Layout::from_size_align(bytes, ALIGN).expect("valid layout");
            let ptr = self.bump.alloc_layout(layout);
            // SAFETY: `alloc_layout` returned `bytes` writable bytes that no
            // one else uses until the reset below.
            unsafe { touch_raw(ptr, bytes) };
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
    fn run(&mut self, run: &TraceRun) {
        let offsets = &self.offsets[&run.label];
        let block = self.block.as_mut_slice();
        for op in &run.ops {
            if let Op::Alloc { id, bytes } = *op {
                let at = offsets[id as usize];
                touch_pages(&mut block[at..at + bytes]);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Hot path
// ---------------------------------------------------------------------------

/// Allocate-and-free pairs, one block at a time, no page touched.
///
/// `Send`, so that a worker thread can own one (the contention group).
pub trait Pairs: Send {
    /// One allocation and its free for each of `sizes`, in order.
    fn pairs(&mut self, sizes: &[usize]);
}

/// A [`Pairs`] of `strategy` for the batch `sizes` (the planned strategy
/// records the batch once, dynamically, to make its plan). Returns `None`
/// for [`Strategy::Bare`], which does not allocate.
pub fn pairs(strategy: Strategy, sizes: &[usize]) -> Option<Box<dyn Pairs>> {
    Some(match strategy {
        Strategy::Arena => Box::new(ArenaPairs {
            arena: Arena::new(ArenaConfig::default()),
            in_run: true,
        }),
        Strategy::Planned => {
            let arena = Arena::new(ArenaConfig::default());
            let r = arena.begin_run();
            for &len in sizes {
                black_box(r.try_alloc(len).expect("allocation failed"));
            }
            let (_, recording) = r.finish_with_recording();
            let plan = Arc::new(Plan::from_recording(&recording).expect("a recorded run plans"));
            Box::new(PlannedPairs { arena, plan })
        }
        Strategy::Shared => shared_pairs(Arc::new(SharedArena::new(ArenaConfig::default()))),
        Strategy::System => Box::new(GlobalPairs(System)),
        Strategy::Mimalloc => Box::new(GlobalPairs(MiMalloc)),
        Strategy::Jemalloc => Box::new(GlobalPairs(Jemalloc)),
        Strategy::Bumpalo => Box::new(BumpPairs { bump: Bump::new() }),
        Strategy::Bare => return None,
    })
}

/// Arena pairs outside any run (what [`Strategy::Shared`] does, without the
/// lock).
pub fn arena_pairs_outside_runs() -> Box<dyn Pairs> {
    Box::new(ArenaPairs {
        arena: Arena::new(ArenaConfig::default()),
        in_run: false,
    })
}

/// [`Strategy::Arena`] pairs: the batch is one run (or no run at all).
struct ArenaPairs {
    arena: Arena,
    in_run: bool,
}

impl Pairs for ArenaPairs {
    fn pairs(&mut self, sizes: &[usize]) {
        if self.in_run {
            let r = self.arena.begin_run();
            for &len in sizes {
                black_box(r.try_alloc(len).expect("allocation failed"));
            }
            r.finish();
        } else {
            for &len in sizes {
                black_box(self.arena.try_alloc(len).expect("allocation failed"));
            }
        }
    }
}

/// [`Strategy::Planned`] pairs: the batch is one planned run.
struct PlannedPairs {
    arena: Arena,
    plan: Arc<Plan>,
}

impl Pairs for PlannedPairs {
    fn pairs(&mut self, sizes: &[usize]) {
        let r = self
            .arena
            .begin_planned_run(Arc::clone(&self.plan))
            .expect("the plan's block could not be drawn");
        for &len in sizes {
            black_box(r.try_alloc(len).expect("allocation failed"));
        }
        r.finish();
    }
}

/// Pairs on `shared`, which other threads may use at the same time: two
/// lock acquisitions per pair.
pub fn shared_pairs(shared: Arc<SharedArena>) -> Box<dyn Pairs> {
    Box::new(SharedPairs { shared })
}

/// [`Strategy::Shared`] pairs.
struct SharedPairs {
    shared: Arc<SharedArena>,
}

impl Pairs for SharedPairs {
    fn pairs(&mut self, sizes: &[usize]) {
        for &len in sizes {
            black_box(self.shared.try_alloc(len).expect("allocation failed"));
        }
    }
}

/// A `GlobalAlloc` used directly.
struct GlobalPairs<G: GlobalAlloc>(G);

impl<G: GlobalAlloc + Send> Pairs for GlobalPairs<G> {
    fn pairs(&mut self, sizes: &[usize]) {
        for &len in sizes {
            let layout = Layout::from_size_align(len, ALIGN).expect("valid layout");
            // SAFETY: `layout` has a non-zero size (sizes are >= 1 KiB).
            let ptr = unsafe { self.0.alloc(layout) };
            assert!(!ptr.is_null(), "allocation failed");
            // SAFETY: `ptr` was allocated by this allocator with `layout`,
            // and is freed once.
            unsafe { self.0.dealloc(black_box(ptr), layout) };
        }
    }
}

/// [`Strategy::Bumpalo`] pairs: allocations, one reset per batch (a bump
/// allocator's "free").
struct BumpPairs {
    bump: Bump,
}

impl Pairs for BumpPairs {
    fn pairs(&mut self, sizes: &[usize]) {
        for &len in sizes {
            let layout = Layout::from_size_align(len, ALIGN).expect("valid layout");
            black_box(self.bump.alloc_layout(layout));
        }
        self.bump.reset();
    }
}

// ---------------------------------------------------------------------------
// Reporting
// ---------------------------------------------------------------------------

/// The criterion configuration of every group: no HTML plots (drawing them
/// with the plotters backend costs seconds per benchmark on this machine,
/// more than most measurements). Pass `--plotting-backend plotters` (or
/// `gnuplot`) after `--` to get them back.
pub fn criterion() -> criterion::Criterion {
    criterion::Criterion::default().without_plots()
}

/// Bytes as MiB with two decimals.
pub fn mib(bytes: usize) -> String {
    format!("{:.2}", bytes as f64 / (1024.0 * 1024.0))
}

/// The median of `values` (sorted in place); 0 for none.
pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_bounds_match_reference() {
        let t = Trace::load("densenet121-mixed");
        assert_eq!(t.runs.len(), 6);
        assert_eq!(t.runs[0].label, "16x3x224x224");
        // traces/REFERENCE.md: exact lower bounds per shape.
        assert_eq!(t.runs[0].lower_bound(), 134_873_088);
        assert_eq!(t.runs[1].lower_bound(), 8_429_568);
        assert_eq!(t.runs[0].naive(), 5_127_715_328);
        assert_eq!(t.lower_bound(), 134_873_088);
    }

    #[test]
    fn hot_path_sizes_are_in_range_and_fixed() {
        let a = hot_path_sizes(256);
        assert_eq!(a, hot_path_sizes(256));
        assert!(a.iter().all(|&s| (1024..=50 << 20).contains(&s)));
    }

    #[test]
    fn touch_writes_one_byte_per_page() {
        let mut buf = vec![0u8; 3 * PAGE + 1];
        touch_pages(&mut buf);
        assert_eq!(buf.iter().filter(|&&b| b == 1).count(), 4);
    }

    #[test]
    fn every_strategy_replays_a_small_trace() {
        let t = Trace::load("silero-vad-mixed");
        for s in Strategy::ALL {
            let mut r = replayer(s, &t);
            r.replay(&t);
            r.replay(&t);
        }
        for s in Strategy::ALLOCATORS {
            let sizes = hot_path_sizes(16);
            let mut p = pairs(s, &sizes).unwrap();
            p.pairs(&sizes);
        }
        assert!(minor_faults() > 0);
    }
}
