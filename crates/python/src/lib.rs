//! `tensor_arena._native`: the Rust side of the `tensor-arena` Python
//! distribution (PyO3, stable ABI). The Python package
//! (`python/tensor_arena`) is the public face; this module gives it
//!
//! - `load`: ONNX Runtime's shared library (the one the user's
//!   `onnxruntime` wheel ships), loaded once per process through
//!   `tensor_arena_ort::Runtime`, with tensor-arena registered as its CPU
//!   allocator;
//! - [`session::Session`]: one model, run from any number of Python threads
//!   with the GIL released, each run on a worker checked out of the
//!   process's bounded pool ([`pool`]);
//! - the pool's settings, its stats under crates/cuda's names, shrink and a
//!   process budget;
//! - the process's default memory limit ([`limit`]);
//! - glibc's heap settings, when the program asks ([`heaps`]).
//!
//! Every error is a Python exception of this module ([`errors`]); no panic
//! crosses into Python (PyO3 turns one into `PanicException`, and inputs are
//! checked before they reach ONNX Runtime).
#![deny(missing_docs)]

pub mod arrays;
pub mod errors;
pub mod heaps;
pub mod limit;
pub mod plans;
pub mod pool;
pub mod session;

use pyo3::prelude::*;

/// Loads ONNX Runtime's shared library from `path` (once per process) and
/// registers tensor-arena as its CPU allocator; returns the library's
/// version. Loading the same file again returns at once.
///
/// # Errors
/// `LibraryError` when the file is missing, is not a usable ONNX Runtime
/// (not a shared library, no C API, older than crates/ort accepts), or
/// another file was loaded before in this process.
#[pyfunction]
fn load(py: Python<'_>, path: std::path::PathBuf) -> PyResult<String> {
    let rt = py
        .detach(|| tensor_arena_ort::Runtime::load(&path))
        .map_err(errors::library)?;
    let _ = session::LOADED.set(rt);
    Ok(rt.version().to_string())
}

/// The library loaded by [`load`] (its path and version), or `None`.
#[pyfunction]
fn loaded() -> Option<(String, String)> {
    session::runtime().map(|rt| (rt.path().display().to_string(), rt.version().to_string()))
}

/// The execution providers the loaded library was built with (ONNX
/// Runtime's `GetAvailableProviders`), for the Python side to do what
/// onnxruntime would with a session asking for one the library lacks.
///
/// # Errors
/// `LibraryError` before [`load`]; `Fail` if ONNX Runtime cannot list them.
#[pyfunction]
fn library_providers() -> PyResult<Vec<String>> {
    let rt = session::runtime()
        .ok_or_else(|| errors::LibraryError::new_err("ONNX Runtime is not loaded yet"))?;
    rt.available_providers()
        .map_err(|e| errors::Fail::new_err(e.to_string()))
}

/// The module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_function(wrap_pyfunction!(loaded, m)?)?;
    m.add_function(wrap_pyfunction!(library_providers, m)?)?;
    errors::add(m)?;
    pool::add(m)?;
    limit::add(m)?;
    heaps::add(m)?;
    plans::add(m)?;
    m.add_class::<session::Session>()?;
    // The session configuration entries passed on (the Python side reads
    // them by name off onnxruntime's options).
    m.add("CONFIG_ENTRIES", session::CONFIG_ENTRIES.to_vec())?;
    Ok(())
}
