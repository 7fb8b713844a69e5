//! [`PlanCache`]: plans by exact key, bounded, least recently used out,
//! and the families those keys belong to, which plan keys never seen.

use super::family::{Families, FamilyCounts, FamilyStats, Learning};
use super::solver::{Depth, Placement};
use super::store::FamilySnapshot;
use super::{DynamicReason, KeyDims, Plan, PlanSource, Recording};
use crate::RunReport;
use parking_lot::Mutex;
use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
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
    /// Runs counted through [`PlanCache::after_run`], by how they were
    /// served (exact, predicted, fell back, dynamic), over every family.
    pub runs: FamilyCounts,
    /// Families held now.
    pub families: usize,
    /// Refits made off the run's path ([`PlanCache::learn`]).
    pub refits_learned: u64,
}

struct Entry {
    plan: Arc<Plan>,
    /// Stamp of the last lookup that returned this entry.
    last_used: AtomicU64,
    /// Whether the plan was learned from a run much smaller than the
    /// key's plan before it: the key's sizes depend on the data
    /// ([`PlanCache::after_run`]), and it grows back only after
    /// `need::GROW_BACK` runs in a row past it.
    shrunk: bool,
    /// Runs in a row that left the plan (reset by one that kept to it).
    over: AtomicU32,
}

/// Plans by key, bounded, least recently used out; and plan families,
/// which plan a key never seen from the keys of its family seen before.
///
/// Exact plans: [`PlanCache::get`] and [`PlanCache::insert`]. Families:
/// [`PlanCache::lookup`] before a run (the key's own plan, else one
/// predicted from its family, else none) and [`PlanCache::after_run`]
/// after it (counts the run, learns its plan, adds its shape to the
/// family and fits the family again). Families are kept apart from the
/// exact plans, so shapes that never repeat (continuous widths, say) do
/// not churn them: the exact plans come and go, least recently used out,
/// and the family goes on predicting.
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
    families: Mutex<Families>,
    /// Whether [`PlanCache::after_run`] leaves refits to [`PlanCache::learn`].
    defer: AtomicBool,
    /// Whether a refit was left since the last [`PlanCache::learn`].
    owes: AtomicBool,
    /// Refits made by [`PlanCache::learn`].
    refits_learned: AtomicU64,
    /// Runs whose own plan is left to [`PlanCache::learn`] to solve.
    solves: Mutex<Vec<Solve<K>>>,
    /// Whether a dynamic run's own plan is left to it too.
    defer_first: AtomicBool,
}

/// A run's own plan, left to [`PlanCache::learn`] to solve and keep as
/// [`PlanCache::after_run`] would have (its family observed the run
/// already).
struct Solve<K> {
    key: K,
    family: u64,
    recording: Recording,
    /// The run was served dynamically (its plan must not need more).
    dynamic: bool,
    high_water: usize,
    /// The run followed a plan that left its workspaces apart for a while:
    /// its recording lacks those, and so does its plan.
    apart: bool,
}

/// The plan to serve a run with, from [`PlanCache::lookup`].
#[derive(Clone, Debug)]
pub struct Lookup {
    /// The plan, if any.
    pub plan: Option<Arc<Plan>>,
    /// Where it came from (or why there is none).
    pub source: PlanSource,
}

impl Lookup {
    /// No plan, for the reason given.
    pub fn none(why: DynamicReason) -> Self {
        Self {
            plan: None,
            source: PlanSource::Dynamic(why),
        }
    }
}

/// Families kept by a cache.
const FAMILIES: usize = 64;

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
            families: Mutex::new(Families::new(FAMILIES)),
            defer: AtomicBool::new(false),
            owes: AtomicBool::new(false),
            refits_learned: AtomicU64::new(0),
            solves: Mutex::new(Vec::new()),
            defer_first: AtomicBool::new(false),
        }
    }

    /// Whether [`after_run`](Self::after_run) refits a family on the run's
    /// thread (`false`, the default) or leaves the refit to
    /// [`learn`](Self::learn), called off the run's path (a background
    /// thread, an idle moment). Deferred, the own plan of a run that had a
    /// plan (it fell back, or kept a loose prediction) is solved and
    /// learned there too (or by the key's next [`lookup`](Self::lookup),
    /// if that comes first: a key seen before is served on its own plan);
    /// a family's first fit is made by `after_run` either way (so that the
    /// next shape is predicted). A deferred refit (a shape past the range
    /// seen, a prediction that failed or was loose) leaves the family
    /// predicting from its previous fit until it is learned.
    pub fn set_deferred_learning(&self, on: bool) {
        self.defer.store(on, Ordering::Relaxed);
    }

    /// With deferred learning, whether a dynamic run's own plan (a key's
    /// first) is left to [`learn`](Self::learn) as well (`false`, the
    /// default: a caller that sizes its memory by the plan just learned,
    /// as a worker shrinking to its need does, has it at once). A caller
    /// that learns between runs, before the next lookup, loses nothing by
    /// it.
    pub fn set_deferred_first_plans(&self, on: bool) {
        self.defer_first.store(on, Ordering::Relaxed);
    }

    /// Whether plans or refits were left to [`learn`](Self::learn) since it
    /// last ran.
    pub fn owes(&self) -> bool {
        self.owes.load(Ordering::Acquire)
    }

    /// Whether family `id`'s current structure owes its fit (tests).
    #[cfg(test)]
    pub(crate) fn owes_fit(&self, id: u64) -> bool {
        self.families.lock().owed_by(id).is_some()
    }

    /// Solves the plans runs left, then makes the refits they left
    /// ([`set_deferred_learning`](Self::set_deferred_learning)),
    /// outside the families' lock (lookups and runs go on meanwhile), and
    /// installs each. A family that saw new shapes while its refit was made
    /// predicts from it and keeps owing the rest, made again, up to three
    /// rounds (then [`owes`](Self::owes) stays true). Returns the refits
    /// that left nothing owed. Safe to call from any thread, at any time,
    /// concurrently.
    pub fn learn(&self) -> usize {
        // Runs' own plans first: their shapes join the families, whose
        // refits follow.
        self.learn_solves();
        let mut installed = 0;
        let mut left = false;
        for _ in 0..3 {
            self.owes.store(false, Ordering::Release);
            let owed = self.families.lock().owed();
            if owed.is_empty() {
                left = false;
                break;
            }
            let made: Vec<_> = owed.iter().map(|o| o.refit()).collect();
            let mut families = self.families.lock();
            let mut settled = 0;
            for (o, fit) in owed.iter().zip(made) {
                settled += usize::from(families.install(o, fit));
            }
            installed += settled;
            left = settled < owed.len();
        }
        if left {
            self.owes.store(true, Ordering::Release);
        }
        self.refits_learned
            .fetch_add(installed as u64, Ordering::Relaxed);
        installed
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
        self.insert_entry(key, plan, false);
    }

    /// [`PlanCache::insert`], with the plan marked as learned from a run
    /// much smaller than the key's plan before it (`shrunk`).
    fn insert_entry(&self, key: K, plan: Arc<Plan>, shrunk: bool) {
        let _writer = self.writer.lock();
        let mut map: HashMap<K, Arc<Entry>> = (**self.map.load()).clone();
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        map.insert(
            key,
            Arc::new(Entry {
                plan,
                last_used: AtomicU64::new(now),
                shrunk,
                over: AtomicU32::new(0),
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

    /// Drops every plan and every family.
    pub fn clear(&self) {
        let _writer = self.writer.lock();
        self.map.store(Arc::new(HashMap::new()));
        self.families.lock().clear();
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
        let (runs, families) = {
            let f = self.families.lock();
            (f.totals(), f.len())
        };
        PlanStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            inserts: self.inserts.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            deviations: self.deviations.load(Ordering::Relaxed),
            plans: self.map.load().len(),
            runs,
            families,
            refits_learned: self.refits_learned.load(Ordering::Relaxed),
        }
    }

    /// Every family's state and counts, by name.
    pub fn families(&self) -> Vec<FamilyStats> {
        self.families.lock().stats()
    }

    /// The structure of family `id` with `events`, if held.
    fn shape(&self, id: u64, events: &[super::PlanEvent]) -> Option<Arc<super::family::Shape>> {
        self.families.lock().shape(id, events)
    }

    /// The plan for a run of `key`: its own if one was learned
    /// ([`PlanSource::Exact`], counted as a hit), else one predicted from
    /// its family's earlier shapes ([`PlanSource::Predicted`]: the fit of
    /// each block's size, evaluated at the key's dimensions, and solved),
    /// else none, with why. Pass the result to [`PlanCache::after_run`]
    /// when the run ends.
    pub fn lookup<Q>(&self, key: &Q) -> Lookup
    where
        K: Borrow<Q>,
        Q: Hash + Eq + KeyDims + ?Sized,
    {
        if let Some(plan) = self.get(key) {
            return Lookup {
                plan: Some(plan),
                source: PlanSource::Exact,
            };
        }
        // The key's own plan, left to the learner and not made yet, is
        // made now: a key seen before is served on its own plan.
        if self.solve_now(key) {
            if let Some(plan) = self.peek(key) {
                return Lookup {
                    plan: Some(plan),
                    source: PlanSource::Exact,
                };
            }
        }
        // A structure loaded from a store owes its fit; a cache with no
        // learner makes it here, once, for the family asked about.
        if self.owes() && !self.defer.load(Ordering::Relaxed) {
            let owed = self.families.lock().owed_by(key.family());
            if let Some(owed) = owed {
                let fit = owed.refit();
                self.families.lock().install(&owed, fit);
            }
        }
        let prediction = self.families.lock().prediction(key.family());
        let prediction = match prediction {
            Ok(p) => p,
            Err(why) => return Lookup::none(why),
        };
        let mut dims = Vec::new();
        key.dims(&mut dims);
        match prediction.plan(&dims) {
            Ok(plan) => Lookup {
                plan: Some(Arc::new(plan)),
                source: PlanSource::Predicted,
            },
            Err(why) => Lookup::none(why),
        }
    }

    /// After a run of `key` served as `lookup` said: counts it in its
    /// family (exact, predicted, fell back and why, dynamic), and, if it
    /// `succeeded`, learns from it. A run served by its key's own plan to
    /// the end teaches nothing new; any other run's plan (the prediction it
    /// followed, or its own `recording` where it left or undercut the
    /// prediction, or ran dynamically) becomes its key's plan, and its
    /// sizes join its family's shapes, which are fitted again. Returns the
    /// plan learned, if any.
    ///
    /// `report` and `recording` are the run's, as
    /// [`RawArena::finish_run`](crate::RawArena::finish_run) or
    /// [`Run::finish_with_recording`](crate::Run::finish_with_recording)
    /// return them (a dynamic run must have been opened recorded to teach
    /// anything).
    pub fn after_run<Q>(
        &self,
        key: &Q,
        lookup: &Lookup,
        report: &RunReport,
        recording: &Recording,
        succeeded: bool,
    ) -> Option<Arc<Plan>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + KeyDims + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        let source = match lookup.source {
            // The plan's block could not be had: the run was dynamic.
            PlanSource::Exact | PlanSource::Predicted if !report.planned => {
                PlanSource::Dynamic(DynamicReason::Off)
            }
            s => s,
        };
        let id = key.family();
        {
            let fell_back = (source == PlanSource::Predicted && report.deviated)
                .then(|| report.deviation.unwrap_or(super::Deviation::Short));
            // A planned run (exact or predicted) that left its plan: the
            // family's plans are robust from now on.
            let left = report.planned && report.deviated;
            self.families
                .lock()
                .record(id, || key.family_name(), source, fell_back, left);
        }
        if report.deviated {
            self.note_deviation();
        }
        if !succeeded {
            return None;
        }
        if source == PlanSource::Exact {
            if let Some(step) = self.exact_follows_need(key, lookup, report, recording) {
                return step;
            }
        }
        let mut hint = None;
        // A run on a plan that left its workspaces apart recorded none of
        // those it served so: its own plan leaves them apart too.
        let apart = lookup.plan.as_ref().is_some_and(|p| p.workspaces_apart());
        // A prediction the run kept to (its blocks within their slots) and
        // that was tight: its plan is kept as the key's, with no search,
        // and the fit explains this shape already, so the shape joins the
        // family without a refit (the next failed or loose prediction
        // refits with it). Learning then costs a well-predicted run
        // nothing but bookkeeping.
        let kept = source == PlanSource::Predicted && report.planned && !report.deviated;
        // Kept, and tight: the prediction's lower bound within 1/64 (and a
        // granule) of the run's own, and its layout within 1/64 of its
        // lower bound. A loose one (a fit from too few shapes) refits with
        // this shape, so that the next is tight; one laid out loosely (its
        // search, from another shape's order, on the run's path, stopped
        // short) has the key's own plan solved again, to a settled search.
        let tight = kept
            && lookup.plan.as_ref().is_some_and(|plan| {
                let own = if recording.is_empty() {
                    plan.lower_bound()
                } else {
                    recording.peak_live()
                };
                let lb = plan.lower_bound();
                lb <= own + own / 64 + plan.align() && plan.size() <= lb + lb / 64 + plan.align()
            });
        let plan = match (&lookup.plan, recording.is_empty()) {
            // Followed to the end, every block as predicted.
            (Some(plan), true) if report.planned && !report.deviated => Arc::clone(plan),
            // Kept and tight: the prediction is the key's plan. A loose
            // one (slots well over the run's sizes) is solved from the
            // run's own recording below, so that the key's later runs are
            // served at their own lower bound, not the loose prediction's.
            (Some(plan), false) if tight => Arc::clone(plan),
            // Solved by a learner, off the run's path; the family
            // observes the run's sizes now (a first fit is made here, so
            // that the next shape is predicted).
            (_, false)
                if self.defer.load(Ordering::Relaxed)
                    && (lookup.plan.is_some() || self.defer_first.load(Ordering::Relaxed)) =>
            {
                let mut dims = Vec::new();
                key.dims(&mut dims);
                self.solves.lock().push(Solve {
                    key: key.to_owned().into(),
                    family: id,
                    recording: recording.clone(),
                    dynamic: matches!(source, PlanSource::Dynamic(_)),
                    high_water: report.high_water,
                    apart,
                });
                self.owes.store(true, Ordering::Release);
                let learning = Learning {
                    refit: !tight,
                    defer: true,
                    import: false,
                };
                self.families.lock().observe(
                    id,
                    || key.family_name(),
                    dims,
                    recording,
                    None,
                    learning,
                );
                return None;
            }
            // Searched from where the structure's last search ended, if
            // the family knows the structure (solved outside the lock).
            (_, false) => {
                let plan = match self.shape(id, &recording.events) {
                    Some(shape) => shape.plan(recording, Depth::Settled)?,
                    None => {
                        let (plan, next) = Plan::from_recording_hinted(
                            recording,
                            None,
                            Depth::Settled,
                            Placement::Close,
                        )
                        .ok()?;
                        hint = next;
                        plan
                    }
                };
                Arc::new(if apart {
                    plan.with_workspaces_apart()
                } else {
                    plan
                })
            }
            _ => return None,
        };
        let mut dims = Vec::new();
        key.dims(&mut dims);
        // The run's own sizes where it kept them (smaller than predicted).
        let seen = if kept && !recording.is_empty() {
            std::borrow::Cow::Borrowed(recording)
        } else {
            std::borrow::Cow::Owned(plan.recording())
        };
        self.keep(
            key.to_owned().into(),
            Arc::clone(&plan),
            matches!(source, PlanSource::Dynamic(_)),
            report.high_water,
        );
        let learning = Learning {
            refit: !tight,
            defer: self.defer.load(Ordering::Relaxed),
            import: false,
        };
        let owed =
            self.families
                .lock()
                .observe(id, || key.family_name(), dims, &seen, hint, learning);
        if owed {
            self.owes.store(true, Ordering::Release);
        }
        Some(plan)
    }

    /// Solves every plan left by [`after_run`](Self::after_run).
    fn learn_solves(&self) {
        let solves = core::mem::take(&mut *self.solves.lock());
        for solve in solves {
            self.learn_solve(solve);
        }
    }

    /// Solves the plan left for `key` by [`after_run`](Self::after_run),
    /// if one is waiting for the learner; whether one was.
    fn solve_now<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let solve = {
            let mut solves = self.solves.lock();
            match solves.iter().position(|s| s.key.borrow() == key) {
                Some(i) => solves.remove(i),
                None => return false,
            }
        };
        self.learn_solve(solve);
        true
    }

    /// Solves and keeps a run's own plan left by
    /// [`after_run`](Self::after_run), as it would have (from where the
    /// structure's last search ended, if the family knows it).
    fn learn_solve(&self, solve: Solve<K>) {
        let Solve {
            key,
            family,
            recording,
            dynamic,
            high_water,
            apart,
        } = solve;
        let plan = match self.shape(family, &recording.events) {
            Some(shape) => shape.plan(&recording, Depth::Settled),
            None => Plan::from_recording_close(&recording),
        };
        let plan = plan.map(|p| if apart { p.with_workspaces_apart() } else { p });
        if let Some(plan) = plan {
            self.keep(key, Arc::new(plan), dynamic, high_water);
        }
    }

    /// Keeps `plan`, learned from a run of `key`, as the key's, unless it
    /// needs more than the run needed `dynamic`ally (its high-water mark,
    /// to a granule): a plan must never cost more than no plan. (A report
    /// with no high-water mark, of a run that placed nothing or made up by
    /// a caller that serves runs itself, vetoes nothing.)
    fn keep(&self, key: K, plan: Arc<Plan>, dynamic: bool, high_water: usize) {
        let dynamic_need = high_water.saturating_add(plan.align());
        if !dynamic || high_water == 0 || plan.size() <= dynamic_need {
            self.insert(key, plan);
        }
    }

    /// What a plan store saves ([`super::store`]): every plan by key,
    /// least recently used first, and every family's structures and
    /// shapes.
    pub(crate) fn snapshot(&self) -> (Vec<(K, Arc<Plan>)>, Vec<FamilySnapshot>) {
        // Every plan learned so far, those left to the learner included.
        self.learn_solves();
        let map = self.map.load();
        let mut plans: Vec<(u64, K, Arc<Plan>)> = map
            .iter()
            .map(|(k, e)| {
                let used = e.last_used.load(Ordering::Relaxed);
                (used, k.clone(), Arc::clone(&e.plan))
            })
            .collect();
        plans.sort_by_key(|p| p.0);
        let plans = plans.into_iter().map(|(_, k, p)| (k, p)).collect();
        (plans, self.families.lock().export())
    }

    /// Adds what a plan store loaded: `plans` (valid, least recently used
    /// first) in one publish, the most recent kept where they pass the
    /// capacity, and `families` through the same path as a run's shapes
    /// ([`Families::import`]): no fit is made; each structure owes its
    /// fit (then [`owes`](Self::owes) is true), made by
    /// [`learn`](Self::learn) with deferred learning, else by the first
    /// [`lookup`](Self::lookup) that needs a prediction from it.
    pub(crate) fn restore(&self, plans: Vec<(K, Arc<Plan>)>, families: Vec<FamilySnapshot>) {
        {
            let _writer = self.writer.lock();
            let mut map: HashMap<K, Arc<Entry>> = (**self.map.load()).clone();
            let added = plans.len() as u64;
            for (key, plan) in plans {
                let now = self.clock.fetch_add(1, Ordering::Relaxed);
                let last_used = AtomicU64::new(now);
                let entry = Entry {
                    plan,
                    last_used,
                    shrunk: false,
                    over: AtomicU32::new(0),
                };
                map.insert(key, Arc::new(entry));
            }
            if map.len() > self.capacity {
                let mut stamps: Vec<u64> = map
                    .values()
                    .map(|e| e.last_used.load(Ordering::Relaxed))
                    .collect();
                stamps.sort_unstable();
                let keep_from = stamps[map.len() - self.capacity];
                let before = map.len();
                map.retain(|_, e| e.last_used.load(Ordering::Relaxed) >= keep_from);
                self.evictions
                    .fetch_add((before - map.len()) as u64, Ordering::Relaxed);
            }
            self.inserts.fetch_add(added, Ordering::Relaxed);
            self.map.store(Arc::new(map));
        }
        let defer = self.defer.load(Ordering::Relaxed);
        if self.families.lock().import(families, defer) {
            self.owes.store(true, Ordering::Release);
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

#[path = "cache_need.rs"]
mod need;

#[cfg(test)]
#[path = "cache_tests.rs"]
mod learn_tests;
