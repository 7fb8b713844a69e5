//! The offset planner: the greedy reference figures of the shared traces,
//! `plan` against the lower bound and greedy, and random recordings.

use proptest::prelude::*;
use tensor_arena::plan::solver::{greedy_by_size, lower_bound, plan, validate, Request, Solution};
use tensor_arena::trace::Trace;

use crate::trace::{reference_for, trace_files};

/// The requests of one trace run: sizes as given (or rounded up to
/// `round`), all aligned to `align`.
fn requests(run: &tensor_arena::trace::TraceRun, round: usize, align: usize) -> Vec<Request> {
    run.lifetimes()
        .iter()
        .map(|l| Request::new(l.size.div_ceil(round) * round, align, l.start, l.end))
        .collect()
}

/// An independent check of a solution (quadratic, no shared code with
/// `validate`): aligned offsets, no two requests that are live at the same
/// time sharing a byte, and the footprint.
fn check(requests: &[Request], solution: &Solution) {
    assert_eq!(solution.offsets.len(), requests.len());
    let mut top = 0;
    for (i, (a, &at)) in requests.iter().zip(&solution.offsets).enumerate() {
        let align = a.align.max(1).next_power_of_two();
        assert_eq!(at % align, 0, "request {i} misaligned");
        top = top.max(at + a.size);
        for (j, (b, &bt)) in requests
            .iter()
            .zip(&solution.offsets)
            .enumerate()
            .skip(i + 1)
        {
            let in_time = a.start < b.end && b.start < a.end && a.start < a.end && b.start < b.end;
            let in_memory = at < bt + b.size && bt < at + a.size;
            assert!(
                !(in_time && in_memory),
                "requests {i} and {j} overlap: {a:?}@{at} {b:?}@{bt}"
            );
        }
    }
    assert_eq!(solution.size, top);
    assert_eq!(validate(requests, solution), Ok(()));
}

#[test]
fn greedy_reproduces_the_reference_figures() {
    for path in trace_files() {
        let trace = Trace::from_file(&path).unwrap();
        for run in &trace.runs {
            let expected = reference_for(&trace, run);
            let name = format!("{} run {}", path.display(), run.label);
            let exact = requests(run, 1, 1);
            let greedy = greedy_by_size(&exact);
            check(&exact, &greedy);
            assert_eq!(greedy.size as u64, expected.greedy, "{name}: greedy");
            assert_eq!(
                lower_bound(&exact) as u64,
                expected.lower_bound,
                "{name}: lower bound"
            );
            let rounded = requests(run, 64, 64);
            let greedy64 = greedy_by_size(&rounded);
            check(&rounded, &greedy64);
            assert_eq!(greedy64.size as u64, expected.greedy64, "{name}: greedy64");
        }
    }
}

#[test]
fn plan_beats_greedy_on_the_shared_traces() {
    println!(
        "{:<34} {:>12} {:>12} {:>12} {:>12} {:>8}",
        "trace run", "lower bound", "greedy", "greedy64", "plan(64)", "plan/lb"
    );
    for path in trace_files() {
        let trace = Trace::from_file(&path).unwrap();
        for run in &trace.runs {
            let expected = reference_for(&trace, run);
            let name = format!(
                "{} {}",
                path.file_name().unwrap().to_string_lossy(),
                run.label
            );
            // Sizes as traced, every offset aligned to 64.
            let aligned = requests(run, 1, 64);
            let best = plan(&aligned);
            check(&aligned, &best);
            let ratio = best.size as f64 / expected.lower_bound as f64;
            println!(
                "{name:<34} {:>12} {:>12} {:>12} {:>12} {ratio:>8.4}",
                expected.lower_bound, expected.greedy, expected.greedy64, best.size
            );
            assert!(
                best.size <= greedy_by_size(&aligned).size,
                "{name}: worse than greedy"
            );
            assert!(
                best.size as u64 <= expected.greedy64,
                "{name}: worse than greedy64"
            );
            assert!(
                best.size as u64 >= expected.lower_bound,
                "{name}: below the lower bound?"
            );
            assert!(ratio <= 1.01, "{name}: {ratio:.4} of the lower bound");
            // Exact sizes, no alignment: the lower bound itself.
            let exact = requests(run, 1, 1);
            let best = plan(&exact);
            check(&exact, &best);
            assert!(
                best.size as u64 <= expected.greedy,
                "{name}: worse than greedy"
            );
            let ratio = best.size as f64 / expected.lower_bound as f64;
            assert!(
                ratio <= 1.01,
                "{name}: {ratio:.4} of the lower bound (align 1)"
            );
        }
    }
}

#[test]
fn plan_is_deterministic() {
    let path = trace_files()
        .into_iter()
        .find(|p| p.to_string_lossy().contains("densenet"))
        .unwrap();
    let trace = Trace::from_file(path).unwrap();
    let requests = requests(&trace.runs[0], 1, 64);
    assert_eq!(plan(&requests), plan(&requests));
}

#[test]
fn empty_and_degenerate_requests() {
    assert_eq!(
        plan(&[]),
        Solution {
            offsets: vec![],
            size: 0
        }
    );
    assert_eq!(
        greedy_by_size(&[]),
        Solution {
            offsets: vec![],
            size: 0
        }
    );
    assert_eq!(lower_bound(&[]), 0);
    assert_eq!(validate(&[], &Solution::default()), Ok(()));
    let requests = [
        Request::new(0, 64, 0, 10),  // no bytes
        Request::new(100, 64, 5, 5), // empty lifetime
        Request::new(30, 0, 0, 3),   // align 0 means 1
        Request::new(30, 48, 1, 4),  // align 48 means 64
        Request::new(40, 1, 9, 2),   // end before start: never live
    ];
    for solution in [plan(&requests), greedy_by_size(&requests)] {
        check(&requests, &solution);
        assert_eq!(solution.size, 100, "the idle request still needs its bytes");
        assert_eq!(solution.offsets[3] % 64, 0);
    }
    assert_eq!(lower_bound(&requests), 100);
}

#[test]
fn huge_sizes_do_not_panic() {
    let half = usize::MAX / 2 + 1;
    let requests = [
        Request::new(half, 1, 0, 2),
        Request::new(half, 1, 1, 3),
        Request::new(usize::MAX, 1 << (usize::BITS - 1), 0, 3),
    ];
    assert_eq!(lower_bound(&requests), usize::MAX);
    for solution in [plan(&requests), greedy_by_size(&requests)] {
        assert_eq!(solution.size, usize::MAX);
        assert!(validate(&requests, &solution).is_err());
    }
    // One huge request alone fits exactly.
    let alone = [Request::new(usize::MAX, 1, 0, 1)];
    check(&alone, &plan(&alone));
}

#[test]
fn validate_reports_each_violation() {
    let requests = [Request::new(10, 8, 0, 2), Request::new(10, 8, 1, 3)];
    let good = Solution {
        offsets: vec![0, 16],
        size: 26,
    };
    assert_eq!(validate(&requests, &good), Ok(()));
    let short = Solution {
        offsets: vec![0],
        size: 10,
    };
    assert!(validate(&requests, &short).unwrap_err().contains("offsets"));
    let misaligned = Solution {
        offsets: vec![0, 12],
        size: 22,
    };
    assert!(validate(&requests, &misaligned)
        .unwrap_err()
        .contains("aligned"));
    let overlapping = Solution {
        offsets: vec![0, 8],
        size: 18,
    };
    assert!(validate(&requests, &overlapping)
        .unwrap_err()
        .contains("overlap"));
    let wrong_size = Solution {
        offsets: vec![0, 16],
        size: 40,
    };
    assert!(validate(&requests, &wrong_size)
        .unwrap_err()
        .contains("size"));
    let overflow = Solution {
        offsets: vec![0, usize::MAX & !7],
        size: usize::MAX,
    };
    assert!(validate(&requests, &overflow)
        .unwrap_err()
        .contains("overflows"));
    // Not live at the same time: sharing bytes is fine.
    let sequential = [Request::new(10, 8, 0, 2), Request::new(10, 8, 2, 3)];
    assert_eq!(
        validate(
            &sequential,
            &Solution {
                offsets: vec![0, 0],
                size: 10
            }
        ),
        Ok(())
    );
}

#[test]
fn reuses_memory_of_dead_buffers() {
    // A chain where each buffer dies when the next one has been made.
    let requests: Vec<Request> = (0..100).map(|i| Request::new(1000, 64, i, i + 2)).collect();
    let solution = plan(&requests);
    check(&requests, &solution);
    assert_eq!(lower_bound(&requests), 2000);
    assert_eq!(solution.size, 1024 + 1000);
}

/// Random recordings: sizes 1..=1 MiB, aligns 1..=4096, lifetimes within
/// 200 events.
fn recording() -> impl Strategy<Value = Vec<Request>> {
    let request = (1usize..=1 << 20, 0u32..=12, 0usize..200, 1usize..80).prop_map(
        |(size, align_log2, start, length)| {
            Request::new(size, 1 << align_log2, start, start + length)
        },
    );
    prop::collection::vec(request, 0..60)
}

proptest! {
    #[test]
    fn plans_are_valid_and_between_the_bound_and_greedy(requests in recording()) {
        let greedy = greedy_by_size(&requests);
        let best = plan(&requests);
        check(&requests, &greedy);
        check(&requests, &best);
        let bound = lower_bound(&requests);
        prop_assert!(bound <= best.size, "{} < lower bound {}", best.size, bound);
        prop_assert!(best.size <= greedy.size, "{} > greedy {}", best.size, greedy.size);
    }

    #[test]
    fn any_request_values_do_not_panic(
        requests in prop::collection::vec(
            (any::<usize>(), any::<usize>(), 0usize..20, 0usize..20)
                .prop_map(|(size, align, start, end)| Request::new(size >> (size % 64), align, start, end)),
            0..12,
        )
    ) {
        let best = plan(&requests);
        let greedy = greedy_by_size(&requests);
        prop_assert!(best.size <= greedy.size);
        prop_assert_eq!(best.offsets.len(), requests.len());
        if best.size < usize::MAX {
            prop_assert_eq!(validate(&requests, &best), Ok(()));
        }
        let _ = lower_bound(&requests);
    }
}
