//! NumPy arrays in and out of ONNX Runtime.
//!
//! In: a C-contiguous, aligned array of native byte order becomes an
//! `OrtValue` over the array's own memory (no copy); the array is kept
//! alive by the caller for the run. A strided or unaligned array goes
//! through `numpy.asarray(x, order="C")` first (a copy, as onnxruntime
//! makes), and a list or a scalar becomes an array of the input's type
//! (as onnxruntime converts it); an array of another dtype is an error,
//! as in onnxruntime.
//!
//! Out: each output tensor is copied into a new NumPy-owned array
//! ([`OutputMode::Copy`], the default), or returned as an array over the
//! tensor's arena block whose base object holds the tensor
//! ([`OutputMode::View`]): the block stays live as long as the array (or a
//! view of it) does, and a shrink never invalidates it.

use crate::errors::{Fail, InvalidArgument};
use numpy::npyffi::{self, npy_intp, NPY_ARRAY_CARRAY, PY_ARRAY_API};
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use std::ffi::c_void;
use std::ptr::NonNull;
use tensor_arena_ort::ort::value::{DynValue, TensorElementType, ValueType};
use tensor_arena_ort::ort::AsPointer;
use tensor_arena_ort::{ort, status_result};

/// How outputs reach Python.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputMode {
    /// Copied into NumPy-owned memory; the arena block is freed at once.
    Copy,
    /// Arrays over the arena block; the block lives as long as the array.
    View,
}

/// ONNX's name of an element type, as onnxruntime's `NodeArg.type` gives
/// it (`tensor(float)`).
pub fn onnx_type_name(ty: TensorElementType) -> &'static str {
    use TensorElementType as T;
    match ty {
        T::Float32 => "tensor(float)",
        T::Float64 => "tensor(double)",
        T::Float16 => "tensor(float16)",
        T::Bfloat16 => "tensor(bfloat16)",
        T::Int8 => "tensor(int8)",
        T::Int16 => "tensor(int16)",
        T::Int32 => "tensor(int32)",
        T::Int64 => "tensor(int64)",
        T::Uint8 => "tensor(uint8)",
        T::Uint16 => "tensor(uint16)",
        T::Uint32 => "tensor(uint32)",
        T::Uint64 => "tensor(uint64)",
        T::Bool => "tensor(bool)",
        T::String => "tensor(string)",
        _ => "tensor(unsupported)",
    }
}

/// The NumPy dtype string of an element type this module moves, or `None`.
fn numpy_name(ty: TensorElementType) -> Option<&'static str> {
    use TensorElementType as T;
    Some(match ty {
        T::Float32 => "float32",
        T::Float64 => "float64",
        T::Float16 => "float16",
        T::Int8 => "int8",
        T::Int16 => "int16",
        T::Int32 => "int32",
        T::Int64 => "int64",
        T::Uint8 => "uint8",
        T::Uint16 => "uint16",
        T::Uint32 => "uint32",
        T::Uint64 => "uint64",
        T::Bool => "bool",
        _ => return None,
    })
}

/// The element type of a NumPy dtype (by kind and size), or `None`.
fn element_of(descr: &Bound<'_, PyArrayDescr>) -> Option<TensorElementType> {
    use TensorElementType as T;
    Some(match (descr.kind(), descr.itemsize()) {
        (b'f', 4) => T::Float32,
        (b'f', 8) => T::Float64,
        (b'f', 2) => T::Float16,
        (b'i', 1) => T::Int8,
        (b'i', 2) => T::Int16,
        (b'i', 4) => T::Int32,
        (b'i', 8) => T::Int64,
        (b'u', 1) => T::Uint8,
        (b'u', 2) => T::Uint16,
        (b'u', 4) => T::Uint32,
        (b'u', 8) => T::Uint64,
        (b'b', 1) => T::Bool,
        _ => return None,
    })
}

/// A dtype's name as ONNX names it, for messages.
fn dtype_label(descr: &Bound<'_, PyArrayDescr>) -> String {
    match element_of(descr) {
        Some(t) => onnx_type_name(t).to_string(),
        None => format!("numpy dtype {}", descr),
    }
}

static ASARRAY: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// One input, ready for ONNX Runtime: its value over the array's memory and
/// the array that owns that memory (kept alive by the caller).
pub struct Input<'py> {
    /// The array (the caller's, or a contiguous copy of it).
    pub array: Bound<'py, PyUntypedArray>,
    /// Its dimensions.
    pub shape: Vec<i64>,
    /// The tensor over its memory.
    pub value: DynValue,
}

/// Makes the input `name` of element type `expected` from a Python object.
///
/// # Errors
/// `InvalidArgument` when the object is no array of a supported dtype or
/// its dtype is not `expected`; `Fail` if ONNX Runtime refuses the tensor.
pub fn input<'py>(
    name: &str,
    obj: &Bound<'py, PyAny>,
    expected: Option<TensorElementType>,
) -> PyResult<Input<'py>> {
    let py = obj.py();
    let ready = obj.cast::<PyUntypedArray>().ok().filter(|a| {
        // SAFETY: `a` is a live NumPy array (the cast checked its type), so
        // its object pointer is valid to read for the call.
        let flags = unsafe { (*a.as_array_ptr()).fields.flags };
        a.is_c_contiguous()
            && flags & npyffi::NPY_ARRAY_ALIGNED != 0
            && a.dtype().is_native_byteorder() != Some(false)
    });
    let array = match ready {
        Some(a) => a.clone(),
        None => {
            let f = ASARRAY.get_or_try_init(py, || -> PyResult<_> {
                Ok(py.import("numpy")?.getattr("asarray")?.unbind())
            })?;
            let kwargs = pyo3::types::PyDict::new(py);
            kwargs.set_item("order", "C")?;
            // A list or a scalar becomes an array of the input's type (as
            // onnxruntime converts it); an array keeps its own dtype.
            if obj.cast::<PyUntypedArray>().is_err() {
                if let Some(dtype) = expected.and_then(numpy_name) {
                    kwargs.set_item("dtype", dtype)?;
                }
            }
            let a = f.bind(py).call((obj,), Some(&kwargs)).map_err(|e| {
                InvalidArgument::new_err(format!("input {name:?}: not an array ({e})"))
            })?;
            let a = a
                .cast_into::<PyUntypedArray>()
                .map_err(|_| InvalidArgument::new_err(format!("input {name:?}: not an array")))?;
            if a.dtype().is_native_byteorder() == Some(false) {
                let native = a.dtype().call_method1("newbyteorder", ("=",))?;
                a.call_method1("astype", (native,))?
                    .cast_into::<PyUntypedArray>()
                    .map_err(|_| {
                        InvalidArgument::new_err(format!("input {name:?}: not an array"))
                    })?
            } else {
                a
            }
        }
    };
    let descr = array.dtype();
    let Some(ty) = element_of(&descr) else {
        return Err(InvalidArgument::new_err(format!(
            "input {name:?}: {} is not a supported input type",
            dtype_label(&descr)
        )));
    };
    if let Some(want) = expected {
        if want != ty {
            return Err(InvalidArgument::new_err(format!(
                "Unexpected input data type. Actual: ({}) , expected: ({}) for input {name:?}",
                onnx_type_name(ty),
                onnx_type_name(want)
            )));
        }
    }
    let shape: Vec<i64> = array.shape().iter().map(|&d| d as i64).collect();
    let nbytes = array.len() * descr.itemsize();
    // SAFETY: the array is live (we hold a reference) and NumPy's object
    // layout has `data` as a valid field to read.
    let data = unsafe { (*array.as_array_ptr()).fields.data }.cast::<c_void>();
    let value = tensor_over(data, nbytes, &shape, ty).map_err(|e| {
        InvalidArgument::new_err(format!("input {name:?}: ONNX Runtime refused it: {e}"))
    })?;
    Ok(Input {
        array,
        shape,
        value,
    })
}

/// An `OrtValue` over `nbytes` at `data` (a C-contiguous array of `shape`
/// and element type `ty`), which must outlive the value.
fn tensor_over(
    data: *mut c_void,
    nbytes: usize,
    shape: &[i64],
    ty: TensorElementType,
) -> Result<DynValue, String> {
    let info = cpu_memory_info()?;
    let api = ort::api();
    let mut out: *mut ort::sys::OrtValue = std::ptr::null_mut();
    // SAFETY: 1. `info` is a live CPU memory info; 2. `data` points to
    // `nbytes` bytes of the caller's array, which the caller keeps alive
    // (and does not free) for as long as the value exists (the value only
    // borrows it: `CreateTensorWithDataAsOrtValue` never frees it); 3. the
    // shape pointer and length describe `shape`; 4. `out` is a valid place
    // for the result.
    let status = unsafe {
        (api.CreateTensorWithDataAsOrtValue)(
            info.ptr(),
            data,
            nbytes,
            shape.as_ptr(),
            shape.len(),
            ty.into(),
            &mut out,
        )
    };
    // SAFETY: `status` was just returned by ONNX Runtime and is not used again.
    unsafe { status_result(status) }?;
    let out = NonNull::new(out).ok_or("ONNX Runtime returned no tensor")?;
    // `ort` wants the allocator a tensor was made with; this one's memory is
    // the caller's array, which ONNX Runtime never frees, so the default CPU
    // allocator (held, never used on it) serves.
    let allocator = ort::memory::Allocator::default();
    // SAFETY: `out` is a value ONNX Runtime just created for us (we own it;
    // `Value` releases it on drop, which does not free the borrowed data).
    Ok(unsafe { DynValue::from_ptr(out, Some(&allocator)) })
}

fn cpu_memory_info() -> Result<&'static ort::memory::MemoryInfo<'static>, String> {
    static INFO: std::sync::OnceLock<Result<MemInfo, String>> = std::sync::OnceLock::new();
    INFO.get_or_init(|| {
        use ort::memory::{AllocationDevice, AllocatorType, MemoryInfo, MemoryType};
        MemoryInfo::new(
            AllocationDevice::CPU,
            0,
            AllocatorType::Device,
            MemoryType::Default,
        )
        .map(MemInfo)
        .map_err(|e| e.message().to_string())
    })
    .as_ref()
    .map(|m| &m.0)
    .map_err(Clone::clone)
}

/// A memory info shared by every thread: ONNX Runtime only reads it.
struct MemInfo(ort::memory::MemoryInfo<'static>);
// SAFETY: an `OrtMemoryInfo` is an immutable description (device, id,
// type); ONNX Runtime reads it from any thread and it is never released
// (the static lives until the process ends).
unsafe impl Send for MemInfo {}
// SAFETY: as for `Send`: nothing mutates it after creation.
unsafe impl Sync for MemInfo {}

/// The tensor's element type, dimensions and data pointer.
fn describe(value: &DynValue) -> Option<(TensorElementType, Vec<i64>, *mut c_void)> {
    let ValueType::Tensor { ty, shape, .. } = value.dtype() else {
        return None;
    };
    let api = ort::api();
    let mut data: *mut c_void = std::ptr::null_mut();
    // SAFETY: `value` is a live tensor value (its type says so); `data` is
    // a valid place for the pointer.
    let status = unsafe { (api.GetTensorMutableData)(value.ptr().cast_mut(), &mut data) };
    // SAFETY: as above.
    unsafe { status_result(status) }.ok()?;
    Some((*ty, shape.to_vec(), data))
}

/// What holds an output tensor alive under a NumPy array over its memory
/// ([`OutputMode::View`]): the array's base object.
#[pyclass(frozen, module = "tensor_arena._native")]
pub struct OutputTensor {
    _value: DynValue,
}

/// The output `name` as a NumPy array: copied, or a view over the tensor's
/// memory that keeps the tensor alive.
///
/// # Errors
/// `Fail` for an output that is not a tensor of a supported element type
/// (strings, sequences, maps), or if NumPy cannot allocate.
pub fn output<'py>(
    py: Python<'py>,
    name: &str,
    value: DynValue,
    mode: OutputMode,
) -> PyResult<Bound<'py, PyAny>> {
    let unsupported = || {
        Fail::new_err(format!(
            "output {name:?} is {}: only numeric and bool tensors are supported",
            value.dtype()
        ))
    };
    let (ty, shape, data) = describe(&value).ok_or_else(unsupported)?;
    let dtype_name = numpy_name(ty).ok_or_else(unsupported)?;
    let descr = PyArrayDescr::new(py, dtype_name)?;
    let itemsize = descr.itemsize();
    let mut dims: Vec<npy_intp> = shape.iter().map(|&d| d as npy_intp).collect();
    let elements = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(usize::try_from(d).ok()?));
    let nbytes = elements
        .and_then(|n| n.checked_mul(itemsize))
        .ok_or_else(|| Fail::new_err(format!("output {name:?}: bad shape {shape:?}")))?;
    let nd = std::ffi::c_int::try_from(dims.len())
        .map_err(|_| Fail::new_err(format!("output {name:?}: rank too large")))?;
    let view = mode == OutputMode::View && nbytes > 0 && !data.is_null();
    // SAFETY: NumPy's API table is loaded (the numpy crate imports it on
    // first use, with the GIL held, as here).
    let array_type = unsafe { npyffi::get_type_object(py, npyffi::NpyTypes::PyArray_Type) };
    // SAFETY: 1. `descr` is a new reference that `PyArray_NewFromDescr`
    // steals; 2. `dims` holds `nd` dimensions; 3. null strides mean
    // C-contiguous; 4. with a null `data` NumPy allocates `nbytes` itself;
    // with `data` (view) it is the tensor's buffer of exactly `nbytes`,
    // which stays valid while the base object set below (holding the
    // tensor) lives.
    let raw = unsafe {
        PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            array_type,
            descr.into_dtype_ptr(),
            nd,
            dims.as_mut_ptr(),
            std::ptr::null_mut(),
            if view { data } else { std::ptr::null_mut() },
            if view { NPY_ARRAY_CARRAY } else { 0 },
            std::ptr::null_mut(),
        )
    };
    // SAFETY: `raw` is a new reference returned by NumPy, or null with an
    // exception set.
    let array = unsafe { Bound::from_owned_ptr_or_err(py, raw) }?;
    if view {
        let holder = Bound::new(py, OutputTensor { _value: value })?;
        // SAFETY: `raw` is the array just made (alive: `array` holds it);
        // `PyArray_SetBaseObject` steals the reference to `holder` that
        // `into_ptr` gives up; the array then keeps the tensor alive.
        let rc = unsafe { PY_ARRAY_API.PyArray_SetBaseObject(py, raw.cast(), holder.into_ptr()) };
        if rc != 0 {
            return Err(PyErr::fetch(py));
        }
    } else if nbytes > 0 {
        // SAFETY: `raw` is the live array just made (`array` holds it).
        let dst = unsafe { (*raw.cast::<npyffi::PyArrayObject>()).fields.data };
        // SAFETY: 1. `data` is the tensor's buffer of `nbytes` bytes (its
        // element type and shape say so), alive while `value` is; 2. `dst`
        // is the new array's buffer of `nbytes` bytes NumPy just allocated
        // (C-contiguous, this dtype and shape); 3. they are distinct
        // allocations.
        unsafe { std::ptr::copy_nonoverlapping(data.cast::<u8>(), dst.cast::<u8>(), nbytes) };
        drop(value);
    }
    Ok(array)
}
