//! One worker's arena ([`Slot`]), the thread-local pointer that routes a
//! thread's `Alloc`/`Free` calls to it while the worker runs, and the way a
//! block freed elsewhere finds its way back.
//!
//! | who frees                                   | path                                      |
//! |---------------------------------------------|-------------------------------------------|
//! | the running worker's thread, during its run | direct, no lock (the run holds the core)  |
//! | anyone, the core unlocked                   | `try_lock` the core, free                 |
//! | anyone, the owner running elsewhere         | queue the pointer; the owner frees it at its run's start or end |
//! | anyone, after the worker was dropped        | lock the core, free; the last block drops the slot and its arena |

use crate::block::{Header, ALIGN, HEADER};
use crate::forklock::{hold, ForkMutex};
use arc_swap::ArcSwap;
use parking_lot::{Mutex, MutexGuard};
use std::cell::Cell;
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use tensor_arena::memory::{default_memory, Budgeted, ErrorCode, PagesConfig};
use tensor_arena::{
    Arena, ArenaConfig, ArenaError, Block, Budget, Plan, Reclaim, Recording, RunReport, Stats,
};

/// One worker's arena and the blocks it has handed to ONNX Runtime.
pub(crate) struct Slot {
    /// Id for stats (1, 2, ... in creation order).
    pub(crate) id: u64,
    /// The arena. Locked by the worker for a whole run (once per run, not per
    /// allocation) and by frees from elsewhere.
    core: Mutex<Core>,
    /// Frees from other threads while the core was locked.
    pending: Mutex<Pending>,
    /// Set in a forked child on a slot whose lock a thread of the parent
    /// held at the fork: never locked again; a block freed into it is
    /// left where it is (as the parent's runs' blocks are).
    orphan: AtomicBool,
    /// The arena's stats after the last operation that held the core.
    /// Swapped, never locked: readers (`arenas()`, any thread) never wait
    /// for a run, and a fork never copies it held.
    published: ArcSwap<Stats>,
}

struct Pending {
    /// Whether the worker still exists (it drains `ptrs`); once false,
    /// freers lock the core and free themselves.
    alive: bool,
    /// Queued blocks, each with the slot reference it held.
    ptrs: Vec<(usize, Arc<Slot>)>,
}

/// A worker's memory: pages, commits charged to a budget.
type WorkerMemory = Budgeted<tensor_arena::DefaultMemory>;
type WorkerArena = Arena<WorkerMemory>;

/// The arena, the open run and the live blocks. The run and the blocks
/// borrow the arena, which lives in a box of its own (its address never
/// changes) and is dropped after them (see `Drop`).
pub(crate) struct Core {
    run: Option<tensor_arena::Run<'static, WorkerMemory>>,
    /// Live blocks by the address handed to ONNX Runtime.
    blocks: HashMap<usize, Block<'static, WorkerMemory>>,
    /// Owned (from `Box::into_raw`); freed in `Drop` after `run` and `blocks`.
    arena: NonNull<WorkerArena>,
    /// Where blocks of at least so many bytes come from instead: the arena
    /// the workers of a pool share for their large blocks
    /// ([`crate::large`]), and the threshold.
    shared: Option<(Arc<Slot>, usize)>,
    /// Whether the open run's large blocks go to `shared`.
    share_now: bool,
    /// The open run's blocks in the shared arena freed on none but this
    /// thread so far, by address, with their sizes (a block freed on
    /// another thread stays counted: it errs high); their bytes now, and
    /// the most they reached in the run.
    large_blocks: HashMap<usize, usize>,
    large_live: usize,
    large_peak: usize,
}

// SAFETY: `Core` owns its arena and every borrow of it (`run`, `blocks`); no
// reference to the arena leaves the core except for the duration of a call
// made while the core is borrowed. Moving the whole core (or handing it to
// another thread through the slot's mutex) moves the arena and all its
// borrowers together, so no two threads ever use the arena at once.
unsafe impl Send for Core {}

impl Core {
    fn new(
        config: ArenaConfig,
        pages: PagesConfig,
        budget: Option<&Arc<Budget>>,
    ) -> Result<Self, ArenaError> {
        // Without a budget of the caller's, an unlimited one of its own: one
        // arena type, and a charge (one atomic operation) per commit only.
        let own;
        let budget = match budget {
            Some(b) => b,
            None => {
                own = Budget::new(usize::MAX);
                &own
            }
        };
        let memory = Budgeted::new(default_memory(pages), Arc::clone(budget));
        let arena = Box::new(Arena::with_memory(config, memory)?);
        Ok(Self {
            run: None,
            blocks: HashMap::new(),
            arena: NonNull::from(Box::leak(arena)),
            shared: None,
            share_now: false,
            large_blocks: HashMap::new(),
            large_live: 0,
            large_peak: 0,
        })
    }

    /// The arena, for as long as the core lives.
    fn arena(&self) -> &'static WorkerArena {
        // SAFETY: `arena` points to a live boxed arena, freed only in `Drop`
        // after every `Block` and `Run` made from this reference (they are
        // stored in `self.blocks`/`self.run` and nowhere else) is dropped.
        unsafe { self.arena.as_ref() }
    }

    /// A block for ONNX Runtime: from the shared arena if it is large
    /// enough to go there (its lock held for the call), else from this one.
    fn alloc(&mut self, owner: &Arc<Slot>, size: usize) -> Served {
        if let Some((shared, threshold)) = self.shared.as_ref().filter(|_| self.share_now) {
            if size >= *threshold {
                let served = shared.core.lock().alloc_here(shared, size);
                if let Served::Arena(p) = served {
                    let total = size.saturating_add(HEADER);
                    self.large_blocks.insert(p.as_ptr() as usize, total);
                    self.large_live += total;
                    self.large_peak = self.large_peak.max(self.large_live);
                }
                return served;
            }
        }
        self.alloc_here(owner, size)
    }

    /// A block of this core's own arena, its header naming `owner`.
    fn alloc_here(&mut self, owner: &Arc<Slot>, size: usize) -> Served {
        let Some(total) = size.checked_add(HEADER) else {
            return Served::Failed;
        };
        let mut block = match self.arena().try_alloc_aligned(total, ALIGN) {
            Ok(b) => b,
            Err(ArenaError::CommitFailed {
                code: Some(ErrorCode::OverBudget { .. }),
                ..
            }) => return Served::OverBudget,
            Err(_) => return Served::Failed,
        };
        let header = Header {
            owner: Arc::into_raw(Arc::clone(owner)) as usize,
            size: total,
        }
        .to_bytes();
        block[..header.len()].copy_from_slice(&header);
        let user = block.as_mut_ptr().wrapping_add(HEADER);
        note_alloc(block.len());
        self.blocks.insert(user as usize, block);
        match NonNull::new(user) {
            Some(p) => Served::Arena(p),
            None => Served::Failed,
        }
    }

    fn free(&mut self, user: usize) {
        let block = self.blocks.remove(&user);
        debug_assert!(block.is_some(), "free of {user:#x}: not a live block");
        if let Some(b) = &block {
            note_free(b.len());
        }
        drop(block);
    }

    fn stats(&self) -> Stats {
        self.arena().stats()
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        self.run = None;
        for b in self.blocks.values() {
            note_free(b.len());
        }
        self.blocks.clear();
        // SAFETY: the pointer came from `Box::leak` in `new` and is freed
        // only here; nothing borrows the arena any more (run and blocks were
        // dropped just above).
        drop(unsafe { Box::from_raw(self.arena.as_ptr()) });
    }
}

/// Bytes live in every worker's arena together (ONNX Runtime's blocks, with
/// their headers), counted at each alloc and free.
static LIVE: AtomicI64 = AtomicI64::new(0);
/// The most [`LIVE`] reached since the start or the last
/// [`reset_live_peak`]: the live peak of the runs in flight together, which
/// the arenas' own stats cannot give (each publishes after its run, so the
/// sum of their in-use bytes misses the moments when runs overlap).
static LIVE_PEAK: AtomicU64 = AtomicU64::new(0);

fn note_alloc(bytes: usize) {
    let now = LIVE.fetch_add(bytes as i64, Ordering::Relaxed) + bytes as i64;
    let now = u64::try_from(now).unwrap_or(0);
    // Read first: the peak's cache line is written only when it grows.
    if now > LIVE_PEAK.load(Ordering::Relaxed) {
        LIVE_PEAK.fetch_max(now, Ordering::Relaxed);
    }
}

fn note_free(bytes: usize) {
    LIVE.fetch_sub(bytes as i64, Ordering::Relaxed);
}

/// Bytes live in the workers' arenas together now, and the most they
/// reached (since the start, the last [`reset_live_peak`], or a fork).
pub(crate) fn live_together() -> (usize, usize) {
    let now = usize::try_from(LIVE.load(Ordering::Relaxed)).unwrap_or(0);
    let peak = usize::try_from(LIVE_PEAK.load(Ordering::Relaxed)).unwrap_or(usize::MAX);
    (now, peak.max(now))
}

/// The live peak starts again from the bytes live now.
pub(crate) fn reset_live_peak() {
    let now = u64::try_from(LIVE.load(Ordering::Relaxed)).unwrap_or(0);
    LIVE_PEAK.store(now, Ordering::Relaxed);
}

/// In a forked child: the live count starts again from what the arenas
/// published (the blocks of runs the child does not have are never freed
/// there, and stay counted as the arenas count them).
pub(crate) fn child_after_fork() {
    for s in REGISTRY.lock().iter().filter_map(Weak::upgrade) {
        if !s.is_free() {
            s.orphan.store(true, Ordering::Relaxed);
        }
    }
    let (sum, _) = all_stats();
    LIVE.store(
        i64::try_from(sum.in_use).unwrap_or(i64::MAX),
        Ordering::Relaxed,
    );
    LIVE_PEAK.store(sum.in_use as u64, Ordering::Relaxed);
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// Every slot alive, for process-wide stats.
static REGISTRY: ForkMutex<Vec<Weak<Slot>>> = ForkMutex::new(Vec::new());

impl Slot {
    /// A slot whose arena commits under `budget`, if any (and is then one
    /// of its members: it gives its cache back when idle).
    pub(crate) fn new(
        config: ArenaConfig,
        pages: PagesConfig,
        budget: Option<&Arc<Budget>>,
    ) -> Result<Arc<Self>, ArenaError> {
        Self::make(config, pages, budget, true)
    }

    /// A slot no worker runs on: the arena the workers of a pool share for
    /// their large blocks ([`crate::large`]). Every free locks its core
    /// (no worker drains a queue), as after a worker is dropped.
    pub(crate) fn new_shared(
        config: ArenaConfig,
        pages: PagesConfig,
        budget: Option<&Arc<Budget>>,
    ) -> Result<Arc<Self>, ArenaError> {
        Self::make(config, pages, budget, false)
    }

    fn make(
        config: ArenaConfig,
        pages: PagesConfig,
        budget: Option<&Arc<Budget>>,
        alive: bool,
    ) -> Result<Arc<Self>, ArenaError> {
        let slot = Arc::new(Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            core: Mutex::new(Core::new(config, pages, budget)?),
            pending: Mutex::new(Pending {
                alive,
                ptrs: Vec::new(),
            }),
            orphan: AtomicBool::new(false),
            published: ArcSwap::from_pointee(Stats::default()),
        });
        if let Some(b) = budget {
            let member: Arc<dyn Reclaim> = slot.clone();
            b.register(Arc::downgrade(&member));
        }
        let mut reg = REGISTRY.lock();
        reg.retain(|w| w.strong_count() > 0);
        reg.push(Arc::downgrade(&slot));
        Ok(slot)
    }

    /// Serves this slot's blocks of `threshold` bytes or more from
    /// `shared`'s arena from now on (`None`: from its own).
    pub(crate) fn share_large(&self, shared: Option<(Arc<Slot>, usize)>) {
        self.core.lock().shared = shared;
    }

    /// Locks the core, freeing what other threads queued.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Core> {
        let mut core = self.core.lock();
        self.drain(&mut core);
        core
    }

    fn drain(&self, core: &mut Core) {
        let ptrs = std::mem::take(&mut self.pending.lock().ptrs);
        // The blocks' own references are dropped after the loop; the caller
        // holds another, so none is the last.
        for (user, _) in &ptrs {
            core.free(*user);
        }
    }

    /// Publishes the core's stats for [`Slot::stats`].
    pub(crate) fn publish(&self, core: &Core) {
        self.published.store(Arc::new(core.stats()));
    }

    /// The stats published last.
    pub(crate) fn stats(&self) -> Stats {
        **self.published.load()
    }

    /// Called when the worker is dropped: frees what is queued, closes any
    /// run and gives back all cached memory; blocks still live (outputs)
    /// keep the slot, and free into it, until the last one goes.
    pub(crate) fn retire(&self) {
        let ptrs = {
            let mut p = self.pending.lock();
            p.alive = false;
            std::mem::take(&mut p.ptrs)
        };
        let mut core = self.core.lock();
        for (user, _) in &ptrs {
            core.free(*user);
        }
        core.run = None;
        core.arena().shrink_to(0);
        self.publish(&core);
    }
}

impl Slot {
    /// Idle decay ([`crate::decay`]): if no run holds the arena, gives all
    /// its cached memory back, what was given back lazily included, and
    /// returns the bytes; `None` if a run holds it (never waited for).
    pub(crate) fn try_decay(&self) -> Option<usize> {
        let mut core = self.core.try_lock()?;
        if core.run.is_some() {
            return None;
        }
        self.drain(&mut core);
        let released = core.arena().shrink_to(0) + core.arena().give_back_now();
        self.publish(&core);
        Some(released)
    }
}

impl Reclaim for Slot {
    /// An idle worker (its core not locked: no run open) gives back all its
    /// cached memory, what it gave back lazily included (memory is short);
    /// live outputs keep their blocks. A running worker is never waited for
    /// and never touched: its thread allocates without a lock during the
    /// run.
    fn try_reclaim(&self, _idle_only: bool) -> usize {
        match self.core.try_lock() {
            Some(core) => {
                let released = core.arena().shrink_to(0);
                core.arena().give_back_now();
                self.publish(&core);
                released
            }
            None => 0,
        }
    }
}

/// What `Alloc` on this thread got.
pub(crate) enum Served {
    /// A block of the running worker's arena.
    Arena(NonNull<u8>),
    /// No worker runs on this thread: use the system allocator.
    NoWorker,
    /// The arena refused (over its cap, out of memory, or the size
    /// overflowed): the caller serves it elsewhere.
    Failed,
    /// The arena's budget refused: the request fails (the budget is a
    /// limit on the process, which the system allocator must not bypass).
    OverBudget,
}

/// The worker running on this thread, if any.
#[derive(Clone, Copy)]
struct Current {
    slot: *const Slot,
    core: *mut Core,
}

thread_local! {
    static CURRENT: Cell<Option<Current>> = const { Cell::new(None) };
}

/// Makes `core` (of `slot`, locked by the caller) the target of this
/// thread's allocations until the returned guard drops.
pub(crate) fn enter<'g>(slot: &'g Arc<Slot>, core: &'g mut Core) -> Entered<'g> {
    let prev = CURRENT.with(|c| {
        c.replace(Some(Current {
            slot: Arc::as_ptr(slot),
            core,
        }))
    });
    Entered {
        prev,
        _borrow: std::marker::PhantomData,
    }
}

/// While alive, this thread's `Alloc`/`Free` go to the entered core.
pub(crate) struct Entered<'g> {
    prev: Option<Current>,
    _borrow: std::marker::PhantomData<&'g mut Core>,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.prev));
    }
}

/// `Alloc` from this thread.
pub(crate) fn alloc_current(size: usize) -> Served {
    let Some(cur) = CURRENT.with(Cell::get) else {
        return Served::NoWorker;
    };
    // SAFETY: `cur` was set by `enter` from a `&mut Core` of a locked core
    // and an `Arc<Slot>`, both borrowed by the `Entered` guard that is still
    // alive (it resets `CURRENT` on drop), and this thread is inside the call
    // that guard spans; the `&mut` is used only here, not re-entrantly.
    let core = unsafe { &mut *cur.core };
    // SAFETY: as above, the slot is kept alive by the caller of `enter`;
    // `ManuallyDrop` keeps this borrowed reference from being released.
    let slot = std::mem::ManuallyDrop::new(unsafe { Arc::from_raw(cur.slot) });
    core.alloc(&slot, size)
}

/// `Free` of the block at `user`, owned by `owner` (the block's
/// reference, now handed over).
pub(crate) fn free(owner: Arc<Slot>, user: usize) {
    if let Some(cur) = CURRENT.with(Cell::get) {
        // SAFETY: as in `alloc_current`: the entered core, used only here.
        let core = unsafe { &mut *cur.core };
        if std::ptr::eq(cur.slot, Arc::as_ptr(&owner)) {
            core.free(user);
            return;
        }
        // A large block of this run's, freed on its thread.
        if let Some(size) = core.large_blocks.remove(&user) {
            core.large_live = core.large_live.saturating_sub(size);
        }
    }
    if owner.orphan.load(Ordering::Relaxed) {
        // A forked child's slot whose lock a thread of the parent held:
        // waiting for it would wait for ever. The block, and the slot with
        // it, stay where they are.
        std::mem::forget(owner);
        return;
    }
    let freed = match owner.core.try_lock() {
        Some(mut core) => {
            core.free(user);
            owner.publish(&core);
            true
        }
        None => false,
    };
    if freed {
        // Possibly the last reference: the slot and its arena go with it.
        drop(owner);
        return;
    }
    let mut p = owner.pending.lock();
    if p.alive {
        // The owner frees it (and drops this reference) at its next lock.
        let owner2 = Arc::clone(&owner);
        p.ptrs.push((user, owner2));
        drop(p);
        return;
    }
    drop(p);
    let mut core = owner.core.lock();
    core.free(user);
    owner.publish(&core);
    drop(core);
    drop(owner);
}

/// [`crate::fork::prepare`]: the registry, kept until
/// [`crate::forklock::release`].
pub(crate) fn prepare_fork() {
    hold(REGISTRY.lock());
}

impl Slot {
    /// Whether a forked child found the slot's lock held by a thread of
    /// the parent (it is never locked again).
    pub(crate) fn is_orphan(&self) -> bool {
        self.orphan.load(Ordering::Relaxed)
    }

    /// Whether no thread holds any of the slot's locks: in a forked child,
    /// a slot that is not free was in use by a thread the child does not
    /// have, and is never locked again.
    pub(crate) fn is_free(&self) -> bool {
        !self.orphan.load(Ordering::Relaxed) && !self.core.is_locked() && !self.pending.is_locked()
    }
}

/// Sum of the published stats of every arena alive, and their number.
pub(crate) fn all_stats() -> (Stats, usize) {
    let reg = REGISTRY.lock();
    let mut sum = Stats::default();
    let mut n = 0;
    for s in reg.iter().filter_map(Weak::upgrade) {
        n += 1;
        add_stats(&mut sum, &s.stats());
    }
    (sum, n)
}

/// Adds `b` into `a`, field by field (peaks add too: an upper bound on the
/// peak of the sum).
pub(crate) fn add_stats(a: &mut Stats, b: &Stats) {
    a.in_use += b.in_use;
    a.peak_in_use += b.peak_in_use;
    a.reserved += b.reserved;
    a.watermark += b.watermark;
    a.allocs += b.allocs;
    a.frees += b.frees;
    a.cache_hits += b.cache_hits;
    a.backing_allocs += b.backing_allocs;
    a.backing_frees += b.backing_frees;
    a.commits += b.commits;
    a.decommits += b.decommits;
    a.bytes_released += b.bytes_released;
    a.largest_free_block = a.largest_free_block.max(b.largest_free_block);
    a.free_bytes += b.free_bytes;
    a.regions += b.regions;
    a.live_blocks += b.live_blocks;
    a.runs += b.runs;
    a.shrinks += b.shrinks;
    a.relayouts += b.relayouts;
    a.planned_allocs += b.planned_allocs;
    a.planned_runs += b.planned_runs;
    a.deviations += b.deviations;
    a.lazily_given_back += b.lazily_given_back;
    a.slow_huge_commits += b.slow_huge_commits;
}

impl Core {
    /// Opens a run, served by `plan` when there is one and its block can be
    /// drawn; a dynamic run keeps its recording if `record` (the first run
    /// of a shape, whose plan is to be learned). With `share`, its large
    /// blocks come from the shared arena, if the slot has one.
    pub(crate) fn begin_run(&mut self, plan: Option<Arc<Plan>>, record: bool, share: bool) {
        let arena = self.arena();
        self.run = None;
        self.share_now = share;
        self.large_blocks.clear();
        self.large_live = 0;
        self.large_peak = 0;
        let run = match plan {
            Some(p) => arena.begin_planned_run(p).ok(),
            None => None,
        };
        self.run = Some(run.unwrap_or_else(|| {
            if record {
                arena.begin_recorded_run()
            } else {
                arena.begin_run()
            }
        }));
    }

    /// Closes the open run.
    pub(crate) fn finish_run(&mut self) -> Option<(RunReport, Recording)> {
        self.share_now = false;
        self.large_blocks.clear();
        self.run
            .take()
            .map(tensor_arena::Run::finish_with_recording)
    }

    /// The most bytes the run's blocks held in the shared arena at once
    /// (0 without one): what its admission needs beside its plan.
    pub(crate) fn large_peak(&self) -> usize {
        self.large_peak
    }

    /// The arena's peak starts again from what is in use now.
    pub(crate) fn reset_peak(&mut self) {
        self.arena().reset_peak();
    }

    /// Gives cached memory back down to `bytes`.
    pub(crate) fn shrink_to(&mut self, bytes: usize) -> usize {
        self.arena().shrink_to(bytes)
    }

    /// Gives memory decommitted lazily back at once (see
    /// [`Arena::give_back_now`]).
    pub(crate) fn give_back_now(&mut self) -> usize {
        self.arena().give_back_now()
    }

    /// Starts or stops recording runs as a trace.
    pub(crate) fn record_trace(&mut self, on: bool) {
        self.arena().record_trace(on);
    }

    /// The runs recorded so far.
    pub(crate) fn take_trace(&mut self) -> tensor_arena::trace::Trace {
        self.arena().take_trace()
    }

    /// The arena's stats now.
    pub(crate) fn arena_stats(&self) -> Stats {
        self.stats()
    }

    /// A block of `size` bytes for the tests, as `Alloc` would hand out.
    #[cfg(test)]
    pub(crate) fn test_alloc(&mut self, owner: &Arc<Slot>, size: usize) -> usize {
        match self.alloc(owner, size) {
            Served::Arena(p) => p.as_ptr() as usize,
            _ => panic!("the arena refused {size} bytes"),
        }
    }

    /// Frees a block of [`Core::test_alloc`], releasing the slot reference
    /// its header holds.
    #[cfg(test)]
    pub(crate) fn test_free(&mut self, user: usize) {
        let p = NonNull::new(user as *mut u8).expect("a block's address");
        // SAFETY: `user` came from `test_alloc` and its block is still live.
        let header = unsafe { crate::block::read_header(p) }.expect("a block's header");
        self.free(user);
        // SAFETY: the header's owner is the `Arc<Slot>` reference the block
        // took in `alloc`; given back once, here.
        drop(unsafe { Arc::from_raw(header.owner as *const Slot) });
    }
}
