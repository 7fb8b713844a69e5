//! Traces (read by [`tensor_arena::trace`], renumbered for fast replay)
//! and the sizes the hot-path benchmarks draw from them.

use crate::PAGE;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One event of a traced run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Tensor `id` is created with `bytes` bytes.
    Alloc {
        /// Slot of the tensor: ids are renumbered `0..slots` in allocation order.
        id: u32,
        /// Size in bytes (> 0).
        bytes: usize,
    },
    /// Tensor `id` is dead.
    Free {
        /// An id allocated earlier in the same run.
        id: u32,
    },
}

/// One inference call of a trace.
#[derive(Clone, Debug, Default)]
pub struct TraceRun {
    /// The `run` line's label: the main input's shape.
    pub label: String,
    /// The run's allocations and frees, in order.
    pub ops: Vec<Op>,
    /// Number of tensors; ids are `0..slots`.
    pub slots: usize,
}

impl TraceRun {
    /// The most bytes live at once: no allocator can use less.
    pub fn lower_bound(&self) -> usize {
        let mut sizes = vec![0usize; self.slots];
        let (mut live, mut peak) = (0usize, 0usize);
        for op in &self.ops {
            match *op {
                Op::Alloc { id, bytes } => {
                    sizes[id as usize] = bytes;
                    live += bytes;
                    peak = peak.max(live);
                }
                Op::Free { id } => live -= sizes[id as usize],
            }
        }
        peak
    }

    /// The sum of all allocation sizes (nothing reused).
    pub fn naive(&self) -> usize {
        self.allocs().sum()
    }

    /// The sizes allocated, in order.
    pub fn allocs(&self) -> impl Iterator<Item = usize> + '_ {
        self.ops.iter().filter_map(|op| match *op {
            Op::Alloc { bytes, .. } => Some(bytes),
            Op::Free { .. } => None,
        })
    }

    /// Page writes a replay of the run does ([`touch_pages`](crate::touch_pages) on each buffer).
    pub fn page_touches(&self) -> usize {
        self.allocs().map(|b| b.div_ceil(PAGE)).sum()
    }
}

/// A trace file: several runs of one model (format in `traces/README.md`).
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// The file name without `.trace`.
    pub name: String,
    /// The runs in file order.
    pub runs: Vec<TraceRun>,
}

impl Trace {
    /// The runs of a trace parsed by [`tensor_arena::trace`], with ids
    /// renumbered densely per run (in allocation order) for table lookups.
    ///
    /// # Panics
    /// If a run holds more than `u32::MAX` allocations.
    pub fn from_parsed(name: &str, parsed: &tensor_arena::trace::Trace) -> Trace {
        use tensor_arena::trace::Event;
        let runs = parsed
            .runs
            .iter()
            .map(|run| {
                let mut slots: HashMap<u64, u32> = HashMap::new();
                let ops = run
                    .events
                    .iter()
                    .map(|event| match *event {
                        Event::Alloc { id, bytes } => {
                            let slot = u32::try_from(slots.len()).expect("fewer than 2^32 tensors");
                            slots.insert(id, slot);
                            Op::Alloc {
                                id: slot,
                                bytes: usize::try_from(bytes).expect("a size that fits usize"),
                            }
                        }
                        // A parsed trace frees only live ids.
                        Event::Free { id } => Op::Free { id: slots[&id] },
                    })
                    .collect();
                TraceRun {
                    label: run.label.clone(),
                    ops,
                    slots: slots.len(),
                }
            })
            .collect();
        Trace {
            name: name.to_owned(),
            runs,
        }
    }

    /// Loads `<name>.trace` from [`traces_dir`] with [`tensor_arena::trace`].
    ///
    /// # Panics
    /// If the file cannot be read or is malformed: the traces are checked
    /// inputs, and a bench should stop loudly rather than measure garbage.
    pub fn load(name: &str) -> Trace {
        let path = traces_dir().join(format!("{name}.trace"));
        let parsed = tensor_arena::trace::Trace::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
        Trace::from_parsed(name, &parsed)
    }

    /// The lower bound of the trace: the largest lower bound of its runs.
    pub fn lower_bound(&self) -> usize {
        self.runs
            .iter()
            .map(TraceRun::lower_bound)
            .max()
            .unwrap_or(0)
    }

    /// The largest naive footprint of its runs.
    pub fn max_naive(&self) -> usize {
        self.runs.iter().map(TraceRun::naive).max().unwrap_or(0)
    }
}

/// Where the traces are: `$TRACES_DIR`, else the workspace's `traces/`.
pub fn traces_dir() -> PathBuf {
    match std::env::var_os("TRACES_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces"),
    }
}

/// The names of every trace file, sorted.
///
/// # Panics
/// If the traces directory cannot be read.
pub fn trace_names() -> Vec<String> {
    let dir = traces_dir();
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".trace").map(str::to_owned)
        })
        .collect();
    names.sort();
    names
}

/// `n` allocation sizes drawn from every single-shape trace (the `-mixed`
/// files repeat them), between 1 KiB and 50 MiB, in a fixed pseudo-random
/// order (the same on every call).
pub fn hot_path_sizes(n: usize) -> Vec<usize> {
    let pool: Vec<usize> = trace_names()
        .iter()
        .filter(|name| !name.ends_with("-mixed"))
        .flat_map(|name| {
            let trace = Trace::load(name);
            trace
                .runs
                .iter()
                .flat_map(|r| r.allocs().collect::<Vec<_>>())
                .collect::<Vec<_>>()
        })
        .filter(|&b| (1 << 10..=50 << 20).contains(&b))
        .collect();
    assert!(!pool.is_empty(), "no trace sizes in 1 KiB..50 MiB");
    // A fixed LCG (Knuth's MMIX constants): deterministic, no dependency.
    let mut state: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) as usize
    };
    let len = pool.len();
    (0..n).map(|_| pool[next() % len]).collect()
}

// ---------------------------------------------------------------------------
// Pages, faults, resident memory
// ---------------------------------------------------------------------------
