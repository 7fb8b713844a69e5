//! [`Dtype`], the element types of safetensors, and [`Element`], the Rust types that hold them.

use std::fmt;

use bytemuck::Pod;

/// Element type of a tensor, as spelled in safetensors headers.
///
/// Covers every safetensors dtype with whole-byte elements. The sub-byte dtypes of the format
/// (`F4`, `F6_E2M3`, `F6_E3M2`) are rejected with
/// [`WeightsError::UnknownDtype`](super::WeightsError::UnknownDtype).
/// [`Display`](fmt::Display) and [`Dtype::name`] give the header spelling (`"BF16"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Dtype {
    /// `BOOL`: one byte, 0 or 1.
    Bool,
    /// `U8`: unsigned 8-bit integer.
    U8,
    /// `I8`: signed 8-bit integer.
    I8,
    /// `F8_E5M2`: 8-bit float, 5 exponent and 2 mantissa bits.
    F8E5M2,
    /// `F8_E4M3`: 8-bit float, 4 exponent and 3 mantissa bits.
    F8E4M3,
    /// `F8_E8M0`: 8-bit scale (exponent only), from the OCP microscaling formats.
    F8E8M0,
    /// `F8_E4M3FNUZ`: 8-bit float, finite, no negative zero.
    F8E4M3Fnuz,
    /// `F8_E5M2FNUZ`: 8-bit float, finite, no negative zero.
    F8E5M2Fnuz,
    /// `U16`: unsigned 16-bit integer.
    U16,
    /// `I16`: signed 16-bit integer.
    I16,
    /// `F16`: IEEE 754 half precision.
    F16,
    /// `BF16`: bfloat16.
    Bf16,
    /// `U32`: unsigned 32-bit integer.
    U32,
    /// `I32`: signed 32-bit integer.
    I32,
    /// `F32`: IEEE 754 single precision.
    F32,
    /// `C64`: complex number made of two `F32` parts.
    C64,
    /// `U64`: unsigned 64-bit integer.
    U64,
    /// `I64`: signed 64-bit integer.
    I64,
    /// `F64`: IEEE 754 double precision.
    F64,
}

impl Dtype {
    /// Every dtype, in declaration order (element size ascending).
    pub const ALL: [Dtype; 19] = [
        Dtype::Bool,
        Dtype::U8,
        Dtype::I8,
        Dtype::F8E5M2,
        Dtype::F8E4M3,
        Dtype::F8E8M0,
        Dtype::F8E4M3Fnuz,
        Dtype::F8E5M2Fnuz,
        Dtype::U16,
        Dtype::I16,
        Dtype::F16,
        Dtype::Bf16,
        Dtype::U32,
        Dtype::I32,
        Dtype::F32,
        Dtype::C64,
        Dtype::U64,
        Dtype::I64,
        Dtype::F64,
    ];

    /// Size of one element in bytes (1, 2, 4 or 8).
    pub const fn size_in_bytes(self) -> usize {
        match self {
            Dtype::Bool
            | Dtype::U8
            | Dtype::I8
            | Dtype::F8E5M2
            | Dtype::F8E4M3
            | Dtype::F8E8M0
            | Dtype::F8E4M3Fnuz
            | Dtype::F8E5M2Fnuz => 1,
            Dtype::U16 | Dtype::I16 | Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::U32 | Dtype::I32 | Dtype::F32 => 4,
            Dtype::C64 | Dtype::U64 | Dtype::I64 | Dtype::F64 => 8,
        }
    }

    /// The spelling used in safetensors headers, e.g. `"F32"`, `"BF16"`, `"F8_E4M3"`.
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::F8E5M2 => "F8_E5M2",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::F8E8M0 => "F8_E8M0",
            Dtype::F8E4M3Fnuz => "F8_E4M3FNUZ",
            Dtype::F8E5M2Fnuz => "F8_E5M2FNUZ",
            Dtype::U16 => "U16",
            Dtype::I16 => "I16",
            Dtype::F16 => "F16",
            Dtype::Bf16 => "BF16",
            Dtype::U32 => "U32",
            Dtype::I32 => "I32",
            Dtype::F32 => "F32",
            Dtype::C64 => "C64",
            Dtype::U64 => "U64",
            Dtype::I64 => "I64",
            Dtype::F64 => "F64",
        }
    }

    /// Parses the header spelling (exact, case-sensitive, as safetensors does).
    /// Returns `None` for unknown names and for the unsupported sub-byte dtypes.
    pub fn from_name(name: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Size in bytes of the scalars an element is made of, the unit whose bytes a big-endian
    /// host must reverse: the element size, except `C64`, two 4-byte `F32` parts.
    pub(crate) const fn scalar_size(self) -> usize {
        match self {
            Dtype::C64 => 4,
            other => other.size_in_bytes(),
        }
    }

    /// `product(shape) * size_in_bytes()`, or `None` on overflow.
    pub(crate) fn byte_len(self, shape: &[usize]) -> Option<usize> {
        shape
            .iter()
            .try_fold(1usize, |acc, &dim| acc.checked_mul(dim))?
            .checked_mul(self.size_in_bytes())
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust element type with a safetensors dtype, for [`TensorView::typed`](super::TensorView::typed).
pub trait Element: Pod + private::Sealed {
    /// The dtype whose elements this type holds.
    const DTYPE: Dtype;
}

mod private {
    pub trait Sealed {}
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl private::Sealed for $t {}
        impl Element for $t {
            const DTYPE: Dtype = Dtype::$d;
        }
    )*};
}

element!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    u64 => U64, i64 => I64, f64 => F64);

#[cfg(test)]
mod tests {
    use super::*;

    /// Our names and sizes are the safetensors crate's (it is a dev-dependency only).
    #[test]
    fn dtype_names_round_trip_and_match_safetensors() {
        for d in Dtype::ALL {
            assert_eq!(Dtype::from_name(d.name()), Some(d));
            assert_eq!(d.to_string(), d.name());
            let st: safetensors::Dtype =
                serde_json::from_str(&format!("\"{}\"", d.name())).unwrap();
            assert_eq!(serde_json::to_string(&st).unwrap(), format!("\"{d}\""));
            assert_eq!(st.bitsize(), d.size_in_bytes() * 8, "{d}");
            assert_eq!(d.size_in_bytes() % d.scalar_size(), 0, "{d}");
        }
        assert_eq!(Dtype::C64.scalar_size(), 4);
        assert_eq!(Dtype::from_name("F4"), None);
        assert_eq!(Dtype::from_name("f32"), None);
    }

    #[test]
    fn byte_len_checks_overflow() {
        assert_eq!(Dtype::F32.byte_len(&[2, 3]), Some(24));
        assert_eq!(Dtype::F32.byte_len(&[]), Some(4));
        assert_eq!(Dtype::U8.byte_len(&[0, usize::MAX]), Some(0));
        assert_eq!(Dtype::F64.byte_len(&[usize::MAX / 4]), None);
    }
}
