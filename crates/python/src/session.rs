//! One model: an ONNX Runtime session whose CPU tensors are tensor-arena's,
//! with the model's plans, run from any Python thread.

use crate::arrays::{self, onnx_type_name};
use crate::errors::{self, InvalidArgument, LibraryError};
use crate::pool;
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use tensor_arena::{DynamicReason, PlanSource};
use tensor_arena_ort::ort;
use tensor_arena_ort::ort::session::builder::GraphOptimizationLevel;
use tensor_arena_ort::ort::value::{DynValue, ValueType};
use tensor_arena_ort::{InputSpec, Plans, RunKey, Runtime, SessionBuilderExt};

/// The runtime loaded by `load`.
pub(crate) fn runtime() -> Option<&'static Runtime> {
    // `Runtime::load` returns the process's one runtime once loaded; asking
    // for it by the path it holds costs a lock and a comparison.
    LOADED.get().copied()
}

pub(crate) static LOADED: std::sync::OnceLock<&'static Runtime> = std::sync::OnceLock::new();

/// A model input or output as onnxruntime's `NodeArg` describes it: name,
/// dimensions (an int, the symbol's name, or `None` for a free dimension
/// with no name) and type (`tensor(float)`).
type Meta = (String, Vec<Dim>, String);

/// One dimension of a [`Meta`].
#[derive(Clone, Debug, IntoPyObject)]
enum Dim {
    Fixed(i64),
    Symbol(String),
    Free(Option<()>),
}

fn meta(outlet: &ort::value::Outlet) -> Meta {
    let name = outlet.name().to_string();
    match outlet.dtype() {
        ValueType::Tensor {
            ty,
            shape,
            dimension_symbols,
        } => {
            let dims = shape
                .iter()
                .enumerate()
                .map(|(i, &d)| match dimension_symbols.get(i) {
                    _ if d >= 0 => Dim::Fixed(d),
                    Some(s) if !s.is_empty() => Dim::Symbol(s.clone()),
                    _ => Dim::Free(None),
                })
                .collect();
            (name, dims, onnx_type_name(*ty).to_string())
        }
        other => (name, Vec::new(), other.to_string()),
    }
}

/// What the session's last run did (of any thread: the last to finish).
#[derive(Clone, Debug, Default)]
struct LastRun {
    /// "exact", "predicted" or "dynamic".
    plan: &'static str,
    /// Why a run had no plan ("" when it had one).
    dynamic_reason: String,
    /// A planned run that left its plan (and went on from the core).
    fell_back: bool,
    learned: bool,
    key: Vec<usize>,
    allocs: u64,
    planned_allocs: u64,
    peak_in_use: usize,
    high_water: usize,
    reserved: usize,
    released: usize,
    commits: u64,
    out_of_memory: bool,
}

/// An ONNX Runtime session over tensor-arena memory (the Rust side of
/// `tensor_arena.onnxruntime.InferenceSession`).
#[pyclass(frozen, module = "tensor_arena._native")]
pub struct Session {
    session: ort::session::Session,
    plans: std::sync::Arc<Plans>,
    specs: Vec<InputSpec>,
    inputs: Vec<Meta>,
    outputs: Vec<Meta>,
    last: Mutex<Option<LastRun>>,
    /// The session configuration entries passed on to ONNX Runtime: the
    /// caller's, then the defaults added ([`default_spin`]).
    config_entries: Vec<(String, String)>,
}

fn level(n: i64) -> PyResult<GraphOptimizationLevel> {
    Ok(match n {
        0 => GraphOptimizationLevel::Disable,
        1 => GraphOptimizationLevel::Level1,
        2 => GraphOptimizationLevel::Level2,
        3 => GraphOptimizationLevel::Level3,
        99 => GraphOptimizationLevel::All,
        _ => {
            return Err(InvalidArgument::new_err(format!(
                "graph_optimization_level {n} is not one of 0, 1, 2, 3, 99"
            )))
        }
    })
}

fn log_level(n: i64) -> PyResult<Option<ort::logging::LogLevel>> {
    use ort::logging::LogLevel as L;
    Ok(match n {
        -1 => None,
        0 => Some(L::Verbose),
        1 => Some(L::Info),
        2 => Some(L::Warning),
        3 => Some(L::Error),
        4 => Some(L::Fatal),
        _ => {
            return Err(InvalidArgument::new_err(format!(
                "log_severity_level {n} is not one of -1, 0, 1, 2, 3, 4"
            )))
        }
    })
}

/// The session configuration entries passed on to ONNX Runtime, checked
/// (ONNX Runtime takes any value of these silently): the thread pools'
/// spinning switches ("0" or "1"), and how long an idle pool thread spins
/// before it sleeps (microseconds) and its backoff cap (1 to 64).
pub(crate) const CONFIG_ENTRIES: [&str; 7] = [
    "session.intra_op.allow_spinning",
    "session.inter_op.allow_spinning",
    "session.force_spinning_stop",
    "session.intra_op.spin_duration_us",
    "session.inter_op.spin_duration_us",
    "session.intra_op.spin_backoff_max",
    "session.inter_op.spin_backoff_max",
];

fn config_entry(key: &str, value: &str) -> PyResult<()> {
    if !CONFIG_ENTRIES.contains(&key) {
        return Err(InvalidArgument::new_err(format!(
            "session config entry {key:?} is not one tensor-arena passes on (it passes {CONFIG_ENTRIES:?})"
        )));
    }
    // Digits only (Rust's parse takes a leading '+'), within a C `int`,
    // which ONNX Runtime reads them into.
    let number = || {
        value
            .parse::<i32>()
            .ok()
            .filter(|&n| n >= 0 && value.bytes().all(|b| b.is_ascii_digit()))
    };
    let ok = if key.ends_with("spin_duration_us") {
        number().is_some()
    } else if key.ends_with("spin_backoff_max") {
        number().is_some_and(|n| (1..=64).contains(&n))
    } else {
        value == "0" || value == "1"
    };
    if !ok {
        let expected = if key.ends_with("spin_duration_us") {
            "microseconds, a whole number up to 2147483647"
        } else if key.ends_with("spin_backoff_max") {
            "a whole number from 1 to 64"
        } else {
            "\"0\" or \"1\""
        };
        return Err(InvalidArgument::new_err(format!(
            "session config entry {key:?} = {value:?}: {expected}"
        )));
    }
    Ok(())
}

/// How long an idle intra-op thread spins before it sleeps, in
/// microseconds, where the options say nothing of spinning: see
/// [`default_spin`].
const DEFAULT_SPIN_US: &str = "50";

const INTRA_SPIN_US: &str = "session.intra_op.spin_duration_us";

/// The intra-op spin duration a session gets that its options leave to
/// the default: [`DEFAULT_SPIN_US`], unless they set a duration or
/// intra-op spinning either way (then `None`: ONNX Runtime's defaults and
/// theirs stand).
///
/// ONNX Runtime's own default spins far longer. With one run at a time
/// that costs CPU the caller's Python work needs, and the pool runs
/// several at once, whose cores spinning threads then take (2 cores, 16
/// Python threads: 0.85-0.93x onnxruntime's requests/s with its default,
/// 0.95-1.05x with 50 µs; one thread of det and rec 1.25x faster). 50 µs
/// still covers the gaps between one run's parallel loops: a stream of
/// small runs one at a time is as fast as with the default (BENCHMARKS.md,
/// "Spinning").
fn default_spin(entries: &[(String, String)]) -> Option<&'static str> {
    let set = |k: &str| {
        entries
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    };
    if set(INTRA_SPIN_US).is_some() || set("session.intra_op.allow_spinning").is_some() {
        return None;
    }
    Some(DEFAULT_SPIN_US)
}

fn threads(what: &str, n: i64) -> PyResult<usize> {
    usize::try_from(n)
        .map_err(|_| InvalidArgument::new_err(format!("{what} must be >= 0, not {n}")))
}

#[pymethods]
impl Session {
    /// Opens `model` (a path, or the model's bytes) with ONNX Runtime's
    /// options as onnxruntime's `SessionOptions` names them (0 threads:
    /// ONNX Runtime's default; `execution_mode` 0 sequential, 1 parallel;
    /// `log_severity_level` -1 keeps the environment's).
    #[new]
    #[pyo3(signature = (model, *, intra_op_num_threads = 0, inter_op_num_threads = 0,
        graph_optimization_level = 99, execution_mode = 0, log_severity_level = -1,
        config_entries = Vec::new()))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: &Bound<'_, PyAny>,
        intra_op_num_threads: i64,
        inter_op_num_threads: i64,
        graph_optimization_level: i64,
        execution_mode: i64,
        log_severity_level: i64,
        config_entries: Vec<(String, String)>,
    ) -> PyResult<Self> {
        let rt = runtime().ok_or_else(|| {
            LibraryError::new_err(
                "ONNX Runtime is not loaded: call tensor_arena._native.load(path)",
            )
        })?;
        for (key, value) in &config_entries {
            config_entry(key, value)?;
        }
        let mut passed = config_entries;
        if let Some(us) = default_spin(&passed) {
            passed.push((INTRA_SPIN_US.to_owned(), us.to_owned()));
        }
        let intra = threads("intra_op_num_threads", intra_op_num_threads)?;
        let inter = threads("inter_op_num_threads", inter_op_num_threads)?;
        let level = level(graph_optimization_level)?;
        let log = log_level(log_severity_level)?;
        let parallel = match execution_mode {
            0 => false,
            1 => true,
            n => {
                return Err(InvalidArgument::new_err(format!(
                    "execution_mode {n} is not 0 (sequential) or 1 (parallel)"
                )))
            }
        };
        enum Source<'a> {
            Path(std::path::PathBuf),
            Bytes(&'a [u8]),
        }
        let bytes = model.cast::<PyBytes>().ok();
        let source = match &bytes {
            Some(b) => Source::Bytes(b.as_bytes()),
            None => Source::Path(model.extract().map_err(|_| {
                InvalidArgument::new_err("model must be a path (str or os.PathLike) or bytes")
            })?),
        };
        if let Source::Path(p) = &source {
            if !p.is_file() {
                return Err(errors::NoSuchFile::new_err(format!(
                    "model file not found: {}",
                    p.display()
                )));
            }
        }
        let session = py.detach(|| -> PyResult<ort::session::Session> {
            // This process is one of its container's under the default
            // limit from now on (its other processes count what it holds
            // while its sessions load); a bad limit surfaces at the first
            // run.
            let _ = tensor_arena_ort::join_default_limit();
            // One load at a time in the container, no run beside it: a
            // load takes hundreds of MiB outside any arena. A limit that
            // cannot be read, or a turn that never comes, loads anyway.
            let turn = tensor_arena_ort::load_turn().ok();
            let _in_ort = pool::in_onnxruntime();
            let mut b =
                ort::session::Session::builder(rt.environment()).map_err(errors::from_ort)?;
            b = b.with_optimization_level(level).map_err(errors::from_ort)?;
            if intra > 0 {
                b = b.with_intra_threads(intra).map_err(errors::from_ort)?;
            }
            if inter > 0 {
                b = b.with_inter_threads(inter).map_err(errors::from_ort)?;
            }
            b = b
                .with_parallel_execution(parallel)
                .map_err(errors::from_ort)?;
            if let Some(l) = log {
                b = b.with_log_level(l).map_err(errors::from_ort)?;
            }
            for (key, value) in &passed {
                b = b.with_config_entry(key, value).map_err(errors::from_ort)?;
            }
            b = b.with_tensor_arena().map_err(errors::from_ort)?;
            let session = match &source {
                Source::Path(p) => b.commit_from_file(p),
                Source::Bytes(bytes) => b.commit_from_memory(bytes),
            }
            .map_err(errors::from_ort);
            drop(turn);
            // And what it holds with this session loaded.
            let _ = tensor_arena_ort::join_default_limit();
            session
        })?;
        // The options that change the allocation order key the store.
        let options = format!(
            "intra={intra} inter={inter} opt={graph_optimization_level} mode={execution_mode}"
        );
        let model_bytes = || match &source {
            Source::Bytes(b) => Ok(b.to_vec()),
            Source::Path(p) => std::fs::read(p),
        };
        let plans = crate::plans::for_model(py, model_bytes, rt.version(), &options)?;
        Ok(Self {
            specs: InputSpec::of(&session),
            inputs: session.inputs().iter().map(meta).collect(),
            outputs: session.outputs().iter().map(meta).collect(),
            plans,
            session,
            last: Mutex::new(None),
            config_entries: passed,
        })
    }

    /// The session configuration entries passed on to ONNX Runtime, as
    /// (key, value) pairs: the options' own, then the defaults added.
    fn config_entries(&self) -> Vec<(String, String)> {
        self.config_entries.clone()
    }

    /// The model's inputs: (name, shape, type) each.
    fn inputs(&self) -> Vec<Meta> {
        self.inputs.clone()
    }

    /// The model's outputs: (name, shape, type) each.
    fn outputs(&self) -> Vec<Meta> {
        self.outputs.clone()
    }

    /// The model's metadata: producer_name, graph_name, domain,
    /// description, graph_description, version, custom_metadata_map.
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let m = self.session.metadata().map_err(errors::from_ort)?;
        let d = PyDict::new(py);
        d.set_item("producer_name", m.producer().unwrap_or_default())?;
        d.set_item("graph_name", m.name().unwrap_or_default())?;
        d.set_item("domain", m.domain().unwrap_or_default())?;
        d.set_item("description", m.description().unwrap_or_default())?;
        d.set_item(
            "graph_description",
            m.graph_description().unwrap_or_default(),
        )?;
        d.set_item("version", m.version().unwrap_or_default())?;
        let custom = PyDict::new(py);
        for k in m.custom_keys().map_err(errors::from_ort)? {
            if let Some(v) = m.custom(&k) {
                custom.set_item(k, v)?;
            }
        }
        d.set_item("custom_metadata_map", custom)?;
        Ok(d)
    }

    /// Runs the model on `feed` (a dict of name to array) and returns the
    /// outputs named in `output_names` (all of them for `None`), in that
    /// order, as NumPy arrays. The GIL is released while ONNX Runtime runs;
    /// the run takes a worker of the process's pool (waiting while all are
    /// busy).
    #[pyo3(signature = (output_names, feed))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        output_names: Option<Vec<String>>,
        feed: &Bound<'py, PyDict>,
    ) -> PyResult<Bound<'py, PyList>> {
        // Which outputs, by index into the model's.
        let picks: Vec<usize> = match &output_names {
            None => (0..self.outputs.len()).collect(),
            Some(names) => names
                .iter()
                .map(|n| {
                    self.outputs.iter().position(|o| &o.0 == n).ok_or_else(|| {
                        InvalidArgument::new_err(format!(
                            "Invalid output name: {n} (the model's outputs: {})",
                            self.outputs
                                .iter()
                                .map(|o| o.0.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ))
                    })
                })
                .collect::<PyResult<_>>()?,
        };
        // Inputs in the model's order, checked (names, dtype) here; rank and
        // fixed dimensions are checked by crates/ort before the run.
        let mut given: Vec<(String, arrays::Input<'py>)> = Vec::with_capacity(feed.len());
        for (k, v) in feed.iter() {
            let name: String = k
                .extract()
                .map_err(|_| InvalidArgument::new_err("input names must be strings"))?;
            let Some(spec) = self.specs.iter().find(|s| s.name == name) else {
                return Err(InvalidArgument::new_err(format!(
                    "Invalid input name: {name} (the model's inputs: {})",
                    self.specs
                        .iter()
                        .map(|s| s.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            };
            let input = arrays::input(&name, &v, spec.elem)?;
            given.push((name, input));
        }
        let mut key_shapes: Vec<&[i64]> = Vec::with_capacity(self.specs.len());
        let mut feed_values: Vec<(&str, &DynValue)> = Vec::with_capacity(self.specs.len());
        for spec in &self.specs {
            let Some((name, input)) = given.iter().find(|(n, _)| *n == spec.name) else {
                return Err(InvalidArgument::new_err(format!(
                    "Required input {:?} is missing from the feed",
                    spec.name
                )));
            };
            key_shapes.push(&input.shape);
            feed_values.push((name.as_str(), &input.value));
        }
        let key = RunKey::from_shapes(key_shapes);
        let (workers, mode) = pool::pool()?;
        let result = py.detach(|| {
            let mut checkout = workers.checkout();
            let (worker, ()) = checkout.parts();
            // Held until the run is counted: a fork waits for all of it,
            // so the child finds none of the locks below held.
            let in_ort = pool::in_onnxruntime();
            // Admitted by what the run will need; run again once, alone,
            // if it ran out of memory beside other runs and fits alone.
            let out = worker.run_retrying(&self.plans, &key, || {
                tensor_arena_ort::run_shared(&self.session, &feed_values, None)
            });
            let info = worker.last_run().cloned().unwrap_or_default();
            pool::after_run(worker, &info);
            self.record(&info);
            drop(in_ort);
            drop(checkout);
            out.map_err(|e| match e {
                tensor_arena_ort::OrtArenaError::Ort(m)
                    if info.out_of_memory() || m.contains("bad_alloc") =>
                {
                    tensor_arena_ort::OrtArenaError::OutOfMemory(m)
                }
                e => e,
            })
        });
        let mut values: Vec<Option<DynValue>> = result
            .map_err(errors::from_arena)?
            .into_iter()
            .map(|(_, v)| Some(v))
            .collect();
        drop(given);
        let list = PyList::empty(py);
        for i in picks {
            let name = &self.outputs[i].0;
            let value = values.get_mut(i).and_then(Option::take).ok_or_else(|| {
                InvalidArgument::new_err(format!("output {name:?} is named twice"))
            })?;
            list.append(arrays::output(py, name, value, mode)?)?;
        }
        Ok(list)
    }

    /// What the last run of this session did: its plan ("exact": the
    /// plan learned for its shapes; "predicted": planned from the model's
    /// other shapes; "dynamic": no plan, and `dynamic_reason`), whether it
    /// fell back from the plan, whether it taught a plan, and its memory
    /// figures. `None` before the first run.
    fn last_run<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(l) = self.last.lock().clone() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("plan", l.plan)?;
        d.set_item("dynamic_reason", l.dynamic_reason)?;
        d.set_item("fell_back", l.fell_back)?;
        d.set_item("learned", l.learned)?;
        d.set_item("key", l.key)?;
        d.set_item("allocations", l.allocs)?;
        d.set_item("planned_allocations", l.planned_allocs)?;
        d.set_item("peak_in_use", l.peak_in_use)?;
        d.set_item("high_water", l.high_water)?;
        d.set_item("reserved", l.reserved)?;
        d.set_item("released", l.released)?;
        d.set_item("commits", l.commits)?;
        d.set_item("out_of_memory", l.out_of_memory)?;
        Ok(Some(d))
    }

    /// The model's plans: plans held, hits, misses, and runs by how they
    /// were served.
    fn plan_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.plans.stats();
        let d = PyDict::new(py);
        d.set_item("plans", s.plans)?;
        d.set_item("hits", s.hits)?;
        d.set_item("misses", s.misses)?;
        d.set_item("runs", format!("{:?}", s.runs))?;
        Ok(d)
    }
}

impl Session {
    fn record(&self, info: &tensor_arena_ort::RunInfo) {
        let (plan, dynamic_reason) = match info.plan {
            Some(PlanSource::Exact) => ("exact", String::new()),
            Some(PlanSource::Predicted) => ("predicted", String::new()),
            Some(PlanSource::Dynamic(r)) => ("dynamic", reason(r)),
            // ONNX Runtime allocated elsewhere: the arena served nothing.
            None => ("not served", String::new()),
        };
        *self.last.lock() = Some(LastRun {
            plan,
            dynamic_reason,
            fell_back: info.report.deviated,
            learned: info.learned,
            key: info.key.as_slice().to_vec(),
            allocs: info.report.allocs,
            planned_allocs: info.report.planned_allocs,
            peak_in_use: info.report.peak_in_use,
            high_water: info.report.high_water,
            reserved: info.report.reserved,
            released: info.released,
            commits: info.report.commits,
            out_of_memory: info.out_of_memory(),
        });
    }
}

fn reason(r: DynamicReason) -> String {
    format!("{r:?}")
}
