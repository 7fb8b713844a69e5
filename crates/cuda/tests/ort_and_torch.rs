//! ONNX Runtime's external allocator and PyTorch's entry points sharing one
//! device's arena, checked by the simulated driver's hazard checker: ONNX
//! Runtime's kernels run on a stream of its own, PyTorch's on the legacy
//! default stream, and a block one of them frees must not reach the other
//! with nothing ordering the two. One test function: the library keeps one
//! global state per process (this binary is a process of its own).

use core::ffi::{c_char, c_int, c_void};
use std::sync::Arc;
use tensor_arena_cuda::{ort_cuda, DeviceArena, DeviceConfig, DevicePtr, SimConfig, SimDriver};

extern "C" {
    fn tensor_arena_cuda_try_alloc(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void;
    fn tensor_arena_cuda_free(ptr: *mut c_void, size: isize, device: c_int, stream: *mut c_void);
    fn tensor_arena_cuda_last_error(buf: *mut c_char, cap: usize) -> isize;
    fn tensor_arena_cuda_ort_alloc(size: usize) -> *mut c_void;
    fn tensor_arena_cuda_ort_free(ptr: *mut c_void);
}

const MIB: usize = 1 << 20;

fn last_error() -> String {
    let mut buf = vec![0u8; 1024];
    // SAFETY: `buf` is writable for its length.
    let n = unsafe { tensor_arena_cuda_last_error(buf.as_mut_ptr().cast(), buf.len()) };
    String::from_utf8(buf[..n as usize].to_vec()).unwrap()
}

/// PyTorch's allocation on `device`, on the legacy default stream.
fn torch_alloc(device: c_int, size: usize) -> *mut c_void {
    // SAFETY: stream 0; the simulated driver takes any stream.
    unsafe { tensor_arena_cuda_try_alloc(size as isize, device, core::ptr::null_mut()) }
}

fn torch_free(device: c_int, p: *mut c_void) {
    // SAFETY: a block of this device's arena, last used on stream 0.
    unsafe { tensor_arena_cuda_free(p, 0, device, core::ptr::null_mut()) }
}

fn ort_alloc(size: usize) -> *mut c_void {
    // SAFETY: plain C function, no pointer arguments.
    unsafe { tensor_arena_cuda_ort_alloc(size) }
}

fn ort_free(p: *mut c_void) {
    // SAFETY: a block `ort_alloc` returned, freed once.
    unsafe { tensor_arena_cuda_ort_free(p) }
}

fn dev(p: *mut c_void) -> DevicePtr {
    DevicePtr(p as usize as u64)
}

/// A simulated device made the C ABI's arena of `device`; the clone kept
/// sees the work queued on its blocks.
fn sim_device(device: i32) -> SimDriver {
    let sim = SimDriver::new(SimConfig::default());
    let arena = DeviceArena::new(Arc::new(sim.clone()), DeviceConfig::default()).unwrap();
    ort_cuda::set_device_arena(device, arena).unwrap();
    sim
}

#[test]
fn ort_and_torch_share_an_arena_only_when_ordered() {
    // The default (legacy) stream, as PyTorch passes it: handle 0.
    // SAFETY: the simulated driver takes any stream value.
    let torch_stream = unsafe { tensor_arena_cuda::Stream::from_raw(0) };

    // 1. ONNX Runtime's stream unknown: its blocks carry the default
    //    stream's tag while its kernels run on its own stream. PyTorch
    //    coming second on the same arena is refused, not served a block
    //    ONNX Runtime's kernels may still be using.
    let sim0 = sim_device(0);
    let ort_stream = sim0.stream();
    ort_cuda::set_device(0).unwrap();
    let p = ort_alloc(4 * MIB);
    assert!(!p.is_null(), "{}", last_error());
    sim0.launch(ort_stream, dev(p), 4 * MIB).unwrap();
    ort_free(p);
    let q = torch_alloc(0, 4 * MIB);
    assert!(
        q.is_null(),
        "PyTorch was handed a block ONNX Runtime's stream may still use"
    );
    let e = last_error();
    assert!(
        e.contains("ONNX Runtime") && e.contains("stream") && e.contains("set_stream"),
        "{e}"
    );
    assert!(sim0.hazards().is_empty(), "{:?}", sim0.hazards());

    // 2. ONNX Runtime's stream given (as `user_compute_stream`): its blocks
    //    carry it, and reuse across the two streams is ordered by events.
    let sim1 = sim_device(1);
    let ort_stream = sim1.stream();
    ort_cuda::set_device(1).unwrap();
    ort_cuda::set_stream(ort_stream).unwrap();
    let opts = ort_cuda::provider_options(1).unwrap();
    assert!(
        opts.contains(&("user_compute_stream", ort_stream.raw().to_string())),
        "{opts:?}"
    );
    // PyTorch first, so that the arena knows two streams from the start.
    let warm = torch_alloc(1, 512);
    assert!(!warm.is_null(), "{}", last_error());
    sim1.launch(torch_stream, dev(warm), 512).unwrap();
    torch_free(1, warm);
    for round in 0..3 {
        // ONNX Runtime frees mid-run, its kernel still queued...
        let p = ort_alloc(4 * MIB);
        assert!(!p.is_null(), "{}", last_error());
        sim1.launch(ort_stream, dev(p), 4 * MIB).unwrap();
        ort_free(p);
        // ...and PyTorch gets the same bytes, after that kernel.
        let q = torch_alloc(1, 4 * MIB);
        assert_eq!(q, p, "round {round}: the freed block is reused");
        sim1.launch(torch_stream, dev(q), 4 * MIB).unwrap();
        assert!(
            sim1.hazards().is_empty(),
            "round {round}: {:?}",
            sim1.hazards()
        );
        // And back: PyTorch's block to ONNX Runtime.
        torch_free(1, q);
        let r = ort_alloc(4 * MIB);
        assert_eq!(r, q);
        sim1.launch(ort_stream, dev(r), 4 * MIB).unwrap();
        assert!(
            sim1.hazards().is_empty(),
            "round {round}: {:?}",
            sim1.hazards()
        );
        ort_free(r);
    }
    let s = ort_cuda::with_device_arena(1, |a| Ok(a.stats())).unwrap();
    assert!(s.streams.waits >= 6, "{:?}", s.streams);
    assert_eq!(s.arena.in_use, 0);
    // The stream cannot change under blocks ONNX Runtime holds.
    let held = ort_alloc(MIB);
    assert!(ort_cuda::set_stream(torch_stream).is_err());
    ort_free(held);
}
