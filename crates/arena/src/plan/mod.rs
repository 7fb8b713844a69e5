//! Shape-keyed memory plans: a run seen before gets every buffer at a
//! precomputed offset inside one block.
//!
//! 1. **Record**: every run records the sizes, alignments and lifetimes of
//!    its blocks ([`Run::finish_with_recording`](crate::Run::finish_with_recording)).
//! 2. **Plan**: [`Plan::from_recording`] computes an offset for each block
//!    so that no two blocks alive at the same time overlap ([`solver`]).
//! 3. **Serve**: [`Arena::begin_planned_run`](crate::Arena::begin_planned_run)
//!    draws one block of the plan's size and hands out the run's blocks, by
//!    their index in the run, at their offsets: O(1), no search, no backing
//!    call. The run's events are checked against the recording as they
//!    come; at the first difference (a size or alignment larger than
//!    recorded, an extra block, frees in another order) the run *deviates*:
//!    blocks already handed out stay where they are, and the rest of the
//!    run is served by the dynamic pool.
//! 4. **Cache**: [`PlanCache`] keeps plans by exact key (hash and equality,
//!    no collisions), bounded, least recently used out; lookups take no lock.

pub mod solver;

use parking_lot::Mutex;
use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One event of a recorded run: block `i` (in allocation order) allocated
/// or freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum PlanEvent {
    /// Block `i` was allocated.
    Alloc(u32),
    /// Block `i` was freed.
    Free(u32),
}

/// What a run did with its blocks: their sizes and alignments, and the
/// order of allocations and frees.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Recording {
    /// `(size, align)` of each block, in allocation order; sizes are rounded
    /// up to the arena's alignment.
    pub blocks: Vec<(usize, usize)>,
    /// The run's events in order. A block allocated but never freed in the
    /// run lives to the end.
    pub events: Vec<PlanEvent>,
}

impl Recording {
    /// An empty recording.
    pub const fn new() -> Self {
        Self {
            blocks: Vec::new(),
            events: Vec::new(),
        }
    }

    /// Appends an allocation of `size` bytes at `align`; returns its index.
    pub fn alloc(&mut self, size: usize, align: usize) -> u32 {
        let i = self.blocks.len() as u32;
        self.blocks.push((size, align));
        self.events.push(PlanEvent::Alloc(i));
        i
    }

    /// Appends the free of block `i`.
    pub fn free(&mut self, i: u32) {
        self.events.push(PlanEvent::Free(i));
    }

    /// Empties the recording, keeping its capacity.
    pub fn clear(&mut self) {
        self.blocks.clear();
        self.events.clear();
    }

    /// Number of blocks.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether no block was recorded.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// The blocks as planner requests: lifetimes are half-open intervals of
    /// event indices, `[alloc, free)` (to the end for blocks never freed).
    pub fn requests(&self) -> Vec<solver::Request> {
        let end = self.events.len();
        let mut reqs: Vec<solver::Request> = self
            .blocks
            .iter()
            .map(|&(size, align)| solver::Request::new(size, align, end, end))
            .collect();
        for (t, ev) in self.events.iter().enumerate() {
            match *ev {
                PlanEvent::Alloc(i) => {
                    if let Some(r) = reqs.get_mut(i as usize) {
                        r.start = t;
                    }
                }
                PlanEvent::Free(i) => {
                    if let Some(r) = reqs.get_mut(i as usize) {
                        r.end = t;
                    }
                }
            }
        }
        reqs
    }

    /// The most bytes live at once.
    pub fn lower_bound(&self) -> usize {
        solver::lower_bound(&self.requests())
    }
}

/// Offsets for every block of a recorded run, inside one block of
/// [`Plan::size`] bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Plan {
    recording: Recording,
    offsets: Vec<usize>,
    size: usize,
    align: usize,
    lower_bound: usize,
}

impl Plan {
    /// Plans a recording with [`solver::plan`].
    pub fn from_recording(recording: &Recording) -> Self {
        let requests = recording.requests();
        let solution = solver::plan(&requests);
        let align = recording
            .blocks
            .iter()
            .map(|b| b.1.max(1))
            .max()
            .unwrap_or(1);
        Self {
            recording: recording.clone(),
            offsets: solution.offsets,
            size: solution.size,
            align,
            lower_bound: solver::lower_bound(&requests),
        }
    }

    /// Bytes of the one block the plan needs.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The most bytes the recorded run had live at once: no plan is smaller.
    pub fn lower_bound(&self) -> usize {
        self.lower_bound
    }

    /// Alignment the plan's block needs (the largest of its blocks').
    pub fn align(&self) -> usize {
        self.align
    }

    /// Number of blocks planned.
    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    /// Whether the plan holds no block.
    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }

    /// `(size, align)` of block `i` as recorded.
    pub fn block(&self, i: usize) -> Option<(usize, usize)> {
        self.recording.blocks.get(i).copied()
    }

    /// Offset of block `i`.
    pub fn offset(&self, i: usize) -> Option<usize> {
        self.offsets.get(i).copied()
    }

    /// The recording the plan was made from.
    pub fn recording(&self) -> &Recording {
        &self.recording
    }

    /// Whether a run that did what `other` records can be served by this
    /// plan: the same events in the same order, and every block no larger
    /// and no more aligned than here.
    pub fn covers(&self, other: &Recording) -> bool {
        other.events == self.recording.events
            && other
                .blocks
                .iter()
                .zip(&self.recording.blocks)
                .all(|(o, s)| o.0 <= s.0 && o.1 <= s.1)
    }

    /// Whether block `i` of a run may be served here, when the run has done
    /// exactly `pos` events like the recording so far.
    #[inline]
    pub(crate) fn serves_alloc(&self, pos: usize, i: u32, size: usize, align: usize) -> bool {
        self.recording.events.get(pos) == Some(&PlanEvent::Alloc(i))
            && self
                .recording
                .blocks
                .get(i as usize)
                .is_some_and(|&(s, a)| size <= s && align <= a)
    }

    /// Whether the free of block `i` is the recording's event number `pos`.
    #[inline]
    pub(crate) fn expects_free(&self, pos: usize, i: u32) -> bool {
        self.recording.events.get(pos) == Some(&PlanEvent::Free(i))
    }

    /// Number of events recorded.
    pub(crate) fn event_count(&self) -> usize {
        self.recording.events.len()
    }

    /// Checks that no two blocks alive at the same time overlap and every
    /// offset is aligned.
    ///
    /// # Errors
    /// A description of the first problem found.
    pub fn validate(&self) -> Result<(), String> {
        let solution = solver::Solution {
            offsets: self.offsets.clone(),
            size: self.size,
        };
        solver::validate(&self.recording.requests(), &solution)
    }
}

/// Counters of a [`PlanCache`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PlanStats {
    /// Lookups that found a plan.
    pub hits: u64,
    /// Lookups that found none.
    pub misses: u64,
    /// Plans added (or replaced).
    pub inserts: u64,
    /// Plans evicted to stay within the capacity.
    pub evictions: u64,
    /// Planned runs that deviated from their plan.
    pub deviations: u64,
    /// Plans held now.
    pub plans: usize,
}

struct Entry {
    plan: Arc<Plan>,
    /// Stamp of the last lookup that returned this entry.
    last_used: AtomicU64,
}

/// Plans by key, bounded, least recently used out.
///
/// Lookups take no lock (they read an immutable snapshot of the map); adding
/// a plan takes a lock, copies the map (plans are shared, not copied) and
/// publishes the new snapshot. So the cache is made for many readers (one
/// per worker) and rare writes (the first run of each shape).
pub struct PlanCache<K> {
    map: arc_swap::ArcSwap<HashMap<K, Arc<Entry>>>,
    writer: Mutex<()>,
    capacity: usize,
    clock: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    inserts: AtomicU64,
    evictions: AtomicU64,
    deviations: AtomicU64,
}

impl<K: Hash + Eq + Clone> PlanCache<K> {
    /// A cache holding at most `capacity` plans (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self {
            map: arc_swap::ArcSwap::from_pointee(HashMap::new()),
            writer: Mutex::new(()),
            capacity: capacity.max(1),
            clock: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            inserts: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            deviations: AtomicU64::new(0),
        }
    }

    /// The plan for `key`, if any (counted as a hit or a miss).
    pub fn get<Q>(&self, key: &Q) -> Option<Arc<Plan>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let map = self.map.load();
        match map.get(key) {
            Some(e) => {
                let now = self.clock.fetch_add(1, Ordering::Relaxed);
                e.last_used.store(now, Ordering::Relaxed);
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some(Arc::clone(&e.plan))
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// The plan for `key`, if any, without counting a hit or a miss or
    /// touching its recency (to inspect the cache).
    pub fn peek<Q>(&self, key: &Q) -> Option<Arc<Plan>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.load().get(key).map(|e| Arc::clone(&e.plan))
    }

    /// Whether a plan for `key` is held (not counted).
    pub fn contains<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.load().contains_key(key)
    }

    /// The largest plan held (by block size), to serve a new, smaller shape
    /// of the same model; not counted as a hit.
    pub fn largest(&self) -> Option<Arc<Plan>> {
        let map = self.map.load();
        map.values()
            .max_by_key(|e| e.plan.size())
            .map(|e| Arc::clone(&e.plan))
    }

    /// Adds (or replaces) the plan for `key`, evicting the least recently
    /// used plans beyond the capacity.
    pub fn insert(&self, key: K, plan: Arc<Plan>) {
        let _writer = self.writer.lock();
        let mut map: HashMap<K, Arc<Entry>> = (**self.map.load()).clone();
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        map.insert(
            key,
            Arc::new(Entry {
                plan,
                last_used: AtomicU64::new(now),
            }),
        );
        while map.len() > self.capacity {
            let oldest = map
                .iter()
                .min_by_key(|(_, e)| e.last_used.load(Ordering::Relaxed))
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                map.remove(&k);
                self.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.inserts.fetch_add(1, Ordering::Relaxed);
        self.map.store(Arc::new(map));
    }

    /// Adds saved plans (for instance deserialized from a file written with
    /// [`PlanCache::entries`]), so that a server starts warm.
    pub fn load(&self, entries: impl IntoIterator<Item = (K, Plan)>) {
        for (k, plan) in entries {
            self.insert(k, Arc::new(plan));
        }
    }

    /// Drops every plan.
    pub fn clear(&self) {
        let _writer = self.writer.lock();
        self.map.store(Arc::new(HashMap::new()));
    }

    /// Counts a planned run that deviated from its plan.
    pub fn note_deviation(&self) {
        self.deviations.fetch_add(1, Ordering::Relaxed);
    }

    /// Every `(key, plan)` held, for saving.
    pub fn entries(&self) -> Vec<(K, Arc<Plan>)> {
        self.map
            .load()
            .iter()
            .map(|(k, e)| (k.clone(), Arc::clone(&e.plan)))
            .collect()
    }

    /// The capacity.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The counters.
    pub fn stats(&self) -> PlanStats {
        PlanStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            inserts: self.inserts.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            deviations: self.deviations.load(Ordering::Relaxed),
            plans: self.map.load().len(),
        }
    }
}

impl<K> std::fmt::Debug for PlanCache<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanCache")
            .field("capacity", &self.capacity)
            .field("plans", &self.map.load().len())
            .finish()
    }
}
