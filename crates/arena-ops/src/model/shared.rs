//! The `SharedArena` part of the model: an [`Op::Shared`] step runs two
//! threads on one shared arena, and its checks.

use super::{align_up, At, Model, SharedLive};
use crate::checks;
use crate::op::{SharedOp, CAP, GRANULE};
use crate::pattern;
use crate::Counting;
use tensor_arena::{ArenaError, Heap, SharedArena};

impl<'a, 'c, 's> Model<'a, 'c, 's> {
    pub(super) fn shared_step(&mut self, at: &At<'_>, a: &[SharedOp], b: &[SharedOp]) {
        // Deal the blocks still live to the two threads, alternately, so that
        // blocks allocated on one thread are freed on another.
        let mut hands: [Vec<SharedLive<'s, 'c>>; 2] = [Vec::new(), Vec::new()];
        for (i, l) in self.shared_live.drain(..).enumerate() {
            hands[i % 2].push(l);
        }
        let [hand_a, hand_b] = hands;
        let shared = self.shared;
        let seed = at.step as u8;
        let back = std::thread::scope(|s| {
            let ta = s.spawn(move || shared_thread(shared, a, hand_a, seed));
            let tb = s.spawn(move || shared_thread(shared, b, hand_b, seed ^ 0x80));
            let mut back = ta.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            back.extend(tb.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
            back
        });
        self.shared_live = back;
    }

    pub(super) fn check_shared(&self, at: &At<'_>) {
        #[cfg(any(fuzzing, feature = "check-invariants"))]
        self.shared.lock().check_invariants();
        let st = self.shared.stats();
        let mut ranges = Vec::with_capacity(self.shared_live.len());
        for l in &self.shared_live {
            if l.block.is_empty() {
                continue;
            }
            let addr = l.block.as_ptr() as usize;
            assert_eq!(
                addr % GRANULE,
                0,
                "{at}: shared block at {addr:#x} misaligned"
            );
            if let Some(i) = pattern::first_mismatch(&l.block, l.seed) {
                panic!("{at}: pattern lost at {addr:#x}+{i} of a shared block");
            }
            let size = align_up(l.block.len(), GRANULE).expect("a served size");
            ranges.push((addr, addr + size));
        }
        let sum = checks::disjoint(at, "shared blocks", &mut ranges);
        assert_eq!(st.in_use, sum, "{at}: shared in_use");
        assert_eq!(st.live_blocks, ranges.len(), "{at}: shared live blocks");
        assert!(
            st.in_use <= st.reserved && st.reserved <= CAP,
            "{at}: {st:?}"
        );
        assert_eq!(
            self.shared_counting.outstanding(),
            st.reserved,
            "{at}: shared backing bytes"
        );
    }
}

/// The blocks a thread of an [`Op::Shared`] step holds; leaked rather than
/// freed if the thread panics (see `Model`'s drop).
struct Hand<'s, 'c>(Vec<SharedLive<'s, 'c>>);

impl Drop for Hand<'_, '_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.drain(..).for_each(std::mem::forget);
        }
    }
}

/// One thread of an [`Op::Shared`] step: runs `ops` against `shared` with the
/// blocks it was dealt, and gives back the blocks still live.
fn shared_thread<'s, 'c>(
    shared: &'s SharedArena<Heap<&'c Counting>>,
    ops: &[SharedOp],
    mine: Vec<SharedLive<'s, 'c>>,
    seed: u8,
) -> Vec<SharedLive<'s, 'c>> {
    let mut hand = Hand(mine);
    let mine = &mut hand.0;
    for (i, op) in ops.iter().enumerate() {
        match *op {
            SharedOp::Alloc { size } => match shared.try_alloc(size as usize) {
                Ok(mut block) => {
                    let seed = seed.wrapping_add(i as u8).wrapping_mul(13);
                    pattern::fill(&mut block, seed);
                    mine.push(SharedLive { block, seed });
                }
                Err(ArenaError::OverCap { limit, .. }) => assert_eq!(limit, CAP),
                Err(e) => panic!("shared thread op {i} ({op:?}): unexpected error {e}"),
            },
            SharedOp::Free { index } => {
                if !mine.is_empty() {
                    let l = mine.swap_remove(index as usize % mine.len());
                    if let Some(at) = pattern::first_mismatch(&l.block, l.seed) {
                        panic!(
                            "shared thread op {i}: pattern lost at +{at} of a block being freed"
                        );
                    }
                }
            }
            SharedOp::Shrink => {
                shared.shrink();
            }
        }
    }
    std::mem::take(mine)
}
