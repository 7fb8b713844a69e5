//! [`DeviceArena`]: the arena's core on device memory, with streams, runs
//! keyed by input shape, and stats.

use crate::driver::{CudaDriver, DevicePtr, Driver, Stream};
use crate::memory::{DeviceCalls, DeviceMemory};
use crate::streams::{StreamStats, Streams};
use crate::CudaError;
use hashbrown::HashMap;
use std::sync::Arc;
use tensor_arena::memory::{Budgeted, ErrorCode};
use tensor_arena::{
    ArenaConfig, ArenaError, DynamicReason, FamilyStats, Handle, Lookup, PlanCache, PlanSource,
    PlanStats, RawArena, RunReport, ShrinkPolicy, Stats,
};
use tensor_arena::{Budget, Memory};

/// Alignment of every device block: 512 bytes, as PyTorch's caching
/// allocator rounds (more than the 256 bytes `cudaMalloc` promises).
pub const DEVICE_ALIGN: usize = 512;

/// Settings of a [`DeviceArena`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceConfig {
    /// The core's settings. Defaults: 512-byte alignment, no cap, manual
    /// shrink.
    pub arena: ArenaConfig,
    /// Address space reserved per arena with no cap; 0 (default) for twice
    /// the device's memory. Reserving costs no memory.
    pub reservation: usize,
    /// Plans kept (one per run key, least recently used out); default 64.
    pub plan_capacity: usize,
    /// Whether learning a plan shrinks the arena to what the plans need
    /// (the blocks live outside runs, such as weights, plus the largest
    /// plan): every key seen before is served from its plan's block, so
    /// nothing more is needed until a new key comes. Free granules between
    /// live blocks that no plan's block fits are unmapped too
    /// ([`RawArena::shrink_for_plans`]): the fragment below a block that
    /// outlived its run, such as PyTorch's cuBLAS workspace. Default true.
    pub shrink_to_plans: bool,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self {
            arena: ArenaConfig {
                alignment: DEVICE_ALIGN,
                ..ArenaConfig::default()
            },
            reservation: 0,
            plan_capacity: 64,
            shrink_to_plans: true,
        }
    }
}

/// A live block: its handle in the core, its size, its stream.
#[derive(Clone, Copy, Debug)]
struct Live {
    handle: Handle,
    size: usize,
}

/// Everything a [`DeviceArena`] can say about itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceStats {
    /// The core's counters (`reserved` = bytes mapped).
    pub arena: Stats,
    /// Driver calls of the memory layer.
    pub calls: DeviceCalls,
    /// The stream layer's counters.
    pub streams: StreamStats,
    /// The plan cache's counters.
    pub plans: PlanStats,
    /// Bytes mapped now, as the memory layer counts them (equals
    /// `arena.reserved`).
    pub mapped: usize,
    /// Most bytes mapped at once during the last run that ended (before
    /// any shrink at its end): the run's real device footprint.
    pub last_run_peak_mapped: usize,
    /// Most bytes mapped at once since the arena was made or
    /// [`DeviceArena::reset_peaks`] was called.
    pub reserved_peak: usize,
    /// Allocations that failed for want of device memory even after the
    /// arena gave its cached memory back and retried.
    pub out_of_memory: u64,
    /// Blocks kept out of reuse because their stream could not be ordered
    /// (neither an event nor a device synchronisation succeeded).
    pub stranded_blocks: u64,
}

/// The arena on one GPU: blocks are device addresses, never touched by the
/// host; growth maps physical chunks at the top of one reservation of
/// address space; [`DeviceArena::shrink`] unmaps down to the watermark.
///
/// Not `Sync`: the C ABI keeps each device's arena behind a mutex.
pub struct DeviceArena {
    /// The core over device memory, its mappings charged to a budget (the
    /// caller's, or an unlimited one of its own).
    raw: RawArena<Budgeted<DeviceMemory>>,
    driver: Arc<dyn Driver>,
    live: HashMap<u64, Live>,
    streams: Streams,
    /// Plans by run key (shared with `plan_store`, which loads and saves
    /// them).
    pub(crate) plans: PlanCache<Vec<u8>>,
    /// The open run's key, and the plan it was opened with (its key's own,
    /// predicted from its family, or none).
    run: Option<(Vec<u8>, Lookup)>,
    shrink_to_plans: bool,
    /// The shrink policy (the core's is `Manual`; see `apply_policy`).
    policy: ShrinkPolicy,
    /// Consecutive runs below the mapped bytes, and the largest need among
    /// them (for `ShrinkPolicy::AfterRunsBelow`).
    below: (u32, usize),
    /// Size of the largest plan learned (or loaded from a store).
    pub(crate) largest_plan: usize,
    out_of_memory: u64,
    stranded: u64,
    stranded_bytes: usize,
    last_run: Option<RunReport>,
    /// How the last run was planned (its key's own plan, predicted, none).
    last_plan: Option<PlanSource>,
    last_run_peak_mapped: usize,
}

impl core::fmt::Debug for DeviceArena {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DeviceArena")
            .field("driver", &self.driver.name())
            .field("live", &self.live.len())
            .finish_non_exhaustive()
    }
}

impl DeviceArena {
    /// An arena on device `ordinal` through the real driver.
    ///
    /// # Errors
    /// [`CudaError::DriverNotFound`] naming what was looked for when
    /// `libcuda.so` cannot be loaded (no GPU driver on this machine);
    /// [`CudaError::Driver`] when the device cannot be opened.
    pub fn cuda(ordinal: i32, config: DeviceConfig) -> Result<Self, CudaError> {
        Self::new(Arc::new(CudaDriver::new(ordinal)?), config)
    }

    /// An arena over `driver`; maps nothing until the first allocation.
    ///
    /// # Errors
    /// [`CudaError::Driver`] when the driver cannot say its granularity;
    /// [`CudaError::Arena`] for an inconsistent configuration.
    pub fn new(driver: Arc<dyn Driver>, config: DeviceConfig) -> Result<Self, CudaError> {
        Self::with_budget(driver, config, &Budget::new(usize::MAX))
    }

    /// An arena over `driver` whose mapped device memory is charged to
    /// `budget`, a budget of device memory (give device arenas their own,
    /// apart from the host's): a mapping that would pass its limit is
    /// refused with [`ErrorCode::OverBudget`] once this arena has given its
    /// own cached memory back, and fails the allocation
    /// ([`CudaError::Arena`]); unmapping credits it.
    ///
    /// # Errors
    /// As [`DeviceArena::new`].
    pub fn with_budget(
        driver: Arc<dyn Driver>,
        config: DeviceConfig,
        budget: &Arc<Budget>,
    ) -> Result<Self, CudaError> {
        let memory = Budgeted::new(
            DeviceMemory::new(Arc::clone(&driver), config.reservation)?,
            Arc::clone(budget),
        );
        let core_config = ArenaConfig {
            shrink_policy: ShrinkPolicy::Manual,
            ..config.arena
        };
        config.arena.validate()?;
        let raw = RawArena::new(core_config, memory)?;
        if config.plan_capacity == 0 {
            return Err(CudaError::Arena(ArenaError::InvalidConfig(
                "plan_capacity must be at least 1",
            )));
        }
        Ok(Self {
            raw,
            driver,
            live: HashMap::new(),
            streams: Streams::default(),
            plans: PlanCache::new(config.plan_capacity),
            run: None,
            shrink_to_plans: config.shrink_to_plans,
            policy: config.arena.shrink_policy,
            below: (0, 0),
            largest_plan: 0,
            out_of_memory: 0,
            stranded: 0,
            stranded_bytes: 0,
            last_run: None,
            last_plan: None,
            last_run_peak_mapped: 0,
        })
    }

    /// The budget its mappings are charged to.
    pub fn budget(&self) -> &Arc<Budget> {
        self.raw.memory().budget()
    }

    /// The driver.
    pub fn driver(&self) -> &Arc<dyn Driver> {
        &self.driver
    }

    /// The granule device memory is mapped in (the driver's recommended
    /// allocation granularity): every mapping is a multiple of it.
    pub fn granule(&self) -> usize {
        self.raw.memory().props().granule
    }

    /// Allocates `len > 0` bytes for work on `stream`, aligned to
    /// [`DEVICE_ALIGN`]. When the driver is out of memory, gives the
    /// arena's cached memory back and tries once more.
    ///
    /// # Errors
    /// [`CudaError::ZeroSize`]; [`CudaError::DeviceMemory`] with the
    /// driver's error when device memory cannot be mapped;
    /// [`CudaError::Arena`] for other refusals (over the cap, past the
    /// reservation);
    /// [`CudaError::Driver`] when the stream cannot be made to wait.
    pub fn alloc(&mut self, len: usize, stream: Stream) -> Result<DevicePtr, CudaError> {
        if len == 0 {
            return Err(CudaError::ZeroSize);
        }
        let got = match self.raw.alloc(len, DEVICE_ALIGN) {
            Err(ArenaError::CommitFailed { .. }) => {
                // Cached memory other allocations could use: give it back.
                self.release_cached(0);
                self.raw.alloc(len, DEVICE_ALIGN)
            }
            other => other,
        };
        let got = match got {
            Ok(got) => got,
            Err(
                e @ ArenaError::CommitFailed {
                    code: Some(ErrorCode::OverBudget { .. }),
                    ..
                },
            ) => {
                // The budget refused: the driver was not asked.
                self.out_of_memory += 1;
                return Err(e.into());
            }
            Err(e @ (ArenaError::CommitFailed { .. } | ArenaError::ReserveFailed { .. })) => {
                self.out_of_memory += 1;
                return Err(match self.raw.memory().inner().last_error() {
                    Some(driver) => CudaError::DeviceMemory {
                        requested: len,
                        driver: driver.clone(),
                    },
                    None => e.into(),
                });
            }
            Err(e) => return Err(e.into()),
        };
        let size = self.raw.capacity(got.handle);
        if let Err(e) = self
            .streams
            .on_alloc(self.driver.as_ref(), got.ptr.0, size, stream)
        {
            let freed = self.raw.free(got.handle);
            debug_assert!(freed.is_ok());
            return Err(e.into());
        }
        let old = self.live.insert(
            got.ptr.0,
            Live {
                handle: got.handle,
                size,
            },
        );
        debug_assert!(old.is_none(), "two live blocks at {}", got.ptr);
        Ok(got.ptr)
    }

    /// Gives back the block at `ptr`, last used by work on `stream`.
    ///
    /// # Errors
    /// [`CudaError::UnknownPointer`] when `ptr` is not a live block of this
    /// arena (nothing changes); [`CudaError::Driver`] when the stream
    /// cannot be ordered: the block is then kept out of reuse for good.
    pub fn free(&mut self, ptr: DevicePtr, stream: Stream) -> Result<(), CudaError> {
        let Some(live) = self.live.remove(&ptr.0) else {
            return Err(CudaError::UnknownPointer { ptr: ptr.0 });
        };
        if let Err(e) = self
            .streams
            .on_free(self.driver.as_ref(), ptr.0, live.size, stream)
        {
            self.stranded += 1;
            self.stranded_bytes += live.size;
            return Err(e.into());
        }
        self.raw
            .free(live.handle)
            .map_err(|_| CudaError::UnknownPointer { ptr: ptr.0 })
    }

    /// Bytes the block at `ptr` holds (its request rounded up to
    /// [`DEVICE_ALIGN`]), or `None` if it is not live.
    pub fn size_of(&self, ptr: DevicePtr) -> Option<usize> {
        self.live.get(&ptr.0).map(|l| l.size)
    }

    /// Opens a run for input shape `key`: served from the plan learned for
    /// `key` if there is one (one block, no search, no driver call), else
    /// from a plan predicted from the earlier shapes of its family (keys
    /// that differ only in their numbers: `("batch", 4)` after
    /// `("batch", 16)` and `("batch", 1)`), else recorded so that a plan is
    /// learned when it ends.
    ///
    /// # Errors
    /// [`CudaError::Arena`] with [`ArenaError::RunAlreadyOpen`].
    pub fn begin_run(&mut self, key: &[u8]) -> Result<u64, CudaError> {
        if self.raw.in_run() {
            return Err(ArenaError::RunAlreadyOpen.into());
        }
        self.raw.memory().inner().reset_peak();
        let lookup = self.plans.lookup(key);
        let id = match self
            .raw
            .begin_run(lookup.plan.clone(), lookup.plan.is_none())
        {
            Ok(id) => id,
            // The plan's block cannot be had: run unplanned, recorded.
            Err(_) => self.raw.begin_run(None, true)?,
        };
        self.run = Some((key.to_vec(), lookup));
        Ok(id)
    }

    /// Closes the open run and reports it. A run that left no block live
    /// teaches its key a plan (blocks still live, such as a returned
    /// output, make the run unplannable: drop them inside the run).
    ///
    /// # Errors
    /// [`CudaError::NoRun`] when no run is open.
    pub fn end_run(&mut self) -> Result<RunReport, CudaError> {
        let Some((key, lookup)) = self.run.take() else {
            return Err(CudaError::NoRun);
        };
        let (mut report, recording) = self.raw.finish_run();
        self.last_run_peak_mapped = self.raw.memory().inner().peak();
        let learnable = report.leaked_blocks == 0;
        if let Some(plan) =
            self.plans
                .after_run(key.as_slice(), &lookup, &report, &recording, learnable)
        {
            {
                self.largest_plan = self.largest_plan.max(plan.size());
                if self.shrink_to_plans {
                    // What stays live between runs, and one plan's block:
                    // fragments no plan's block fits are unmapped too (the
                    // one below a block that outlived its run, say).
                    let released = self.raw.shrink_for_plans(self.largest_plan);
                    report.released += self.after_shrink(released);
                }
            }
        }
        report.released += self.apply_policy(report.high_water);
        report.reserved = self.raw.stats().reserved;
        self.last_run = Some(report);
        self.last_plan = Some(if report.planned {
            lookup.source
        } else {
            match lookup.source {
                PlanSource::Dynamic(why) => PlanSource::Dynamic(why),
                _ => PlanSource::Dynamic(DynamicReason::Off),
            }
        });
        Ok(report)
    }

    /// The shrink policy, applied here rather than in the core: the core
    /// measures a run's need without the blocks live outside runs (see
    /// [`DeviceArena::shrink`]), which on a GPU are the model's weights.
    fn apply_policy(&mut self, high_water: usize) -> usize {
        let outside = self.raw.stats().in_use;
        match self.policy {
            ShrinkPolicy::Manual => 0,
            ShrinkPolicy::AfterEveryRun => self.shrink(),
            ShrinkPolicy::AfterRunsBelow { runs } => {
                let need = outside.saturating_add(high_water);
                let granule = self.raw.memory().props().granule;
                let reserved = self.raw.stats().reserved;
                if need
                    .next_multiple_of(granule)
                    .saturating_add(high_water / 8)
                    < reserved
                {
                    self.below = (self.below.0 + 1, self.below.1.max(need));
                } else {
                    self.below = (0, 0);
                }
                if self.below.0 >= runs {
                    let target = self.below.1;
                    self.below = (0, 0);
                    self.shrink_to(target)
                } else {
                    0
                }
            }
        }
    }

    /// How the last run that ended was planned: its key's own plan, one
    /// predicted from its family's earlier shapes, or none (and why).
    /// Whether it kept to its plan is in [`DeviceArena::last_run`].
    pub fn last_plan(&self) -> Option<PlanSource> {
        self.last_plan
    }

    /// Its plan families (one per model, by key): each one's shapes and
    /// runs (exact, predicted, fell back and why, dynamic).
    pub fn plan_families(&self) -> Vec<FamilyStats> {
        self.plans.families()
    }

    /// The last run's report (`None` before the first run ends).
    pub fn last_run(&self) -> Option<RunReport> {
        self.last_run
    }

    /// Whether a run is open.
    pub fn in_run(&self) -> bool {
        self.raw.in_run()
    }

    /// Gives device memory back down to what the last run needed plus the
    /// blocks live outside runs (weights, say): unmaps and releases the
    /// free granules above that. Returns the bytes released.
    ///
    /// (The core's own watermark counts the run's blocks only; blocks live
    /// across runs, which PyTorch's weights are, sit below them, so they
    /// are added here. Inside a run, the core's watermark is used as is.)
    pub fn shrink(&mut self) -> usize {
        let released = if self.raw.in_run() {
            self.raw.shrink()
        } else {
            let st = self.raw.stats();
            self.raw.shrink_to(st.watermark.saturating_add(st.in_use))
        };
        self.after_shrink(released)
    }

    /// Gives device memory back towards `bytes`.
    pub fn shrink_to(&mut self, bytes: usize) -> usize {
        let released = self.raw.shrink_to(bytes);
        self.after_shrink(released)
    }

    fn release_cached(&mut self, bytes: usize) -> usize {
        let released = self.raw.shrink_to(bytes);
        self.after_shrink(released)
    }

    fn after_shrink(&mut self, released: usize) -> usize {
        if released > 0 {
            // Decommitting synchronised the device: every event completed.
            self.streams.all_done();
        }
        released
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> DeviceStats {
        DeviceStats {
            arena: self.raw.stats(),
            calls: self.raw.memory().inner().calls(),
            streams: self.streams.stats(),
            plans: self.plans.stats(),
            mapped: self.raw.memory().inner().mapped(),
            last_run_peak_mapped: self.last_run_peak_mapped,
            reserved_peak: self.raw.memory().inner().reserved_peak(),
            out_of_memory: self.out_of_memory,
            stranded_blocks: self.stranded,
        }
    }

    /// Lowers the peaks to what is held now: `arena.peak_in_use` to the
    /// bytes in live blocks, `reserved_peak` to the bytes mapped (what
    /// PyTorch's `torch.cuda.reset_peak_memory_stats` does to its own).
    pub fn reset_peaks(&mut self) {
        self.raw.reset_peak();
        self.raw.memory().inner().reset_reserved_peak();
    }

    /// The last error the driver gave the memory layer, if any.
    pub fn last_driver_error(&self) -> Option<String> {
        self.raw
            .memory()
            .inner()
            .last_error()
            .map(ToString::to_string)
    }

    /// Live blocks: `(address, bytes)`, sorted by address.
    pub fn live_blocks(&self) -> Vec<(DevicePtr, usize)> {
        let mut v: Vec<_> = self
            .live
            .iter()
            .map(|(&a, l)| (DevicePtr(a), l.size))
            .collect();
        v.sort_unstable();
        v
    }

    /// Walks the stream layer's ranges and compares the core's counters
    /// with the memory layer's and the live blocks; panics if an invariant
    /// is broken (for tests; it costs a pass over the live blocks).
    pub fn check_invariants(&self) {
        self.streams.check();
        let s = self.raw.stats();
        assert_eq!(s.reserved, self.raw.memory().inner().mapped());
        let live: usize = self.live.values().map(|l| l.size).sum();
        assert_eq!(live + self.stranded_bytes, s.in_use);
    }
}

impl Drop for DeviceArena {
    fn drop(&mut self) {
        // The core releases the memory when it drops (after this); events
        // go first.
        self.streams.destroy(self.driver.as_ref());
    }
}
