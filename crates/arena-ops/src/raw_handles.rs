//! [`Op::Raw`](crate::Op::Raw): the core, [`RawArena`], whose handles are
//! `Copy`, driven with stale and foreign frees among valid ones.
//!
//! Two fresh arenas (`one`, and `two` for foreign handles) over a counting
//! `Heap`. Every handle ever handed out is kept: live ones, and freed ones
//! (stale). A stale free must be [`FreeError::AlreadyFree`] and a foreign one
//! [`FreeError::Foreign`], and neither may change anything: after every
//! step each live block still has its capacity, no two overlap, and the
//! stats count exactly the live blocks. Runs of `one` are learned as plans
//! and repeated, so planned handles go stale across runs too.

use crate::checks;
use crate::op::RawOp;
use crate::Counting;
use std::sync::Arc;
use tensor_arena::{ArenaConfig, FreeError, Handle, Heap, Plan, RawArena};

type Core<'c> = RawArena<Heap<&'c Counting>>;

struct Live {
    handle: Handle,
    addr: usize,
    len: usize,
}

/// One arena of the pair and the handles it handed out.
struct Side<'c> {
    core: Core<'c>,
    live: Vec<Live>,
    stale: Vec<Handle>,
}

impl<'c> Side<'c> {
    fn new(counting: &'c Counting) -> Self {
        let config = ArenaConfig {
            max_reserved: 16 << 20,
            ..ArenaConfig::default()
        };
        Self {
            core: RawArena::new(config, Heap::new(counting)).expect("a valid configuration"),
            live: Vec::new(),
            stale: Vec::new(),
        }
    }

    fn free(&mut self, index: u8) {
        if self.live.is_empty() {
            return;
        }
        let l = self.live.swap_remove(usize::from(index) % self.live.len());
        self.core.free(l.handle).expect("a live handle frees");
        self.stale.push(l.handle);
    }

    /// Live blocks have their capacity, do not overlap, and are what the
    /// stats count.
    fn check(&self, at: &str) {
        let mut ranges = Vec::with_capacity(self.live.len());
        for l in &self.live {
            assert!(
                self.core.capacity(l.handle) >= l.len,
                "{at}: a live block lost its capacity"
            );
            ranges.push((l.addr, l.addr + l.len));
        }
        checks::disjoint(&at, "raw blocks", &mut ranges);
        assert_eq!(self.core.stats().live_blocks, self.live.len(), "{at}");
    }
}

/// Frees one of `from`'s handles (live or freed) in `into`: refused as
/// foreign, nothing changes.
fn foreign(at: &str, from: &Side<'_>, into: &mut Side<'_>, index: u8) {
    let handles: Vec<Handle> = from
        .live
        .iter()
        .map(|l| l.handle)
        .chain(from.stale.iter().copied())
        .collect();
    if handles.is_empty() {
        return;
    }
    let h = handles[usize::from(index) % handles.len()];
    let before = into.core.stats();
    assert_eq!(into.core.free(h), Err(FreeError::Foreign), "{at}");
    assert_eq!(into.core.capacity(h), 0, "{at}");
    assert_eq!(before.in_use, into.core.stats().in_use, "{at}");
}

/// Runs the steps of one [`Op::Raw`](crate::Op::Raw).
///
/// # Panics
/// When a stale or foreign free is accepted, changes anything, or a check
/// fails.
pub(crate) fn run_raw(at: &str, ops: &[RawOp]) {
    let counting = Counting::new();
    {
        let mut one = Side::new(&counting);
        let mut two = Side::new(&counting);
        let mut plan: Option<Arc<Plan>> = None;
        for (i, op) in ops.iter().enumerate() {
            let at = format!("{at}, raw step {i} ({op:?})");
            match *op {
                RawOp::Alloc { size, second } => {
                    let side = if second { &mut two } else { &mut one };
                    let len = usize::from(size) + 1;
                    if let Ok(a) = side.core.alloc(len, 64) {
                        side.live.push(Live {
                            handle: a.handle,
                            addr: a.ptr.as_ptr() as usize,
                            len,
                        });
                    }
                }
                RawOp::Free { index, second } => {
                    if second {
                        two.free(index);
                    } else {
                        one.free(index);
                    }
                }
                RawOp::Stale { index } => {
                    for side in [&mut one, &mut two] {
                        if side.stale.is_empty() {
                            continue;
                        }
                        let h = side.stale[usize::from(index) % side.stale.len()];
                        let before = side.core.stats();
                        assert_eq!(side.core.free(h), Err(FreeError::AlreadyFree), "{at}");
                        assert_eq!(side.core.capacity(h), 0, "{at}");
                        let after = side.core.stats();
                        assert_eq!((before.in_use, before.frees), (after.in_use, after.frees));
                    }
                }
                RawOp::Foreign { index } => {
                    foreign(&at, &one, &mut two, index);
                    foreign(&at, &two, &mut one, index);
                }
                RawOp::Run => {
                    if one.core.in_run() {
                        let (report, rec) = one.core.finish_run();
                        if report.leaked_blocks == 0 {
                            plan = Plan::from_recording(&rec).ok().map(Arc::new);
                        }
                    } else {
                        let _ = one.core.begin_run(plan.clone(), true);
                    }
                }
            }
            one.check(&at);
            two.check(&at);
        }
        for side in [&mut one, &mut two] {
            if side.core.in_run() {
                side.core.finish_run();
            }
            while !side.live.is_empty() {
                side.free(0);
            }
            assert_eq!(side.core.stats().in_use, 0, "{at}: raw blocks left");
        }
    }
    assert_eq!(counting.outstanding(), 0, "{at}: raw arenas leaked memory");
}
