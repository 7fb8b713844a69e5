//! `--value NAME=V` and `--value NAME=LOW:HIGH`: the values an input is
//! filled with, instead of `make_input`'s defaults (floats uniform in
//! [-1, 1), integers in 0..4).
//!
//! A float input gets `V` everywhere, or values uniform in `[LOW, HIGH)`
//! (`LOW` everywhere when the two are equal); an integer input gets `V`, or
//! values uniform in `LOW..=HIGH`, both integers within the element type; a
//! bool input 0, 1 or `0:1`. The values come from `make_input_in`,
//! seeded by the run, so every strategy gets the same bytes.

use tensor_arena_ort::ort::value::{DynValue, TensorElementType};
use tensor_arena_ort::{make_input_in, InputSpec};

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

/// A tensor for `spec` of shape `shape` holding the values `v` asks for,
/// from `seed`; `v` has passed [`check`].
pub fn make(
    spec: &InputSpec,
    shape: &[usize],
    v: &ValueSpec,
    seed: u64,
) -> Result<DynValue, String> {
    make_input_in(spec, shape, seed, v.low, v.high).map_err(|e| e.to_string())
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
}
