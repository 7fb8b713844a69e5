//! Fill patterns: every block is written when handed out and read back at
//! every step, so a block that another block (or the arena's bookkeeping)
//! overwrote is caught.

/// Blocks up to this many bytes are filled and checked whole; larger ones at
/// both ends and at spread-out probes.
const FULL: usize = 256;

/// The byte at offset `i` of a block filled with `seed`.
#[inline]
pub fn byte(seed: u8, i: usize) -> u8 {
    seed.wrapping_mul(31) ^ (i as u8).wrapping_mul(7) ^ (i >> 8) as u8
}

/// Calls `f` with each offset of a `len`-byte block that carries the pattern.
fn probes(len: usize, mut f: impl FnMut(usize)) {
    if len <= FULL {
        (0..len).for_each(f);
        return;
    }
    (0..64).for_each(&mut f);
    (len - 64..len).for_each(&mut f);
    let stride = len / 64;
    for k in 0..64 {
        f((k * stride + k % 61) % len);
    }
}

/// Writes the pattern of `seed` into `bytes`.
pub fn fill(bytes: &mut [u8], seed: u8) {
    probes(bytes.len(), |i| bytes[i] = byte(seed, i));
}

/// The first offset of `bytes` that lost the pattern of `seed`, if any.
pub fn first_mismatch(bytes: &[u8], seed: u8) -> Option<usize> {
    let mut bad = None;
    probes(bytes.len(), |i| {
        if bad.is_none() && bytes[i] != byte(seed, i) {
            bad = Some(i);
        }
    });
    bad
}
