//! What a run is keyed by: the shapes of its inputs, taken from whatever the
//! caller hands ONNX Runtime (`ort::inputs!` in either form, a slice of
//! values, or bare shapes).

use ort::session::{SessionInputValue, SessionInputs};
use ort::value::{DynValue, ValueType};
use std::borrow::Cow;
use std::hash::{Hash, Hasher};
use tensor_arena::KeyDims;

/// The key of a run: the rank and dimensions of each input, in the order
/// given. Runs of one model with equal keys allocate the same tensors in the
/// same order, so the first run of a key is recorded and planned, and the
/// later ones are served from the plan.
///
/// Build it from the inputs as they are passed to `Session::run`:
/// ```
/// # use tensor_arena_ort::RunKey;
/// // from shapes
/// let a = RunKey::from_shapes([[1i64, 3, 48, 320]]);
/// // the same shapes give the same key
/// assert_eq!(a, RunKey::from_shapes([vec![1i64, 3, 48, 320]]));
/// assert_ne!(a, RunKey::from_shapes([[1i64, 3, 48, 100]]));
/// ```
/// and `RunKey::of(&inputs)` for the value of `ort::inputs![...]` (either
/// form), a `SessionInputs`, or `&[&DynValue]`.
///
/// The order of the inputs is part of the key: build it the same way at
/// each call site (as `ort::inputs!` does). A key that does not describe
/// the run (another model's plans, the wrong shapes) is harmless: a plan
/// whose offsets do not fit what ONNX Runtime asks for is left (the run
/// "deviates" and goes on dynamically) and the key is planned again.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct RunKey(Vec<usize>);

impl RunKey {
    /// The key of inputs of these shapes (negative dimensions count as 0).
    pub fn from_shapes<I, S>(shapes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<[i64]>,
    {
        let mut key = Vec::new();
        for s in shapes {
            push_shape(&mut key, s.as_ref());
        }
        Self(key)
    }

    /// The key of the inputs of a run, as given to `Session::run`.
    pub fn of<T: KeyInputs + ?Sized>(inputs: &T) -> Self {
        let mut key = Vec::new();
        inputs.for_each_input(&mut |v| push_value(&mut key, v));
        Self(key)
    }

    /// The key as numbers: for each input its rank, then its dimensions.
    pub fn as_slice(&self) -> &[usize] {
        &self.0
    }

    pub(crate) fn from_raw(key: Vec<usize>) -> Self {
        Self(key)
    }
}

/// Keys in a plan store ([`Plans::with_store`](crate::Plans::with_store)):
/// their numbers, as `tensor_arena` writes keys of numbers.
impl tensor_arena::PlanKey for RunKey {
    const KIND: &'static str = <Vec<usize> as tensor_arena::PlanKey>::KIND;
    fn encode(&self, out: &mut Vec<u8>) {
        tensor_arena::plan::store::encode_dims(&self.0, out);
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        tensor_arena::plan::store::decode_dims(bytes).map(Self)
    }
}

fn push_shape(key: &mut Vec<usize>, dims: &[i64]) {
    key.push(dims.len());
    key.extend(dims.iter().map(|&d| d.max(0) as usize));
}

/// A tensor's shape; other values (sequences, maps) count as rank 0 with a
/// marker, so they never collide with a tensor's key.
fn push_value(key: &mut Vec<usize>, v: &DynValue) {
    match v.dtype() {
        ValueType::Tensor { shape, .. } => push_shape(key, shape),
        _ => key.push(usize::MAX),
    }
}

/// How the model's plans group keys into families: as a key of numbers
/// (every rank and dimension is a dimension, ranks are fitted as the
/// constants they are, and the family is the key's length), named by the
/// inputs its first key describes: `1 input: 4-d` for one 1x3xHxW image
/// (whose key holds five numbers: the rank, then four dimensions).
impl KeyDims for RunKey {
    fn family(&self) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        // As `[usize]`'s family (the key's length), so that a lookup by
        // the key's slice finds the same family.
        ("dims", self.0.len()).hash(&mut h);
        h.finish()
    }

    fn dims(&self, out: &mut Vec<u64>) {
        out.extend(self.0.iter().map(|&d| d as u64));
    }

    fn family_name(&self) -> String {
        describe(&self.0)
    }
}

/// The key's numbers: plans are found by them too
/// (`plans.cache().get(&[4usize, 1, 3, 48, 100][..])`). `RunKey`'s `Hash`
/// and `Eq` are its `Vec`'s, which are its slice's.
impl std::borrow::Borrow<[usize]> for RunKey {
    fn borrow(&self) -> &[usize] {
        &self.0
    }
}

/// `N inputs: R-d, R-d` for a key of tensors' shapes; a key that is not
/// one (a value that is no tensor) is `N numbers`.
fn describe(key: &[usize]) -> String {
    let mut ranks = Vec::new();
    let mut rest = key;
    while let Some((&rank, tail)) = rest.split_first() {
        if rank == usize::MAX || rank > tail.len() {
            return format!("{} numbers", key.len());
        }
        ranks.push(format!("{rank}-d"));
        rest = &tail[rank..];
    }
    let n = ranks.len();
    if n == 0 {
        return "no inputs".into();
    }
    format!(
        "{n} input{}: {}",
        if n == 1 { "" } else { "s" },
        ranks.join(", ")
    )
}

/// Inputs of a run whose shapes make a [`RunKey`]: what `ort::inputs!`
/// builds (an array of values, or a vector of named values),
/// `SessionInputs`, and slices of values.
pub trait KeyInputs {
    /// Calls `f` with each input value, in order.
    fn for_each_input(&self, f: &mut dyn FnMut(&DynValue));
}

impl<const N: usize> KeyInputs for [SessionInputValue<'_>; N] {
    fn for_each_input(&self, f: &mut dyn FnMut(&DynValue)) {
        self.iter().for_each(|v| f(v));
    }
}

impl KeyInputs for [SessionInputValue<'_>] {
    fn for_each_input(&self, f: &mut dyn FnMut(&DynValue)) {
        self.iter().for_each(|v| f(v));
    }
}

impl KeyInputs for Vec<(Cow<'_, str>, SessionInputValue<'_>)> {
    fn for_each_input(&self, f: &mut dyn FnMut(&DynValue)) {
        self.iter().for_each(|(_, v)| f(v));
    }
}

impl<const N: usize> KeyInputs for SessionInputs<'_, '_, N> {
    fn for_each_input(&self, f: &mut dyn FnMut(&DynValue)) {
        match self {
            SessionInputs::ValueMap(m) => m.iter().for_each(|(_, v)| f(v)),
            SessionInputs::ValueSlice(s) => s.iter().for_each(|v| f(v)),
            SessionInputs::ValueArray(a) => a.iter().for_each(|v| f(v)),
        }
    }
}

impl KeyInputs for [&DynValue] {
    fn for_each_input(&self, f: &mut dyn FnMut(&DynValue)) {
        self.iter().for_each(|v| f(v));
    }
}

impl KeyInputs for [(&str, &DynValue)] {
    fn for_each_input(&self, f: &mut dyn FnMut(&DynValue)) {
        self.iter().for_each(|(_, v)| f(v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_family_is_named_by_its_inputs_ranks() {
        // One 4-d input: five numbers in the key, one input of rank 4.
        let image = RunKey::from_shapes([[1i64, 3, 48, 320]]);
        assert_eq!(image.family_name(), "1 input: 4-d");
        let two = RunKey::from_shapes([vec![2i64, 3], vec![7, 1]]);
        assert_eq!(two.family_name(), "2 inputs: 2-d, 2-d");
        assert_eq!(
            RunKey::from_raw(vec![usize::MAX]).family_name(),
            "1 numbers"
        );
        assert_eq!(RunKey::from_raw(vec![3, 1]).family_name(), "2 numbers");
        assert_eq!(RunKey::default().family_name(), "no inputs");
        // Families are as before: by the key's length, as the slice's.
        let other = RunKey::from_shapes([[1i64, 3, 48, 100]]);
        assert_eq!(image.family(), other.family());
        assert_eq!(image.family(), image.as_slice().family());
        assert_ne!(image.family(), two.family());
    }

    #[test]
    fn rank_separates_shapes_with_the_same_numbers() {
        assert_ne!(
            RunKey::from_shapes([vec![2i64, 3], vec![4]]),
            RunKey::from_shapes([vec![2i64], vec![3, 4]])
        );
        assert_eq!(
            RunKey::from_shapes([[2i64, 3]]).as_slice(),
            &[2usize, 2, 3][..]
        );
        assert_eq!(RunKey::from_shapes([[-1i64]]).as_slice(), &[1usize, 0][..]);
    }
}
