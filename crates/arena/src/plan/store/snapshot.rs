//! What a plan store holds of a [`PlanCache`](crate::PlanCache)'s families:
//! each structure's events and alignments, and the shapes it saw (their
//! recordings, not their fits: a fresh process fits them again).

use crate::plan::{PlanEvent, Recording};

/// One family of a plan store: its structures, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FamilySnapshot {
    /// The family's id ([`KeyDims::family`](crate::KeyDims::family) of its
    /// keys).
    pub id: u64,
    /// The family's name, for reports.
    pub name: String,
    /// Its run structures, least recently seen first.
    pub structures: Vec<StructureSnapshot>,
}

/// One run structure of a family: which block comes when, their
/// alignments, and the shapes seen, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StructureSnapshot {
    /// The structure's events (which block is allocated or freed when).
    pub events: Vec<PlanEvent>,
    /// Each block's alignment.
    pub aligns: Vec<usize>,
    /// The shapes seen, oldest first.
    pub shapes: Vec<ShapeSnapshot>,
}

/// One shape a structure was seen at: its key's dimensions, each block's
/// size, and the run's lower bound.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShapeSnapshot {
    /// The key's dimensions.
    pub dims: Vec<u64>,
    /// Each block's size, in the structure's block order.
    pub sizes: Vec<usize>,
    /// The most bytes the run had live at once.
    pub lower_bound: usize,
}

impl StructureSnapshot {
    /// The recording of shape `shape` (its sizes with the structure's
    /// alignments and events): what a run at that shape did.
    pub fn recording(&self, shape: &ShapeSnapshot) -> Recording {
        Recording {
            blocks: shape
                .sizes
                .iter()
                .copied()
                .zip(self.aligns.iter().copied())
                .collect(),
            events: self.events.clone(),
        }
    }
}
