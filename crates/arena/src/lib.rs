#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod arena;
mod budget;
mod config;
#[cfg(feature = "cxx")]
pub mod cxx;
mod error;
mod freemap;
pub mod memory;
pub mod plan;
mod pool;
mod pressure;
mod raw;
mod shared;
mod stats;
pub use plan::trace;

pub use allocator_api2;
pub use arena::{Arena, Block, Run, ScopedBlock, ScopedRun, TypedBlock};
pub use budget::{cgroup_limit_file, default_headroom, Budget, BudgetStats, Reclaim};
pub use config::{ArenaConfig, Coalesce, Fit, Growth, Relayout, ShrinkPolicy, DEFAULT_MAX_EXTEND};
pub use error::ArenaError;
pub use freemap::FreeError;
pub use memory::{DefaultMemory, Heap, HostMemory, Memory};
pub use plan::store::{ModelKey, PlanKey, PlanStore};
pub use plan::{
    Deviation, DynamicReason, FamilyCounts, FamilyStats, KeyDims, Lookup, Plan, PlanCache,
    PlanError, PlanSource, PlanStats, Recording,
};
pub use pressure::{PressureConfig, PressureMonitor, PressureStats, Relief, Signal, Watch};
pub use raw::{Handle, RawAlloc, RawArena};
pub use shared::{SharedArena, SharedArenaGuard, SharedBlock};
pub use stats::{LiveBlock, RunReport, Stats};

/// The workspace README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct WorkspaceReadme;
