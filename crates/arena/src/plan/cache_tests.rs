//! Tests of the plan cache's learning: first fits, owed refits.

use super::*;

/// A run at width `n`: three blocks that scale with it.
fn run(cache: &PlanCache<Vec<usize>>, n: usize) -> PlanSource {
    let key = [n];
    let lookup = cache.lookup(&key[..]);
    let mut rec = Recording::new();
    let a = rec.alloc(64 * n, 64);
    let b = rec.alloc(128 * n, 64);
    rec.free(a);
    let c = rec.alloc(64 * n, 64);
    rec.free(b);
    rec.free(c);
    cache.after_run(&key[..], &lookup, &RunReport::default(), &rec, true);
    lookup.source
}

#[test]
fn a_familys_first_fit_is_made_on_the_runs_thread() {
    let cache: PlanCache<Vec<usize>> = PlanCache::new(8);
    cache.set_deferred_learning(true);
    run(&cache, 4);
    run(&cache, 8);
    // No refit owed (the plans are: the runs' own), and the third
    // shape is predicted all the same.
    assert!(cache.families.lock().owed().is_empty());
    assert_eq!(run(&cache, 6), PlanSource::Predicted);
}

#[test]
fn a_runs_own_plan_is_solved_by_the_learner_as_after_the_run() {
    let inline: PlanCache<Vec<usize>> = PlanCache::new(8);
    let deferred: PlanCache<Vec<usize>> = PlanCache::new(8);
    deferred.set_deferred_learning(true);
    deferred.set_deferred_first_plans(true);
    // A key's next lookup makes its plan if the learner has not.
    run(&deferred, 2);
    assert!(deferred.peek(&[2][..]).is_none());
    assert_eq!(run(&deferred, 2), PlanSource::Exact);
    run(&inline, 2);
    run(&inline, 2);
    deferred.learn();
    for n in [4, 8] {
        run(&inline, n);
        run(&deferred, n);
        // Not solved on the run's thread: the key has no plan yet.
        assert!(deferred.peek(&[n][..]).is_none());
        assert!(deferred.owes());
        deferred.learn();
        assert!(!deferred.owes());
        assert_eq!(
            deferred.peek(&[n][..]).map(|p| p.size()),
            inline.peek(&[n][..]).map(|p| p.size())
        );
    }
    assert_eq!(run(&deferred, 8), PlanSource::Exact);
}

#[test]
fn a_refit_taken_before_a_newer_shape_leaves_that_shape_owed() {
    let cache: PlanCache<Vec<usize>> = PlanCache::new(8);
    cache.set_deferred_learning(true);
    for n in [4, 8, 16] {
        run(&cache, n);
    }
    assert!(cache.owes());
    let owed = cache.families.lock().owed();
    assert_eq!(owed.len(), 1);
    // A newer shape is observed while the refit is made.
    run(&cache, 32);
    let fit = owed[0].refit();
    assert!(!cache.families.lock().install(&owed[0], fit));
    assert_eq!(
        cache.families.lock().owed().len(),
        1,
        "the newer shape's refit is still owed"
    );
    assert_eq!(cache.learn(), 1);
    assert!(cache.families.lock().owed().is_empty());
    assert!(!cache.owes());
}
