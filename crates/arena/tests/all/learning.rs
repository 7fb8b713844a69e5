//! Learning off the run's path (`PlanCache::set_deferred_learning`): a
//! run's thread leaves its family's refit to `PlanCache::learn`.
//! - Learned before the next lookup, a deferred cache predicts exactly as
//!   one that refits on the run's thread: the same plans, the same runs.
//! - Never learned, or learned late, every run is still served correctly
//!   and no worse than the checks of `families::run` allow: a stale fit
//!   only predicts less well.
//! - `learn` may run on another thread while runs go on.

use crate::families::{arena, drive, model, run, Twist};
use proptest::prelude::*;
use tensor_arena::PlanCache;

fn keys() -> impl Strategy<Value = Vec<(usize, usize)>> {
    prop::collection::vec((1usize..9, 32usize..289), 3..10)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: crate::common::cases(48), ..ProptestConfig::default() })]

    #[test]
    fn learned_before_the_next_lookup_predicts_as_inline(model in model(), keys in keys()) {
        let (a1, a2) = (arena(), arena());
        let inline: PlanCache<Vec<usize>> = PlanCache::new(64);
        let deferred: PlanCache<Vec<usize>> = PlanCache::new(64);
        deferred.set_deferred_learning(true);
        let mut refits = 0;
        for (b, w) in keys {
            refits += deferred.learn();
            prop_assert!(!deferred.owes());
            let key = [b, w];
            let (li, ld) = (inline.lookup(&key[..]), deferred.lookup(&key[..]));
            prop_assert_eq!(li.source, ld.source);
            prop_assert_eq!(
                li.plan.as_ref().map(|p| (p.size(), p.lower_bound())),
                ld.plan.as_ref().map(|p| (p.size(), p.lower_bound()))
            );
            let (ri, reci, _) = drive(&a1, li.plan.clone(), &model, key, Twist::None);
            let (rd, recd, _) = drive(&a2, ld.plan.clone(), &model, key, Twist::None);
            prop_assert_eq!((ri.high_water, ri.deviated), (rd.high_water, rd.deviated));
            inline.after_run(&key[..], &li, &ri, &reci, true);
            deferred.after_run(&key[..], &ld, &rd, &recd, true);
        }
        prop_assert_eq!(deferred.stats().refits_learned, refits as u64);
        prop_assert_eq!(inline.stats().refits_learned, 0);
    }

    #[test]
    fn runs_with_refits_owed_are_served_correctly(
        model in model(),
        keys in keys(),
        every in 0usize..4,
    ) {
        let arena = arena();
        let cache = PlanCache::new(64);
        cache.set_deferred_learning(true);
        for (i, (b, w)) in keys.into_iter().enumerate() {
            // Learned every `every` runs (0: never).
            if every > 0 && i % every == 0 {
                cache.learn();
            }
            // Checks no overlap, every byte intact, and the high-water
            // against the same run on a fresh dynamic arena.
            run(&arena, &cache, &model, [b, w], Twist::None);
        }
    }
}

/// Runs on one thread, `learn` on another, concurrently: every run is
/// served correctly, and what is owed at the end is learned.
#[test]
fn learning_on_another_thread_while_runs_go_on() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let shapes = prop::collection::vec((1usize..9, 32usize..289), 12);
    let mut learned = 0;
    for _ in 0..8 {
        let model = model().new_tree(&mut runner).unwrap().current();
        let keys = shapes.new_tree(&mut runner).unwrap().current();
        let cache = PlanCache::new(64);
        cache.set_deferred_learning(true);
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !done.load(Ordering::Acquire) {
                    cache.learn();
                    std::thread::yield_now();
                }
            });
            // Set however the runs end: a failed run stops the learner too
            // (the test fails instead of hanging).
            struct Done<'a>(&'a AtomicBool);
            impl Drop for Done<'_> {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::Release);
                }
            }
            let _done = Done(&done);
            let arena = arena();
            for &(b, w) in &keys {
                run(&arena, &cache, &model, [b, w], Twist::None);
            }
        });
        cache.learn();
        assert!(!cache.owes());
        learned += cache.stats().refits_learned;
    }
    // Twelve random shapes widen the range seen: refits were owed.
    assert!(learned > 0);
}
