//! Workloads: runs of buffer allocations and frees, from trace files or from
//! the built-in model (see [`crate::model`]).
//!
//! Trace files are read and checked by `tensor_arena::trace` (errors carry
//! the file and line); [`from_trace_files`] maps them to [`Workload`]s.
//! Everything downstream sees dense ids: the `k`-th allocation of a run has
//! id `k`, so a replay can keep its live buffers in a `Vec` indexed by id.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use tensor_arena::trace::{Event, Trace, TraceError};

/// A sequence of runs (inference calls) to replay, in order.
#[derive(Clone, Debug)]
pub struct Workload {
    /// One line saying what this is (file names or the model and its shapes).
    pub description: String,
    /// The runs, in replay order. Never empty.
    pub runs: Vec<RunSpec>,
}

/// One run: a label and its allocation events.
#[derive(Clone, Debug)]
pub struct RunSpec {
    /// What the run is (the input shape, as in trace files).
    pub label: String,
    /// Allocations and frees in order. Ids are dense (the `k`-th alloc has id
    /// `k`), every alloc is freed exactly once, every free names a live id.
    pub events: Vec<Ev>,
}

/// One allocation event of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ev {
    /// A buffer of `bytes > 0` bytes is created; `id` is the number of
    /// allocations before it in the run.
    Alloc {
        /// Dense id within the run.
        id: u32,
        /// Size in bytes, at least 1.
        bytes: usize,
    },
    /// The buffer `id` is dead.
    Free {
        /// Dense id of a live buffer.
        id: u32,
    },
}

impl RunSpec {
    /// Number of allocations (also the number of distinct ids).
    pub fn allocs(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e, Ev::Alloc { .. }))
            .count()
    }

    /// The lower bound: the most bytes live at once. No allocator or plan can
    /// serve the run with less. Lifetimes are half-open, so an allocation
    /// counts together with everything freed after it.
    pub fn lower_bound(&self) -> usize {
        live_curve(&self.events).max().unwrap_or(0)
    }
}

impl Workload {
    /// Total allocations over all runs.
    pub fn allocs(&self) -> usize {
        self.runs.iter().map(RunSpec::allocs).sum()
    }

    /// Total events over all runs.
    pub fn events(&self) -> usize {
        self.runs.iter().map(|r| r.events.len()).sum()
    }
}

/// Bytes live after each event of `events` (which must be well formed).
pub fn live_curve(events: &[Ev]) -> impl Iterator<Item = usize> + '_ {
    let mut sizes: Vec<usize> = Vec::new();
    let mut live = 0usize;
    events.iter().map(move |e| {
        match *e {
            Ev::Alloc { id, bytes } => {
                debug_assert_eq!(id as usize, sizes.len(), "ids must be dense");
                sizes.push(bytes);
                live += bytes;
            }
            Ev::Free { id } => live -= sizes[id as usize],
        }
        live
    })
}

/// Why trace files could not be turned into a workload. Displays as
/// `file:line: what`.
#[derive(Debug)]
pub enum WorkloadError {
    /// The file could not be read or breaks the format.
    Trace(TraceError),
    /// The file holds no `run`.
    NoRuns(PathBuf),
}

impl fmt::Display for WorkloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Trace(e) => e.fmt(f),
            Self::NoRuns(p) => write!(f, "{}: no `run` line: nothing to replay", p.display()),
        }
    }
}

impl std::error::Error for WorkloadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Trace(e) => Some(e),
            Self::NoRuns(_) => None,
        }
    }
}

/// Reads trace files (format v1, `traces/README.md`) into one workload, runs
/// in file order. With several files, each run's label is prefixed with its
/// file's stem.
///
/// # Errors
/// The first problem found, with its file and line: unreadable file,
/// malformed line, alloc before `run`, id allocated twice, free of an id
/// that is not live, ids live at the end of a run, no runs.
pub fn from_trace_files(paths: &[PathBuf]) -> Result<Workload, WorkloadError> {
    let mut runs = Vec::new();
    for path in paths {
        let trace = Trace::from_file(path).map_err(WorkloadError::Trace)?;
        if trace.runs.is_empty() {
            return Err(WorkloadError::NoRuns(path.clone()));
        }
        let stem = path.file_stem().map_or_else(
            || path.display().to_string(),
            |s| s.to_string_lossy().into(),
        );
        for run in &trace.runs {
            let label = if paths.len() > 1 {
                format!("{stem}:{}", run.label)
            } else {
                run.label.clone()
            };
            runs.push(RunSpec {
                label,
                events: dense(&run.events),
            });
        }
    }
    let names: Vec<String> = paths
        .iter()
        .map(|p| {
            p.file_name()
                .map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into())
        })
        .collect();
    Ok(Workload {
        description: format!("trace {}", names.join(", ")),
        runs,
    })
}

/// Renumbers a checked run's ids densely, in allocation order.
fn dense(events: &[Event]) -> Vec<Ev> {
    let mut ids: HashMap<u64, u32> = HashMap::new();
    events
        .iter()
        .map(|e| match *e {
            Event::Alloc { id, bytes } => {
                let dense = ids.len() as u32;
                ids.insert(id, dense);
                Ev::Alloc {
                    id: dense,
                    bytes: usize::try_from(bytes).unwrap_or(usize::MAX),
                }
            }
            // `Trace::from_file` checked that every free names a live id.
            Event::Free { id } => Ev::Free { id: ids[&id] },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_become_dense_in_allocation_order() {
        let events = [
            Event::Alloc { id: 7, bytes: 10 },
            Event::Alloc { id: 3, bytes: 20 },
            Event::Free { id: 7 },
            Event::Free { id: 3 },
        ];
        assert_eq!(
            dense(&events),
            vec![
                Ev::Alloc { id: 0, bytes: 10 },
                Ev::Alloc { id: 1, bytes: 20 },
                Ev::Free { id: 0 },
                Ev::Free { id: 1 },
            ]
        );
    }
}
