//! The simulated driver checks preconditions as the real one does; the
//! real driver is an `Err`, not a panic, on a machine without one.

use crate::common::{sim_access, sim_free, sim_map, sim_unmap, SMALL};
use tensor_arena_cuda::driver::{DevicePtr, Driver};
use tensor_arena_cuda::{CudaError, DeviceArena, DeviceConfig, SimDriver, Stream};

const G: usize = 64 << 10;

#[test]
fn no_driver_is_a_clear_error() {
    // This machine has no NVIDIA driver (CI, the development container):
    // loading it fails with an error naming the library. On a machine with
    // a GPU the arena opens instead, which is fine too.
    match DeviceArena::cuda(0, DeviceConfig::default()) {
        Err(CudaError::DriverNotFound { looked_for, .. }) => {
            assert!(looked_for.contains("libcuda.so"), "{looked_for}");
            let msg = CudaError::DriverNotFound {
                looked_for,
                reason: "not found".into(),
            }
            .to_string();
            assert!(
                msg.contains("libcuda.so") && msg.contains("not found"),
                "{msg}"
            );
        }
        Err(CudaError::Driver(e)) => {
            // A driver without a usable device.
            assert!(!e.call.is_empty());
        }
        Err(other) => panic!("unexpected error: {other}"),
        Ok(mut arena) => {
            let p = arena
                .alloc(1000, Stream::DEFAULT)
                .expect("alloc on a real GPU");
            arena.free(p, Stream::DEFAULT).expect("free");
        }
    }
}

#[test]
fn reserve_needs_whole_granules() {
    let d = SimDriver::new(SMALL);
    assert!(d.address_reserve(0, 0).is_err());
    assert!(d.address_reserve(G + 1, 0).is_err());
    assert!(d.address_reserve(G, 3).is_err());
    let p = d.address_reserve(4 * G, 1 << 20).unwrap();
    assert_eq!(p.0 % (1 << 20), 0);
    // Only whole reservations are freed.
    assert!(sim_free(&d, p, G).is_err());
    assert!(sim_free(&d, DevicePtr(p.0 + G as u64), 3 * G).is_err());
    sim_free(&d, p, 4 * G).unwrap();
    assert!(sim_free(&d, p, 4 * G).is_err(), "freed twice");
}

#[test]
fn map_only_whole_handles_into_free_reserved_space() {
    let d = SimDriver::new(SMALL);
    let base = d.address_reserve(4 * G, 0).unwrap();
    assert!(d.mem_create(G / 2).is_err(), "not a granule multiple");
    let h = d.mem_create(G).unwrap();
    assert!(
        sim_map(&d, DevicePtr(base.0 + 1), G, &h).is_err(),
        "unaligned"
    );
    assert!(
        sim_map(&d, base, 2 * G, &h).is_err(),
        "size differs from the handle"
    );
    assert!(
        sim_map(&d, DevicePtr(base.0 + 4 * G as u64), G, &h).is_err(),
        "outside the reservation"
    );
    sim_map(&d, base, G, &h).unwrap();
    assert!(sim_map(&d, base, G, &h).is_err(), "mapped twice");
    let h2 = d.mem_create(G).unwrap();
    assert!(sim_map(&d, base, G, &h2).is_err(), "overlaps a mapping");
    // No access yet: the device would fault.
    assert!(d.write(base, &[1, 2, 3]).is_err());
    assert!(sim_access(&d, base, 2 * G).is_err(), "not wholly mapped");
    sim_access(&d, base, G).unwrap();
    d.write(base, &[1, 2, 3]).unwrap();
    assert_eq!(d.read(base, 3).unwrap(), [1, 2, 3]);
    assert!(d.read(base, G + 1).is_err(), "past the mapping");
    // A reservation with mappings is not freed.
    assert!(sim_free(&d, base, 4 * G).is_err());
    // Released while mapped: the memory stays until unmapped.
    d.mem_release(h).unwrap();
    // Released twice: impossible, `mem_release` takes the handle.
    assert_eq!(d.physical_bytes(), 2 * G);
    assert!(sim_unmap(&d, base, G / 2).is_err(), "part of a mapping");
    sim_unmap(&d, base, G).unwrap();
    assert!(sim_unmap(&d, base, G).is_err(), "nothing mapped");
    d.mem_release(h2).unwrap();
    assert_eq!(d.physical_bytes(), 0);
    sim_free(&d, base, 4 * G).unwrap();
}

#[test]
fn unmap_covers_whole_mappings_without_gaps() {
    let d = SimDriver::new(SMALL);
    let base = d.address_reserve(4 * G, 0).unwrap();
    let at = |i: usize| DevicePtr(base.0 + (i * G) as u64);
    let hs: Vec<_> = (0..3).map(|_| d.mem_create(G).unwrap()).collect();
    sim_map(&d, at(0), G, &hs[0]).unwrap();
    sim_map(&d, at(2), G, &hs[2]).unwrap();
    assert!(sim_unmap(&d, at(0), 3 * G).is_err(), "a gap at granule 1");
    sim_map(&d, at(1), G, &hs[1]).unwrap();
    sim_access(&d, at(0), 3 * G).unwrap();
    sim_unmap(&d, at(0), 3 * G).unwrap();
    for h in hs {
        d.mem_release(h).unwrap();
    }
    sim_free(&d, base, 4 * G).unwrap();
    assert_eq!(d.physical_bytes(), 0);
}

#[test]
fn physical_memory_runs_out() {
    let d = SimDriver::new(SMALL);
    let n = SMALL.memory / G;
    let hs: Vec<_> = (0..n).map(|_| d.mem_create(G).unwrap()).collect();
    let e = d.mem_create(G).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    for h in hs {
        d.mem_release(h).unwrap();
    }
    d.mem_create(G).map(|h| d.mem_release(h)).unwrap().unwrap();
}
