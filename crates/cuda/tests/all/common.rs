//! Helpers shared by the test modules.

use std::sync::Arc;
use tensor_arena_cuda::driver::{DevicePtr, Driver, DriverError, PhysHandle};
use tensor_arena_cuda::{DeviceArena, DeviceConfig, SimConfig, SimDriver};

/// 64 KiB granules, 64 MiB of device memory: small enough for many cases.
pub const SMALL: SimConfig = SimConfig {
    granularity: 64 << 10,
    memory: 64 << 20,
};

/// An arena over a fresh simulated device, and a handle on that device.
pub fn sim_arena(sim: SimConfig, config: DeviceConfig) -> (DeviceArena, SimDriver) {
    let driver = SimDriver::new(sim);
    let arena = DeviceArena::new(Arc::new(driver.clone()), config).expect("arena");
    (arena, driver)
}

/// Checks that a dropped arena's device holds nothing.
pub fn assert_device_clean(sim: &SimDriver) {
    assert_eq!(sim.mapped_bytes(), 0, "bytes still mapped");
    assert_eq!(sim.physical_bytes(), 0, "physical memory still held");
    assert_eq!(sim.reservations(), 0, "address space still reserved");
    assert_eq!(sim.live_events(), 0, "events not destroyed");
    let c = sim.calls();
    assert_eq!(c.created, c.released, "creates and releases");
    assert_eq!(c.mappings_made, c.mappings_removed, "maps and unmaps");
    assert_eq!(c.address_reserve, c.address_free, "reserves and frees");
    assert!(sim.hazards().is_empty(), "hazards: {:?}", sim.hazards());
}

// The simulated driver checks every precondition of its unsafe calls itself
// (returning `CUDA_ERROR_INVALID_VALUE`) and maps no memory of the real
// device, so the wrappers below may pass it anything: that is what its
// tests do.

/// `address_free` on the simulated driver.
pub fn sim_free(d: &SimDriver, p: DevicePtr, len: usize) -> Result<(), DriverError> {
    // SAFETY: the simulated driver checks the range; nothing real is freed.
    unsafe { d.address_free(p, len) }
}

/// `mem_map` on the simulated driver.
pub fn sim_map(d: &SimDriver, p: DevicePtr, len: usize, h: &PhysHandle) -> Result<(), DriverError> {
    // SAFETY: as above: checked by the simulation, host memory only.
    unsafe { d.mem_map(p, len, h) }
}

/// `mem_unmap` on the simulated driver.
pub fn sim_unmap(d: &SimDriver, p: DevicePtr, len: usize) -> Result<(), DriverError> {
    // SAFETY: as above.
    unsafe { d.mem_unmap(p, len) }
}

/// `set_access` on the simulated driver.
pub fn sim_access(d: &SimDriver, p: DevicePtr, len: usize) -> Result<(), DriverError> {
    // SAFETY: as above.
    unsafe { d.set_access(p, len) }
}
