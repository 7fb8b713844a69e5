//! What the operating system says about this process: minor page faults
//! (`getrusage`) and resident memory (`/proc/self/statm`); and about a child
//! process when it ends: its exit status and peak resident memory (`wait4`).
//!
//! `getrusage`, `wait4`, `sysconf` and `mallinfo2` are C calls, hence the
//! one `unsafe` block each here; the rest of the CLI has no `unsafe` outside
//! `baselines.rs`.
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

/// How a child process ended, from `wait4`.
#[derive(Debug)]
pub struct ChildExit {
    /// Its exit status (an exit code or the signal that ended it).
    pub status: std::process::ExitStatus,
    /// Its peak resident memory in bytes (`ru_maxrss`, which Linux gives in
    /// KiB), if the system reports it.
    pub peak_rss_bytes: Option<u64>,
}

/// Waits for `child` to end and reaps it, returning its status and its
/// resource usage (`wait4`). Takes the child by value: std must not wait for
/// (or kill) a pid that is already reaped.
///
/// # Errors
/// What `wait4` reports.
#[cfg(unix)]
pub fn wait_child(child: std::process::Child) -> std::io::Result<ChildExit> {
    use std::os::unix::process::ExitStatusExt as _;
    let pid = libc::pid_t::try_from(child.id())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "pid out of range"))?;
    let mut status: libc::c_int = 0;
    let mut usage = core::mem::MaybeUninit::<libc::rusage>::zeroed();
    loop {
        // SAFETY: `status` and `usage` point to writable memory of the size
        // and alignment of a `c_int` and a `rusage`, all `wait4` writes to.
        let rc = unsafe { libc::wait4(pid, &mut status, 0, usage.as_mut_ptr()) };
        if rc == pid {
            break;
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
    // SAFETY: `wait4` returned the pid, so it filled the struct (which was
    // zeroed before anyway, a valid `rusage`: plain integers).
    let usage = unsafe { usage.assume_init() };
    Ok(ChildExit {
        status: std::process::ExitStatus::from_raw(status),
        peak_rss_bytes: u64::try_from(usage.ru_maxrss)
            .ok()
            .filter(|&k| k > 0)
            .map(|k| k * 1024),
    })
}

/// Waits for `child`: without `wait4`, std's wait and no peak memory.
///
/// # Errors
/// What the wait reports.
#[cfg(not(unix))]
pub fn wait_child(mut child: std::process::Child) -> std::io::Result<ChildExit> {
    Ok(ChildExit {
        status: child.wait()?,
        peak_rss_bytes: None,
    })
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

/// Bytes the C allocator (glibc's malloc) holds from the system: its
/// arenas' heaps plus its directly mapped blocks (`arena + hblkhd` of
/// `mallinfo2`, summed over every malloc arena), or `None` off glibc.
/// What a process mallocs outside any tensor-arena arena shows here.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn malloc_held() -> Option<u64> {
    // SAFETY: `mallinfo2` takes no argument and returns a plain struct by
    // value; it only reads malloc's own state under its locks.
    let info = unsafe { libc::mallinfo2() };
    Some(info.arena as u64 + info.hblkhd as u64)
}

/// Bytes the C allocator holds: not available off glibc.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn malloc_held() -> Option<u64> {
    None
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
