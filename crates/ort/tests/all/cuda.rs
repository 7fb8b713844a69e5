//! ONNX Runtime's CUDA memory from the Rust side, with the device arena's
//! simulated driver (the tests' ONNX Runtime is the CPU build, so no CUDA
//! session runs here). On a GPU, `tools/gpu-check/identical_check.py
//! --parts ort` (run by `tools/gpu-check/issue36.sh`; needs
//! `onnxruntime-gpu` and `--onnx MODEL`) runs a CUDA session with the same
//! external-allocator entry points (`gpu_external_alloc`, `_free`,
//! `_empty_cache`) from Python; no script runs this crate's `CudaExt` on a
//! GPU.

use ort::ep::CUDA;
use tensor_arena_ort::{cuda_run, cuda_shrink, cuda_stats, CudaExt, OrtArenaError, RunKey};

#[test]
fn cuda_provider_and_keyed_runs() {
    tensor_arena_cuda::ort_cuda::init_driver("simulated").unwrap();
    // One call on the user's provider: its options name our functions.
    let ep = CUDA::default().with_tensor_arena(0).unwrap();
    let text = format!("{ep:?}");
    for key in [
        "device_id",
        "gpu_external_alloc",
        "gpu_external_free",
        "gpu_external_empty_cache",
    ] {
        assert!(text.contains(key), "{key} missing in {text}");
    }
    let alloc = tensor_arena_cuda::ort_cuda::tensor_arena_ort_cuda_alloc as *const () as usize;
    assert!(text.contains(&alloc.to_string()), "{text}");
    // A bad device: a clear error, not a panic.
    let e = CUDA::default().with_tensor_arena(-1).unwrap_err();
    assert!(matches!(e, OrtArenaError::Device(_)));
    assert!(e.to_string().contains("-1"), "{e}");

    // Runs keyed by input shapes: the third of a key is planned and makes
    // no driver call. (ONNX Runtime's allocations, through the entry point
    // the provider is given.)
    let key = RunKey::from_shapes([[8i64, 512]]);
    let one = |key: &RunKey| {
        let run = cuda_run(0, key).unwrap();
        let p = tensor_arena_cuda::ort_cuda::tensor_arena_ort_cuda_alloc(3 << 20);
        let q = tensor_arena_cuda::ort_cuda::tensor_arena_ort_cuda_alloc(1 << 20);
        assert!(!p.is_null() && !q.is_null());
        // SAFETY: blocks the entry point handed out, freed once.
        unsafe {
            tensor_arena_cuda::ort_cuda::tensor_arena_ort_cuda_free(p);
            tensor_arena_cuda::ort_cuda::tensor_arena_ort_cuda_free(q);
        }
        run.end().unwrap()
    };
    one(&key);
    one(&key);
    let calls = cuda_stats(0).unwrap().calls.total();
    let report = one(&key);
    assert!(report.planned && !report.deviated, "{report:?}");
    assert_eq!(cuda_stats(0).unwrap().calls.total(), calls);
    // A run open twice: an error, and the first still ends.
    let run = cuda_run(0, &key).unwrap();
    assert!(matches!(cuda_run(0, &key), Err(OrtArenaError::Device(_))));
    run.end().unwrap();
    cuda_shrink(0).unwrap();
    assert_eq!(cuda_stats(0).unwrap().arena.in_use, 0);
}
