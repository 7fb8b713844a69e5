//! Stream-ordered reuse: when a block freed on one stream may be handed to
//! work on another.
//!
//! The rule (as PyTorch's caching allocator keeps it):
//! - a block freed on stream `S` may be reused at once by an allocation on
//!   `S`: the stream's own order puts the new work after the old;
//! - reuse on another stream `T` first makes `T` wait
//!   (`cuStreamWaitEvent`, on the device; the host never blocks) on an
//!   event recorded on `S` at the free.
//!
//! The arena's core knows nothing of streams, and a new block may span
//! bytes of several freed blocks; so this layer keeps the freed byte ranges
//! not reused yet, each with its stream and event, and on each allocation
//! waits on the events of the ranges it overlaps that were freed on other
//! streams.
//!
//! Cost: while an arena has seen one stream only (the common case), no
//! event is recorded. When a second stream appears, one event is recorded
//! on the first (it covers every free made so far) and each stream that
//! later allocates waits on it once; from then on every free records an
//! event (events are pooled). A shrink synchronises the device before
//! unmapping, which completes every event, so the ranges are dropped then;
//! completed events are also swept when many ranges pile up.

use crate::driver::{Driver, DriverError, EventHandle, Stream};
use std::collections::BTreeMap;

/// Ranges kept before completed events are swept out.
const SWEEP_AT: usize = 4096;

/// A freed range not reused yet.
#[derive(Clone, Copy, Debug)]
struct Freed {
    end: u64,
    stream: Stream,
    /// Index into `Streams::events`.
    slot: usize,
}

#[derive(Debug)]
struct Slot {
    event: EventHandle,
    /// Ranges (and the baseline) that name this slot.
    refs: usize,
}

/// The event recorded on the first stream when a second one appeared.
#[derive(Debug)]
struct Baseline {
    stream: Stream,
    slot: usize,
    /// Streams that have waited on it.
    waited: Vec<Stream>,
}

/// Counters of the stream layer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// Whether a second stream has been seen (events are recorded from then on).
    pub multi_stream: bool,
    /// Events recorded (`cuEventRecord`).
    pub events_recorded: u64,
    /// Waits issued (`cuStreamWaitEvent`).
    pub waits: u64,
    /// Events created (`cuEventCreate`).
    pub events_created: u64,
    /// Freed ranges tracked now.
    pub pending_ranges: usize,
}

/// The stream layer's state.
#[derive(Debug, Default)]
pub(crate) struct Streams {
    first: Option<Stream>,
    multi: bool,
    baseline: Option<Baseline>,
    /// Disjoint freed ranges by start address.
    freed: BTreeMap<u64, Freed>,
    events: Vec<Slot>,
    free_slots: Vec<usize>,
    stats: StreamStats,
}

impl Streams {
    pub(crate) fn stats(&self) -> StreamStats {
        StreamStats {
            multi_stream: self.multi,
            pending_ranges: self.freed.len(),
            ..self.stats
        }
    }

    /// A slot with an event, made if none is free.
    fn take_slot(&mut self, d: &dyn Driver) -> Result<usize, DriverError> {
        if let Some(i) = self.free_slots.pop() {
            self.events[i].refs = 1;
            return Ok(i);
        }
        let event = d.event_create()?;
        self.stats.events_created += 1;
        self.events.push(Slot { event, refs: 1 });
        Ok(self.events.len() - 1)
    }

    fn unref(&mut self, slot: usize) {
        let s = &mut self.events[slot];
        s.refs -= 1;
        if s.refs == 0 {
            self.free_slots.push(slot);
        }
    }

    /// Records a fresh event on `stream` (or, if that fails, waits for the
    /// whole device so that no event is needed: `Ok(None)`).
    fn record(&mut self, d: &dyn Driver, stream: Stream) -> Result<Option<usize>, DriverError> {
        let recorded = self.take_slot(d).and_then(|slot| {
            match d.event_record(&self.events[slot].event, stream) {
                Ok(()) => Ok(slot),
                Err(e) => {
                    self.unref(slot);
                    Err(e)
                }
            }
        });
        match recorded {
            Ok(slot) => {
                self.stats.events_recorded += 1;
                Ok(Some(slot))
            }
            Err(_) => d.synchronize().map(|()| None),
        }
    }

    /// Notes `stream`; on the first sight of a second stream, records the
    /// baseline event on the first.
    fn note(&mut self, d: &dyn Driver, stream: Stream) -> Result<(), DriverError> {
        match self.first {
            None => self.first = Some(stream),
            Some(first) if first != stream && !self.multi => {
                if let Some(slot) = self.record(d, first)? {
                    self.baseline = Some(Baseline {
                        stream: first,
                        slot,
                        waited: Vec::new(),
                    });
                }
                self.multi = true;
            }
            _ => {}
        }
        Ok(())
    }

    /// Freed ranges overlapping `start..end`, in order.
    fn overlapping(&self, start: u64, end: u64) -> Vec<(u64, Freed)> {
        let mut out = Vec::new();
        if let Some((&a, f)) = self.freed.range(..start).next_back() {
            if f.end > start {
                out.push((a, *f));
            }
        }
        out.extend(self.freed.range(start..end).map(|(&a, f)| (a, *f)));
        out
    }

    /// Before `len` bytes at `start` go to work on `stream`: makes `stream`
    /// wait for what other streams may still do with them.
    ///
    /// # Errors
    /// A failed wait; nothing changed then (the caller gives the block back).
    pub(crate) fn on_alloc(
        &mut self,
        d: &dyn Driver,
        start: u64,
        len: usize,
        stream: Stream,
    ) -> Result<(), DriverError> {
        self.note(d, stream)?;
        if !self.multi {
            return Ok(());
        }
        let end = start + len as u64;
        let found = self.overlapping(start, end);
        // 1. Waits first, so a failure changes nothing.
        let mut waited: Vec<usize> = Vec::new();
        if let Some(b) = &self.baseline {
            if b.stream != stream && !b.waited.contains(&stream) {
                d.stream_wait_event(stream, &self.events[b.slot].event)?;
                self.stats.waits += 1;
                waited.push(b.slot);
            }
        }
        for (_, f) in &found {
            if f.stream != stream && !waited.contains(&f.slot) {
                d.stream_wait_event(stream, &self.events[f.slot].event)?;
                self.stats.waits += 1;
                waited.push(f.slot);
            }
        }
        if let Some(b) = &mut self.baseline {
            if b.stream != stream && !b.waited.contains(&stream) {
                b.waited.push(stream);
            }
        }
        // 2. The block is live: its bytes leave the freed ranges (its free
        // will add them again with that free's stream and event).
        for (a, f) in found {
            self.freed.remove(&a);
            let mut refs = 0;
            if a < start {
                self.freed.insert(a, Freed { end: start, ..f });
                refs += 1;
            }
            if f.end > end {
                self.freed.insert(end, f);
                refs += 1;
            }
            self.events[f.slot].refs += refs;
            self.unref(f.slot);
        }
        Ok(())
    }

    /// After work on `stream` last used `len` bytes at `start` and the block
    /// is given back.
    ///
    /// # Errors
    /// When neither an event can be recorded nor the device synchronised:
    /// the caller must not reuse the block then.
    pub(crate) fn on_free(
        &mut self,
        d: &dyn Driver,
        start: u64,
        len: usize,
        stream: Stream,
    ) -> Result<(), DriverError> {
        self.note(d, stream)?;
        if !self.multi {
            return Ok(());
        }
        let end = start + len as u64;
        debug_assert!(
            self.overlapping(start, end).is_empty(),
            "a live block overlaps freed ranges"
        );
        if let Some(slot) = self.record(d, stream)? {
            self.freed.insert(start, Freed { end, stream, slot });
        }
        if self.freed.len() >= SWEEP_AT {
            self.sweep(d);
        }
        Ok(())
    }

    /// Drops the ranges (and baseline) whose events have completed.
    pub(crate) fn sweep(&mut self, d: &dyn Driver) {
        let mut done = vec![false; self.events.len()];
        let mut asked = vec![false; self.events.len()];
        let slots: Vec<usize> = self
            .freed
            .values()
            .map(|f| f.slot)
            .chain(self.baseline.as_ref().map(|b| b.slot))
            .collect();
        for s in slots {
            if !asked[s] {
                asked[s] = true;
                done[s] = d.event_query(&self.events[s].event).unwrap_or(false);
            }
        }
        let gone: Vec<(u64, usize)> = self
            .freed
            .iter()
            .filter(|(_, f)| done[f.slot])
            .map(|(&a, f)| (a, f.slot))
            .collect();
        for (a, slot) in gone {
            self.freed.remove(&a);
            self.unref(slot);
        }
        if let Some(b) = self.baseline.take_if(|b| done[b.slot]) {
            self.unref(b.slot);
        }
    }

    /// Everything queued so far has finished (the device was synchronised):
    /// no range needs a wait any more.
    pub(crate) fn all_done(&mut self) {
        let slots: Vec<usize> = self
            .freed
            .values()
            .map(|f| f.slot)
            .chain(self.baseline.take().map(|b| b.slot))
            .collect();
        self.freed.clear();
        for s in slots {
            self.unref(s);
        }
    }

    /// Destroys every event.
    pub(crate) fn destroy(&mut self, d: &dyn Driver) {
        self.freed.clear();
        self.baseline = None;
        self.free_slots.clear();
        for slot in self.events.drain(..) {
            let _ = d.event_destroy(slot.event);
        }
    }

    /// Checks the bookkeeping (tests): ranges disjoint, reference counts
    /// equal to the ranges naming each slot.
    pub(crate) fn check(&self) {
        let mut refs = vec![0usize; self.events.len()];
        let mut prev_end = 0;
        for (&a, f) in &self.freed {
            assert!(a >= prev_end && f.end > a, "freed ranges overlap");
            prev_end = f.end;
            refs[f.slot] += 1;
        }
        if let Some(b) = &self.baseline {
            refs[b.slot] += 1;
        }
        for (i, s) in self.events.iter().enumerate() {
            assert_eq!(s.refs, refs[i], "slot {i}");
        }
    }
}
