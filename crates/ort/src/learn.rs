//! Learning off the run's path: a model's [`Plans`](crate::Plans) leave
//! their families' refits (a shape past the range seen, a prediction that
//! failed or was loose: 0.26 to 0.4 ms on det and rec) to the process's
//! background thread, the one that runs idle decay ([`crate::decay`]),
//! which makes them in its next pass, outside the families' lock. A run's
//! thread pays the bookkeeping only; until the refit is made, the family
//! predicts from its previous fit (a prediction that is wrong is served as
//! any wrong prediction: inside the plan's block, then dynamically).
//!
//! [`Plans::learn_now`](crate::Plans::learn_now) makes them on the
//! caller's thread instead.

use crate::forklock::{hold, ForkMutex, ForkRwLock};
use crate::key::RunKey;
use std::sync::{Arc, Weak};
use tensor_arena::PlanCache;

/// The caches that owe refits, each once.
static OWED: ForkMutex<Vec<Weak<PlanCache<RunKey>>>> = ForkMutex::new(Vec::new());

/// Shared by a thread while it is inside a model's plan cache (a run's
/// lookup, its learning after the run, [`Plans::stats`](crate::Plans::stats)
/// and the like; the background thread's pass is covered by its own
/// lock), taken alone by a fork: a plan cache's locks are never copied
/// held by a thread the child does not have. Each section is short (no
/// run happens inside one) and never nested in another on its thread.
static SECTIONS: ForkRwLock<()> = ForkRwLock::new(());

/// Enters a plan-cache section (see [`SECTIONS`]) until the guard drops.
pub(crate) fn section() -> std::sync::RwLockReadGuard<'static, ()> {
    SECTIONS.read()
}

/// Notes that `cache` owes refits (the caller then wakes the thread).
pub(crate) fn owe(cache: &Arc<PlanCache<RunKey>>) {
    let mut owed = OWED.lock();
    if !owed
        .iter()
        .any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(cache)))
    {
        owed.push(Arc::downgrade(cache));
    }
}

/// Whether a cache waits for its refits.
pub(crate) fn is_owed() -> bool {
    !OWED.lock().is_empty()
}

/// Makes every refit owed; the number made. Called by the background
/// thread in its pass (which a fork never copies midway).
pub(crate) fn pass() -> usize {
    let owed = std::mem::take(&mut *OWED.lock());
    owed.iter()
        .filter_map(Weak::upgrade)
        .map(|c| c.learn())
        .sum()
}

/// [`crate::fork::prepare`]: the plan caches (waiting for the sections
/// in progress), then the list, kept until [`crate::forklock::release`].
pub(crate) fn prepare_fork() {
    hold(SECTIONS.write());
    hold(OWED.lock());
}
