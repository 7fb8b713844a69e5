//! `--value NAME=V` and `--value NAME=LOW:HIGH`: the values an input is
//! filled with, instead of `make_input`'s defaults (floats uniform in
//! [-1, 1), integers in 0..4).
//!
//! A float input gets `V` everywhere, or values uniform in `[LOW, HIGH)`
//! (`LOW` everywhere when the two are equal); an integer input gets `V`, or
//! values uniform in `LOW..=HIGH`, both integers within the element type; a
//! bool input 0, 1 or `0:1`. The values come from the same kind of
//! deterministic generator as `make_input`'s, seeded by the run, so every
//! strategy gets the same bytes.

use tensor_arena_ort::ort::value::{DynValue, Tensor, TensorElementType};
use tensor_arena_ort::InputSpec;

/// The values asked for one input.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueSpec {
    /// The input's name.
    pub name: String,
    /// Lowest value.
    pub low: f64,
    /// Highest value (equal to `low` for one value).
    pub high: f64,
}

/// Parses one `--value` argument: `NAME=V` or `NAME=LOW:HIGH`.
pub fn parse(s: &str) -> Result<ValueSpec, String> {
    let syntax = || format!("bad --value `{s}`: write NAME=VALUE or NAME=LOW:HIGH");
    let (name, spec) = s.split_once('=').ok_or_else(syntax)?;
    let name = name.trim();
    if name.is_empty() || spec.trim().is_empty() {
        return Err(syntax());
    }
    let number = |t: &str| -> Result<f64, String> {
        t.trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .ok_or_else(|| format!("bad --value `{s}`: `{}` is not a finite number", t.trim()))
    };
    let (low, high) = match spec.split_once(':') {
        Some((lo, hi)) => (number(lo)?, number(hi)?),
        None => {
            let v = number(spec)?;
            (v, v)
        }
    };
    if low > high {
        return Err(format!(
            "bad --value `{s}`: the low end {low} is above the high end {high}"
        ));
    }
    Ok(ValueSpec {
        name: name.to_string(),
        low,
        high,
    })
}

/// Parses every `--value` argument; one input may be named once only.
pub fn parse_all(args: &[String]) -> Result<Vec<ValueSpec>, String> {
    let mut out: Vec<ValueSpec> = Vec::new();
    for a in args {
        let v = parse(a)?;
        if out.iter().any(|o| o.name == v.name) {
            return Err(format!("--value: input `{}` is given twice", v.name));
        }
        out.push(v);
    }
    Ok(out)
}

/// The element types `tensor-arena ort` can fill, as ONNX Runtime names
/// them (for messages).
pub const SUPPORTED: &str = "f32, f64, i64, i32, u8, i8 and bool";

/// Whether inputs (and outputs, for the hash) of this element type are
/// supported.
pub fn supported(ty: TensorElementType) -> bool {
    use TensorElementType as T;
    matches!(
        ty,
        T::Float32 | T::Float64 | T::Int64 | T::Int32 | T::Uint8 | T::Int8 | T::Bool
    )
}

/// The integer range of an element type, `None` for floats.
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

/// Checks `v` against the model's inputs: the name exists, its element type
/// is one this module fills, and integer types get integers they can hold.
pub fn check(v: &ValueSpec, specs: &[InputSpec]) -> Result<(), String> {
    let Some(spec) = specs.iter().find(|s| s.name == v.name) else {
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        return Err(format!(
            "--value {}: the model has no input named {:?} (its inputs: {})",
            v.name,
            v.name,
            names.join(", ")
        ));
    };
    let ty = match spec.elem {
        Some(ty) if supported(ty) => ty,
        Some(ty) => {
            return Err(format!(
                "--value {}: the input is a tensor of {ty}; values can be given for tensors of {SUPPORTED}",
                v.name
            ))
        }
        None => {
            return Err(format!(
                "--value {}: the input is not a tensor; values can be given for tensors of {SUPPORTED}",
                v.name
            ))
        }
    };
    if let Some((min, max)) = int_range(ty) {
        for x in [v.low, v.high] {
            // `as` saturates; the comparisons catch values out of range.
            if x.fract() != 0.0 || x < min as f64 || x > max as f64 {
                return Err(format!(
                    "--value {}: the input is a tensor of {ty}, which holds integers from {min} to {max}; {x} is not one",
                    v.name
                ));
            }
        }
    }
    Ok(())
}

/// A small deterministic generator (SplitMix64), as `make_input`'s.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `low..=high`.
    fn int(&mut self, low: i64, high: i64) -> i64 {
        let span = (i128::from(high) - i128::from(low) + 1) as u128;
        let r = u128::from(self.next()) % span;
        (i128::from(low) + r as i128) as i64
    }
}

/// `n` values from `f`, or an out-of-memory message (an error, not an
/// abort).
fn filled<T>(name: &str, n: usize, mut f: impl FnMut() -> T) -> Result<Vec<T>, String> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        format!(
            "out of memory: input {name:?}: {} bytes for its values could not be allocated",
            n.saturating_mul(size_of::<T>())
        )
    })?;
    v.extend((0..n).map(|_| f()));
    Ok(v)
}

/// A tensor for `spec` of shape `shape` holding the values `v` asks for,
/// from `seed`; `v` has passed [`check`].
pub fn make(
    spec: &InputSpec,
    shape: &[usize],
    v: &ValueSpec,
    seed: u64,
) -> Result<DynValue, String> {
    spec.check(shape).map_err(|e| e.to_string())?;
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= (1 << 34))
        .ok_or_else(|| format!("input {:?}: shape {shape:?} is too large", spec.name))?;
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let mut rng = SplitMix(seed ^ 0x7A1E_0000_0000_0000);
    let (low, high) = (v.low, v.high);
    let mut float = || low + (high - low) * rng.unit();
    let name = spec.name.as_str();
    let ort = |e: tensor_arena_ort::ort::Error| format!("input {name:?}: {e}");
    use TensorElementType as T;
    let value = match spec.elem {
        Some(T::Float32) => Tensor::from_array((dims, filled(name, n, || float() as f32)?))
            .map_err(ort)?
            .into_dyn(),
        Some(T::Float64) => Tensor::from_array((dims, filled(name, n, float)?))
            .map_err(ort)?
            .into_dyn(),
        Some(ty) => {
            let (lo, hi) = (low as i64, high as i64);
            let mut int = || rng.int(lo, hi);
            match ty {
                T::Int64 => Tensor::from_array((dims, filled(name, n, int)?))
                    .map_err(ort)?
                    .into_dyn(),
                T::Int32 => Tensor::from_array((dims, filled(name, n, || int() as i32)?))
                    .map_err(ort)?
                    .into_dyn(),
                T::Uint8 => Tensor::from_array((dims, filled(name, n, || int() as u8)?))
                    .map_err(ort)?
                    .into_dyn(),
                T::Int8 => Tensor::from_array((dims, filled(name, n, || int() as i8)?))
                    .map_err(ort)?
                    .into_dyn(),
                T::Bool => Tensor::from_array((dims, filled(name, n, || int() == 1)?))
                    .map_err(ort)?
                    .into_dyn(),
                _ => return Err(format!("input {name:?}: no values for a tensor of {ty}")),
            }
        }
        None => return Err(format!("input {name:?} is not a tensor")),
    };
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_values_and_ranges() {
        let v = parse("speed=1.0").unwrap();
        assert_eq!((v.name.as_str(), v.low, v.high), ("speed", 1.0, 1.0));
        let v = parse("x=-1:1").unwrap();
        assert_eq!((v.name.as_str(), v.low, v.high), ("x", -1.0, 1.0));
        let v = parse("ids=3:3").unwrap();
        assert_eq!((v.low, v.high), (3.0, 3.0));
        for bad in [
            "", "x", "=1", "x=", "x=a", "x=1:", "x=:1", "x=2:1", "x=nan", "x=inf", "x=1:2:3",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(parse_all(&["a=1".into(), "a=2".into()]).is_err());
    }

    #[test]
    fn checks_names_and_integer_types() {
        let specs = vec![
            InputSpec {
                name: "ids".into(),
                dims: vec![-1],
                elem: Some(TensorElementType::Int8),
            },
            InputSpec {
                name: "s".into(),
                dims: vec![-1],
                elem: Some(TensorElementType::String),
            },
        ];
        assert!(check(&parse("ids=-128:127").unwrap(), &specs).is_ok());
        let e = check(&parse("ids=0.5").unwrap(), &specs).unwrap_err();
        assert!(e.contains("integers from -128 to 127"), "{e}");
        assert!(check(&parse("ids=0:200").unwrap(), &specs).is_err());
        let e = check(&parse("y=1").unwrap(), &specs).unwrap_err();
        assert!(
            e.contains("no input named \"y\" (its inputs: ids, s)"),
            "{e}"
        );
        let e = check(&parse("s=1").unwrap(), &specs).unwrap_err();
        assert!(e.contains("tensor of String"), "{e}");
    }

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
            let u = rng.unit();
            assert!((0.0..1.0).contains(&u));
        }
    }
}
