//! What a plan is placed for: its lowest footprint, or a placement a run
//! that leaves it can go on from as a dynamic arena would.

/// What a plan is placed for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Placement {
    /// The lowest footprint the search finds; the run's own order (each
    /// block where a dynamic arena's best fit puts it) only where that is
    /// as low (`Search::as_dynamic`).
    Lowest,
    /// For a family whose runs leave their plans: the run's own order
    /// wherever it is within a [`LEEWAY`]th of the lowest. A run that
    /// leaves such a plan has its live blocks where a dynamic arena would
    /// have them, and goes on as that arena would (no higher than its
    /// dynamic run, or the plan's block it drew); one that keeps to it
    /// pays at most the leeway over the lowest, and is where a dynamic
    /// arena would be.
    Robust,
}

/// A robust plan ([`Placement::Robust`]) is the run's own order where that
/// is no higher than the lowest footprint found plus this fraction of it
/// (a tenth). On the random families of the tests, where runs leave their
/// plans often, robust plans for the families that showed it brought the
/// predicted runs over their dynamic runs (by more than max(a granule,
/// 3%)) from 204 of 4,411 to 112 at a tenth, 125 at a sixteenth and 136 at
/// a thirty-second (docs/decisions.md, "Robust plans").
pub(crate) const LEEWAY: usize = 10;
