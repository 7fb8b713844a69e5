//! What the fuzz models of planned runs share ([`plans`](crate::plans) and
//! the plan families under it): recordings decoded from fuzz bytes, live
//! blocks with their fill byte, and the checks after every step. It sits
//! below both, so that neither imports the other for it.

use crate::checks;
use crate::Counting;
use arbitrary::{Arbitrary, Unstructured};
use tensor_arena::plan::PlanEvent;
use tensor_arena::{Block, Heap, Recording};

/// Most blocks in a decoded recording.
const MAX_BLOCKS: usize = 48;
/// Most events in a decoded recording, and steps of a run.
pub(crate) const MAX_EVENTS: usize = 160;

/// A recording: mostly a valid run (allocations in order, frees of live
/// blocks), sometimes corrupted.
pub(crate) fn recording(u: &mut Unstructured<'_>) -> arbitrary::Result<Recording> {
    let n = usize::from(u8::arbitrary(u)?) % MAX_BLOCKS;
    let mut rec = Recording::new();
    for _ in 0..n {
        let raw = u16::arbitrary(u)?;
        // Sizes in 64-byte steps (as an arena with alignment 64 records
        // them) or, now and then, anything.
        let size = if raw & 0x8000 == 0 {
            (usize::from(raw & 0x3ff) + 1) * 64
        } else {
            usize::from(raw & 0x7fff)
        };
        let align = match u8::arbitrary(u)? % 8 {
            0..=4 => 64,
            5 => 128,
            6 => 4096,
            _ => usize::from(u8::arbitrary(u)?),
        };
        rec.blocks.push((size, align));
    }
    let mut allocated = 0u32;
    let mut live: Vec<u32> = Vec::new();
    while rec.events.len() < MAX_EVENTS && (allocated as usize) < n || !live.is_empty() {
        if rec.events.len() >= MAX_EVENTS {
            break;
        }
        let choice = u8::arbitrary(u).unwrap_or(0);
        match choice % 16 {
            // Corruptions: any event at all.
            15 => {
                let i = u32::from(u8::arbitrary(u).unwrap_or(0)) % (n as u32 + 2);
                rec.events.push(if choice & 0x10 == 0 {
                    PlanEvent::Alloc(i)
                } else {
                    PlanEvent::Free(i)
                });
                if i < n as u32 && choice & 0x10 == 0 {
                    allocated = allocated.max(i + 1);
                }
            }
            0..=8 if (allocated as usize) < n => {
                rec.events.push(PlanEvent::Alloc(allocated));
                live.push(allocated);
                allocated += 1;
            }
            _ if !live.is_empty() => {
                let k = usize::from(choice) % live.len();
                rec.events.push(PlanEvent::Free(live.swap_remove(k)));
            }
            // Nothing live and every block allocated: blocks left live
            // live to the end.
            _ if (allocated as usize) >= n => break,
            _ => {}
        }
        if u.is_empty() && (allocated as usize) >= n {
            break;
        }
    }
    Ok(rec)
}

/// A live block of a driven run and its fill byte.
pub(crate) struct Live<'a, 'c> {
    pub(crate) block: Block<'a, Heap<&'c Counting>>,
    pub(crate) fill: u8,
}

/// Drops live block `i`, or with `instead`, the `instead % len`th slot
/// (a free out of the recorded order); a slot already empty stays so.
pub(crate) fn free_slot<T>(live: &mut [Option<T>], i: u32, instead: Option<usize>) {
    let k = match instead {
        Some(k) if !live.is_empty() => k % live.len(),
        _ => i as usize,
    };
    if let Some(slot) = live.get_mut(k) {
        *slot = None;
    }
}

/// No two live blocks overlap, and every fill pattern is intact.
pub(crate) fn check<'a, 'b: 'a, 'c: 'b>(live: impl Iterator<Item = &'a Live<'b, 'c>> + Clone) {
    let mut ranges: Vec<(usize, usize)> = live
        .clone()
        .filter(|l| !l.block.is_empty())
        .map(|l| {
            (
                l.block.as_ptr() as usize,
                l.block.as_ptr() as usize + l.block.len(),
            )
        })
        .collect();
    checks::disjoint(&"plans", "live blocks", &mut ranges);
    for l in live {
        assert!(
            l.block.iter().all(|&b| b == l.fill),
            "a live block was overwritten"
        );
    }
}
