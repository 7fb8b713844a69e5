//! Loading ONNX Runtime and registering the arena allocator on its
//! environment, once per process.

use crate::OrtArenaError;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// ONNX Runtime, loaded from a shared library, with an environment whose
/// CPU allocator is tensor-arena.
///
/// A process loads ONNX Runtime once and has one environment, so this is a
/// process-wide handle: [`Runtime::load`] loads and registers on the first
/// call and returns the same runtime afterwards.
#[derive(Clone, Debug)]
pub struct Runtime {
    env: ort::environment::Environment,
    path: PathBuf,
    version: String,
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();
static LOADING: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

impl Runtime {
    /// Loads the library at `path` (a `libonnxruntime.so` of version 1.31
    /// or later), creates the environment and registers the arena allocator
    /// on it.
    ///
    /// # Errors
    /// [`OrtArenaError::LibraryNotFound`] if there is no such file;
    /// [`OrtArenaError::Library`] if it is not a usable ONNX Runtime (not a
    /// shared library, no C API, older than 1.31);
    /// [`OrtArenaError::AlreadyLoaded`] if another file was loaded before in
    /// this process; [`OrtArenaError::Ort`] if the environment or the
    /// registration fails.
    pub fn load(path: impl AsRef<Path>) -> Result<&'static Runtime, OrtArenaError> {
        let path = path.as_ref();
        if !path.is_file() {
            return Err(OrtArenaError::LibraryNotFound { path: path.into() });
        }
        let path = path.canonicalize().map_err(|e| OrtArenaError::Library {
            path: path.into(),
            message: e.to_string(),
        })?;
        let _loading = LOADING.lock();
        if let Some(rt) = RUNTIME.get() {
            return if rt.path == path {
                Ok(rt)
            } else {
                Err(OrtArenaError::AlreadyLoaded {
                    loaded: rt.path.clone(),
                    requested: path,
                })
            };
        }
        let builder = ort::init_from(&path).map_err(|e| OrtArenaError::Library {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let env = builder
            .with_name("tensor-arena")
            .build()
            .map_err(OrtArenaError::from)?;
        crate::register(&env)?;
        let version = version_of(ort::info(), &path);
        Ok(RUNTIME.get_or_init(|| Runtime { env, path, version }))
    }

    /// [`Runtime::load`] from the path in `ORT_DYLIB_PATH`.
    ///
    /// # Errors
    /// [`OrtArenaError::LibraryPathUnset`] when the variable is unset or
    /// empty; otherwise as [`Runtime::load`].
    pub fn from_env() -> Result<&'static Runtime, OrtArenaError> {
        match std::env::var_os("ORT_DYLIB_PATH") {
            Some(p) if !p.is_empty() => Self::load(PathBuf::from(p)),
            _ => Err(OrtArenaError::LibraryPathUnset),
        }
    }

    /// The environment, for building sessions.
    pub fn environment(&self) -> &ort::environment::Environment {
        &self.env
    }

    /// The library file loaded.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// ONNX Runtime's version (e.g. `1.31.1`): from its build info, else
    /// (PyPI's builds say no version there) from the library's file name
    /// (`libonnxruntime.so.1.31.1`), else `unknown`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The execution providers this library was built with, as ONNX
    /// Runtime names them (`GetAvailableProviders`: the PyPI `onnxruntime`
    /// wheel's library lists the CPU's, and Azure's; a CUDA build lists
    /// `CUDAExecutionProvider` too, whether or not a GPU is present).
    /// Sessions of this crate run on the CPU whatever the list says; the
    /// Python module reads it to do what onnxruntime would with a session
    /// asking for a provider this library lacks.
    ///
    /// # Errors
    /// [`OrtArenaError::Ort`] if ONNX Runtime fails to list them.
    pub fn available_providers(&self) -> Result<Vec<String>, OrtArenaError> {
        let api = ort::api();
        let mut names: *mut *mut std::ffi::c_char = std::ptr::null_mut();
        let mut count: std::ffi::c_int = 0;
        // SAFETY: two places for the results, written by ONNX Runtime.
        let status = unsafe { (api.GetAvailableProviders)(&mut names, &mut count) };
        // SAFETY: a status ONNX Runtime just returned, used once.
        unsafe { crate::raw::status_result(status) }.map_err(OrtArenaError::Ort)?;
        if names.is_null() {
            return Ok(Vec::new());
        }
        let len = usize::try_from(count).unwrap_or(0);
        let mut out = Vec::with_capacity(len);
        for i in 0..len {
            // SAFETY: ONNX Runtime returned `count` pointers at `names`, each
            // a NUL-terminated string, alive until they are released below.
            let name = unsafe { std::ffi::CStr::from_ptr(*names.add(i)) };
            out.push(name.to_string_lossy().into_owned());
        }
        // SAFETY: the array and count ONNX Runtime returned, released once.
        let status = unsafe { (api.ReleaseAvailableProviders)(names, count) };
        // SAFETY: a status ONNX Runtime just returned, used once.
        unsafe { crate::raw::status_result(status) }.map_err(OrtArenaError::Ort)?;
        Ok(out)
    }
}

/// The version in ONNX Runtime's build info (`git-branch=rel-1.22.0,`),
/// else in the library's file name (`libonnxruntime.so.1.31.1`,
/// `libonnxruntime.1.31.1.dylib`), else `unknown`.
fn version_of(info: &str, library: &Path) -> String {
    let from_info = info
        .split("git-branch=rel-")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .filter(|v| is_version(v));
    let name = library
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let from_name = name
        .strip_prefix("libonnxruntime.so.")
        .or_else(|| {
            name.strip_prefix("libonnxruntime.")
                .and_then(|r| r.strip_suffix(".dylib"))
        })
        .filter(|v| is_version(v));
    from_info.or(from_name).unwrap_or("unknown").to_string()
}

/// Whether `v` reads as a version: dot-separated numbers, the first two
/// at least.
fn is_version(v: &str) -> bool {
    let parts: Vec<&str> = v.split('.').collect();
    parts.len() >= 2
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod version_tests {
    use super::version_of;
    use std::path::Path;

    #[test]
    fn a_pypi_build_without_a_branch_takes_the_file_names_version() {
        // PyPI's build info names no release branch.
        let info = "ORT Build Info: git-branch=HEAD, git-commit-id=abc, build type=Release";
        let lib = Path::new("/site-packages/onnxruntime/capi/libonnxruntime.so.1.31.1");
        assert_eq!(version_of(info, lib), "1.31.1");
        let mac = Path::new("/x/libonnxruntime.1.32.0.dylib");
        assert_eq!(version_of(info, mac), "1.32.0");
        let bare = Path::new("/x/libonnxruntime.so");
        assert_eq!(version_of(info, bare), "unknown");
        let built = "ORT Build Info: git-branch=rel-1.22.0, git-commit-id=abc";
        assert_eq!(version_of(built, lib), "1.22.0");
    }
}
