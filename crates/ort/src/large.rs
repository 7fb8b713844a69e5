//! The arena the workers of a [`WorkerPool`](crate::WorkerPool) share for
//! their large blocks.
//!
//! A worker holds its plan's block, the size of its run's spike, from the
//! run's start to its end; runs in flight together then hold every spike
//! at once while their live bytes add to much less (docs/decisions.md,
//! "What runs in flight together hold"). Blocks of
//! [`WorkerOptions::share_large_blocks`](crate::WorkerOptions::share_large_blocks)
//! bytes or more (the full-resolution maps, the concatenations) come
//! instead from one dynamic arena the pool's workers share: what one run
//! freed, the next run in flight reuses at once, with no fault. The
//! smaller blocks stay on each worker's plan.
//!
//! The shared arena keeps its memory while runs use it, follows them down
//! over a window of a second, and gives everything back when the pool is
//! idle (its decay); the budget can take its cached memory like any
//! member's. A run that starts with no other of the pool in flight keeps
//! its large blocks on its own plan, as a worker alone does: a single
//! stream pays nothing for the sharing.

use crate::decay::Decay;
use crate::slot::Slot;
use crate::OrtArenaError;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tensor_arena::memory::PagesConfig;
use tensor_arena::{ArenaConfig, ArenaError, Budget, Stats};

/// How long the shared arena holds the most its blocks reached: what
/// runs of the last window used stays cached (as a worker's
/// [`Shrink::Window`](crate::Shrink::Window) of 1 s).
pub(crate) const WINDOW: Duration = Duration::from_secs(1);

/// One arena shared by workers for their large blocks. A
/// [`WorkerPool`](crate::WorkerPool) of several workers makes its own
/// ([`WorkerOptions::share_large_blocks`](crate::WorkerOptions::share_large_blocks));
/// a server that keeps its workers itself shares one among them with
/// [`Worker::set_large_blocks`](crate::Worker::set_large_blocks).
///
/// ```
/// use tensor_arena_ort::{LargeBlocks, Worker, WorkerOptions};
/// let options = WorkerOptions::default();
/// let large = LargeBlocks::new(1 << 20, options.pages, options.budget.clone(), options.decay)?;
/// let mut workers = (0..4)
///     .map(|_| Worker::new(options.clone()))
///     .collect::<Result<Vec<_>, _>>()?;
/// for w in &mut workers {
///     w.set_large_blocks(Some(large.clone()));
/// }
/// assert_eq!(large.stats().reserved, 0, "nothing until a run uses it");
/// # Ok::<(), tensor_arena_ort::OrtArenaError>(())
/// ```
pub struct LargeBlocks {
    slot: Arc<Slot>,
    threshold: usize,
    /// Runs of the pool's workers in flight now.
    in_flight: AtomicUsize,
    /// When the window began: the arena's peak in use is the most its
    /// blocks reached since then (reset at each window's end).
    window: Mutex<Instant>,
    decay: Option<Arc<Decay>>,
}

impl LargeBlocks {
    /// An arena for the blocks of `threshold` bytes or more (at least 1)
    /// of the workers that will share it, made with the workers' own
    /// settings ([`WorkerOptions`](crate::WorkerOptions)' `pages`, `budget`
    /// and `decay`): it commits under `budget` (`None`: the process's
    /// default, as a worker made without one), and gives everything back
    /// after `decay` with no run ending.
    ///
    /// # Errors
    /// [`OrtArenaError::Arena`] if the arena cannot be made; the errors of
    /// [`default_budget`](crate::default_budget).
    pub fn new(
        threshold: usize,
        pages: PagesConfig,
        budget: Option<Arc<Budget>>,
        decay: Option<Duration>,
    ) -> Result<Arc<Self>, OrtArenaError> {
        let budget = match budget {
            Some(b) => Some(b),
            None => crate::limit::default_budget()?,
        };
        Ok(Self::make(threshold, pages, budget.as_ref(), decay)?)
    }

    fn make(
        threshold: usize,
        pages: PagesConfig,
        budget: Option<&Arc<Budget>>,
        decay: Option<Duration>,
    ) -> Result<Arc<Self>, ArenaError> {
        let slot = Slot::new_shared(ArenaConfig::default(), pages, budget)?;
        Ok(Arc::new(Self {
            decay: decay.map(|idle| Decay::register(&slot, idle)),
            slot,
            threshold: threshold.max(1),
            in_flight: AtomicUsize::new(0),
            window: Mutex::new(Instant::now()),
        }))
    }

    /// The arena a pool of `size` workers shares for their blocks of
    /// `share` bytes or more (`None`: none), under their `budget`, with
    /// their memory settings: none for a single worker (nothing to share).
    pub(crate) fn for_pool(
        share: Option<usize>,
        size: usize,
        pages: PagesConfig,
        budget: Option<&Arc<Budget>>,
        decay: Option<Duration>,
    ) -> Result<Option<Arc<Self>>, ArenaError> {
        match share.filter(|_| size > 1) {
            Some(threshold) => Ok(Some(Self::make(threshold, pages, budget, decay)?)),
            None => Ok(None),
        }
    }

    /// A run of one of the pool's workers starts: it shares the arena if
    /// another run is in flight now (with none, nothing would share its
    /// spike, and its own plan holds its large blocks tighter than a
    /// dynamic arena: a single stream keeps its plans whole).
    pub(crate) fn enter(self: &Arc<Self>) -> Flight {
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        Flight {
            large: Arc::clone(self),
            shared: before > 0,
        }
    }

    /// What a worker's slot serves its large blocks from.
    pub(crate) fn target(&self) -> (Arc<Slot>, usize) {
        (Arc::clone(&self.slot), self.threshold)
    }

    /// At the end of a worker's run: once a window has passed, gives back
    /// what the shared arena holds beyond the most its blocks reached in
    /// it. Returns the bytes given back.
    pub(crate) fn after_run(&self) -> usize {
        if let Some(d) = &self.decay {
            d.used();
        }
        self.after_run_at(Instant::now())
    }

    fn after_run_at(&self, now: Instant) -> usize {
        let mut start = self.window.lock();
        if now.saturating_duration_since(*start) < WINDOW {
            return 0;
        }
        let mut core = self.slot.lock();
        let stats = core.arena_stats();
        let keep = stats.peak_in_use;
        let released = if stats.reserved > keep {
            core.shrink_to(keep)
        } else {
            0
        };
        core.reset_peak();
        *start = now;
        self.slot.publish(&core);
        released
    }

    /// The shared arena's stats (its lock taken for the call).
    pub fn stats(&self) -> Stats {
        let core = self.slot.lock();
        self.slot.publish(&core);
        core.arena_stats()
    }

    /// The shared arena's slot, for the tests to hold its lock.
    #[cfg(test)]
    pub(crate) fn slot(&self) -> &Arc<Slot> {
        &self.slot
    }

    /// Whether no thread holds the shared arena's locks (in a forked
    /// child: one that a thread of the parent held is never locked again).
    pub(crate) fn is_free(&self) -> bool {
        self.slot.is_free()
    }
}

/// A run of the pool in flight ([`LargeBlocks::enter`]), until dropped.
pub(crate) struct Flight {
    large: Arc<LargeBlocks>,
    /// Whether the run's large blocks come from the shared arena.
    pub(crate) shared: bool,
}

impl Drop for Flight {
    fn drop(&mut self) {
        self.large.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for LargeBlocks {
    /// The pool is gone: everything cached goes back; blocks still live
    /// (outputs) keep the arena until the last is freed. In a forked child
    /// whose parent held its lock at the fork, it is left as it is.
    fn drop(&mut self) {
        if !self.slot.is_orphan() {
            self.slot.retire();
        }
    }
}

impl std::fmt::Debug for LargeBlocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LargeBlocks")
            .field("threshold", &self.threshold)
            .field("stats", &self.slot.stats())
            .finish()
    }
}
