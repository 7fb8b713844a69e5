//! Helpers shared by the test modules.

use allocator_api2::alloc::{AllocError, Allocator, Global, Layout};
use std::cell::Cell;
use std::ptr::NonNull;

/// A backing allocator that counts calls and outstanding bytes, and can be
/// told to fail from its Nth allocation on.
#[derive(Debug, Default)]
pub struct Counting {
    pub allocs: Cell<u64>,
    pub frees: Cell<u64>,
    pub outstanding: Cell<usize>,
    /// Fail every allocation once `allocs + failures` reaches this.
    pub fail_from: Cell<Option<u64>>,
    pub calls: Cell<u64>,
}

impl Counting {
    pub fn failing_from(n: u64) -> Self {
        let c = Self::default();
        c.fail_from.set(Some(n));
        c
    }
}

// SAFETY: forwards to `Global`, only counting; every block it returns is a
// live `Global` block until deallocated.
unsafe impl Allocator for &Counting {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let call = self.calls.get();
        self.calls.set(call + 1);
        if self.fail_from.get().is_some_and(|n| call >= n) {
            return Err(AllocError);
        }
        let p = Global.allocate(layout)?;
        self.allocs.set(self.allocs.get() + 1);
        self.outstanding.set(self.outstanding.get() + layout.size());
        Ok(p)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        self.frees.set(self.frees.get() + 1);
        self.outstanding.set(self.outstanding.get() - layout.size());
        // SAFETY: `ptr` came from `Global.allocate(layout)` above.
        unsafe { Global.deallocate(ptr, layout) }
    }
}

/// One run of a trace: `(alloc: true, id, bytes)` or `(false, id, 0)`.
#[derive(Clone)]
pub struct TraceRun {
    pub label: String,
    pub events: Vec<(bool, usize, usize)>,
}

impl TraceRun {
    /// Max bytes live at once (the lower bound), sizes as given.
    pub fn lower_bound(&self) -> usize {
        let mut sizes = std::collections::HashMap::new();
        let (mut live, mut max) = (0usize, 0usize);
        for &(alloc, id, bytes) in &self.events {
            if alloc {
                sizes.insert(id, bytes);
                live += bytes;
                max = max.max(live);
            } else {
                live -= sizes[&id];
            }
        }
        max
    }
}

pub fn traces_dir() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../traces");
    assert!(dir.is_dir(), "shared traces not found at {}", dir.display());
    dir
}

/// Reads the runs of a trace file (well-formed input assumed: these are the
/// shared reference traces).
pub fn read_trace(name: &str) -> Vec<TraceRun> {
    let text = std::fs::read_to_string(traces_dir().join(name)).unwrap();
    let mut runs: Vec<TraceRun> = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        match f[0] {
            "run" => runs.push(TraceRun {
                label: f[1].to_string(),
                events: Vec::new(),
            }),
            "alloc" => runs.last_mut().unwrap().events.push((
                true,
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            )),
            "free" => runs
                .last_mut()
                .unwrap()
                .events
                .push((false, f[1].parse().unwrap(), 0)),
            _ => {}
        }
    }
    runs
}

/// Names of every `.trace` file in the shared folder, sorted.
pub fn trace_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(traces_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".trace"))
        .collect();
    names.sort();
    names
}

/// A proptest's case count: `n`, or `PROPTEST_CASES` where that is fewer.
/// `.ci/reliability.sh` sets it for the run under AddressSanitizer, whose
/// purpose is the memory layer's accesses, not the search's breadth; the
/// plain `cargo test` runs every property's own count.
pub fn cases(n: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .map_or(n, |c| c.clamp(1, n))
}
