//! [`TensorView`]: a borrowed look at one tensor, raw or typed, and the byte-order rule of
//! typed views.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;
use std::path::Path;

use bytemuck::Pod;

use super::{Dtype, Element, Entry, WeightsError};

/// Byte order of a host. Safetensors stores every value little-endian.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ByteOrder {
    /// Least significant byte first: the file's order, and x86-64's and AArch64's.
    Little,
    /// Most significant byte first (s390x, some PowerPC and MIPS targets).
    Big,
}

impl ByteOrder {
    /// The order of the target this crate is compiled for.
    pub(crate) const NATIVE: ByteOrder = if cfg!(target_endian = "big") {
        ByteOrder::Big
    } else {
        ByteOrder::Little
    };
}

/// A borrowed view of one tensor of a [`Weights`](super::Weights).
///
/// Values are stored little-endian, as safetensors specifies; [`TensorView::bytes`] gives
/// them as stored. Typed views give native values: on a little-endian host they borrow the
/// bytes in place (when aligned); on a big-endian host the borrowing views
/// ([`TensorView::try_as_slice`], [`TensorView::typed`]) refuse multi-byte elements with
/// [`WeightsError::BigEndianHost`], and [`TensorView::as_cow`] and [`TensorView::to_vec_of`]
/// convert, reversing the bytes of each scalar (each `F32` half of a `C64`).
#[derive(Clone, Copy)]
pub struct TensorView<'a> {
    path: Option<&'a Path>,
    file_image: bool,
    entry: &'a Entry,
    /// Always `product(shape) * dtype.size_in_bytes()` long.
    bytes: &'a [u8],
}

impl<'a> TensorView<'a> {
    /// A view of `entry`, whose bytes are `bytes`.
    pub(super) fn new(
        path: Option<&'a Path>,
        file_image: bool,
        entry: &'a Entry,
        bytes: &'a [u8],
    ) -> Self {
        TensorView {
            path,
            file_image,
            entry,
            bytes,
        }
    }

    /// The tensor's name.
    pub fn name(&self) -> &'a str {
        &self.entry.name
    }

    /// The element type.
    pub fn dtype(&self) -> Dtype {
        self.entry.dtype
    }

    /// The shape; empty for a scalar.
    pub fn shape(&self) -> &'a [usize] {
        &self.entry.shape
    }

    /// The raw bytes, `len_elements() * dtype().size_in_bytes()` of them, little-endian as
    /// stored in the file.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Number of elements: the product of the shape (1 for a scalar).
    pub fn len_elements(&self) -> usize {
        self.bytes.len() / self.entry.dtype.size_in_bytes()
    }

    /// Where the bytes sit in the file, for weights loaded with
    /// [`Weights::open`](super::Weights::open) (and their
    /// [`Weights::to_owned_copy`](super::Weights::to_owned_copy)); `None` for
    /// [`Weights::from_tensors`](super::Weights::from_tensors).
    pub fn file_range(&self) -> Option<Range<usize>> {
        self.file_image.then(|| self.entry.range.clone())
    }

    /// The elements as a borrowed `&[T]`.
    ///
    /// `T` may be any [`Pod`] type of the dtype's size (`f32`, `u32` or `[u8; 4]` for `F32`;
    /// `u16` for `BF16` bits).
    ///
    /// # Errors
    /// [`WeightsError::DtypeSizeMismatch`] if `size_of::<T>()` differs from the dtype size;
    /// [`WeightsError::Misaligned`] if the bytes are not aligned for `T` (safetensors does
    /// not guarantee aligned offsets; [`TensorView::as_cow`] copies in that case);
    /// [`WeightsError::BigEndianHost`] for multi-byte elements on a big-endian host.
    pub fn try_as_slice<T: Pod>(&self) -> Result<&'a [T], WeightsError> {
        self.slice_in(ByteOrder::NATIVE)
    }

    /// The elements as `&[T]`, where `T`'s dtype must be the tensor's: an `F32` tensor as
    /// `f32`, never as `u32` (unlike [`TensorView::try_as_slice`], which checks sizes only).
    ///
    /// # Errors
    /// [`WeightsError::DtypeMismatch`] for another dtype; otherwise as
    /// [`TensorView::try_as_slice`].
    pub fn typed<T: Element>(&self) -> Result<&'a [T], WeightsError> {
        if T::DTYPE != self.entry.dtype {
            return Err(WeightsError::DtypeMismatch {
                path: self.path(),
                tensor: self.entry.name.clone(),
                dtype: self.entry.dtype,
                requested: T::DTYPE,
            });
        }
        self.try_as_slice()
    }

    /// The elements as `&[T]` when they can be borrowed, else as an owned copy: when the
    /// bytes are not aligned for `T`, or on a big-endian host (converted to native order).
    ///
    /// # Errors
    /// [`WeightsError::DtypeSizeMismatch`] if `size_of::<T>()` differs from the dtype size.
    pub fn as_cow<T: Pod>(&self) -> Result<Cow<'a, [T]>, WeightsError> {
        self.cow_in(ByteOrder::NATIVE)
    }

    /// The elements copied into a `Vec<T>`, whatever their alignment, in native byte order.
    ///
    /// # Errors
    /// [`WeightsError::DtypeSizeMismatch`] if `size_of::<T>()` differs from the dtype size.
    pub fn to_vec_of<T: Pod>(&self) -> Result<Vec<T>, WeightsError> {
        self.as_cow().map(Cow::into_owned)
    }

    /// [`TensorView::try_as_slice`] on a host of byte order `host`.
    fn slice_in<T: Pod>(&self, host: ByteOrder) -> Result<&'a [T], WeightsError> {
        self.check_size::<T>()?;
        if self.bytes.is_empty() {
            return Ok(&[]);
        }
        if host == ByteOrder::Big && self.entry.dtype.scalar_size() > 1 {
            return Err(WeightsError::BigEndianHost {
                path: self.path(),
                tensor: self.entry.name.clone(),
                dtype: self.entry.dtype,
            });
        }
        bytemuck::try_cast_slice(self.bytes).map_err(|_| WeightsError::Misaligned {
            path: self.path(),
            tensor: self.entry.name.clone(),
            requested: std::any::type_name::<T>(),
            required_align: std::mem::align_of::<T>(),
            address: self.bytes.as_ptr() as usize,
        })
    }

    /// [`TensorView::as_cow`] on a host of byte order `host`.
    fn cow_in<T: Pod>(&self, host: ByteOrder) -> Result<Cow<'a, [T]>, WeightsError> {
        match self.slice_in::<T>(host) {
            Ok(slice) => Ok(Cow::Borrowed(slice)),
            Err(WeightsError::Misaligned { .. } | WeightsError::BigEndianHost { .. }) => {
                let mut out = vec![T::zeroed(); self.len_elements()];
                let out_bytes = bytemuck::cast_slice_mut::<T, u8>(&mut out);
                out_bytes.copy_from_slice(self.bytes);
                if host == ByteOrder::Big {
                    for scalar in out_bytes.chunks_exact_mut(self.entry.dtype.scalar_size()) {
                        scalar.reverse();
                    }
                }
                Ok(Cow::Owned(out))
            }
            Err(err) => Err(err),
        }
    }

    fn check_size<T: Pod>(&self) -> Result<(), WeightsError> {
        let size = std::mem::size_of::<T>();
        if size == self.entry.dtype.size_in_bytes() {
            Ok(())
        } else {
            Err(WeightsError::DtypeSizeMismatch {
                path: self.path(),
                tensor: self.entry.name.clone(),
                dtype: self.entry.dtype,
                requested: std::any::type_name::<T>(),
                requested_size: size,
            })
        }
    }

    fn path(&self) -> Option<std::path::PathBuf> {
        self.path.map(Path::to_path_buf)
    }
}

impl fmt::Debug for TensorView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorView")
            .field("name", &self.entry.name)
            .field("dtype", &self.entry.dtype)
            .field("shape", &self.entry.shape)
            .field("len_bytes", &self.bytes.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Weights;

    fn weights() -> Weights {
        let f32s: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let c64: Vec<u8> = [3.0f32, -4.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let u16s: Vec<u8> = [0x0102u16, 0xA0B0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        Weights::from_tensors([
            ("f", Dtype::F32, vec![2], f32s),
            ("c", Dtype::C64, vec![1], c64),
            ("h", Dtype::Bf16, vec![2], u16s),
            ("b", Dtype::U8, vec![3], vec![7, 8, 9]),
            ("e", Dtype::F64, vec![0], vec![]),
        ])
        .unwrap()
    }

    #[test]
    fn native_order_is_the_target_endianness() {
        assert_eq!(
            ByteOrder::NATIVE == ByteOrder::Little,
            cfg!(target_endian = "little")
        );
    }

    #[test]
    fn little_endian_host_borrows_values_as_stored() {
        let w = weights();
        let f = w.get("f").unwrap();
        assert_eq!(f.slice_in::<f32>(ByteOrder::Little).unwrap(), &[1.5, -2.0]);
        let cow = f.cow_in::<f32>(ByteOrder::Little).unwrap();
        assert!(matches!(cow, Cow::Borrowed(_)));
        let c = w.get("c").unwrap().cow_in::<[f32; 2]>(ByteOrder::Little);
        assert_eq!(&*c.unwrap(), &[[3.0, -4.0]]);
    }

    /// What a big-endian host must see: borrowing refused with a clear error, conversion
    /// giving each value's big-endian (native there) bytes. Run on any host by passing the
    /// byte order in; `ByteOrder::NATIVE` picks it in the public methods.
    #[test]
    fn big_endian_host_refuses_to_borrow_and_converts() {
        let w = weights();
        for name in ["f", "c", "h"] {
            let t = w.get(name).unwrap();
            let err = match t.dtype().size_in_bytes() {
                2 => t.slice_in::<u16>(ByteOrder::Big).unwrap_err(),
                4 => t.slice_in::<f32>(ByteOrder::Big).unwrap_err(),
                _ => t.slice_in::<u64>(ByteOrder::Big).unwrap_err(),
            };
            assert!(
                matches!(&err, WeightsError::BigEndianHost { tensor, .. } if tensor == name),
                "{err:?}"
            );
            let msg = err.to_string();
            assert!(
                msg.contains("big-endian") && msg.contains("as_cow"),
                "{msg}"
            );
        }

        let be =
            |values: &[u32]| -> Vec<u8> { values.iter().flat_map(|v| v.to_be_bytes()).collect() };
        let f = w.get("f").unwrap().cow_in::<u32>(ByteOrder::Big).unwrap();
        assert!(matches!(f, Cow::Owned(_)));
        let want = be(&[1.5f32.to_bits(), (-2.0f32).to_bits()]);
        assert_eq!(bytemuck::cast_slice::<u32, u8>(&f), want);
        // C64: each F32 part is reversed on its own; the parts keep their order.
        let c = w.get("c").unwrap().cow_in::<u64>(ByteOrder::Big).unwrap();
        let want = be(&[3.0f32.to_bits(), (-4.0f32).to_bits()]);
        assert_eq!(bytemuck::cast_slice::<u64, u8>(&c), want);
        let h = w.get("h").unwrap().cow_in::<u16>(ByteOrder::Big).unwrap();
        let want: Vec<u8> = [0x0102u16, 0xA0B0]
            .iter()
            .flat_map(|v| v.to_be_bytes())
            .collect();
        assert_eq!(bytemuck::cast_slice::<u16, u8>(&h), want);

        // Single-byte and empty tensors have no byte order: they still borrow.
        let b = w.get("b").unwrap();
        assert_eq!(b.slice_in::<u8>(ByteOrder::Big).unwrap(), &[7, 8, 9]);
        assert!(matches!(
            b.cow_in::<u8>(ByteOrder::Big).unwrap(),
            Cow::Borrowed(_)
        ));
        let e = w.get("e").unwrap();
        assert!(e.slice_in::<f64>(ByteOrder::Big).unwrap().is_empty());
        // The size check comes first, whatever the host.
        assert!(matches!(
            w.get("f").unwrap().cow_in::<u16>(ByteOrder::Big),
            Err(WeightsError::DtypeSizeMismatch { .. })
        ));
    }
}
