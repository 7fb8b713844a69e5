//! What the operating system says about this process: minor page faults
//! (`getrusage`) and resident memory (`/proc/self/statm`).
//!
//! `getrusage` and `sysconf` are C calls, hence the one `unsafe` block each
//! here; the rest of the CLI has no `unsafe` outside `baselines.rs`.
#![allow(unsafe_code)]

use std::fs::File;

/// Minor page faults of this process so far (`ru_minflt` of
/// `getrusage(RUSAGE_SELF)`), or `None` where that is not available.
#[cfg(unix)]
pub fn minor_faults() -> Option<u64> {
    let mut usage = core::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `usage` points to writable memory of the size and alignment of
    // a `rusage`, which is all `getrusage` writes to.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: `getrusage` returned 0, so it filled the struct (and it was
    // zeroed before, which is a valid `rusage` anyway: plain integers).
    let usage = unsafe { usage.assume_init() };
    u64::try_from(usage.ru_minflt).ok()
}

/// Minor page faults: not available on this platform.
#[cfg(not(unix))]
pub fn minor_faults() -> Option<u64> {
    None
}

/// Reads this process's resident set size, keeping `/proc/self/statm` open
/// so that a reading allocates nothing.
#[derive(Debug)]
pub struct Rss {
    /// `/proc/self/statm`, if it could be opened.
    statm: Option<File>,
    /// Bytes per page.
    page: u64,
}

impl Rss {
    /// Opens `/proc/self/statm`; readings are `None` where it does not exist.
    pub fn new() -> Self {
        Self {
            statm: File::open("/proc/self/statm").ok(),
            page: page_size(),
        }
    }

    /// Resident bytes now.
    pub fn bytes(&self) -> Option<u64> {
        let file = self.statm.as_ref()?;
        let mut buf = [0u8; 256];
        let n = read_at_start(file, &mut buf)?;
        // "size resident shared text lib data dt", in pages.
        let text = core::str::from_utf8(&buf[..n]).ok()?;
        let resident: u64 = text.split_ascii_whitespace().nth(1)?.parse().ok()?;
        Some(resident * self.page)
    }
}

/// Reads the start of `file` into `buf` without moving its cursor.
#[cfg(unix)]
fn read_at_start(file: &File, buf: &mut [u8]) -> Option<usize> {
    use std::os::unix::fs::FileExt;
    file.read_at(buf, 0).ok()
}

/// Reads the start of `file`: not supported off unix.
#[cfg(not(unix))]
fn read_at_start(_file: &File, _buf: &mut [u8]) -> Option<usize> {
    None
}

/// The page size (4 KiB when it cannot be asked).
#[cfg(unix)]
fn page_size() -> u64 {
    // SAFETY: `sysconf` only reads its integer argument.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}

/// The page size: 4 KiB.
#[cfg(not(unix))]
fn page_size() -> u64 {
    4096
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_move() {
        let rss = Rss::new();
        let before = rss.bytes().unwrap();
        assert!(before > 0);
        let faults = minor_faults().unwrap();
        let v = vec![1u8; 16 << 20];
        std::hint::black_box(&v);
        assert!(minor_faults().unwrap() > faults);
        assert!(rss.bytes().unwrap() > before);
    }
}
