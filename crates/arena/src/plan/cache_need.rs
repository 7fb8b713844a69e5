//! A key's own plan follows what its runs need
//! ([`PlanCache::exact_follows_need`]): where sizes depend on the data at
//! one shape, a run much smaller than its plan teaches the key.

use super::{Lookup, PlanCache};
use crate::plan::solver::Depth;
use crate::plan::{KeyDims, Plan, Recording};
use crate::RunReport;
use std::borrow::Borrow;
use std::hash::Hash;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A run that kept to its key's own plan and needed less than
/// `SHRINK_NUM / SHRINK_DEN` (four fifths) of the plan's lower bound (its
/// need counted with a granule a block) teaches the key its own, smaller
/// plan.
const SHRINK_NUM: usize = 4;
const SHRINK_DEN: usize = 5;

/// Runs in a row that leave a plan learned from a smaller run
/// (`Entry::shrunk`) before the key learns a larger one again: one
/// large run among small ones (200 detections among 0 to 3) falls back
/// once, served as no plan serves it, and leaves the small plan in place.
pub(super) const GROW_BACK: u32 = 2;

impl<K: Hash + Eq + Clone> PlanCache<K> {
    /// How a run served by its key's own plan teaches the key: `None` to
    /// learn as any other run does (it left a plan that was not learned
    /// from a smaller run), else what [`after_run`](Self::after_run)
    /// returns.
    ///
    /// A key's plan follows what its runs need, where sizes depend on the
    /// data at one shape (detections, `NonZero`, `TopK`): a run that kept
    /// to the plan but needed less than four fifths of its lower bound (to
    /// a granule a block) teaches the key its own plan at once, marked
    /// `Entry::shrunk` (so the key's next run draws what this one
    /// needed, not the most any run ever needed); and a key whose plan was
    /// so learned grows back only after [`GROW_BACK`] runs in a row past
    /// it (the hysteresis: a lone large run falls back, served as no plan
    /// serves it, and the small plan stays). A run that kept to its plan
    /// within that band teaches nothing.
    pub(super) fn exact_follows_need<Q>(
        &self,
        key: &Q,
        lookup: &Lookup,
        report: &RunReport,
        recording: &Recording,
    ) -> Option<Option<Arc<Plan>>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + KeyDims + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        let entry = self.map.load().get(key).map(Arc::clone);
        if report.deviated {
            let entry = entry.filter(|e| e.shrunk)?;
            let same = lookup
                .plan
                .as_ref()
                .is_some_and(|p| Arc::ptr_eq(p, &entry.plan));
            if same && entry.over.fetch_add(1, Ordering::Relaxed) + 1 < GROW_BACK {
                return Some(None);
            }
            return None;
        }
        if let Some(e) = entry.as_ref() {
            e.over.store(0, Ordering::Relaxed);
        }
        let plan = lookup.plan.as_ref()?;
        // A run served at every planned size records nothing: it needed
        // the plan's lower bound.
        if recording.is_empty() || recording.blocks.len() != plan.len() {
            return Some(None);
        }
        let need = recording.peak_live();
        let slack = plan.align().saturating_mul(plan.len());
        if plan.lower_bound() * SHRINK_NUM <= (need + slack) * SHRINK_DEN {
            return Some(None);
        }
        let id = key.family();
        let own = match self.shape(id, &recording.events) {
            Some(shape) => shape.plan(recording, Depth::Settled),
            None => Plan::from_recording_close(recording),
        };
        let own = own.map(|p| {
            if plan.workspaces_apart() {
                p.with_workspaces_apart()
            } else {
                p
            }
        });
        let Some(own) = own.filter(|p| p.size() < plan.size()) else {
            return Some(None);
        };
        let own = Arc::new(own);
        self.insert_entry(key.to_owned().into(), Arc::clone(&own), true);
        Some(Some(own))
    }
}
