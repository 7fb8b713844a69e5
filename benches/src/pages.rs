//! Page touches, fault and resident-memory counters.

use core::ptr::NonNull;

/// The page size the benches touch at (x86-64 Linux base pages).
pub const PAGE: usize = 4096;

/// Writes one byte in every 4 KiB of `buf` (at offsets 0, 4096, ...), as a
/// kernel writing its output would first touch each page. The writes are
/// volatile, so the compiler cannot drop them before a free.
pub fn touch_pages(buf: &mut [u8]) {
    for byte in buf.iter_mut().step_by(PAGE) {
        // SAFETY: `byte` is a valid, exclusive `&mut u8`.
        unsafe { core::ptr::write_volatile(byte, 1) };
    }
}

/// [`touch_pages`] on raw memory.
///
/// # Safety
/// - `ptr` must be valid for writes of `len` bytes;
/// - no other reference may access those bytes during the call.
pub(crate) unsafe fn touch_raw(ptr: NonNull<u8>, len: usize) {
    // SAFETY: the caller guarantees `ptr..ptr+len` is writable and not
    // aliased; `u8` has no invalid values, so a slice over it is sound even if
    // the bytes were never initialized by Rust (they are only written).
    let buf = unsafe { core::slice::from_raw_parts_mut(ptr.as_ptr(), len) };
    touch_pages(buf);
}

/// Minor page faults of this process so far (`getrusage(RUSAGE_SELF)`).
///
/// # Panics
/// If `getrusage` fails (it cannot with these arguments).
pub fn minor_faults() -> u64 {
    let mut usage = core::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `RUSAGE_SELF` is a valid `who`, and `usage` points to writable
    // memory of the right type and size for the call to fill.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    assert_eq!(rc, 0, "getrusage failed");
    // SAFETY: `getrusage` returned 0, so it filled the struct (which was also
    // zero-initialized, a valid value for this plain C struct).
    let usage = unsafe { usage.assume_init() };
    u64::try_from(usage.ru_minflt).unwrap_or(0)
}

/// A field of `/proc/self/status` in bytes (`VmRSS`, `VmHWM`...), or
/// `None` off Linux.
pub fn proc_status_bytes(field: &str) -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status
        .lines()
        .find(|l| l.split(':').next() == Some(field))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Resident memory now (`VmRSS`).
pub fn rss_bytes() -> Option<usize> {
    proc_status_bytes("VmRSS")
}

/// Peak resident memory (`VmHWM`) since the process started or the last
/// [`reset_peak_rss`].
pub fn peak_rss_bytes() -> Option<usize> {
    proc_status_bytes("VmHWM")
}

/// Gives the C heap's free memory back to the OS (glibc `malloc_trim(0)`),
/// so that memory freed earlier is not counted in a later RSS baseline and
/// then silently reused. Returns whether anything was released.
pub fn trim_heap() -> bool {
    // SAFETY: `malloc_trim` only walks glibc's own heap state; it has no
    // preconditions and may be called at any time.
    unsafe { libc::malloc_trim(0) != 0 }
}

/// Resets `VmHWM` to the current RSS (writes `5` to `/proc/self/clear_refs`);
/// returns whether the kernel allowed it.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}
