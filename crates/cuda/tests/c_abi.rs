//! Contract tests of the C ABI: the exported symbols called through their C
//! signatures, as PyTorch's `CUDAPluggableAllocator` and the Python module
//! call them, against the simulated driver. One test function: the library
//! keeps one global state per process.

use core::ffi::{c_char, c_int, c_void};
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

// Links the library whose symbols the prototypes below name.
use tensor_arena_cuda as _;

extern "C-unwind" {
    // Throws std::bad_alloc on failure where a C++ runtime is loaded: only
    // requests that succeed go through it here (`cxx_host` below throws).
    fn tensor_arena_cuda_alloc(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void;
}

extern "C" {
    fn tensor_arena_cuda_try_alloc(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void;
    fn tensor_arena_cuda_free(ptr: *mut c_void, size: isize, device: c_int, stream: *mut c_void);
    fn tensor_arena_cuda_init(driver: *const c_char) -> c_int;
    fn tensor_arena_cuda_run_begin(device: c_int, key: *const u8, key_len: usize) -> c_int;
    fn tensor_arena_cuda_run_end(device: c_int) -> c_int;
    fn tensor_arena_cuda_shrink(device: c_int) -> i64;
    fn tensor_arena_cuda_shrink_to(device: c_int, bytes: u64) -> i64;
    fn tensor_arena_cuda_stats_json(device: c_int, buf: *mut c_char, cap: usize) -> isize;
    fn tensor_arena_cuda_last_error(buf: *mut c_char, cap: usize) -> isize;
}

fn last_error() -> String {
    let mut buf = vec![0u8; 1024];
    // SAFETY: `buf` is writable for its length.
    let n = unsafe { tensor_arena_cuda_last_error(buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n >= 0 && (n as usize) < buf.len());
    String::from_utf8(buf[..n as usize].to_vec()).unwrap()
}

fn stats(device: c_int) -> serde_json::Value {
    // SAFETY: a null buffer with capacity 0 only asks for the length.
    let n = unsafe { tensor_arena_cuda_stats_json(device, core::ptr::null_mut(), 0) };
    assert!(n > 0, "{}", last_error());
    let mut small = vec![0u8; 8];
    // SAFETY: `small` is writable for its length; too small, nothing written.
    let m = unsafe { tensor_arena_cuda_stats_json(device, small.as_mut_ptr().cast(), small.len()) };
    assert_eq!(m, n);
    assert_eq!(small, [0; 8], "nothing written into a short buffer");
    let mut buf = vec![0u8; n as usize + 1];
    // SAFETY: `buf` is writable for its length.
    let k = unsafe { tensor_arena_cuda_stats_json(device, buf.as_mut_ptr().cast(), buf.len()) };
    assert!(k >= n - 64 && k <= n + 64, "length changed: {k} vs {n}");
    assert_eq!(buf[k as usize], 0, "NUL-terminated");
    serde_json::from_slice(&buf[..k as usize]).expect("valid JSON")
}

fn alloc(size: isize, stream: usize) -> *mut c_void {
    // SAFETY: the simulated driver accepts any stream value.
    unsafe { tensor_arena_cuda_try_alloc(size, 0, stream as *mut c_void) }
}

fn free(p: *mut c_void, size: isize, stream: usize) {
    // SAFETY: as `alloc`.
    unsafe { tensor_arena_cuda_free(p, size, 0, stream as *mut c_void) }
}

fn init(driver: &core::ffi::CStr) -> c_int {
    // SAFETY: a NUL-terminated string.
    unsafe { tensor_arena_cuda_init(driver.as_ptr()) }
}

fn run_begin(key: &[u8]) -> c_int {
    // SAFETY: `key` is readable for its length.
    unsafe { tensor_arena_cuda_run_begin(0, key.as_ptr(), key.len()) }
}

fn run_end() -> c_int {
    // SAFETY: no pointer arguments.
    unsafe { tensor_arena_cuda_run_end(0) }
}

fn shrink() -> i64 {
    // SAFETY: no pointer arguments.
    unsafe { tensor_arena_cuda_shrink(0) }
}

fn shrink_to(bytes: u64) -> i64 {
    // SAFETY: no pointer arguments.
    unsafe { tensor_arena_cuda_shrink_to(0, bytes) }
}

fn run(key: &str, sizes: &[isize]) {
    // SAFETY: `key` is readable for its length.
    assert_eq!(run_begin(key.as_bytes()), 0, "{}", last_error());
    let mut live = Vec::new();
    for (i, &s) in sizes.iter().enumerate() {
        let p = alloc(s, 0);
        assert!(!p.is_null(), "{}", last_error());
        assert_eq!(p as usize % 512, 0);
        live.push((p, s));
        if i % 2 == 1 {
            let (q, n) = live.remove(0);
            free(q, n, 0);
        }
    }
    for (p, n) in live {
        free(p, n, 0);
    }
    assert_eq!(run_end(), 0, "{}", last_error());
}

#[test]
fn c_abi_contract() {
    assert_eq!(init(c"no-such-driver"), -1);
    assert!(last_error().contains("unknown driver"), "{}", last_error());
    assert_eq!(init(c"simulated"), 0);
    // Sizes PyTorch may pass.
    assert!(alloc(0, 0).is_null(), "zero bytes: null, no error");
    assert!(alloc(-1, 0).is_null());
    assert!(last_error().contains("negative"), "{}", last_error());
    // SAFETY: a device out of range is refused before anything else.
    let bad_device = unsafe { tensor_arena_cuda_try_alloc(64, 999, core::ptr::null_mut()) };
    assert!(bad_device.is_null());
    assert!(last_error().contains("999"), "{}", last_error());
    assert!(alloc(1 << 50, 0).is_null(), "more than the device has");
    assert!(!last_error().is_empty());
    // PyTorch's entry, on requests that succeed (a failure would throw
    // where a C++ runtime is loaded): the same blocks.
    // SAFETY: the simulated driver accepts any stream value; nothing fails.
    let (z, p) = unsafe {
        (
            tensor_arena_cuda_alloc(0, 0, core::ptr::null_mut()),
            tensor_arena_cuda_alloc(4096, 0, core::ptr::null_mut()),
        )
    };
    assert!(z.is_null() && !p.is_null(), "{}", last_error());
    free(p, 4096, 0);
    // Free of something not ours, or null: ignored, with a message.
    free(core::ptr::null_mut(), 0, 0);
    free(0x1234 as *mut c_void, 16, 0);
    assert!(
        last_error().contains("not a live block"),
        "{}",
        last_error()
    );

    // Two streams: blocks on each, freed across.
    let a = alloc(1000, 0x10);
    let b = alloc(3000, 0x20);
    assert!(!a.is_null() && !b.is_null());
    assert_ne!(a, b);
    free(a, 1000, 0x10);
    free(b, 3000, 0x20);
    let s = stats(0);
    assert_eq!(s["driver"], "simulated");
    assert_eq!(s["streams"]["multi_stream"], true);
    assert_eq!(s["arena"]["in_use"], 0);

    // Runs keyed by shape: the third run of a key is served from its plan
    // with no driver call.
    let sizes = [3 << 20, 1 << 20, 5 << 20, 4096, 2 << 20];
    let big: Vec<isize> = sizes.iter().map(|s| s * 4).collect();
    run("batch=16", &big);
    run("batch=1", &sizes);
    let before = stats(0);
    run("batch=16", &big);
    let after = stats(0);
    assert_eq!(after["last_run"]["planned"], true, "{after}");
    assert_eq!(after["last_run"]["deviated"], false);
    assert_eq!(after["calls"]["total"], before["calls"]["total"]);

    // Run misuse is an error code, not a crash.
    assert_eq!(run_end(), -1);
    assert!(last_error().contains("no run"), "{}", last_error());
    // SAFETY: a null key with a length is refused before it is read.
    let null_key = unsafe { tensor_arena_cuda_run_begin(0, core::ptr::null(), 4) };
    assert_eq!(null_key, -1);

    // Shrink after a small batch: down to its need.
    run("batch=1", &sizes);
    let released = shrink();
    assert!(released > 0);
    let s = stats(0);
    let reserved = s["arena"]["reserved"].as_u64().unwrap();
    let need = s["arena"]["watermark"].as_u64().unwrap();
    assert!(reserved >= need && reserved <= need + (2 << 20), "{s}");
    assert_eq!(s["mapped"], s["arena"]["reserved"]);
    // Issue 19, finding 2: a target past any reservation keeps everything
    // (it once wrapped to 0 and released every free granule).
    assert_eq!(shrink_to(u64::MAX), 0);
    assert_eq!(stats(0)["arena"]["reserved"], s["arena"]["reserved"]);
    let reserved = stats(0)["arena"]["reserved"].as_u64().unwrap();
    assert!(reserved > 0);
    assert_eq!(
        shrink_to(0),
        reserved as i64,
        "everything is free: all of it goes"
    );
    assert_eq!(stats(0)["arena"]["reserved"], 0);
    assert_eq!(shrink_to(0), 0, "nothing left");

    // The driver cannot change once memory was allocated.
    assert_eq!(init(c"cuda"), -1);
}

/// A child's stdout and stderr, as text.
fn text_of(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The library file next to this test binary (`target/<profile>/deps`).
fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let name = format!(
        "{}tensor_arena_cuda{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    [deps.join(&name), deps.parent().unwrap().join(&name)]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{name} not built next to {}", deps.display()))
}

/// The Python module's ctypes layer, run by `python3` against the built
/// library with the simulated driver. Needs `python3` (no torch): a missing
/// interpreter fails the test rather than skipping it.
#[test]
fn python_module_ctypes_layer() {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/test_ctypes.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(cdylib())
        .env_remove("TENSOR_ARENA_CUDA_DRIVER")
        .output()
        .expect("python3 is needed for this test (no torch, no GPU)");
    let text = text_of(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("python ctypes layer: ok"), "{text}");
}

/// The MemPool route (`tensor_arena_cuda.pool`) in a process that used
/// CUDA with PyTorch's own allocator first, against the stand-in torch
/// (`tools/gpu-check/fake`: `torch.cuda.MemPool` / `use_mem_pool` over a
/// private pool that caches segments) and the library with the simulated
/// driver: the pool's allocations reach the arena, others do not, keyed
/// scopes are planned, stats read through PyTorch's names. Needs `python3`
/// (no torch): a missing interpreter fails the test.
#[test]
fn python_mempool_route_with_a_stand_in_for_torch() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("python3")
        .arg(root.join("crates/cuda/python/test_mempool.py"))
        .arg(cdylib())
        .env("PYTHONPATH", root.join("tools/gpu-check/fake"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("TENSOR_ARENA_CUDA_DRIVER")
        .env_remove("TENSOR_ARENA_CUDA_LIB")
        .output()
        .expect("python3 is needed for this test (no torch, no GPU)");
    let text = text_of(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("tensor_arena_cuda MemPool route: ok"),
        "{text}"
    );
}

/// `tools/gpu-check/gpu_check.py`'s control flow (three child processes:
/// native, the Python module's `install` and its MemPool route; keyed
/// runs, stats, shrink, the report) run against a stand-in for torch (`tools/gpu-check/fake`) whose model
/// allocates through the library with the simulated driver. The figures
/// mean nothing; the flow, the JSON keys and the planned-run count do.
#[test]
fn gpu_check_flow_with_a_stand_in_for_torch() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("python3")
        .arg(root.join("tools/gpu-check/gpu_check.py"))
        .arg("--lib")
        .arg(cdylib())
        .args(["--repeat", "1"])
        .env("PYTHONPATH", root.join("tools/gpu-check/fake"))
        .env("TENSOR_ARENA_CUDA_DRIVER", "simulated")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("python3 is needed for this test (no torch, no GPU)");
    let text = text_of(&out);
    assert!(out.status.success(), "{text}");
    for model in ["densenet121", "resnet50", "bert"] {
        assert!(text.contains(&format!("== {model} (fake")), "{text}");
    }
    assert_eq!(text.matches("outputs identical: True").count(), 3, "{text}");
    // The MemPool route in a process that used CUDA first, beside install().
    assert_eq!(
        text.matches("outputs identical to native: True").count(),
        3,
        "{text}"
    );
    assert_eq!(
        text.matches("\ndriver calls in a pass of planned runs: 0")
            .count(),
        3,
        "{text}"
    );
    assert_eq!(
        text.matches("pool() driver calls in a pass of planned runs: 0")
            .count(),
        3,
        "{text}"
    );
}

/// `tensor_arena_cuda_alloc` refuses a C++ caller by throwing `std::bad_alloc`, as
/// PyTorch's own allocator throws, where a null would be used unchecked:
/// a C++ host (built here with `c++`) loads the library with the
/// simulated driver, catches the exception for a request past the
/// device's memory, and goes on allocating; `tensor_arena_cuda_try_alloc` returns
/// null for the same request without throwing. Needs a C++ compiler: a
/// missing one fails the test rather than skipping it.
#[test]
fn alloc_throws_bad_alloc_into_a_cxx_host() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("host.cc");
    std::fs::write(&src, include_str!("cxx_host.cc")).unwrap();
    let host = dir.path().join("host");
    let cxx = Command::new("c++")
        .arg("-o")
        .arg(&host)
        .arg(&src)
        .arg("-ldl")
        .status()
        .expect("a C++ compiler (c++) is needed to build the test's C++ host");
    assert!(cxx.success());
    let out = Command::new(&host)
        .arg(cdylib())
        .env("TENSOR_ARENA_CUDA_DRIVER", "simulated")
        .output()
        .unwrap();
    let text = text_of(&out);
    assert!(out.status.success(), "{text}");
    for line in [
        "small: ok",
        "zero: null",
        "huge: caught std::bad_alloc",
        "huge, C entry: null",
        "after: ok",
    ] {
        assert!(text.contains(line), "{line:?} missing in:\n{text}");
    }
}

/// Set in the environment of the child that
/// [`a_panicking_caller_lookup_gives_null_and_a_message_not_an_abort`]
/// starts: this binary again, running that test alone.
const LOOKUP_CHILD: &str = "TENSOR_ARENA_CUDA_TEST_LOOKUP_CHILD";

/// PyTorch's entry (`tensor_arena_cuda_alloc`) looks its caller's C++
/// runtime up at its first call; a panic of that lookup stays inside: the
/// request is still served, a request that cannot be is a null (nothing to
/// throw through), and `tensor_arena_cuda_last_error` says what happened,
/// never an abort and never a Rust panic unwound into the caller. The
/// lookup is made to panic by a test hook (a `#[doc(hidden)]` Rust
/// function, not exported from the `cdylib`); in a child process (this
/// binary again, the test alone), because the lookup's answer is kept for
/// the process's life and `c_abi_contract` makes it here.
#[test]
fn a_panicking_caller_lookup_gives_null_and_a_message_not_an_abort() {
    const TEST: &str = "a_panicking_caller_lookup_gives_null_and_a_message_not_an_abort";
    if std::env::var_os(LOOKUP_CHILD).is_some() {
        panicking_lookup_child();
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
        .env(LOOKUP_CHILD, "1")
        .env_remove("TENSOR_ARENA_CUDA_DRIVER")
        .output()
        .unwrap();
    let text = text_of(&out);
    assert!(out.status.success(), "the child failed:\n{text}");
    assert!(text.contains("panicking lookup: ok"), "{text}");
}

/// The child's part: the lookup panics at the first call of PyTorch's
/// entry (the only call that looks it up).
fn panicking_lookup_child() {
    tensor_arena_cuda::__panic_in_caller_lookup_for_tests();
    assert_eq!(init(c"simulated"), 0, "{}", last_error());
    // SAFETY: the simulated driver accepts any stream value; a panic of
    // the lookup must not unwind out of the call (the test fails if it
    // does, in this child).
    let p = unsafe { tensor_arena_cuda_alloc(4096, 0, core::ptr::null_mut()) };
    let msg = last_error();
    assert!(
        msg.contains("panicked") && msg.contains("test hook"),
        "the lookup's panic is in last_error: {msg:?}"
    );
    assert!(!p.is_null(), "the request is still served");
    // A request the device cannot serve: with no runtime found, a null
    // and its message, not a throw.
    // SAFETY: as above; nothing throws (no runtime was found).
    let huge = unsafe { tensor_arena_cuda_alloc(1 << 50, 0, core::ptr::null_mut()) };
    assert!(huge.is_null());
    let msg = last_error();
    assert!(msg.contains("allocating"), "{msg:?}");
    free(p, 4096, 0);
    assert_eq!(stats(0)["arena"]["in_use"], 0);
    println!("panicking lookup: ok");
}

/// Every symbol the library exports starts with `tensor_arena_cuda_`: a
/// process's global symbol table is shared by every library in it, and
/// names such as `alloc_fn` would bind to whichever came first. Read with
/// `nm -D` (binutils): a missing `nm` fails the test.
#[test]
fn every_exported_symbol_is_prefixed() {
    let out = Command::new("nm")
        .args(["-D", "--defined-only", "--format=posix"])
        .arg(cdylib())
        .output()
        .expect("nm (binutils) is needed to read the library's exports");
    assert!(out.status.success(), "{}", text_of(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    // Functions (T) and data (D, B, R) this library defines; weak and
    // versioned symbols of the runtime it links (w, V, ...) are not its.
    let ours: Vec<&str> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (name, kind) = (f.next()?, f.next()?);
            matches!(kind, "T" | "D" | "B" | "R").then_some(name)
        })
        .collect();
    for want in [
        "tensor_arena_cuda_alloc",
        "tensor_arena_cuda_free",
        "tensor_arena_cuda_try_alloc",
        "tensor_arena_cuda_ort_alloc",
        "tensor_arena_cuda_ort_set_stream",
    ] {
        assert!(ours.contains(&want), "{want} not exported: {ours:?}");
    }
    let bare: Vec<&&str> = ours
        .iter()
        .filter(|n| !n.starts_with("tensor_arena_cuda_"))
        .collect();
    assert!(bare.is_empty(), "exported without the prefix: {bare:?}");
}

/// Whether `TENSOR_ARENA_REQUIRE_TORCH_GPU=1` (the GPU check and `.ci/run`
/// on a machine with a GPU set it): a part that cannot run fails.
fn torch_gpu_required() -> bool {
    std::env::var_os("TENSOR_ARENA_REQUIRE_TORCH_GPU").is_some_and(|v| v == "1")
}

/// On a GPU: PyTorch's MemPool route and ONNX Runtime's CUDA execution
/// provider with the external allocator give outputs identical to native
/// (`tools/gpu-check/identical_check.py`, each part in its own process).
/// Without a GPU, torch or onnxruntime-gpu, each part prints that it did
/// not run, straight to stderr past the test harness's capture (so CI's
/// log shows it, as `real_driver.rs` does), and passes;
/// `TENSOR_ARENA_REQUIRE_TORCH_GPU=1` makes that a failure (`.ci/run` sets
/// it where a GPU is visible). The ONNX Runtime part needs a model:
/// `TENSOR_ARENA_ONNX_MODEL` (e.g. `target/ort-assets/densenet121_batch.onnx`,
/// which `.ci/run` sets there); required and missing, the test fails.
#[test]
fn gpu_routes_identical_to_native_or_not_run() {
    const TEST: &str = "gpu_routes_identical_to_native_or_not_run";
    let required = torch_gpu_required();
    let model = std::env::var_os("TENSOR_ARENA_ONNX_MODEL").map(PathBuf::from);
    if required {
        let model = model.as_ref().unwrap_or_else(|| {
            panic!(
                "{TEST}: TENSOR_ARENA_REQUIRE_TORCH_GPU=1 but TENSOR_ARENA_ONNX_MODEL is not set"
            )
        });
        assert!(
            model.is_file(),
            "{TEST}: TENSOR_ARENA_REQUIRE_TORCH_GPU=1 but the ONNX model {} is missing",
            model.display()
        );
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut cmd = Command::new("python3");
    cmd.arg(root.join("tools/gpu-check/identical_check.py"))
        .arg("--lib")
        .arg(cdylib())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("TENSOR_ARENA_CUDA_DRIVER")
        .env_remove("TENSOR_ARENA_CUDA_LIB");
    if let Some(model) = &model {
        cmd.arg("--onnx").arg(model);
    }
    let out = cmd
        .output()
        .expect("python3 is needed for this test (it says 'not run' without torch)");
    let text = text_of(&out);
    // Straight to stderr, past the harness's capture: CI's log names each
    // part that did not run.
    for line in text.lines().filter(|l| l.contains(": not run: ")) {
        let _ = writeln!(std::io::stderr(), "{TEST}: {line}");
    }
    assert!(out.status.success(), "{text}");
    for part in ["mempool", "ort"] {
        let identical = text.contains(&format!("{part}: identical"));
        let not_run = text.contains(&format!("{part}: not run"));
        assert!(
            identical || not_run,
            "{part}: neither identical nor 'not run':\n{text}"
        );
        assert!(
            identical || !required,
            "{part}: TENSOR_ARENA_REQUIRE_TORCH_GPU=1 but it did not run:\n{text}"
        );
    }
}
