//! Host-side cost of the device allocator's hot path (no driver call: the
//! memory is cached), against the simulated driver. Side by side in one
//! group: the bare core over device memory, the `DeviceArena` (streams and
//! the live-block map on top), the C ABI PyTorch calls (a global mutex on
//! top of that), and a planned run.
//!
//! `cargo bench -p benches --bench device_hot_path`

use core::ffi::{c_int, c_void};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use std::sync::Arc;
// Links the library whose C symbols the prototypes below name.
use tensor_arena::RawArena;
use tensor_arena_cuda as _;
use tensor_arena_cuda::{
    DeviceArena, DeviceConfig, DeviceMemory, Driver, SimConfig, SimDriver, Stream, DEVICE_ALIGN,
};

extern "C" {
    fn tensor_arena_cuda_alloc(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void;
    fn tensor_arena_cuda_free(ptr: *mut c_void, size: isize, device: c_int, stream: *mut c_void);
    fn tensor_arena_cuda_init(driver: *const core::ffi::c_char) -> c_int;
}

/// Sizes of a run: a CNN's activations, 256 KiB to 12 MiB, in the order of
/// a forward pass with a skip connection kept live.
fn sizes() -> Vec<usize> {
    (0..64).map(|i| (256 << 10) * (1 + (i * 7) % 48)).collect()
}

fn sim() -> Arc<dyn Driver> {
    Arc::new(SimDriver::new(SimConfig {
        memory: 4 << 30,
        ..SimConfig::default()
    }))
}

/// Allocates all of `sizes`, freeing each block two allocations later.
macro_rules! pass {
    ($sizes:expr, $alloc:expr, $free:expr) => {{
        let mut held = std::collections::VecDeque::with_capacity(4);
        for &s in $sizes {
            held.push_back(($alloc)(s));
            if held.len() > 2 {
                ($free)(held.pop_front().unwrap());
            }
        }
        while let Some(p) = held.pop_front() {
            ($free)(p);
        }
    }};
}

fn hot_path(c: &mut Criterion) {
    let sizes = sizes();
    let mut g = c.benchmark_group("device_hot_path");
    g.throughput(Throughput::Elements(sizes.len() as u64));
    let s = Stream::DEFAULT;

    let config = DeviceConfig::default();
    let mut raw = RawArena::new(config.arena, DeviceMemory::new(sim(), 0).unwrap()).unwrap();
    g.bench_function(BenchmarkId::new("core", "alloc+free"), |b| {
        b.iter(|| {
            pass!(
                &sizes,
                |n| raw.alloc(black_box(n), DEVICE_ALIGN).unwrap().handle,
                |h| raw.free(h).unwrap()
            )
        })
    });

    let mut arena = DeviceArena::new(sim(), config).unwrap();
    g.bench_function(BenchmarkId::new("device_arena", "alloc+free"), |b| {
        b.iter(|| {
            pass!(&sizes, |n| arena.alloc(black_box(n), s).unwrap(), |p| arena
                .free(p, s)
                .unwrap())
        })
    });

    g.bench_function(BenchmarkId::new("device_arena", "planned run"), |b| {
        b.iter(|| {
            arena.begin_run(b"cnn").unwrap();
            pass!(&sizes, |n| arena.alloc(black_box(n), s).unwrap(), |p| arena
                .free(p, s)
                .unwrap());
            arena.end_run().unwrap();
        })
    });

    // SAFETY: a NUL-terminated string.
    assert_eq!(unsafe { tensor_arena_cuda_init(c"simulated".as_ptr()) }, 0);
    g.bench_function(
        BenchmarkId::new("c_abi", "tensor_arena_cuda_alloc+free"),
        |b| {
            b.iter(|| {
                pass!(
                    &sizes,
                    // SAFETY: the simulated driver takes any stream.
                    |n: usize| unsafe {
                        tensor_arena_cuda_alloc(black_box(n as isize), 0, core::ptr::null_mut())
                    },
                    // SAFETY: a pointer `tensor_arena_cuda_alloc` returned, freed once.
                    |p| unsafe { tensor_arena_cuda_free(p, 0, 0, core::ptr::null_mut()) }
                )
            })
        },
    );
    g.finish();
}

criterion_group!(benches, hot_path);
criterion_main!(benches);
