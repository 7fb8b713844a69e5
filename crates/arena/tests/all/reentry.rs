//! Review finding 3 (issue 35): a budget member written by hand, whose
//! `try_reclaim` calls back into the arena whose commit asked for room.
//! `try_stats` is the call allowed there: it answers `None` for the arena
//! mid-commit (no panic) and the counters of the others.

use std::sync::{Arc, Mutex};
use tensor_arena::{ArenaConfig, Budget, Reclaim, SharedArena, Stats};

/// Watches the budget's arenas when asked to reclaim.
struct Watcher {
    arenas:
        Mutex<Vec<Arc<SharedArena<tensor_arena::memory::Budgeted<tensor_arena::DefaultMemory>>>>>,
    seen: Mutex<Vec<Option<Stats>>>,
}

impl Reclaim for Watcher {
    fn try_reclaim(&self, _idle_only: bool) -> usize {
        let seen: Vec<Option<Stats>> = self
            .arenas
            .lock()
            .unwrap()
            .iter()
            .map(|a| a.try_stats())
            .collect();
        self.seen.lock().unwrap().extend(seen);
        0
    }
}

#[test]
fn a_member_may_read_the_committing_arena_with_try_stats() {
    let granule = 2 << 20;
    let budget = Budget::new(3 * granule);
    let busy = SharedArena::with_budget(ArenaConfig::default(), &budget).unwrap();
    let other = SharedArena::with_budget(ArenaConfig::default(), &budget).unwrap();
    let watcher = Arc::new(Watcher {
        arenas: Mutex::new(vec![busy.clone(), other.clone()]),
        seen: Mutex::new(Vec::new()),
    });
    let member: Arc<dyn Reclaim> = watcher.clone();
    budget.register(Arc::downgrade(&member));
    let held = other.try_alloc(granule).unwrap();
    let a = busy.try_alloc(granule).unwrap();
    // Over the budget: the commit asks the members, the watcher among them,
    // while `busy` is in the middle of its call.
    assert!(busy.try_alloc(2 * granule).is_err());
    let seen = watcher.seen.lock().unwrap().clone();
    assert!(!seen.is_empty(), "the watcher was asked");
    for pair in seen.chunks(2) {
        assert_eq!(pair[0], None, "the arena mid-commit");
        assert!(
            pair[1].is_some_and(|s| s.in_use >= granule),
            "{:?}",
            pair[1]
        );
    }
    // Outside a commit, try_stats answers.
    assert_eq!(busy.try_stats(), Some(busy.stats()));
    drop((a, held));
}
