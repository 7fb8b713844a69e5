//! glibc's heap settings, set from Python only when the program asks
//! (crates/ort's `map_large_blocks` and `limit_system_heaps`): importing
//! the package changes nothing process-wide.
//!
//! | call | what it does |
//! |---|---|
//! | `system_heap(mmap_threshold=131072)` | glibc maps every block of that many bytes or more on its own and gives it back at `free` (`MALLOC_MMAP_THRESHOLD_`) |
//! | `system_heap(arena_max=2)` | at most that many glibc heaps (`MALLOC_ARENA_MAX`) |

use crate::errors::InvalidArgument;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::num::NonZeroUsize;

fn positive(what: &str, n: Option<i64>) -> PyResult<Option<NonZeroUsize>> {
    n.map(|n| {
        usize::try_from(n)
            .ok()
            .and_then(NonZeroUsize::new)
            .ok_or_else(|| InvalidArgument::new_err(format!("{what} must be at least 1, not {n}")))
    })
    .transpose()
}

/// Sets glibc's malloc parameters for the rest of the process, as the
/// environment variables would at start; each argument left `None` is
/// left as it is. Returns `{"mmap_threshold": accepted, "arena_max":
/// accepted}` (`False` for one not given, where the C library is not
/// glibc, or that glibc refused).
///
/// `mmap_threshold`: blocks of this many bytes or more get a mapping of
/// their own, returned to the kernel at `free` (at most 32 MiB). glibc's
/// default moves up to the size of each large block freed, so that ONNX
/// Runtime's own large scratch stays in the heaps of the threads that ran
/// it: 131072 (128 KiB, the start of glibc's default) takes the peak of 16
/// threads from 724-770 to 546-622 MiB and rapidocr's from 568 to 537 MiB,
/// for 4 % to 5 % more time on rapidocr (BENCHMARKS.md, "glibc's moving
/// mmap threshold"). It applies to later allocations.
///
/// `arena_max`: at most that many heaps; call it before threads allocate
/// (glibc fixes the count once it has made more than 8).
///
/// # Errors
/// `InvalidArgument` for a value under 1.
#[pyfunction]
#[pyo3(signature = (*, mmap_threshold = None, arena_max = None))]
fn system_heap(
    py: Python<'_>,
    mmap_threshold: Option<i64>,
    arena_max: Option<i64>,
) -> PyResult<Bound<'_, PyDict>> {
    let threshold = positive("mmap_threshold", mmap_threshold)?;
    let max = positive("arena_max", arena_max)?;
    let d = PyDict::new(py);
    d.set_item(
        "mmap_threshold",
        tensor_arena_ort::map_large_blocks(threshold),
    )?;
    d.set_item("arena_max", tensor_arena_ort::limit_system_heaps(max))?;
    Ok(d)
}

/// Adds this module's function to `m`.
pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(system_heap, m)?)
}
