//! What a plan is placed for: its lowest footprint, or a placement a run
//! that leaves it can go on from as a dynamic arena would.

/// What a plan is placed for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Placement {
    /// The lowest footprint the search finds; the run's own order (each
    /// block where a dynamic arena's best fit puts it) only where that is
    /// as low (`Search::as_dynamic`). What [`plan`](super::plan) and
    /// [`Plan::from_recording`](crate::plan::Plan::from_recording) give.
    Lowest,
    /// What a family plans with until its runs show they leave their
    /// plans: the run's own order wherever it is within a [`CLOSE`]th of
    /// the lowest, else the lowest. A run that leaves such a plan goes on
    /// as a dynamic arena would; one that keeps to it pays at most the
    /// thirty-second, and never more than a dynamic arena would for the
    /// sizes planned.
    Close,
    /// For a family whose runs leave their plans: the run's own order
    /// wherever it is within a [`LEEWAY`]th of the lowest. A run that
    /// leaves such a plan has its live blocks where a dynamic arena would
    /// have them, and goes on as that arena would (no higher than its
    /// dynamic run, or the plan's block it drew); one that keeps to it
    /// pays at most the leeway over the lowest, and is where a dynamic
    /// arena would be.
    Robust,
}

impl Placement {
    /// What the run's own order may exceed the lowest footprint found by,
    /// as a fraction (`lowest / n`), and still be the plan; `None`: only
    /// where it is as low.
    pub(crate) fn leeway(self) -> Option<usize> {
        match self {
            Placement::Lowest => None,
            Placement::Close => Some(CLOSE),
            Placement::Robust => Some(LEEWAY),
        }
    }
}

/// A robust plan ([`Placement::Robust`]) is the run's own order where that
/// is no higher than the lowest footprint found plus this fraction of it
/// (a tenth). On the random families of the tests, where runs leave their
/// plans often, robust plans for the families that showed it brought the
/// predicted runs over their dynamic runs (by more than max(a granule,
/// 3%)) from 204 of 4,411 to 112 at a tenth, 125 at a sixteenth and 136 at
/// a thirty-second (docs/decisions.md, "Robust plans").
pub(crate) const LEEWAY: usize = 10;

/// A family's plans before its runs left one ([`Placement::Close`]) are
/// the run's own order where that is within this fraction of the lowest
/// (a thirty-second): on the random families, 17 more predicted runs of
/// 4,258 within max(a granule, 3%) of their dynamic runs, and no real
/// trace's plan changed; a sixteenth put ppocr-cls's plans 5% over their
/// lowest (docs/decisions.md, "A family's first plans close to a dynamic
/// arena's").
pub(crate) const CLOSE: usize = 32;
