//! A model's plans: what each input shape's run allocates, shared by every
//! worker that runs the model.

use crate::key::RunKey;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tensor_arena::{FamilyStats, PlanCache, PlanStats};

/// The plans of one model: what each input shape's run allocates, and
/// where. One per model (session), shared by every worker that runs it
/// (`&Plans` is `Sync`; put it beside the session, or in an `Arc`).
///
/// Plans are validated when they are made and checked when they are
/// served, so handing a worker another model's plans, or keys that do not
/// describe the run, is harmless: the run deviates from the plan, goes on
/// dynamically, and the key is planned again.
pub struct Plans {
    id: u64,
    pub(crate) cache: Arc<PlanCache<RunKey>>,
    /// The largest run of the model seen so far (its high-water, bytes),
    /// plus one; 0: no run has ended yet. What a run with no plan is
    /// admitted for. Shared with [`Plans::sharing`]: one model's runs.
    largest: Arc<AtomicUsize>,
    /// What runs of each key held at once in the arena their pool's
    /// workers share for large blocks (`crate::large`), where it was not
    /// 0; and the most any run of the model held there. Beside the plan's
    /// block, what a run of the key is admitted for.
    large: parking_lot::Mutex<std::collections::HashMap<RunKey, usize>>,
    largest_large: AtomicUsize,
    /// The plans of the model's runs whose large blocks come from the
    /// arena their pool's workers share (made at the first such run): the
    /// worker's plan then holds only its smaller blocks, another structure
    /// than a run that holds all its own.
    sharing: std::sync::OnceLock<Box<Plans>>,
    /// Where the plans are loaded from and saved to, and what the last
    /// save saw (`crate::store`).
    pub(crate) store: Option<Stored>,
}

/// A [`Plans`]' store (`crate::store`), and the plans' generation its file
/// last saw.
#[derive(Debug)]
pub(crate) struct Stored {
    pub(crate) store: tensor_arena::PlanStore,
    /// [`PlanStats::inserts`](tensor_arena::PlanStats::inserts) when last
    /// loaded or saved: a save with nothing new is skipped.
    pub(crate) saved: std::sync::atomic::AtomicU64,
}

static NEXT_PLANS: AtomicU64 = AtomicU64::new(1);

impl Plans {
    /// Plans for up to `capacity` shapes (least recently used out; at least
    /// 1).
    ///
    /// A family's refit is made off the run's path, by the process's
    /// background thread (`crate::learn`); [`Plans::learn_now`] makes
    /// what is owed on the caller's thread.
    pub fn new(capacity: usize) -> Self {
        let cache = PlanCache::new(capacity.max(1));
        cache.set_deferred_learning(true);
        Self {
            id: NEXT_PLANS.fetch_add(1, Ordering::Relaxed),
            cache: Arc::new(cache),
            largest: Arc::new(AtomicUsize::new(0)),
            large: parking_lot::Mutex::new(std::collections::HashMap::new()),
            largest_large: AtomicUsize::new(0),
            sharing: std::sync::OnceLock::new(),
            store: None,
        }
    }

    /// Makes the refits the runs left to the background thread now, on
    /// this thread ([`PlanCache::learn`]); returns how many were made.
    /// For a caller that wants the next prediction to know every shape
    /// run so far (a test, a warm-up).
    pub fn learn_now(&self) -> usize {
        let _section = crate::learn::section();
        self.cache.learn()
    }

    /// The plan cache (hits, misses, plans held: [`PlanCache::stats`]).
    /// A program that forks while another thread calls into it directly
    /// leaves that call to chance: this type's own methods are safe across
    /// [`fork`](crate::fork) (the fork waits for them), the cache's are not.
    pub fn cache(&self) -> &PlanCache<RunKey> {
        &self.cache
    }

    /// The cache's counters, with every run of the model by how it was
    /// served ([`PlanStats::runs`]).
    pub fn stats(&self) -> PlanStats {
        let _section = crate::learn::section();
        self.cache.stats()
    }

    /// The model's plan families: each one's shapes, fit and runs (exact,
    /// predicted, fell back and why, dynamic).
    pub fn families(&self) -> Vec<FamilyStats> {
        let _section = crate::learn::section();
        self.cache.families()
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The largest run of the model seen so far, in bytes (0 before the
    /// first run ends): what a run with no plan is admitted for.
    pub fn largest_run(&self) -> usize {
        self.largest.load(Ordering::Relaxed).saturating_sub(1)
    }

    /// Whether a run of the model has ended (a model whose runs take
    /// nothing from the arena has run too: its runs need 0 bytes, and only
    /// its first runs alone).
    pub(crate) fn has_run(&self) -> bool {
        self.largest.load(Ordering::Relaxed) != 0
    }

    /// The plans of the model's runs whose large blocks come from the arena
    /// their pool's workers share (`crate::large`); not in the plan store.
    /// One model to a worker's shrink policy: what a worker cached for a
    /// run that held all its blocks follows the model's sharing runs down
    /// after the policy's window, as it would the model's smaller inputs.
    pub fn sharing(&self) -> &Plans {
        self.sharing.get_or_init(|| {
            Box::new(Plans {
                id: self.id,
                largest: Arc::clone(&self.largest),
                ..Plans::new(self.cache.capacity())
            })
        })
    }

    /// What a run of `key` needs beside its plan's block, in the arena its
    /// pool's workers share for large blocks: what the key's last run held
    /// there at once; for a key not run yet (a predicted plan), the most
    /// any run of the model held there. 0 where no run of the model used
    /// one.
    pub fn large_need(&self, key: &RunKey) -> usize {
        let largest = self.largest_large.load(Ordering::Relaxed);
        if largest == 0 {
            return 0;
        }
        self.large.lock().get(key).copied().unwrap_or(largest)
    }

    /// Notes what a run of `key` held at once in the shared arena.
    pub(crate) fn note_large(&self, key: &RunKey, bytes: usize) {
        if bytes == 0 && self.largest_large.load(Ordering::Relaxed) == 0 {
            return;
        }
        self.largest_large.fetch_max(bytes, Ordering::Relaxed);
        let mut large = self.large.lock();
        if large.get(key) != Some(&bytes) {
            // Bounded as the plans are (a few per shape); a full map starts
            // again, and its keys fall back on the model's largest.
            if large.len() >= self.cache.capacity().saturating_mul(4).max(64) {
                large.clear();
            }
            large.insert(key.clone(), bytes);
        }
    }

    /// Counts a run that reached `high_water` bytes.
    pub(crate) fn note_run(&self, high_water: usize) {
        self.largest
            .fetch_max(high_water.saturating_add(1), Ordering::Relaxed);
    }
}

impl Default for Plans {
    /// Room for 64 shapes.
    fn default() -> Self {
        Self::new(64)
    }
}

impl std::fmt::Debug for Plans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plans")
            .field("id", &self.id)
            .field("stats", &self.stats())
            .finish()
    }
}
