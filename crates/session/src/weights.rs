//! Named, read-only tensors loaded from safetensors files.
//!
//! Layout of this module, top down:
//! - the public types: [`LoadMode`], [`Dtype`], [`Weights`], [`TensorView`], [`WeightsError`];
//! - the backing bytes: [`Storage`] (a read-only map or an owned, 64-byte aligned copy);
//! - the loader: `open_file` / `map_read_only` / `read_to_owned` get the bytes, `parse_file`
//!   validates them (our own checks, then `safetensors::SafeTensors::read_metadata`, whose
//!   errors are mapped to [`WeightsError`] variants that name the tensor at fault).
//!
//! The only `unsafe` in the crate is the `Mmap::map` call in `map_read_only`.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::str::Utf8Error;
use std::sync::Arc;

use bytemuck::{Pod, Zeroable};
use memmap2::Mmap;
use safetensors::{SafeTensorError, SafeTensors};
use serde::de::{IgnoredAny, MapAccess, Visitor};

/// Largest JSON header accepted, in bytes: the safetensors crate's own limit (100 MB).
///
/// The crate does not export its constant; we check the header length against this value
/// before parsing so that the error names the file and the length.
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// Alignment, in bytes, of the start of every owned buffer ([`LoadMode::Copy`],
/// [`Weights::from_tensors`], [`Weights::to_owned_copy`]).
///
/// A mapped file starts on a page boundary, which is at least as strict.
pub const OWNED_ALIGN: usize = 64;

/// Size of the little-endian `u64` header length that opens every safetensors file.
const LEN_PREFIX: usize = 8;

/// The key of the optional free-form string map in a safetensors header; not a tensor.
const METADATA_KEY: &str = "__metadata__";

// ---------------------------------------------------------------------------------------------
// LoadMode, Dtype
// ---------------------------------------------------------------------------------------------

/// How [`Weights::open`] brings a file's bytes into memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LoadMode {
    /// Map the file read-only (memmap2). Loading is cheap and pages are shared with the page
    /// cache, but the file must not be written or truncated in place while the map is alive:
    /// see the crate docs, "Files under mmap: what is safe".
    Mmap,
    /// Read the whole file into owned memory aligned to [`OWNED_ALIGN`] bytes. The file is
    /// closed before [`Weights::open`] returns and may then be deleted, replaced or rewritten.
    Copy,
}

/// Element type of a tensor, as spelled in safetensors headers.
///
/// Covers every safetensors dtype with whole-byte elements. The sub-byte dtypes of the format
/// (`F4`, `F6_E2M3`, `F6_E3M2`) are rejected with [`WeightsError::UnknownDtype`].
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

    /// Maps the safetensors crate's dtype; `None` for the sub-byte dtypes we do not support.
    fn from_safetensors(dtype: safetensors::Dtype) -> Option<Dtype> {
        use safetensors::Dtype as S;
        Some(match dtype {
            S::BOOL => Dtype::Bool,
            S::U8 => Dtype::U8,
            S::I8 => Dtype::I8,
            S::F8_E5M2 => Dtype::F8E5M2,
            S::F8_E4M3 => Dtype::F8E4M3,
            S::F8_E8M0 => Dtype::F8E8M0,
            S::F8_E4M3FNUZ => Dtype::F8E4M3Fnuz,
            S::F8_E5M2FNUZ => Dtype::F8E5M2Fnuz,
            S::U16 => Dtype::U16,
            S::I16 => Dtype::I16,
            S::F16 => Dtype::F16,
            S::BF16 => Dtype::Bf16,
            S::U32 => Dtype::U32,
            S::I32 => Dtype::I32,
            S::F32 => Dtype::F32,
            S::C64 => Dtype::C64,
            S::U64 => Dtype::U64,
            S::I64 => Dtype::I64,
            S::F64 => Dtype::F64,
            // F4, F6_*, and whatever a later 0.8.x adds (the enum is non-exhaustive).
            _ => return None,
        })
    }

    /// `product(shape) * size_in_bytes()`, or `None` on overflow.
    fn byte_len(self, shape: &[usize]) -> Option<usize> {
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

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// Everything that can go wrong when loading [`Weights`] or viewing a tensor.
///
/// Every message names where the weights came from (the file's path, or "in-memory weights"
/// for [`Weights::from_tensors`]) and, when one is at fault, the tensor.
#[derive(Debug)]
#[non_exhaustive]
pub enum WeightsError {
    /// The file does not exist.
    NotFound {
        /// The path given to [`Weights::open`].
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
    /// The header is not JSON, or not the JSON shape safetensors expects
    /// (an object of `{"dtype", "shape", "data_offsets"}` objects).
    BadJson {
        /// The file.
        path: PathBuf,
        /// The parser's message, with line and column.
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
    /// [`Weights::from_tensors`]).
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
        /// Start offset, relative to the data section.
        start: u64,
        /// End offset (exclusive), relative to the data section.
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
        /// Start offset, relative to the data section.
        start: u64,
        /// End offset, relative to the data section.
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
        /// Start of the gap, relative to the data section.
        gap_start: u64,
        /// End of the gap (exclusive), relative to the data section.
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
        /// Where the last tensor ends, relative to the data section.
        data_end: u64,
        /// Length of the data section.
        data_len: u64,
    },
    /// Any other problem the safetensors crate reports about the header.
    InvalidHeader {
        /// The file.
        path: PathBuf,
        /// The safetensors crate's message.
        message: String,
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
    /// A dtype-checked view ([`TensorView::typed`]) was asked for with an element type of
    /// another dtype.
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
    /// element type. Safetensors does not align data offsets; use [`TensorView::as_cow`] or
    /// [`TensorView::to_vec_of`], which copy in that case.
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
}

/// Displays where weights came from: the file's path, or a fixed text for in-memory weights.
struct Origin<'a>(Option<&'a Path>);

impl fmt::Display for Origin<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(path) => write!(f, "{}", path.display()),
            None => f.write_str("in-memory weights"),
        }
    }
}

impl fmt::Display for WeightsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use WeightsError as E;
        let file = |p: &PathBuf| p.display().to_string();
        let origin = |p: &Option<PathBuf>| Origin(p.as_deref()).to_string();
        match self {
            E::NotFound { path } => write!(f, "{}: weights file not found", file(path)),
            E::Io { path, source } => write!(f, "{}: I/O error: {source}", file(path)),
            E::OutOfMemory { path, bytes } => {
                write!(f, "{}: cannot allocate {bytes} bytes", origin(path))
            }
            E::FileTooSmall { path, len } => write!(
                f,
                "{}: file is {len} bytes long, too short for a safetensors file \
                 (it must start with an 8-byte header length)",
                file(path)
            ),
            E::HeaderTooLarge { path, header_len } => write!(
                f,
                "{}: header length {header_len} is over the safetensors limit of \
                 {MAX_HEADER_LEN} bytes",
                file(path)
            ),
            E::HeaderPastEof {
                path,
                header_len,
                file_len,
            } => write!(
                f,
                "{}: header length {header_len} runs past the end of the file \
                 ({file_len} bytes)",
                file(path)
            ),
            E::HeaderNotUtf8 { path, source } => {
                write!(f, "{}: header is not UTF-8: {source}", file(path))
            }
            E::BadJson { path, message } => {
                write!(
                    f,
                    "{}: header is not valid safetensors JSON: {message}",
                    file(path)
                )
            }
            E::UnknownDtype {
                path,
                tensor,
                dtype,
            } => write!(
                f,
                "{}: tensor `{tensor}` has unknown or unsupported dtype `{dtype}`",
                file(path)
            ),
            E::DuplicateName { path, tensor } => write!(
                f,
                "{}: tensor name `{tensor}` appears more than once",
                origin(path)
            ),
            E::OffsetsOutOfRange {
                path,
                tensor,
                start,
                end,
                data_len,
            } => write!(
                f,
                "{}: tensor `{tensor}` has data_offsets [{start}, {end}) past the end of the \
                 data section ({data_len} bytes); the file is truncated or the header is wrong",
                file(path)
            ),
            E::InvalidOffsets {
                path,
                tensor,
                start,
                end,
            } => write!(
                f,
                "{}: tensor `{tensor}` has data_offsets [{start}, {end}) that end before they \
                 start",
                file(path)
            ),
            E::OverlappingTensors {
                path,
                tensor,
                other,
            } => write!(
                f,
                "{}: tensor `{tensor}` overlaps tensor `{other}` in the data section",
                file(path)
            ),
            E::GapBeforeTensor {
                path,
                tensor,
                gap_start,
                gap_end,
            } => write!(
                f,
                "{}: bytes [{gap_start}, {gap_end}) of the data section, before tensor \
                 `{tensor}`, belong to no tensor (safetensors offsets must be contiguous)",
                file(path)
            ),
            E::LengthMismatch {
                path,
                tensor,
                dtype,
                shape,
                expected,
                actual,
            } => match expected {
                Some(expected) => write!(
                    f,
                    "{}: tensor `{tensor}` ({dtype}, shape {shape:?}) needs {expected} bytes \
                     but has {actual}",
                    origin(path)
                ),
                None => write!(
                    f,
                    "{}: tensor `{tensor}` ({dtype}, shape {shape:?}) has a byte size that \
                     overflows; it has {actual} bytes",
                    origin(path)
                ),
            },
            E::TrailingBytes {
                path,
                data_end,
                data_len,
            } => write!(
                f,
                "{}: the data section has {} bytes after the last tensor (tensors end at \
                 {data_end}, the data section is {data_len} bytes)",
                file(path),
                data_len.saturating_sub(*data_end)
            ),
            E::InvalidHeader { path, message } => {
                write!(f, "{}: invalid safetensors header: {message}", file(path))
            }
            E::DtypeSizeMismatch {
                path,
                tensor,
                dtype,
                requested,
                requested_size,
            } => write!(
                f,
                "{}: tensor `{tensor}` has dtype {dtype} ({}-byte elements) and cannot be \
                 viewed as `{requested}` ({requested_size}-byte elements)",
                origin(path),
                dtype.size_in_bytes()
            ),
            E::DtypeMismatch {
                path,
                tensor,
                dtype,
                requested,
            } => write!(
                f,
                "{}: tensor `{tensor}` has dtype {dtype}, not {requested}",
                origin(path)
            ),
            E::Misaligned {
                path,
                tensor,
                requested,
                required_align,
                address,
            } => write!(
                f,
                "{}: tensor `{tensor}` starts at {address:#x}, not aligned to \
                 {required_align} bytes as `{requested}` needs; use as_cow or to_vec_of to \
                 get a copy",
                origin(path)
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

// ---------------------------------------------------------------------------------------------
// Storage
// ---------------------------------------------------------------------------------------------

/// One 64-byte, 64-aligned unit of an owned buffer.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C, align(64))]
struct Chunk([u8; OWNED_ALIGN]);

const _: () = assert!(std::mem::size_of::<Chunk>() == OWNED_ALIGN);
const _: () = assert!(std::mem::align_of::<Chunk>() == OWNED_ALIGN);

/// Owned bytes whose first byte is aligned to [`OWNED_ALIGN`].
struct OwnedBytes {
    /// Backing memory; the tail of the last chunk past `len` is zero.
    chunks: Vec<Chunk>,
    /// Number of meaningful bytes; always `<= chunks.len() * OWNED_ALIGN`.
    len: usize,
}

impl OwnedBytes {
    /// A zeroed buffer of `len` bytes, or `None` if the memory cannot be had.
    fn try_zeroed(len: usize) -> Option<OwnedBytes> {
        let n = len.div_ceil(OWNED_ALIGN);
        let mut chunks = Vec::new();
        chunks.try_reserve_exact(n).ok()?;
        chunks.resize(n, Chunk::zeroed());
        Some(OwnedBytes { chunks, len })
    }

    fn as_bytes(&self) -> &[u8] {
        let all: &[u8] = bytemuck::cast_slice(&self.chunks);
        // `len <= all.len()` by the field invariant; `get` keeps this panic-free regardless.
        all.get(..self.len).unwrap_or(all)
    }

    fn as_bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        let all: &mut [u8] = bytemuck::cast_slice_mut(&mut self.chunks);
        let all_len = all.len();
        &mut all[..len.min(all_len)]
    }
}

/// The bytes behind a [`Weights`]: a read-only map of the file, or an owned buffer.
enum Storage {
    /// The whole file, mapped read-only. Keeps the file's inode alive until dropped.
    Mapped(Mmap),
    /// An owned, aligned copy (of the whole file, or of packed tensors).
    Owned(OwnedBytes),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(map) => map,
            Storage::Owned(owned) => owned.as_bytes(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Weights
// ---------------------------------------------------------------------------------------------

/// One tensor's description and where its bytes are.
#[derive(Clone, Debug)]
struct Entry {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte range in `Inner::storage`; always within it, and its length is always
    /// `product(shape) * dtype.size_in_bytes()` (checked when the entry is built).
    range: Range<usize>,
}

struct Inner {
    /// The file the weights were loaded from (kept by `to_owned_copy`).
    path: Option<PathBuf>,
    storage: Storage,
    /// `true` when `storage` holds the file image, so that entry ranges are file offsets.
    file_image: bool,
    /// Sorted by `(range.start, range.end, name)`.
    entries: Vec<Entry>,
    /// Name -> index into `entries`.
    index: HashMap<String, usize>,
    /// Sum of the entries' byte lengths.
    total_bytes: usize,
}

/// Named, read-only tensors (dtype, shape, bytes), loaded from a safetensors file or built in
/// memory.
///
/// `Weights` is a handle: cloning it is one atomic increment, and every clone shares the same
/// bytes. A mapping ([`LoadMode::Mmap`]) is released when the last clone drops. `Weights` is
/// `Send + Sync`, so one load can serve many worker threads (directly, or as `Arc<Weights>`).
///
/// Tensors are listed in order of their offset in the file ([`Weights::names`],
/// [`Weights::iter`]); ties (empty tensors) are broken by name.
#[derive(Clone)]
pub struct Weights {
    inner: Arc<Inner>,
}

const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Weights>();
};

impl Weights {
    /// Loads a safetensors file.
    ///
    /// With [`LoadMode::Mmap`] the file is mapped read-only and stays mapped until the last
    /// clone of the returned `Weights` drops; the file descriptor itself is closed before this
    /// returns. With [`LoadMode::Copy`] the file is read into owned memory aligned to
    /// [`OWNED_ALIGN`] bytes and closed before this returns. In both modes tensor offsets keep
    /// their place relative to the file start, so a tensor is aligned in one mode exactly when
    /// it is aligned in the other.
    ///
    /// The whole header is validated: see [`WeightsError`] for what is rejected. Never panics,
    /// whatever the file holds.
    ///
    /// # Errors
    /// [`WeightsError::NotFound`] or [`WeightsError::Io`] if the file cannot be opened, read
    /// or mapped; [`WeightsError::OutOfMemory`] if a copy cannot be allocated; any of the
    /// format variants if the file is not a valid safetensors file.
    pub fn open(path: impl AsRef<Path>, mode: LoadMode) -> Result<Weights, WeightsError> {
        let path = path.as_ref();
        let storage = match mode {
            LoadMode::Mmap => Storage::Mapped(map_read_only(path)?),
            LoadMode::Copy => Storage::Owned(read_to_owned(path)?),
        };
        let entries = parse_file(storage.bytes(), path)?;
        Ok(Weights::from_parts(
            Some(path.to_path_buf()),
            storage,
            true,
            entries,
        ))
    }

    /// Builds weights from in-memory tensors, packed into one owned buffer where every tensor
    /// starts on an [`OWNED_ALIGN`]-byte boundary (so every typed view is aligned).
    ///
    /// Each item is `(name, dtype, shape, bytes)`. Tensors keep the order given.
    ///
    /// # Errors
    /// [`WeightsError::DuplicateName`] if a name repeats; [`WeightsError::LengthMismatch`] if
    /// `bytes.len()` is not `product(shape) * dtype.size_in_bytes()` (or that overflows);
    /// [`WeightsError::OutOfMemory`] if the buffer cannot be allocated.
    ///
    /// # Examples
    /// ```
    /// use tensor_session::{Dtype, Weights};
    ///
    /// let bias: Vec<u8> = [1.0f32, 2.0, 3.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    /// let w = Weights::from_tensors([("bias", Dtype::F32, vec![3], bias)])?;
    /// assert_eq!(w.get("bias").unwrap().try_as_slice::<f32>()?, &[1.0, 2.0, 3.0]);
    /// # Ok::<(), tensor_session::WeightsError>(())
    /// ```
    pub fn from_tensors<I, N, S, B>(tensors: I) -> Result<Weights, WeightsError>
    where
        I: IntoIterator<Item = (N, Dtype, S, B)>,
        N: Into<String>,
        S: Into<Vec<usize>>,
        B: AsRef<[u8]>,
    {
        let items: Vec<(String, Dtype, Vec<usize>, B)> = tensors
            .into_iter()
            .map(|(name, dtype, shape, bytes)| (name.into(), dtype, shape.into(), bytes))
            .collect();

        let mut seen = HashSet::with_capacity(items.len());
        let mut entries = Vec::with_capacity(items.len());
        let mut cursor = 0usize;
        for (name, dtype, shape, bytes) in &items {
            if !seen.insert(name.as_str()) {
                return Err(WeightsError::DuplicateName {
                    path: None,
                    tensor: name.clone(),
                });
            }
            let actual = bytes.as_ref().len();
            let expected = dtype.byte_len(shape);
            if expected != Some(actual) {
                return Err(WeightsError::LengthMismatch {
                    path: None,
                    tensor: name.clone(),
                    dtype: *dtype,
                    shape: shape.clone(),
                    expected,
                    actual: actual as u64,
                });
            }
            let too_big = || WeightsError::OutOfMemory {
                path: None,
                bytes: u64::MAX,
            };
            let start = cursor
                .checked_next_multiple_of(OWNED_ALIGN)
                .ok_or_else(too_big)?;
            let end = start.checked_add(actual).ok_or_else(too_big)?;
            cursor = end;
            entries.push(Entry {
                name: name.clone(),
                dtype: *dtype,
                shape: shape.clone(),
                range: start..end,
            });
        }

        let mut owned = OwnedBytes::try_zeroed(cursor).ok_or(WeightsError::OutOfMemory {
            path: None,
            bytes: cursor as u64,
        })?;
        let buf = owned.as_bytes_mut();
        for (entry, (_, _, _, bytes)) in entries.iter().zip(&items) {
            buf[entry.range.clone()].copy_from_slice(bytes.as_ref());
        }
        Ok(Weights::from_parts(
            None,
            Storage::Owned(owned),
            false,
            entries,
        ))
    }

    /// Assembles a `Weights`. `entries` must have unique names and ranges within `storage`.
    fn from_parts(
        path: Option<PathBuf>,
        storage: Storage,
        file_image: bool,
        mut entries: Vec<Entry>,
    ) -> Weights {
        entries.sort_by(|a, b| {
            (a.range.start, a.range.end, &a.name).cmp(&(b.range.start, b.range.end, &b.name))
        });
        let index = entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.name.clone(), i))
            .collect();
        let total_bytes = entries.iter().map(|e| e.range.len()).sum();
        debug_assert!(
            entries.iter().all(|e| e.range.end <= storage.bytes().len()),
            "every tensor should lie within the {} bytes of storage",
            storage.bytes().len()
        );
        Weights {
            inner: Arc::new(Inner {
                path,
                storage,
                file_image,
                entries,
                index,
                total_bytes,
            }),
        }
    }

    /// The tensor called `name`, if there is one.
    pub fn get(&self, name: &str) -> Option<TensorView<'_>> {
        let &i = self.inner.index.get(name)?;
        self.inner.entries.get(i).map(|entry| self.view(entry))
    }

    fn view<'a>(&'a self, entry: &'a Entry) -> TensorView<'a> {
        let all = self.inner.storage.bytes();
        debug_assert!(
            entry.range.end <= all.len(),
            "tensor `{}` range {:?} should lie within {} bytes",
            entry.name,
            entry.range,
            all.len()
        );
        TensorView {
            path: self.inner.path.as_deref(),
            file_image: self.inner.file_image,
            entry,
            bytes: all.get(entry.range.clone()).unwrap_or_default(),
        }
    }

    /// Tensor names, in order of their offset.
    pub fn names(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.inner.entries.iter().map(|e| e.name.as_str())
    }

    /// All tensors, in order of their offset.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = TensorView<'_>> + '_ {
        self.inner.entries.iter().map(|e| self.view(e))
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.inner.entries.len()
    }

    /// `true` if there are no tensors.
    pub fn is_empty(&self) -> bool {
        self.inner.entries.is_empty()
    }

    /// Sum of the tensors' byte lengths (the data section, without the header).
    pub fn total_bytes(&self) -> usize {
        self.inner.total_bytes
    }

    /// `true` if the bytes are a live map of the file ([`LoadMode::Mmap`]).
    pub fn is_mapped(&self) -> bool {
        matches!(self.inner.storage, Storage::Mapped(_))
    }

    /// The file these weights were loaded from; `None` for [`Weights::from_tensors`].
    /// Copies made by [`Weights::to_owned_copy`] keep the path, for messages, but no longer
    /// depend on the file.
    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    /// An owned copy that does not depend on the file (as if loaded with [`LoadMode::Copy`]):
    /// the copy is not mapped, and dropping every clone of `self` releases the mapping.
    ///
    /// # Errors
    /// [`WeightsError::OutOfMemory`] if the copy cannot be allocated.
    pub fn try_to_owned_copy(&self) -> Result<Weights, WeightsError> {
        let src = self.inner.storage.bytes();
        let mut owned = OwnedBytes::try_zeroed(src.len()).ok_or(WeightsError::OutOfMemory {
            path: self.inner.path.clone(),
            bytes: src.len() as u64,
        })?;
        owned.as_bytes_mut().copy_from_slice(src);
        Ok(Weights::from_parts(
            self.inner.path.clone(),
            Storage::Owned(owned),
            self.inner.file_image,
            self.inner.entries.clone(),
        ))
    }

    /// Like [`Weights::try_to_owned_copy`].
    ///
    /// # Panics
    /// If the copy cannot be allocated.
    pub fn to_owned_copy(&self) -> Weights {
        match self.try_to_owned_copy() {
            Ok(weights) => weights,
            Err(err) => panic!("{err}"),
        }
    }
}

impl fmt::Debug for Weights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Weights")
            .field("path", &self.inner.path)
            .field("mapped", &self.is_mapped())
            .field("tensors", &self.len())
            .field("total_bytes", &self.total_bytes())
            .finish()
    }
}

// ---------------------------------------------------------------------------------------------
// TensorView
// ---------------------------------------------------------------------------------------------

/// A Rust element type with a safetensors dtype, for [`TensorView::typed`].
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

/// A borrowed view of one tensor of a [`Weights`].
///
/// Values are stored little-endian, as safetensors specifies; the typed views reinterpret the
/// bytes in native order, which is the same on every little-endian target.
#[derive(Clone, Copy)]
pub struct TensorView<'a> {
    path: Option<&'a Path>,
    file_image: bool,
    entry: &'a Entry,
    /// Always `product(shape) * dtype.size_in_bytes()` long.
    bytes: &'a [u8],
}

impl<'a> TensorView<'a> {
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

    /// The raw bytes, `len_elements() * dtype().size_in_bytes()` of them.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Number of elements: the product of the shape (1 for a scalar).
    pub fn len_elements(&self) -> usize {
        self.bytes.len() / self.entry.dtype.size_in_bytes()
    }

    /// Where the bytes sit in the file, for weights loaded with [`Weights::open`] (and their
    /// [`Weights::to_owned_copy`]); `None` for [`Weights::from_tensors`].
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
    /// not guarantee aligned offsets; [`TensorView::as_cow`] copies in that case).
    pub fn try_as_slice<T: Pod>(&self) -> Result<&'a [T], WeightsError> {
        self.check_size::<T>()?;
        if self.bytes.is_empty() {
            return Ok(&[]);
        }
        bytemuck::try_cast_slice(self.bytes).map_err(|_| WeightsError::Misaligned {
            path: self.path.map(Path::to_path_buf),
            tensor: self.entry.name.clone(),
            requested: std::any::type_name::<T>(),
            required_align: std::mem::align_of::<T>(),
            address: self.bytes.as_ptr() as usize,
        })
    }

    /// The elements as `&[T]`, where `T`'s dtype must be the tensor's: an `F32` tensor as
    /// `f32`, never as `u32` (unlike [`TensorView::try_as_slice`], which checks sizes only).
    ///
    /// # Errors
    /// [`WeightsError::DtypeMismatch`] for another dtype; [`WeightsError::Misaligned`] as in
    /// [`TensorView::try_as_slice`].
    pub fn typed<T: Element>(&self) -> Result<&'a [T], WeightsError> {
        if T::DTYPE != self.entry.dtype {
            return Err(WeightsError::DtypeMismatch {
                path: self.path.map(Path::to_path_buf),
                tensor: self.entry.name.clone(),
                dtype: self.entry.dtype,
                requested: T::DTYPE,
            });
        }
        self.try_as_slice()
    }

    /// The elements as `&[T]` when the bytes are aligned for `T`, else as an owned copy.
    ///
    /// # Errors
    /// [`WeightsError::DtypeSizeMismatch`] if `size_of::<T>()` differs from the dtype size.
    pub fn as_cow<T: Pod>(&self) -> Result<Cow<'a, [T]>, WeightsError> {
        match self.try_as_slice::<T>() {
            Ok(slice) => Ok(Cow::Borrowed(slice)),
            Err(WeightsError::Misaligned { .. }) => {
                let mut out = vec![T::zeroed(); self.len_elements()];
                bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(self.bytes);
                Ok(Cow::Owned(out))
            }
            Err(err) => Err(err),
        }
    }

    /// The elements copied into a `Vec<T>`, whatever their alignment.
    ///
    /// # Errors
    /// [`WeightsError::DtypeSizeMismatch`] if `size_of::<T>()` differs from the dtype size.
    pub fn to_vec_of<T: Pod>(&self) -> Result<Vec<T>, WeightsError> {
        self.as_cow().map(Cow::into_owned)
    }

    fn check_size<T: Pod>(&self) -> Result<(), WeightsError> {
        let size = std::mem::size_of::<T>();
        if size == self.entry.dtype.size_in_bytes() {
            Ok(())
        } else {
            Err(WeightsError::DtypeSizeMismatch {
                path: self.path.map(Path::to_path_buf),
                tensor: self.entry.name.clone(),
                dtype: self.entry.dtype,
                requested: std::any::type_name::<T>(),
                requested_size: size,
            })
        }
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

// ---------------------------------------------------------------------------------------------
// Getting the bytes
// ---------------------------------------------------------------------------------------------

fn io_error(path: &Path, source: io::Error) -> WeightsError {
    WeightsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Opens `path` for reading and returns it with its length; rejects what is not a regular file.
fn open_file(path: &Path) -> Result<(File, u64), WeightsError> {
    let file = File::open(path).map_err(|source| match source.kind() {
        io::ErrorKind::NotFound => WeightsError::NotFound {
            path: path.to_path_buf(),
        },
        _ => io_error(path, source),
    })?;
    let meta = file.metadata().map_err(|e| io_error(path, e))?;
    if !meta.is_file() {
        return Err(io_error(
            path,
            io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"),
        ));
    }
    Ok((file, meta.len()))
}

/// Maps the whole file read-only. The file descriptor is closed on return; the map keeps the
/// file's inode alive.
#[allow(unsafe_code)]
fn map_read_only(path: &Path) -> Result<Mmap, WeightsError> {
    let (file, _len) = open_file(path)?;
    // The contract of `LoadMode::Mmap` (crate docs, "Files under mmap: what is safe"): while
    // any `Weights` from this map is alive, the caller must not
    //   1. write to the file in place (the bytes would change under shared references), nor
    //   2. truncate it (touching pages past the new end raises SIGBUS).
    // Deleting the file or replacing it by rename is fine: the map keeps the old inode.
    // SAFETY: the mapped bytes are sound while nobody modifies the file, which is the contract
    // above (we cannot enforce it); the map is read-only, so this process never writes to it.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| io_error(path, e))?;
    drop(file);
    Ok(map)
}

/// Reads the whole file into an aligned owned buffer and closes it.
fn read_to_owned(path: &Path) -> Result<OwnedBytes, WeightsError> {
    let (mut file, len) = open_file(path)?;
    let oom = || WeightsError::OutOfMemory {
        path: Some(path.to_path_buf()),
        bytes: len,
    };
    let len_usize = usize::try_from(len).map_err(|_| oom())?;
    let mut owned = OwnedBytes::try_zeroed(len_usize).ok_or_else(oom)?;
    let changed = || {
        io_error(
            path,
            io::Error::other("the file changed size while it was being read"),
        )
    };
    file.read_exact(owned.as_bytes_mut())
        .map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => changed(),
            _ => io_error(path, e),
        })?;
    // The file must end where its metadata said it would.
    let mut extra = [0u8; 1];
    loop {
        match file.read(&mut extra) {
            Ok(0) => break,
            Ok(_) => return Err(changed()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_error(path, e)),
        }
    }
    drop(file);
    Ok(owned)
}

// ---------------------------------------------------------------------------------------------
// Parsing and validation
// ---------------------------------------------------------------------------------------------

/// What our own pass over the header JSON found for one tensor. Fields the JSON does not
/// give in the expected form are `None`; the safetensors crate then reports the problem.
struct ProbeEntry {
    name: String,
    dtype: Option<String>,
    shape: Option<Vec<u64>>,
    offsets: Option<(u64, u64)>,
}

impl ProbeEntry {
    fn from_value(name: String, value: &serde_json::Value) -> ProbeEntry {
        let field = |key: &str| value.as_object().and_then(|o| o.get(key));
        let dtype = field("dtype")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned);
        let shape = field("shape")
            .and_then(serde_json::Value::as_array)
            .and_then(|dims| dims.iter().map(serde_json::Value::as_u64).collect());
        let offsets = field("data_offsets")
            .and_then(serde_json::Value::as_array)
            .and_then(|pair| match pair.as_slice() {
                [start, end] => Some((start.as_u64()?, end.as_u64()?)),
                _ => None,
            });
        ProbeEntry {
            name,
            dtype,
            shape,
            offsets,
        }
    }
}

/// Our pass over the header: every tensor entry in file order, and the first repeated key
/// (which `serde_json` and the safetensors crate would otherwise let overwrite the first).
struct HeaderProbe {
    entries: Vec<ProbeEntry>,
    duplicate: Option<String>,
}

impl<'de> serde::Deserialize<'de> for HeaderProbe {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ProbeVisitor;

        impl<'de> Visitor<'de> for ProbeVisitor {
            type Value = HeaderProbe;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object mapping tensor names to tensor descriptions")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<HeaderProbe, A::Error> {
                let mut seen = HashSet::new();
                let mut entries = Vec::new();
                let mut duplicate = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key == METADATA_KEY {
                        map.next_value::<IgnoredAny>()?;
                        continue;
                    }
                    let value = map.next_value::<serde_json::Value>()?;
                    if !seen.insert(key.clone()) {
                        duplicate.get_or_insert(key);
                        continue;
                    }
                    entries.push(ProbeEntry::from_value(key, &value));
                }
                Ok(HeaderProbe { entries, duplicate })
            }
        }

        deserializer.deserialize_map(ProbeVisitor)
    }
}

/// Validates a whole safetensors file image and returns its tensors, with byte ranges
/// relative to the start of `bytes`.
///
/// Our checks come first, in file order: lengths (clear messages; the crate's are terse),
/// UTF-8 and JSON, repeated names (the crate keeps the last silently), dtype names (the crate
/// does not say which tensor), and offsets past the end of the data section (the crate's
/// final `buffer_end + 8 + n` sum can overflow, a panic in debug builds, on offsets near
/// `usize::MAX`). Then `SafeTensors::read_metadata` checks ordering, contiguity, byte lengths
/// and full coverage; its errors are mapped to variants naming the tensor at fault.
fn parse_file(bytes: &[u8], path: &Path) -> Result<Vec<Entry>, WeightsError> {
    let file_len = bytes.len();
    let Some((len_bytes, rest)) = bytes.split_first_chunk::<LEN_PREFIX>() else {
        return Err(WeightsError::FileTooSmall {
            path: path.to_path_buf(),
            len: file_len as u64,
        });
    };
    let header_len = u64::from_le_bytes(*len_bytes);
    if header_len > MAX_HEADER_LEN {
        return Err(WeightsError::HeaderTooLarge {
            path: path.to_path_buf(),
            header_len,
        });
    }
    let past_eof = || WeightsError::HeaderPastEof {
        path: path.to_path_buf(),
        header_len,
        file_len: file_len as u64,
    };
    let n = usize::try_from(header_len).map_err(|_| past_eof())?;
    let header = rest.get(..n).ok_or_else(past_eof)?;
    let header_end = LEN_PREFIX + n; // <= file_len, so no overflow
    let data_len = (file_len - header_end) as u64;

    let text = std::str::from_utf8(header).map_err(|source| WeightsError::HeaderNotUtf8 {
        path: path.to_path_buf(),
        source,
    })?;
    let probe: HeaderProbe = serde_json::from_str(text).map_err(|e| WeightsError::BadJson {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    if let Some(tensor) = probe.duplicate {
        return Err(WeightsError::DuplicateName {
            path: Some(path.to_path_buf()),
            tensor,
        });
    }
    for entry in &probe.entries {
        if let Some(dtype) = &entry.dtype {
            if Dtype::from_name(dtype).is_none() {
                return Err(WeightsError::UnknownDtype {
                    path: path.to_path_buf(),
                    tensor: entry.name.clone(),
                    dtype: dtype.clone(),
                });
            }
        }
        if let Some((start, end)) = entry.offsets {
            if start > data_len || end > data_len {
                return Err(WeightsError::OffsetsOutOfRange {
                    path: path.to_path_buf(),
                    tensor: entry.name.clone(),
                    start,
                    end,
                    data_len,
                });
            }
        }
    }

    // Every offset is now <= data_len, so the crate's arithmetic cannot overflow.
    let metadata = match SafeTensors::read_metadata(bytes) {
        Ok((crate_n, metadata)) => {
            debug_assert_eq!(crate_n, n, "the crate should read the same header length");
            metadata
        }
        Err(err) => return Err(map_crate_error(err, path, &probe.entries, data_len)),
    };

    // Build our entries from the crate's parse, re-checking what our invariants rest on.
    let mut entries = Vec::with_capacity(metadata.tensors().len());
    for (name, info) in metadata.tensors() {
        let Some(dtype) = Dtype::from_safetensors(info.dtype) else {
            return Err(WeightsError::UnknownDtype {
                path: path.to_path_buf(),
                dtype: info.dtype.to_string(),
                tensor: name,
            });
        };
        let (start, end) = info.data_offsets;
        let range = header_end
            .checked_add(start)
            .zip(header_end.checked_add(end))
            .filter(|&(s, e)| s <= e && e <= file_len);
        let Some((abs_start, abs_end)) = range else {
            return Err(WeightsError::OffsetsOutOfRange {
                path: path.to_path_buf(),
                tensor: name,
                start: start as u64,
                end: end as u64,
                data_len,
            });
        };
        let expected = dtype.byte_len(&info.shape);
        if expected != Some(abs_end - abs_start) {
            return Err(WeightsError::LengthMismatch {
                path: Some(path.to_path_buf()),
                tensor: name,
                dtype,
                shape: info.shape.clone(),
                expected,
                actual: (abs_end - abs_start) as u64,
            });
        }
        entries.push(Entry {
            name,
            dtype,
            shape: info.shape.clone(),
            range: abs_start..abs_end,
        });
    }
    Ok(entries)
}

/// Turns a safetensors error into a [`WeightsError`], naming the tensor at fault when the
/// crate does not.
fn map_crate_error(
    err: SafeTensorError,
    path: &Path,
    probe: &[ProbeEntry],
    data_len: u64,
) -> WeightsError {
    let path_buf = path.to_path_buf();
    let fallback = |err: &SafeTensorError| WeightsError::InvalidHeader {
        path: path.to_path_buf(),
        message: err.to_string(),
    };
    match err {
        SafeTensorError::InvalidHeaderDeserialization(ref e)
        | SafeTensorError::JsonError(ref e) => WeightsError::BadJson {
            path: path_buf,
            message: e.to_string(),
        },
        SafeTensorError::InvalidHeader(source) => WeightsError::HeaderNotUtf8 {
            path: path_buf,
            source,
        },
        SafeTensorError::InvalidOffset(_)
        | SafeTensorError::TensorInvalidInfo
        | SafeTensorError::ValidationOverflow
        | SafeTensorError::MisalignedSlice
        | SafeTensorError::InvalidTensorView(..) => {
            first_layout_problem(path, probe).unwrap_or_else(|| fallback(&err))
        }
        SafeTensorError::MetadataIncompleteBuffer => WeightsError::TrailingBytes {
            path: path_buf,
            data_end: probe
                .iter()
                .filter_map(|e| e.offsets.map(|(_, end)| end))
                .max()
                .unwrap_or(0),
            data_len,
        },
        // Our own checks run first and catch these; kept for completeness.
        SafeTensorError::HeaderTooLarge
        | SafeTensorError::HeaderTooSmall
        | SafeTensorError::InvalidHeaderLength
        | SafeTensorError::TensorNotFound(_)
        | SafeTensorError::IoError(_) => fallback(&err),
    }
}

/// Walks the tensors in offset order as the safetensors crate does (offsets, then byte
/// length, tensor by tensor) and describes the first problem.
fn first_layout_problem(path: &Path, probe: &[ProbeEntry]) -> Option<WeightsError> {
    let mut sorted: Vec<(&ProbeEntry, (u64, u64))> = probe
        .iter()
        .filter_map(|e| e.offsets.map(|o| (e, o)))
        .collect();
    sorted.sort_by(|(a, ao), (b, bo)| (ao, &a.name).cmp(&(bo, &b.name)));

    let mut prev: Option<&str> = None;
    let mut prev_end = 0u64;
    for (entry, (start, end)) in sorted {
        let tensor = entry.name.clone();
        if end < start {
            return Some(WeightsError::InvalidOffsets {
                path: path.to_path_buf(),
                tensor,
                start,
                end,
            });
        }
        if start < prev_end {
            return Some(WeightsError::OverlappingTensors {
                path: path.to_path_buf(),
                tensor,
                other: prev.unwrap_or_default().to_owned(),
            });
        }
        if start > prev_end {
            return Some(WeightsError::GapBeforeTensor {
                path: path.to_path_buf(),
                tensor,
                gap_start: prev_end,
                gap_end: start,
            });
        }
        let dtype = entry.dtype.as_deref().and_then(Dtype::from_name);
        if let (Some(dtype), Some(dims)) = (dtype, &entry.shape) {
            let shape: Vec<usize> = dims
                .iter()
                .map(|&d| usize::try_from(d).unwrap_or(usize::MAX))
                .collect();
            let exact = dims.iter().all(|&d| usize::try_from(d).is_ok());
            let expected = if exact { dtype.byte_len(&shape) } else { None };
            let actual = end - start;
            if expected.map(|x| x as u64) != Some(actual) {
                return Some(WeightsError::LengthMismatch {
                    path: Some(path.to_path_buf()),
                    tensor,
                    dtype,
                    shape,
                    expected,
                    actual,
                });
            }
        }
        prev = Some(&entry.name);
        prev_end = end;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_image(header: &str, data: &[u8]) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn dtype_names_round_trip_and_match_safetensors() {
        for d in Dtype::ALL {
            assert_eq!(Dtype::from_name(d.name()), Some(d));
            assert_eq!(d.to_string(), d.name());
            let st: safetensors::Dtype =
                serde_json::from_str(&format!("\"{}\"", d.name())).unwrap();
            assert_eq!(Dtype::from_safetensors(st), Some(d));
            assert_eq!(st.bitsize(), d.size_in_bytes() * 8, "{d}");
        }
        assert_eq!(Dtype::from_name("F4"), None);
        assert_eq!(Dtype::from_name("f32"), None);
    }

    #[test]
    fn owned_bytes_are_aligned() {
        for len in [0, 1, 63, 64, 65, 1000] {
            let b = OwnedBytes::try_zeroed(len).unwrap();
            assert_eq!(b.as_bytes().len(), len);
            assert_eq!(b.as_bytes().as_ptr() as usize % OWNED_ALIGN, 0);
        }
    }

    #[test]
    fn parse_rejects_offsets_near_usize_max_without_overflow() {
        // Offsets chained up to usize::MAX: the crate's own final sum would overflow.
        let mut header = String::from("{");
        let step = 1usize << 60;
        for i in 0..16usize {
            let start = i * step;
            let end = if i == 15 { usize::MAX } else { start + step };
            if i > 0 {
                header.push(',');
            }
            header.push_str(&format!(
                "\"t{i}\":{{\"dtype\":\"U8\",\"shape\":[{}],\"data_offsets\":[{start},{end}]}}",
                end - start
            ));
        }
        header.push('}');
        let img = file_image(&header, &[0; 8]);
        let err = parse_file(&img, Path::new("near_max.safetensors")).unwrap_err();
        assert!(
            matches!(err, WeightsError::OffsetsOutOfRange { .. }),
            "{err}"
        );
    }

    #[test]
    fn layout_problems_name_the_tensor() {
        let u8s = |name: &str, len: usize, start: usize, end: usize| {
            format!(r#""{name}":{{"dtype":"U8","shape":[{len}],"data_offsets":[{start},{end}]}}"#)
        };
        let parse = |entries: &[String], data: usize| {
            let img = file_image(&format!("{{{}}}", entries.join(",")), &vec![0; data]);
            parse_file(&img, Path::new("x.safetensors")).unwrap_err()
        };
        let err = parse(&[u8s("a", 4, 0, 4), u8s("b", 4, 2, 6)], 6);
        assert!(
            matches!(&err, WeightsError::OverlappingTensors { tensor, other, .. } if tensor == "b" && other == "a"),
            "{err:?}"
        );
        let err = parse(&[u8s("a", 2, 0, 2), u8s("b", 2, 4, 6)], 6);
        assert!(
            matches!(&err, WeightsError::GapBeforeTensor { tensor, gap_start: 2, gap_end: 4, .. } if tensor == "b"),
            "{err:?}"
        );
        let err = parse(&[u8s("a", 2, 2, 0)], 6);
        assert!(
            matches!(&err, WeightsError::InvalidOffsets { tensor, .. } if tensor == "a"),
            "{err:?}"
        );
        let err = parse(&[u8s("a", 3, 0, 6)], 6);
        assert!(
            matches!(&err, WeightsError::LengthMismatch { tensor, expected: Some(3), actual: 6, .. } if tensor == "a"),
            "{err:?}"
        );
    }
}
