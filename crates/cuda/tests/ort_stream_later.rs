//! ONNX Runtime's external allocator used first without its stream, then
//! given it once it holds no block (a session made, run and dropped before
//! the application learned to pass `user_compute_stream`): from then on
//! the arena serves it, and a caller on another stream, as any two
//! streams, because `set_stream` synchronised the device its old kernels
//! ran on. Before, the arena refused ONNX Runtime for the life of the
//! process, with a message that blamed PyTorch. Checked by the simulated
//! driver's hazard checker. One test function: the library keeps one
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

/// PyTorch's allocation on device 0, on the legacy default stream.
fn torch_alloc(size: usize) -> *mut c_void {
    // SAFETY: stream 0; the simulated driver takes any stream.
    unsafe { tensor_arena_cuda_try_alloc(size as isize, 0, core::ptr::null_mut()) }
}

fn torch_free(p: *mut c_void) {
    // SAFETY: a block of device 0's arena, last used on stream 0.
    unsafe { tensor_arena_cuda_free(p, 0, 0, core::ptr::null_mut()) }
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

#[test]
fn ort_given_its_stream_after_freeing_everything_is_served_again() {
    // SAFETY: the simulated driver takes any stream value.
    let torch_stream = unsafe { tensor_arena_cuda::Stream::from_raw(0) };
    let sim = SimDriver::new(SimConfig::default());
    let arena = DeviceArena::new(Arc::new(sim.clone()), DeviceConfig::default()).unwrap();
    ort_cuda::set_device_arena(0, arena).unwrap();
    ort_cuda::set_device(0).unwrap();

    // 1. A first session, its stream unknown: its kernels run on a stream
    //    of its own; it frees everything with a kernel still queued.
    let first_session_stream = sim.stream();
    let p = ort_alloc(4 * MIB);
    assert!(!p.is_null(), "{}", last_error());
    sim.launch(first_session_stream, dev(p), 4 * MIB).unwrap();
    ort_free(p);

    // A caller on a stream is refused meanwhile, and the message names who
    // asked and who came before, not PyTorch for ONNX Runtime.
    assert!(torch_alloc(MIB).is_null());
    let e = last_error();
    assert!(
        e.contains("refused a caller on a stream")
            && e.contains("ONNX Runtime's external allocator with its compute stream unknown allocated from it before")
            && e.contains("set_stream"),
        "{e}"
    );

    // 2. ONNX Runtime given its stream now (no block held): the device is
    //    synchronised, so the first session's kernel is done.
    let synced = sim.calls().synchronize;
    let ort_stream = sim.stream();
    ort_cuda::set_stream(ort_stream).unwrap();

    // 3. ONNX Runtime's next session is served (refused before, for the
    //    life of the process), on the bytes the first one freed, with no
    //    hazard against that first session's kernel.
    let q = ort_alloc(4 * MIB);
    assert!(
        !q.is_null(),
        "ONNX Runtime refused after set_stream: {}",
        last_error()
    );
    assert_eq!(q, p, "the freed block is reused");
    sim.launch(ort_stream, dev(q), 4 * MIB).unwrap();
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    assert_eq!(
        sim.calls().synchronize,
        synced + 1,
        "one synchronisation, at set_stream"
    );

    // 4. And PyTorch beside it, ordered by events as between any two
    //    streams.
    ort_free(q);
    let t = torch_alloc(4 * MIB);
    assert!(!t.is_null(), "{}", last_error());
    sim.launch(torch_stream, dev(t), 4 * MIB).unwrap();
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    torch_free(t);

    // 5. ONNX Runtime's next block, PyTorch's stream known to the arena.
    let r = ort_alloc(MIB);
    assert!(!r.is_null(), "{}", last_error());
    ort_free(r);
}
