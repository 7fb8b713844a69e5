//! Named, read-only tensors loaded from safetensors files.
//!
//! One module per concept:
//! - `dtype`: [`Dtype`] and the [`Element`] types of typed views;
//! - `error`: [`WeightsError`];
//! - `storage`: [`LoadMode`], [`MmapAck`] and the bytes behind a [`Weights`] (a read-only
//!   map, or an owned, 64-byte aligned copy), with the crate's only `unsafe`;
//! - `header`: the one validator of a file's header and layout;
//! - `view`: [`TensorView`] and the byte-order rule of typed views;
//! - here: [`Weights`] itself, a shared table of validated entries over one storage.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod dtype;
mod error;
mod header;
mod storage;
mod view;

pub use dtype::{Dtype, Element};
pub use error::WeightsError;
pub use storage::{LoadMode, MmapAck};
pub use view::TensorView;

use storage::{OwnedBytes, Storage};

/// Largest JSON header accepted, in bytes: the safetensors crate's own limit (100 MB).
///
/// Checked before the header is read, so that a file the crate refuses for its size is
/// refused here too, with an error naming the file and the length.
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// Alignment, in bytes, of the start of every owned buffer ([`LoadMode::Copy`],
/// [`Weights::from_tensors`], [`Weights::to_owned_copy`]).
///
/// A mapped file starts on a page boundary, which is at least as strict.
pub const OWNED_ALIGN: usize = 64;

/// One tensor's description and where its bytes are.
#[derive(Clone, Debug)]
struct Entry {
    name: String,
    dtype: Dtype,
    /// Its product times the dtype size is `range.len()`.
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
        let storage = Storage::load(path, mode)?;
        let entries = header::parse_file(storage.bytes(), path)?;
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
        TensorView::new(
            self.inner.path.as_deref(),
            self.inner.file_image,
            entry,
            all.get(entry.range.clone()).unwrap_or_default(),
        )
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
