//! What a run key tells a plan family: which family it belongs to, and the
//! dimensions a family fits its sizes to ([`KeyDims`]).

use std::hash::{Hash, Hasher};

/// A run key that exposes its dimensions, so that a
/// [`PlanCache`](super::PlanCache) can group keys into families and plan a
/// key it has never seen from the ones it has.
///
/// Keys of one family differ only in their dimensions (the same model, the
/// same inputs, other shapes); the family fits each block's size to them.
/// A key that says nothing useful (a family of its own, no dimensions) is
/// harmless: it is only ever planned exactly.
pub trait KeyDims {
    /// The family: equal for keys that differ only in their dimensions.
    fn family(&self) -> u64;
    /// The dimensions, appended to `out` (always as many for one family).
    fn dims(&self, out: &mut Vec<u64>);
    /// The family's name, for reports (the key with its dimensions as `#`).
    fn family_name(&self) -> String;
}

fn hash_of(value: impl Hash) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

/// A key of numbers (`crates/ort`'s `RunKey`: each input's rank, then its
/// dimensions; `crates/session`'s shapes): every number is a dimension, and
/// the family is the key's length (numbers that never vary, such as ranks,
/// are fitted as constants).
impl KeyDims for [usize] {
    fn family(&self) -> u64 {
        hash_of(("dims", self.len()))
    }

    fn dims(&self, out: &mut Vec<u64>) {
        out.extend(self.iter().map(|&d| d as u64));
    }

    fn family_name(&self) -> String {
        format!("{} dims", self.len())
    }
}

/// Splits text into its skeleton (each run of decimal digits as `#`) and
/// the numbers those runs spell (saturating).
fn skeleton(text: &[u8], dims: Option<&mut Vec<u64>>) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut dims = dims;
    let mut i = 0;
    while i < text.len() {
        if text[i].is_ascii_digit() {
            let mut n: u64 = 0;
            while i < text.len() && text[i].is_ascii_digit() {
                n = n
                    .saturating_mul(10)
                    .saturating_add(u64::from(text[i] - b'0'));
                i += 1;
            }
            if let Some(d) = dims.as_deref_mut() {
                d.push(n);
            }
            out.push(b'#');
        } else {
            out.push(text[i]);
            i += 1;
        }
    }
    out
}

/// A textual key (a trace's run label `16x3x224x224`, Python's
/// `str(("batch", 16))` in `crates/cuda`): every run of decimal digits is a
/// dimension, and the rest of the text names the family.
impl KeyDims for [u8] {
    fn family(&self) -> u64 {
        hash_of(("text", skeleton(self, None)))
    }

    fn dims(&self, out: &mut Vec<u64>) {
        skeleton(self, Some(out));
    }

    fn family_name(&self) -> String {
        String::from_utf8_lossy(&skeleton(self, None)).into_owned()
    }
}

/// Owned and borrowed forms of a key read as the form they deref to.
macro_rules! as_keydims {
    ($($owner:ty => $view:ty),* $(,)?) => {$(
        impl KeyDims for $owner {
            fn family(&self) -> u64 {
                <$view as KeyDims>::family(self.as_ref())
            }
            fn dims(&self, out: &mut Vec<u64>) {
                <$view as KeyDims>::dims(self.as_ref(), out)
            }
            fn family_name(&self) -> String {
                <$view as KeyDims>::family_name(self.as_ref())
            }
        }
    )*};
}

as_keydims! {
    Box<[usize]> => [usize],
    Vec<usize> => [usize],
    Vec<u8> => [u8],
    String => str,
}

impl KeyDims for str {
    fn family(&self) -> u64 {
        self.as_bytes().family()
    }
    fn dims(&self, out: &mut Vec<u64>) {
        self.as_bytes().dims(out)
    }
    fn family_name(&self) -> String {
        self.as_bytes().family_name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims_of<K: KeyDims + ?Sized>(k: &K) -> Vec<u64> {
        let mut v = Vec::new();
        k.dims(&mut v);
        v
    }

    #[test]
    fn text_keys_split_into_family_and_dims() {
        assert_eq!(dims_of("16x3x224x224"), [16, 3, 224, 224]);
        assert_eq!("16x3x224x224".family(), "1x3x224x224".family());
        assert_ne!("16x3x224x224".family(), "16x3x224".family());
        assert_eq!("('batch', 16)".family_name(), "('batch', #)");
        assert_eq!(dims_of("('batch', 16)"), [16]);
        assert_eq!(dims_of("99999999999999999999999"), [u64::MAX]);
        assert_eq!(dims_of(""), Vec::<u64>::new());
    }

    #[test]
    fn number_keys_are_all_dims() {
        let k: Box<[usize]> = vec![4, 1, 3, 48, 320].into();
        assert_eq!(dims_of(&k), [4, 1, 3, 48, 320]);
        let other: Box<[usize]> = vec![4, 6, 3, 48, 100].into();
        assert_eq!(k.family(), other.family());
        assert_ne!(k.family(), [1usize, 2].family());
    }
}
