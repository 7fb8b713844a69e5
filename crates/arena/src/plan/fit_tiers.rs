//! The monomials a block's size is fitted with, over the dimensions that
//! varied.

use super::*;

/// The monomials to try, in tiers, simplest first: one tier per choice of
/// exponents over the dimensions that varied, holding that choice's strided
/// variants.
pub(super) fn tiers(varied: &[bool]) -> Vec<Vec<Monomial>> {
    let dims: Vec<u16> = (0..varied.len())
        .filter(|&d| varied[d])
        .map(|d| d as u16)
        .collect();
    if dims.is_empty() || dims.len() > u16::MAX as usize {
        return Vec::new();
    }
    let k = dims.len();
    // Exponent vectors of degree 1..=3, each entry 0..=2, or one 3.
    let mut exps: Vec<Vec<u8>> = Vec::new();
    if k <= FULL_SEARCH_DIMS {
        let total = 3usize.pow(k as u32);
        for code in 1..total {
            let mut e = Vec::with_capacity(k);
            let mut c = code;
            for _ in 0..k {
                e.push((c % 3) as u8);
                c /= 3;
            }
            let degree: u8 = e.iter().sum();
            if (1..=3).contains(&degree) {
                exps.push(e);
            }
        }
        // The cube of one dimension (a block in the cube of the
        // sequence): beside `b * s^2` it fits shapes where the batch and
        // the sequence moved together, and the two part at other keys.
        for i in 0..k {
            let mut e = vec![0u8; k];
            e[i] = 3;
            exps.push(e);
        }
    } else {
        for i in 0..k {
            let mut e = vec![0u8; k];
            e[i] = 1;
            exps.push(e);
        }
        exps.push(vec![1u8; k]);
    }
    exps.sort_by_key(|e| {
        let degree: u8 = e.iter().sum();
        let volume = e.iter().all(|&x| x == 1);
        let squares = e.iter().filter(|&&x| x >= 2).count();
        (
            degree,
            !volume,
            squares,
            e.iter().max().copied(),
            e.iter().rev().copied().collect::<Vec<u8>>(),
        )
    });
    exps.iter()
        .map(|e| {
            let used: Vec<(u16, u8)> = dims
                .iter()
                .zip(e)
                .filter(|(_, &x)| x > 0)
                .map(|(&d, &x)| (d, x))
                .collect();
            // Strided variants: each factor unstrided, or divided by a
            // stride with every rounding offset, all unstrided first; with
            // more than one factor, only one of them takes offsets other
            // than down and up (the search stays in thousands).
            let shifts = if used.len() <= FULL_SEARCH_DIMS {
                MAX_SHIFT
            } else {
                0
            };
            let mut out: Vec<Monomial> = Vec::new();
            let mut seen = std::collections::HashSet::new();
            let mut choices: Vec<Vec<(u8, u8)>> = Vec::new();
            // Offsets for up to two varying factors (a third multiplies the
            // search by thousands).
            let free_factors = if used.len() <= 2 { used.len() } else { 1 };
            for free in 0..free_factors {
                choices.clear();
                for i in 0..used.len() {
                    let mut c = vec![(0u8, 0u8)];
                    for shift in 1..=shifts {
                        let top = (1u8 << shift) - 1;
                        if i == free && used.len() <= 2 {
                            c.extend((0..=top).map(|offset| (shift, offset)));
                        } else {
                            c.extend([(shift, 0), (shift, top)]);
                        }
                    }
                    choices.push(c);
                }
                let variants: usize = choices.iter().map(Vec::len).product();
                for code in 0..variants {
                    let mut c = code;
                    let m = Monomial(
                        used.iter()
                            .zip(&choices)
                            .map(|(&(dim, exp), ch)| {
                                let (shift, offset) = ch[c % ch.len()];
                                c /= ch.len();
                                Factor {
                                    dim,
                                    shift,
                                    offset,
                                    exp,
                                }
                            })
                            .collect(),
                    );
                    if seen.insert(m.clone()) {
                        out.push(m);
                    }
                }
            }
            out.sort_by_key(|m| m.0.iter().map(|f| u32::from(f.shift)).sum::<u32>());
            out
        })
        .collect()
}
