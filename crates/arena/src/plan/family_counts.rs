//! How runs of a family were served, and why a run had no plan: the
//! counts a [`PlanCache`](super::PlanCache) reports per family.

use super::Deviation;

/// Why a run was not served on a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum DynamicReason {
    /// Its family has seen no shape yet.
    NewFamily,
    /// Its family has seen one shape: no fit yet.
    OneShape,
    /// Its family's sizes do not follow any fit (a data-dependent size),
    /// or its keys explain nothing (a shape at smaller dimensions needed
    /// more than one at larger: a key made of request counters).
    Unfit,
    /// The key's dimensions are not the family's, or a predicted size is
    /// not a size.
    Unpredictable,
    /// The key changes a dimension its family never saw vary, and the
    /// sizes seen cannot show which blocks follow it (its value is 1 or a
    /// power of two, or the blocks that show it hold too few of the
    /// varying bytes): the run teaches it.
    Unvaried,
    /// Models that explain every shape seen equally well (dimensions that
    /// only varied together: the batch and the sequence, doubled at once;
    /// or a block constant at every shape seen, far above the key, which a
    /// size padded to a bucket explains as well) disagree at the key by
    /// more than a sixty-fourth of its live bytes: which is right is
    /// unknown (the run teaches it).
    Ambiguous,
    /// The prediction needs more than its family's runs justify: the
    /// largest lower bound seen, scaled past the shapes seen by the fit's
    /// degree, plus an eighth (a wrong fit, not a large input).
    Unbounded,
    /// Planning is off, or the plan's block could not be had.
    Off,
}

/// Where a run's plan came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum PlanSource {
    /// The plan learned from an earlier run of the same key.
    Exact,
    /// Predicted from the family's earlier shapes.
    Predicted,
    /// No plan: the run is served dynamically (and recorded).
    Dynamic(DynamicReason),
}

impl Default for PlanSource {
    /// No plan: planning off.
    fn default() -> Self {
        PlanSource::Dynamic(DynamicReason::Off)
    }
}

/// What runs of one family did, by how they were served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct FamilyCounts {
    /// Runs served by the plan of their own key.
    pub exact: u64,
    /// Runs served by a plan predicted for a key never seen.
    pub predicted: u64,
    /// Predicted runs that left the prediction (counted in `predicted`
    /// too), by why: a block larger than its slot ...
    pub fell_back_larger: u64,
    /// ... an allocation the prediction did not have ...
    pub fell_back_extra: u64,
    /// ... a free out of the prediction's order ...
    pub fell_back_order: u64,
    /// ... or a run that ended short of the prediction (a missing free,
    /// fewer blocks).
    pub fell_back_short: u64,
    /// Runs served dynamically (no plan, or no prediction).
    pub dynamic: u64,
    /// Of those, runs whose family's sizes did not follow its fit.
    pub dynamic_unfit: u64,
    /// Of those, runs whose key changed a dimension the family never saw
    /// vary.
    pub dynamic_unvaried: u64,
    /// Of those, runs whose prediction was refused as larger than the
    /// family's runs justify.
    pub dynamic_unbounded: u64,
    /// Of those, runs whose family's models disagreed at their key.
    pub dynamic_ambiguous: u64,
}

impl FamilyCounts {
    /// Predicted runs that fell back, for any reason.
    pub fn fell_back(&self) -> u64 {
        self.fell_back_larger + self.fell_back_extra + self.fell_back_order + self.fell_back_short
    }

    /// Runs served on a plan to their end (exact, or predicted and kept).
    pub fn on_plan(&self) -> u64 {
        self.exact + self.predicted - self.fell_back()
    }

    /// Runs counted.
    pub fn runs(&self) -> u64 {
        self.exact + self.predicted + self.dynamic
    }

    pub(crate) fn add(&mut self, o: &FamilyCounts) {
        self.exact += o.exact;
        self.predicted += o.predicted;
        self.fell_back_larger += o.fell_back_larger;
        self.fell_back_extra += o.fell_back_extra;
        self.fell_back_order += o.fell_back_order;
        self.fell_back_short += o.fell_back_short;
        self.dynamic += o.dynamic;
        self.dynamic_unfit += o.dynamic_unfit;
        self.dynamic_unvaried += o.dynamic_unvaried;
        self.dynamic_unbounded += o.dynamic_unbounded;
        self.dynamic_ambiguous += o.dynamic_ambiguous;
    }

    pub(crate) fn count(&mut self, source: PlanSource) {
        match source {
            PlanSource::Exact => self.exact += 1,
            PlanSource::Predicted => self.predicted += 1,
            PlanSource::Dynamic(why) => {
                self.dynamic += 1;
                match why {
                    DynamicReason::Unfit => self.dynamic_unfit += 1,
                    DynamicReason::Unvaried => self.dynamic_unvaried += 1,
                    DynamicReason::Unbounded => self.dynamic_unbounded += 1,
                    DynamicReason::Ambiguous => self.dynamic_ambiguous += 1,
                    _ => {}
                }
            }
        }
    }

    pub(crate) fn fell_back_by(&mut self, why: Deviation) {
        match why {
            Deviation::Larger => self.fell_back_larger += 1,
            Deviation::Extra => self.fell_back_extra += 1,
            Deviation::Order => self.fell_back_order += 1,
            Deviation::Short => self.fell_back_short += 1,
        }
    }
}

/// One family's state, for reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct FamilyStats {
    /// The family's name (a key with its dimensions as `#`).
    pub name: String,
    /// Run structures seen (one for a model whose runs all allocate alike).
    pub structures: usize,
    /// Shapes its current fit was made from.
    pub shapes: usize,
    /// Blocks of its current structure whose sizes follow no fit (0 when
    /// every block is predicted).
    pub unfit_blocks: usize,
    /// Its runs, by how they were served.
    pub counts: FamilyCounts,
}
