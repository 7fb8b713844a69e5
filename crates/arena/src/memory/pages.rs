//! [`Pages`]: one reservation of address space per arena, committed in
//! place, with transparent huge pages where the system offers them.

use super::thp::{self, Policy};
use super::{
    ErrorCode, GiveBack, HostMemory, HugePages, Memory, MemoryError, MemoryOp, MemoryProps,
    PagesConfig,
};
use core::ffi::c_void;
use core::ptr::NonNull;
use rustix::io::Errno;
use rustix::mm::{self, Advice, MapFlags, MprotectFlags, ProtFlags};
use std::time::{Duration, Instant};

/// Huge pages a commit populates at a time, and times, when it asks for
/// at least [`PROBE_MIN`] of them ([`Pages::probe_huge`]), after a first
/// step of [`PROBE_FIRST`].
const PROBE: usize = 8;
/// Huge pages of a probed commit's first step: where huge pages are slow
/// (2-5 ms each), the rest goes to base pages after few of them.
const PROBE_FIRST: usize = 2;
/// The fewest huge pages of a commit that is probed; smaller commits are
/// timed whole and judged together, every this many huge pages.
const PROBE_MIN: usize = 4;
/// A huge page that takes longer than this to populate was not free memory
/// the kernel could hand over: zeroing 2 MiB takes 0.1-0.3 ms; a guest whose
/// free huge blocks went back to its host (free page reporting, a balloon)
/// waits 2-3 ms for each while the host backs it, where base pages,
/// which come from smaller free blocks the host still backs, do not.
/// Timed in the thread's CPU time ([`thread_cpu`]).
const SLOW_HUGE: Duration = Duration::from_millis(1);
/// How long after huge pages were found slow a commit takes base pages at
/// once, without asking for huge ones: slow blocks come in runs (a guest's
/// reported memory is all of its free huge blocks), and an arena that grows
/// by small commits, each below [`PROBE_MIN`], would meet them one by one.
const SLOW_FOR: Duration = Duration::from_secs(5);
/// The fewest huge pages of a commit that is probed anew while huge pages
/// are held slow ([`SLOW_FOR`]), one huge page a step, where this
/// layer gave back at least half as much in the last [`RECENT`]; other
/// commits take base pages at once. A guest's memory is slow while its host
/// has it, and fast when the process freed it moments before: an arena that
/// gives a large run's memory back before a small run and takes it again
/// for the next large one met an earlier step's verdict and populated 168
/// MiB in base pages (43,008 faults, 47 ms of system time, against 84
/// faults and about 8 ms in huge pages). Where the verdict still holds,
/// probing costs a slow huge page (2-5 ms); below this
/// size that is more than huge pages would save, and fresh memory (a first
/// run's commits) is as slow as the verdict says.
const REPROBE_MIN: usize = 16;
/// How recently memory given back counts as still backed by the host: a
/// guest reports its free blocks to its host about 2 s after they are
/// freed.
const RECENT: Duration = Duration::from_secs(1);

/// The calling thread's CPU time. A populate's is what it cost the thread:
/// a host backing the guest's pages stalls the thread inside it (counted),
/// where another thread of a busy machine running meanwhile is not (a
/// test run's other threads made wall-clock steps look slow).
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

/// Virtual memory from the kernel: one `mmap` reservation per arena,
/// `PROT_NONE` (address space only, no memory, not charged), made usable
/// granule by granule at its top as the arena grows (`mprotect`), and given
/// back on shrink by mapping fresh `PROT_NONE` pages over the range
/// (`mmap` with `MAP_FIXED`). Fresh and decommitted memory reads as zero,
/// so the arena never zero-fills.
///
/// # Commits are charged like `malloc`
/// The reservation is made without `MAP_NORESERVE`, so making a range
/// writable is charged to the process's commit like a `malloc` of the same
/// size: the kernel refuses it (`ENOMEM`, an [`ArenaError::CommitFailed`])
/// under the overcommit heuristic (a commit larger than memory and swap),
/// under strict overcommit (past `CommitLimit`), and past `RLIMIT_DATA`,
/// where a `malloc` would fail, instead of killing the process at first
/// touch. Decommitting replaces the range with a new `PROT_NONE` mapping,
/// which gives its pages and its commit charge back.
///
/// # Address space
/// A reservation is address space only, but it counts against
/// `RLIMIT_AS` (`ulimit -v`). With a finite limit, the first reservation
/// takes at most half of the address space the process has left under it
/// when the arena first grows (the limit less the process's current
/// `VmSize`), and at least what that first request needs; so the rest of
/// the process (the runtime's own `malloc`s, other arenas) keeps the other
/// half. A request past the reservation is then
/// [`ArenaError::ReservationExhausted`], an error like any refusal.
///
/// [`ArenaError::CommitFailed`]: crate::ArenaError::CommitFailed
/// [`ArenaError::ReservationExhausted`]: crate::ArenaError::ReservationExhausted
///
/// # Commits are populated
/// A commit makes its range present in one call,
/// `madvise(MADV_POPULATE_WRITE)` (Linux 5.14 and later; before, the pages
/// fault in as they are first written): the kernel fills the range without
/// a trap per page, and a system with no memory for it refuses the commit
/// ([`ArenaError::CommitFailed`]) instead of the process meeting it at a
/// first touch. With transparent huge pages (see [`HugePages`]) the range
/// is aligned to the huge page size, and a range of whole huge pages is
/// backed by them where the system offers them without compacting memory
/// on the committing thread: 2 MiB then cost one fault instead of 512.
///
/// With [`GiveBack::Lazily`], a decommit is `madvise(MADV_FREE)` instead:
/// the range stays mapped and writable, and the kernel may take its pages
/// at any moment until they are written again. A commit of such a range
/// therefore writes a zero to the first byte of each of its pages before
/// the arena hands any of it out: a page the kernel had not taken is kept
/// (with what it held, less that byte), one it had taken comes back zeroed,
/// and either way its bytes no longer change under a reader.
#[derive(Debug, Clone)]
pub struct Pages {
    config: PagesConfig,
    page: usize,
    /// The huge page size, or 0 without transparent huge pages.
    huge: usize,
    /// How a commit asks for huge pages (`Off` when `huge` is 0).
    policy: Policy,
    /// Whether a commit populates its range with
    /// `madvise(MADV_POPULATE_WRITE)`; cleared when the kernel refuses it
    /// (before Linux 5.14), and the range's pages then fault in as they
    /// are first written.
    populate: bool,
    /// Free huge pages the kernel has now ([`thp::free_huge_pages`]; the
    /// tests set a fixed answer).
    free_huge: fn(usize, usize) -> Option<usize>,
    /// Address ranges `[start, end)` given back with `MADV_FREE` and not
    /// committed since (disjoint, in no order; [`GiveBack::Lazily`] only).
    lazy: Vec<(usize, usize)>,
    /// A huge page slower than this to populate makes the rest of its
    /// commit take base pages ([`SLOW_HUGE`]; the tests set their own).
    slow_huge: Duration,
    /// The clock that times a populate ([`thread_cpu`]; the tests script
    /// their own).
    clock: fn() -> Duration,
    /// Commits whose huge pages were found slow, or that took base pages
    /// because they had been (for stats and tests).
    slow_commits: u64,
    /// When huge pages were last found slow ([`SLOW_FOR`]).
    slow_at: Option<Instant>,
    /// Huge pages populated by commits too small to probe, and the time
    /// they took, since the last verdict: judged every [`PROBE_MIN`] pages.
    tally: (usize, Duration),
    /// When memory was last given back at once (not lazily), and the bytes
    /// given back since the count started afresh, which it does when the
    /// last give-back is older than [`RECENT`]; a commit probed anew uses
    /// them up ([`REPROBE_MIN`]).
    given_back: (Option<Instant>, usize),
}

impl Pages {
    /// A layer with `config`; reads the system's page and huge page sizes
    /// and whether transparent huge pages are offered.
    pub fn new(config: PagesConfig) -> Self {
        let page = rustix::param::page_size();
        let settings = match config.huge_pages {
            HugePages::Never => None,
            _ => thp::Settings::read().filter(|s| s.size > page),
        };
        let policy = thp::policy(config.huge_pages, settings);
        let huge = match policy {
            Policy::Off => 0,
            _ => settings.map_or(0, |s| s.size),
        };
        Self {
            config,
            page,
            huge,
            policy,
            populate: true,
            free_huge: thp::free_huge_pages,
            lazy: Vec::new(),
            slow_huge: SLOW_HUGE,
            clock: thread_cpu,
            slow_commits: 0,
            slow_at: None,
            tally: (0, Duration::ZERO),
            given_back: (None, 0),
        }
    }

    /// Where a commit of `len` bytes at `at` asks for many huge pages
    /// (`WhereFree`), populates them [`PROBE`] at a time (the first step
    /// [`PROBE_FIRST`]) and times each
    /// step: once a step took longer than [`SLOW_HUGE`] a huge page, the
    /// rest of the range (up to `kept_from`, where base pages start
    /// anyway) is kept from huge pages while it is populated, and advised
    /// after, for khugepaged. A commit probed anew while huge pages are
    /// held slow ([`REPROBE_MIN`]) steps by one huge page throughout.
    /// Returns the offset from which the range is kept from huge pages.
    fn probe_huge(
        &mut self,
        at: *mut c_void,
        len: usize,
        kept_from: Option<usize>,
    ) -> Result<Option<usize>, MemoryError> {
        let (first, huge) = (at as usize, self.huge);
        if self.policy != Policy::WhereFree || !self.populate || huge == 0 {
            return Ok(kept_from);
        }
        let start = first.next_multiple_of(huge);
        let split = kept_from.map_or(first + len, |k| first + k);
        if split < start + PROBE_MIN * huge {
            // Too small to probe: timed whole, and judged with the commits
            // before it.
            let pages = split.saturating_sub(start) / huge;
            if pages > 0 {
                let t = (self.clock)();
                if !self.populate(at, split - first)? {
                    return Ok(kept_from);
                }
                self.tally.0 += pages;
                self.tally.1 += (self.clock)().saturating_sub(t);
                if self.tally.0 >= PROBE_MIN {
                    let (n, spent) = core::mem::take(&mut self.tally);
                    if spent / n as u32 > self.slow_huge {
                        self.found_slow();
                    }
                }
            }
            return Ok(kept_from);
        }
        // Probed anew while huge pages are held slow ([`REPROBE_MIN`]):
        // one huge page a step, so a slow one costs one slow huge page.
        let reprobe = self.slow_at.is_some_and(|t| t.elapsed() < SLOW_FOR);
        let mut from = first;
        while from < split {
            let step = match (reprobe, from == first) {
                (true, _) => 1,
                (false, true) => PROBE_FIRST,
                (false, false) => PROBE,
            };
            let to = (from.next_multiple_of(huge) + step * huge).min(split);
            let t = (self.clock)();
            if !self.populate(at.wrapping_byte_add(from - first), to - from)? {
                return Ok(kept_from);
            }
            let pages = ((to - from) / huge).max(1) as u32;
            if (self.clock)().saturating_sub(t) / pages > self.slow_huge {
                // Slow, even in the commit's last step: the next commits
                // take base pages for a while ([`SLOW_FOR`]).
                self.found_slow();
                if to == split {
                    break;
                }
                // SAFETY: `to..split` lies inside the range being
                // committed (inside a reservation of this layer), derived
                // from `at`; advice changes how its pages are backed,
                // never its contents.
                let _ = unsafe {
                    mm::madvise(
                        at.wrapping_byte_add(to - first),
                        split - to,
                        Advice::LinuxNoHugepage,
                    )
                };
                return Ok(Some(to - first));
            }
            from = to;
        }
        Ok(kept_from)
    }

    /// Huge pages were found slow now: this commit counts, and the commits
    /// of the next [`SLOW_FOR`] take base pages ([`Pages::huge_pages_slow`]).
    fn found_slow(&mut self) {
        self.slow_commits += 1;
        self.slow_at = Some(Instant::now());
    }

    /// Bytes given back in the last [`RECENT`] or so ([`Pages::given_back`]).
    fn recently_given_back(&self) -> usize {
        match self.given_back {
            (Some(t), n) if t.elapsed() < RECENT => n,
            _ => 0,
        }
    }

    /// Counts `len` bytes given back now ([`REPROBE_MIN`]).
    fn note_given_back(&mut self, len: usize) {
        let count = self.recently_given_back().saturating_add(len);
        self.given_back = (Some(Instant::now()), count);
    }

    /// Whether huge pages were found slow moments ago ([`SLOW_FOR`]) and
    /// the range of `len` bytes at `at` (just made writable) holds a whole
    /// one but fewer than [`REPROBE_MIN`] (a larger one is probed anew): the
    /// range is then kept from huge pages while it is populated (advised
    /// after, for khugepaged), counted as a slow commit.
    fn huge_pages_slow(&mut self, at: *mut c_void, len: usize) -> bool {
        let recent = self.slow_at.is_some_and(|t| t.elapsed() < SLOW_FOR);
        let huge = self.huge;
        let start = (at as usize).next_multiple_of(huge.max(1));
        let whole = huge > 0 && start + huge <= at as usize + len;
        if !recent || !whole || self.policy != Policy::WhereFree || !self.populate {
            return false;
        }
        // A large commit of memory just given back is probed anew
        // ([`REPROBE_MIN`]).
        let large = start + REPROBE_MIN * huge <= at as usize + len;
        let given = self.recently_given_back();
        if large && given >= len / 2 {
            self.given_back.1 = given.saturating_sub(len);
            return false;
        }
        self.slow_commits += 1;
        // SAFETY: the range lies inside a reservation of this layer and was
        // just made writable; advice changes how its pages are backed, never
        // its contents.
        let _ = unsafe { mm::madvise(at, len, Advice::LinuxNoHugepage) };
        true
    }

    /// Asks for huge pages for the range of `len` bytes at `at`, just made
    /// writable and not yet populated, as the policy says (see
    /// [`HugePages::Auto`]). Returns the offset from which the range was
    /// kept from huge pages only until it is populated (then
    /// [`Pages::commit`] advises that part, for khugepaged), or `None`.
    /// Advice only: a refusal leaves base pages.
    fn advise_commit(&self, at: *mut c_void, len: usize) -> Option<usize> {
        let huge = self.huge;
        if huge == 0 || self.policy == Policy::Off || self.policy == Policy::Unadvised {
            return None;
        }
        // Whole huge pages inside the range: none, nothing to ask for.
        let (first, last) = (at as usize, at as usize + len);
        let start = first.next_multiple_of(huge);
        let end = last & !(huge - 1);
        if start >= end {
            return None;
        }
        let blocks = (end - start) / huge;
        let take = if self.policy == Policy::Advise {
            blocks
        } else {
            thp::huge_pages_to_take((self.free_huge)(huge, self.page), blocks)
        };
        // Huge pages below `split`, base pages from it on.
        let split = match take {
            0 => first,
            t if t == blocks => last,
            t => start + t * huge,
        };
        for (from, to, advice) in [
            (first, split, Advice::LinuxHugepage),
            (split, last, Advice::LinuxNoHugepage),
        ] {
            if from < to {
                // SAFETY: `from..to` lies inside the range being committed,
                // inside a reservation of this layer (the `Memory`
                // contract), derived from `at`; advice changes how its pages
                // are backed, never its contents.
                let _ =
                    unsafe { mm::madvise(at.wrapping_byte_add(from - first), to - from, advice) };
            }
        }
        (split < last).then_some(split - first)
    }

    /// Faults the range of `len` bytes at `at` (just made writable) in at
    /// once, `madvise(MADV_POPULATE_WRITE)`: one call instead of a trap per
    /// page. `Ok(true)` when populated; `Ok(false)` when the kernel refused
    /// it for another reason than memory (the pages then fault in as they
    /// are written); `Err` when the system has no memory for it.
    fn populate(&mut self, at: *mut c_void, len: usize) -> Result<bool, MemoryError> {
        if !self.populate {
            return Ok(false);
        }
        // A signal may interrupt it; a few tries, then it is left to the
        // first touches.
        for _ in 0..4 {
            // SAFETY: the range lies inside a reservation of this layer and
            // was just made readable and writable; populating writes nothing
            // to it (fresh pages read as zero, present ones are kept).
            match unsafe { mm::madvise(at, len, Advice::LinuxPopulateWrite) } {
                Ok(()) => return Ok(true),
                Err(Errno::INTR | Errno::AGAIN) => {}
                // Before Linux 5.14 (unknown advice): never asked again.
                Err(Errno::INVAL) => {
                    self.populate = false;
                    return Ok(false);
                }
                Err(e @ Errno::NOMEM) => return Err(os_error(MemoryOp::Commit, len, e)),
                Err(_) => return Ok(false),
            }
        }
        Ok(false)
    }

    /// Replaces the range of `len` bytes at `at` by a fresh `PROT_NONE`
    /// mapping: its pages and their commit charge go back at once.
    ///
    /// # Safety
    /// The range lies inside a reservation of this layer, is
    /// granule-aligned, and holds nothing anyone may read (no live block).
    unsafe fn unmap_pages(&self, at: *mut c_void, len: usize) -> Result<(), MemoryError> {
        // SAFETY: the caller's promise: replacing the range's mapping loses
        // nothing anyone may read and touches no other mapping.
        let mapped = unsafe {
            mm::mmap_anonymous(
                at,
                len,
                ProtFlags::empty(),
                MapFlags::PRIVATE | MapFlags::FIXED,
            )
        };
        match mapped {
            Ok(p) if p == at => {}
            Ok(p) => debug_assert_eq!(p, at, "MAP_FIXED maps at the address given"),
            // Out of mappings (`vm.max_map_count`), say: the range keeps its
            // pages, still committed, as the contract allows.
            Err(e) => return Err(os_error(MemoryOp::Decommit, len, e)),
        }
        Ok(())
    }

    /// Settles the lazily given back parts of the range of `len` bytes at
    /// `at`, just made writable: one write per page ends `MADV_FREE` on it
    /// (a page the kernel took comes back zeroed), so its bytes stay as
    /// they are from now on; the parts leave `lazy`.
    fn settle(&mut self, at: *mut u8, len: usize) {
        let (start, end) = (at as usize, at as usize + len);
        let mut i = 0;
        while i < self.lazy.len() {
            let (s, e) = self.lazy[i];
            let (lo, hi) = (s.max(start), e.min(end));
            if lo >= hi {
                i += 1;
                continue;
            }
            let mut addr = lo;
            while addr < hi {
                // SAFETY: `addr` is a page of the range just committed (it
                // lies in `[start, end)`, made readable and writable by the
                // caller, inside a reservation of this layer), derived from
                // `at` with its provenance; the arena hands out nothing in a
                // range it is committing, so no one else reads or writes it.
                unsafe { at.wrapping_add(addr - start).write_volatile(0) };
                addr += self.page;
            }
            match (s < lo, hi < e) {
                (false, false) => {
                    self.lazy.swap_remove(i);
                    continue;
                }
                (true, false) => self.lazy[i].1 = lo,
                (false, true) => self.lazy[i].0 = hi,
                (true, true) => {
                    self.lazy[i].1 = lo;
                    self.lazy.push((hi, e));
                }
            }
            i += 1;
        }
    }

    /// Notes `[start, end)` as given back lazily, merged with a range it
    /// touches.
    fn note_lazy(&mut self, start: usize, end: usize) {
        if let Some(r) = self.lazy.iter_mut().find(|r| r.1 == start || r.0 == end) {
            *r = (r.0.min(start), r.1.max(end));
        } else {
            self.lazy.push((start, end));
        }
    }

    /// Whether the layer asks for transparent huge pages.
    pub fn huge_pages(&self) -> bool {
        self.huge > 0
    }

    /// The settings.
    pub fn config(&self) -> PagesConfig {
        self.config
    }
}

impl Default for Pages {
    fn default() -> Self {
        Self::new(PagesConfig::default())
    }
}

/// Bytes of address space the process may still map under a finite
/// `RLIMIT_AS` (its soft limit less its current `VmSize`), or `None` with no
/// limit.
pub(crate) fn address_space_left() -> Option<usize> {
    use rustix::process::{getrlimit, Resource};
    let limit = getrlimit(Resource::As).current?;
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    // `/proc/self/statm` starts with the mapped size in pages; unreadable
    // means the whole limit is assumed used, so the reservation is the
    // first request.
    let mapped = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<usize>().ok())
        .map_or(limit, |pages| {
            pages.saturating_mul(rustix::param::page_size())
        });
    Some(limit.saturating_sub(mapped))
}

fn os_error(op: MemoryOp, bytes: usize, e: rustix::io::Errno) -> MemoryError {
    MemoryError {
        op,
        bytes,
        code: Some(ErrorCode::Os(e.raw_os_error())),
    }
}

impl Memory for Pages {
    type Ptr = NonNull<u8>;

    fn props(&self) -> MemoryProps {
        MemoryProps {
            granule: self.page,
            huge: self.huge,
            zeroed: self.config.give_back == GiveBack::Now,
            host_accessible: true,
            committed_on_reserve: false,
        }
    }

    fn reservation_size(&self, min: usize, cap: usize) -> usize {
        // The cap, down to whole pages (committed bytes never pass it), or
        // the configured reservation: a request past it is
        // `ReservationExhausted`, the first as any later one.
        let mut want = if cap != usize::MAX {
            cap & !(self.page - 1)
        } else {
            self.config.reservation
        };
        // Under `RLIMIT_AS`, half of what the process has left, but at
        // least this request (the reservation is then tried at that size and
        // may still fail, as a `malloc` would).
        if let Some(left) = address_space_left() {
            want = want.min((left / 2).max(min));
        }
        if cap != usize::MAX {
            return want & !(self.page - 1);
        }
        // Whole pages (huge pages where there are some).
        let step = self.huge.max(self.page);
        want.checked_next_multiple_of(step)
            .unwrap_or(want & !(step - 1))
    }

    fn reserve(&mut self, len: usize, align: usize) -> Result<NonNull<u8>, MemoryError> {
        let refused = |code| MemoryError {
            op: MemoryOp::Reserve,
            bytes: len,
            code,
        };
        // Aligned to the huge page size too, so that huge pages line up
        // with the arena's offsets.
        let align = align.max(self.huge).max(self.page);
        let Some(total) = len.checked_add(align - self.page) else {
            return Err(refused(None));
        };
        if len == 0 || len % self.page != 0 {
            return Err(refused(None));
        }
        // SAFETY: a new anonymous mapping at an address of the kernel's
        // choosing (null hint, no MAP_FIXED) replaces nothing.
        let raw = unsafe {
            mm::mmap_anonymous(
                core::ptr::null_mut(),
                total,
                ProtFlags::empty(),
                // No `MAP_NORESERVE`: a `PROT_NONE` private mapping is not
                // charged, and leaving the flag out makes `commit`'s
                // `mprotect` charge what it makes writable (see the type's
                // docs).
                MapFlags::PRIVATE,
            )
        }
        .map_err(|e| os_error(MemoryOp::Reserve, len, e))?;
        let start = raw as usize;
        let aligned = start.next_multiple_of(align);
        let (head, tail) = (aligned - start, total - (aligned - start) - len);
        if head > 0 {
            // SAFETY: `raw..raw + head` is the start of the mapping just
            // made, which nothing uses.
            let _ = unsafe { mm::munmap(raw, head) };
        }
        if tail > 0 {
            // SAFETY: the `tail` bytes after `aligned + len` are the end of
            // the mapping just made, which nothing uses.
            let _ = unsafe { mm::munmap(raw.wrapping_byte_add(head + len), tail) };
        }
        // No advice here: each commit asks for huge pages as the policy says.
        let base = raw.wrapping_byte_add(head);
        NonNull::new(base.cast::<u8>()).ok_or(refused(None))
    }

    fn commit(&mut self, base: NonNull<u8>, offset: usize, len: usize) -> Result<(), MemoryError> {
        let at = Self::at(base, offset).as_ptr().cast::<c_void>();
        // SAFETY: the arena commits granule-aligned ranges inside a
        // reservation of this layer (the `Memory` contract): making them
        // readable and writable affects no other mapping.
        unsafe { mm::mprotect(at, len, MprotectFlags::READ | MprotectFlags::WRITE) }
            .map_err(|e| os_error(MemoryOp::Commit, len, e))?;
        let slow = self.huge_pages_slow(at, len);
        let kept_from_huge = if slow {
            Some(0)
        } else {
            self.advise_commit(at, len)
        };
        if !self.lazy.is_empty() {
            self.settle(at.cast::<u8>(), len);
        }
        // Kept from huge pages from its start (`slow`): nothing is probed.
        let probed = self.probe_huge(at, len, kept_from_huge);
        match probed.and_then(|kept| Ok((kept, self.populate(at, len)?))) {
            Ok((kept_from_huge, populated)) => {
                if let Some(off) = kept_from_huge.filter(|_| populated) {
                    // Every page is present, so no fault in the range can
                    // compact now; advised, khugepaged (the kernel's own
                    // thread, under its own `defrag`) may collapse it.
                    // SAFETY: as in `advise_commit`: `off < len`, the part
                    // lies in the range being committed, and advice never
                    // changes its contents.
                    let _ = unsafe {
                        mm::madvise(at.wrapping_byte_add(off), len - off, Advice::LinuxHugepage)
                    };
                }
                Ok(())
            }
            Err(e) => {
                // No memory for it: the range goes back as it was, given
                // back, and the commit fails as an `mprotect` refusal would.
                // SAFETY: the range lies inside a reservation of this layer
                // and holds no live block (the arena hands out nothing in a
                // range it is committing).
                let _ = unsafe { self.unmap_pages(at, len) };
                Err(e)
            }
        }
    }

    fn decommit(
        &mut self,
        base: NonNull<u8>,
        offset: usize,
        len: usize,
    ) -> Result<(), MemoryError> {
        let at = Self::at(base, offset).as_ptr().cast::<c_void>();
        if self.config.give_back == GiveBack::Lazily {
            // SAFETY: the range lies inside a reservation of this layer
            // (granule-aligned, not released) and holds no live block (the
            // arena decommits free granules only): the kernel may drop its
            // contents, which no one reads before `commit` settles them.
            if unsafe { mm::madvise(at, len, Advice::LinuxFree) }.is_ok() {
                self.note_lazy(at as usize, at as usize + len);
                return Ok(());
            }
            // Refused (a kernel before 4.5): given back at once below.
        }
        // A new `PROT_NONE` mapping over the range: its pages go, and so does
        // their commit charge (`madvise(MADV_DONTNEED)` then `PROT_NONE`
        // would keep the charge of memory once touched).
        // SAFETY: the range lies inside a reservation of this layer (the
        // `Memory` contract: granule-aligned, not released) and holds no
        // live block (the arena decommits free granules only).
        unsafe { self.unmap_pages(at, len) }?;
        self.note_given_back(len);
        Ok(())
    }

    fn lazily_given_back(&self) -> usize {
        self.lazy.iter().map(|&(s, e)| e - s).sum()
    }

    fn slow_huge_commits(&self) -> u64 {
        self.slow_commits
    }

    fn give_back_now(&mut self) -> usize {
        let mut done = 0;
        let lazy = core::mem::take(&mut self.lazy);
        for (start, end) in lazy {
            // SAFETY: a lazy range was decommitted (inside a reservation of
            // this layer, granule-aligned, no live block) and has not been
            // committed since; a released reservation took its ranges out.
            match unsafe { self.unmap_pages(start as *mut c_void, end - start) } {
                Ok(()) => done += end - start,
                Err(_) => self.lazy.push((start, end)),
            }
        }
        done
    }

    fn release(&mut self, base: NonNull<u8>, len: usize, _align: usize) {
        let (start, end) = (base.as_ptr() as usize, base.as_ptr() as usize + len);
        self.lazy.retain(|&(s, e)| e <= start || s >= end);
        // SAFETY: `base..base + len` is a reservation of this layer that the
        // arena releases once, with nothing live in it.
        let _ = unsafe { mm::munmap(base.as_ptr().cast(), len) };
    }

    fn at(base: NonNull<u8>, offset: usize) -> NonNull<u8> {
        NonNull::new(base.as_ptr().wrapping_add(offset)).unwrap_or(base)
    }

    fn address(ptr: NonNull<u8>) -> usize {
        ptr.as_ptr() as usize
    }
}

// SAFETY: 1. each range is a mapping of its own, made by `reserve` and
// unmapped only by `release`, at a fixed address; 2. `commit` makes it
// readable and writable (process-wide), and anonymous private memory reads
// as zero when first touched, and after a decommit either as zero (a fresh
// mapping) or, given back lazily, as what it held or zero, fixed by the
// write per page that `commit` makes before the range is used: it is
// initialized and does not change under a reader; 3. `at` offsets `base`
// with its provenance.
unsafe impl HostMemory for Pages {}

#[cfg(test)]
#[path = "pages_tests.rs"]
mod policy_tests;
