//! [`WeightsError`]: every way loading weights or viewing a tensor can fail.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::str::Utf8Error;

use super::{Dtype, MAX_HEADER_LEN};

/// Everything that can go wrong when loading [`Weights`](super::Weights) or viewing a tensor.
///
/// Every message names where the weights came from ([`WeightsError::path`]: the file, or
/// "in-memory weights" for [`Weights::from_tensors`](super::Weights::from_tensors)) and, when
/// one is at fault, the tensor. Offsets are relative to the data section, after the header.
#[derive(Debug)]
#[non_exhaustive]
pub enum WeightsError {
    /// The file does not exist.
    NotFound {
        /// The path given to [`Weights::open`](super::Weights::open).
        path: PathBuf,
    },
    /// Opening, inspecting, reading or mapping the file failed, the path is not a regular
    /// file, or the file changed size while it was being copied.
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// There is not enough memory (or address space) for an owned copy.
    OutOfMemory {
        /// The file, if the weights came from one.
        path: Option<PathBuf>,
        /// The number of bytes requested.
        bytes: u64,
    },
    /// The file is shorter than the 8-byte header length that opens every safetensors file.
    FileTooSmall {
        /// The file.
        path: PathBuf,
        /// Its length in bytes.
        len: u64,
    },
    /// The header length is above [`MAX_HEADER_LEN`].
    HeaderTooLarge {
        /// The file.
        path: PathBuf,
        /// The header length read from the first 8 bytes.
        header_len: u64,
    },
    /// The header length runs past the end of the file.
    HeaderPastEof {
        /// The file.
        path: PathBuf,
        /// The header length read from the first 8 bytes.
        header_len: u64,
        /// The file's length in bytes.
        file_len: u64,
    },
    /// The header is not UTF-8.
    HeaderNotUtf8 {
        /// The file.
        path: PathBuf,
        /// Where decoding failed.
        source: Utf8Error,
    },
    /// The header is not JSON, or not the JSON shape safetensors expects (an object of
    /// `{"dtype", "shape", "data_offsets"}` objects, and an optional `__metadata__` object of
    /// strings).
    BadJson {
        /// The file.
        path: PathBuf,
        /// The parser's message, with line and column or the tensor at fault.
        message: String,
    },
    /// A tensor's dtype is not a known safetensors dtype, or is a sub-byte dtype this crate
    /// does not support (`F4`, `F6_E2M3`, `F6_E3M2`).
    UnknownDtype {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The dtype as written in the header.
        dtype: String,
    },
    /// Two tensors have the same name (a repeated key in a header, or in
    /// [`Weights::from_tensors`](super::Weights::from_tensors)).
    DuplicateName {
        /// The file, if the weights came from one.
        path: Option<PathBuf>,
        /// The repeated name.
        tensor: String,
    },
    /// A tensor's `data_offsets` lie past the end of the data section: the file is truncated
    /// or the header is wrong.
    OffsetsOutOfRange {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Start offset.
        start: u64,
        /// End offset (exclusive).
        end: u64,
        /// Length of the data section actually present in the file.
        data_len: u64,
    },
    /// A tensor's end offset is before its start offset.
    InvalidOffsets {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Start offset.
        start: u64,
        /// End offset.
        end: u64,
    },
    /// Two tensors' byte ranges overlap.
    OverlappingTensors {
        /// The file.
        path: PathBuf,
        /// The tensor that starts inside `other`.
        tensor: String,
        /// The tensor it overlaps (the one before it, by offset).
        other: String,
    },
    /// Some bytes of the data section before a tensor belong to no tensor. Safetensors
    /// requires the tensors to cover the data section contiguously, from offset 0.
    GapBeforeTensor {
        /// The file.
        path: PathBuf,
        /// The tensor after the gap.
        tensor: String,
        /// Start of the gap.
        gap_start: u64,
        /// End of the gap (exclusive).
        gap_end: u64,
    },
    /// A tensor's byte length is not `product(shape) * dtype size`.
    LengthMismatch {
        /// The file, if the weights came from one.
        path: Option<PathBuf>,
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: Dtype,
        /// Its shape. Dimensions too large for `usize` are shown as `usize::MAX`.
        shape: Vec<usize>,
        /// The length the dtype and shape call for; `None` if computing it overflows.
        expected: Option<usize>,
        /// The length the tensor has.
        actual: u64,
    },
    /// The data section continues after the last tensor.
    TrailingBytes {
        /// The file.
        path: PathBuf,
        /// Where the last tensor ends.
        data_end: u64,
        /// Length of the data section.
        data_len: u64,
    },
    /// A typed view asked for elements whose size is not the tensor's dtype size.
    DtypeSizeMismatch {
        /// The file, if the weights came from one.
        path: Option<PathBuf>,
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: Dtype,
        /// The requested element type.
        requested: &'static str,
        /// The requested element type's size in bytes.
        requested_size: usize,
    },
    /// A dtype-checked view ([`TensorView::typed`](super::TensorView::typed)) was asked for
    /// with an element type of another dtype.
    DtypeMismatch {
        /// The file, if the weights came from one.
        path: Option<PathBuf>,
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: Dtype,
        /// The dtype of the requested element type.
        requested: Dtype,
    },
    /// A borrowed typed view was asked for, but the tensor's bytes are not aligned for the
    /// element type. Safetensors does not align data offsets; use
    /// [`TensorView::as_cow`](super::TensorView::as_cow) or
    /// [`TensorView::to_vec_of`](super::TensorView::to_vec_of), which copy in that case.
    Misaligned {
        /// The file, if the weights came from one.
        path: Option<PathBuf>,
        /// The tensor.
        tensor: String,
        /// The requested element type.
        requested: &'static str,
        /// The alignment it needs.
        required_align: usize,
        /// The address of the tensor's first byte.
        address: usize,
    },
    /// A borrowed typed view of multi-byte elements was asked for on a big-endian host.
    /// Safetensors stores values little-endian, so they must be converted, not borrowed:
    /// [`TensorView::as_cow`](super::TensorView::as_cow) and
    /// [`TensorView::to_vec_of`](super::TensorView::to_vec_of) do that.
    BigEndianHost {
        /// The file, if the weights came from one.
        path: Option<PathBuf>,
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: Dtype,
    },
}

impl WeightsError {
    /// The file the weights came from; `None` for in-memory weights.
    pub fn path(&self) -> Option<&Path> {
        use WeightsError as E;
        match self {
            E::NotFound { path }
            | E::Io { path, .. }
            | E::FileTooSmall { path, .. }
            | E::HeaderTooLarge { path, .. }
            | E::HeaderPastEof { path, .. }
            | E::HeaderNotUtf8 { path, .. }
            | E::BadJson { path, .. }
            | E::UnknownDtype { path, .. }
            | E::OffsetsOutOfRange { path, .. }
            | E::InvalidOffsets { path, .. }
            | E::OverlappingTensors { path, .. }
            | E::GapBeforeTensor { path, .. }
            | E::TrailingBytes { path, .. } => Some(path),
            E::OutOfMemory { path, .. }
            | E::DuplicateName { path, .. }
            | E::LengthMismatch { path, .. }
            | E::DtypeSizeMismatch { path, .. }
            | E::DtypeMismatch { path, .. }
            | E::Misaligned { path, .. }
            | E::BigEndianHost { path, .. } => path.as_deref(),
        }
    }
}

impl fmt::Display for WeightsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use WeightsError as E;
        match self.path() {
            Some(path) => write!(f, "{}: ", path.display())?,
            None => f.write_str("in-memory weights: ")?,
        }
        match self {
            E::NotFound { .. } => f.write_str("weights file not found"),
            E::Io { source, .. } => write!(f, "I/O error: {source}"),
            E::OutOfMemory { bytes, .. } => write!(f, "cannot allocate {bytes} bytes"),
            E::FileTooSmall { len, .. } => write!(
                f,
                "file is {len} bytes long, too short for a safetensors file \
                 (it must start with an 8-byte header length)"
            ),
            E::HeaderTooLarge { header_len, .. } => write!(
                f,
                "header length {header_len} is over the safetensors limit of \
                 {MAX_HEADER_LEN} bytes"
            ),
            E::HeaderPastEof {
                header_len,
                file_len,
                ..
            } => write!(
                f,
                "header length {header_len} runs past the end of the file ({file_len} bytes)"
            ),
            E::HeaderNotUtf8 { source, .. } => write!(f, "header is not UTF-8: {source}"),
            E::BadJson { message, .. } => {
                write!(f, "header is not valid safetensors JSON: {message}")
            }
            E::UnknownDtype { tensor, dtype, .. } => write!(
                f,
                "tensor `{tensor}` has unknown or unsupported dtype `{dtype}`"
            ),
            E::DuplicateName { tensor, .. } => {
                write!(f, "tensor name `{tensor}` appears more than once")
            }
            E::OffsetsOutOfRange {
                tensor,
                start,
                end,
                data_len,
                ..
            } => write!(
                f,
                "tensor `{tensor}` has data_offsets [{start}, {end}) past the end of the data \
                 section ({data_len} bytes); the file is truncated or the header is wrong"
            ),
            E::InvalidOffsets {
                tensor, start, end, ..
            } => write!(
                f,
                "tensor `{tensor}` has data_offsets [{start}, {end}) that end before they start"
            ),
            E::OverlappingTensors { tensor, other, .. } => write!(
                f,
                "tensor `{tensor}` overlaps tensor `{other}` in the data section"
            ),
            E::GapBeforeTensor {
                tensor,
                gap_start,
                gap_end,
                ..
            } => write!(
                f,
                "bytes [{gap_start}, {gap_end}) of the data section, before tensor `{tensor}`, \
                 belong to no tensor (safetensors offsets must be contiguous)"
            ),
            E::LengthMismatch {
                tensor,
                dtype,
                shape,
                expected: Some(expected),
                actual,
                ..
            } => write!(
                f,
                "tensor `{tensor}` ({dtype}, shape {shape:?}) needs {expected} bytes but has \
                 {actual}"
            ),
            E::LengthMismatch {
                tensor,
                dtype,
                shape,
                expected: None,
                actual,
                ..
            } => write!(
                f,
                "tensor `{tensor}` ({dtype}, shape {shape:?}) has a byte size that overflows; \
                 it has {actual} bytes"
            ),
            E::TrailingBytes {
                data_end, data_len, ..
            } => write!(
                f,
                "the data section has {} bytes after the last tensor (tensors end at \
                 {data_end}, the data section is {data_len} bytes)",
                data_len.saturating_sub(*data_end)
            ),
            E::DtypeSizeMismatch {
                tensor,
                dtype,
                requested,
                requested_size,
                ..
            } => write!(
                f,
                "tensor `{tensor}` has dtype {dtype} ({}-byte elements) and cannot be viewed \
                 as `{requested}` ({requested_size}-byte elements)",
                dtype.size_in_bytes()
            ),
            E::DtypeMismatch {
                tensor,
                dtype,
                requested,
                ..
            } => write!(f, "tensor `{tensor}` has dtype {dtype}, not {requested}"),
            E::Misaligned {
                tensor,
                requested,
                required_align,
                address,
                ..
            } => write!(
                f,
                "tensor `{tensor}` starts at {address:#x}, not aligned to {required_align} \
                 bytes as `{requested}` needs; use as_cow or to_vec_of to get a copy"
            ),
            E::BigEndianHost { tensor, dtype, .. } => write!(
                f,
                "tensor `{tensor}` ({dtype}) is stored little-endian and this host is \
                 big-endian, so it cannot be borrowed as native values; use as_cow or \
                 to_vec_of, which convert"
            ),
        }
    }
}

impl std::error::Error for WeightsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WeightsError::Io { source, .. } => Some(source),
            WeightsError::HeaderNotUtf8 { source, .. } => Some(source),
            _ => None,
        }
    }
}
