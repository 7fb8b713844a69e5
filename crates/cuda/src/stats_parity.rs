//! [`TorchStats`]: the device arena's counters under the names PyTorch's
//! `torch.cuda.memory_stats()` gives them, where they mean the same thing.
//!
//! With a pluggable allocator installed, PyTorch's own memory functions
//! report nothing (`memory_allocated()` is 0, pytorch#106200;
//! `memory_stats()` and `reset_peak_memory_stats()` do not see it,
//! pytorch#133281). The Python module reads these instead.

use crate::DeviceStats;

/// The arena's counters as PyTorch names them, plus a few of its own.
///
/// | field | PyTorch's key | meaning here |
/// |---|---|---|
/// | `allocated_current` | `allocated_bytes.all.current` | bytes in live blocks (each rounded up to 512 bytes, as PyTorch rounds) |
/// | `allocated_peak` | `allocated_bytes.all.peak` | most bytes live at once since the peaks were reset |
/// | `reserved_current` | `reserved_bytes.all.current` | bytes of device memory mapped |
/// | `reserved_peak` | `reserved_bytes.all.peak` | most bytes mapped at once since the peaks were reset |
/// | `allocations_current` | `allocation.all.current` | live blocks |
/// | `allocations` / `frees` | `allocation.all.allocated` / `allocation.all.freed` | blocks handed out / given back, ever |
/// | `device_allocs` / `device_frees` | `num_device_alloc` / `num_device_free` | physical chunks created / released (`cuMemCreate` / `cuMemRelease`: PyTorch counts its `cudaMalloc` / `cudaFree`) |
/// | `ooms` | `num_ooms` | requests refused for want of device memory after the cache was given back |
/// | `driver_calls` | (`tensor_arena.driver_calls`) | every driver call of the memory layer |
/// | `free_bytes` | (`tensor_arena.free_bytes`) | mapped bytes in no live block (PyTorch's reserved minus allocated) |
/// | `largest_free_block` | (`tensor_arena.largest_free_block`) | the largest request served with no driver call |
/// | `fragmentation` | (`tensor_arena.fragmentation`) | share of `free_bytes` the largest free span does not cover, 0.0 to 1.0 |
///
/// PyTorch's `active_bytes` and `inactive_split_bytes` describe its
/// segments split into blocks, which the arena does not have: they are left
/// out rather than given a meaning of their own.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TorchStats {
    /// `allocated_bytes.all.current`.
    pub allocated_current: u64,
    /// `allocated_bytes.all.peak`.
    pub allocated_peak: u64,
    /// `reserved_bytes.all.current`.
    pub reserved_current: u64,
    /// `reserved_bytes.all.peak`.
    pub reserved_peak: u64,
    /// `allocation.all.current`.
    pub allocations_current: u64,
    /// `allocation.all.allocated`.
    pub allocations: u64,
    /// `allocation.all.freed`.
    pub frees: u64,
    /// `num_device_alloc`.
    pub device_allocs: u64,
    /// `num_device_free`.
    pub device_frees: u64,
    /// `num_ooms`.
    pub ooms: u64,
    /// `tensor_arena.driver_calls`.
    pub driver_calls: u64,
    /// `tensor_arena.free_bytes`.
    pub free_bytes: u64,
    /// `tensor_arena.largest_free_block`.
    pub largest_free_block: u64,
    /// `tensor_arena.fragmentation`.
    pub fragmentation: f64,
}

impl TorchStats {
    /// The PyTorch view of a snapshot of the device arena's counters.
    pub fn of(s: &DeviceStats) -> Self {
        let n = |v: usize| v as u64;
        Self {
            allocated_current: n(s.arena.in_use),
            allocated_peak: n(s.arena.peak_in_use),
            reserved_current: n(s.mapped),
            reserved_peak: n(s.reserved_peak.max(s.mapped)),
            allocations_current: n(s.arena.live_blocks),
            allocations: s.arena.allocs,
            frees: s.arena.frees,
            device_allocs: s.calls.mem_create,
            device_frees: s.calls.mem_release,
            ooms: s.out_of_memory,
            driver_calls: s.calls.total(),
            free_bytes: n(s.arena.reserved.saturating_sub(s.arena.in_use)),
            largest_free_block: n(s.arena.largest_free_block),
            fragmentation: s.arena.fragmentation(),
        }
    }

    /// The pairs `(PyTorch's key, value)`, in the order of the table above;
    /// the arena's own keys start with `tensor_arena.`.
    pub fn entries(&self) -> [(&'static str, serde_json::Value); 14] {
        use serde_json::Value;
        [
            ("allocated_bytes.all.current", self.allocated_current.into()),
            ("allocated_bytes.all.peak", self.allocated_peak.into()),
            ("reserved_bytes.all.current", self.reserved_current.into()),
            ("reserved_bytes.all.peak", self.reserved_peak.into()),
            ("allocation.all.current", self.allocations_current.into()),
            ("allocation.all.allocated", self.allocations.into()),
            ("allocation.all.freed", self.frees.into()),
            ("num_device_alloc", self.device_allocs.into()),
            ("num_device_free", self.device_frees.into()),
            ("num_ooms", self.ooms.into()),
            ("tensor_arena.driver_calls", self.driver_calls.into()),
            ("tensor_arena.free_bytes", self.free_bytes.into()),
            (
                "tensor_arena.largest_free_block",
                self.largest_free_block.into(),
            ),
            (
                "tensor_arena.fragmentation",
                serde_json::Number::from_f64(self.fragmentation).map_or(Value::Null, Value::Number),
            ),
        ]
    }

    /// The entries as a JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        let map: serde_json::Map<String, serde_json::Value> = self
            .entries()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        serde_json::Value::Object(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DeviceArena, DeviceConfig, SimConfig, SimDriver, Stream};
    use std::sync::Arc;

    #[test]
    fn names_follow_the_arena_and_peaks_reset() {
        let sim = SimDriver::new(SimConfig::default());
        let mut a = DeviceArena::new(Arc::new(sim), DeviceConfig::default()).unwrap();
        let s = Stream::DEFAULT;
        let x = a.alloc(3 << 20, s).unwrap();
        let y = a.alloc(1000, s).unwrap();
        let t = TorchStats::of(&a.stats());
        assert_eq!(t.allocated_current, (3 << 20) + 1024);
        assert_eq!(t.allocated_peak, t.allocated_current);
        assert_eq!(t.reserved_current, 4 << 20, "two 2 MiB granules");
        assert_eq!(t.reserved_peak, 4 << 20);
        assert_eq!(t.allocations_current, 2);
        assert_eq!(t.device_allocs, 2);
        assert_eq!(t.free_bytes, (4 << 20) - t.allocated_current);
        a.free(x, s).unwrap();
        a.shrink_to(0);
        let t = TorchStats::of(&a.stats());
        assert_eq!(t.allocated_current, 1024);
        assert_eq!(t.allocated_peak, (3 << 20) + 1024, "the peak stays");
        assert!(t.reserved_current < 4 << 20);
        assert_eq!(t.reserved_peak, 4 << 20, "the peak stays");
        a.reset_peaks();
        let t = TorchStats::of(&a.stats());
        assert_eq!(t.allocated_peak, 1024);
        assert_eq!(t.reserved_peak, t.reserved_current);
        assert_eq!(t.frees, 1);
        let j = t.to_json();
        assert_eq!(j["allocated_bytes.all.current"], 1024);
        assert_eq!(j["reserved_bytes.all.peak"], t.reserved_current);
        assert!(j["tensor_arena.fragmentation"].is_number());
        a.free(y, s).unwrap();
    }

    /// Every counter under its own key, each with a value no other has, so
    /// that a field wired to the wrong counter (allocations to frees, ooms
    /// to zero) or a key given the wrong field is caught.
    #[test]
    fn every_key_reads_its_own_counter() {
        const MIB: usize = 1 << 20;
        let sim = SimDriver::new(SimConfig {
            memory: 8 * MIB,
            ..SimConfig::default()
        });
        let mut a = DeviceArena::new(Arc::new(sim), DeviceConfig::default()).unwrap();
        let s = Stream::DEFAULT;
        // Three blocks made, one given back: 3 allocated, 1 freed, 2 live.
        let x = a.alloc(MIB, s).unwrap();
        let y = a.alloc(MIB, s).unwrap();
        let z = a.alloc(MIB, s).unwrap();
        a.free(y, s).unwrap();
        // Two requests that would take the device past its 8 MiB: refused
        // after the cache was given back, each counted once.
        for _ in 0..2 {
            let e = a.alloc(7 * MIB, s).unwrap_err();
            assert!(matches!(e, crate::CudaError::DeviceMemory { .. }), "{e:?}");
        }
        let d = a.stats();
        let t = TorchStats::of(&d);
        assert_eq!(
            t.allocations, 3,
            "allocation.all.allocated counts blocks made"
        );
        assert_eq!(t.frees, 1, "allocation.all.freed counts blocks given back");
        assert_eq!(t.allocations_current, 2);
        assert_eq!(t.allocations - t.frees, t.allocations_current);
        assert_eq!(t.ooms, 2, "num_ooms counts refused requests");
        // The free span is exactly what the arena says, and non-zero.
        assert!(d.arena.largest_free_block > 0);
        assert_eq!(t.largest_free_block, d.arena.largest_free_block as u64);
        assert!(t.largest_free_block <= t.free_bytes);
        let j = t.to_json();
        let keys: Vec<&str> = t.entries().iter().map(|(k, _)| *k).collect();
        assert_eq!(keys.len(), 14, "each key once");
        for (key, want) in [
            ("allocation.all.allocated", 3u64),
            ("allocation.all.freed", 1),
            ("allocation.all.current", 2),
            ("num_ooms", 2),
            ("tensor_arena.largest_free_block", t.largest_free_block),
            ("tensor_arena.free_bytes", t.free_bytes),
            ("num_device_alloc", t.device_allocs),
            ("num_device_free", t.device_frees),
            ("tensor_arena.driver_calls", t.driver_calls),
        ] {
            assert_eq!(j[key], want, "{key}");
        }
        a.free(x, s).unwrap();
        a.free(z, s).unwrap();
    }
}
