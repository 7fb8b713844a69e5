//! A cheap refusal before a fit's vertices: sizes that follow no line.

/// Whether some slope `c` agrees with every pair of the first shape and
/// another: `a + c · m_k` within `(s_k - q, s_k]` (to `tol`) at both
/// bounds `c · (m_k - m_0)` to `s_k - s_0` within `q` (and twice `tol`).
/// A necessary condition for `vertices` to find any vertex, in one pass
/// (the vertices cost a pass per pair of lines): sizes that follow no
/// line, as a hostile store's do, are refused here.
pub(super) fn agree(ms: &[f64], sizes: &[f64], q: f64, tol: f64) -> bool {
    let (Some(&m0), Some(&s0)) = (ms.first(), sizes.first()) else {
        return true;
    };
    let (mut lo, mut hi) = (f64::NEG_INFINITY, f64::INFINITY);
    for (&m, &s) in ms.iter().zip(sizes).skip(1) {
        let (dm, ds) = (m - m0, s - s0);
        let slack = q + 2.0 * tol;
        if dm == 0.0 {
            if ds.abs() > slack {
                return false;
            }
            continue;
        }
        let (a, b) = ((ds - slack) / dm, (ds + slack) / dm);
        lo = lo.max(a.min(b));
        hi = hi.min(a.max(b));
    }
    // A relative hair of float error is not a disagreement.
    lo <= hi + 1e-9 * lo.abs().max(hi.abs()).max(1.0)
}
