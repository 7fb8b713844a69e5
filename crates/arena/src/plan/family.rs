//! Plan families: the runs of one model share their structure across input
//! shapes, and each block's size follows the key's dimensions, so a key
//! never seen is planned from the keys seen before ([`Families`]).

use super::fit::{Fit, NoPrediction, Observation};
use super::solver::{Depth, Hint, Placement};
use super::store::{FamilySnapshot, ShapeSnapshot, StructureSnapshot};
use super::{Deviation, Plan, PlanEvent, Recording};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub use super::family_counts::{DynamicReason, FamilyCounts, FamilyStats, PlanSource};

/// Shapes kept per structure to fit from (oldest out).
const MAX_SHAPES: usize = 8;
/// Structures kept per family (least recently seen out).
const MAX_STRUCTURES: usize = 4;

/// The events and alignments of one run structure, shared with the plans
/// predicted from it, and where the latest search for a plan of it ended.
#[derive(Debug)]
pub(crate) struct Shape {
    events: Vec<PlanEvent>,
    aligns: Vec<usize>,
    /// The placement order the latest plan of the structure (predicted or
    /// learned, at any shape) was found with: the next search starts from
    /// it, so the structure's plans improve as its shapes come, at no more
    /// work per plan.
    hint: Mutex<Option<Hint>>,
    /// Whether a run of its family has left its plan, or its runs came in
    /// two structures: the structure's plans are robust
    /// ([`Placement::Robust`]) from then on.
    robust: AtomicBool,
}

impl Shape {
    /// What a fit rounds sizes to: the structure's smallest alignment.
    fn rounding(&self) -> usize {
        self.aligns.iter().copied().min().unwrap_or(1)
    }

    /// Plans `rec` (a run of this structure), its search started where the
    /// last one ended, and keeps where this one ends; a `Settled` search
    /// goes on where that start leaves the plan loose ([`Depth`]).
    /// Placed robust once a run of the family has left its plan or its
    /// runs came in two structures ([`Placement::Robust`]).
    pub(crate) fn plan(&self, rec: &Recording, depth: Depth) -> Option<Plan> {
        let hint = self.hint.lock().clone();
        let placement = if self.robust.load(Ordering::Relaxed) {
            Placement::Robust
        } else {
            Placement::Close
        };
        let (plan, next) =
            Plan::from_recording_hinted(rec, hint.as_ref(), depth, placement).ok()?;
        if next.is_some() {
            *self.hint.lock() = next;
        }
        Some(plan)
    }
}

struct Structure {
    shape: Arc<Shape>,
    obs: VecDeque<Observation>,
    fit: Option<Arc<Fit>>,
    last_used: u64,
    /// A refit its shapes asked for that was left to a learner
    /// ([`Families::owed`]): `Some(afresh)`, `afresh` when a shape was
    /// replaced or evicted since the fit (then the fit is made anew, not
    /// block by block).
    owed: Option<bool>,
    /// Bumped by every shape observed: a refit made from an older set of
    /// shapes is not installed ([`Families::install`]).
    generation: u64,
    /// Whether its runs differ by workspaces: its events and sizes are
    /// their core ([`Recording::core`]), and its plans serve workspaces
    /// apart ([`Plan::workspaces_apart`]).
    apart: bool,
}

impl Structure {
    /// Whether `events` (a run's core) are this structure's core.
    fn core_is(&self, events: &[PlanEvent]) -> bool {
        if self.apart {
            return self.shape.events == events;
        }
        let own = self.recording();
        match own.core() {
            Some(core) => core.events == events,
            None => own.events == events,
        }
    }

    /// The structure's events with its alignments (sizes 0).
    fn recording(&self) -> Recording {
        Recording {
            blocks: self.shape.aligns.iter().map(|&a| (0, a)).collect(),
            events: self.shape.events.clone(),
        }
    }

    /// Makes the structure its runs' core: its workspaces out of its
    /// events and shapes, its fit made afresh from what is left.
    fn go_apart(&mut self) {
        if self.apart {
            return;
        }
        self.apart = true;
        let own = self.recording();
        let (Some(map), Some(core)) = (own.core_indices(), own.core()) else {
            return;
        };
        let kept = |v: &[usize]| {
            v.iter()
                .zip(&map)
                .filter(|(_, &j)| j != u32::MAX)
                .map(|(&x, _)| x)
                .collect::<Vec<_>>()
        };
        self.shape = Arc::new(Shape {
            events: core.events,
            aligns: kept(&self.shape.aligns),
            hint: Mutex::new(None),
            robust: AtomicBool::new(self.shape.robust.load(Ordering::Relaxed)),
        });
        for o in &mut self.obs {
            o.sizes = kept(&o.sizes);
            o.lower_bound = Recording {
                blocks: o
                    .sizes
                    .iter()
                    .copied()
                    .zip(self.shape.aligns.iter().copied())
                    .collect(),
                events: self.shape.events.clone(),
            }
            .peak_live();
        }
        self.fit = None;
        self.owed = None;
        self.generation += 1;
    }
}

/// How [`Families::observe`] learns a shape: `refit` when its prediction
/// failed or was loose (a shape past the range seen, or an ambiguous fit,
/// refits anyway); `defer` to leave the refit to a learner
/// ([`Families::owed`]) where the structure has a fit to go on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Learning {
    pub(crate) refit: bool,
    pub(crate) defer: bool,
    /// A shape loaded from a plan store ([`Families::import`]): only added,
    /// never fitted; with `refit` (its structure's last shape) the
    /// structure owes its fit, made later with every shape in.
    pub(crate) import: bool,
}

/// A refit left to a learner: the structure's shapes and fit when it was
/// taken ([`Families::owed`]), to be made outside the lock and installed
/// with [`Families::install`].
pub(crate) struct Owed {
    family: u64,
    shape: Arc<Shape>,
    generation: u64,
    obs: Vec<Observation>,
    fit: Option<Arc<Fit>>,
    afresh: bool,
}

impl Owed {
    /// Makes the refit (the costly part: no lock is held).
    pub(crate) fn refit(&self) -> Option<Arc<Fit>> {
        fit_of(
            self.fit.as_ref(),
            self.afresh,
            &self.obs,
            self.shape.rounding(),
        )
    }
}

/// The fit of `obs` (none under two shapes): block by block from `fit`
/// (only the blocks a new shape contradicts are fitted from scratch), or
/// anew when `afresh` or there is none.
fn fit_of(
    fit: Option<&Arc<Fit>>,
    afresh: bool,
    obs: &[Observation],
    rounding: usize,
) -> Option<Arc<Fit>> {
    (obs.len() >= 2).then(|| {
        Arc::new(match fit {
            Some(fit) if !afresh => fit.refit(obs, rounding),
            _ => Fit::new(obs, rounding),
        })
    })
}

struct Family {
    name: String,
    structures: Vec<Structure>,
    counts: FamilyCounts,
    last_used: u64,
    /// Whether a run of the family has left its plan (exact or
    /// predicted), or its runs came in two structures: its structures'
    /// plans are robust ([`Shape::plan`]).
    left: bool,
}

impl Family {
    /// Makes the family's plans robust from now on ([`Family::left`]).
    fn leave(&mut self) {
        if !self.left {
            self.left = true;
            for s in &self.structures {
                s.shape.robust.store(true, Ordering::Relaxed);
            }
        }
    }
}

/// A prediction to make outside the lock: the fit and the structure.
pub(crate) struct Prediction {
    pub(crate) fit: Arc<Fit>,
    pub(crate) shape: Arc<Shape>,
    /// Whether the structure is its runs' core ([`Plan::workspaces_apart`]).
    pub(crate) apart: bool,
}

impl Prediction {
    /// The plan of the recording a run at `dims` is predicted to make,
    /// searched from where the structure's last search ended; or why there
    /// is none: models that explain the shapes seen alike disagree at
    /// `dims` by more than a sixty-fourth of its live bytes (and a
    /// quantum a block), or the prediction is past [`Fit::bound`] (both
    /// refused before any search).
    pub(crate) fn plan(&self, dims: &[u64]) -> Result<Plan, DynamicReason> {
        let rec = self.recording(dims, self.fit.bound(dims))?;
        let plan = self
            .shape
            .plan(&rec, Depth::Quick)
            .ok_or(DynamicReason::Unpredictable)?
            .predicted();
        Ok(if self.apart {
            plan.with_workspaces_apart()
        } else {
            plan
        })
    }

    /// The recording a run at `dims` is predicted to make, if its live
    /// bytes are within `bound` (else `Unbounded`, before any ambiguity:
    /// the largest a fit says past what any run justifies is the stronger
    /// reason).
    fn recording(&self, dims: &[u64], bound: usize) -> Result<Recording, DynamicReason> {
        let predicted = self.fit.predict(dims).map_err(|why| match why {
            NoPrediction::Unfit => DynamicReason::Unfit,
            NoPrediction::Unpredictable => DynamicReason::Unpredictable,
            NoPrediction::Unvaried => DynamicReason::Unvaried,
        })?;
        let rec = self.with_sizes(predicted.sizes);
        let most = rec.peak_live();
        if most > bound {
            return Err(DynamicReason::Unbounded);
        }
        if let Some(least) = predicted.least {
            // Where the models the shapes cannot tell apart disagree, the
            // largest is predicted only if it costs no more than the least
            // (live bytes, to a sixty-fourth): a slot that scaled with the
            // batch where the block follows the sequence would hold a plan
            // several times the run's need.
            let fewest = self.with_sizes(least).peak_live();
            let slack = self.fit.quantum().saturating_mul(rec.blocks.len());
            if most > fewest + fewest / 64 + slack {
                return Err(DynamicReason::Ambiguous);
            }
        }
        Ok(rec)
    }

    /// The structure's recording with these block sizes.
    fn with_sizes(&self, sizes: Vec<usize>) -> Recording {
        Recording {
            blocks: sizes
                .into_iter()
                .zip(self.shape.aligns.iter().copied())
                .collect(),
            events: self.shape.events.clone(),
        }
    }
}

/// Every family of a [`PlanCache`](super::PlanCache), bounded (least
/// recently used out).
pub(crate) struct Families {
    map: HashMap<u64, Family>,
    /// Every run counted, in families held or gone.
    total: FamilyCounts,
    capacity: usize,
    clock: u64,
}

impl Families {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            map: HashMap::new(),
            total: FamilyCounts::default(),
            capacity: capacity.max(1),
            clock: 0,
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The fit to predict family `id`'s next run from (its most recently
    /// seen structure's), or why there is none.
    pub(crate) fn prediction(&mut self, id: u64) -> Result<Prediction, DynamicReason> {
        let now = self.tick();
        let family = self.map.get_mut(&id).ok_or(DynamicReason::NewFamily)?;
        family.last_used = now;
        let s = family
            .structures
            .iter_mut()
            .max_by_key(|s| s.last_used)
            .ok_or(DynamicReason::NewFamily)?;
        match &s.fit {
            None => Err(DynamicReason::OneShape),
            Some(fit) => Ok(Prediction {
                fit: Arc::clone(fit),
                shape: Arc::clone(&s.shape),
                apart: s.apart,
            }),
        }
    }

    /// The structure of family `id` whose events are `events`, if held.
    pub(crate) fn shape(&self, id: u64, events: &[PlanEvent]) -> Option<Arc<Shape>> {
        let family = self.map.get(&id)?;
        let s = family
            .structures
            .iter()
            .find(|s| s.shape.events == events)?;
        Some(Arc::clone(&s.shape))
    }

    /// The counts of family `id` (made on first sight, named `name`).
    fn counts(&mut self, id: u64, name: impl FnOnce() -> String) -> &mut FamilyCounts {
        let now = self.tick();
        if !self.map.contains_key(&id) {
            self.make_room();
            self.map.insert(
                id,
                Family {
                    name: name(),
                    structures: Vec::new(),
                    counts: FamilyCounts::default(),
                    last_used: now,
                    left: false,
                },
            );
        }
        let family = self.map.get_mut(&id).expect("just made");
        family.last_used = now;
        &mut family.counts
    }

    fn make_room(&mut self) {
        while self.map.len() >= self.capacity {
            let Some(oldest) = self
                .map
                .iter()
                .min_by_key(|(_, f)| f.last_used)
                .map(|(&k, _)| k)
            else {
                return;
            };
            self.map.remove(&oldest);
        }
    }

    /// Adds what a run at `dims` did (a valid recording) to family `id`,
    /// and, if `refit` (or the structure has no fit yet), fits its
    /// structure again; `hint` (where the search for the run's plan ended,
    /// when no structure of the family could start it) starts the
    /// structure's next search. A run that kept to its prediction passes
    /// `refit: false`: the fit explains it already, and the shape waits
    /// for the next refit, unless it widens the range of shapes seen.
    pub(crate) fn observe(
        &mut self,
        id: u64,
        name: impl FnOnce() -> String,
        dims: Vec<u64>,
        rec: &Recording,
        hint: Option<Hint>,
        learning: Learning,
    ) -> bool {
        let Learning {
            refit,
            defer,
            import,
        } = learning;
        let now = self.tick();
        self.counts(id, name);
        let family = self.map.get_mut(&id).expect("made by counts");
        let fits_dims = |s: &Structure| s.obs.front().is_none_or(|o| o.dims.len() == dims.len());
        let mut pos = family
            .structures
            .iter()
            .position(|s| s.shape.events == rec.events && fits_dims(s));
        // A run that differs from a structure by its workspaces only
        // (blocks freed right after their allocation, which cuDNN and
        // cuBLAS pick per shape) joins it: the structure is its runs' core
        // from then on, and its plans leave workspaces to the run.
        let mut core = None;
        if pos.is_none() {
            let own = rec.core();
            let events = &own.as_ref().unwrap_or(rec).events;
            pos = family
                .structures
                .iter()
                .position(|s| fits_dims(s) && s.core_is(events));
            if let Some(p) = pos {
                family.structures[p].go_apart();
                core = own;
            }
        }
        // A hint is a placement of the run's own blocks: a core has others.
        let hint = hint.filter(|_| core.is_none());
        let rec = core.as_ref().unwrap_or(rec);
        let aligns = || rec.blocks.iter().map(|b| b.1).collect::<Vec<_>>();
        let s = match pos {
            Some(p) => &mut family.structures[p],
            None => {
                // A second structure: the model's runs differ by their
                // blocks or their order (data-dependent control flow), so
                // its runs will leave their plans too.
                if !family.structures.is_empty() {
                    family.leave();
                }
                if family.structures.len() >= MAX_STRUCTURES {
                    if let Some(oldest) =
                        (0..family.structures.len()).min_by_key(|&i| family.structures[i].last_used)
                    {
                        family.structures.swap_remove(oldest);
                    }
                }
                family.structures.push(Structure {
                    shape: Arc::new(Shape {
                        events: rec.events.clone(),
                        aligns: aligns(),
                        hint: Mutex::new(None),
                        robust: AtomicBool::new(family.left),
                    }),
                    obs: VecDeque::new(),
                    fit: None,
                    last_used: now,
                    owed: None,
                    generation: 0,
                    apart: false,
                });
                family.structures.last_mut().expect("just pushed")
            }
        };
        s.last_used = now;
        if hint.is_some() {
            *s.shape.hint.lock() = hint;
        }
        // A larger alignment than the structure's so far widens it.
        if s.shape
            .aligns
            .iter()
            .zip(&rec.blocks)
            .any(|(a, b)| b.1 > *a)
        {
            let aligns = s
                .shape
                .aligns
                .iter()
                .zip(&rec.blocks)
                .map(|(a, b)| (*a).max(b.1))
                .collect();
            let hint = s.shape.hint.lock().clone();
            s.shape = Arc::new(Shape {
                events: s.shape.events.clone(),
                aligns,
                hint: Mutex::new(hint),
                robust: AtomicBool::new(s.shape.robust.load(Ordering::Relaxed)),
            });
        }
        let sizes: Vec<usize> = rec.blocks.iter().map(|b| b.0).collect();
        let before = s.obs.len();
        s.obs.retain(|o| o.dims != dims);
        if s.obs.len() >= MAX_SHAPES {
            s.obs.pop_front();
        }
        // A shape gone (replaced or evicted) may rule monomials in again:
        // the fit is then made afresh, else from the current one.
        let only_added = s.obs.len() == before;
        // Of the structure's own blocks (a core's, where it is one): the
        // fit's bound and its test of keys that explain nothing compare
        // shapes by it.
        let lower_bound = rec.peak_live();
        s.obs.push_back(Observation {
            dims,
            sizes,
            lower_bound,
        });
        s.generation += 1;
        // A refit owed from scratch stays so until it is made.
        let afresh = !only_added || s.owed == Some(true);
        if afresh && s.owed.is_some() {
            s.owed = Some(true);
        }
        // A shape past the range seen so far (by the product of its
        // dimensions) widens what the fit knows: it refits even when its
        // prediction held, so that later extrapolations start from it. A
        // stream's range widens a few times, so this costs a few refits.
        let volume = |d: &[u64]| d.iter().map(|&x| x as f64).product::<f64>();
        let here = volume(&s.obs.back().expect("just pushed").dims);
        let widens = s
            .obs
            .iter()
            .rev()
            .skip(1)
            .map(|o| volume(&o.dims))
            .fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            });
        let widens = here < widens.0 || here > widens.1;
        // A fit that keeps models the shapes could not tell apart learns
        // from every shape (the one that tells them apart ends it).
        let ambiguous = s.fit.as_ref().is_some_and(|f| f.ambiguous());
        if import && !refit {
            return false;
        }
        if !refit && !widens && !ambiguous && s.fit.is_some() {
            return false;
        }
        // With a fit to go on, the refit is left to a learner when asked
        // (the run's thread then pays bookkeeping only); the first fit is
        // made here, so the next shape is predicted.
        // A structure loaded from a store owes its fit (a store's load
        // costs no fit at all): to the learner when there is one, else to
        // the first lookup that needs it.
        if (defer && s.fit.is_some() || import) && s.obs.len() >= 2 {
            s.owed = Some(afresh || s.fit.is_none());
            return true;
        }
        let obs: Vec<Observation> = s.obs.iter().cloned().collect();
        s.fit = fit_of(s.fit.as_ref(), afresh, &obs, s.shape.rounding());
        s.owed = None;
        false
    }

    /// The refits owed by every structure ([`Families::observe`] with
    /// `defer`), to make outside the lock. A structure stays owing until
    /// its refit is installed.
    pub(crate) fn owed(&self) -> Vec<Owed> {
        let mut out = Vec::new();
        for (&family, f) in &self.map {
            for s in &f.structures {
                if let Some(afresh) = s.owed {
                    out.push(Owed {
                        family,
                        shape: Arc::clone(&s.shape),
                        generation: s.generation,
                        obs: s.obs.iter().cloned().collect(),
                        fit: s.fit.clone(),
                        afresh,
                    });
                }
            }
        }
        out
    }

    /// The fit owed by family `id`'s current structure (the one
    /// [`Families::prediction`] predicts from), if it owes one: for a
    /// cache with no learner, made by the lookup that needs it (outside
    /// the lock) and installed.
    pub(crate) fn owed_by(&self, id: u64) -> Option<Owed> {
        let f = self.map.get(&id)?;
        let s = f.structures.iter().max_by_key(|s| s.last_used)?;
        let afresh = s.owed?;
        Some(Owed {
            family: id,
            shape: Arc::clone(&s.shape),
            generation: s.generation,
            obs: s.obs.iter().cloned().collect(),
            fit: s.fit.clone(),
            afresh,
        })
    }

    /// Installs a refit made from `owed`, if its structure is still held
    /// and owing. A structure that saw shapes since keeps owing (the next
    /// refit adds them) but predicts from this fit meanwhile: it explains
    /// more shapes than the one it replaces. Whether the structure owes
    /// nothing now.
    pub(crate) fn install(&mut self, owed: &Owed, fit: Option<Arc<Fit>>) -> bool {
        let Some(f) = self.map.get_mut(&owed.family) else {
            return false;
        };
        let Some(s) = f.structures.iter_mut().find(|s| {
            s.owed.is_some()
                && (Arc::ptr_eq(&s.shape, &owed.shape) || s.shape.events == owed.shape.events)
        }) else {
            return false;
        };
        if fit.is_some() {
            s.fit = fit;
        }
        if s.generation == owed.generation {
            s.owed = None;
            return true;
        }
        // Shapes added since (not replaced): block by block from here.
        false
    }

    /// Every family's state.
    pub(crate) fn stats(&self) -> Vec<FamilyStats> {
        let mut out: Vec<FamilyStats> = self
            .map
            .values()
            .map(|f| {
                let current = f.structures.iter().max_by_key(|s| s.last_used);
                FamilyStats {
                    name: f.name.clone(),
                    structures: f.structures.len(),
                    shapes: current.map_or(0, |s| s.obs.len()),
                    unfit_blocks: current
                        .and_then(|s| s.fit.as_ref())
                        .map_or(0, |fit| fit.unfit()),
                    counts: f.counts,
                }
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Every family's counts added up.
    pub(crate) fn totals(&self) -> FamilyCounts {
        self.total
    }

    /// Counts a run of family `id` served as `source` (and, for a
    /// prediction it left, why) in the family and in the totals; a planned
    /// run that `left` its plan makes the family's plans robust from now
    /// on ([`Shape::plan`]).
    pub(crate) fn record(
        &mut self,
        id: u64,
        name: impl FnOnce() -> String,
        source: PlanSource,
        fell_back: Option<Deviation>,
        left: bool,
    ) {
        let mut one = FamilyCounts::default();
        one.count(source);
        if let Some(why) = fell_back {
            one.fell_back_by(why);
        }
        self.counts(id, name).add(&one);
        self.total.add(&one);
        if left {
            self.map.get_mut(&id).expect("made by counts").leave();
        }
    }

    /// Families held.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn clear(&mut self) {
        self.map.clear();
    }

    /// Every family's structures and shapes, least recently used first
    /// (families, structures and shapes alike), for a plan store: what a
    /// fresh process needs to fit them again ([`Families::import`]).
    pub(crate) fn export(&self) -> Vec<FamilySnapshot> {
        let mut families: Vec<(&u64, &Family)> = self.map.iter().collect();
        families.sort_by_key(|(_, f)| f.last_used);
        families
            .into_iter()
            .map(|(&id, f)| {
                let mut structures: Vec<&Structure> = f.structures.iter().collect();
                structures.sort_by_key(|s| s.last_used);
                FamilySnapshot {
                    id,
                    name: f.name.clone(),
                    structures: structures
                        .into_iter()
                        .map(|s| StructureSnapshot {
                            events: s.shape.events.clone(),
                            aligns: s.shape.aligns.clone(),
                            shapes: s
                                .obs
                                .iter()
                                .map(|o| ShapeSnapshot {
                                    dims: o.dims.clone(),
                                    sizes: o.sizes.clone(),
                                    lower_bound: o.lower_bound,
                                })
                                .collect(),
                        })
                        .collect(),
                }
            })
            .collect()
    }

    /// Adds saved families ([`Families::export`]'s, from a plan store):
    /// each shape joins its family through [`Families::observe`], as a
    /// run's would, oldest first, consumed as it goes (one recording per
    /// structure, its sizes replaced shape by shape). Every shape's
    /// recording must pass [`Recording::validate`] (the store checks them
    /// all before it imports any).
    ///
    /// No fit is made here: a fit costs thousands of monomials a block,
    /// far more than the bytes that describe it, so a store's load would
    /// cost what its file's content chooses. Each structure of two shapes
    /// or more is left owing its fit ([`Families::owed`]): to the learner
    /// with `defer`, else to the first lookup that asks the family for a
    /// prediction ([`Families::owed_by`]). Whether any is.
    pub(crate) fn import(&mut self, families: Vec<FamilySnapshot>, defer: bool) -> bool {
        let mut owes = false;
        for f in families {
            let name = f.name;
            for s in f.structures {
                let last = s.shapes.len().saturating_sub(1);
                let aligns = s.aligns;
                let mut rec = Recording {
                    blocks: Vec::with_capacity(aligns.len()),
                    events: s.events,
                };
                for (i, shape) in s.shapes.into_iter().enumerate() {
                    rec.blocks.clear();
                    rec.blocks
                        .extend(shape.sizes.iter().copied().zip(aligns.iter().copied()));
                    let learning = Learning {
                        refit: i == last,
                        defer,
                        import: true,
                    };
                    let name = || name.clone();
                    owes |= self.observe(f.id, name, shape.dims, &rec, None, learning);
                }
            }
        }
        owes
    }
}
