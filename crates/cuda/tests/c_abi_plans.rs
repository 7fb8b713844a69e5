//! Contract test of the plan store's C ABI (`tensor_arena_cuda_plans_load`
//! / `_save`), called through its C signature against the simulated
//! driver: one device's arena saves, another device's (standing for the
//! next process) loads and is planned from its first run; every bad
//! argument or file is -1 with a message, never a crash. One test
//! function: the library keeps one global state per process.

use core::ffi::{c_char, c_int, c_void};

// Links the library whose symbols the prototypes below name.
use tensor_arena_cuda as _;

extern "C" {
    fn tensor_arena_cuda_try_alloc(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void;
    fn tensor_arena_cuda_free(ptr: *mut c_void, size: isize, device: c_int, stream: *mut c_void);
    fn tensor_arena_cuda_init(driver: *const c_char) -> c_int;
    fn tensor_arena_cuda_run_begin(device: c_int, key: *const u8, key_len: usize) -> c_int;
    fn tensor_arena_cuda_run_end(device: c_int) -> c_int;
    fn tensor_arena_cuda_stats_json(device: c_int, buf: *mut c_char, cap: usize) -> isize;
    fn tensor_arena_cuda_last_error(buf: *mut c_char, cap: usize) -> isize;
    fn tensor_arena_cuda_plans_load(
        device: c_int,
        dir: *const u8,
        dir_len: usize,
        model: *const u8,
        model_len: usize,
        options: *const u8,
        options_len: usize,
    ) -> i64;
    fn tensor_arena_cuda_plans_save(
        device: c_int,
        dir: *const u8,
        dir_len: usize,
        model: *const u8,
        model_len: usize,
        options: *const u8,
        options_len: usize,
    ) -> i64;
}

fn last_error() -> String {
    let mut buf = vec![0u8; 4096];
    // SAFETY: `buf` is writable for its length.
    let n = unsafe { tensor_arena_cuda_last_error(buf.as_mut_ptr().cast(), buf.len()) };
    String::from_utf8(buf[..n as usize].to_vec()).unwrap()
}

fn stats(device: c_int) -> serde_json::Value {
    let mut buf = vec![0u8; 1 << 20];
    // SAFETY: `buf` is writable for its length.
    let n = unsafe { tensor_arena_cuda_stats_json(device, buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n > 0 && (n as usize) < buf.len(), "{}", last_error());
    serde_json::from_slice(&buf[..n as usize]).unwrap()
}

/// One run of `key` on `device`: blocks of `sizes`, every other one freed
/// as the next comes, the rest at the end.
fn run(device: c_int, key: &str, sizes: &[isize]) {
    // SAFETY: `key` is readable for its length.
    let begun = unsafe { tensor_arena_cuda_run_begin(device, key.as_ptr(), key.len()) };
    assert_eq!(begun, 0, "{}", last_error());
    let mut live = Vec::new();
    for (i, &s) in sizes.iter().enumerate() {
        // SAFETY: the simulated driver accepts any stream value.
        let p = unsafe { tensor_arena_cuda_try_alloc(s, device, core::ptr::null_mut()) };
        assert!(!p.is_null(), "{}", last_error());
        live.push((p, s));
        if i % 2 == 1 {
            let (q, n) = live.remove(0);
            // SAFETY: as above; `q` is a live block of `device`.
            unsafe { tensor_arena_cuda_free(q, n, device, core::ptr::null_mut()) };
        }
    }
    for (p, n) in live {
        // SAFETY: as above.
        unsafe { tensor_arena_cuda_free(p, n, device, core::ptr::null_mut()) };
    }
    // SAFETY: no pointer arguments.
    let ended = unsafe { tensor_arena_cuda_run_end(device) };
    assert_eq!(ended, 0, "{}", last_error());
}

type Call =
    unsafe extern "C" fn(c_int, *const u8, usize, *const u8, usize, *const u8, usize) -> i64;

/// `call` (load or save) with byte strings for its three texts.
fn store(call: Call, device: c_int, dir: &[u8], model: &[u8], options: &[u8]) -> i64 {
    // SAFETY: each pointer is readable for its length.
    unsafe {
        call(
            device,
            dir.as_ptr(),
            dir.len(),
            model.as_ptr(),
            model.len(),
            options.as_ptr(),
            options.len(),
        )
    }
}

const OPTS: &[u8] = b"torch=test";

#[test]
fn plan_store_c_abi_contract() {
    // SAFETY: a NUL-terminated string.
    assert_eq!(unsafe { tensor_arena_cuda_init(c"simulated".as_ptr()) }, 0);
    let load: Call = tensor_arena_cuda_plans_load;
    let save: Call = tensor_arena_cuda_plans_save;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap().as_bytes();
    let sizes = [3 << 20, 1 << 20, 5 << 20, 4096, 2 << 20];
    let big: Vec<isize> = sizes.iter().map(|s| s * 4).collect();

    // Device 0 is the first process: nothing to load, then it learns.
    assert_eq!(store(load, 0, dir, b"m", OPTS), 0, "{}", last_error());
    for _ in 0..2 {
        run(0, "m:16", &big);
        run(0, "m:1", &sizes);
    }
    let bytes = store(save, 0, dir, b"m", OPTS);
    assert!(bytes > 0, "{}", last_error());

    // Device 1 is the next process: planned from its first run.
    assert_eq!(store(load, 1, dir, b"m", OPTS), 2, "{}", last_error());
    run(1, "m:16", &big);
    let s = stats(1);
    assert_eq!(s["last_plan"], "Exact", "{s}");
    assert_eq!(s["last_run"]["planned"], true, "{s}");
    assert_eq!(s["last_run"]["deviated"], false, "{s}");

    // Bad arguments: -1 and a message, nothing loaded (device 2 stays empty).
    let refused = |r: i64, why: &str| {
        assert_eq!(r, -1);
        let e = last_error();
        assert!(e.contains(why), "{why}: {e}");
        assert_eq!(stats(2)["plans"]["plans"], 0);
    };
    // SAFETY: null pointers with non-zero lengths are refused before use.
    let r = unsafe {
        tensor_arena_cuda_plans_load(
            2,
            core::ptr::null(),
            8,
            b"m".as_ptr(),
            1,
            core::ptr::null(),
            0,
        )
    };
    refused(r, "null pointer");
    // SAFETY: as above.
    let r = unsafe {
        tensor_arena_cuda_plans_save(
            2,
            dir.as_ptr(),
            dir.len(),
            core::ptr::null(),
            3,
            core::ptr::null(),
            0,
        )
    };
    refused(r, "null pointer");
    refused(store(load, 2, b"\xff\xfe", b"m", OPTS), "not UTF-8");
    refused(store(load, 2, dir, b"m\0x", OPTS), "NUL");
    refused(store(load, 2, dir, b"", OPTS), "empty model name");
    refused(store(load, 2, b"", b"m", OPTS), "empty directory");
    refused(
        store(load, 2, &vec![b'a'; 5000], b"m", OPTS),
        "at most 4096",
    );
    refused(store(load, 999, dir, b"m", OPTS), "999");
    refused(
        store(load, 2, b"/no/such/dir/here", b"m", OPTS),
        "does not exist",
    );
    // Another setting's store is a file of its own: nothing to load.
    assert_eq!(
        store(load, 2, dir, b"m", b"torch=other"),
        0,
        "{}",
        last_error()
    );
    assert_eq!(stats(2)["plans"]["plans"], 0);
    // A corrupt file: refused whole (the store, not its saves' lock file).
    let file = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "plans"))
        .unwrap();
    let mut bad = std::fs::read(&file).unwrap();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    std::fs::write(&file, &bad).unwrap();
    refused(store(load, 2, dir, b"m", OPTS), "checksum");
    let blocked = format!("{}/under", file.display());
    refused(
        store(save, 2, blocked.as_bytes(), b"m", OPTS),
        "saving plan store",
    );
}
