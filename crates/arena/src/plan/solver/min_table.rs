//! A sparse table for range-minimum queries, for the search's
//! greedy-by-breadth order.

/// Sparse table for range-minimum queries over a fixed array.
pub(super) struct MinTable {
    levels: Vec<Vec<u32>>,
}

impl MinTable {
    /// The table over `values`.
    pub(super) fn new(values: Vec<u32>) -> Self {
        let mut levels = vec![values];
        let mut width = 1;
        while width * 2 <= levels[0].len() {
            let prev = &levels[levels.len() - 1];
            let next: Vec<u32> = (0..prev.len() - width)
                .map(|i| prev[i].min(prev[i + width]))
                .collect();
            levels.push(next);
            width *= 2;
        }
        MinTable { levels }
    }

    /// Minimum of `values[lo..hi]` (`u32::MAX` when empty).
    pub(super) fn min(&self, lo: usize, hi: usize) -> u32 {
        if hi <= lo {
            return u32::MAX;
        }
        let level = (usize::BITS - 1 - (hi - lo).leading_zeros()) as usize;
        let row = &self.levels[level];
        row[lo].min(row[hi - (1 << level)])
    }
}
