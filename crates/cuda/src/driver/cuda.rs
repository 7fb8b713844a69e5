//! [`CudaDriver`]: the CUDA driver (`libcuda.so`), loaded at run time by
//! `cudarc` (`dynamic-loading`, bindings of CUDA 13.0).

use super::{
    check_owner, next_driver_id, DevicePtr, Driver, DriverError, EventHandle, PhysHandle, Stream,
    CUDA_ERROR_INVALID_VALUE,
};
use crate::CudaError;
use cudarc::driver::sys;

/// What the loader looks for, for error messages.
pub(crate) const LOOKED_FOR: &str =
    "libcuda.so (also libcuda.so.1 and the other names cudarc tries) on the dynamic loader's path (LD_LIBRARY_PATH, ldconfig)";

/// The real driver for one device: its primary context, retained while the
/// driver lives, made current around each call that needs it (and the
/// caller's context restored after).
#[derive(Debug)]
pub struct CudaDriver {
    /// Unique in the process; the handles it makes carry it.
    id: u64,
    device: sys::CUdevice,
    /// The primary context (`CUcontext`) as a number: a handle the driver
    /// owns, valid until released in `Drop`.
    ctx: usize,
    granularity: usize,
    total: usize,
}

fn check(call: &'static str, r: sys::CUresult) -> Result<(), DriverError> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(DriverError::new(call, r as i32, format!("{r:?}")))
    }
}

impl CudaDriver {
    /// Loads the driver and opens device `ordinal`'s primary context.
    ///
    /// # Errors
    /// [`CudaError::DriverNotFound`] when `libcuda.so` cannot be loaded or
    /// lacks the CUDA 13.0 functions; [`CudaError::Driver`] when
    /// initialising the driver or the device fails (no such device, say).
    pub fn new(ordinal: i32) -> Result<Self, CudaError> {
        let too_old = || {
            CudaError::DriverNotFound {
            looked_for: LOOKED_FOR.into(),
            reason: "found, but it lacks functions of CUDA 13.0 (a driver of release 580 or newer is needed)".into(),
        }
        };
        // cudarc panics when a function of its bindings is missing from the
        // library (a driver older than CUDA 13.0), in both calls below:
        // turn that into an error.
        let present = std::panic::catch_unwind(|| {
            // SAFETY: opens the library (dlopen) and resolves its functions
            // to see whether it loads; nothing is called.
            unsafe { sys::is_culib_present() }
        });
        match present {
            Ok(true) => {}
            Ok(false) => {
                return Err(CudaError::DriverNotFound {
                    looked_for: LOOKED_FOR.into(),
                    reason: "not found".into(),
                })
            }
            Err(_) => return Err(too_old()),
        }
        let loaded = std::panic::catch_unwind(|| {
            // SAFETY: loads the library and resolves its functions; nothing
            // is called.
            unsafe { sys::culib() };
        });
        if loaded.is_err() {
            return Err(too_old());
        }
        // SAFETY: cuInit takes flags 0 and may be called any number of times.
        check("cuInit", unsafe { sys::cuInit(0) })?;
        let mut device: sys::CUdevice = 0;
        // SAFETY: `device` is a valid out-pointer.
        check("cuDeviceGet", unsafe {
            sys::cuDeviceGet(&mut device, ordinal)
        })?;
        let mut ctx: sys::CUcontext = core::ptr::null_mut();
        // SAFETY: `ctx` is a valid out-pointer and `device` a device handle.
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut ctx, device)
        })?;
        let mut driver = Self {
            id: next_driver_id(),
            device,
            ctx: ctx as usize,
            granularity: 0,
            total: 0,
        };
        let prop = driver.prop();
        let (total, granularity) = driver.in_ctx(|| {
            let mut total = 0usize;
            // SAFETY: `total` is a valid out-pointer.
            check("cuDeviceTotalMem", unsafe {
                sys::cuDeviceTotalMem_v2(&mut total, device)
            })?;
            let mut granularity = 0usize;
            // SAFETY: valid out-pointer and property struct.
            check("cuMemGetAllocationGranularity", unsafe {
                sys::cuMemGetAllocationGranularity(
                    &mut granularity,
                    &prop,
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
                )
            })?;
            Ok((total, granularity))
        })?;
        if !granularity.is_power_of_two() {
            return Err(CudaError::Driver(DriverError::new(
                "cuMemGetAllocationGranularity",
                0,
                format!("granularity {granularity} is not a power of two"),
            )));
        }
        driver.granularity = granularity;
        driver.total = total;
        Ok(driver)
    }

    /// The properties of the device's physical allocations: pinned device
    /// memory, no shareable handle.
    fn prop(&self) -> sys::CUmemAllocationProp {
        sys::CUmemAllocationProp {
            type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: self.device,
            },
            win32HandleMetaData: core::ptr::null_mut(),
            allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
                compressionType: 0,
                gpuDirectRDMACapable: 0,
                usage: 0,
                reserved: [0; 4],
            },
        }
    }

    /// Runs `f` with this device's primary context current, then restores
    /// the caller's.
    fn in_ctx<T>(&self, f: impl FnOnce() -> Result<T, DriverError>) -> Result<T, DriverError> {
        let mut current: sys::CUcontext = core::ptr::null_mut();
        // SAFETY: `current` is a valid out-pointer.
        check("cuCtxGetCurrent", unsafe {
            sys::cuCtxGetCurrent(&mut current)
        })?;
        let ours = self.ctx as sys::CUcontext;
        if current == ours {
            return f();
        }
        // SAFETY: `ours` is the retained primary context, live until Drop.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ours) })?;
        let out = f();
        // SAFETY: `current` is what was current (possibly null: none).
        let restored = check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(current) });
        let out = out?;
        restored.map(|()| out)
    }
}

impl Drop for CudaDriver {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `new`; nothing uses the context after.
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.device) };
    }
}

impl Driver for CudaDriver {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn id(&self) -> u64 {
        self.id
    }

    fn granularity(&self) -> Result<usize, DriverError> {
        Ok(self.granularity)
    }

    fn total_memory(&self) -> Result<usize, DriverError> {
        Ok(self.total)
    }

    fn address_reserve(&self, len: usize, align: usize) -> Result<DevicePtr, DriverError> {
        self.in_ctx(|| {
            let mut ptr: sys::CUdeviceptr = 0;
            // SAFETY: valid out-pointer; the driver checks size and alignment.
            check("cuMemAddressReserve", unsafe {
                sys::cuMemAddressReserve(&mut ptr, len, align, 0, 0)
            })?;
            Ok(DevicePtr(ptr))
        })
    }

    unsafe fn address_free(&self, ptr: DevicePtr, len: usize) -> Result<(), DriverError> {
        self.in_ctx(|| {
            // SAFETY: a whole reservation of this driver with nothing mapped
            // (the caller's obligation); the driver checks it too.
            check("cuMemAddressFree", unsafe {
                sys::cuMemAddressFree(ptr.0, len)
            })
        })
    }

    fn mem_create(&self, len: usize) -> Result<PhysHandle, DriverError> {
        let prop = self.prop();
        self.in_ctx(|| {
            let mut h: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: valid out-pointer and property struct.
            check("cuMemCreate", unsafe {
                sys::cuMemCreate(&mut h, len, &prop, 0)
            })?;
            Ok(PhysHandle {
                raw: h,
                driver: self.id,
            })
        })
    }

    fn mem_release(&self, handle: PhysHandle) -> Result<(), DriverError> {
        check_owner("cuMemRelease", self.id, handle.driver)?;
        // SAFETY: `handle` was made by `mem_create` of this driver (checked
        // just above; the type cannot be forged outside the crate) and is
        // consumed here, so it is released once.
        self.in_ctx(|| check("cuMemRelease", unsafe { sys::cuMemRelease(handle.raw) }))
    }

    unsafe fn mem_map(
        &self,
        ptr: DevicePtr,
        len: usize,
        handle: &PhysHandle,
    ) -> Result<(), DriverError> {
        check_owner("cuMemMap", self.id, handle.driver)?;
        self.in_ctx(|| {
            // SAFETY: a live handle of this driver (checked; not released:
            // `mem_release` consumes it); the range is free space of this
            // driver's reservation (the caller's obligation).
            check("cuMemMap", unsafe {
                sys::cuMemMap(ptr.0, len, 0, handle.raw, 0)
            })
        })
    }

    unsafe fn mem_unmap(&self, ptr: DevicePtr, len: usize) -> Result<(), DriverError> {
        // SAFETY: whole mappings of this driver that nothing uses any more
        // (the caller's obligation).
        self.in_ctx(|| check("cuMemUnmap", unsafe { sys::cuMemUnmap(ptr.0, len) }))
    }

    unsafe fn set_access(&self, ptr: DevicePtr, len: usize) -> Result<(), DriverError> {
        let desc = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: self.device,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        self.in_ctx(|| {
            // SAFETY: one valid descriptor; memory this driver mapped (the
            // caller's obligation).
            check("cuMemSetAccess", unsafe {
                sys::cuMemSetAccess(ptr.0, len, &desc, 1)
            })
        })
    }

    fn synchronize(&self) -> Result<(), DriverError> {
        // SAFETY: no arguments; the context is current.
        self.in_ctx(|| check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() }))
    }

    fn event_create(&self) -> Result<EventHandle, DriverError> {
        self.in_ctx(|| {
            let mut e: sys::CUevent = core::ptr::null_mut();
            let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
            // SAFETY: valid out-pointer.
            check("cuEventCreate", unsafe {
                sys::cuEventCreate(&mut e, flags)
            })?;
            Ok(EventHandle {
                raw: e as usize as u64,
                driver: self.id,
            })
        })
    }

    fn event_destroy(&self, event: EventHandle) -> Result<(), DriverError> {
        check_owner("cuEventDestroy", self.id, event.driver)?;
        let e = event.raw as usize as sys::CUevent;
        // SAFETY: a live event of this driver (checked), consumed here, so
        // destroyed once.
        self.in_ctx(|| check("cuEventDestroy", unsafe { sys::cuEventDestroy_v2(e) }))
    }

    fn event_record(&self, event: &EventHandle, stream: Stream) -> Result<(), DriverError> {
        check_owner("cuEventRecord", self.id, event.driver)?;
        let s = real_stream("cuEventRecord", stream)?;
        let e = event.raw as usize as sys::CUevent;
        // SAFETY: a live event of this driver (checked; destroying consumes
        // it); `stream` is live by the invariant of `Stream`, and not a
        // simulated one (checked).
        self.in_ctx(|| check("cuEventRecord", unsafe { sys::cuEventRecord(e, s) }))
    }

    fn event_query(&self, event: &EventHandle) -> Result<bool, DriverError> {
        check_owner("cuEventQuery", self.id, event.driver)?;
        let e = event.raw as usize as sys::CUevent;
        self.in_ctx(|| {
            // SAFETY: a live event of this driver (checked).
            match unsafe { sys::cuEventQuery(e) } {
                sys::CUresult::CUDA_SUCCESS => Ok(true),
                sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
                r => check("cuEventQuery", r).map(|()| false),
            }
        })
    }

    fn stream_wait_event(&self, stream: Stream, event: &EventHandle) -> Result<(), DriverError> {
        check_owner("cuStreamWaitEvent", self.id, event.driver)?;
        let s = real_stream("cuStreamWaitEvent", stream)?;
        let e = event.raw as usize as sys::CUevent;
        self.in_ctx(|| {
            // SAFETY: a live event of this driver (checked); `stream` is live
            // by the invariant of `Stream`, and not a simulated one.
            check("cuStreamWaitEvent", unsafe {
                sys::cuStreamWaitEvent(s, e, 0)
            })
        })
    }
}

/// `stream` as the driver's handle, or an error for a stream of the
/// simulated driver (its values are no driver handles).
pub(crate) fn real_stream(
    call: &'static str,
    stream: Stream,
) -> Result<sys::CUstream, DriverError> {
    if stream.is_simulated() {
        return Err(DriverError::new(
            call,
            CUDA_ERROR_INVALID_VALUE,
            "a stream of the simulated driver",
        ));
    }
    Ok(stream.raw() as usize as sys::CUstream)
}

#[cfg(test)]
mod tests {
    //! The real driver's refusals run before any driver call, so they are
    //! tested without a GPU.
    use super::*;
    use crate::driver::{SimConfig, SimDriver};

    #[test]
    fn a_simulated_stream_never_reaches_the_driver() {
        let sim = SimDriver::new(SimConfig::default());
        for s in [sim.stream(), sim.stream(), sim.stream()] {
            let err = real_stream("cuEventRecord", s).unwrap_err();
            assert_eq!(err.code, CUDA_ERROR_INVALID_VALUE);
            assert!(err.detail.contains("simulated"), "{err}");
        }
        assert!(real_stream("cuEventRecord", Stream::DEFAULT)
            .unwrap()
            .is_null());
        // SAFETY: a host stream value, never passed to a driver here.
        let host = unsafe { Stream::from_raw(0x1234) };
        assert_eq!(
            real_stream("cuStreamWaitEvent", host).unwrap() as usize,
            0x1234
        );
    }

    #[test]
    fn a_handle_of_another_driver_never_reaches_the_driver() {
        let sim = SimDriver::new(SimConfig::default());
        let e = sim.event_create().unwrap();
        // A real driver has an id of its own, never the simulated one's.
        let real_id = next_driver_id();
        let err = check_owner("cuEventRecord", real_id, e.driver).unwrap_err();
        assert_eq!(err.code, CUDA_ERROR_INVALID_VALUE);
        assert!(check_owner("cuEventRecord", sim.id(), e.driver).is_ok());
        sim.event_destroy(e).unwrap();
    }
}
