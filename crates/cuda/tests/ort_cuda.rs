//! Contract test of ONNX Runtime's CUDA external-allocator entry points
//! (`gpu_external_alloc` / `gpu_external_free` / `gpu_external_empty_cache`),
//! called through their C signatures at the addresses
//! `ort_cuda::provider_options` gives ONNX Runtime, against the simulated
//! driver. One test function: the library keeps one global state per
//! process (this binary is a process of its own).

use core::ffi::{c_char, c_int, c_void};
use tensor_arena_cuda::ort_cuda;

extern "C" {
    fn tensor_arena_cuda_init(driver: *const c_char) -> c_int;
    fn tensor_arena_cuda_run_begin(device: c_int, key: *const u8, key_len: usize) -> c_int;
    fn tensor_arena_cuda_run_end(device: c_int) -> c_int;
    fn tensor_arena_cuda_last_error(buf: *mut c_char, cap: usize) -> isize;
    fn tensor_arena_cuda_ort_set_device(device: c_int) -> c_int;
}

type AllocFn = extern "C" fn(usize) -> *mut c_void;
type FreeFn = extern "C" fn(*mut c_void);
type EmptyFn = extern "C" fn();

fn last_error() -> String {
    let mut buf = vec![0u8; 1024];
    // SAFETY: `buf` is writable for its length.
    let n = unsafe { tensor_arena_cuda_last_error(buf.as_mut_ptr().cast(), buf.len()) };
    String::from_utf8(buf[..n as usize].to_vec()).unwrap()
}

/// The three functions as ONNX Runtime gets them: from the decimal
/// addresses in the provider options.
fn entry_points(device: i32) -> (AllocFn, FreeFn, EmptyFn) {
    let opts = ort_cuda::provider_options(device).unwrap();
    let get = |name: &str| -> usize {
        let (_, v) = opts.iter().find(|(k, _)| *k == name).unwrap();
        v.parse().unwrap()
    };
    assert_eq!(opts[0], ("device_id", device.to_string()));
    // SAFETY: each address is that of an `extern "C"` function of this
    // signature (`provider_options` takes them from the functions), as
    // ONNX Runtime casts them.
    unsafe {
        (
            core::mem::transmute::<usize, AllocFn>(get("gpu_external_alloc")),
            core::mem::transmute::<usize, FreeFn>(get("gpu_external_free")),
            core::mem::transmute::<usize, EmptyFn>(get("gpu_external_empty_cache")),
        )
    }
}

fn stats() -> tensor_arena_cuda::DeviceStats {
    ort_cuda::with_device_arena(0, |a| Ok(a.stats())).unwrap()
}

/// One session run as ONNX Runtime makes it: activations of sizes scaled
/// by the batch, freed in order.
fn session_run(alloc: AllocFn, free: FreeFn, batch: usize) {
    let sizes = [3 << 20, 1 << 20, 5 << 20, 4096, 2 << 20];
    let mut live = Vec::new();
    for (i, s) in sizes.iter().enumerate() {
        let p = alloc(s * batch);
        assert!(!p.is_null(), "{}", last_error());
        assert_eq!(p as usize % 512, 0);
        live.push(p);
        if i % 2 == 1 {
            free(live.remove(0));
        }
    }
    for p in live {
        free(p);
    }
}

#[test]
fn ort_cuda_external_allocator_contract() {
    // SAFETY: a NUL-terminated string.
    assert_eq!(unsafe { tensor_arena_cuda_init(c"simulated".as_ptr()) }, 0);
    let (alloc, free, empty_cache) = entry_points(0);

    // Allocation and free; null and zero sizes.
    assert!(alloc(0).is_null(), "zero bytes: null");
    let p = alloc(1000);
    assert!(!p.is_null(), "{}", last_error());
    assert_eq!(stats().arena.in_use, 1024);
    free(p);
    free(core::ptr::null_mut());
    assert_eq!(stats().arena.in_use, 0);
    free(0x1234 as *mut c_void);
    assert!(
        last_error().contains("not a live block"),
        "{}",
        last_error()
    );

    // Initializers: allocated at session creation, outside runs, kept.
    let weights = alloc(7 << 20);
    assert!(!weights.is_null());

    // Refusal: a clear error, nothing lost, and the next request served.
    let before = stats();
    // (The simulated device has 1 GiB; the reservation is twice that.)
    assert!(alloc(3 << 29).is_null(), "more than the device has");
    let e = last_error();
    assert!(e.contains("allocating 1610612736 bytes"), "{e}");
    let after = stats();
    assert_eq!(after.arena.in_use, before.arena.in_use, "nothing lost");
    assert_eq!(after.out_of_memory, before.out_of_memory + 1);
    assert!(alloc(usize::MAX).is_null());
    assert!(last_error().contains("isize::MAX"), "{}", last_error());
    let small = alloc(4096);
    assert!(
        !small.is_null(),
        "a smaller request succeeds after a refusal"
    );
    free(small);

    // The device cannot move while ONNX Runtime holds blocks.
    // SAFETY: no pointer arguments.
    assert_eq!(unsafe { tensor_arena_cuda_ort_set_device(1) }, -1);
    assert!(last_error().contains("cannot change"), "{}", last_error());
    // SAFETY: as above.
    assert_eq!(unsafe { tensor_arena_cuda_ort_set_device(99) }, -1);
    assert!(last_error().contains("99"), "{}", last_error());

    // Keyed runs (keys from input shapes, as tensor_arena_ort::RunKey
    // gives them): the third run of a key is served from its plan, with no
    // driver call.
    let keyed = |key: &str, batch: usize| {
        // SAFETY: `key` is readable for its length.
        let r = unsafe { tensor_arena_cuda_run_begin(0, key.as_ptr(), key.len()) };
        assert_eq!(r, 0, "{}", last_error());
        session_run(alloc, free, batch);
        // SAFETY: no pointer arguments.
        let r = unsafe { tensor_arena_cuda_run_end(0) };
        assert_eq!(r, 0, "{}", last_error());
    };
    keyed("input:[16,3,224,224]", 16);
    keyed("input:[1,3,224,224]", 1);
    keyed("input:[16,3,224,224]", 16);
    let calls = stats().calls.total();
    keyed("input:[16,3,224,224]", 16);
    let s = stats();
    let last = s.arena.planned_runs;
    assert!(last >= 1, "{s:?}");
    assert_eq!(s.calls.total(), calls, "a planned run made driver calls");
    assert_eq!(s.arena.in_use, 7 << 20, "the initializers stay");

    // The Rust scope does the same and ends the run when dropped.
    {
        let _run = ort_cuda::begin_run(0, b"input:[16,3,224,224]").unwrap();
        session_run(alloc, free, 16);
    }
    let s = stats();
    assert_eq!(s.arena.planned_runs, last + 1);
    assert_eq!(s.calls.total(), calls);
    assert!(ort_cuda::begin_run(0, b"a").unwrap().end().is_ok());

    // empty_cache after a small batch: down to its need plus the
    // initializers; the small batch then repeats with no driver call.
    keyed("input:[1,3,224,224]", 1);
    let big = stats().mapped;
    empty_cache();
    let s = stats();
    assert!(s.mapped < big, "{} -> {}", big, s.mapped);
    let need = s.arena.watermark + s.arena.in_use;
    assert!(s.mapped >= need && s.mapped <= need + (2 << 20), "{s:?}");
    let calls = s.calls.total();
    keyed("input:[1,3,224,224]", 1);
    assert_eq!(stats().calls.total(), calls);

    // Nothing left but the initializers; then the device may change.
    free(weights);
    assert_eq!(stats().arena.in_use, 0);
    // SAFETY: no pointer arguments.
    assert_eq!(unsafe { tensor_arena_cuda_ort_set_device(1) }, 0);
    assert_eq!(ort_cuda::device(), 1);
}
