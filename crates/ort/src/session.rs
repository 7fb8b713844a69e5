//! Sessions whose CPU memory comes from tensor-arena, and the per-thread
//! workers that run them.

use crate::slot::{self, Slot};
use crate::tensors::InputSpec;
use crate::{OrtArenaError, Runtime};
use ort::value::{DynValue, ValueType};
use std::ffi::CString;
use std::path::Path;
use std::sync::Arc;
use tensor_arena::{ArenaConfig, Plan, PlanCache, Recording, RunReport, Stats};

/// Whose memory a session's CPU tensors use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// ONNX Runtime's defaults: its CPU arena and its memory pattern.
    OrtArena,
    /// ONNX Runtime with its CPU arena and memory pattern off: every tensor
    /// from the system allocator.
    OrtNoArena,
    /// tensor-arena: the environment's allocator (this crate's), ONNX
    /// Runtime's CPU arena and memory pattern off.
    TensorArena,
}

/// Options of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionOptions {
    /// Whose memory tensors use.
    pub memory: Memory,
    /// Threads of ONNX Runtime's intra-op pool (1: kernels run on the
    /// calling thread, so every allocation of a run comes from it).
    pub intra_threads: usize,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self {
            memory: Memory::TensorArena,
            intra_threads: 1,
        }
    }
}

/// Creates an `ort` session for `model` with the given memory.
///
/// # Errors
/// [`OrtArenaError::ModelNotFound`] if the file does not exist,
/// [`OrtArenaError::Model`] if ONNX Runtime refuses it, [`OrtArenaError::Ort`]
/// for other failures of ONNX Runtime.
pub fn open_session(
    runtime: &Runtime,
    model: impl AsRef<Path>,
    options: SessionOptions,
) -> Result<ort::session::Session, OrtArenaError> {
    let model = model.as_ref();
    if !model.is_file() {
        return Err(OrtArenaError::ModelNotFound { path: model.into() });
    }
    let arena = options.memory == Memory::OrtArena;
    let mut b = ort::session::Session::builder(runtime.environment())?
        .with_execution_providers([ort::ep::CPU::default().with_arena_allocator(arena).build()])?
        .with_memory_pattern(arena)?
        .with_intra_threads(options.intra_threads.max(1))?;
    if options.memory == Memory::TensorArena {
        b = b.with_env_allocators()?;
    }
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
) -> Result<(Vec<&'v DynValue>, Vec<usize>), OrtArenaError> {
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
    Ok((ordered, key))
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArenaOptions {
    /// Each worker's arena (shrink policy, cap, growth).
    pub arena: ArenaConfig,
    /// Whether runs are planned by input shapes (default: yes).
    pub plans: bool,
    /// Plans kept, least recently used out (default 64).
    pub plan_capacity: usize,
    /// After learning a plan, shrink the worker's arena to the largest plan
    /// it has used (default: yes), as `tensor-session` does.
    pub shrink_to_plans: bool,
    /// Threads of ONNX Runtime's intra-op pool (default 1).
    pub intra_threads: usize,
}

impl Default for ArenaOptions {
    fn default() -> Self {
        Self {
            arena: ArenaConfig::default(),
            plans: true,
            plan_capacity: 64,
            shrink_to_plans: true,
            intra_threads: 1,
        }
    }
}

/// The one place a recording becomes a plan. The arena's own recordings
/// always validate; were one not to, the key simply stays unplanned.
fn plan_from(recording: &Recording) -> Option<Plan> {
    Plan::from_recording(recording).ok()
}

/// An ONNX Runtime session whose CPU tensors (intermediates and outputs)
/// come from tensor-arena. Share it between threads (`&ArenaSession` is
/// `Sync`); each thread runs it through its own [`Worker`].
pub struct ArenaSession {
    session: ort::session::Session,
    specs: Vec<InputSpec>,
    input_names: Vec<CString>,
    outputs: Vec<String>,
    output_names: Vec<CString>,
    plans: PlanCache<Box<[usize]>>,
    options: ArenaOptions,
    /// The arenas of this session's workers (alive while the worker or one
    /// of its outputs is).
    slots: parking_lot::Mutex<Vec<std::sync::Weak<Slot>>>,
}

impl std::fmt::Debug for ArenaSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArenaSession")
            .field("inputs", &self.specs)
            .field("outputs", &self.outputs)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl ArenaSession {
    /// Opens `model` with tensor-arena memory.
    ///
    /// # Errors
    /// As [`open_session`], and [`OrtArenaError::Arena`] if
    /// `options.arena` is invalid.
    pub fn open(
        runtime: &Runtime,
        model: impl AsRef<Path>,
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
        let specs = InputSpec::of(&session);
        let input_names = cstrings(specs.iter().map(|s| s.name.as_str()))?;
        let outputs: Vec<String> = session
            .outputs()
            .iter()
            .map(|o| o.name().to_string())
            .collect();
        let output_names = cstrings(outputs.iter().map(String::as_str))?;
        Ok(Self {
            session,
            specs,
            input_names,
            outputs,
            output_names,
            plans: PlanCache::new(options.plan_capacity.max(1)),
            options,
            slots: parking_lot::Mutex::new(Vec::new()),
        })
    }

    /// The model's inputs.
    pub fn inputs(&self) -> &[InputSpec] {
        &self.specs
    }

    /// The model's output names.
    pub fn outputs(&self) -> &[String] {
        &self.outputs
    }

    /// The `ort` session underneath.
    pub fn session(&self) -> &ort::session::Session {
        &self.session
    }

    /// The arenas of this session's workers still alive (a worker's arena
    /// lives while the worker or one of its outputs does), with their stats
    /// (as published after each run and each free from another thread),
    /// one per worker, and summed.
    pub fn arenas(&self) -> (Vec<Stats>, Stats) {
        let slots: Vec<Arc<Slot>> = self
            .slots
            .lock()
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
    pub fn plans(&self) -> &PlanCache<Box<[usize]>> {
        &self.plans
    }

    /// A worker with an empty arena of its own, for one thread.
    ///
    /// # Errors
    /// [`OrtArenaError::Arena`] if the arena cannot be created.
    pub fn worker(&self) -> Result<Worker<'_>, OrtArenaError> {
        let slot = Slot::new(self.options.arena)?;
        let mut slots = self.slots.lock();
        slots.retain(|w| w.strong_count() > 0);
        slots.push(Arc::downgrade(&slot));
        drop(slots);
        Ok(Worker {
            session: self,
            slot,
            largest_plan: 0,
            runs: 0,
        })
    }
}

/// What one [`Worker::run`] returned.
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
    /// `max_reserved` cap), served by the system allocator instead: a cap
    /// cannot fail a run inside ONNX Runtime, which does not expect a null
    /// from `Alloc` everywhere.
    pub refused_allocs: u64,
    /// The shape key of the run (rank and dimensions of each input).
    pub key: Vec<usize>,
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

/// Runs an [`ArenaSession`] on one thread with an arena of its own: the
/// runtime's `Alloc`/`Free` calls made on the worker's thread during
/// [`Worker::run`] go to it with no lock. It is `Send` (move it to the thread
/// that uses it). Dropping it gives back its cached memory; outputs still
/// alive keep their blocks until dropped.
pub struct Worker<'s> {
    session: &'s ArenaSession,
    slot: Arc<Slot>,
    largest_plan: usize,
    runs: u64,
}

impl std::fmt::Debug for Worker<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("id", &self.slot.id)
            .field("runs", &self.runs)
            .finish_non_exhaustive()
    }
}

impl Worker<'_> {
    /// Runs the model once on named inputs. The run is an arena run keyed by
    /// the input shapes: its first time is recorded and planned; later runs
    /// of the same shapes get every tensor at its planned offset in one
    /// block. The arena's shrink policy applies at the end of the run.
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

    /// [`Worker::run`] with `ort` run options.
    ///
    /// # Errors
    /// As [`Worker::run`].
    pub fn run_with_options(
        &mut self,
        inputs: &[(&str, &DynValue)],
        run_options: Option<&ort::session::RunOptions>,
    ) -> Result<RunOutput, OrtArenaError> {
        let s = self.session;
        let (ordered, key) = order_inputs(&s.specs, inputs)?;
        let opts = s.options;
        let (plan, own) = if opts.plans {
            match s.plans.get(key.as_slice()) {
                Some(p) => (Some(p), true),
                None => (None, false),
            }
        } else {
            (None, false)
        };
        let planned_size = plan.as_ref().map(|p| p.size());
        let slot = Arc::clone(&self.slot);
        let mut core = slot.lock();
        let need = plan
            .as_ref()
            .map_or(0, |p| p.size())
            .max(if opts.shrink_to_plans {
                self.largest_plan
            } else {
                0
            });
        let st = core.arena_stats();
        if need > 0 && st.in_use == 0 && st.largest_free_block < need {
            // Lay the arena out again as one block that fits every plan this
            // worker has used, while no block is live (outputs of earlier
            // runs keep theirs): later runs of any of those shapes then make
            // no backing call.
            core.shrink_to(0);
            let _ = core.reserve(need);
        }
        core.begin_run(plan);
        let thread_calls_before = thread_alloc_calls();
        let failed_before = crate::raw::thread_failed_allocs();
        let result = {
            let _entered = slot::enter(&slot, &mut core);
            crate::raw::run(
                &s.session,
                run_options,
                &s.input_names,
                &ordered,
                &s.output_names,
            )
        };
        let calls = thread_alloc_calls();
        let alloc_calls = calls.0 - thread_calls_before.0;
        let refused_allocs = calls.1 - thread_calls_before.1;
        let (report, recording) = core.finish_run().unwrap_or_default();
        if opts.plans && result.is_ok() {
            if (!own || report.deviated) && !recording.is_empty() {
                if let Some(plan) = plan_from(&recording) {
                    self.largest_plan = self.largest_plan.max(plan.size());
                    s.plans.insert(key.clone().into(), Arc::new(plan));
                    if opts.shrink_to_plans {
                        core.shrink_to(self.largest_plan);
                    }
                }
            } else if let Some(size) = planned_size {
                self.largest_plan = self.largest_plan.max(size);
            }
        }
        let out_of_memory = crate::raw::thread_failed_allocs() > failed_before;
        if result.is_err() && (out_of_memory || refused_allocs > 0) {
            // Memory ran short: give back what the failed run left cached,
            // down to what the plans in use need, for the rest of the
            // process.
            core.shrink_to(self.largest_plan);
        }
        self.runs += 1;
        slot.publish(&core);
        drop(core);
        let values = result.map_err(|message| {
            // Refused on this thread, or on one of ONNX Runtime's pool
            // threads (its message then names the exception).
            if out_of_memory || message.contains("bad_alloc") {
                OrtArenaError::OutOfMemory(message)
            } else {
                OrtArenaError::Ort(message)
            }
        })?;
        Ok(RunOutput {
            outputs: s.outputs.iter().cloned().zip(values).collect(),
            report,
            alloc_calls,
            refused_allocs,
            key,
        })
    }

    /// Gives cached memory back down to the recent runs' watermark; returns
    /// the bytes released.
    pub fn shrink(&mut self) -> usize {
        let mut core = self.slot.lock();
        let watermark = core.arena_stats().watermark;
        let released = core.shrink_to(watermark);
        self.slot.publish(&core);
        released
    }

    /// This worker's arena stats (also counting blocks freed from other
    /// threads so far).
    pub fn stats(&self) -> Stats {
        let core = self.slot.lock();
        self.slot.publish(&core);
        core.arena_stats()
    }

    /// Runs made.
    pub fn runs(&self) -> u64 {
        self.runs
    }
}

impl Drop for Worker<'_> {
    fn drop(&mut self) {
        self.slot.retire();
    }
}

/// `Alloc` calls served on this thread, and those the arena refused.
fn thread_alloc_calls() -> (u64, u64) {
    crate::raw::thread_alloc_calls()
}
