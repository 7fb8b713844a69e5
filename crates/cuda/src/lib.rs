#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod arena;
pub mod driver;
mod ffi;
mod ffi_plans;
mod memory;
pub mod ort_cuda;
mod plan_store;
mod stats_parity;
mod streams;

pub use arena::{DeviceArena, DeviceConfig, DeviceStats, DEVICE_ALIGN};
pub use driver::{DevicePtr, Driver, DriverError, SimConfig, SimDriver, Stream};
#[doc(hidden)]
pub use ffi::panic_in_caller_lookup as __panic_in_caller_lookup_for_tests;
pub use memory::{DeviceCalls, DeviceMemory};
pub use plan_store::{plan_store_key, RUNTIME};
pub use stats_parity::TorchStats;
pub use streams::StreamStats;

use core::fmt;
use tensor_arena::ArenaError;

/// What can go wrong on the device.
#[derive(Debug)]
pub enum CudaError {
    /// The CUDA driver library could not be loaded (no NVIDIA driver on
    /// this machine, or one too old).
    DriverNotFound {
        /// What was looked for, and where.
        looked_for: String,
        /// Why it could not be used.
        reason: String,
    },
    /// A driver call failed.
    Driver(DriverError),
    /// The arena refused (out of device memory, over its cap, bad
    /// configuration, a run already open).
    Arena(ArenaError),
    /// Device memory could not be mapped (out of device memory, say):
    /// the driver's own error. (The core's `ArenaError::CommitFailed`
    /// would print the driver's code as an OS error number.)
    DeviceMemory {
        /// Bytes requested.
        requested: usize,
        /// What the driver said.
        driver: DriverError,
    },
    /// A zero-byte request (the C ABI answers it with a null pointer).
    ZeroSize,
    /// A pointer that is not a live block of the arena.
    UnknownPointer {
        /// The address.
        ptr: u64,
    },
    /// `end_run` with no run open.
    NoRun,
    /// A device ordinal the C ABI does not serve (negative, or past 63).
    BadDevice {
        /// The ordinal given.
        device: i32,
    },
    /// ONNX Runtime's external allocator, with its compute stream unknown,
    /// and a caller on a stream of its own (PyTorch's entries, the ctypes
    /// layer) would share one device's arena: a block one frees could be
    /// handed to the other with nothing ordering their kernels. Give ONNX
    /// Runtime its stream first ([`ort_cuda::set_stream`]).
    UnorderedSharing {
        /// The device.
        device: i32,
        /// The caller refused now.
        asking: &'static str,
        /// The other kind of caller, which allocated from the arena before.
        earlier: &'static str,
    },
    /// A plan store could not be used: its directory is missing or not a
    /// directory, its file was refused (corrupt, another format version,
    /// another model's or setting's: one line says which), or it could not
    /// be written. Nothing was loaded.
    PlanStore(String),
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DriverNotFound { looked_for, reason } => {
                write!(
                    f,
                    "CUDA driver not usable: looked for {looked_for}: {reason}"
                )
            }
            Self::Driver(e) => write!(f, "{e}"),
            Self::Arena(e) => write!(f, "{e}"),
            Self::DeviceMemory { requested, driver } => write!(
                f,
                "could not map device memory for a request of {requested} bytes: {driver}"
            ),
            Self::ZeroSize => f.write_str("zero-byte device allocation"),
            Self::UnknownPointer { ptr } => {
                write!(f, "{ptr:#x} is not a live block of this arena")
            }
            Self::NoRun => f.write_str("no run is open"),
            Self::BadDevice { device } => {
                write!(f, "device ordinal {device} is out of range 0..64")
            }
            Self::UnorderedSharing {
                device,
                asking,
                earlier,
            } => write!(
                f,
                "device {device}'s arena refused {asking}: {earlier} allocated from it \
                 before, and a block one frees could reach the other with nothing ordering \
                 their kernels. Give ONNX Runtime its stream before its first allocation \
                 (ort_cuda::set_stream, tensor_arena_cuda_ort_set_stream, or stream= in \
                 Python's ort_cuda_provider_options, which sets user_compute_stream); \
                 given once ONNX Runtime holds no block, the device is synchronised and \
                 its allocations without a stream are forgotten"
            ),
            Self::PlanStore(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for CudaError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Driver(e) | Self::DeviceMemory { driver: e, .. } => Some(e),
            Self::Arena(e) => Some(e),
            _ => None,
        }
    }
}

impl From<DriverError> for CudaError {
    fn from(e: DriverError) -> Self {
        Self::Driver(e)
    }
}

impl From<ArenaError> for CudaError {
    fn from(e: ArenaError) -> Self {
        Self::Arena(e)
    }
}
