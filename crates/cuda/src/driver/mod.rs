//! The CUDA driver calls the device layer makes, behind one trait with two
//! implementations: [`CudaDriver`] (the real driver, `libcuda.so` loaded at
//! run time through `cudarc`) and [`SimDriver`] (host memory behind the same
//! calls, every precondition checked as the driver would).

mod cuda;
mod sim;

pub use cuda::CudaDriver;
pub use sim::{SimCalls, SimConfig, SimDriver};

use core::fmt;

/// A device address (`CUdeviceptr`). The host never reads or writes through it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The address `bytes` further on; `None` past the end of the address space.
    pub fn checked_add(self, bytes: usize) -> Option<Self> {
        self.0.checked_add(bytes as u64).map(Self)
    }
}

impl fmt::Display for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// A CUDA stream (`CUstream` / `cudaStream_t`) of the driver's context.
///
/// Invariant: the value is 0 (the legacy default stream), or a stream handle
/// the host runtime created in the device's context and has not destroyed.
/// The only ways to make one are [`Stream::DEFAULT`] and the unsafe
/// [`Stream::from_raw`]; the simulated driver makes its own with
/// [`SimDriver::stream`], marked as simulated, and the real driver refuses
/// those with an error instead of passing them on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stream {
    raw: u64,
    /// 0 for a stream of the host runtime; the simulated driver's id for
    /// one of [`SimDriver::stream`].
    sim: u64,
}

impl Stream {
    /// The legacy default stream (handle 0).
    pub const DEFAULT: Stream = Stream { raw: 0, sim: 0 };

    /// Wraps a raw stream handle from the host runtime.
    ///
    /// # Safety
    /// - `raw` is 0 or a live stream of the context of the device the arena
    ///   using it serves, and stays live while blocks freed on it may be
    ///   reused (the real driver dereferences it);
    /// - with the simulated driver any value is fine.
    pub const unsafe fn from_raw(raw: u64) -> Self {
        Self { raw, sim: 0 }
    }

    /// A simulated stream of the simulated driver `sim` (never 0).
    pub(crate) const fn simulated(raw: u64, sim: u64) -> Self {
        Self { raw, sim }
    }

    /// The raw handle.
    pub const fn raw(self) -> u64 {
        self.raw
    }

    /// Whether the simulated driver made it ([`SimDriver::stream`]): the
    /// real driver refuses such a stream.
    pub const fn is_simulated(self) -> bool {
        self.sim != 0
    }
}

/// A physical allocation (`CUmemGenericAllocationHandle`); made only by a
/// driver of this crate, which it names, and neither `Copy` nor `Clone`:
/// [`Driver::mem_release`] takes it, so it cannot be released twice or used
/// after.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct PhysHandle {
    pub(crate) raw: u64,
    /// [`Driver::id`] of the driver that made it.
    pub(crate) driver: u64,
}

/// An event (`CUevent`); made only by a driver of this crate, which it
/// names, and neither `Copy` nor `Clone`: [`Driver::event_destroy`] takes
/// it, so a destroyed event cannot be destroyed again or recorded.
///
/// ```compile_fail
/// use tensor_arena_cuda::driver::{Driver, SimDriver, SimConfig};
/// let d = SimDriver::new(SimConfig::default());
/// let e = d.event_create().unwrap();
/// d.event_destroy(e).unwrap();
/// d.event_destroy(e).unwrap(); // used after being moved
/// ```
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct EventHandle {
    pub(crate) raw: u64,
    /// [`Driver::id`] of the driver that made it.
    pub(crate) driver: u64,
}

/// Ids of driver instances ([`Driver::id`]), from 1.
pub(crate) fn next_driver_id() -> u64 {
    static NEXT: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, core::sync::atomic::Ordering::Relaxed)
}

/// The refusal of a handle another driver made: checked before any call.
pub(crate) fn check_owner(
    call: &'static str,
    id: u64,
    handle_driver: u64,
) -> Result<(), DriverError> {
    if handle_driver == id {
        Ok(())
    } else {
        Err(DriverError::new(
            call,
            CUDA_ERROR_INVALID_VALUE,
            format!("a handle of another driver (driver {handle_driver}, not {id})"),
        ))
    }
}

/// A failed driver call: which call and the `CUresult`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverError {
    /// The driver function, e.g. `"cuMemCreate"`.
    pub call: &'static str,
    /// The `CUresult` code (2 = `CUDA_ERROR_OUT_OF_MEMORY`).
    pub code: i32,
    /// What went wrong, in words.
    pub detail: String,
}

/// `CUDA_ERROR_INVALID_VALUE`.
pub const CUDA_ERROR_INVALID_VALUE: i32 = 1;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const CUDA_ERROR_OUT_OF_MEMORY: i32 = 2;
/// `CUDA_ERROR_NOT_READY` (an event not reached yet; not a failure).
pub const CUDA_ERROR_NOT_READY: i32 = 600;

impl DriverError {
    pub(crate) fn new(call: &'static str, code: i32, detail: impl Into<String>) -> Self {
        Self {
            call,
            code,
            detail: detail.into(),
        }
    }

    /// Whether the driver ran out of device memory.
    pub fn is_out_of_memory(&self) -> bool {
        self.code == CUDA_ERROR_OUT_OF_MEMORY
    }
}

impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed with CUresult {}", self.call, self.code)?;
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

impl std::error::Error for DriverError {}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::CudaDriver {}
    impl Sealed for super::SimDriver {}
}

/// The driver calls of the device layer, one method per driver function.
///
/// Sealed: the handles it passes around ([`PhysHandle`], [`EventHandle`])
/// are made only by the two drivers of this crate and name the driver
/// instance that made them; each method refuses another driver's handle
/// with an error before any call, and handles are consumed when destroyed,
/// so safe code cannot hand the real driver a forged, foreign or destroyed
/// one. Calls on address ranges the caller must vouch for are `unsafe`.
/// Every method takes `&self` (the real driver keeps no state; the
/// simulated one locks its own).
pub trait Driver: sealed::Sealed + Send + Sync + fmt::Debug {
    /// `"cuda"` or `"simulated"`.
    fn name(&self) -> &'static str;
    /// This driver's id, unique in the process; its handles carry it.
    fn id(&self) -> u64;
    /// The device's allocation granularity (`cuMemGetAllocationGranularity`,
    /// recommended): a power of two, 2 MiB on current GPUs.
    fn granularity(&self) -> Result<usize, DriverError>;
    /// The device's memory in bytes (`cuDeviceTotalMem`).
    fn total_memory(&self) -> Result<usize, DriverError>;
    /// `cuMemAddressReserve`: `len` bytes of address space aligned to `align`.
    fn address_reserve(&self, len: usize, align: usize) -> Result<DevicePtr, DriverError>;
    /// `cuMemAddressFree` of a whole reservation (nothing mapped in it).
    ///
    /// # Safety
    /// - `ptr..ptr + len` is a whole reservation this driver made
    ///   ([`Driver::address_reserve`]) and has not freed, with nothing
    ///   mapped in it.
    unsafe fn address_free(&self, ptr: DevicePtr, len: usize) -> Result<(), DriverError>;
    /// `cuMemCreate`: `len` bytes of physical memory on the device.
    fn mem_create(&self, len: usize) -> Result<PhysHandle, DriverError>;
    /// `cuMemRelease` (the memory goes once it is unmapped too).
    fn mem_release(&self, handle: PhysHandle) -> Result<(), DriverError>;
    /// `cuMemMap` of all of `handle` (`len` bytes) at `ptr`.
    ///
    /// # Safety
    /// - `ptr..ptr + len` lies in a reservation this driver made and has
    ///   not freed, and nothing is mapped there.
    unsafe fn mem_map(
        &self,
        ptr: DevicePtr,
        len: usize,
        handle: &PhysHandle,
    ) -> Result<(), DriverError>;
    /// `cuMemUnmap` of whole mappings covering `ptr..ptr + len`.
    ///
    /// # Safety
    /// - `ptr..ptr + len` covers whole mappings this driver made
    ///   ([`Driver::mem_map`]) in its own reservation, and no work queued
    ///   on the device and no live block uses that memory any more.
    unsafe fn mem_unmap(&self, ptr: DevicePtr, len: usize) -> Result<(), DriverError>;
    /// `cuMemSetAccess`: read and write for the device, over mapped memory.
    ///
    /// # Safety
    /// - `ptr..ptr + len` covers memory this driver mapped in its own
    ///   reservation.
    unsafe fn set_access(&self, ptr: DevicePtr, len: usize) -> Result<(), DriverError>;
    /// `cuCtxSynchronize`: waits for all work of the context.
    fn synchronize(&self) -> Result<(), DriverError>;
    /// `cuEventCreate` (timing disabled).
    fn event_create(&self) -> Result<EventHandle, DriverError>;
    /// `cuEventDestroy`.
    fn event_destroy(&self, event: EventHandle) -> Result<(), DriverError>;
    /// `cuEventRecord`: the event completes when the work queued on `stream`
    /// so far has.
    fn event_record(&self, event: &EventHandle, stream: Stream) -> Result<(), DriverError>;
    /// `cuEventQuery`: whether the event has completed.
    fn event_query(&self, event: &EventHandle) -> Result<bool, DriverError>;
    /// `cuStreamWaitEvent`: work queued on `stream` from now on waits for
    /// the event (on the device; the host does not block).
    fn stream_wait_event(&self, stream: Stream, event: &EventHandle) -> Result<(), DriverError>;
}
