//! Helpers shared by the test modules.

use std::sync::Arc;
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
