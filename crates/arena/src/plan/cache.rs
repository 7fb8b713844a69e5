//! [`PlanCache`]: plans by exact key, bounded, least recently used out.

use super::Plan;
use parking_lot::Mutex;
use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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
