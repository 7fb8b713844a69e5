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

    /// A robust plan (for a family whose runs leave their plans) is the
    /// run's own order, best fit, wherever that is within a tenth of the
    /// lowest plan found; elsewhere it is the lowest plan. Valid either way.
    #[test]
    fn a_robust_plan_is_the_runs_own_order_within_a_tenth(
        shape in structure(),
        scale in 1usize..9,
    ) {
        let requests = scaled(&shape, scale);
        let (offsets, top) = run_order_best_fit(&requests);
        let (lowest, _) = plan_hinted(&requests, None, Depth::Quick, Placement::Lowest);
        let (robust, _) = plan_hinted(&requests, None, Depth::Quick, Placement::Robust);
        prop_assert!(validate(&requests, &robust).is_ok());
        if top <= lowest.size + lowest.size / LEEWAY {
            prop_assert_eq!(&robust.offsets, &offsets);
            prop_assert_eq!(robust.size, top);
        } else {
            prop_assert_eq!(robust.offsets, lowest.offsets);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// A family's plan before its runs left one ([`Placement::Close`]) is
    /// the run's own order, best fit, wherever that is within a
    /// thirty-second of the lowest plan found; elsewhere it is the lowest
    /// plan. Valid either way.
    #[test]
    fn a_close_plan_is_the_runs_own_order_within_a_thirty_second(
        shape in structure(),
        scale in 1usize..9,
    ) {
        let requests = scaled(&shape, scale);
        let (offsets, top) = run_order_best_fit(&requests);
        let (lowest, _) = plan_hinted(&requests, None, Depth::Quick, Placement::Lowest);
        let (close, _) = plan_hinted(&requests, None, Depth::Quick, Placement::Close);
        prop_assert!(validate(&requests, &close).is_ok());
        if top <= lowest.size + lowest.size / CLOSE {
            prop_assert_eq!(&close.offsets, &offsets);
            prop_assert_eq!(close.size, top);
        } else {
            prop_assert_eq!(close.offsets, lowest.offsets);
        }
    }
}

/// The case below with a larger first block: the run's own order reaches
/// 4,213 bytes, 2.4% over the lowest plan's 4,113. The family's plan
/// before any run left one ([`Placement::Close`]) is the run's order; the
/// lowest placement ([`plan`]) is not.
#[test]
fn a_close_plan_takes_the_runs_order_within_a_thirty_second() {
    let requests = [
        Request::new(4000, 1, 0, 5),
        Request::new(100, 1, 1, 3),
        Request::new(10, 1, 2, 5),
        Request::new(103, 1, 3, 5),
    ];
    let (lowest, _) = plan_hinted(&requests, None, Depth::Quick, Placement::Lowest);
    assert_eq!(lowest.size, 4113);
    assert!(!is_run_order(&requests, &lowest.offsets));
    let (close, _) = plan_hinted(&requests, None, Depth::Quick, Placement::Close);
    assert_eq!(close.size, 4213);
    assert_eq!(close.offsets, vec![0, 4000, 4100, 4110]);
    assert!(is_run_order(&requests, &close.offsets));
    // The same requests with the first block a quarter of it: the run's
    // order is 9% over the lowest, and the close plan is the lowest.
    let mut small = requests;
    small[0] = Request::new(1000, 1, 0, 5);
    let (lowest, _) = plan_hinted(&small, None, Depth::Quick, Placement::Lowest);
    let (close, _) = plan_hinted(&small, None, Depth::Quick, Placement::Close);
    assert_eq!(close.offsets, lowest.offsets);
    assert_eq!(close.size, 1113);
}

/// A block live throughout, then one freed early, a small one that lives
/// on, and one a little larger than the first: the run's own order (a
/// dynamic arena's best fit) cannot put the last in the first's gap, and
/// reaches 1,215 bytes; the lowest plan puts the small one under the first
/// and reaches the lower bound, 1,115. Robust, the plan is the run's order
/// (within a tenth): a run that leaves it goes on as a dynamic arena would.
#[test]
fn a_robust_plan_takes_the_runs_order_a_tenth_over_the_lowest() {
    let requests = [
        Request::new(1000, 1, 0, 5),
        Request::new(100, 1, 1, 3),
        Request::new(10, 1, 2, 5),
        Request::new(105, 1, 3, 5),
    ];
    let (lowest, _) = plan_hinted(&requests, None, Depth::Quick, Placement::Lowest);
    assert_eq!(lowest.size, 1115);
    assert!(!is_run_order(&requests, &lowest.offsets));
    let (robust, _) = plan_hinted(&requests, None, Depth::Quick, Placement::Robust);
    assert_eq!(robust.size, 1215);
    assert_eq!(robust.offsets, vec![0, 1000, 1100, 1110]);
    assert!(is_run_order(&requests, &robust.offsets));
}
