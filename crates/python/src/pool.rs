//! The process's workers: one bounded `WorkerPool` shared by every session,
//! so that however many Python threads call `run`, at most `workers`
//! arenas exist, and one worker running several models (an OCR pipeline's
//! det, cls and rec) holds the largest one's need, not the sum.
//!
//! | call | what it does |
//! |---|---|
//! | `configure(...)` | the pool's size, budget, idle decay, shrink policy, output mode; a new pool for the runs that start after it (runs in flight finish on the old one, whose workers then go) |
//! | `stats()` | the arenas' counters under crates/cuda's (PyTorch's) names |
//! | `reset_peak_stats()` | peaks start again from the current figures |
//! | `shrink(everything)` | idle workers give cached memory back |

use crate::arrays::OutputMode;
use crate::errors::InvalidArgument;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::RwLockReadGuard;
use std::time::Duration;
use tensor_arena::Budget as ArenaBudget;
use tensor_arena_ort::fork::{ForkMutex, ForkRwLock};
use tensor_arena_ort::{fork, Checkout, RunInfo, Shrink, Worker, WorkerOptions, WorkerPool};

/// The pool's settings.
#[derive(Clone, Debug)]
struct Config {
    workers: usize,
    options: WorkerOptions,
    outputs: OutputMode,
}

/// The pool and what is counted across its runs.
struct State {
    config: Config,
    pool: Option<WorkerPool>,
    /// Most bytes committed by all arenas at once, as seen by runs (a
    /// run's own reservation plus what the other arenas held), since the
    /// last reset. (The live peak is counted at each alloc and free:
    /// [`tensor_arena_ort::live_together`].)
    reserved_peak: usize,
    /// Runs refused memory.
    ooms: u64,
}

static STATE: ForkMutex<Option<State>> = ForkMutex::new(None);

/// Held (shared) by every thread inside ONNX Runtime on this package's
/// behalf (a run, a session's creation), and (exclusive) by a fork
/// ([`_fork_prepare`]): ONNX Runtime's own locks are not fork-safe (a
/// child forked while another thread ran inside it can wait forever on a
/// lock that thread held: 2 children in 100 did, `test_fork.py`), so a fork
/// waits for the runs in flight (at most one run each) and holds new ones
/// until it is done. A waiting fork keeps new runs out. The standard
/// library's lock ([`ForkRwLock`]): the runs waiting for it at the fork
/// leave nothing behind in the child.
static IN_ORT: ForkRwLock<()> = ForkRwLock::new(());

/// A thread's stay inside ONNX Runtime ([`IN_ORT`]); its end is noted in
/// [`LEFT_ORT`].
pub(crate) struct InOrt {
    _shared: RwLockReadGuard<'static, ()>,
}

impl Drop for InOrt {
    fn drop(&mut self) {
        LEFT_ORT.store(now_ns().max(1), Ordering::Relaxed);
    }
}

/// A thread's stay inside ONNX Runtime ([`IN_ORT`]).
pub(crate) fn in_onnxruntime() -> InOrt {
    InOrt {
        _shared: IN_ORT.read(),
    }
}

/// When a thread last left ONNX Runtime ([`now_ns`]; 0: none has).
static LEFT_ORT: AtomicU64 = AtomicU64::new(0);

/// Nanoseconds since this module first asked (monotonic).
fn now_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(std::time::Instant::now);
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// How long a fork waits after the last run left ONNX Runtime before it
/// goes on. A run's end leaves ONNX Runtime's intra-op threads spinning
/// (50 µs by default here: `session::default_spin`), then each takes its
/// own mutex to go to sleep. A fork at that instant copies the mutex held,
/// and the child's first run, waking that thread, waits on it for ever
/// (gdb: the child's only thread in `pthread_mutex_lock` inside
/// libonnxruntime; 1 child in 100 of `test_fork.py`'s storm). With the
/// runs kept out, the threads are asleep well within this.
const SETTLE: Duration = Duration::from_millis(2);

fn default_workers() -> usize {
    std::env::var("TENSOR_ARENA_WORKERS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&n: &usize| n > 0)
        // Two per CPU: a pool of one per CPU left a core idle while Python
        // threads made inputs and copied outputs between runs (16 threads
        // on 2 CPUs: docs/decisions.md, "Two pool workers per CPU").
        .unwrap_or_else(|| 2 * std::thread::available_parallelism().map_or(1, |n| n.get()))
}

fn with_state<T>(f: impl FnOnce(&mut State) -> T) -> T {
    let mut st = STATE.lock();
    let st = st.get_or_insert_with(|| State {
        config: Config {
            workers: default_workers(),
            options: WorkerOptions::default(),
            outputs: OutputMode::Copy,
        },
        pool: None,
        reserved_peak: 0,
        ooms: 0,
    });
    f(st)
}

/// The pool (made on first use) and the output mode.
pub(crate) fn pool() -> PyResult<(WorkerPool, OutputMode)> {
    with_state(|st| {
        if st.pool.is_none() {
            let pool = WorkerPool::new(st.config.workers, st.config.options.clone())
                .map_err(crate::errors::from_arena)?;
            st.pool = Some(pool);
        }
        Ok((st.pool.clone().expect("just made"), st.config.outputs))
    })
}

/// Counts a finished run: the process's peaks from the run's report and
/// the arenas' totals, and whether it ran out of memory.
pub(crate) fn after_run(worker: &Worker, info: &RunInfo) {
    let (_, total) = tensor_arena_ort::arenas();
    let own = worker.stats();
    let others_reserved = total.reserved.saturating_sub(own.reserved);
    let run_reserved = info.report.reserved + info.report.released;
    with_state(|st| {
        st.reserved_peak = st
            .reserved_peak
            .max(others_reserved + run_reserved)
            .max(total.reserved);
        if info.out_of_memory() {
            st.ooms += 1;
        }
    });
}

/// A process memory budget: every worker's arena commits under it, idle
/// workers give cached memory back when a commit would pass the limit, and
/// a run it still refuses fails with `OutOfMemory` (the session goes on).
/// Takes effect through `configure(budget=...)`.
#[pyclass(frozen, module = "tensor_arena._native")]
pub struct Budget {
    inner: Arc<ArenaBudget>,
}

#[pymethods]
impl Budget {
    /// A budget of `limit` bytes; a commit over it waits up to `wait`
    /// seconds for busy workers to give memory back (0: no wait). `limit`
    /// is bytes or text as `set_memory_limit` takes it (`"512M"`).
    #[new]
    #[pyo3(signature = (limit, wait = 0.0))]
    fn new(limit: Bound<'_, PyAny>, wait: f64) -> PyResult<Self> {
        let Some(limit) = crate::limit::memory_size(&limit)? else {
            return Err(InvalidArgument::new_err(
                "a Budget needs a limit; for none, configure(budget=False)",
            ));
        };
        if !(wait.is_finite() && wait >= 0.0) {
            return Err(InvalidArgument::new_err(format!(
                "wait must be a number of seconds >= 0, not {wait}"
            )));
        }
        let inner = if wait > 0.0 {
            ArenaBudget::with_wait(limit, Duration::from_secs_f64(wait))
        } else {
            ArenaBudget::new(limit)
        };
        Ok(Self { inner })
    }

    /// The limit in bytes.
    #[getter]
    fn limit(&self) -> usize {
        self.inner.limit()
    }

    /// The budget's counters: limit, committed, peak_committed, reclaimed,
    /// reclaims, refusals, waited, members.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("limit", s.limit)?;
        d.set_item("committed", s.committed)?;
        d.set_item("peak_committed", s.peak_committed)?;
        d.set_item("reclaimed", s.reclaimed)?;
        d.set_item("reclaims", s.reclaims)?;
        d.set_item("refusals", s.refusals)?;
        d.set_item("waited", s.waited)?;
        d.set_item("members", s.members)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        let s = self.inner.stats();
        format!(
            "Budget(limit={}, committed={}, members={})",
            s.limit, s.committed, s.members
        )
    }
}

/// Sets up the process's pool for the runs that start after the call;
/// arguments left `None` keep their current value. `workers`: arenas at
/// most (default: two per CPU, or `TENSOR_ARENA_WORKERS`); `budget`: a
/// [`Budget`], or `False` for none of the pool's own (the process's default
/// limit, `memory_limit()`, then applies); `decay`: seconds idle before a worker
/// gives everything back (`0` or `False`: never); `shrink`: `"window"`
/// (crates/ort's default: the largest need of the last second),
/// `"follow"` (the last run's need), `"keep_largest"` or `"never"`;
/// `outputs`: `"copy"` (default) or `"view"`; `huge_pages`: `"auto"`
/// (default, crates/ort's: huge pages where the kernel has them free
/// without compacting on the run's thread, base pages for the rest, and
/// base pages for the rest of a large commit whose first huge pages come
/// slowly, as in a virtual machine whose free memory went back to its
/// host), `True`
/// (huge pages wherever THP is on: a first run may wait for the kernel to
/// compact memory), or `False` (4 KiB pages); `plans`: a directory of plan
/// stores for the sessions opened after the call (`False`: none; default
/// `TENSOR_ARENA_PLANS`): see the `plans` module; `share_large_blocks`:
/// blocks of this many bytes or more come from one arena the pool's
/// workers share (default 1 MiB; `False`: each worker serves all its
/// blocks).
#[pyfunction]
#[pyo3(signature = (*, workers = None, budget = None, decay = None, shrink = None, outputs = None,
    huge_pages = None, plans = None, share_large_blocks = None))]
#[allow(clippy::too_many_arguments)]
fn configure(
    py: Python<'_>,
    workers: Option<usize>,
    budget: Option<Bound<'_, PyAny>>,
    decay: Option<Bound<'_, PyAny>>,
    shrink: Option<&str>,
    outputs: Option<&str>,
    huge_pages: Option<Bound<'_, PyAny>>,
    plans: Option<Bound<'_, PyAny>>,
    share_large_blocks: Option<Bound<'_, PyAny>>,
) -> PyResult<()> {
    let plans_dir = match plans {
        None => None,
        Some(p) if p.is_none() || p.extract::<bool>().is_ok_and(|b| !b) => Some(None),
        Some(p) => Some(Some(p.extract::<std::path::PathBuf>().map_err(|_| {
            InvalidArgument::new_err("plans must be a directory (str or os.PathLike) or False")
        })?)),
    };
    let mut config = with_state(|st| st.config.clone());
    if let Some(n) = workers {
        if n == 0 {
            return Err(InvalidArgument::new_err("workers must be at least 1"));
        }
        config.workers = n;
    }
    if let Some(b) = budget {
        if let Ok(b) = b.cast::<Budget>() {
            config.options.budget = Some(b.get().inner.clone());
        } else if b.is_none() || !b.is_truthy()? {
            config.options.budget = None;
        } else {
            return Err(InvalidArgument::new_err("budget must be a Budget or False"));
        }
    }
    if let Some(d) = decay {
        config.options.decay = if d.is_none() || !d.is_truthy()? {
            None
        } else {
            let secs: f64 = d.extract()?;
            if !(secs.is_finite() && secs > 0.0) {
                return Err(InvalidArgument::new_err(format!(
                    "decay must be seconds > 0, 0 or False, not {secs}"
                )));
            }
            Some(Duration::from_secs_f64(secs))
        };
    }
    if let Some(s) = shrink {
        config.options.shrink = match s {
            "window" => Shrink::default(),
            "follow" => Shrink::FollowInput { runs: 1 },
            "keep_largest" => Shrink::KeepLargest,
            "never" => Shrink::Never,
            _ => {
                return Err(InvalidArgument::new_err(format!(
                    "shrink must be 'window', 'follow', 'keep_largest' or 'never', not {s:?}"
                )))
            }
        };
    }
    if let Some(o) = outputs {
        config.outputs = match o {
            "copy" => OutputMode::Copy,
            "view" => OutputMode::View,
            _ => {
                return Err(InvalidArgument::new_err(format!(
                    "outputs must be 'copy' or 'view', not {o:?}"
                )))
            }
        };
    }
    if let Some(h) = huge_pages {
        use tensor_arena::memory::HugePages;
        config.options.pages.huge_pages = if let Ok(on) = h.extract::<bool>() {
            if on {
                HugePages::Advise
            } else {
                HugePages::Never
            }
        } else if h.extract::<String>().is_ok_and(|s| s == "auto") {
            HugePages::Auto
        } else {
            return Err(InvalidArgument::new_err(format!(
                "huge_pages must be 'auto', True or False, not {h}"
            )));
        };
    }
    if let Some(t) = share_large_blocks {
        config.options.share_large_blocks = if t.extract::<bool>().is_ok_and(|b| !b) {
            None
        } else {
            match t.extract::<i64>() {
                Ok(n) if n > 0 && t.extract::<bool>().is_err() => {
                    Some(usize::try_from(n).unwrap_or(usize::MAX))
                }
                _ => {
                    return Err(InvalidArgument::new_err(format!(
                        "share_large_blocks must be bytes > 0 or False, not {t}"
                    )))
                }
            }
        };
    }
    let pool = WorkerPool::new(config.workers, config.options.clone())
        .map_err(crate::errors::from_arena)?;
    with_state(|st| {
        st.config = config;
        st.pool = Some(pool);
    });
    if let Some(dir) = plans_dir {
        crate::plans::set_dir(py, dir);
    }
    Ok(())
}

/// The current settings, as a dict.
#[pyfunction]
fn config(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let c = with_state(|st| st.config.clone());
    let d = PyDict::new(py);
    d.set_item("workers", c.workers)?;
    let budget = c.options.budget.map(|inner| Budget { inner });
    d.set_item("budget", budget)?;
    d.set_item("decay", c.options.decay.map(|t| t.as_secs_f64()))?;
    d.set_item("share_large_blocks", c.options.share_large_blocks)?;
    let shrink = match c.options.shrink {
        Shrink::FollowInput { .. } => "follow",
        Shrink::Window { .. } => "window",
        Shrink::KeepLargest => "keep_largest",
        _ => "never",
    };
    d.set_item("shrink", shrink)?;
    d.set_item(
        "plans",
        crate::plans::dir(py).map(|p| p.display().to_string()),
    )?;
    match c.options.pages.huge_pages {
        tensor_arena::memory::HugePages::Auto => d.set_item("huge_pages", "auto")?,
        h => d.set_item("huge_pages", h == tensor_arena::memory::HugePages::Advise)?,
    }
    d.set_item(
        "outputs",
        if c.outputs == OutputMode::View {
            "view"
        } else {
            "copy"
        },
    )?;
    Ok(d)
}

/// The arenas' counters, named as crates/cuda's `TorchStats` (PyTorch's
/// `memory_stats()`) names them: `allocated_current`, `allocated_peak`,
/// `reserved_current`, `reserved_peak`, `allocations_current`,
/// `allocations`, `frees`, `ooms`, `free_bytes`, `largest_free_block`
/// (`allocated_*` counted at every alloc and free, and `reserved_*` at
/// every commit and give-back under the workers' budget, so they count the
/// runs in flight, and the peaks the moments when those overlap);
/// and the pool's: `arenas` (alive: the workers' and the one their large
/// blocks share), `large_blocks_reserved` and `large_blocks_allocations`
/// (that shared arena's bytes now and its blocks so far: runs that start
/// beside another take their blocks of `share_large_blocks` bytes or more
/// there), `workers` (the pool's size),
/// `checkouts`, `waits`, `runs`, `planned_runs`, `system_allocs` (tensors
/// ONNX Runtime allocated outside a run: session creation); and its
/// admission by predicted need: `admission_room` (bytes the runs may be
/// promised together now; `None` without a limit), `admitted_current` and
/// `admitted_peak` (bytes promised to runs in flight), `runs_in_flight`,
/// `runs_in_flight_peak`, `queued` (runs waiting for room now),
/// `admissions`, `admission_waits`, `admission_passes` (runs that fitted
/// and went ahead of a larger one), `wait_seconds_total`,
/// `wait_seconds_max`, `retried_alone` (runs that ran out of memory beside
/// others and ran again alone), `refused` (runs that could not fit alone)
/// and `processes_sharing_limit` (the container's processes under one
/// limit); and `slow_huge_commits`: commits of the arenas alive that took
/// base pages because their huge pages came slowly (a virtual machine
/// whose free memory went back to its host).
#[pyfunction]
fn stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let (n, s) = tensor_arena_ort::arenas();
    let (live, live_peak) = tensor_arena_ort::live_together();
    let (rpeak, ooms, pool, workers, budget) = with_state(|st| {
        (
            st.reserved_peak,
            st.ooms,
            st.pool.as_ref().map(WorkerPool::stats),
            st.config.workers,
            st.pool.is_some().then(|| st.config.options.budget.clone()),
        )
    });
    // The workers' budget counts every commit and give-back: what it holds
    // is the arenas' reserved bytes now, and its peak their reserved peak,
    // exact while runs are in flight (the arenas' own stats are published
    // at each run's end).
    let (reserved, rpeak) = match workers_budget(budget) {
        Some(b) => {
            let now = b.committed();
            (now, b.stats().peak_committed.max(now))
        }
        None => (s.reserved, rpeak.max(s.reserved)),
    };
    let counters = tensor_arena_ort::allocator_counters();
    let d = PyDict::new(py);
    d.set_item("allocated_current", live)?;
    d.set_item("allocated_peak", live_peak)?;
    d.set_item("reserved_current", reserved)?;
    d.set_item("reserved_peak", rpeak)?;
    d.set_item("allocations_current", s.live_blocks)?;
    d.set_item("allocations", s.allocs)?;
    d.set_item("frees", s.frees)?;
    d.set_item("ooms", ooms)?;
    d.set_item("free_bytes", s.reserved.saturating_sub(s.in_use))?;
    d.set_item("largest_free_block", s.largest_free_block)?;
    d.set_item("arenas", n)?;
    let large = pool.and_then(|p| p.large_blocks);
    d.set_item("large_blocks_reserved", large.map_or(0, |l| l.reserved))?;
    d.set_item("large_blocks_allocations", large.map_or(0, |l| l.allocs))?;
    d.set_item("workers", pool.map_or(workers, |p| p.size))?;
    d.set_item("checkouts", pool.map_or(0, |p| p.checkouts))?;
    d.set_item("waits", pool.map_or(0, |p| p.waits))?;
    d.set_item("runs", s.runs)?;
    d.set_item("planned_runs", s.planned_runs)?;
    d.set_item("slow_huge_commits", s.slow_huge_commits)?;
    // Admission by predicted need (shared by every pool under the
    // default limit).
    let a = pool.map(|p| p.admission).unwrap_or_default();
    let room = pool.and_then(|p| (p.admission.room != usize::MAX).then_some(p.admission.room));
    d.set_item("admission_room", room)?;
    d.set_item("admitted_current", a.promised)?;
    d.set_item("admitted_peak", a.promised_peak)?;
    d.set_item("runs_in_flight", a.running)?;
    d.set_item("runs_in_flight_peak", a.running_peak)?;
    d.set_item("queued", a.queued)?;
    d.set_item("admissions", a.admitted)?;
    d.set_item("admission_waits", a.waited)?;
    d.set_item("admission_passes", a.passed)?;
    d.set_item("wait_seconds_total", a.wait_total.as_secs_f64())?;
    d.set_item("wait_seconds_max", a.wait_max.as_secs_f64())?;
    d.set_item("retried_alone", a.retried_alone)?;
    d.set_item("refused", a.refused)?;
    d.set_item("processes_sharing_limit", a.processes)?;
    d.set_item("system_allocs", counters.system_allocs)?;
    Ok(d)
}

/// Peaks start again from the current figures.
#[pyfunction]
fn reset_peak_stats() {
    let (_, s) = tensor_arena_ort::arenas();
    tensor_arena_ort::reset_live_peak();
    let budget = with_state(|st| {
        st.reserved_peak = s.reserved;
        st.pool.is_some().then(|| st.config.options.budget.clone())
    });
    if let Some(b) = workers_budget(budget) {
        b.reset_peak();
    }
}

/// The budget the pool's workers commit under, once the pool exists
/// (`pool_budget`: `Some` of the configured one then): the configured one,
/// else the default limit's, which the pool made. Read outside the
/// state's lock (the default limit has its own).
fn workers_budget(pool_budget: Option<Option<Arc<ArenaBudget>>>) -> Option<Arc<ArenaBudget>> {
    match pool_budget? {
        Some(b) => Some(b),
        None => tensor_arena_ort::default_budget().ok().flatten(),
    }
}

/// Idle workers give cached memory back: down to what their models' recent
/// runs need, or all of it with `everything`. Busy workers are skipped
/// (their own shrink policy runs after their run). Live outputs keep their
/// blocks. Returns the bytes released.
#[pyfunction]
#[pyo3(signature = (everything = false))]
fn shrink(py: Python<'_>, everything: bool) -> usize {
    let Some(pool) = with_state(|st| st.pool.clone()) else {
        return 0;
    };
    py.detach(|| {
        let mut out: Vec<Checkout> = Vec::new();
        while let Some(c) = pool.try_checkout() {
            out.push(c);
        }
        out.iter_mut().map(|c| c.parts().0.shrink(everything)).sum()
    })
}

/// `os.register_at_fork(before=...)`: waits for the runs inside ONNX
/// Runtime ([`IN_ORT`]) and keeps new ones out, then takes the pool's lock,
/// the plan saver's and crates/ort's process-wide locks
/// ([`tensor_arena_ort::fork`]), so that the child has none held by a
/// thread it does not have. The GIL is let go while the runs finish (they
/// do not need it inside ONNX Runtime, and other Python threads go on
/// meanwhile), and held from then on.
#[pyfunction]
fn _fork_prepare(py: Python<'_>) {
    // The guards stay on this thread (`detach` runs the closure here). The
    // plan saver's locks are taken without the GIL too: a save may be
    // under way, and it does not need the GIL to finish.
    py.detach(|| {
        fork::hold(IN_ORT.write());
        // No run is inside ONNX Runtime now, nor will one enter: let the
        // pool threads of the last ones go to sleep ([`SETTLE`]).
        let left = LEFT_ORT.load(Ordering::Relaxed);
        let since = Duration::from_nanos(now_ns().saturating_sub(left));
        if left != 0 && since < SETTLE {
            std::thread::sleep(SETTLE - since);
        }
        crate::plans::prepare_fork();
    });
    // With the GIL, and never let go from here: a thread that holds the
    // GIL may wait for STATE (`pool()`), so STATE is taken only once this
    // thread has the GIL back, and the GIL is not let go while STATE is
    // held.
    fork::hold(STATE.lock());
    fork::prepare();
}

/// `after_in_parent`: lets the locks [`_fork_prepare`] took go.
#[pyfunction]
fn _fork_parent() {
    fork::parent();
}

/// `after_in_child`: in the forked child, lets the locks go, restarts idle
/// decay where a worker waits for it, and gives the child a pool of its
/// own: the parent's idle workers (their memory decays as before) and new
/// ones for those that threads of the parent held; and a plan saver of its
/// own.
#[pyfunction]
fn _fork_child() {
    // SAFETY: CPython calls `after_in_child` in the child, on the thread
    // that forked (the only one), right after the fork, once;
    // `_fork_prepare` took the locks in the parent just before.
    unsafe { fork::child() };
    if let Some(st) = STATE.lock().as_mut() {
        if let Some(old) = st.pool.take() {
            // `after_fork` fails only for invalid options, which made the
            // old pool: then the next run makes one (`pool()`).
            st.pool = old.after_fork(st.config.options.clone()).ok();
        }
    }
    crate::plans::child_after_fork();
}

/// Adds the pool's functions and `Budget` to the module.
pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Budget>()?;
    m.add_function(wrap_pyfunction!(configure, m)?)?;
    m.add_function(wrap_pyfunction!(config, m)?)?;
    m.add_function(wrap_pyfunction!(stats, m)?)?;
    m.add_function(wrap_pyfunction!(reset_peak_stats, m)?)?;
    m.add_function(wrap_pyfunction!(shrink, m)?)?;
    m.add_function(wrap_pyfunction!(_fork_prepare, m)?)?;
    m.add_function(wrap_pyfunction!(_fork_parent, m)?)?;
    m.add_function(wrap_pyfunction!(_fork_child, m)?)?;
    Ok(())
}
