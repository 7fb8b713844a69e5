//! [`DeviceMemory`]: the arena's memory layer over CUDA virtual memory.

use crate::driver::{DevicePtr, Driver, DriverError, PhysHandle};
use core::cell::Cell;
use std::sync::Arc;
use tensor_arena::memory::{MemoryError, MemoryOp, MemoryProps};
use tensor_arena::Memory;

/// Driver calls a [`DeviceMemory`] made, by driver function.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCalls {
    /// `cuMemAddressReserve`.
    pub address_reserve: u64,
    /// `cuMemAddressFree`.
    pub address_free: u64,
    /// `cuMemCreate`: one per granule committed.
    pub mem_create: u64,
    /// `cuMemRelease`: one per granule decommitted.
    pub mem_release: u64,
    /// `cuMemMap`.
    pub mem_map: u64,
    /// `cuMemUnmap`.
    pub mem_unmap: u64,
    /// `cuMemSetAccess`: one per commit.
    pub set_access: u64,
    /// `cuCtxSynchronize`: one per decommit or release.
    pub synchronize: u64,
    /// Calls that failed.
    pub failed: u64,
}

impl DeviceCalls {
    /// Every call.
    pub fn total(&self) -> u64 {
        self.address_reserve
            + self.address_free
            + self.mem_create
            + self.mem_release
            + self.mem_map
            + self.mem_unmap
            + self.set_access
            + self.synchronize
    }
}

/// One reservation and the physical chunk mapped at each of its granules.
#[derive(Debug)]
struct Range {
    base: DevicePtr,
    len: usize,
    /// By granule index; `Some` where a chunk is mapped.
    chunks: Vec<Option<PhysHandle>>,
}

/// Device memory through CUDA virtual memory management.
///
/// | arena call | driver calls |
/// |---|---|
/// | reserve | `cuMemAddressReserve` (once per arena; the device's memory size, or the arena's cap) |
/// | commit `n` granules | `n` × (`cuMemCreate` + `cuMemMap`), then one `cuMemSetAccess` over the range |
/// | decommit `n` granules | `cuCtxSynchronize` (queued work may still use them), then `n` × (`cuMemUnmap` + `cuMemRelease`) |
/// | release | as decommit for every mapped granule, then `cuMemAddressFree` |
///
/// Each granule has its own physical chunk because the driver unmaps only
/// whole mappings: so any free granule can be given back on its own.
/// Fresh memory is not zeroed and the host cannot touch it
/// ([`MemoryProps`]). The granule is the driver's recommended allocation
/// granularity (2 MiB on current GPUs).
#[derive(Debug)]
pub struct DeviceMemory {
    driver: Arc<dyn Driver>,
    granule: usize,
    /// Address space reserved per arena with no cap.
    reservation: usize,
    ranges: Vec<Range>,
    /// Bytes mapped now.
    mapped: usize,
    /// Most bytes mapped since the last [`DeviceMemory::reset_peak`].
    peak: Cell<usize>,
    /// Most bytes mapped since the last [`DeviceMemory::reset_reserved_peak`]
    /// (the user's window, as PyTorch's `reset_peak_memory_stats`; `peak`
    /// is the arena's own, per run).
    reserved_peak: Cell<usize>,
    calls: DeviceCalls,
    last_error: Option<DriverError>,
}

impl DeviceMemory {
    /// A layer over `driver`, reserving `reservation` bytes of address space
    /// per arena (0: twice the device's memory, so that growth at the top
    /// of a fragmented range still finds addresses; address space costs no
    /// memory).
    ///
    /// # Errors
    /// The driver's, when it cannot say its granularity or memory size.
    pub fn new(driver: Arc<dyn Driver>, reservation: usize) -> Result<Self, DriverError> {
        let granule = driver.granularity()?;
        let reservation = match reservation {
            0 => driver.total_memory()?.saturating_mul(2),
            r => r,
        };
        Ok(Self {
            driver,
            granule,
            reservation: reservation.next_multiple_of(granule),
            ranges: Vec::new(),
            mapped: 0,
            peak: Cell::new(0),
            reserved_peak: Cell::new(0),
            calls: DeviceCalls::default(),
            last_error: None,
        })
    }

    /// The driver.
    pub fn driver(&self) -> &Arc<dyn Driver> {
        &self.driver
    }

    /// Driver calls so far.
    pub fn calls(&self) -> DeviceCalls {
        self.calls
    }

    /// Bytes mapped now.
    pub fn mapped(&self) -> usize {
        self.mapped
    }

    /// Most bytes mapped at once since the last [`DeviceMemory::reset_peak`].
    pub fn peak(&self) -> usize {
        self.peak.get()
    }

    /// Starts a new peak window at the bytes mapped now.
    pub fn reset_peak(&self) {
        self.peak.set(self.mapped);
    }

    /// Most bytes mapped at once since the last
    /// [`DeviceMemory::reset_reserved_peak`] (or since it was made).
    pub fn reserved_peak(&self) -> usize {
        self.reserved_peak.get()
    }

    /// Starts a new window for [`DeviceMemory::reserved_peak`] at the
    /// bytes mapped now.
    pub fn reset_reserved_peak(&self) {
        self.reserved_peak.set(self.mapped);
    }

    /// The last driver error, if any call failed.
    pub fn last_error(&self) -> Option<&DriverError> {
        self.last_error.as_ref()
    }

    fn failed(&mut self, op: MemoryOp, bytes: usize, e: DriverError) -> MemoryError {
        self.calls.failed += 1;
        let code = Some(tensor_arena::memory::ErrorCode::Driver(e.code));
        self.last_error = Some(e);
        MemoryError { op, bytes, code }
    }

    fn range_index(&self, base: DevicePtr) -> Option<usize> {
        self.ranges.iter().position(|r| r.base == base)
    }

    /// Maps a fresh chunk at granule `i` of range `ri`.
    fn map_chunk(&mut self, ri: usize, i: usize) -> Result<(), DriverError> {
        let g = self.granule;
        let ptr = DevicePtr(self.ranges[ri].base.0 + (i * g) as u64);
        self.calls.mem_create += 1;
        let h = self.driver.mem_create(g)?;
        self.calls.mem_map += 1;
        // SAFETY: granule `i` lies in range `ri`, a reservation this layer's
        // driver made and has not freed, and nothing is mapped there (its
        // chunk slot is empty: the arena commits only what is not
        // committed).
        if let Err(e) = unsafe { self.driver.mem_map(ptr, g, &h) } {
            self.calls.mem_release += 1;
            let _ = self.driver.mem_release(h);
            return Err(e);
        }
        self.ranges[ri].chunks[i] = Some(h);
        self.mapped += g;
        self.peak.set(self.peak.get().max(self.mapped));
        self.reserved_peak
            .set(self.reserved_peak.get().max(self.mapped));
        Ok(())
    }

    /// Unmaps and releases the chunk at granule `i` of range `ri`, if any.
    fn unmap_chunk(&mut self, ri: usize, i: usize) -> Result<(), DriverError> {
        let g = self.granule;
        if self.ranges[ri].chunks[i].is_none() {
            return Ok(());
        }
        let ptr = DevicePtr(self.ranges[ri].base.0 + (i * g) as u64);
        self.calls.mem_unmap += 1;
        // SAFETY: the chunk at granule `i` is one whole mapping this layer
        // made (`map_chunk`) in its own reservation; the callers unmap only
        // memory nothing uses any more (decommit and release synchronise
        // the device first; a failed commit unmaps what it just mapped).
        unsafe { self.driver.mem_unmap(ptr, g) }?;
        let Some(h) = self.ranges[ri].chunks[i].take() else {
            return Ok(());
        };
        self.mapped -= g;
        self.calls.mem_release += 1;
        // Unmapped: the chunk is no longer reachable; a failed release only
        // leaks it.
        if let Err(e) = self.driver.mem_release(h) {
            self.calls.failed += 1;
            self.last_error = Some(e);
        }
        Ok(())
    }

    /// Granules `first..first + n` of the range at `base`, checked.
    fn granules(
        &self,
        base: DevicePtr,
        offset: usize,
        len: usize,
    ) -> Option<(usize, usize, usize)> {
        let g = self.granule;
        let ri = self.range_index(base)?;
        let r = &self.ranges[ri];
        let end = offset.checked_add(len)?;
        (offset % g == 0 && len % g == 0 && end <= r.len).then_some((ri, offset / g, len / g))
    }
}

impl Memory for DeviceMemory {
    type Ptr = DevicePtr;

    fn props(&self) -> MemoryProps {
        MemoryProps {
            granule: self.granule,
            // The granule is already the device's unit (2 MiB).
            huge: 0,
            zeroed: false,
            host_accessible: false,
            committed_on_reserve: false,
        }
    }

    fn reservation_size(&self, min: usize, cap: usize) -> usize {
        if cap != usize::MAX {
            return cap & !(self.granule - 1);
        }
        let want = self.reservation.max(min);
        want.checked_next_multiple_of(self.granule)
            .unwrap_or(want & !(self.granule - 1))
    }

    fn reserve(&mut self, len: usize, align: usize) -> Result<DevicePtr, MemoryError> {
        self.calls.address_reserve += 1;
        let align = align.max(self.granule);
        match self.driver.address_reserve(len, align) {
            Ok(base) => {
                self.ranges.push(Range {
                    base,
                    len,
                    chunks: (0..len / self.granule).map(|_| None).collect(),
                });
                Ok(base)
            }
            Err(e) => Err(self.failed(MemoryOp::Reserve, len, e)),
        }
    }

    fn commit(&mut self, base: DevicePtr, offset: usize, len: usize) -> Result<(), MemoryError> {
        let Some((ri, first, n)) = self.granules(base, offset, len) else {
            let e = DriverError::new("commit", 1, "not whole granules of a reservation");
            return Err(self.failed(MemoryOp::Commit, len, e));
        };
        let mut done = 0;
        let mut result = Ok(());
        while done < n {
            if let Err(e) = self.map_chunk(ri, first + done) {
                result = Err(e);
                break;
            }
            done += 1;
        }
        if result.is_ok() {
            self.calls.set_access += 1;
            // SAFETY: `offset..offset + len` of the range at `base` was just
            // mapped by this layer's driver (every chunk above).
            result = unsafe {
                self.driver
                    .set_access(base.checked_add(offset).expect("in range"), len)
            };
        }
        if let Err(e) = result {
            // As before: give back what this call mapped.
            for i in first..first + done {
                let _ = self.unmap_chunk(ri, i);
            }
            return Err(self.failed(MemoryOp::Commit, len, e));
        }
        Ok(())
    }

    fn decommit(&mut self, base: DevicePtr, offset: usize, len: usize) -> Result<(), MemoryError> {
        let Some((ri, first, n)) = self.granules(base, offset, len) else {
            let e = DriverError::new("decommit", 1, "not whole granules of a reservation");
            return Err(self.failed(MemoryOp::Decommit, len, e));
        };
        // Work queued on any stream may still use these granules.
        self.calls.synchronize += 1;
        if let Err(e) = self.driver.synchronize() {
            return Err(self.failed(MemoryOp::Decommit, len, e));
        }
        for i in first..first + n {
            if let Err(e) = self.unmap_chunk(ri, i) {
                // The arena counts the range as committed: map the granules
                // given back so far again (fresh chunks; they were free).
                for j in first..i {
                    if self.map_chunk(ri, j).is_err() {
                        break;
                    }
                }
                self.calls.set_access += 1;
                // SAFETY: granules `first..i` were just mapped again by this
                // layer's driver (or the access call fails on what is not).
                let _ = unsafe {
                    self.driver.set_access(
                        DevicePtr(base.0 + (first * self.granule) as u64),
                        (i - first) * self.granule,
                    )
                };
                return Err(self.failed(MemoryOp::Decommit, len, e));
            }
        }
        Ok(())
    }

    fn release(&mut self, base: DevicePtr, len: usize, _align: usize) {
        let Some(ri) = self.range_index(base) else {
            return;
        };
        self.calls.synchronize += 1;
        if let Err(e) = self.driver.synchronize() {
            self.calls.failed += 1;
            self.last_error = Some(e);
        }
        for i in 0..self.ranges[ri].chunks.len() {
            if let Err(e) = self.unmap_chunk(ri, i) {
                self.calls.failed += 1;
                self.last_error = Some(e);
            }
        }
        let range = self.ranges.swap_remove(ri);
        debug_assert_eq!(range.len, len);
        self.calls.address_free += 1;
        // SAFETY: the whole reservation this layer's driver made, removed
        // from the layer just above, with every chunk unmapped (a chunk that
        // failed to unmap makes the driver refuse, which is an error, not a
        // hazard).
        if let Err(e) = unsafe { self.driver.address_free(range.base, range.len) } {
            self.calls.failed += 1;
            self.last_error = Some(e);
        }
    }

    fn at(base: DevicePtr, offset: usize) -> DevicePtr {
        DevicePtr(base.0 + offset as u64)
    }

    fn address(ptr: DevicePtr) -> usize {
        ptr.0 as usize
    }
}
