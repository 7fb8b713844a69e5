//! Sessions opened by this crate (a convenience over [`Worker`] and
//! [`Plans`] for callers without an `ort` setup of their own), and running
//! any `ort` session from `&Session`.

use crate::key::RunKey;
use crate::plans::Plans;
use crate::slot::{self, Slot};
use crate::tensors::InputSpec;
use crate::worker::{Worker, WorkerOptions};
use crate::{OrtArenaError, Shrink};
use ort::value::{DynValue, ValueType};
use std::ffi::CString;
use std::sync::Arc;
use tensor_arena::memory::PagesConfig;
use tensor_arena::{ArenaConfig, RunReport, Stats};

/// Whose memory a session's CPU tensors use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// ONNX Runtime's defaults: its CPU arena and its memory pattern.
    OrtArena,
    /// ONNX Runtime with its CPU arena and memory pattern off: every tensor
    /// from the system allocator.
    OrtNoArena,
    /// ONNX Runtime's own CPU arena, one for the whole environment, shared
    /// by every session opened with it (ONNX Runtime's shared allocators:
    /// `CreateAndRegisterAllocator` and `session.use_env_allocators`).
    /// The first such session registers it on the environment; a process
    /// uses this or [`Memory::TensorArena`], not both.
    OrtSharedArena,
    /// tensor-arena: the environment's allocator (this crate's), ONNX
    /// Runtime's CPU arena and memory pattern off.
    TensorArena,
}

/// Options of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionOptions {
    /// Whose memory tensors use.
    pub memory: Memory,
    /// Threads of ONNX Runtime's intra-op pool; 0 (the default) leaves
    /// ONNX Runtime's own default (one per physical core).
    pub intra_threads: usize,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self {
            memory: Memory::TensorArena,
            intra_threads: 0,
        }
    }
}

/// Creates an `ort` session for `model` with the given memory.
///
/// # Errors
/// [`OrtArenaError::ModelNotFound`] if the file does not exist,
/// [`OrtArenaError::Model`] if ONNX Runtime refuses it, [`OrtArenaError::Ort`]
/// for other failures of ONNX Runtime.
#[cfg(feature = "load-dynamic")]
pub fn open_session(
    runtime: &crate::Runtime,
    model: impl AsRef<std::path::Path>,
    options: SessionOptions,
) -> Result<ort::session::Session, OrtArenaError> {
    let model = model.as_ref();
    if !model.is_file() {
        return Err(OrtArenaError::ModelNotFound { path: model.into() });
    }
    use crate::adopt::SessionBuilderExt;
    let mut b = ort::session::Session::builder(runtime.environment())?;
    if options.intra_threads > 0 {
        b = b.with_intra_threads(options.intra_threads)?;
    }
    b = match options.memory {
        Memory::OrtArena => b,
        Memory::OrtNoArena => b
            .with_execution_providers([ort::ep::CPU::default()
                .with_arena_allocator(false)
                .build()])?
            .with_memory_pattern(false)?,
        Memory::OrtSharedArena => {
            // Registered once (the runtime's environment is the process's
            // one); a refusal is returned and tried again next time.
            static REGISTERED: parking_lot::Mutex<bool> = parking_lot::Mutex::new(false);
            let mut registered = REGISTERED.lock();
            if !*registered {
                crate::raw::register_ort_arena(runtime.environment())
                    .map_err(OrtArenaError::Ort)?;
                *registered = true;
            }
            b.with_env_allocators()?
        }
        Memory::TensorArena => b.with_tensor_arena()?,
    };
    b.commit_from_file(model).map_err(|e| OrtArenaError::Model {
        path: model.into(),
        message: e.message().to_string(),
    })
}

/// Checks named inputs against a session's and puts them in the model's
/// order; returns them with the shape key (rank and dims of each input).
fn order_inputs<'v>(
    specs: &[InputSpec],
    inputs: &[(&str, &'v DynValue)],
) -> Result<(Vec<&'v DynValue>, RunKey), OrtArenaError> {
    for (name, _) in inputs {
        if !specs.iter().any(|s| s.name == *name) {
            return Err(OrtArenaError::UnknownInput {
                name: (*name).to_string(),
                known: specs.iter().map(|s| s.name.clone()).collect(),
            });
        }
    }
    let mut ordered = Vec::with_capacity(specs.len());
    let mut key = Vec::new();
    for spec in specs {
        let Some((_, v)) = inputs.iter().find(|(n, _)| *n == spec.name) else {
            return Err(OrtArenaError::MissingInput {
                name: spec.name.clone(),
            });
        };
        let shape: Vec<usize> = match v.dtype() {
            ValueType::Tensor { shape, .. } => shape.iter().map(|&d| d.max(0) as usize).collect(),
            _ => Vec::new(),
        };
        spec.check(&shape)?;
        key.push(shape.len());
        key.extend_from_slice(&shape);
        ordered.push(*v);
    }
    Ok((ordered, RunKey::from_raw(key)))
}

fn cstrings<'a>(names: impl Iterator<Item = &'a str>) -> Result<Vec<CString>, OrtArenaError> {
    names
        .map(|n| {
            CString::new(n).map_err(|_| OrtArenaError::Ort(format!("name {n:?} contains NUL")))
        })
        .collect()
}

/// Runs any `ort` session from `&Session`, so several threads can run one
/// session at once; inputs are checked (names, rank, fixed dimensions) first.
/// Returns the outputs by name, in the model's order.
///
/// # Errors
/// [`OrtArenaError::UnknownInput`], [`OrtArenaError::MissingInput`],
/// [`OrtArenaError::BadShape`], or [`OrtArenaError::Ort`] if the run fails.
pub fn run_shared(
    session: &ort::session::Session,
    inputs: &[(&str, &DynValue)],
    run_options: Option<&ort::session::RunOptions>,
) -> Result<Vec<(String, DynValue)>, OrtArenaError> {
    let specs = InputSpec::of(session);
    let (ordered, _) = order_inputs(&specs, inputs)?;
    let in_names = cstrings(specs.iter().map(|s| s.name.as_str()))?;
    let out: Vec<String> = session
        .outputs()
        .iter()
        .map(|o| o.name().to_string())
        .collect();
    let out_names = cstrings(out.iter().map(String::as_str))?;
    let values = crate::raw::run(session, run_options, &in_names, &ordered, &out_names)
        .map_err(OrtArenaError::Ort)?;
    Ok(out.into_iter().zip(values).collect())
}

/// How an [`ArenaSession`] manages memory.
#[derive(Clone, Debug)]
pub struct ArenaOptions {
    /// Each worker's arena (cap, growth).
    pub arena: ArenaConfig,
    /// Whether runs are planned by input shapes (default: yes).
    pub plans: bool,
    /// Plans kept, least recently used out (default 64).
    pub plan_capacity: usize,
    /// When workers give cached memory back (default [`Shrink::default`]).
    pub shrink: Shrink,
    /// Each worker's idle decay (see [`WorkerOptions::decay`]; default
    /// [`DEFAULT_DECAY`](crate::DEFAULT_DECAY)).
    pub decay: Option<std::time::Duration>,
    /// Each worker's memory layer (see [`WorkerOptions::pages`]).
    pub pages: PagesConfig,
    /// Threads of ONNX Runtime's intra-op pool; 0 (the default) leaves ONNX
    /// Runtime's own default. Used by [`ArenaSession::open`] only.
    pub intra_threads: usize,
    /// A budget every worker's arena commits under (see
    /// [`WorkerOptions::budget`]). Default `None`: the process's default
    /// budget ([`default_budget`](crate::default_budget)).
    pub budget: Option<Arc<tensor_arena::Budget>>,
    /// The model's plan store: the session's plans start from it
    /// ([`Plans::with_store`]) and [`Plans::save`] writes back to it.
    /// Default `None`: plans live as long as the session.
    pub plan_store: Option<tensor_arena::PlanStore>,
}

impl Default for ArenaOptions {
    fn default() -> Self {
        Self {
            arena: ArenaConfig::default(),
            plans: true,
            plan_capacity: 64,
            shrink: Shrink::default(),
            pages: PagesConfig::default(),
            intra_threads: 0,
            budget: None,
            decay: Some(crate::DEFAULT_DECAY),
            plan_store: None,
        }
    }
}

impl ArenaOptions {
    fn worker(&self) -> WorkerOptions {
        WorkerOptions {
            arena: self.arena,
            plans: self.plans,
            shrink: self.shrink,
            pages: self.pages,
            budget: self.budget.clone(),
            decay: self.decay,
            // A session's workers are made alone: each serves all its blocks.
            share_large_blocks: None,
        }
    }
}

struct Inner {
    session: ort::session::Session,
    specs: Vec<InputSpec>,
    input_names: Vec<CString>,
    outputs: Vec<String>,
    output_names: Vec<CString>,
    plans: Plans,
    options: ArenaOptions,
    /// The arenas of this session's workers (alive while the worker or one
    /// of its outputs is).
    slots: arc_swap::ArcSwap<Vec<std::sync::Weak<Slot>>>,
}

/// An ONNX Runtime session whose CPU tensors come from tensor-arena, with
/// its [`Plans`]: the convenience for callers without an `ort` setup of
/// their own (a server that has one uses [`Worker`] around its own
/// `session.run`). A cheap handle (`Clone`, `Send`, `Sync`); each thread
/// runs it through its own [`SessionWorker`], which owns its arena and
/// keeps the session alive.
#[derive(Clone)]
pub struct ArenaSession(Arc<Inner>);

impl std::fmt::Debug for ArenaSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArenaSession")
            .field("inputs", &self.0.specs)
            .field("outputs", &self.0.outputs)
            .field("options", &self.0.options)
            .finish_non_exhaustive()
    }
}

impl ArenaSession {
    /// Opens `model` with tensor-arena memory, on the runtime's environment.
    ///
    /// # Errors
    /// As [`open_session`], and [`OrtArenaError::Arena`] if
    /// `options.arena` is invalid.
    #[cfg(feature = "load-dynamic")]
    pub fn open(
        runtime: &crate::Runtime,
        model: impl AsRef<std::path::Path>,
        options: ArenaOptions,
    ) -> Result<Self, OrtArenaError> {
        options.arena.validate()?;
        let session = open_session(
            runtime,
            model,
            SessionOptions {
                memory: Memory::TensorArena,
                intra_threads: options.intra_threads,
            },
        )?;
        Self::from_session(session, options)
    }

    /// Wraps a session the caller built (with
    /// [`with_tensor_arena`](crate::SessionBuilderExt::with_tensor_arena),
    /// or its tensors do not come from the arena).
    ///
    /// # Errors
    /// [`OrtArenaError::Arena`] if `options.arena` is invalid;
    /// [`OrtArenaError::Ort`] if a name contains NUL.
    pub fn from_session(
        session: ort::session::Session,
        options: ArenaOptions,
    ) -> Result<Self, OrtArenaError> {
        options.arena.validate()?;
        let specs = InputSpec::of(&session);
        let input_names = cstrings(specs.iter().map(|s| s.name.as_str()))?;
        let outputs: Vec<String> = session
            .outputs()
            .iter()
            .map(|o| o.name().to_string())
            .collect();
        let output_names = cstrings(outputs.iter().map(String::as_str))?;
        Ok(Self(Arc::new(Inner {
            session,
            specs,
            input_names,
            outputs,
            output_names,
            plans: match &options.plan_store {
                Some(store) => Plans::with_store(options.plan_capacity, store.clone()),
                None => Plans::new(options.plan_capacity),
            },
            options,
            slots: arc_swap::ArcSwap::from_pointee(Vec::new()),
        })))
    }

    /// The model's inputs.
    pub fn inputs(&self) -> &[InputSpec] {
        &self.0.specs
    }

    /// The model's output names.
    pub fn outputs(&self) -> &[String] {
        &self.0.outputs
    }

    /// The `ort` session underneath.
    pub fn session(&self) -> &ort::session::Session {
        &self.0.session
    }

    /// The arenas of this session's workers still alive (a worker's arena
    /// lives while the worker or one of its outputs does), with their stats
    /// (as published after each run and each free from another thread),
    /// one per worker, and summed.
    pub fn arenas(&self) -> (Vec<Stats>, Stats) {
        let slots: Vec<Arc<Slot>> = self
            .0
            .slots
            .load()
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .collect();
        let each: Vec<Stats> = slots.iter().map(|s| s.stats()).collect();
        let mut sum = Stats::default();
        for st in &each {
            slot::add_stats(&mut sum, st);
        }
        (each, sum)
    }

    /// The plans learned so far (shared by all workers).
    pub fn plans(&self) -> &Plans {
        &self.0.plans
    }

    /// A worker with an empty arena of its own, for one thread.
    ///
    /// # Errors
    /// [`OrtArenaError::Arena`] if the arena cannot be created.
    pub fn worker(&self) -> Result<SessionWorker, OrtArenaError> {
        let worker = Worker::new(self.0.options.worker())?;
        let new = Arc::downgrade(worker.slot());
        // Copied and swapped, never locked: a fork never finds it held.
        self.0.slots.rcu(|slots| {
            let mut next: Vec<_> = slots
                .iter()
                .filter(|w| w.strong_count() > 0)
                .cloned()
                .collect();
            next.push(new.clone());
            next
        });
        Ok(SessionWorker {
            session: self.clone(),
            worker,
        })
    }
}

/// What one [`SessionWorker::run`] returned.
#[derive(Debug)]
pub struct RunOutput {
    /// Outputs by name, in the model's order. Their memory is in the
    /// worker's arena; they may outlive the run, the worker and the session,
    /// and may be dropped on any thread.
    pub outputs: Vec<(String, DynValue)>,
    /// The arena's report of the run.
    pub report: RunReport,
    /// `Alloc` calls made on this thread during the run.
    pub alloc_calls: u64,
    /// Of those, requests the worker's arena refused (over its
    /// `max_reserved` cap), served by the system allocator instead.
    pub refused_allocs: u64,
    /// The shape key of the run (rank and dimensions of each input).
    pub key: Vec<usize>,
    /// How the arena served the run, as [`RunInfo::plan`](crate::RunInfo::plan)
    /// says: its key's own plan, a plan predicted from the model's earlier
    /// shapes, dynamically (and why), or `None` if the arena did not serve
    /// it; whether a planned run kept to its plan is in `report`.
    pub plan: Option<tensor_arena::PlanSource>,
}

impl RunOutput {
    /// [`crate::hash_outputs`] of the outputs.
    ///
    /// # Errors
    /// As [`crate::hash_outputs`].
    pub fn hash(&self) -> Result<u64, OrtArenaError> {
        crate::hash_outputs(self.outputs.iter().map(|(n, v)| (n.as_str(), v)))
    }
}

/// An [`ArenaSession`] and a [`Worker`]: one thread's way to run it. Owned
/// and `Send` (it keeps the session alive): keep one per thread, or move
/// it into `spawn_blocking`.
#[derive(Debug)]
pub struct SessionWorker {
    session: ArenaSession,
    worker: Worker,
}

impl SessionWorker {
    /// Runs the model once on named inputs (checked first: names, rank,
    /// fixed dimensions), keyed by their shapes. Several threads may run
    /// one session at once (ONNX Runtime's `Run` is called from `&Session`).
    ///
    /// # Errors
    /// [`OrtArenaError::UnknownInput`], [`OrtArenaError::MissingInput`],
    /// [`OrtArenaError::BadShape`] (nothing is run), or
    /// [`OrtArenaError::Ort`] if ONNX Runtime fails, or
    /// [`OrtArenaError::OutOfMemory`] if it failed because neither the
    /// arena nor the system allocator could serve a tensor (the worker
    /// stays usable). An arena over its cap alone does not fail the run:
    /// see [`RunOutput::refused_allocs`].
    pub fn run(&mut self, inputs: &[(&str, &DynValue)]) -> Result<RunOutput, OrtArenaError> {
        self.run_with_options(inputs, None)
    }

    /// [`SessionWorker::run`] with `ort` run options.
    ///
    /// # Errors
    /// As [`SessionWorker::run`].
    pub fn run_with_options(
        &mut self,
        inputs: &[(&str, &DynValue)],
        run_options: Option<&ort::session::RunOptions>,
    ) -> Result<RunOutput, OrtArenaError> {
        let s = &*self.session.0;
        let (ordered, key) = order_inputs(&s.specs, inputs)?;
        let result = self.worker.run(&s.plans, &key, || {
            crate::raw::run(
                &s.session,
                run_options,
                &s.input_names,
                &ordered,
                &s.output_names,
            )
        });
        let info = self.worker.last_run().cloned().unwrap_or_default();
        let values = result.map_err(|message| {
            // Refused on this thread, or on one of ONNX Runtime's pool
            // threads (its message then names the exception).
            if info.failed_allocs > 0 || message.contains("bad_alloc") {
                OrtArenaError::OutOfMemory(message)
            } else {
                OrtArenaError::Ort(message)
            }
        })?;
        Ok(RunOutput {
            outputs: s.outputs.iter().cloned().zip(values).collect(),
            report: info.report,
            alloc_calls: info.alloc_calls,
            refused_allocs: info.refused_allocs,
            key: info.key.as_slice().to_vec(),
            plan: info.plan,
        })
    }

    /// Gives back, before a run on `inputs`, what the worker holds beyond
    /// what that run's own plan and the shrink policy will hold
    /// ([`Worker::prepare`]; [`SessionWorker::run`] does it as the run
    /// starts); returns the bytes released.
    ///
    /// # Errors
    /// As [`SessionWorker::run`] for inputs that do not fit the model
    /// (nothing is given back).
    pub fn prepare(&mut self, inputs: &[(&str, &DynValue)]) -> Result<usize, OrtArenaError> {
        let s = &*self.session.0;
        let (_, key) = order_inputs(&s.specs, inputs)?;
        Ok(self.worker.prepare(&s.plans, &key))
    }

    /// Gives cached memory back down to what the recent runs need (see
    /// [`Worker::shrink`]); returns the bytes released.
    pub fn shrink(&mut self) -> usize {
        self.worker.shrink(false)
    }

    /// This worker's arena stats.
    pub fn stats(&self) -> Stats {
        self.worker.stats()
    }

    /// Runs made.
    pub fn runs(&self) -> u64 {
        self.worker.runs()
    }

    /// The worker underneath (to run other models on the same arena).
    pub fn worker_mut(&mut self) -> &mut Worker {
        &mut self.worker
    }

    /// The session.
    pub fn session(&self) -> &ArenaSession {
        &self.session
    }
}
