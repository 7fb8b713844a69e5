//! Plans that outlive the process: with `configure(plans="DIR")` or
//! `TENSOR_ARENA_PLANS=DIR`, each session's plans start from its model's
//! plan store in DIR (crates/ort's `Plans::with_store`) and are saved back
//! to it, merged with what other processes (uvicorn workers, replicas)
//! saved there, every `TENSOR_ARENA_PLANS_EVERY` seconds (default 30) on a
//! thread of their own and once more at exit: never on a run's thread.
//!
//! | call | what it does |
//! |---|---|
//! | `configure(plans="DIR")` | sessions opened after it use DIR's stores (`False`: none) |
//! | `save_plans()` | saves every session's plans now; returns how many stores were written |
//!
//! Locks and the GIL: a fork's `before` hook takes `SAVING` and `STATE`
//! without the GIL, then waits for the GIL while it holds them. So a
//! thread that holds the GIL never waits for either. A call from Python
//! takes `STATE` at once if it is free (`with_state`), and otherwise
//! lets the GIL go (`py.detach`) before it waits. Letting the GIL go on
//! every call instead starved the process: a thread calling `configure`
//! or `config()` in a loop took it back before any waiting thread woke,
//! for seconds at a time (the fork test's main thread, on a 2-core
//! machine).
//!
//! A relative directory (`configure(plans="plans")` or
//! `TENSOR_ARENA_PLANS=plans`) is made absolute once, when it is
//! configured (the environment's when first read), against the current
//! directory then, with a leading `~` expanded: a process that changes
//! directory later keeps saving where it loaded.

use pyo3::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tensor_arena_ort::fork::{self, ForkMutex};
use tensor_arena_ort::{model_key, PlanSaver, PlanStore, Plans};

/// Plans kept per model, as crates/ort's default.
const CAPACITY: usize = 64;

struct State {
    /// The directory set by `configure` (or read from the environment on
    /// first use), absolute: `None` until set, `Some(None)` for none.
    dir: Option<Option<PathBuf>>,
    /// Every store-backed session's plans, while alive.
    live: Vec<Weak<Plans>>,
    /// The saving thread, started with the first store-backed session.
    saver: Option<PlanSaver>,
}

static STATE: ForkMutex<State> = ForkMutex::new(State {
    dir: None,
    live: Vec::new(),
    saver: None,
});

/// Held for each save ([`save_all`]), so that a fork never copies a save
/// midway (a session's plans locked by the saving thread, which the child
/// does not have).
static SAVING: ForkMutex<()> = ForkMutex::new(());

/// The fork's `before` hook: waits for a save in progress, then takes the
/// state, both kept until crates/ort's `fork::parent` or `fork::child`.
pub(crate) fn prepare_fork() {
    fork::hold(SAVING.lock());
    fork::hold(STATE.lock());
}

/// In a forked child, after the locks are let go: the parent's saving
/// thread does not exist here (its handle is forgotten: stopping it would
/// wait for it); the child saves on a thread of its own.
pub(crate) fn child_after_fork() {
    let mut st = STATE.lock();
    std::mem::forget(st.saver.take());
    st.live.retain(|w| w.strong_count() > 0);
    if !st.live.is_empty() {
        st.saver = PlanSaver::start(every(), || {
            save_all();
        })
        .ok();
    }
}

/// Runs `f` on `STATE` from a thread that holds the GIL: at once if
/// `STATE` is free, else after letting the GIL go to wait for it (see
/// the module's docs).
fn with_state<T: Send>(py: Python<'_>, f: impl FnOnce(&mut State) -> T + Send) -> T {
    if let Some(mut st) = STATE.try_lock() {
        return f(&mut st);
    }
    py.detach(|| f(&mut STATE.lock()))
}

/// Sets the directory of the stores of sessions opened from now on (made
/// absolute now: [`absolute`]).
pub(crate) fn set_dir(py: Python<'_>, dir: Option<PathBuf>) {
    let dir = dir.map(|d| absolute(&d));
    with_state(py, |st| st.dir = Some(dir));
}

/// The directory configured, else `TENSOR_ARENA_PLANS` (read and made
/// absolute once, then kept), if any.
pub(crate) fn dir(py: Python<'_>) -> Option<PathBuf> {
    with_state(py, |st| {
        st.dir
            .get_or_insert_with(|| {
                std::env::var_os("TENSOR_ARENA_PLANS")
                    .filter(|v| !v.is_empty())
                    .map(|v| absolute(Path::new(&v)))
            })
            .clone()
    })
}

/// `dir` with a leading `~` (alone or followed by `/`) replaced by `HOME`,
/// then absolute against the current directory (unchanged if that cannot
/// be read).
pub(crate) fn absolute(dir: &Path) -> PathBuf {
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty());
    let expanded = match (dir.strip_prefix("~"), home) {
        (Ok(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => dir.to_path_buf(),
    };
    std::path::absolute(&expanded).unwrap_or(expanded)
}

/// Seconds between saves: `TENSOR_ARENA_PLANS_EVERY`, default 30.
fn every() -> Duration {
    let secs = std::env::var("TENSOR_ARENA_PLANS_EVERY")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(30.0);
    Duration::from_secs_f64(secs)
}

/// The plans of a new session: from its model's store when a directory is
/// set (`model` gives the model's bytes, read only then; `options` the
/// session options that change the allocation order), else empty.
pub(crate) fn for_model(
    py: Python<'_>,
    model: impl FnOnce() -> std::io::Result<Vec<u8>>,
    runtime_version: &str,
    options: &str,
) -> PyResult<Arc<Plans>> {
    let Some(dir) = dir(py) else {
        return Ok(Arc::new(Plans::new(CAPACITY)));
    };
    let bytes = model().map_err(|e| crate::errors::NoSuchFile::new_err(e.to_string()))?;
    let store = PlanStore::new(dir, model_key(&bytes, runtime_version, options));
    let plans = Arc::new(py.detach(|| Plans::with_store(CAPACITY, store)));
    // Never waiting with the GIL (see the module's docs), and the saver
    // started under the same lock, so that two sessions made at once start
    // one.
    let started = with_state(py, |st| {
        st.live.retain(|w| w.strong_count() > 0);
        st.live.push(Arc::downgrade(&plans));
        if st.saver.is_some() {
            return Ok(false);
        }
        st.saver = Some(PlanSaver::start(every(), || {
            save_all();
        })?);
        Ok(true)
    });
    let start = started
        .map_err(|e: std::io::Error| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
    if start {
        // The last save at exit (off any run: runs have ended).
        let save = wrap_pyfunction!(save_plans, py)?;
        py.import("atexit")?.call_method1("register", (save,))?;
    }
    Ok(plans)
}

/// Saves every live store-backed session's plans that learned something;
/// returns how many stores were written. A store that cannot be written
/// is reported in one line on stderr.
fn save_all() -> usize {
    let _saving = SAVING.lock();
    let live: Vec<Arc<Plans>> = STATE.lock().live.iter().filter_map(Weak::upgrade).collect();
    let mut written = 0;
    for plans in live {
        match plans.save() {
            Some(Ok(_)) => written += 1,
            Some(Err(e)) => eprintln!("tensor_arena: plans not saved: {e}"),
            None => {}
        }
    }
    written
}

/// Saves every session's plans to its store now (they are also saved
/// every `TENSOR_ARENA_PLANS_EVERY` seconds and at exit); returns how many
/// stores were written.
#[pyfunction]
fn save_plans(py: Python<'_>) -> usize {
    py.detach(save_all)
}

pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(save_plans, m)?)?;
    Ok(())
}
