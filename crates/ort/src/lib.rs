#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
// `Runtime`, `open_session` and `ArenaSession::open` exist with the
// `load-dynamic` feature only; the docs link them either way.
#![cfg_attr(not(feature = "load-dynamic"), allow(rustdoc::broken_intra_doc_links))]
#![warn(clippy::undocumented_unsafe_blocks)]

mod admit;
mod admit_stats;
mod adopt;
mod block;
#[cfg(feature = "cuda")]
mod cuda;
mod decay;
mod error;
mod follow;
pub mod fork;
mod forklock;
mod heaps;
mod key;
mod large;
mod learn;
mod ledger;
mod limit;
mod plans;
mod pool;
mod raw;
mod reserve;
mod room;
mod runners;
#[cfg(feature = "load-dynamic")]
mod runtime;
mod served;
mod session;
mod slot;
mod store;
mod tensors;
mod worker;

pub use admit::{Admission, AdmissionStats, ALONE_WAIT, MAX_PASSES};
pub use adopt::{is_registered, is_registered_on, register, SessionBuilderExt};
#[cfg(feature = "cuda")]
pub use cuda::{cuda_run, cuda_shrink, cuda_stats, CudaExt, CudaRun, DeviceStats, TorchStats};
pub use decay::{system_heap_trims, DEFAULT_DECAY};
pub use error::OrtArenaError;
pub use follow::Shrink;
pub use heaps::{limit_system_heaps, map_large_blocks, IDLE_RSS_SYSTEM_HEAPS, MAX_MMAP_THRESHOLD};
pub use key::{KeyInputs, RunKey};
pub use large::LargeBlocks;
pub use ledger::LEDGER_DIR_ENV;
pub use limit::{
    check_memory_limit, default_budget, default_memory_limit, join_default_limit, load_turn,
    margin, parse_memory_limit, set_default_memory_limit, LimitSource, LoadTurn, MemoryLimit,
    MEMORY_LIMIT_ENV, MEMTOTAL_PERCENT,
};
pub use ort;
pub use plans::Plans;
pub use pool::{Checkout, CheckoutFuture, PoolStats, WorkerPool};
pub use raw::status_result;
pub use reserve::Reservation;
#[cfg(feature = "load-dynamic")]
pub use runtime::Runtime;
pub use served::NotServed;
#[cfg(feature = "load-dynamic")]
pub use session::open_session;
pub use session::{
    run_shared, ArenaOptions, ArenaSession, Memory, RunOutput, SessionOptions, SessionWorker,
};
pub use store::{model_key, PlanSaver};
pub use tensor_arena::memory::{GiveBack, PagesConfig};
/// A model's plan store ([`Plans::with_store`]): where it is, what it is
/// keyed by, what saving wrote and why a store was refused.
pub use tensor_arena::{
    plan::store::{Saved, StoreError},
    ModelKey, PlanStore,
};
/// What a server needs of the arena crate without depending on it: one
/// memory limit for every worker ([`Budget`], [`BudgetStats`]), the
/// arena's stats and configuration, and every type this crate's functions
/// return or their results hold: a run's report and how it was served
/// ([`RunReport`], [`PlanSource`], [`DynamicReason`], [`Deviation`]), a
/// model's plans ([`PlanCache`], [`PlanStats`], [`FamilyStats`],
/// [`FamilyCounts`]), errors ([`ArenaError`]) and traces ([`Trace`]).
pub use tensor_arena::{
    trace::Trace, ArenaConfig, ArenaError, Budget, BudgetStats, Deviation, DynamicReason,
    FamilyCounts, FamilyStats, PlanCache, PlanSource, PlanStats, RunReport, Stats,
};
pub use tensors::{hash_outputs, make_input, make_input_in, InputSpec};
pub use worker::{worker_warning_limit, RunInfo, Worker, WorkerOptions, SHARE_LARGE_BLOCKS};

/// Counters of the registered allocator since the process started, over all
/// threads and arenas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocatorCounters {
    /// `Alloc` calls.
    pub alloc_calls: u64,
    /// `Free` calls.
    pub free_calls: u64,
    /// Allocations served by the system allocator: no worker was running on
    /// the calling thread (session creation, ONNX Runtime's own pool
    /// threads), or the worker's arena refused the request.
    pub system_allocs: u64,
    /// System-allocator blocks still live.
    pub system_live: u64,
    /// Requests a worker's arena refused (over its `max_reserved` cap),
    /// served by the system allocator instead (included in
    /// `system_allocs`).
    pub refused_allocs: u64,
    /// Bytes asked for by all `Alloc` calls.
    pub alloc_bytes: u64,
    /// Of those, bytes served by the system allocator.
    pub system_bytes: u64,
}

/// Whether a request nothing can serve is refused to ONNX Runtime with
/// `std::bad_alloc` (its run then fails with a status, and the process goes
/// on): true once [`register`] has found the C++ runtime the ONNX Runtime
/// library binds `__cxa_throw` to (`tensor_arena::cxx::runtime_for`). When
/// false, `Alloc` returns null for such a request, which ONNX Runtime does
/// not check (the process then crashes): seen only with a library that
/// carries a hidden C++ runtime of its own.
pub fn bad_alloc_available() -> bool {
    raw::can_throw()
}

/// The registered allocator's counters.
pub fn allocator_counters() -> AllocatorCounters {
    use std::sync::atomic::Ordering::Relaxed;
    AllocatorCounters {
        alloc_calls: raw::ALLOC_CALLS.load(Relaxed) as u64,
        free_calls: raw::FREE_CALLS.load(Relaxed) as u64,
        system_allocs: raw::SYSTEM_ALLOCS.load(Relaxed) as u64,
        system_live: raw::SYSTEM_LIVE.load(Relaxed) as u64,
        refused_allocs: raw::REFUSED_ALLOCS.load(Relaxed) as u64,
        alloc_bytes: raw::ALLOC_BYTES.load(Relaxed) as u64,
        system_bytes: raw::SYSTEM_BYTES.load(Relaxed) as u64,
    }
}

/// The arenas alive in the process (one per worker, kept after the worker
/// is dropped while its outputs live) and the sum of their stats as last
/// published (after each run, and after each free from another thread).
pub fn arenas() -> (usize, tensor_arena::Stats) {
    let (stats, n) = slot::all_stats();
    (n, stats)
}

/// Bytes live in the workers' arenas together, counted at every alloc and
/// free (ONNX Runtime's blocks with their headers): `(now, peak)`. Unlike
/// the sum of [`arenas`]' stats, published after each run, the peak
/// includes the moments when runs in flight overlap: the figure to set
/// against what the arenas reserve. The peak counts since the start, the
/// last [`reset_live_peak`], or a fork (in a child).
pub fn live_together() -> (usize, usize) {
    slot::live_together()
}

/// [`live_together`]'s peak starts again from the bytes live now.
pub fn reset_live_peak() {
    slot::reset_live_peak()
}

#[cfg(test)]
mod admit_tests;
#[cfg(test)]
mod large_tests;
