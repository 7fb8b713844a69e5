//! [`SimDriver`]: host memory behind the driver's virtual memory calls, with
//! simulated streams and events, for tests on machines with no GPU.

use super::{
    DevicePtr, Driver, DriverError, EventHandle, PhysHandle, Stream, CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_OUT_OF_MEMORY,
};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Settings of a [`SimDriver`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// Allocation granularity (a power of two); default 2 MiB, as on an H100.
    pub granularity: usize,
    /// Physical device memory: `cuMemCreate` fails with
    /// `CUDA_ERROR_OUT_OF_MEMORY` past it. Default 1 GiB.
    pub memory: usize,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            granularity: 2 << 20,
            memory: 1 << 30,
        }
    }
}

/// Calls made to a [`SimDriver`], by driver function.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimCalls {
    /// `cuMemAddressReserve`.
    pub address_reserve: u64,
    /// `cuMemAddressFree`.
    pub address_free: u64,
    /// `cuMemCreate`.
    pub mem_create: u64,
    /// `cuMemRelease`.
    pub mem_release: u64,
    /// `cuMemMap`.
    pub mem_map: u64,
    /// `cuMemUnmap`.
    pub mem_unmap: u64,
    /// `cuMemSetAccess`.
    pub set_access: u64,
    /// `cuCtxSynchronize`.
    pub synchronize: u64,
    /// `cuEventCreate`.
    pub event_create: u64,
    /// `cuEventDestroy`.
    pub event_destroy: u64,
    /// `cuEventRecord`.
    pub event_record: u64,
    /// `cuEventQuery`.
    pub event_query: u64,
    /// `cuStreamWaitEvent`.
    pub stream_wait_event: u64,
    /// Physical allocations made (successful `cuMemCreate`s).
    pub created: u64,
    /// Physical allocations released (successful `cuMemRelease`s).
    pub released: u64,
    /// Mappings made (successful `cuMemMap`s).
    pub mappings_made: u64,
    /// Mappings removed (by successful `cuMemUnmap`s).
    pub mappings_removed: u64,
}

impl SimCalls {
    /// Every call.
    pub fn total(&self) -> u64 {
        self.memory_calls()
            + self.synchronize
            + self.event_create
            + self.event_destroy
            + self.event_record
            + self.event_query
            + self.stream_wait_event
    }

    /// Calls about memory: reserve, free, create, release, map, unmap, access.
    pub fn memory_calls(&self) -> u64 {
        self.address_reserve
            + self.address_free
            + self.mem_create
            + self.mem_release
            + self.mem_map
            + self.mem_unmap
            + self.set_access
    }
}

/// A physical allocation: host memory, zeroed.
struct Phys {
    data: Box<[u8]>,
    released: bool,
    mapped_at: Option<u64>,
}

struct Mapping {
    len: usize,
    handle: u64,
    access: bool,
}

/// A stream's queue as the simulation sees it.
#[derive(Clone, Default)]
struct StreamState {
    /// Work items queued so far (the position of the last one).
    queued: u64,
    /// Work items known to have finished.
    completed: u64,
    /// For each other stream, the position up to which this stream's
    /// later work waits for it (through events).
    waits: HashMap<u64, u64>,
}

/// What an event captured when recorded: the stream, its position, and
/// what that stream itself waited for.
#[derive(Clone)]
struct Captured {
    stream: u64,
    pos: u64,
    waits: HashMap<u64, u64>,
}

/// The last work that touched a byte range: `stream`'s item `pos`.
#[derive(Clone, Copy)]
struct Use {
    end: u64,
    stream: u64,
    pos: u64,
}

#[derive(Default)]
struct State {
    next_va: u64,
    reservations: BTreeMap<u64, usize>,
    next_handle: u64,
    handles: HashMap<u64, Phys>,
    physical: usize,
    mappings: BTreeMap<u64, Mapping>,
    next_event: u64,
    events: HashMap<u64, Option<Captured>>,
    next_stream: u64,
    streams: HashMap<u64, StreamState>,
    uses: BTreeMap<u64, Use>,
    hazards: Vec<String>,
    calls: SimCalls,
    fail: Vec<(&'static str, u32)>,
}

/// Host memory behind the CUDA driver's virtual memory calls.
///
/// - Every call checks its preconditions as the driver does and fails with
///   `CUDA_ERROR_INVALID_VALUE` otherwise: sizes and addresses in whole
///   granules, mapping only into a reservation and only where nothing is
///   mapped, unmapping only whole mappings, freeing only whole reservations
///   with nothing mapped.
/// - Physical memory is host memory (zeroed, committed lazily by the
///   system) and limited to [`SimConfig::memory`].
/// - Streams and events: [`SimDriver::launch`] queues simulated work that
///   touches device memory on a stream; the simulation flags a *hazard*
///   when work on one stream touches bytes that work on another stream
///   touched and that is neither known finished nor waited for through an
///   event, and when memory is unmapped under unfinished work.
///
/// Clones share one simulated device, so a test can keep a clone to look
/// at what the arena did.
#[derive(Clone)]
pub struct SimDriver {
    /// Unique in the process (clones share it, as they share the device);
    /// the handles and streams it makes carry it.
    id: u64,
    config: SimConfig,
    state: Arc<Mutex<State>>,
}

impl core::fmt::Debug for SimDriver {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SimDriver")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn invalid(call: &'static str, detail: impl Into<String>) -> DriverError {
    DriverError::new(call, CUDA_ERROR_INVALID_VALUE, detail)
}

impl SimDriver {
    /// A simulated device.
    ///
    /// # Panics
    /// If `config.granularity` is not a power of two.
    pub fn new(config: SimConfig) -> Self {
        assert!(
            config.granularity.is_power_of_two(),
            "the granularity must be a power of two"
        );
        let state = State {
            // Device addresses far from anything on the host, so a block
            // dereferenced by mistake faults.
            next_va: 0x7e00_0000_0000,
            next_handle: 1,
            next_event: 1,
            next_stream: 1,
            ..State::default()
        };
        Self {
            id: super::next_driver_id(),
            config,
            state: Arc::new(Mutex::new(state)),
        }
    }

    /// The settings.
    pub fn config(&self) -> SimConfig {
        self.config
    }

    /// A new simulated stream (the legacy default stream is [`Stream::DEFAULT`]).
    pub fn stream(&self) -> Stream {
        let mut st = self.state.lock();
        let raw = st.next_stream;
        st.next_stream += 1;
        st.streams.insert(raw, StreamState::default());
        Stream::simulated(raw, self.id)
    }

    /// Calls made so far.
    pub fn calls(&self) -> SimCalls {
        self.state.lock().calls
    }

    /// Bytes of physical memory held (created and not yet freed: released
    /// handles still mapped count).
    pub fn physical_bytes(&self) -> usize {
        self.state.lock().physical
    }

    /// Bytes mapped now.
    pub fn mapped_bytes(&self) -> usize {
        self.state.lock().mappings.values().map(|m| m.len).sum()
    }

    /// Reservations held now.
    pub fn reservations(&self) -> usize {
        self.state.lock().reservations.len()
    }

    /// Events created and not destroyed.
    pub fn live_events(&self) -> usize {
        self.state.lock().events.len()
    }

    /// Hazards seen so far (see the type's docs); empty when all is well.
    pub fn hazards(&self) -> Vec<String> {
        self.state.lock().hazards.clone()
    }

    /// Makes the next `count` calls of `call` (e.g. `"cuMemCreate"`) fail
    /// with `CUDA_ERROR_OUT_OF_MEMORY`.
    pub fn fail_next(&self, call: &'static str, count: u32) {
        let mut st = self.state.lock();
        st.fail.retain(|(c, _)| *c != call);
        if count > 0 {
            st.fail.push((call, count));
        }
    }

    /// Queues simulated work on `stream` that reads and writes
    /// `ptr..ptr + len`: checks that the range is mapped with access and
    /// records hazards (see the type's docs).
    ///
    /// # Errors
    /// `CUDA_ERROR_INVALID_VALUE` when part of the range is not mapped with
    /// access (the real device would fault).
    pub fn launch(&self, stream: Stream, ptr: DevicePtr, len: usize) -> Result<(), DriverError> {
        let mut st = self.state.lock();
        st.check_accessible("launch", ptr.0, len)?;
        let s = stream.raw();
        let ss = st.streams.entry(s).or_default().clone();
        let (start, end) = (ptr.0, ptr.0 + len as u64);
        // Records are disjoint and sorted: the one before `start` may reach
        // into the range, then those starting inside it.
        let mut found: Vec<(u64, Use)> = Vec::new();
        if let Some((&a, u)) = st.uses.range(..start).next_back() {
            if u.end > start {
                found.push((a, *u));
            }
        }
        found.extend(st.uses.range(start..end).map(|(&a, u)| (a, *u)));
        for (a, u) in &found {
            if u.stream != s {
                let done = st.streams.get(&u.stream).map_or(0, |t| t.completed);
                let waited = ss.waits.get(&u.stream).copied().unwrap_or(0);
                if done < u.pos && waited < u.pos {
                    st.hazards.push(format!(
                        "stream {s} touches {:#x}..{:#x}, last touched by stream {} item {} \
                         (finished up to {done}, waited up to {waited})",
                        a.max(&start),
                        u.end.min(end),
                        u.stream,
                        u.pos
                    ));
                }
            }
        }
        // Replace the overlapped records by this use, keeping what lies outside.
        for (a, u) in found {
            st.uses.remove(&a);
            if a < start {
                st.uses.insert(a, Use { end: start, ..u });
            }
            if u.end > end {
                st.uses.insert(end, u);
            }
        }
        let ss = st.streams.entry(s).or_default();
        ss.queued += 1;
        let pos = ss.queued;
        st.uses.insert(
            start,
            Use {
                end,
                stream: s,
                pos,
            },
        );
        Ok(())
    }

    /// Marks all work queued on `stream` so far as finished.
    pub fn complete(&self, stream: Stream) {
        let mut st = self.state.lock();
        let ss = st.streams.entry(stream.raw()).or_default();
        ss.completed = ss.queued;
    }

    /// Writes `data` at `ptr` (a test's stand-in for a kernel's output).
    ///
    /// # Errors
    /// As [`SimDriver::launch`].
    pub fn write(&self, ptr: DevicePtr, data: &[u8]) -> Result<(), DriverError> {
        let mut st = self.state.lock();
        st.check_accessible("write", ptr.0, data.len())?;
        let mut done = 0;
        while done < data.len() {
            let (slice, _) = st.phys_at(ptr.0 + done as u64);
            let n = slice.len().min(data.len() - done);
            slice[..n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
        Ok(())
    }

    /// Reads `len` bytes at `ptr`.
    ///
    /// # Errors
    /// As [`SimDriver::launch`].
    pub fn read(&self, ptr: DevicePtr, len: usize) -> Result<Vec<u8>, DriverError> {
        let mut st = self.state.lock();
        st.check_accessible("read", ptr.0, len)?;
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let at = ptr.0 + out.len() as u64;
            let (slice, _) = st.phys_at(at);
            let n = slice.len().min(len - out.len());
            out.extend_from_slice(&slice[..n]);
        }
        Ok(out)
    }

    fn gran(&self) -> u64 {
        self.config.granularity as u64
    }

    /// Counts a call and fails it if a failure was injected.
    fn enter(&self, st: &mut State, call: &'static str) -> Result<(), DriverError> {
        if let Some(i) = st.fail.iter().position(|(c, _)| *c == call) {
            st.fail[i].1 -= 1;
            if st.fail[i].1 == 0 {
                st.fail.remove(i);
            }
            return Err(DriverError::new(
                call,
                CUDA_ERROR_OUT_OF_MEMORY,
                "failure injected by the simulated driver",
            ));
        }
        Ok(())
    }
}

impl State {
    /// The reservation holding all of `start..start + len`.
    fn reservation_of(&self, start: u64, len: usize) -> Option<u64> {
        let (&base, &rlen) = self.reservations.range(..=start).next_back()?;
        (start.checked_add(len as u64)? <= base + rlen as u64).then_some(base)
    }

    /// Mappings overlapping `start..end`, in order.
    fn overlapping(&self, start: u64, end: u64) -> Vec<(u64, usize)> {
        let mut out = Vec::new();
        if let Some((&a, m)) = self.mappings.range(..start).next_back() {
            if a + m.len as u64 > start {
                out.push((a, m.len));
            }
        }
        out.extend(self.mappings.range(start..end).map(|(&a, m)| (a, m.len)));
        out
    }

    /// Whether `start..end` is covered by whole mappings with no gap.
    fn whole_mappings(&self, start: u64, end: u64) -> Option<Vec<u64>> {
        let mut at = start;
        let mut starts = Vec::new();
        for (a, len) in self.overlapping(start, end) {
            if a != at {
                return None;
            }
            at = a + len as u64;
            starts.push(a);
        }
        (at == end).then_some(starts)
    }

    fn check_accessible(
        &self,
        call: &'static str,
        start: u64,
        len: usize,
    ) -> Result<(), DriverError> {
        let end = start
            .checked_add(len as u64)
            .ok_or_else(|| invalid(call, "range overflows"))?;
        let mut at = start;
        for (a, l) in self.overlapping(start, end) {
            if a > at || !self.mappings[&a].access {
                break;
            }
            at = a + l as u64;
        }
        if at < end {
            return Err(invalid(
                call,
                format!("{:#x} is not mapped with access", at.max(start)),
            ));
        }
        Ok(())
    }

    /// The physical bytes from `at` to the end of its mapping.
    fn phys_at(&mut self, at: u64) -> (&mut [u8], u64) {
        let (&a, m) = self.mappings.range(..=at).next_back().expect("checked");
        let off = (at - a) as usize;
        let h = m.handle;
        let data = &mut self.handles.get_mut(&h).expect("mapped handle").data;
        (&mut data[off..], a)
    }
}

impl Driver for SimDriver {
    fn name(&self) -> &'static str {
        "simulated"
    }

    fn id(&self) -> u64 {
        self.id
    }

    fn granularity(&self) -> Result<usize, DriverError> {
        Ok(self.config.granularity)
    }

    fn total_memory(&self) -> Result<usize, DriverError> {
        Ok(self.config.memory)
    }

    fn address_reserve(&self, len: usize, align: usize) -> Result<DevicePtr, DriverError> {
        const CALL: &str = "cuMemAddressReserve";
        let mut st = self.state.lock();
        st.calls.address_reserve += 1;
        self.enter(&mut st, CALL)?;
        let g = self.gran();
        if len == 0 || len as u64 % g != 0 {
            return Err(invalid(
                CALL,
                format!("size {len} is not a positive multiple of the granularity"),
            ));
        }
        if align != 0 && !align.is_power_of_two() {
            return Err(invalid(
                CALL,
                format!("alignment {align} is not a power of two"),
            ));
        }
        let align = (align as u64).max(g);
        let base = st.next_va.next_multiple_of(align);
        let end = base
            .checked_add(len as u64)
            .filter(|&e| e < 1 << 56)
            .ok_or_else(|| {
                DriverError::new(CALL, CUDA_ERROR_OUT_OF_MEMORY, "address space exhausted")
            })?;
        // A granule of unreserved space between reservations.
        st.next_va = end + g;
        st.reservations.insert(base, len);
        Ok(DevicePtr(base))
    }

    unsafe fn address_free(&self, ptr: DevicePtr, len: usize) -> Result<(), DriverError> {
        const CALL: &str = "cuMemAddressFree";
        let mut st = self.state.lock();
        st.calls.address_free += 1;
        match st.reservations.get(&ptr.0) {
            Some(&l) if l == len => {}
            _ => {
                return Err(invalid(
                    CALL,
                    format!("{ptr}, {len} bytes is not a reservation"),
                ))
            }
        }
        if !st.overlapping(ptr.0, ptr.0 + len as u64).is_empty() {
            return Err(invalid(CALL, "the reservation still has mappings"));
        }
        st.reservations.remove(&ptr.0);
        Ok(())
    }

    fn mem_create(&self, len: usize) -> Result<PhysHandle, DriverError> {
        const CALL: &str = "cuMemCreate";
        let mut st = self.state.lock();
        st.calls.mem_create += 1;
        self.enter(&mut st, CALL)?;
        if len == 0 || len as u64 % self.gran() != 0 {
            return Err(invalid(
                CALL,
                format!("size {len} is not a positive multiple of the granularity"),
            ));
        }
        if st.physical + len > self.config.memory {
            return Err(DriverError::new(
                CALL,
                CUDA_ERROR_OUT_OF_MEMORY,
                "device memory exhausted",
            ));
        }
        st.physical += len;
        st.calls.created += 1;
        let h = st.next_handle;
        st.next_handle += 1;
        st.handles.insert(
            h,
            Phys {
                data: vec![0u8; len].into_boxed_slice(),
                released: false,
                mapped_at: None,
            },
        );
        Ok(PhysHandle {
            raw: h,
            driver: self.id,
        })
    }

    fn mem_release(&self, handle: PhysHandle) -> Result<(), DriverError> {
        super::check_owner("cuMemRelease", self.id, handle.driver)?;
        const CALL: &str = "cuMemRelease";
        let mut st = self.state.lock();
        st.calls.mem_release += 1;
        let Some(p) = st.handles.get_mut(&handle.raw).filter(|p| !p.released) else {
            return Err(invalid(CALL, format!("unknown handle {}", handle.raw)));
        };
        p.released = true;
        st.calls.released += 1;
        let p = st.handles.get_mut(&handle.raw).expect("checked");
        if p.mapped_at.is_none() {
            let len = p.data.len();
            st.handles.remove(&handle.raw);
            st.physical -= len;
        }
        Ok(())
    }

    unsafe fn mem_map(
        &self,
        ptr: DevicePtr,
        len: usize,
        handle: &PhysHandle,
    ) -> Result<(), DriverError> {
        super::check_owner("cuMemMap", self.id, handle.driver)?;
        const CALL: &str = "cuMemMap";
        let mut st = self.state.lock();
        st.calls.mem_map += 1;
        self.enter(&mut st, CALL)?;
        let Some(p) = st.handles.get(&handle.raw).filter(|p| !p.released) else {
            return Err(invalid(CALL, format!("unknown handle {}", handle.raw)));
        };
        if p.mapped_at.is_some() {
            return Err(invalid(CALL, "the handle is mapped already"));
        }
        if p.data.len() != len {
            return Err(invalid(CALL, "size differs from the handle's"));
        }
        if ptr.0 % self.gran() != 0 {
            return Err(invalid(CALL, format!("{ptr} is not granule-aligned")));
        }
        if st.reservation_of(ptr.0, len).is_none() {
            return Err(invalid(
                CALL,
                format!("{ptr}, {len} bytes is not inside a reservation"),
            ));
        }
        if !st.overlapping(ptr.0, ptr.0 + len as u64).is_empty() {
            return Err(invalid(
                CALL,
                format!("{ptr}, {len} bytes overlaps a mapping"),
            ));
        }
        st.handles.get_mut(&handle.raw).expect("checked").mapped_at = Some(ptr.0);
        st.calls.mappings_made += 1;
        st.mappings.insert(
            ptr.0,
            Mapping {
                len,
                handle: handle.raw,
                access: false,
            },
        );
        Ok(())
    }

    unsafe fn mem_unmap(&self, ptr: DevicePtr, len: usize) -> Result<(), DriverError> {
        const CALL: &str = "cuMemUnmap";
        let mut st = self.state.lock();
        st.calls.mem_unmap += 1;
        let g = self.gran();
        if len == 0 || ptr.0 % g != 0 || len as u64 % g != 0 {
            return Err(invalid(CALL, "range not in whole granules"));
        }
        let end = ptr.0 + len as u64;
        let Some(starts) = st.whole_mappings(ptr.0, end) else {
            return Err(invalid(
                CALL,
                format!("{ptr}, {len} bytes is not whole mappings"),
            ));
        };
        // Unfinished work on the range would fault on a real device.
        let busy: Vec<String> = st
            .uses
            .range(..end)
            .filter(|(_, u)| u.end > ptr.0)
            .filter(|(_, u)| st.streams.get(&u.stream).map_or(0, |s| s.completed) < u.pos)
            .map(|(a, u)| {
                format!(
                    "{a:#x} unmapped under unfinished work of stream {}",
                    u.stream
                )
            })
            .collect();
        st.hazards.extend(busy);
        for a in starts {
            let m = st.mappings.remove(&a).expect("listed");
            st.calls.mappings_removed += 1;
            let p = st.handles.get_mut(&m.handle).expect("mapped handle");
            p.mapped_at = None;
            if p.released {
                st.handles.remove(&m.handle);
                st.physical -= m.len;
            }
        }
        Ok(())
    }

    unsafe fn set_access(&self, ptr: DevicePtr, len: usize) -> Result<(), DriverError> {
        const CALL: &str = "cuMemSetAccess";
        let mut st = self.state.lock();
        st.calls.set_access += 1;
        self.enter(&mut st, CALL)?;
        let end = ptr.0 + len as u64;
        let Some(starts) = st.whole_mappings(ptr.0, end) else {
            return Err(invalid(
                CALL,
                format!("{ptr}, {len} bytes is not wholly mapped"),
            ));
        };
        for a in starts {
            st.mappings.get_mut(&a).expect("listed").access = true;
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<(), DriverError> {
        let mut st = self.state.lock();
        st.calls.synchronize += 1;
        for s in st.streams.values_mut() {
            s.completed = s.queued;
        }
        Ok(())
    }

    fn event_create(&self) -> Result<EventHandle, DriverError> {
        let mut st = self.state.lock();
        st.calls.event_create += 1;
        self.enter(&mut st, "cuEventCreate")?;
        let e = st.next_event;
        st.next_event += 1;
        st.events.insert(e, None);
        Ok(EventHandle {
            raw: e,
            driver: self.id,
        })
    }

    fn event_destroy(&self, event: EventHandle) -> Result<(), DriverError> {
        super::check_owner("cuEventDestroy", self.id, event.driver)?;
        let mut st = self.state.lock();
        st.calls.event_destroy += 1;
        st.events
            .remove(&event.raw)
            .map(drop)
            .ok_or_else(|| invalid("cuEventDestroy", "unknown event"))
    }

    fn event_record(&self, event: &EventHandle, stream: Stream) -> Result<(), DriverError> {
        super::check_owner("cuEventRecord", self.id, event.driver)?;
        let mut st = self.state.lock();
        st.calls.event_record += 1;
        self.enter(&mut st, "cuEventRecord")?;
        let ss = st.streams.entry(stream.raw()).or_default().clone();
        let Some(slot) = st.events.get_mut(&event.raw) else {
            return Err(invalid("cuEventRecord", "unknown event"));
        };
        *slot = Some(Captured {
            stream: stream.raw(),
            pos: ss.queued,
            waits: ss.waits,
        });
        Ok(())
    }

    fn event_query(&self, event: &EventHandle) -> Result<bool, DriverError> {
        super::check_owner("cuEventQuery", self.id, event.driver)?;
        let mut st = self.state.lock();
        st.calls.event_query += 1;
        match st.events.get(&event.raw) {
            None => Err(invalid("cuEventQuery", "unknown event")),
            Some(None) => Ok(true),
            Some(Some(c)) => Ok(st.streams.get(&c.stream).map_or(0, |s| s.completed) >= c.pos),
        }
    }

    fn stream_wait_event(&self, stream: Stream, event: &EventHandle) -> Result<(), DriverError> {
        super::check_owner("cuStreamWaitEvent", self.id, event.driver)?;
        let mut st = self.state.lock();
        st.calls.stream_wait_event += 1;
        self.enter(&mut st, "cuStreamWaitEvent")?;
        let Some(c) = st.events.get(&event.raw).cloned() else {
            return Err(invalid("cuStreamWaitEvent", "unknown event"));
        };
        let Some(c) = c else { return Ok(()) };
        let ss = st.streams.entry(stream.raw()).or_default();
        let mut waits = c.waits;
        waits.insert(c.stream, c.pos);
        for (t, p) in waits {
            if t != stream.raw() {
                let w = ss.waits.entry(t).or_insert(0);
                *w = (*w).max(p);
            }
        }
        Ok(())
    }
}
