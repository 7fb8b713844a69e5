//! The counters of an admission ([`crate::Admission::stats`]).

use std::time::Duration;

/// The admission counters of a pool (or of the process's default limit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdmissionStats {
    /// Bytes the runs may be promised together now (the limit less what
    /// other processes and the rest of the process hold); `usize::MAX`
    /// without a limit.
    pub room: usize,
    /// Bytes promised to the runs in flight now.
    pub promised: usize,
    /// The most promised at once.
    pub promised_peak: usize,
    /// Runs in flight.
    pub running: usize,
    /// The most runs in flight at once.
    pub running_peak: usize,
    /// Runs waiting to be admitted now.
    pub queued: usize,
    /// Runs admitted so far.
    pub admitted: u64,
    /// Of those, runs that waited.
    pub waited: u64,
    /// Of those, runs that passed the head of the queue.
    pub passed: u64,
    /// Total time runs waited.
    pub wait_total: Duration,
    /// The longest wait.
    pub wait_max: Duration,
    /// Runs that ran out of memory and were run again, alone.
    pub retried_alone: u64,
    /// Runs refused at once: they need more than the limit can give.
    pub refused: u64,
    /// Processes sharing the limit (this one included; 1 when not shared).
    pub processes: usize,
}
