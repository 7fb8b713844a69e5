//! The module's exceptions, named as ONNX Runtime's Python module names its
//! own (`InvalidArgument`, `NoSuchFile`, `InvalidProtobuf`, `Fail`), all
//! under one base, [`Error`] (a `RuntimeError`), plus [`OutOfMemory`] (a
//! run refused memory: that run fails, the session goes on) and
//! [`LibraryError`] (an `ImportError`: no usable ONNX Runtime library).

use pyo3::create_exception;
use pyo3::exceptions::{PyImportError, PyRuntimeError};
use pyo3::prelude::*;
use tensor_arena_ort::OrtArenaError;

create_exception!(
    tensor_arena.onnxruntime,
    Error,
    PyRuntimeError,
    "Base of tensor_arena.onnxruntime's errors."
);
create_exception!(
    tensor_arena.onnxruntime,
    InvalidArgument,
    Error,
    "An input or output the model does not have, a missing input, a wrong dtype or shape, a bad option."
);
create_exception!(
    tensor_arena.onnxruntime,
    NoSuchFile,
    Error,
    "The model file does not exist."
);
create_exception!(
    tensor_arena.onnxruntime,
    InvalidProtobuf,
    Error,
    "ONNX Runtime could not load the model: corrupt, truncated or not an ONNX model."
);
create_exception!(
    tensor_arena.onnxruntime,
    Fail,
    Error,
    "ONNX Runtime failed (session creation or a run), for another reason."
);
create_exception!(
    tensor_arena.onnxruntime,
    OutOfMemory,
    Error,
    "A run was refused memory (a process Budget, or the system): the run failed, the session goes on."
);
create_exception!(
    tensor_arena.onnxruntime,
    LibraryError,
    PyImportError,
    "No usable ONNX Runtime library: missing, not ONNX Runtime, or too old."
);

/// Adds the exceptions to the module.
pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("InvalidArgument", py.get_type::<InvalidArgument>())?;
    m.add("NoSuchFile", py.get_type::<NoSuchFile>())?;
    m.add("InvalidProtobuf", py.get_type::<InvalidProtobuf>())?;
    m.add("Fail", py.get_type::<Fail>())?;
    m.add("OutOfMemory", py.get_type::<OutOfMemory>())?;
    m.add("LibraryError", py.get_type::<LibraryError>())?;
    Ok(())
}

/// A failure to load the library.
pub(crate) fn library(e: OrtArenaError) -> PyErr {
    LibraryError::new_err(e.to_string())
}

/// A crates/ort error as the exception a Python caller acts on.
pub(crate) fn from_arena(e: OrtArenaError) -> PyErr {
    let message = e.to_string();
    match e {
        OrtArenaError::UnknownInput { .. }
        | OrtArenaError::MissingInput { .. }
        | OrtArenaError::BadShape { .. }
        | OrtArenaError::UnsupportedInput { .. }
        | OrtArenaError::UnsupportedOutput { .. }
        | OrtArenaError::BadValues { .. } => InvalidArgument::new_err(message),
        OrtArenaError::ModelNotFound { .. } => NoSuchFile::new_err(message),
        OrtArenaError::Model { .. } => InvalidProtobuf::new_err(message),
        OrtArenaError::OutOfMemory(_) => OutOfMemory::new_err(message),
        OrtArenaError::LibraryNotFound { .. }
        | OrtArenaError::Library { .. }
        | OrtArenaError::LibraryPathUnset
        | OrtArenaError::AlreadyLoaded { .. } => LibraryError::new_err(message),
        _ => Fail::new_err(message),
    }
}

/// An `ort` error by its ONNX Runtime status code.
pub(crate) fn from_ort<R>(e: ort::Error<R>) -> PyErr {
    use ort::error::ErrorCode as C;
    let message = e.message().to_string();
    match e.code() {
        C::InvalidArgument => InvalidArgument::new_err(message),
        C::NoSuchFile => NoSuchFile::new_err(message),
        C::InvalidProtobuf | C::InvalidGraph | C::NoModel => InvalidProtobuf::new_err(message),
        _ => Fail::new_err(message),
    }
}

use tensor_arena_ort::ort;
