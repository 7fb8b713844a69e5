//! A run that leaves a plan that saved more than a dynamic arena would:
//! the block with no room left in the plan's block goes past it where
//! that reaches less far than the rest of the plan placed again around
//! what is live.

use super::families::{arena, drive, run, size, Model, Twist, GRANULE};
use tensor_arena::{PlanCache, PlanSource};

/// A family of the random draw (`first_sight`'s, 1,200 families) whose
/// last run doubles block 2, which finds no room in the plan's block. The
/// rest of the plan placed again around what is live reached 1.12x the
/// same run on a fresh dynamic arena; the block past the plan's, the rest
/// kept inside it, stays within 3% of it.
#[test]
fn a_block_with_no_room_in_its_plan_goes_past_it_where_that_reaches_less_far() {
    let model = Model {
        sizes: vec![
            size(1318, 139, 0),
            size(1672, 246, 0),
            size(2034, 255, 1),
            size(2073, 186, 4),
            size(3123, 202, 2),
            size(781, 77, 3),
            size(2591, 67, 0),
            size(268, 178, 4),
        ],
        events: vec![
            (true, 0),
            (false, 0),
            (true, 1),
            (true, 2),
            (true, 3),
            (true, 4),
            (true, 5),
            (true, 6),
            (false, 1),
            (false, 4),
            (true, 7),
            (false, 7),
            (false, 5),
            (false, 6),
        ],
    };
    let runs = [
        ([2, 20], Twist::None),
        ([4, 27], Twist::None),
        ([8, 132], Twist::None),
        ([2, 135], Twist::Extra(9675318178640757959)),
        ([3, 226], Twist::MissingFree(17712454174427680905)),
        ([8, 191], Twist::None),
        ([8, 70], Twist::MissingFree(1529466442430493790)),
        ([1, 91], Twist::None),
        ([4, 106], Twist::MissingFree(10517213333262650630)),
        ([2, 168], Twist::MissingFree(4528011827808184740)),
    ];
    // One arena for the family, as a worker's.
    let family = arena();
    let cache: PlanCache<Vec<usize>> = PlanCache::new(64);
    for (key, twist) in runs {
        run(&family, &cache, &model, key, twist);
    }
    let (key, twist) = ([5, 138], Twist::Larger(4602804360518374778));
    let (lookup, report, _) = run(&family, &cache, &model, key, twist);
    let (dynamic, _, _) = drive(&arena(), None, &model, key, twist);
    assert_eq!(lookup.source, PlanSource::Predicted);
    assert!(report.deviated, "the run left its plan");
    let d = dynamic.high_water;
    assert!(
        report.high_water <= d + GRANULE.max(d * 3 / 100),
        "{} against its dynamic run's {d}",
        report.high_water,
    );
}
