//! The device arena on the real CUDA driver (`libcuda.so`), where a GPU is
//! present: blocks hold what is written to them, planned runs make no
//! driver call, shrink and drop give device memory back to the device
//! (read with `cuMemGetInfo`), more than the device has is an error that
//! changes nothing, and reuse across two real streams is ordered.
//!
//! Without a usable driver each test prints why it did not run and passes,
//! so that `cargo test` passes on a machine with no GPU; with
//! `TENSOR_ARENA_REQUIRE_GPU=1` a missing driver fails instead (the GPU
//! check sets it, so that nothing there passes by not running).

use cudarc::driver::sys;
use std::io::Write;
use std::sync::Arc;
use tensor_arena_cuda::driver::CudaDriver;
use tensor_arena_cuda::{CudaError, DeviceArena, DeviceConfig, DevicePtr, Driver, Stream};

const S: Stream = Stream::DEFAULT;
const MIB: usize = 1 << 20;

/// The real driver on device 0 with its primary context current on this
/// thread (for the test's own copies), or `None` with the reason printed.
fn gpu(test: &str) -> Option<Arc<CudaDriver>> {
    match CudaDriver::new(0) {
        Ok(d) => {
            let mut ctx: sys::CUcontext = core::ptr::null_mut();
            // SAFETY: the driver loaded (CudaDriver::new succeeded); valid
            // out-pointer; device 0 exists. The retain is never released:
            // the context lives as long as the test process.
            let r = unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, 0) };
            assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "cuDevicePrimaryCtxRetain");
            // SAFETY: `ctx` is the retained primary context.
            let r = unsafe { sys::cuCtxSetCurrent(ctx) };
            assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "cuCtxSetCurrent");
            Some(Arc::new(d))
        }
        Err(e) => {
            let required = std::env::var_os("TENSOR_ARENA_REQUIRE_GPU").is_some_and(|v| v == "1");
            assert!(!required, "{test}: TENSOR_ARENA_REQUIRE_GPU=1 but {e}");
            // Straight to stderr, past the test harness's capture, so that
            // the output says which tests did not run.
            let _ = writeln!(
                std::io::stderr(),
                "{test}: not run: no usable CUDA driver here ({e})"
            );
            None
        }
    }
}

fn ok(call: &str, r: sys::CUresult) {
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "{call}");
}

/// Free and total device memory (`cuMemGetInfo`).
fn mem_info() -> (usize, usize) {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid out-pointers; a context is current (`gpu`).
    ok("cuMemGetInfo", unsafe {
        sys::cuMemGetInfo_v2(&mut free, &mut total)
    });
    (free, total)
}

/// Writes `len` bytes of the pattern of `seed` at `p` (synchronous copy).
fn write(p: DevicePtr, len: usize, seed: u8) {
    let host = pattern(len, seed);
    // SAFETY: `p..p + len` is a live block of the arena (mapped, readable
    // and writable from this context); `host` holds `len` bytes.
    ok("cuMemcpyHtoD", unsafe {
        sys::cuMemcpyHtoD_v2(p.0, host.as_ptr().cast(), len)
    });
}

/// Whether the `len` bytes at `p` hold the pattern of `seed`.
fn holds(p: DevicePtr, len: usize, seed: u8) -> bool {
    let mut host = vec![0u8; len];
    // SAFETY: as in `write`; `host` has room for `len` bytes.
    ok("cuMemcpyDtoH", unsafe {
        sys::cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), p.0, len)
    });
    host == pattern(len, seed)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Slack for `cuMemGetInfo` comparisons: the driver's own bookkeeping
/// (events, page tables) may take a little device memory.
const SLACK: usize = 4 * MIB;

#[test]
fn blocks_hold_what_is_written_and_drop_gives_every_byte_back() {
    let Some(driver) = gpu("blocks_hold_what_is_written") else {
        return;
    };
    let g = driver.granularity().unwrap();
    assert!(g.is_power_of_two() && g >= 64 << 10, "granularity {g}");
    let (free0, _) = mem_info();
    let mut a = DeviceArena::new(driver.clone(), DeviceConfig::default()).unwrap();
    let sizes = [1024, 3 * MIB + 5, 40 * MIB, 512, 7 * MIB];
    let blocks: Vec<_> = sizes.iter().map(|&n| a.alloc(n, S).unwrap()).collect();
    for (i, (&p, &n)) in blocks.iter().zip(&sizes).enumerate() {
        write(p, n, i as u8);
    }
    for (i, (&p, &n)) in blocks.iter().zip(&sizes).enumerate() {
        assert!(holds(p, n, i as u8), "block {i} lost its bytes");
    }
    let st = a.stats();
    assert_eq!(st.mapped % g, 0, "mapped in whole granules");
    assert!(st.mapped >= sizes.iter().sum::<usize>());
    let (free1, _) = mem_info();
    assert!(
        free0 - free1 + SLACK >= st.mapped,
        "the device lost {} bytes for {} mapped",
        free0 - free1,
        st.mapped
    );
    // Free two, allocate again: the others keep their bytes.
    a.free(blocks[1], S).unwrap();
    a.free(blocks[3], S).unwrap();
    let again = a.alloc(2 * MIB, S).unwrap();
    write(again, 2 * MIB, 99);
    for i in [0, 2, 4] {
        assert!(holds(blocks[i], sizes[i], i as u8), "block {i} changed");
    }
    assert!(holds(again, 2 * MIB, 99));
    a.check_invariants();
    drop(a);
    let (free2, _) = mem_info();
    assert!(
        free2 + SLACK >= free0,
        "after drop the device has {} bytes less than before",
        free0.saturating_sub(free2)
    );
}

/// One run of `key`: allocates `sizes` (times `scale`), freeing every
/// second one as it goes, and writes each block.
fn run(a: &mut DeviceArena, key: &[u8], scale: usize) -> tensor_arena::RunReport {
    let sizes = [300_000, 50_000, 1_000_000, 7_000, 400_000];
    a.begin_run(key).unwrap();
    let mut live = Vec::new();
    for (i, &s) in sizes.iter().enumerate() {
        let p = a.alloc(s * scale, S).unwrap();
        write(p, s * scale, i as u8);
        live.push((p, s * scale, i as u8));
        if i % 2 == 1 {
            let (p, n, seed) = live.remove(0);
            assert!(holds(p, n, seed));
            a.free(p, S).unwrap();
        }
    }
    for (p, n, seed) in live {
        assert!(holds(p, n, seed));
        a.free(p, S).unwrap();
    }
    a.end_run().unwrap()
}

#[test]
fn a_key_seen_before_is_planned_and_makes_no_driver_call() {
    let Some(driver) = gpu("a_key_seen_before_is_planned") else {
        return;
    };
    let mut a = DeviceArena::new(driver, DeviceConfig::default()).unwrap();
    assert!(!run(&mut a, b"batch=16", 16).planned);
    run(&mut a, b"batch=1", 1);
    run(&mut a, b"batch=16", 16);
    let calls = a.stats().calls;
    let again = run(&mut a, b"batch=16", 16);
    assert!(again.planned && !again.deviated, "{again:?}");
    assert_eq!(a.stats().calls, calls, "a planned run makes no driver call");
    assert_eq!(a.stats().calls.failed, 0);
}

#[test]
fn shrink_gives_device_memory_back() {
    let Some(driver) = gpu("shrink_gives_device_memory_back") else {
        return;
    };
    let mut a = DeviceArena::new(driver, DeviceConfig::default()).unwrap();
    run(&mut a, b"big", 64);
    run(&mut a, b"small", 1);
    let (before, _) = mem_info();
    let mapped = a.stats().mapped;
    let released = a.shrink();
    assert!(released > 0 && a.stats().mapped == mapped - released);
    let (after, _) = mem_info();
    assert!(
        after + SLACK >= before + released,
        "shrink released {released} bytes but the device gained {}",
        after.saturating_sub(before)
    );
    // The small run still works and is planned.
    run(&mut a, b"small", 1);
    assert_eq!(a.stats().calls.failed, 0);
}

#[test]
fn more_than_the_device_has_is_an_error_and_changes_nothing() {
    let Some(driver) = gpu("more_than_the_device_has") else {
        return;
    };
    let total = driver.total_memory().unwrap();
    let mut a = DeviceArena::new(driver, DeviceConfig::default()).unwrap();
    let kept = a.alloc(5 * MIB, S).unwrap();
    write(kept, 5 * MIB, 7);
    let mapped = a.stats().mapped;
    // Never touched: the driver refuses to create the physical memory.
    let err = a.alloc(total + (1 << 30), S).unwrap_err();
    assert!(
        matches!(err, CudaError::DeviceMemory { .. } | CudaError::Arena(_)),
        "{err}"
    );
    assert!(holds(kept, 5 * MIB, 7), "a live block changed");
    assert_eq!(a.stats().mapped, mapped, "nothing left mapped");
    let small = a.alloc(MIB, S).unwrap();
    write(small, MIB, 3);
    assert!(holds(small, MIB, 3) && holds(kept, 5 * MIB, 7));
    a.check_invariants();
}

#[test]
fn reuse_on_another_real_stream_waits_on_the_free() {
    let Some(driver) = gpu("reuse_on_another_real_stream") else {
        return;
    };
    let new_stream = || {
        let mut s: sys::CUstream = core::ptr::null_mut();
        // SAFETY: valid out-pointer; a context is current.
        ok("cuStreamCreate", unsafe { sys::cuStreamCreate(&mut s, 0) });
        s
    };
    let (r1, r2) = (new_stream(), new_stream());
    // SAFETY: both are live streams of device 0's primary context, the
    // arena's, and are destroyed only after the arena is dropped.
    let (s1, s2) = unsafe { (Stream::from_raw(r1 as u64), Stream::from_raw(r2 as u64)) };
    let n = 64 * MIB;
    {
        let mut a = DeviceArena::new(driver, DeviceConfig::default()).unwrap();
        let warm = a.alloc(512, s2).unwrap();
        a.free(warm, s2).unwrap();
        let p = a.alloc(n, s1).unwrap();
        // Queued work on s1 over the block, then the block freed on s1.
        for v in 0..8u8 {
            // SAFETY: `p..p + n` is a live block; `r1` a live stream.
            ok("cuMemsetD8Async", unsafe {
                sys::cuMemsetD8Async(p.0, v, n, r1)
            });
        }
        a.free(p, s1).unwrap();
        // s2 gets the bytes, ordered after s1's work.
        let q = a.alloc(n, s2).unwrap();
        assert!(a.stats().streams.waits >= 1, "{:?}", a.stats().streams);
        // SAFETY: `q..q + n` is a live block; `r2` a live stream.
        ok("cuMemsetD8Async", unsafe {
            sys::cuMemsetD8Async(q.0, 0xAB, n, r2)
        });
        // SAFETY: `r2` is a live stream.
        ok("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(r2)
        });
        // SAFETY: `r1` is a live stream.
        ok("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(r1)
        });
        let mut host = vec![0u8; n];
        // SAFETY: `q..q + n` is a live block; `host` has room for `n` bytes.
        ok("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), q.0, n)
        });
        assert!(
            host.iter().all(|&b| b == 0xAB),
            "s2's write was overtaken by s1's"
        );
        a.free(q, s2).unwrap();
        a.check_invariants();
        assert_eq!(a.stats().calls.failed, 0);
    }
    for s in [r1, r2] {
        // SAFETY: a stream made above; nothing uses it any more.
        ok("cuStreamDestroy", unsafe { sys::cuStreamDestroy_v2(s) });
    }
}
