//! A run that leaves its plan stays inside the plan's block while it can
//! ("repair in place"): every later block is still served at its planned
//! offset where nothing live is there, and a block that does not fit its
//! slot (larger, extra, or in the way of one that outlived its planned
//! free) is moved to a range of the block that the rest of the plan leaves
//! free for the block's planned life. The run then reaches no further than
//! the plan's block. Where no such range is left, or the run does
//! something else than the plan (a block many times its slot, a large
//! extra one, more than a few moved), the block is dissolved
//! ([`RawArena::dissolve`]) and the rest served dynamically: moving blocks
//! of a run whose blocks are no longer the plan's by index would pin them
//! where a dynamic arena would not have them (a GPU trace whose first run
//! holds cuBLAS's workspace peaked 6% higher so).
//!
//! Why this is sound: a block served at its slot is *regular*, and two
//! regular blocks live at once were live at once in the plan too (each
//! allocation moves the run to its step, and a block the run walks past the
//! planned free of while still live becomes *irregular*), so the plan keeps
//! them apart. Every irregular block (moved, extra, or overdue) is checked
//! against each later slot, and against every range a moved block takes.

use super::repair::{self, NEVER};
use super::{Handle, HandleKind, RawAlloc, RawArena};
use crate::freemap::pow2;
use crate::memory::Memory;
use crate::plan::Plan;

/// Blocks one run may move before it is dissolved instead: each move
/// searches the plan (`O(n log n)` in its blocks), on the run's thread.
/// (Over random families, 1 to 16 moves keep 173 to 177 of 293 fell-back
/// runs within a granule of the dynamic run.)
const MOVES: u32 = 4;
/// Irregular blocks one run may hold before it is dissolved instead: each
/// later allocation is checked against every one of them.
const IRREGULAR: usize = 32;

/// How a run that left its plan is served inside the plan's block.
pub(super) struct Loose {
    /// The plan step after the last allocation served.
    pos: usize,
    /// Each block's offset in the plan's block, by index: the plan's, or
    /// where it was moved; past the plan's blocks, the extra ones'.
    offsets: Vec<usize>,
    /// Each planned block's allocation step and planned free step
    /// ([`NEVER`]: live at the plan's end).
    life: Vec<(usize, usize)>,
    /// Live blocks that may not be where (or when) the plan has them:
    /// `(index, offset, bytes)`.
    irregular: Vec<(u32, usize, usize)>,
    /// Blocks moved so far.
    moved: u32,
    /// Planned blocks live past the plan's block: `(index, offset from the
    /// block's start, bytes)`.
    past: Vec<(u32, usize, usize)>,
}

impl Loose {
    /// Starts serving the rest of a run on `plan` loosely, from step `pos`.
    pub(super) fn new(plan: &Plan, pos: usize) -> Box<Self> {
        let mut offsets: Vec<usize> = (0..plan.len())
            .map(|i| plan.offset(i).unwrap_or(0))
            .collect();
        offsets.shrink_to_fit();
        let mut life = vec![(0, NEVER); plan.len()];
        for (at, step) in plan.steps().iter().enumerate() {
            if let Some(l) = life.get_mut(step.index as usize) {
                if step.is_free() {
                    l.1 = at;
                } else {
                    l.0 = at;
                }
            }
        }
        Box::new(Loose {
            pos,
            offsets,
            life,
            irregular: Vec::new(),
            moved: 0,
            past: Vec::new(),
        })
    }

    /// Offset of block `index` in the plan's block.
    pub(super) fn offset(&self, index: usize) -> Option<usize> {
        self.offsets.get(index).copied()
    }

    /// Block `index` (the run's latest) lies at `off`, `bytes` long: moved
    /// off its slot (or past the plan's blocks) before the run left.
    pub(super) fn moved_to(&mut self, index: u32, off: usize, bytes: usize) {
        let k = index as usize;
        if self.offsets.len() <= k {
            self.offsets.resize(k + 1, 0);
        }
        self.offsets[k] = off;
        self.irregular.push((index, off, bytes));
        self.moved += 1;
    }

    /// Whether the run's block with no room inside the plan's block may go
    /// past it: only the run's first block off its slot (counted as a
    /// move). Past that, the run does more than one twist of the plan, and
    /// blocks past the plan's block would pile up there.
    pub(super) fn may_go_past(&mut self) -> bool {
        if self.moved > 0 {
            return false;
        }
        self.moved += 1;
        true
    }

    /// Planned block `index`, `bytes` long, lies past the plan's block, at
    /// `off` from its start.
    pub(super) fn went_past(&mut self, index: u32, off: usize, bytes: usize) {
        self.past.push((index, off, bytes));
    }

    /// Block `index` was freed.
    pub(super) fn freed(&mut self, index: u32) {
        if let Some(i) = self.irregular.iter().position(|e| e.0 == index) {
            self.irregular.swap_remove(i);
        }
        if let Some(i) = self.past.iter().position(|e| e.0 == index) {
            self.past.swap_remove(i);
        }
    }

    /// The rest of the run from block `k` (now `size` bytes at `align`,
    /// the block that did not fit) placed again around what is live, as
    /// the plan has the rest ([`repair::place`]): each block's `(offset in
    /// the plan's block, bytes)`, from `k`, with no cap: the blocks live
    /// (`(offset, bytes, planned free)`) and those to come. `None` past the
    /// plan's blocks, or with too many left to place on the run's thread.
    pub(super) fn repair(
        &self,
        plan: &Plan,
        served: &[usize],
        k: usize,
        size: usize,
        align: usize,
    ) -> Option<(Vec<repair::Held>, Vec<repair::Item>)> {
        let n = plan.len();
        // A first block off its slot shows nothing of the run being the
        // plan's: a plan of another shape.
        if k == 0 || k >= n || n - k > repair::MAX_BLOCKS {
            return None;
        }
        let now = self.life.get(k)?.0;
        let mut fixed = Vec::with_capacity(served.len());
        for (i, &bytes) in served.iter().enumerate() {
            if bytes == 0 {
                continue;
            }
            // Live until its planned free, if that is still to come and the
            // block is where the plan has it; else to the end.
            let end = match self.life.get(i) {
                Some(&(_, f)) if f > now && !self.irregular.iter().any(|e| e.0 as usize == i) => f,
                _ => NEVER,
            };
            fixed.push((*self.offsets.get(i)?, bytes, end));
        }
        // Blocks past the plan's block, where they lie, until their free.
        for &(i, off, bytes) in &self.past {
            let end = match self.life.get(i as usize) {
                Some(&(_, f)) if f > now => f,
                _ => NEVER,
            };
            fixed.push((off, bytes, end));
        }
        let items: Vec<repair::Item> = (k..n)
            .map(|j| {
                let (bytes, al) = plan.block(j).unwrap_or((size, align));
                let (bytes, al) = if j == k { (size, align) } else { (bytes, al) };
                repair::Item {
                    bytes,
                    align: al.max(1),
                    start: self.life[j].0,
                    end: self.life[j].1,
                }
            })
            .collect();
        Some((fixed, items))
    }

    fn irregular_overlaps(&self, off: usize, size: usize) -> bool {
        self.irregular
            .iter()
            .any(|&(_, o, s)| o < off + size && off < o + s)
    }

    /// The lowest offset (aligned to `align`, inside `cap`) where `size`
    /// bytes, for block `skip` to be freed at step `hi`, are free of every
    /// irregular block, every block served before it and still live, and
    /// every planned block after it allocated before step `hi`; `prefer`
    /// first, if it is such.
    #[allow(clippy::too_many_arguments)]
    fn find(
        &self,
        plan: &Plan,
        served: &[usize],
        skip: usize,
        hi: usize,
        size: usize,
        align: usize,
        cap: usize,
        prefer: Option<usize>,
    ) -> Option<usize> {
        let mut taken: Vec<(usize, usize)> =
            self.irregular.iter().map(|&(_, o, s)| (o, o + s)).collect();
        for (j, &(a, _)) in self.life.iter().enumerate() {
            if j < skip {
                // Served already: in the way while live.
                if served.get(j).is_none_or(|&s| s == 0) {
                    continue;
                }
            } else if j == skip || a >= hi {
                continue; // itself, or allocated after it is freed
            }
            if self.irregular.iter().any(|e| e.0 as usize == j) {
                continue; // in the list above, where it really is
            }
            let bytes = plan.block(j).map_or(0, |b| b.0);
            taken.push((self.offsets[j], self.offsets[j] + bytes));
        }
        let fits = |off: usize| off.checked_add(size).is_some_and(|end| end <= cap);
        if let Some(p) = prefer.filter(|&p| p % align == 0 && fits(p)) {
            if taken.iter().all(|&(s, e)| e <= p || p + size <= s) {
                return Some(p);
            }
        }
        // By start: the first gap after everything below it ends.
        taken.sort_unstable();
        let mut at = 0usize;
        for &(s, e) in &taken {
            let off = at.next_multiple_of(align);
            if off.checked_add(size).is_some_and(|end| end <= s) {
                break;
            }
            at = at.max(e);
        }
        let off = at.next_multiple_of(align);
        fits(off).then_some(off)
    }
}

impl<M: Memory> RawArena<M> {
    /// Serves the open run's next allocation inside its plan's block after
    /// the run left the plan (see the module's doc), entering that mode at
    /// the run's first deviation. `None` when it cannot: the caller
    /// dissolves the block and serves the rest from the pool. `len` and
    /// `align` were checked by the pool already.
    pub(super) fn alloc_loose(&mut self, len: usize, align: usize) -> Option<RawAlloc<M::Ptr>> {
        let granule = self.pool.granule();
        let run = self.run.as_mut()?;
        let serve = run.serve.as_mut()?;
        let loose = serve.loose.as_mut()?;
        let pb = self.plan_blocks.get_mut(serve.slot as usize)?.as_mut()?;
        if pb.dissolved || !pow2(align) {
            return None;
        }
        let plan = &serve.plan;
        let size = len.checked_add(granule - 1)? & !(granule - 1);
        let align = align.max(granule);
        let k = run.blocks as usize;
        let cap = pb.raw.size;
        let (hi, slot) = match loose.life.get(k).copied() {
            Some((a, f)) => {
                // Walk to the block's step: a planned free passed while its
                // block is still live leaves that block irregular.
                let steps = plan.steps();
                for step in steps.iter().take(a).skip(loose.pos) {
                    let i = step.index as usize;
                    let live = pb.served.get(i).copied().unwrap_or(0);
                    if step.is_free()
                        && live > 0
                        && !loose.irregular.iter().any(|e| e.0 == step.index)
                    {
                        loose.irregular.push((step.index, loose.offsets[i], live));
                    }
                }
                loose.pos = loose.pos.max(a + 1);
                let fits = plan
                    .block(k)
                    .is_some_and(|(bytes, al)| size <= bytes && align <= al);
                (f, fits.then(|| loose.offsets[k]))
            }
            // Past the plan's blocks: for as long as the run lasts.
            None => (NEVER, None),
        };
        if loose.irregular.len() >= IRREGULAR {
            return None;
        }
        let off = match slot {
            Some(o) if !loose.irregular_overlaps(o, size) => o,
            _ => {
                // A few blocks a little off their slots are moved; a run
                // that does something else (a block many times its slot,
                // a large extra one: another path through the model, its
                // blocks no longer the plan's by index) is dissolved at
                // once, where moving would pin blocks where a dynamic
                // arena would not have them.
                let like = match plan.block(k) {
                    Some((bytes, _)) => size <= bytes.saturating_mul(2),
                    None => size <= cap / 16,
                };
                // Offsets are aligned inside the block, whose base is
                // aligned to the plan's alignment only.
                let like = like && align <= plan.align();
                if loose.moved >= MOVES || !like {
                    return None;
                }
                let prefer = (k < loose.offsets.len()).then(|| loose.offsets[k]);
                let off = loose.find(plan, &pb.served, k, hi, size, align, cap, prefer)?;
                loose.moved += 1;
                loose.irregular.push((k as u32, off, size));
                off
            }
        };
        #[cfg(debug_assertions)]
        for (i, &live) in pb.served.iter().enumerate() {
            let o = loose.offsets.get(i).copied().unwrap_or(usize::MAX);
            assert!(
                live == 0 || o + live <= off || off + size <= o,
                "block {k} at {off}+{size} (slot {slot:?}, freed at step {hi}) meets live block {i} at {o}+{live} (life {:?}); irregular {:?}, pos {}",
                loose.life.get(i),
                loose.irregular,
                loose.pos
            );
        }
        if k < loose.offsets.len() {
            loose.offsets[k] = off;
        } else {
            loose.offsets.resize(k, 0);
            loose.offsets.push(off);
        }
        if pb.served.len() <= k {
            pb.served.resize(k + 1, 0);
        }
        let ptr = M::at(pb.raw.ptr, off);
        pb.served[k] = size;
        pb.live += 1;
        pb.live_bytes += size;
        run.rec.alloc(size, align);
        if self.trace.is_some() {
            run.lens.push(len);
        }
        run.blocks += 1;
        self.planned_live += size;
        self.planned_allocs += 1;
        self.allocs += 1;
        let in_use = self.pool.in_use() - (self.plan_reserved - self.planned_live);
        self.peak_in_use = self.peak_in_use.max(in_use);
        run.peak = run.peak.max(in_use);
        Some(RawAlloc {
            ptr,
            handle: Handle {
                kind: HandleKind::Planned {
                    slot: serve.slot,
                    index: k as u32,
                },
                arena: self.id,
                generation: pb.generation_of(k as u32),
            },
        })
    }
}
