//! The crate's one error type.

use core::fmt;

/// Why an arena operation failed. Every fallible call returns it, and after
/// any of them the arena is unchanged and usable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ArenaError {
    /// The size, once rounded up to the arena's alignment, is over 128 TiB
    /// (more than any address space in use; no region is larger).
    CapacityOverflow {
        /// Bytes requested.
        requested: usize,
    },
    /// The alignment is zero or not a power of two.
    InvalidAlignment {
        /// The alignment asked for.
        align: usize,
    },
    /// The alignment is larger than the arena's regions are aligned to
    /// ([`ArenaConfig::max_align`](crate::ArenaConfig::max_align)).
    AlignmentTooLarge {
        /// The alignment asked for.
        align: usize,
        /// The largest alignment this arena serves.
        max: usize,
    },
    /// Serving the request would take the reserved bytes over the cap
    /// ([`ArenaConfig::max_reserved`](crate::ArenaConfig::max_reserved)).
    OverCap {
        /// Bytes requested (rounded up to the arena's alignment).
        requested: usize,
        /// Bytes reserved when the request was refused.
        reserved: usize,
        /// The cap.
        limit: usize,
    },
    /// The arena's reserved address space is used up: without a cap, the
    /// configured reservation; under `RLIMIT_AS`, the share of the address
    /// space the arena took (see [`Pages`](crate::memory::Pages)). Raise
    /// [`PagesConfig::reservation`](crate::memory::PagesConfig::reservation)
    /// or the limit. (With a cap the reservation is the cap, and a request
    /// past it is [`ArenaError::OverCap`].)
    ReservationExhausted {
        /// Bytes requested (rounded up to the arena's alignment).
        requested: usize,
        /// Bytes of address space the arena reserved.
        reservation: usize,
    },
    /// The memory layer could not reserve the arena's range of address
    /// space, even at the size the request needs.
    ReserveFailed {
        /// Bytes requested by the caller.
        requested: usize,
        /// The smallest reservation tried.
        reservation: usize,
        /// The operating system's error code, if any.
        code: Option<crate::memory::ErrorCode>,
    },
    /// The memory layer could not commit memory: the system refused it as
    /// it would refuse a `malloc` of that size (out of memory, strict
    /// overcommit, `RLIMIT_DATA`), or a device is full. The arena is as it
    /// was before the request.
    CommitFailed {
        /// Bytes requested by the caller.
        requested: usize,
        /// Bytes the arena tried to commit.
        bytes: usize,
        /// Bytes the arena had committed when the commit was refused.
        committed: usize,
        /// The operating system's or driver's error code, if any.
        code: Option<crate::memory::ErrorCode>,
    },
    /// The backing allocator refused a region.
    BackingFailed {
        /// Bytes requested by the caller.
        requested: usize,
        /// Size of the region the arena asked the backing allocator for.
        region: usize,
    },
    /// A run is already open on this arena; runs do not nest.
    RunAlreadyOpen,
    /// The configuration is inconsistent; the message says which field.
    InvalidConfig(&'static str),
}

impl fmt::Display for ArenaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::CapacityOverflow { requested } => write!(
                f,
                "capacity overflow: {requested} bytes cannot be allocated (over 128 TiB once aligned)"
            ),
            Self::InvalidAlignment { align } => {
                write!(f, "invalid alignment {align}: must be a non-zero power of two")
            }
            Self::AlignmentTooLarge { align, max } => write!(
                f,
                "alignment {align} is larger than the arena's maximum alignment {max}"
            ),
            Self::OverCap {
                requested,
                reserved,
                limit,
            } => write!(
                f,
                "over the memory cap: requested {requested} bytes with {reserved} bytes reserved, limit {limit} bytes"
            ),
            Self::BackingFailed { requested, region } => write!(
                f,
                "the backing allocator refused a region of {region} bytes (for a request of {requested} bytes)"
            ),
            Self::ReservationExhausted { requested, reservation } => write!(
                f,
                "out of memory: the arena's reserved address space is used up ({requested} more bytes do not \
                 fit in its {reservation}-byte reservation; not the memory cap: raise the reservation or the \
                 address-space limit)"
            ),
            Self::ReserveFailed {
                requested,
                reservation,
                code,
            } => {
                write!(
                    f,
                    "could not reserve {reservation} bytes of address space (for a request of {requested} bytes)"
                )?;
                os_code(f, code)
            }
            Self::CommitFailed {
                requested,
                bytes,
                committed,
                code,
            } => {
                write!(
                    f,
                    "out of memory: could not commit {bytes} more bytes (for a request of {requested} bytes, \
                     with {committed} bytes committed)"
                )?;
                os_code(f, code)
            }
            Self::RunAlreadyOpen => f.write_str("a run is already open on this arena"),
            Self::InvalidConfig(why) => write!(f, "invalid arena configuration: {why}"),
        }
    }
}

impl ArenaError {
    /// Whether the request was refused for lack of memory: over the cap,
    /// the reservation used up, or the system (or device) refusing to
    /// reserve, commit or allocate. A caller can answer these with "input
    /// too large" or retry smaller: the arena is unchanged and usable. The
    /// other errors are mistakes of the caller (a bad size or alignment, a
    /// run already open, an inconsistent configuration).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(
            self,
            Self::OverCap { .. }
                | Self::ReservationExhausted { .. }
                | Self::ReserveFailed { .. }
                | Self::CommitFailed { .. }
                | Self::BackingFailed { .. }
        )
    }
}

impl std::error::Error for ArenaError {}

/// Appends the description of `code`, if any.
fn os_code(f: &mut fmt::Formatter<'_>, code: Option<crate::memory::ErrorCode>) -> fmt::Result {
    match code {
        Some(code) => write!(f, ": {code}"),
        None => Ok(()),
    }
}
