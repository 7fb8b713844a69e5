//! Checks shared by the models ([`run`](crate::run), [`run_pages`](crate::run_pages),
//! [`plans`](crate::plans)).

use std::fmt::Display;
use tensor_arena::Stats;

/// Sorts `ranges` (`start..end` address ranges of live blocks) and asserts
/// that no two overlap; returns their total bytes.
///
/// # Panics
/// On the first two overlapping ranges, naming `what` and `at`.
pub(crate) fn disjoint(at: &dyn Display, what: &str, ranges: &mut [(usize, usize)]) -> usize {
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "{at}: {what} overlap: {:x?} and {:x?}",
            w[0],
            w[1]
        );
    }
    ranges.iter().map(|r| r.1 - r.0).sum()
}

/// What every shrink promises, whatever the memory layer: it never raises
/// `reserved`, reports exactly the bytes it gave back, and frees no block.
///
/// # Panics
/// When one of those fails, naming `at`.
pub(crate) fn shrink_accounting(at: &dyn Display, before: &Stats, after: &Stats, released: usize) {
    assert!(
        after.reserved <= before.reserved,
        "{at}: shrink grew the arena"
    );
    assert_eq!(
        released,
        before.reserved - after.reserved,
        "{at}: bytes released"
    );
    assert_eq!(after.in_use, before.in_use, "{at}");
}

/// What `free_bytes` promises on any memory layer: the bytes of free spans
/// that are committed, so that with what is in use they are at most what
/// is reserved (decommitted holes inside free spans are not free bytes of
/// the arena: they are not reserved).
///
/// # Panics
/// When `free_bytes + in_use > reserved`, naming `at`.
pub(crate) fn free_bytes(at: &dyn Display, st: &Stats) {
    assert!(
        st.free_bytes + st.in_use <= st.reserved,
        "{at}: free bytes {} and in use {} over reserved {}",
        st.free_bytes,
        st.in_use,
        st.reserved
    );
}
