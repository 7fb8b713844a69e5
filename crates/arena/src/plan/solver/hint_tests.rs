//! Searches started from where an earlier one ended ([`plan_hinted`]).

use super::super::placement::{CLOSE, LEEWAY};
use super::super::{lower_bound, validate, Request};
use super::*;
use crate::trace::Trace;
use proptest::prelude::*;

/// Requests of one structure: `(size, start, end)` at `scale` times the
/// size (rounded to 64 bytes, as the arena records them).
fn scaled(shape: &[(usize, usize, usize)], scale: usize) -> Vec<Request> {
    shape
        .iter()
        .map(|&(size, start, end)| {
            Request::new((size * scale).next_multiple_of(64), 64, start, end)
        })
        .collect()
}

/// The footprint of `order` (request indices) placed with `fit`.
fn placed(requests: &[Request], hint: &Hint) -> usize {
    let problem = Problem::new(requests).unwrap();
    let order = problem.items_in(&hint.order).unwrap();
    let mut decoder = Decoder::new(&problem, order);
    decoder
        .decode(&problem, 0, hint.fit, usize::MAX)
        .unwrap()
        .max(problem.idle)
}

fn structure() -> impl Strategy<Value = Vec<(usize, usize, usize)>> {
    prop::collection::vec((1usize..5000, 0usize..60, 1usize..30), 1..60).prop_map(|v| {
        v.into_iter()
            .map(|(size, start, len)| (size, start, start + len))
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// Searched from the order an earlier search of the structure ended
    /// on (at another scale), a plan is valid, never larger than that
    /// order's placement nor than greedy by size, and hands on an order
    /// that places as well as the plan.
    #[test]
    fn a_hinted_plan_is_valid_and_never_worse_than_its_hint(
        shape in structure(),
        scales in prop::collection::vec(1usize..9, 2..6),
    ) {
        let mut hint: Option<Hint> = None;
        for (k, &scale) in scales.iter().enumerate() {
            let requests = scaled(&shape, scale);
            let (solution, next) = plan_hinted(&requests, hint.as_ref(), Depth::Quick, Placement::Lowest);
            prop_assert!(validate(&requests, &solution).is_ok());
            prop_assert!(solution.size <= greedy_by_size(&requests).size);
            prop_assert!(solution.size >= lower_bound(&requests));
            if let Some(h) = &hint {
                prop_assert!(solution.size <= placed(&requests, h));
            }
            let next = next.unwrap();
            prop_assert_eq!(next.round, k as u64);
            prop_assert_eq!(placed(&requests, &next), solution.size);
            hint = Some(next);
        }
    }

    /// A hint that does not order exactly the requests that take part (too
    /// short, too long, a request twice, one out of range) is ignored: the
    /// plan is `plan`'s own.
    #[test]
    fn a_hint_of_other_requests_is_ignored(
        shape in structure(),
        garbage in prop::collection::vec(0u32..80, 0..70),
    ) {
        let requests = scaled(&shape, 1);
        let problem = Problem::new(&requests).unwrap();
        prop_assume!(problem.items_in(&garbage).is_none());
        let hint = Hint {
            order: garbage,
            fit: Fit::First,
            round: 0,
            lifetimes: Arc::clone(&problem.lifetimes),
        };
        let (solution, _) = plan_hinted(&requests, Some(&hint), Depth::Quick, Placement::Lowest);
        prop_assert_eq!(solution, plan(&requests));
    }
}

/// A request named twice is refused even when the count is right.
#[test]
fn an_order_with_a_request_twice_is_refused() {
    let requests = [
        Request::new(64, 64, 0, 2),
        Request::new(64, 64, 1, 3),
        Request::new(64, 64, 2, 4),
    ];
    let problem = Problem::new(&requests).unwrap();
    assert!(problem.items_in(&[0, 1, 2]).is_some());
    assert!(problem.items_in(&[0, 1, 1]).is_none());
    assert!(problem.items_in(&[0, 1, 3]).is_none());
    assert!(problem.items_in(&[0, 1]).is_none());
}

/// DenseNet-121 in ONNX Runtime's own order (batches 8, 1, 4, 2, 6): each
/// batch's plan is at the lower bound of live bytes, and from the second
/// batch on it is the previous batch's order placed again (the search
/// stops there: a hint that reaches the lower bound is the plan, one
/// placement instead of a search), with the structure's lifetimes shared.
/// A plan that ignored its hint would end on an order of its own.
#[test]
fn densenet_in_onnx_runtimes_order_is_planned_at_its_lower_bound() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../traces/ort/densenet121-batches.trace"
    );
    let trace = Trace::from_file(path).unwrap();
    let mut hint: Option<Hint> = None;
    for run in &trace.runs {
        let requests: Vec<Request> = run
            .lifetimes()
            .iter()
            .map(|l| Request::new(l.size.next_multiple_of(64), 64, l.start, l.end))
            .collect();
        let (solution, next) =
            plan_hinted(&requests, hint.as_ref(), Depth::Quick, Placement::Lowest);
        let next = next.unwrap();
        let bound = lower_bound(&requests);
        assert_eq!(solution.size, bound, "{}: over the lower bound", run.label);
        if let Some(h) = &hint {
            assert_eq!(
                next.order, h.order,
                "{}: the hint's order not kept",
                run.label
            );
            assert!(Arc::ptr_eq(&next.lifetimes, &h.lifetimes), "{}", run.label);
        }
        hint = Some(next);
    }
}

/// Each request, by start, in the smallest gap between those live then
/// (the top when none holds it): a dynamic arena's best fit. Its
/// offsets, request by request, and its footprint.
fn run_order_best_fit(requests: &[Request]) -> (Vec<usize>, usize) {
    let problem = Problem::new(requests).unwrap();
    let mut decoder = Decoder::new(&problem, problem.run_order());
    let top = decoder.decode(&problem, 0, Fit::Best, usize::MAX).unwrap();
    let solution = problem.solution(requests, &decoder.offset);
    (solution.offsets, top.max(problem.idle))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// Wherever the run's own order, best fit, places as low as the
    /// search, that placement is the plan (a run that leaves it midway
    /// then has its live blocks where a dynamic arena would); elsewhere
    /// the plan is lower. Either way the plan is valid, and a search
    /// started from the order it hands on places as low.
    #[test]
    fn a_plan_is_the_runs_own_order_where_that_is_as_low(shape in structure(), scale in 1usize..9) {
        let requests = scaled(&shape, scale);
        let (offsets, top) = run_order_best_fit(&requests);
        let (solution, hint) = plan_hinted(&requests, None, Depth::Quick, Placement::Lowest);
        prop_assert!(validate(&requests, &solution).is_ok());
        let ordered = is_run_order(&requests, &solution.offsets);
        prop_assert_eq!(ordered, top <= solution.size);
        if ordered {
            prop_assert_eq!(&solution.offsets, &offsets);
            // Searched again from it: as low or lower, and the run's
            // order again unless the search found lower.
            let (again, _) = plan_hinted(&requests, hint.as_ref(), Depth::Quick, Placement::Lowest);
            prop_assert!(again.size <= solution.size);
            if again.size == solution.size {
                prop_assert!(is_run_order(&requests, &again.offsets));
                prop_assert_eq!(again.offsets, offsets);
            }
        } else {
            prop_assert!(solution.size < top);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// Where the run's own order is not as low, the plan starts with as
    /// much of it as keeps the footprint: its first `run_order_start`
    /// requests are where a dynamic arena's best fit puts them (so a run
    /// that leaves the plan before them has its live blocks there), the
    /// plan is valid, and a search started from the order it hands on
    /// places as low or lower.
    #[test]
    fn a_plan_starts_as_a_dynamic_arena_would_where_that_is_as_low(
        shape in structure(),
        scale in 1usize..9,
    ) {
        let requests = scaled(&shape, scale);
        let (offsets, top) = run_order_best_fit(&requests);
        let (solution, hint) = plan_hinted(&requests, None, Depth::Quick, Placement::Lowest);
        prop_assert!(validate(&requests, &solution).is_ok());
        let start = run_order_start(&requests, &solution.offsets);
        prop_assert!(start <= requests.len());
        prop_assert_eq!(&solution.offsets[..start], &offsets[..start]);
        if let Some(&at) = solution.offsets.get(start) {
            // The first request past the start is elsewhere.
            prop_assert_ne!(at, offsets[start]);
            prop_assert!(solution.size < top);
        }
        let (again, _) = plan_hinted(&requests, hint.as_ref(), Depth::Quick, Placement::Lowest);
        prop_assert!(again.size <= solution.size);
    }
}

/// A block freed at once, one that lives on, and an output that starts
/// while it lives: the run's order puts the second where the first was and
/// the output over it, as low as any plan, and as a dynamic arena would.
/// That is the plan; outputs low would have turned it upside down
/// (`[256, 64, 0]`).
#[test]
fn the_runs_order_is_kept_where_it_is_as_low() {
    let requests = [
        Request::new(64, 64, 0, 1),
        Request::new(256, 64, 1, 4),
        Request::new(64, 64, 2, 5),
    ];
    let (solution, _) = plan_hinted(&requests, None, Depth::Quick, Placement::Lowest);
    assert_eq!(solution.size, 320);
    assert_eq!(solution.offsets, vec![0, 0, 256]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// A plan with a leeway is the run's own order, best fit, wherever
    /// that is within the leeway of the lowest plan found; elsewhere it is
    /// the lowest plan. Valid either way. A family's plans before its runs
    /// left one ([`Placement::Close`]) have a thirty-second; robust plans
    /// (for a family whose runs leave their plans) a tenth.
    #[test]
    fn a_plan_with_a_leeway_is_the_runs_own_order_within_it(
        shape in structure(),
        scale in 1usize..9,
    ) {
        let requests = scaled(&shape, scale);
        let (offsets, top) = run_order_best_fit(&requests);
        let (lowest, _) = plan_hinted(&requests, None, Depth::Quick, Placement::Lowest);
        for (placement, n) in [(Placement::Close, CLOSE), (Placement::Robust, LEEWAY)] {
            let (plan, _) = plan_hinted(&requests, None, Depth::Quick, placement);
            prop_assert!(validate(&requests, &plan).is_ok());
            if top <= lowest.size + lowest.size / n {
                prop_assert_eq!(&plan.offsets, &offsets, "{:?}", placement);
                prop_assert_eq!(plan.size, top);
            } else {
                prop_assert_eq!(&plan.offsets, &lowest.offsets, "{:?}", placement);
            }
        }
    }
}

/// A block live throughout of `first` bytes, then one of 100 freed early,
/// a small one of 10 that lives on, and one of `last`, a little larger
/// than the second: the run's own order (a dynamic arena's best fit)
/// cannot put the last in the second's gap; the lowest plan puts the small
/// one under the second and reaches the lower bound. Returns the lowest
/// plan's size and, placed for `placement`, the plan's size and whether it
/// is the run's order (at `[0, first, first + 100, first + 110]`).
fn run_order_or_lowest(first: usize, last: usize, placement: Placement) -> (usize, usize, bool) {
    let requests = [
        Request::new(first, 1, 0, 5),
        Request::new(100, 1, 1, 3),
        Request::new(10, 1, 2, 5),
        Request::new(last, 1, 3, 5),
    ];
    let (lowest, _) = plan_hinted(&requests, None, Depth::Quick, Placement::Lowest);
    assert!(!is_run_order(&requests, &lowest.offsets));
    let (plan, _) = plan_hinted(&requests, None, Depth::Quick, placement);
    let ordered = plan.offsets == [0, first, first + 100, first + 110];
    assert_eq!(ordered, is_run_order(&requests, &plan.offsets));
    if !ordered {
        assert_eq!(plan.offsets, lowest.offsets);
    }
    (lowest.size, plan.size, ordered)
}

/// Robust, the plan is the run's order within a tenth of the lowest
/// (1,215 bytes against 1,115): a run that leaves it goes on as a dynamic
/// arena would. A family's plan before any run left one
/// ([`Placement::Close`]) is the run's order within a thirty-second (4,213
/// against 4,113, 2.4% over), and the lowest at 9% over; the lowest
/// placement ([`plan`]) never is.
#[test]
fn a_plan_takes_the_runs_order_within_its_leeway() {
    for (first, last, placement, expected) in [
        (1000, 105, Placement::Robust, (1115, 1215, true)),
        (4000, 103, Placement::Close, (4113, 4213, true)),
        (1000, 103, Placement::Close, (1113, 1113, false)),
        (4000, 103, Placement::Lowest, (4113, 4113, false)),
    ] {
        let got = run_order_or_lowest(first, last, placement);
        assert_eq!(got, expected, "{first} {last} {placement:?}");
    }
}
