//! Outputs low: a plan keeps the buffers live at its run's end where a run
//! that leaves the plan needs them, at the bottom of its block.

use super::{Decoder, Fit, Problem, Search};

impl Search {
    /// Where the run's own order (each buffer, as it comes, in the smallest
    /// gap between the buffers live then: what a dynamic arena does)
    /// places as low as the best, that placement is the plan: a run that
    /// leaves it midway has its live blocks where a dynamic arena would
    /// have put them, and what follows is served from the same free spans.
    /// Tried where `decode` (after a search, or for a robust plan, where
    /// it is taken up to `within` bytes over the best), or taken when the
    /// start the structure's last plan left is that order. Whether the
    /// plan is now that placement. (`order`: the run's,
    /// [`Problem::run_order`].)
    pub(super) fn as_dynamic(
        &mut self,
        problem: &Problem,
        order: &[u32],
        decode: bool,
        within: usize,
    ) -> bool {
        if self.best_fit == Fit::Best && self.best_order == order {
            return true;
        }
        if !decode {
            return false;
        }
        let mut decoder = Decoder::new(problem, order.to_vec());
        let limit = self.best.saturating_add(within);
        let placed = decoder.decode(problem, 0, Fit::Best, limit);
        self.spent += decoder.work;
        match placed {
            Some(top) => {
                self.keep(&decoder, top, Fit::Best);
                self.walk.clear();
                true
            }
            None => false,
        }
    }

    /// Where the run's own order is not as low ([`Search::as_dynamic`]):
    /// the longest start of it placed as a dynamic arena would (the run's
    /// first allocations in its order, each in the smallest gap free at
    /// its start), then the outputs (low, as [`Search::settle`] puts
    /// them), then the rest in the best order, that is as low as the best
    /// (sought by halving: a longer start is rarely lower). A run that
    /// leaves such a plan before the end of that start has its live
    /// blocks where a dynamic arena would have them, and the pool's best
    /// fit goes on with it as that arena would. After a search
    /// (`searched`); else recognised in the order the structure's hint
    /// placed, with best fit. Whether the plan starts so (with at least
    /// [`MIN_START`] of the items). (`order`: the run's.)
    pub(super) fn dynamic_start(
        &mut self,
        problem: &Problem,
        order: &[u32],
        searched: bool,
    ) -> bool {
        let n = problem.len();
        if n < 2 * MIN_START {
            return false;
        }
        if !searched {
            let same = self
                .best_order
                .iter()
                .zip(order)
                .take_while(|(a, b)| a == b)
                .count();
            return self.best_fit == Fit::Best && same >= MIN_START;
        }
        let lasting = &problem.lifetimes.lasting().outputs;
        let with_start = |k: usize| {
            let mut taken = vec![false; n];
            let mut o = order[..k].to_vec();
            for &i in &order[..k] {
                taken[i as usize] = true;
            }
            for &i in lasting {
                if !taken[i as usize] {
                    taken[i as usize] = true;
                    o.push(i);
                }
            }
            o.extend(
                self.best_order
                    .iter()
                    .copied()
                    .filter(|&i| !taken[i as usize]),
            );
            o
        };
        // The whole order is not as low (`as_dynamic`); the empty start is
        // the best order placed with best fit, which may not be.
        let (mut lo, mut hi) = (0usize, n);
        let mut found: Option<(Decoder, usize)> = None;
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            let mut decoder = Decoder::new(problem, with_start(mid));
            let placed = decoder.decode(problem, 0, Fit::Best, self.best);
            self.spent += decoder.work;
            match placed {
                Some(top) => {
                    lo = mid;
                    found = Some((decoder, top));
                }
                None => hi = mid,
            }
        }
        match found {
            Some((decoder, top)) if lo >= MIN_START => {
                self.keep(&decoder, top, Fit::Best);
                self.walk.clear();
                true
            }
            _ => false,
        }
    }

    /// Puts the buffers live at the run's end (its outputs) at the bottom
    /// of the plan, where the footprint allows it (placed first, then the
    /// rest in the best order, no higher than the best): a run that leaves
    /// its plan keeps its live blocks where the plan put them, and the
    /// rest of the block serves the rest of the run, so a block that lives
    /// on in the middle of it would split the space a grown block needs.
    /// Kept as the order the structure's next search starts from, so that
    /// its later plans keep them there too.
    ///
    /// The buffers that enclose every buffer allocated after them (freed
    /// no earlier than any of those, as a stack's would be) go low with
    /// them, oldest lowest, where that too keeps the footprint: a run that
    /// leaves its plan midway finds them packed under the rest as a
    /// dynamic arena has them, and the space above them whole.
    pub(super) fn settle(&mut self, problem: &Problem) {
        if self.best_order.len() != problem.len() {
            return;
        }
        let lasting = problem.lifetimes.lasting();
        if !self.settle_with(problem, &lasting.stacked) {
            self.settle_with(problem, &lasting.outputs);
        }
    }

    /// Places the items of `lasting` first, in its order (oldest lowest),
    /// then the rest in the best order; keeps that if it is no higher than
    /// the best. Whether they are low now.
    fn settle_with(&mut self, problem: &Problem, lasting: &[u32]) -> bool {
        if lasting.is_empty() || lasting.len() == problem.len() {
            return true;
        }
        if self.best_order[..lasting.len()] == lasting[..] {
            return true;
        }
        let mut is_lasting = vec![false; problem.len()];
        for &i in lasting {
            is_lasting[i as usize] = true;
        }
        let mut order = lasting.to_vec();
        order.extend(
            self.best_order
                .iter()
                .copied()
                .filter(|&i| !is_lasting[i as usize]),
        );
        let mut decoder = Decoder::new(problem, order);
        match decoder.decode(problem, 0, self.best_fit, self.best) {
            Some(top) => {
                self.keep(&decoder, top, self.best_fit);
                self.walk.clear();
                true
            }
            None => false,
        }
    }
}

/// The fewest items a start placed as a dynamic arena would
/// ([`Search::dynamic_start`]) must hold to be taken over the outputs low.
const MIN_START: usize = 2;

impl Problem {
    /// The items in the order the run allocates them (by start; items
    /// are in request order, so ties keep it).
    pub(super) fn run_order(&self) -> Vec<u32> {
        let mut order: Vec<u32> = (0..self.len() as u32).collect();
        order.sort_by_key(|&i| self.items[i as usize].start);
        order
    }

    /// Turns `offset` (a placement of every item) upside down, where that
    /// brings the items live at the run's end (its outputs) nearer the
    /// bottom and keeps every offset aligned: the same footprint, no two
    /// conflicting items sharing a byte (mirroring keeps both), but a run
    /// that leaves its plan keeps its live blocks where the plan put them,
    /// and the rest of the plan's block is then one free span with the
    /// space above it, which a grown block extends, rather than a span
    /// under an output.
    pub(super) fn lasting_low(&self, offset: &mut [usize]) {
        let Some(last) = self.items.iter().map(|it| it.end).max() else {
            return;
        };
        // Every item ends at or under `top`, which no sum here passes; a
        // placement past `usize::MAX` (saturated: not a valid plan) is
        // left as it is.
        let Some(top) = self
            .items
            .iter()
            .zip(offset.iter())
            .map(|(it, &at)| at.checked_add(it.size))
            .try_fold(0usize, |top, end| end.map(|e| top.max(e)))
        else {
            return;
        };
        let (mut reach, mut mirrored) = (0usize, 0usize);
        for (it, &at) in self.items.iter().zip(offset.iter()) {
            if it.end == last {
                reach = reach.max(at + it.size);
                mirrored = mirrored.max(top - at);
            }
        }
        if mirrored >= reach {
            return;
        }
        let aligned = self
            .items
            .iter()
            .zip(offset.iter())
            .all(|(it, &at)| (top - at - it.size) & it.mask == 0);
        if aligned {
            for (it, at) in self.items.iter().zip(offset.iter_mut()) {
                *at = top - *at - it.size;
            }
        }
    }
}
