//! The store's checksum and the model hash of [`ModelKey`](super::ModelKey):
//! a 64-bit multiply-xor hash over 8-byte words (FNV-1a's constants, one
//! word per step instead of one byte, four lanes, and a final avalanche).
//!
//! Written here rather than taken from a crate: a dozen lines, no
//! dependency, a few GB/s on one core (a word per multiply), and it only
//! has to notice accidents (a torn or bit-flipped file, another model's
//! bytes). It is not a defence against a hostile file, and need not be:
//! whatever a file holds is validated as any plan and recording is.

const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// The 64-bit hash of `bytes`: four lanes over 32-byte strides (so that
/// the multiplies of one stride do not wait for each other), folded, then
/// the tail a word at a time.
pub(crate) fn hash64(bytes: &[u8]) -> u64 {
    let word = |w: &[u8]| u64::from_le_bytes(w.try_into().expect("8 bytes"));
    let step = |h: u64, w: u64| (h ^ w).wrapping_mul(PRIME).rotate_left(29);
    let mut lanes = [OFFSET, OFFSET ^ 1, OFFSET ^ 2, OFFSET ^ 3];
    let mut strides = bytes.chunks_exact(32);
    for s in &mut strides {
        for (lane, w) in lanes.iter_mut().zip(s.chunks_exact(8)) {
            *lane = step(*lane, word(w));
        }
    }
    let mut h = (bytes.len() as u64).wrapping_mul(PRIME);
    for lane in lanes {
        h = step(h, lane);
    }
    let mut words = strides.remainder().chunks_exact(8);
    for w in &mut words {
        h = step(h, word(w));
    }
    let mut tail = [0u8; 8];
    let rest = words.remainder();
    tail[..rest.len()].copy_from_slice(rest);
    h = step(h, u64::from_le_bytes(tail));
    // Avalanche (splitmix64's finaliser): every input bit reaches every
    // output bit.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::hash64;

    #[test]
    fn every_flipped_bit_and_length_changes_the_hash() {
        let base: Vec<u8> = (0..77u8).collect();
        let h = hash64(&base);
        for byte in 0..base.len() {
            for bit in 0..8 {
                let mut b = base.clone();
                b[byte] ^= 1 << bit;
                assert_ne!(hash64(&b), h, "byte {byte} bit {bit}");
            }
        }
        for len in 0..base.len() {
            assert_ne!(hash64(&base[..len]), h, "prefix {len}");
        }
        assert_ne!(hash64(&[]), hash64(&[0]));
    }
}
