//! Replaying a trace ([`crate::trace`], the format, which sits with the
//! plans at the bottom of the crate) through an [`Arena`]: the shell's
//! side of traces.

use crate::trace::{Event, Trace, TraceRun};
use crate::{Arena, ArenaError, Block, RunReport};
use std::collections::HashMap;

impl Trace {
    /// Replays every run into `arena`, in order; see [`TraceRun::replay`].
    ///
    /// # Errors
    /// The first allocation error.
    pub fn replay<M: crate::memory::HostMemory>(
        &self,
        arena: &Arena<M>,
    ) -> Result<Vec<RunReport>, ArenaError> {
        self.runs.iter().map(|r| r.replay(arena)).collect()
    }
}

impl TraceRun {
    /// Replays the run into `arena` (every block written once per 4 KiB
    /// page, as a runtime would) and returns the run's report.
    ///
    /// # Errors
    /// The first allocation error; the run is closed and its blocks freed.
    pub fn replay<M: crate::memory::HostMemory>(
        &self,
        arena: &Arena<M>,
    ) -> Result<RunReport, ArenaError> {
        let run = arena.try_begin_run()?;
        run.set_label(&self.label);
        let mut live: HashMap<u64, Block<'_, M>> = HashMap::new();
        for ev in &self.events {
            match *ev {
                Event::Alloc { id, bytes } => {
                    let len = usize::try_from(bytes).unwrap_or(usize::MAX);
                    let mut block = run.try_alloc(len)?;
                    for page in block.chunks_mut(4096) {
                        page[0] = id as u8;
                    }
                    live.insert(id, block);
                }
                Event::Free { id } => {
                    live.remove(&id);
                }
            }
        }
        drop(live);
        Ok(run.finish())
    }
}
