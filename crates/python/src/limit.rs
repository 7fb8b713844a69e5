//! The process's default memory limit, seen and set from Python
//! (crates/ort's `default_memory_limit` and `set_default_memory_limit`).
//!
//! | call | what it does |
//! |---|---|
//! | `memory_limit()` | the limit every worker without a `Budget` of its own commits under: `{"bytes": n, "source": ..., "file": ...}`, or `None` for no limit |
//! | `set_memory_limit(limit)` | sets it (bytes, text such as `"1G"`, or `None`: no limit), before the first session, `configure()` and the first run |
//! | `reserve(nbytes, for_run=False)` | waits until `nbytes` fit beside the runs in flight under the limit, and holds them until the reservation ends (`with ta.reserve(n): decode()`); `for_run=True`: with the room of the thread's next run, which takes it over |
//!
//! Where it comes from, first that applies: `set_memory_limit`, then
//! `TENSOR_ARENA_MEMORY_LIMIT` (`512M`, `4GiB`, bytes, or `off`), then the
//! process's cgroup limit (a container's `--memory`: the whole container,
//! whose processes' arenas get what the rest of those processes leave),
//! then 50 % of `MemTotal`. Every process of the container under the same
//! limit shares it. It is read once, when the first worker is made.

use crate::errors::InvalidArgument;
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tensor_arena_ort::LimitSource;

/// The default limit of the process's workers' memory: the one in force if
/// a run happened, else the one that would be. A dict with `bytes`,
/// `source` (`"set_memory_limit"`, `"environment"`, `"cgroup"` or
/// `"memtotal"`) and `file` (the cgroup file read, else `None`); `None`
/// when there is no limit (`TENSOR_ARENA_MEMORY_LIMIT=off`,
/// `set_memory_limit(None)`). A `Budget` given to `configure` applies
/// instead of this one.
///
/// # Errors
/// `InvalidArgument` when `TENSOR_ARENA_MEMORY_LIMIT` holds no size.
#[pyfunction]
fn memory_limit(py: Python<'_>) -> PyResult<Option<Bound<'_, PyDict>>> {
    let Some(limit) = tensor_arena_ort::default_memory_limit()
        .map_err(|e| InvalidArgument::new_err(e.to_string()))?
    else {
        return Ok(None);
    };
    let d = PyDict::new(py);
    d.set_item("bytes", limit.bytes)?;
    let (source, file) = match &limit.source {
        LimitSource::Code => ("set_memory_limit", None),
        LimitSource::Environment => ("environment", None),
        LimitSource::Cgroup(f) => ("cgroup", Some(f.display().to_string())),
        LimitSource::MemTotal => ("memtotal", None),
    };
    d.set_item("source", source)?;
    d.set_item("file", file)?;
    Ok(Some(d))
}

/// Sets the default limit of the process's workers' memory (`None` or
/// `"off"`: no limit), in place of `TENSOR_ARENA_MEMORY_LIMIT`'s and the
/// system's: bytes as an int, or text as the variable takes it (`"512M"`,
/// `"1G"`, `"4GiB"`). Every process of the container that sets the same
/// limit shares it. Call it before the first session, `configure()` and
/// the first run: a session joins the container's limit when it is made
/// (so that the other processes count what it holds while it loads), and
/// the others make the pool's workers.
///
/// # Errors
/// `InvalidArgument` for a value that is not a size, 0, negative or more
/// than the machine's memory, or once a session, `configure()` or a run
/// put the limit in force (it then stays).
#[pyfunction]
#[pyo3(signature = (limit))]
fn set_memory_limit(limit: Option<Bound<'_, PyAny>>) -> PyResult<()> {
    let bytes = match limit {
        None => None,
        Some(v) => memory_size(&v)?,
    };
    tensor_arena_ort::set_default_memory_limit(bytes)
        .map_err(|e| InvalidArgument::new_err(e.to_string()))
}

/// A memory size from Python: an int (bytes), text (`"1G"`, `"off"`), or
/// `None`/`"off"` for no limit; checked as [`set_memory_limit`] says.
pub(crate) fn memory_size(v: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
    if v.is_none() {
        return Ok(None);
    }
    if let Ok(text) = v.extract::<String>() {
        return tensor_arena_ort::parse_memory_limit(&text)
            .map_err(|e| InvalidArgument::new_err(e.to_string()));
    }
    if v.is_instance_of::<pyo3::types::PyBool>() {
        return Err(InvalidArgument::new_err(
            "a memory limit is a size (bytes, or text such as \"1G\"), not a bool",
        ));
    }
    let n: i128 = v.extract().map_err(|_| {
        InvalidArgument::new_err(format!(
            "a memory limit is bytes (an int) or text such as \"1G\", not {v}"
        ))
    })?;
    if n < 0 {
        return Err(InvalidArgument::new_err(format!(
            "a memory limit of {n} bytes: a limit is not negative (None: no limit)"
        )));
    }
    let bytes = usize::try_from(n).map_err(|_| {
        InvalidArgument::new_err(format!("a memory limit of {n} bytes is too large"))
    })?;
    tensor_arena_ort::check_memory_limit(bytes)
        .map(Some)
        .map_err(|e| InvalidArgument::new_err(e.to_string()))
}

/// Bytes promised to the application under the memory limit, beside the
/// runs, until `release()` or the end of its `with` block.
#[pyclass(frozen, module = "tensor_arena._native")]
pub struct Reservation {
    held: Mutex<Option<tensor_arena_ort::Reservation>>,
    bytes: usize,
}

#[pymethods]
impl Reservation {
    /// The bytes reserved (for a reservation for a run: the application's
    /// and the run's).
    #[getter]
    fn nbytes(&self) -> usize {
        self.bytes
    }

    /// Whether it still holds its bytes (a reservation for a run no longer
    /// does once the thread's run took them over).
    #[getter]
    fn held(&self) -> bool {
        self.held.lock().as_ref().is_some_and(|r| r.held())
    }

    /// Gives the bytes back (again: nothing).
    fn release(&self) {
        self.held.lock().take();
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.release();
        false
    }

    fn __repr__(&self) -> String {
        format!("Reservation(nbytes={}, held={})", self.bytes, self.held())
    }
}

/// Waits until `nbytes` fit in what the memory limit has not promised to
/// the runs in flight (of every process sharing the limit) and to other
/// reservations, then holds them for the caller: for work that allocates
/// outside the arenas, such as decoding a request's image (`with
/// ta.reserve(h * w * 10): img = decode(body)`). The wait is first come,
/// first served with the runs and releases the GIL. Without a limit it
/// returns at once.
///
/// `for_run=False`: end it before the request's own runs (a plain
/// reservation held while a run of the same thread waits for room can wait
/// on itself under a tight limit). `for_run=True`: it holds `nbytes` and
/// the room of the largest run admitted so far, and the thread's next run
/// takes it over (what that run does not need goes back, and it does not
/// wait again; a run it does not cover gives it back and waits its turn):
/// hold it around the whole request (`with ta.reserve(h * w * 10,
/// for_run=True): img = decode(body); result = engine(img)`), so that a
/// server decodes no more requests than their runs have room for.
///
/// # Errors
/// `OutOfMemory` at once when `nbytes` is more than the limit could ever
/// give (the limit less what the rest of the processes holds);
/// `InvalidArgument` for a negative or non-integer size.
#[pyfunction]
#[pyo3(signature = (nbytes, *, for_run = false))]
fn reserve(py: Python<'_>, nbytes: Bound<'_, PyAny>, for_run: bool) -> PyResult<Reservation> {
    if nbytes.is_instance_of::<pyo3::types::PyBool>() {
        return Err(InvalidArgument::new_err(
            "nbytes is a number of bytes, not a bool",
        ));
    }
    let n: i128 = nbytes.extract().map_err(|_| {
        InvalidArgument::new_err(format!(
            "nbytes is a number of bytes (an int), not {nbytes}"
        ))
    })?;
    let bytes = usize::try_from(n).map_err(|_| {
        InvalidArgument::new_err(format!("nbytes must be at least 0 and countable, not {n}"))
    })?;
    let (pool, _) = crate::pool::pool()?;
    let admission = std::sync::Arc::clone(pool.admission());
    let held = py
        .detach(|| {
            if for_run {
                admission.reserve_for_run(bytes)
            } else {
                admission.reserve(bytes)
            }
        })
        .map_err(crate::errors::from_arena)?;
    Ok(Reservation {
        bytes: held.bytes(),
        held: Mutex::new(Some(held)),
    })
}

/// Adds the functions to the module.
pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(memory_limit, m)?)?;
    m.add_function(wrap_pyfunction!(set_memory_limit, m)?)?;
    m.add_function(wrap_pyfunction!(reserve, m)?)?;
    m.add_class::<Reservation>()?;
    Ok(())
}
