//! [`Session`]: shared weights plus a private arena; [`RunContext`]: what a
//! run's closure gets.

use crate::swap::ModelHandle;
use crate::weights::Weights;
use bumpalo::Bump;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tensor_arena::{Arena, ArenaConfig, ArenaError, Block, LiveBlock, Run, RunReport, Stats};

/// Configuration of a [`Session`] and of every clone made from it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionConfig {
    /// Configuration of each clone's private arena.
    pub arena: ArenaConfig,
}

/// What clones of one session share: the model handle and live counters.
#[derive(Debug)]
pub(crate) struct Family {
    /// Clones alive (including the original).
    pub(crate) alive: AtomicUsize,
    /// Clones ever made (including the original).
    pub(crate) created: AtomicU64,
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
/// `Sync` (its arena has no lock).
pub struct Session {
    model: ModelHandle,
    config: SessionConfig,
    arena: Arena,
    family: Arc<Family>,
    runs: u64,
    last: Option<RunReport>,
    /// Runs per key (input shape).
    keys: HashMap<Box<[usize]>, u64>,
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
        let family = Arc::new(Family {
            alive: AtomicUsize::new(0),
            created: AtomicU64::new(0),
        });
        Self::member(model, config, family)
    }

    fn member(model: ModelHandle, config: SessionConfig, family: Arc<Family>) -> Self {
        family.alive.fetch_add(1, Ordering::Relaxed);
        family.created.fetch_add(1, Ordering::Relaxed);
        Self {
            model,
            config,
            arena: Arena::new(config.arena),
            family,
            runs: 0,
            last: None,
            keys: HashMap::new(),
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
    pub fn run<R>(&mut self, key: &[usize], f: impl FnOnce(&RunContext<'_>) -> R) -> R {
        let weights = self.model.load();
        let run = self.arena.begin_run();
        let ctx = RunContext {
            run: &run,
            weights: &weights,
            key,
        };
        let out = f(&ctx);
        let report = run.finish();
        self.runs += 1;
        self.last = Some(report);
        match self.keys.get_mut(key) {
            Some(n) => *n += 1,
            None => {
                self.keys.insert(key.into(), 1);
            }
        }
        out
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

    /// The configuration.
    pub fn config(&self) -> SessionConfig {
        self.config
    }

    /// Gives the arena's cached memory back down to the recent runs'
    /// watermark; returns the bytes released.
    pub fn shrink(&mut self) -> usize {
        self.arena.shrink()
    }

    /// Gives cached memory back until at most `bytes` stay reserved.
    pub fn shrink_to(&mut self, bytes: usize) -> usize {
        self.arena.shrink_to(bytes)
    }

    /// The session's arena (for stats, or allocations outside runs).
    pub fn arena(&self) -> &Arena {
        &self.arena
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
        }
    }

    /// How many runs used `key`.
    pub fn runs_with_key(&self, key: &[usize]) -> u64 {
        self.keys.get(key).copied().unwrap_or(0)
    }

    /// Blocks still live in the arena (none outside a run, unless a block
    /// was leaked with `mem::forget`).
    pub fn live_blocks(&self) -> Vec<LiveBlock> {
        self.arena.live_blocks()
    }
}

impl Clone for Session {
    /// Same as [`Session::try_clone`].
    fn clone(&self) -> Self {
        self.try_clone()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.family.alive.fetch_sub(1, Ordering::Relaxed);
        if cfg!(debug_assertions) {
            for b in self.arena.live_blocks() {
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

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("runs", &self.runs)
            .field("arena", &self.arena.stats())
            .finish()
    }
}

/// What the closure of [`Session::run`] gets: the weights, buffer
/// allocation from the session's arena, and per-run scratch.
pub struct RunContext<'r> {
    run: &'r Run<'r>,
    weights: &'r Arc<Weights>,
    key: &'r [usize],
}

impl<'r> RunContext<'r> {
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
    pub fn alloc(&self, bytes: usize) -> Result<Block<'r>, ArenaError> {
        self.run.try_alloc(bytes)
    }

    /// A buffer of `len` elements of `T`, zero-filled.
    ///
    /// # Errors
    /// [`ArenaError::CapacityOverflow`] if the size overflows, else as
    /// [`Arena::try_alloc`].
    #[track_caller]
    pub fn alloc_slice<T: bytemuck::Pod>(&self, len: usize) -> Result<Block<'r>, ArenaError> {
        let bytes = len
            .checked_mul(size_of::<T>())
            .ok_or(ArenaError::CapacityOverflow {
                requested: usize::MAX,
            })?;
        let mut block = self.run.try_alloc(bytes)?;
        block.fill(0);
        Ok(block)
    }

    /// Scratch memory for small per-run data, reset when the run ends.
    pub fn scratch(&self) -> &'r Bump {
        self.run.scratch()
    }

    /// The session's arena.
    pub fn arena(&self) -> &'r Arena {
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
}
