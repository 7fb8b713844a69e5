//! The crate's one error type.

use std::fmt;
use std::path::PathBuf;

/// What went wrong; every fallible call of the crate returns it.
#[derive(Debug)]
#[non_exhaustive]
pub enum OrtArenaError {
    /// The ONNX Runtime library file does not exist.
    LibraryNotFound {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// The library exists but could not be used: not a shared library, no
    /// `OrtGetApiBase`, or a version older than 1.31.
    Library {
        /// The file.
        path: PathBuf,
        /// What the loader said.
        message: String,
    },
    /// No library path was given and `ORT_DYLIB_PATH` is not set.
    LibraryPathUnset,
    /// ONNX Runtime was already loaded in this process from another file
    /// (a process loads it once).
    AlreadyLoaded {
        /// The file loaded first.
        loaded: PathBuf,
        /// The file asked for now.
        requested: PathBuf,
    },
    /// The model file does not exist.
    ModelNotFound {
        /// The path given.
        path: PathBuf,
    },
    /// ONNX Runtime refused the model (corrupt or unsupported file).
    Model {
        /// The model file.
        path: PathBuf,
        /// ONNX Runtime's message.
        message: String,
    },
    /// An input name the model does not have.
    UnknownInput {
        /// The name given.
        name: String,
        /// The model's inputs.
        known: Vec<String>,
    },
    /// A model input was given no value.
    MissingInput {
        /// The input's name.
        name: String,
    },
    /// An input value whose rank or fixed dimensions do not match the model.
    BadShape {
        /// The input's name.
        name: String,
        /// The model's dimensions (-1 where free).
        expected: Vec<i64>,
        /// The dimensions given.
        got: Vec<usize>,
    },
    /// An input whose element type the crate does not fill (only tensors of
    /// f32, f64, i64, i32, u8, i8, bool are generated).
    UnsupportedInput {
        /// The input's name.
        name: String,
        /// Its type as ONNX Runtime describes it.
        dtype: String,
    },
    /// Values asked for an input that it cannot hold, or that are no range
    /// ([`crate::make_input_in`]).
    BadValues {
        /// The input's name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// An output whose element type [`crate::hash_outputs`] does not hash
    /// (only tensors of f32, f64, i64, i32, u8, i8, bool).
    UnsupportedOutput {
        /// The output's name.
        name: String,
        /// Its type as ONNX Runtime describes it.
        dtype: String,
    },
    /// An error from ONNX Runtime while creating a session or running.
    Ort(String),
    /// A run failed because memory ran out: neither the worker's arena nor
    /// the system allocator could serve a tensor, so ONNX Runtime was
    /// refused it (`std::bad_alloc`) and stopped the run. The worker and
    /// the session stay usable; a smaller run can succeed.
    OutOfMemory(String),
    /// The arena refused a configuration or a reservation.
    Arena(tensor_arena::ArenaError),
    /// The device arena (ONNX Runtime's CUDA memory, `tensor_arena_cuda`)
    /// refused: a bad device, a run already open, no CUDA driver (feature
    /// `cuda`).
    #[cfg(feature = "cuda")]
    Device(tensor_arena_cuda::CudaError),
    /// A run's tensors were not served by the worker's arena: the closure
    /// started ONNX Runtime's `run_async` (its tensors are allocated on
    /// ONNX Runtime's own threads, out of the worker's reach), or it made
    /// no allocation on the worker's thread while the system allocator
    /// served tensor-sized blocks ([`crate::RunInfo::check`]).
    NotServed(String),
    /// A [`crate::WorkerPool`] could not do what was asked: a pool of no
    /// workers, a run's thread that could not be started, or a run that
    /// panicked (its message).
    Pool(String),
    /// The process's default memory limit could not be read or set: a
    /// `TENSOR_ARENA_MEMORY_LIMIT` that is no size, or a limit set after
    /// the first worker was made ([`crate::set_default_memory_limit`]).
    MemoryLimit(String),
}

impl fmt::Display for OrtArenaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::LibraryNotFound { path } => write!(
                f,
                "ONNX Runtime library not found at {} (set ORT_DYLIB_PATH, or run tools/fetch-ort-assets.sh)",
                path.display()
            ),
            Self::Library { path, message } => write!(
                f,
                "cannot use ONNX Runtime library {}: {message}",
                path.display()
            ),
            Self::LibraryPathUnset => f.write_str(
                "no ONNX Runtime library given and ORT_DYLIB_PATH is not set (run tools/fetch-ort-assets.sh)",
            ),
            Self::AlreadyLoaded { loaded, requested } => write!(
                f,
                "ONNX Runtime is already loaded from {}; cannot load {} in the same process",
                loaded.display(),
                requested.display()
            ),
            Self::ModelNotFound { path } => write!(f, "model file not found: {}", path.display()),
            Self::Model { path, message } => {
                write!(f, "cannot load model {}: {message}", path.display())
            }
            Self::UnknownInput { name, known } => write!(
                f,
                "the model has no input named {name:?} (its inputs: {})",
                known.join(", ")
            ),
            Self::MissingInput { name } => write!(f, "no value given for model input {name:?}"),
            Self::BadShape {
                name,
                expected,
                got,
            } => write!(
                f,
                "input {name:?} has shape {got:?} but the model expects rank {} with dims {expected:?} (-1 = any)",
                expected.len()
            ),
            Self::UnsupportedInput { name, dtype } => write!(
                f,
                "input {name:?} is {dtype}: only tensors of f32, f64, i64, i32, u8, i8 and bool can be generated"
            ),
            Self::BadValues { name, message } => write!(f, "values for input {name:?}: {message}"),
            Self::UnsupportedOutput { name, dtype } => write!(
                f,
                "output {name:?} is {dtype}: only tensors of f32, f64, i64, i32, u8, i8 and bool can be hashed"
            ),
            Self::Ort(message) => write!(f, "ONNX Runtime: {message}"),
            Self::OutOfMemory(message) => write!(f, "out of memory: {message}"),
            Self::Arena(e) => write!(f, "arena: {e}"),
            #[cfg(feature = "cuda")]
            Self::Device(e) => write!(f, "device arena: {e}"),
            Self::NotServed(why) => write!(f, "run not served by the worker's arena: {why}"),
            Self::Pool(why) => write!(f, "worker pool: {why}"),
            Self::MemoryLimit(why) => write!(f, "default memory limit: {why}"),
        }
    }
}

impl std::error::Error for OrtArenaError {}

impl From<tensor_arena::ArenaError> for OrtArenaError {
    fn from(e: tensor_arena::ArenaError) -> Self {
        Self::Arena(e)
    }
}

impl<R> From<ort::Error<R>> for OrtArenaError {
    fn from(e: ort::Error<R>) -> Self {
        Self::Ort(e.message().to_string())
    }
}
