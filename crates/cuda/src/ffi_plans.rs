//! The C ABI of the plan store ([`crate::plan_store`]): a device's arena
//! loads a model's plans saved by an earlier process, and saves its own.
//!
//! Trampolines as in `ffi`: every pointer and length is checked at the
//! edge, a panic is caught, and an error is -1 with its message in
//! `tensor_arena_cuda_last_error`.

use crate::ffi::{code, set_error, trampoline, with_arena};
use crate::CudaError;
use core::ffi::c_int;
use std::path::PathBuf;

/// Longest directory accepted, in bytes.
const MAX_DIR: usize = 4096;
/// Longest model name accepted, in bytes.
const MAX_MODEL: usize = 1024;
/// Longest options text accepted, in bytes.
const MAX_OPTIONS: usize = 4096;

/// One text argument: `len` bytes at `ptr`, UTF-8, at most `max` bytes,
/// no NUL; `what` names it in the error.
///
/// # Safety
/// `ptr` is valid for reads of `len` bytes, or null with `len` 0.
unsafe fn text_arg<'a>(
    ptr: *const u8,
    len: usize,
    max: usize,
    what: &str,
) -> Result<&'a str, CudaError> {
    let bad = |why: String| CudaError::PlanStore(format!("plan store: {what} {why}"));
    if len > max {
        return Err(bad(format!(
            "is {len} bytes long; at most {max} are accepted"
        )));
    }
    let bytes: &[u8] = if len == 0 {
        &[]
    } else if ptr.is_null() {
        return Err(bad("is a null pointer with a non-zero length".into()));
    } else {
        // SAFETY: `len` readable bytes at `ptr` (caller), checked non-null.
        unsafe { core::slice::from_raw_parts(ptr, len) }
    };
    let s = core::str::from_utf8(bytes).map_err(|_| bad("is not UTF-8".into()))?;
    if s.contains('\0') {
        return Err(bad("holds a NUL byte".into()));
    }
    Ok(s)
}

/// The arguments both functions take, checked: directory, model, options.
///
/// # Safety
/// As [`text_arg`], for each pointer and its length.
unsafe fn args(
    dir: (*const u8, usize),
    model: (*const u8, usize),
    options: (*const u8, usize),
) -> Result<(PathBuf, String, String), CudaError> {
    // SAFETY: forwarded from the caller, one pointer and length each.
    let d = unsafe { text_arg(dir.0, dir.1, MAX_DIR, "directory") }?;
    // SAFETY: as above.
    let m = unsafe { text_arg(model.0, model.1, MAX_MODEL, "model name") }?;
    // SAFETY: as above.
    let o = unsafe { text_arg(options.0, options.1, MAX_OPTIONS, "options") }?;
    if d.is_empty() {
        return Err(CudaError::PlanStore("plan store: empty directory".into()));
    }
    if m.is_empty() {
        return Err(CudaError::PlanStore("plan store: empty model name".into()));
    }
    Ok((PathBuf::from(d), m.to_owned(), o.to_owned()))
}

/// Loads model `model`'s plans (`model_len` bytes of UTF-8) from the plan
/// store in directory `dir` into `device`'s arena, for the setting named by
/// `options` (text, may be empty: PyTorch's version, the GPU's name; the
/// store's key also holds the arena's granule, alignment and driver). The
/// directory must exist; a directory with no file for the model loads
/// nothing and succeeds. Returns the number of plans loaded (0 or more),
/// or -1: a missing directory, a refused file (corrupt, another format
/// version, another model's or setting's: the message says which), a bad
/// argument. Nothing is loaded on -1. A file whose families this build
/// cannot use loads its plans and leaves a message in
/// `tensor_arena_cuda_last_error` all the same.
///
/// # Safety
/// Each of `dir`, `model`, `options` is valid for reads of its length in
/// bytes, or null with a length of 0.
#[no_mangle]
pub unsafe extern "C" fn tensor_arena_cuda_plans_load(
    device: c_int,
    dir: *const u8,
    dir_len: usize,
    model: *const u8,
    model_len: usize,
    options: *const u8,
    options_len: usize,
) -> i64 {
    trampoline(-1, || {
        // SAFETY: the caller's promise for each pointer and length.
        let got = unsafe { args((dir, dir_len), (model, model_len), (options, options_len)) };
        let loaded = got.and_then(|(dir, model, options)| {
            with_arena(device, |a| {
                let store = a.plan_store(&dir, &model, &options);
                a.load_plans(&store)
            })
        });
        code(loaded, |l| {
            if let Some(w) = l.warning {
                set_error(w);
            }
            i64::try_from(l.plans).unwrap_or(i64::MAX)
        })
    })
}

/// Saves `device`'s plans as model `model`'s in the plan store in `dir`
/// (made if missing), merged with what the file holds, atomically;
/// `options` as for [`tensor_arena_cuda_plans_load`] (the same text, or
/// the next load refuses the file). Returns the bytes of the file written,
/// or -1 (a bad argument, a directory or file that cannot be written).
///
/// # Safety
/// As [`tensor_arena_cuda_plans_load`].
#[no_mangle]
pub unsafe extern "C" fn tensor_arena_cuda_plans_save(
    device: c_int,
    dir: *const u8,
    dir_len: usize,
    model: *const u8,
    model_len: usize,
    options: *const u8,
    options_len: usize,
) -> i64 {
    trampoline(-1, || {
        // SAFETY: the caller's promise for each pointer and length.
        let got = unsafe { args((dir, dir_len), (model, model_len), (options, options_len)) };
        let saved = got.and_then(|(dir, model, options)| {
            with_arena(device, |a| {
                let store = a.plan_store(&dir, &model, &options);
                a.save_plans(&store)
            })
        });
        code(saved, |s| i64::try_from(s.bytes).unwrap_or(i64::MAX))
    })
}
