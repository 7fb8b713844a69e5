//! [`Run`]: one inference call on an [`Arena`].

use super::{Arena, Block, TypedBlock};
use crate::memory::{DefaultMemory, HostMemory};
use crate::plan::Recording;
use crate::stats::RunReport;
use crate::ArenaError;
use bumpalo::Bump;
use core::fmt;
use core::panic::Location;

/// One inference call on an [`Arena`], from [`Arena::begin_run`] (or
/// [`Arena::begin_recorded_run`], [`Arena::begin_planned_run`]).
///
/// Close it with [`Run::finish`] to get its [`RunReport`]; dropping it (for
/// instance while unwinding from a panic) closes it too.
pub struct Run<'a, M: HostMemory = DefaultMemory> {
    arena: &'a Arena<M>,
    id: u64,
    scratch: Bump,
    open: bool,
}

impl<'a, M: HostMemory> Run<'a, M> {
    pub(crate) fn new(arena: &'a Arena<M>, id: u64, scratch: Bump) -> Self {
        Self {
            arena,
            id,
            scratch,
            open: true,
        }
    }

    /// The run's id, as in [`RunReport::run`].
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Names the run in a recorded trace (default `run<id>`); the trace
    /// format wants no whitespace, so it is replaced by `_`.
    pub fn set_label(&self, label: &str) {
        let clean: String = label
            .chars()
            .map(|c| if c.is_whitespace() { '_' } else { c })
            .collect();
        self.arena.set_run_label(clean);
    }

    /// The arena the run is on.
    pub fn arena(&self) -> &'a Arena<M> {
        self.arena
    }

    /// A scratch allocator for small per-run data (shape vectors and the
    /// like), reset when the run finishes; what it hands out borrows the run.
    pub fn scratch(&self) -> &Bump {
        &self.scratch
    }

    /// Allocates a block in the run; the same as [`Arena::try_alloc`].
    ///
    /// # Errors
    /// As [`Arena::try_alloc`].
    #[track_caller]
    pub fn try_alloc(&self, len: usize) -> Result<Block<'a, M>, ArenaError> {
        self.arena.alloc_inner(len, 1, Location::caller())
    }

    /// A typed buffer in the run; the same as [`Arena::try_alloc_slice`].
    ///
    /// # Errors
    /// As [`Arena::try_alloc_slice`].
    #[track_caller]
    pub fn try_alloc_slice<T: bytemuck::Pod>(
        &self,
        len: usize,
    ) -> Result<TypedBlock<'a, T, M>, ArenaError> {
        super::block::typed(
            self.arena.alloc_slice_bytes::<T>(len, Location::caller())?,
            len,
        )
    }

    /// Closes the run and reports what it did. Blocks of the run still live
    /// are counted as leaked; they stay valid until dropped.
    pub fn finish(mut self) -> RunReport {
        self.close(false).0
    }

    /// Closes the run and also returns its [`Recording`], from which a
    /// [`Plan`](crate::Plan) for runs of the same shape can be made: that of
    /// a run opened with [`Arena::begin_recorded_run`]. A planned run that
    /// followed its plan exactly returns an empty recording (its plan's
    /// recording is already the run's), one that left it the recording of
    /// the whole run; a run opened with [`Arena::begin_run`] kept none and
    /// returns an empty one.
    pub fn finish_with_recording(mut self) -> (RunReport, Recording) {
        self.close(true)
    }

    fn close(&mut self, keep_recording: bool) -> (RunReport, Recording) {
        self.open = false;
        let scratch = core::mem::take(&mut self.scratch);
        self.arena.finish_run(scratch, keep_recording)
    }
}

impl<M: HostMemory> Drop for Run<'_, M> {
    fn drop(&mut self) {
        if self.open {
            self.close(false);
        }
    }
}

impl<M: HostMemory> fmt::Debug for Run<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Run").field("id", &self.id).finish()
    }
}
