//! Resident memory of this process from `/proc/self/status`, and its peak
//! per run: writing `5` to `/proc/self/clear_refs` resets the peak
//! (`VmHWM`) to the current RSS (Linux 4.0 and later), so the peak read
//! after a run is that run's.

/// Resident and peak resident bytes of this process (`VmRSS`, `VmHWM` of
/// `/proc/self/status`; `VmHWM` is what `getrusage` reports as `ru_maxrss`).
/// Zero where they cannot be read.
pub fn read() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Resets the peak (`VmHWM`) to the current RSS.
///
/// # Errors
/// Why `/proc/self/clear_refs` could not be written (not Linux, no procfs,
/// a kernel or sandbox that refuses it): the peak then stays the process's
/// peak so far.
pub fn reset_peak() -> Result<(), String> {
    std::fs::write("/proc/self/clear_refs", "5")
        .map_err(|e| format!("cannot reset the peak RSS (writing 5 to /proc/self/clear_refs: {e})"))
}
