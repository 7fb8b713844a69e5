//! [`run`]: applies operations to real arenas and checks them against a
//! simple model (the list of live blocks) after every step.

use crate::checks;
use crate::counting::Counting;
use crate::op::{
    align_from_log2, Op, CAP, GRANULE, MAX_ALIGN, MAX_PLANS, MAX_REQUEST, MAX_SESSIONS,
};
use crate::pattern;

mod budget;
mod session;
mod shared;
pub use budget::{run_budget, BudgetReport};
use session::weights;
use std::fmt;
use std::mem::ManuallyDrop;
use std::sync::Arc;
use tensor_arena::allocator_api2::vec::Vec as AVec;
use tensor_arena::plan::Plan;
use tensor_arena::{
    Arena, ArenaConfig, ArenaError, Block, Heap, Run, SharedArena, SharedBlock, Stats,
};
use tensor_session::{Session, SessionConfig};

/// The configuration of the arenas [`run`] drives: the defaults (64-byte
/// granule, 4 KiB maximum alignment, power-of-two growth, relayout after
/// growth) under a cap of [`CAP`] bytes.
pub fn config() -> ArenaConfig {
    ArenaConfig {
        max_reserved: CAP,
        ..ArenaConfig::default()
    }
}

/// Where a check failed: the step number and its operation.
struct At<'o> {
    step: usize,
    op: &'o Op,
}

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "step {} ({:?})", self.step, self.op)
    }
}

/// A live block of the single-threaded arena and what the model knows of it.
struct Live<'a, 'c> {
    block: Block<'a, Heap<&'c Counting>>,
    seed: u8,
    /// Alignment asked for.
    align: usize,
    /// The run it was allocated in.
    run: Option<u64>,
    /// Whether it was served from a plan (inside the plan's block, which
    /// the arena lists as one live span).
    planned: bool,
}

/// A live block of the shared arena.
struct SharedLive<'s, 'c> {
    block: SharedBlock<'s, Heap<&'c Counting>>,
    seed: u8,
}

/// The open run: the arena's handle, its id, and the stats when it began.
struct OpenRun<'a, 'c> {
    run: Run<'a, Heap<&'c Counting>>,
    id: u64,
    begin: Stats,
    /// Whether a plan serves it.
    planned: bool,
    /// Whether it was opened recorded (as a plain run).
    recorded: bool,
}

/// What a request must give, as far as the model can tell.
#[derive(Debug)]
enum Expect {
    /// An empty block holding no memory (a zero-size request).
    Empty,
    /// This error, and nothing changed.
    Fail(ArenaError),
    /// A block of `rounded` bytes, or `OverCap` if the cached memory cannot
    /// hold it and the cap leaves no room to grow, or `BackingFailed` if a
    /// backing failure was injected.
    Served { rounded: usize },
}

fn align_up(x: usize, align: usize) -> Option<usize> {
    Some(x.checked_add(align - 1)? & !(align - 1))
}

/// The documented outcome of a request for `len` bytes at `align` on an
/// arena holding `reserved` bytes.
fn expect(len: usize, align: usize, reserved: usize) -> Expect {
    if !align.is_power_of_two() {
        return Expect::Fail(ArenaError::InvalidAlignment { align });
    }
    if len == 0 {
        return Expect::Empty;
    }
    if align > MAX_ALIGN {
        return Expect::Fail(ArenaError::AlignmentTooLarge {
            align,
            max: MAX_ALIGN,
        });
    }
    match align_up(len, GRANULE) {
        Some(rounded) if rounded <= MAX_REQUEST => {
            if rounded > CAP {
                Expect::Fail(ArenaError::OverCap {
                    requested: rounded,
                    reserved,
                    limit: CAP,
                })
            } else {
                Expect::Served { rounded }
            }
        }
        _ => Expect::Fail(ArenaError::CapacityOverflow { requested: len }),
    }
}

/// `after` with the counters a refused request may move set back to
/// `before`'s: a planned run counts any request it did not record as a
/// deviation, even one that is then refused.
fn unchanged(mut after: Stats, before: &Stats, loose: bool) -> Stats {
    if after.deviations == before.deviations + 1 || (loose && after.deviations == before.deviations)
    {
        // The request left its run's plan (or, the run having left it
        // already and being served inside the plan's block, could be
        // served there no longer): counted, and the plan's block
        // dissolved into the pool (its unused part is free memory now),
        // before the request was refused. Nothing live or reserved moved.
        after.deviations = before.deviations;
        after.free_bytes = before.free_bytes;
        after.largest_free_block = before.largest_free_block;
    }
    after
}

/// Applies `ops` to a fresh [`Arena`] (capped at [`CAP`], over a
/// [`Counting`] backing allocator), a [`SharedArena`] driven from two
/// threads, and a small [`Session`] with its clones; after every step checks:
///
/// - live blocks do not overlap, are aligned as asked (and to the granule),
///   and still hold the pattern written when they were handed out;
/// - each request gives the documented result (errors for bad sizes and
///   alignments, `OverCap` only when neither the cache nor the cap allow the
///   request, `BackingFailed` only when a failure was injected), and a
///   refused request changes nothing;
/// - `in_use` is the sum of live block sizes, `in_use <= reserved <= CAP`,
///   and the backing allocator holds exactly `reserved` bytes in `regions`
///   allocations;
/// - run reports, shrinks and session stats agree with the model;
///
/// and at the end that every region went back: backing allocations equal
/// frees and no byte is outstanding. Returns the arena's stats after the
/// last step (before everything is dropped).
///
/// # Panics
/// On the first broken invariant, with the step and operation in the message.
pub fn run(ops: &[Op]) -> Stats {
    let counting = Counting::new();
    let shared_counting = Counting::new();
    let last = {
        let arena = Arena::with_backing(config(), &counting);
        let shared = SharedArena::with_backing(config(), &shared_counting);
        let mut model = Model {
            arena: &arena,
            counting: &counting,
            live: Vec::new(),
            run: None,
            next_run: 1,
            plans: Vec::new(),
            template: Session::new(weights(), SessionConfig::default()),
            sessions: Vec::new(),
            shared: &shared,
            shared_counting: &shared_counting,
            shared_live: Vec::new(),
        };
        for (step, op) in ops.iter().enumerate() {
            let at = At { step, op };
            model.apply(&at);
            model.check(&at);
        }
        let last = arena.stats();
        model.finish();
        last
    };
    for (name, c) in [("arena", &counting), ("shared arena", &shared_counting)] {
        assert_eq!(
            c.allocs(),
            c.frees(),
            "{name}: backing allocations and frees differ after drop"
        );
        assert_eq!(
            c.outstanding(),
            0,
            "{name}: bytes still held from the backing allocator after drop"
        );
    }
    last
}

/// Everything [`run`] drives, and what it expects of it.
struct Model<'a, 'c, 's> {
    arena: &'a Arena<Heap<&'c Counting>>,
    counting: &'c Counting,
    live: Vec<Live<'a, 'c>>,
    run: Option<OpenRun<'a, 'c>>,
    /// Id the next run must get.
    next_run: u64,
    /// Plans made from finished runs, oldest first.
    plans: Vec<Arc<Plan>>,
    /// The session clones are made from.
    template: Session,
    sessions: Vec<Session>,
    shared: &'s SharedArena<Heap<&'c Counting>>,
    shared_counting: &'c Counting,
    shared_live: Vec<SharedLive<'s, 'c>>,
}

impl<'a, 'c, 's> Model<'a, 'c, 's> {
    fn apply(&mut self, at: &At<'_>) {
        match *at.op {
            Op::Alloc { size, align_log2 } => self.alloc(at, size.0, align_from_log2(align_log2)),
            Op::Free { index } => {
                if !self.live.is_empty() {
                    let l = self.live.swap_remove(index as usize % self.live.len());
                    if let Some(i) = pattern::first_mismatch(&l.block, l.seed) {
                        panic!("{at}: pattern lost at +{i} of a block being freed");
                    }
                    let before = self.arena.stats();
                    let size = l.block.capacity();
                    drop(l);
                    let after = self.arena.stats();
                    assert_eq!(
                        after.in_use,
                        before.in_use - size,
                        "{at}: in_use after free"
                    );
                }
            }
            Op::BeginRun { recorded } => self.begin_run(at, None, recorded),
            Op::BeginPlannedRun { plan } => {
                let plan = (!self.plans.is_empty())
                    .then(|| Arc::clone(&self.plans[plan as usize % self.plans.len()]));
                // With no plan kept, a plain run, recorded as the first run
                // of a shape is.
                let recorded = plan.is_none();
                self.begin_run(at, plan, recorded);
            }
            Op::EndRun => self.end_run(at),
            Op::Shrink => {
                let watermark = self.arena.stats().watermark;
                self.shrink(at, watermark, |a| a.shrink());
            }
            Op::ShrinkTo { kib } => {
                let target = kib as usize * 1024;
                self.shrink(at, target, |a| a.shrink_to(target));
            }
            Op::ShrinkForPlans { plan } => {
                let block = match self.plans.len() {
                    0 => 0,
                    n => self.plans[plan as usize % n].size(),
                };
                // On `Heap`: `shrink_to` of what is live and the block.
                let target = self.arena.stats().in_use.saturating_add(block);
                self.shrink(at, target, |a| a.shrink_for_plans(block));
            }
            Op::FailBacking { calls } => self.counting.fail_next(u64::from(calls % 4)),
            Op::Collection { len } => self.collection(at, len % 2048),
            Op::SessionClone => {
                if self.sessions.len() < MAX_SESSIONS {
                    let clone = match self.sessions.last() {
                        Some(s) => s.try_clone(),
                        None => self.template.try_clone(),
                    };
                    let st = clone.stats().arena;
                    assert_eq!(st.reserved, 0, "{at}: a new clone's arena is not empty");
                    self.sessions.push(clone);
                }
            }
            Op::SessionDrop { index } => {
                if !self.sessions.is_empty() {
                    let i = index as usize % self.sessions.len();
                    drop(self.sessions.swap_remove(i));
                }
            }
            Op::SessionRun { index, size } => self.session_run(at, index, size as usize % 2048),
            Op::Shared { ref a, ref b } => self.shared_step(at, a, b),
            Op::Raw { ref ops } => crate::raw_handles::run_raw(&at.to_string(), ops),
        }
    }

    fn alloc(&mut self, at: &At<'_>, len: usize, align: usize) {
        let before = self.arena.stats();
        let calls = self.counting.calls();
        let may_fail = self.counting.may_fail();
        let want = expect(len, align, before.reserved);
        let got = self.arena.try_alloc_aligned(len, align);
        let run = self.run.as_ref().map(|r| r.id);
        let planned = self.arena.stats().planned_allocs > before.planned_allocs;
        match (want, got) {
            (Expect::Empty, Ok(block)) => {
                assert!(block.is_empty() && block.capacity() == 0, "{at}: {block:?}");
                assert_eq!(
                    self.arena.stats(),
                    before,
                    "{at}: an empty block changed stats"
                );
                self.live.push(Live {
                    block,
                    seed: 0,
                    align,
                    run,
                    planned: false,
                });
            }
            (Expect::Fail(want), Err(got)) => {
                assert_eq!(got, want, "{at}: wrong error");
                assert_eq!(
                    unchanged(self.arena.stats(), &before, self.loose(&before)),
                    before,
                    "{at}: a refused request changed stats"
                );
            }
            (Expect::Served { rounded }, Ok(mut block)) => {
                assert_eq!(block.len(), len, "{at}");
                assert_eq!(block.capacity(), rounded, "{at}: block size");
                let fits_cache = align <= GRANULE && rounded <= before.largest_free_block;
                if fits_cache || planned {
                    assert_eq!(
                        self.counting.calls(),
                        calls,
                        "{at}: a backing call for a request the cache could serve"
                    );
                }
                let after = self.arena.stats();
                assert_eq!(after.allocs, before.allocs + 1, "{at}");
                assert_eq!(after.in_use, before.in_use + rounded, "{at}");
                let seed = (at.step as u8).wrapping_mul(37).wrapping_add(1);
                pattern::fill(&mut block, seed);
                self.live.push(Live {
                    block,
                    seed,
                    align,
                    run,
                    planned,
                });
            }
            (
                Expect::Served { rounded },
                Err(ArenaError::OverCap {
                    requested,
                    reserved,
                    limit,
                }),
            ) => {
                assert_eq!(
                    (requested, reserved, limit),
                    (rounded, before.reserved, CAP),
                    "{at}"
                );
                assert!(
                    before.reserved + rounded > CAP,
                    "{at}: OverCap with room under the cap ({} reserved)",
                    before.reserved
                );
                assert!(
                    !(align <= GRANULE && rounded <= before.largest_free_block),
                    "{at}: OverCap though a cached span of {} bytes fits",
                    before.largest_free_block
                );
                assert_eq!(
                    unchanged(self.arena.stats(), &before, self.loose(&before)),
                    before,
                    "{at}: a refused request changed stats"
                );
            }
            (Expect::Served { rounded }, Err(ArenaError::BackingFailed { requested, region })) => {
                assert!(may_fail, "{at}: BackingFailed with no failure injected");
                assert_eq!((requested, region), (len, rounded), "{at}");
                let after = self.arena.stats();
                assert_eq!(
                    (after.in_use, after.live_blocks, after.allocs),
                    (before.in_use, before.live_blocks, before.allocs),
                    "{at}: a failed request changed the live blocks"
                );
            }
            (want, got) => panic!("{at}: expected {want:?}, got {got:?}"),
        }
    }

    fn begin_run(&mut self, at: &At<'_>, plan: Option<Arc<Plan>>, recorded: bool) {
        // On `Heap` (regions), a planned run that starts while blocks of
        // earlier runs are live (not blocks allocated outside any run) is
        // dynamic, and recorded.
        let pinned = plan.is_some()
            && self
                .live
                .iter()
                .any(|l| l.run.is_some() && !l.block.is_empty());
        let open = |plan: Option<Arc<Plan>>| match plan {
            Some(p) => self.arena.begin_planned_run(p),
            None if recorded => self.arena.try_begin_recorded_run(),
            None => self.arena.try_begin_run(),
        };
        if self.run.is_some() {
            let err = open(plan).map(|r| r.id());
            assert_eq!(err, Err(ArenaError::RunAlreadyOpen), "{at}: runs nested");
            return;
        }
        let begin = self.arena.stats();
        let planned = plan.is_some() && !pinned;
        let recorded = recorded || pinned;
        let run = match open(plan) {
            Ok(run) => run,
            Err(e) => {
                // Drawing the plan's block failed: documented as OverCap or
                // BackingFailed, and the caller may run unplanned.
                assert!(planned, "{at}: a plain run refused: {e}");
                assert!(
                    matches!(e, ArenaError::OverCap { .. })
                        || matches!(e, ArenaError::BackingFailed { .. }),
                    "{at}: a planned run refused with {e}"
                );
                let after = self.arena.stats();
                assert_eq!(
                    (after.in_use, after.live_blocks, after.runs),
                    (begin.in_use, begin.live_blocks, begin.runs),
                    "{at}: a refused planned run changed the arena"
                );
                return self.begin_run(at, None, recorded);
            }
        };
        assert_eq!(run.id(), self.next_run, "{at}: run id");
        assert!(self.arena.in_run(), "{at}");
        self.next_run += 1;
        self.run = Some(OpenRun {
            id: run.id(),
            run,
            begin,
            planned,
            recorded,
        });
    }

    fn end_run(&mut self, at: &At<'_>) {
        let Some(open) = self.run.take() else {
            assert!(
                !self.arena.in_run(),
                "{at}: a run is open that the model closed"
            );
            return;
        };
        let (report, recording) = open.run.finish_with_recording();
        let (begin, after) = (open.begin, self.arena.stats());
        assert_eq!(report.planned, open.planned, "{at}");
        assert!(!self.arena.in_run(), "{at}: the run is still open");
        let (leaked, leaked_bytes) = self
            .live
            .iter()
            .filter(|l| l.run == Some(open.id) && !l.block.is_empty())
            .fold((0, 0), |(n, b), l| (n + 1, b + l.block.capacity()));
        assert_eq!(report.run, open.id, "{at}");
        assert_eq!(
            report.allocs,
            after.allocs - begin.allocs,
            "{at}: report allocs"
        );
        assert_eq!(
            report.frees,
            after.frees - begin.frees,
            "{at}: report frees"
        );
        assert_eq!(
            (report.leaked_blocks, report.leaked_bytes),
            (leaked, leaked_bytes),
            "{at}: leaked blocks of the run"
        );
        assert_eq!(report.reserved, after.reserved, "{at}");
        assert_eq!(
            report.backing_allocs,
            after.backing_allocs - begin.backing_allocs,
            "{at}"
        );
        assert_eq!(
            report.backing_frees,
            after.backing_frees - begin.backing_frees,
            "{at}"
        );
        assert_eq!(after.runs, begin.runs + 1, "{at}");
        assert!(
            report.peak_in_use >= begin.in_use.max(after.in_use),
            "{at}: run peak"
        );
        if report.relaid_out {
            assert_eq!(after.in_use, 0, "{at}: relaid out with blocks live");
            // Not checked: `after.regions <= 1`. A relayout whose target is
            // over the cap is skipped yet reported as done (known bug, see
            // the arena's `reliability::a_skipped_relayout_is_not_reported`).
        }
        assert_eq!(
            after.planned_runs - begin.planned_runs,
            u64::from(open.planned),
            "{at}: planned runs"
        );
        assert_eq!(
            after.planned_allocs - begin.planned_allocs,
            report.planned_allocs,
            "{at}: planned allocations"
        );
        assert!(report.planned_allocs <= report.allocs, "{at}");
        assert!(
            !report.deviated || open.planned,
            "{at}: a plain run deviated"
        );
        assert!(
            open.planned || open.recorded || recording.is_empty(),
            "{at}: a run opened unrecorded returned a recording"
        );
        if report.leaked_blocks == 0 && !recording.is_empty() {
            let plan = match Plan::from_recording(&recording) {
                Ok(plan) => plan,
                Err(why) => panic!("{at}: the recording of the run does not plan: {why}"),
            };
            assert!(
                plan.size() >= plan.lower_bound(),
                "{at}: plan under its lower bound"
            );
            if self.plans.len() == MAX_PLANS {
                self.plans.remove(0);
            }
            self.plans.push(Arc::new(plan));
        }
    }

    fn shrink(
        &mut self,
        at: &At<'_>,
        target: usize,
        f: impl FnOnce(&Arena<Heap<&'c Counting>>) -> usize,
    ) {
        let before = self.arena.stats();
        let released = f(self.arena);
        let after = self.arena.stats();
        checks::shrink_accounting(at, &before, &after, released);
        assert_eq!(after.watermark, before.watermark, "{at}");
        let limit = align_up(target, GRANULE).unwrap_or(usize::MAX);
        if after.in_use == 0 && !self.plan_block_held() && before.reserved > limit {
            // Nothing live: the arena is laid out again as one region of the
            // target (or none, if the backing allocator refused it). A plan's
            // block, held while its run is open or a planned block is live,
            // pins its region like a live block.
            assert!(
                after.reserved <= limit,
                "{at}: nothing live, yet {} bytes stay reserved over the target {target}",
                after.reserved
            );
            assert!(
                after.regions <= 1,
                "{at}: {} regions after shrink",
                after.regions
            );
        }
    }

    fn collection(&mut self, at: &At<'_>, len: u16) {
        let before = self.arena.stats();
        {
            // Leaked, not freed, if a check fails meanwhile (see `Model`'s drop).
            let mut v: ManuallyDrop<AVec<u32, &Arena<Heap<&Counting>>>> =
                ManuallyDrop::new(AVec::new_in(self.arena));
            for i in 0..u32::from(len) {
                if v.try_reserve(1).is_err() {
                    break;
                }
                v.push(i ^ 0x5a5a);
            }
            for (i, &x) in v.iter().enumerate() {
                assert_eq!(x, i as u32 ^ 0x5a5a, "{at}: collection element {i}");
            }
            let st = self.arena.stats();
            if v.capacity() > 0 {
                assert_eq!(st.live_blocks, before.live_blocks + 1, "{at}");
                assert!(st.in_use >= before.in_use + v.capacity() * 4, "{at}");
            }
            // SAFETY: `v` is not used again.
            unsafe { ManuallyDrop::drop(&mut v) };
        }
        let after = self.arena.stats();
        assert_eq!(
            (after.in_use, after.live_blocks),
            (before.in_use, before.live_blocks),
            "{at}: the collection did not give its memory back"
        );
    }

    /// Whether the open run is planned and left its plan before `now`:
    /// it is served inside the plan's block until a request does not fit
    /// there, which dissolves the block.
    fn loose(&self, now: &Stats) -> bool {
        self.run
            .as_ref()
            .is_some_and(|r| r.planned && now.deviations > r.begin.deviations)
    }

    /// Whether the arena may hold a plan's block: a planned run is open, or
    /// a block served from a plan is still live.
    fn plan_block_held(&self) -> bool {
        self.live.iter().any(|l| l.planned) || self.run.as_ref().is_some_and(|r| r.planned)
    }

    /// The checks after every step.
    fn check(&self, at: &At<'_>) {
        #[cfg(any(fuzzing, feature = "check-invariants"))]
        self.arena.check_invariants();
        let st = self.arena.stats();
        let mut ranges = Vec::with_capacity(self.live.len());
        for l in &self.live {
            if l.block.is_empty() {
                continue;
            }
            let addr = l.block.as_ptr() as usize;
            let align = l.align.max(GRANULE);
            assert_eq!(
                addr % align,
                0,
                "{at}: block at {addr:#x} not aligned to {align:#x}"
            );
            if let Some(i) = pattern::first_mismatch(&l.block, l.seed) {
                panic!(
                    "{at}: pattern lost at {addr:#x}+{i} (block of {} bytes)",
                    l.block.len()
                );
            }
            ranges.push((addr, addr + l.block.capacity()));
        }
        let sum = checks::disjoint(at, "blocks", &mut ranges);
        assert_eq!(
            st.in_use, sum,
            "{at}: in_use is not the sum of live block sizes"
        );
        assert!(
            st.in_use <= st.reserved,
            "{at}: in_use {} > reserved {}",
            st.in_use,
            st.reserved
        );
        assert!(
            st.reserved <= CAP,
            "{at}: reserved {} over the cap",
            st.reserved
        );
        checks::free_bytes(at, &st);
        assert!(
            st.largest_free_block <= st.free_bytes,
            "{at}: largest free block {} > free bytes {}",
            st.largest_free_block,
            st.free_bytes
        );
        assert_eq!(
            self.counting.outstanding(),
            st.reserved,
            "{at}: the backing allocator holds other than the reserved bytes"
        );
        assert_eq!(
            (st.backing_allocs, st.backing_frees),
            (self.counting.allocs(), self.counting.frees()),
            "{at}: backing call counts"
        );
        assert_eq!(
            self.counting.allocs() - self.counting.frees(),
            st.regions as u64,
            "{at}: regions held"
        );
        // The arena lists the caller's blocks it carved from the pool: not
        // those served from a plan (which sit inside the plan's block), nor
        // the plan's block itself. `stats().live_blocks` counts them all.
        assert_eq!(st.live_blocks, ranges.len(), "{at}: live block count");
        let mut listed: Vec<usize> = self.arena.live_blocks().iter().map(|b| b.addr).collect();
        listed.sort_unstable();
        let mut plain: Vec<usize> = self
            .live
            .iter()
            .filter(|l| !l.planned && !l.block.is_empty())
            .map(|l| l.block.as_ptr() as usize)
            .collect();
        plain.sort_unstable();
        assert_eq!(
            listed, plain,
            "{at}: live_blocks() disagrees with the model"
        );
        // `free_bytes` counts the pool's free spans: the unused part of a
        // plan's block is neither in use nor free.
        if self.plan_block_held() {
            assert!(st.free_bytes <= st.reserved - st.in_use, "{at}: free bytes");
        } else {
            assert_eq!(st.free_bytes, st.reserved - st.in_use, "{at}: free bytes");
        }
        assert_eq!(self.arena.in_run(), self.run.is_some(), "{at}");

        let alive = self.template.stats().clones_alive;
        assert_eq!(alive, 1 + self.sessions.len(), "{at}: sessions alive");

        self.check_shared(at);
    }

    /// Drops everything in an order that is not the allocation order and
    /// checks that the arenas are empty.
    fn finish(mut self) {
        // Odd blocks first, then the rest: frees in a scattered order.
        let mut i = 0;
        self.live.retain(|_| {
            i += 1;
            i % 2 == 0
        });
        while let Some(l) = self.live.pop() {
            assert!(
                pattern::first_mismatch(&l.block, l.seed).is_none(),
                "final check"
            );
        }
        if let Some(open) = self.run.take() {
            let report = open.run.finish();
            assert_eq!(report.leaked_blocks, 0, "every block was dropped");
        }
        assert_eq!(
            self.arena.stats().in_use,
            0,
            "bytes in use after every block dropped"
        );
        self.shared_live.clear();
        assert_eq!(
            self.shared.stats().in_use,
            0,
            "shared bytes in use after every block dropped"
        );
        self.sessions.clear();
        assert_eq!(self.template.stats().clones_alive, 1);
    }
}

impl Drop for Model<'_, '_, '_> {
    /// While unwinding from a failed check, leaks the blocks and the open run
    /// instead of giving them back: giving them back would run the arena's
    /// checks again inside a destructor, and a second panic there aborts
    /// the process (and with it the test harness's report).
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.live.drain(..).for_each(std::mem::forget);
            self.shared_live.drain(..).for_each(std::mem::forget);
            if let Some(open) = self.run.take() {
                std::mem::forget(open);
            }
        }
    }
}
