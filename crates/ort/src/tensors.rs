//! Deterministic inputs and output hashes, so that runs under different
//! memory strategies can be compared bit for bit.

use crate::OrtArenaError;
use ort::value::{DynValue, Tensor, TensorElementType, ValueType};

/// A model input as the model declares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputSpec {
    /// Its name.
    pub name: String,
    /// Its dimensions; -1 where the model leaves a dimension free.
    pub dims: Vec<i64>,
    /// Its element type (`None` for a non-tensor input).
    pub elem: Option<TensorElementType>,
}

impl InputSpec {
    /// The specs of a session's inputs.
    pub fn of(session: &ort::session::Session) -> Vec<InputSpec> {
        session
            .inputs()
            .iter()
            .map(|o| match o.dtype() {
                ValueType::Tensor { ty, shape, .. } => InputSpec {
                    name: o.name().to_string(),
                    dims: shape.to_vec(),
                    elem: Some(*ty),
                },
                _ => InputSpec {
                    name: o.name().to_string(),
                    dims: Vec::new(),
                    elem: None,
                },
            })
            .collect()
    }

    /// Checks that `shape` fits: the same rank, and equal to every fixed
    /// dimension.
    ///
    /// # Errors
    /// [`OrtArenaError::BadShape`].
    pub fn check(&self, shape: &[usize]) -> Result<(), OrtArenaError> {
        let fits = shape.len() == self.dims.len()
            && shape
                .iter()
                .zip(&self.dims)
                .all(|(&s, &d)| d < 0 || i64::try_from(s).is_ok_and(|s| s == d));
        if fits {
            Ok(())
        } else {
            Err(OrtArenaError::BadShape {
                name: self.name.clone(),
                expected: self.dims.clone(),
                got: shape.to_vec(),
            })
        }
    }
}

/// A small deterministic generator (SplitMix64).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }

    /// Uniform in [0, 1).
    fn unit01(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `low..=high` (`low <= high`).
    fn int(&mut self, low: i64, high: i64) -> i64 {
        let span = (i128::from(high) - i128::from(low) + 1) as u128;
        let r = u128::from(self.next()) % span;
        (i128::from(low) + r as i128) as i64
    }
}

/// Where the values of an input come from.
enum Values {
    /// [`make_input`]'s: floats uniform in [-1, 1), integers 0..4, bytes
    /// and booleans at random.
    Default(SplitMix),
    /// [`make_input_in`]'s: floats uniform in `[low, high)` (`low` when
    /// equal), integers uniform in `lo..=hi`.
    Range {
        rng: SplitMix,
        low: f64,
        high: f64,
        lo: i64,
        hi: i64,
    },
}

impl Values {
    fn float(&mut self) -> f64 {
        match self {
            Values::Default(rng) => rng.unit(),
            Values::Range { rng, low, high, .. } => *low + (*high - *low) * rng.unit01(),
        }
    }

    /// An integer: the range's, or `default` of the next random word.
    fn int(&mut self, default: impl FnOnce(u64) -> i64) -> i64 {
        match self {
            Values::Default(rng) => default(rng.next()),
            Values::Range { rng, lo, hi, .. } => rng.int(*lo, *hi),
        }
    }
}

/// A tensor for `spec` of shape `shape`, filled with pseudo-random values
/// from `seed` (floats uniform in [-1, 1); integers in 0..4; booleans
/// alternating at random). The same arguments give the same bytes.
///
/// # Errors
/// [`OrtArenaError::BadShape`] if the shape does not fit the spec,
/// [`OrtArenaError::UnsupportedInput`] for element types other than f32,
/// f64, i64, i32, u8, i8 and bool, [`OrtArenaError::OutOfMemory`] if the
/// values cannot be allocated, and [`OrtArenaError::Ort`] if ONNX Runtime
/// refuses to create the tensor (or the size overflows).
pub fn make_input(spec: &InputSpec, shape: &[usize], seed: u64) -> Result<DynValue, OrtArenaError> {
    fill(
        spec,
        shape,
        Values::Default(SplitMix(seed ^ 0x5EED_0000_0000_0000)),
    )
}

/// [`make_input`] with values in a range: floats uniform in `[low, high)`
/// (`low` everywhere when the two are equal), integers uniform in
/// `low..=high`, booleans from `0..=1`. The same arguments give the same
/// bytes.
///
/// # Errors
/// As [`make_input`], and [`OrtArenaError::BadValues`] if `low` or `high`
/// is not finite, `low > high`, or, for an integer or boolean input, either
/// is not a whole number the element type holds.
pub fn make_input_in(
    spec: &InputSpec,
    shape: &[usize],
    seed: u64,
    low: f64,
    high: f64,
) -> Result<DynValue, OrtArenaError> {
    let bad = |message: String| OrtArenaError::BadValues {
        name: spec.name.clone(),
        message,
    };
    if !low.is_finite() || !high.is_finite() || low > high {
        return Err(bad(format!("{low} to {high} is not a range")));
    }
    if let Some((min, max)) = spec.elem.and_then(int_range) {
        for x in [low, high] {
            if x.fract() != 0.0 || x < min as f64 || x > max as f64 {
                return Err(bad(format!(
                    "it holds integers from {min} to {max}; {x} is not one"
                )));
            }
        }
    }
    let rng = SplitMix(seed ^ 0x7A1E_0000_0000_0000);
    let (lo, hi) = (low as i64, high as i64);
    fill(
        spec,
        shape,
        Values::Range {
            rng,
            low,
            high,
            lo,
            hi,
        },
    )
}

/// The integer range of an element type, `None` for floats and types
/// [`make_input`] does not fill.
fn int_range(ty: TensorElementType) -> Option<(i64, i64)> {
    use TensorElementType as T;
    match ty {
        T::Int64 => Some((i64::MIN, i64::MAX)),
        T::Int32 => Some((i32::MIN.into(), i32::MAX.into())),
        T::Uint8 => Some((0, u8::MAX.into())),
        T::Int8 => Some((i8::MIN.into(), i8::MAX.into())),
        T::Bool => Some((0, 1)),
        _ => None,
    }
}

/// A tensor for `spec` of shape `shape` holding values from `values`.
fn fill(spec: &InputSpec, shape: &[usize], mut values: Values) -> Result<DynValue, OrtArenaError> {
    spec.check(shape)?;
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= (1 << 34))
        .ok_or_else(|| {
            OrtArenaError::Ort(format!(
                "input {:?}: shape {shape:?} is too large",
                spec.name
            ))
        })?;
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let unsupported = || OrtArenaError::UnsupportedInput {
        name: spec.name.clone(),
        dtype: spec
            .elem
            .map_or_else(|| "not a tensor".into(), |t| format!("a tensor of {t}")),
    };
    let v = &mut values;
    let name = spec.name.as_str();
    let value = match spec.elem.ok_or_else(unsupported)? {
        TensorElementType::Float32 => {
            Tensor::from_array((dims, filled(name, n, || v.float() as f32)?))?.into_dyn()
        }
        TensorElementType::Float64 => {
            Tensor::from_array((dims, filled(name, n, || v.float())?))?.into_dyn()
        }
        TensorElementType::Int64 => {
            Tensor::from_array((dims, filled(name, n, || v.int(|x| (x % 4) as i64))?))?.into_dyn()
        }
        TensorElementType::Int32 => {
            let f = || v.int(|x| (x % 4) as i64) as i32;
            Tensor::from_array((dims, filled(name, n, f)?))?.into_dyn()
        }
        TensorElementType::Uint8 => {
            let f = || v.int(|x| i64::from(x as u8)) as u8;
            Tensor::from_array((dims, filled(name, n, f)?))?.into_dyn()
        }
        TensorElementType::Int8 => {
            let f = || v.int(|x| i64::from(x as i8)) as i8;
            Tensor::from_array((dims, filled(name, n, f)?))?.into_dyn()
        }
        TensorElementType::Bool => {
            let f = || v.int(|x| (x & 1) as i64) == 1;
            Tensor::from_array((dims, filled(name, n, f)?))?.into_dyn()
        }
        _ => return Err(unsupported()),
    };
    Ok(value)
}

/// `n` values from `f`, or [`OrtArenaError::OutOfMemory`] if the memory
/// for them cannot be had (an error, not an abort).
fn filled<T>(name: &str, n: usize, mut f: impl FnMut() -> T) -> Result<Vec<T>, OrtArenaError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        OrtArenaError::OutOfMemory(format!(
            "input {name:?}: {} bytes for its values could not be allocated",
            n.saturating_mul(size_of::<T>())
        ))
    })?;
    v.extend((0..n).map(|_| f()));
    Ok(v)
}

/// FNV-1a, 64 bits.
struct Fnv(u64);

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01B3);
        }
    }
}

/// A hash of named outputs: names, element types, shapes and every byte.
/// Equal outputs give equal hashes; the order of `outputs` matters.
///
/// # Errors
/// [`OrtArenaError::UnsupportedOutput`] for an output that is not a tensor
/// of a type [`make_input`] supports.
pub fn hash_outputs<'a>(
    outputs: impl IntoIterator<Item = (&'a str, &'a DynValue)>,
) -> Result<u64, OrtArenaError> {
    let mut h = Fnv(0xCBF2_9CE4_8422_2325);
    for (name, value) in outputs {
        h.write(name.as_bytes());
        h.write(&[0]);
        let bad = || OrtArenaError::UnsupportedOutput {
            name: name.to_string(),
            dtype: value.dtype().to_string(),
        };
        let ValueType::Tensor { ty, .. } = value.dtype() else {
            return Err(bad());
        };
        h.write(format!("{ty:?}").as_bytes());
        macro_rules! bytes {
            ($t:ty) => {{
                let (shape, data) = value.try_extract_tensor::<$t>()?;
                for d in shape.iter() {
                    h.write(&d.to_le_bytes());
                }
                for x in data {
                    h.write(&x.to_le_bytes());
                }
            }};
        }
        match ty {
            TensorElementType::Float32 => bytes!(f32),
            TensorElementType::Float64 => bytes!(f64),
            TensorElementType::Int64 => bytes!(i64),
            TensorElementType::Int32 => bytes!(i32),
            TensorElementType::Uint8 => bytes!(u8),
            TensorElementType::Int8 => bytes!(i8),
            TensorElementType::Bool => {
                let (shape, data) = value.try_extract_tensor::<bool>()?;
                for d in shape.iter() {
                    h.write(&d.to_le_bytes());
                }
                for &x in data {
                    h.write(&[u8::from(x)]);
                }
            }
            _ => return Err(bad()),
        }
    }
    Ok(h.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_stay_in_range_and_cover_it() {
        let mut rng = SplitMix(7);
        let mut seen = [false; 5];
        for _ in 0..1000 {
            let x = rng.int(-2, 2);
            assert!((-2..=2).contains(&x));
            seen[(x + 2) as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
        // The whole of i64: no overflow.
        let _ = rng.int(i64::MIN, i64::MAX);
        for _ in 0..1000 {
            let u = rng.unit01();
            assert!((0.0..1.0).contains(&u));
        }
    }
}
