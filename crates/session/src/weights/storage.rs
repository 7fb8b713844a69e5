//! Where the bytes of a [`Weights`](super::Weights) live: [`LoadMode`] and its [`MmapAck`],
//! [`Storage`] (a read-only map or an owned, 64-byte aligned copy), and the file I/O.
//!
//! This module holds the crate's only `unsafe`: the declaration of [`MmapAck::new`], which
//! passes the mapping contract to the caller, and the `Mmap::map` call it licenses.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use bytemuck::{Pod, Zeroable};
use memmap2::Mmap;

use super::{WeightsError, OWNED_ALIGN};

/// How [`Weights::open`](super::Weights::open) brings a file's bytes into memory.
///
/// [`LoadMode::Copy`] is the default and needs no promise. [`LoadMode::Mmap`] carries an
/// [`MmapAck`], which only `unsafe` code can make: the caller promises not to modify the file
/// in place while it is mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LoadMode {
    /// Map the file read-only (memmap2). Loading is cheap and pages are shared with the page
    /// cache, but the file must not be written or truncated in place while the map is alive:
    /// see [`MmapAck::new`] and the crate docs, "Files under mmap: what is safe".
    Mmap(MmapAck),
    /// Read the whole file into owned memory aligned to [`OWNED_ALIGN`] bytes. The file is
    /// closed before [`Weights::open`](super::Weights::open) returns and may then be deleted,
    /// replaced or rewritten.
    #[default]
    Copy,
}

/// The caller's acknowledgement that a file loaded with [`LoadMode::Mmap`] is not modified in
/// place while it is mapped; made only by the `unsafe` [`MmapAck::new`], as memmap2's
/// `Mmap::map` is `unsafe` for the same reason.
///
/// Safe code cannot make one, so safe code cannot map a file:
///
/// ```compile_fail,E0133
/// use tensor_session::{LoadMode, MmapAck, Weights};
/// let _ = Weights::open("model.safetensors", LoadMode::Mmap(MmapAck::new()));
/// ```
///
/// ```compile_fail,E0451
/// let _ = tensor_session::MmapAck { _private: () };
/// ```
///
/// ```compile_fail,E0308
/// use tensor_session::{LoadMode, Weights};
/// let _ = Weights::open("model.safetensors", LoadMode::Mmap);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MmapAck {
    _private: (),
}

impl MmapAck {
    /// Acknowledges the contract of mapped weights.
    ///
    /// ```
    /// use tensor_session::{LoadMode, MmapAck, Weights};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let path = std::env::temp_dir().join(format!("ack-{}.safetensors", std::process::id()));
    /// std::fs::write(&path, b"\x02\x00\x00\x00\x00\x00\x00\x00{}")?;
    /// // SAFETY: this process wrote the file above and nobody else knows its name; it is
    /// // only removed (which is allowed) while mapped.
    /// let mode = LoadMode::Mmap(unsafe { MmapAck::new() });
    /// let weights = Weights::open(&path, mode)?;
    /// std::fs::remove_file(&path)?;
    /// assert!(weights.is_mapped() && weights.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Safety
    /// The acknowledgement and its copies are a promise about every file loaded with them:
    /// from the call to [`Weights::open`](super::Weights::open) until the last clone of the
    /// returned [`Weights`](super::Weights) drops, **no process**
    /// - writes into the file in place (`pwrite`, a write through a descriptor opened
    ///   without `O_TRUNC`, `dd conv=notrunc`, a writable shared map of it): the bytes behind
    ///   the `&[u8]` and `&[T]` views would change, a data race and undefined behaviour;
    /// - truncates or shrinks it (`set_len`, `truncate`, anything opening it with `O_TRUNC`:
    ///   `>` redirection, `cp` onto it, editors saving in place): a read of a page past the
    ///   new end raises `SIGBUS`, which kills the process.
    ///
    /// These are fine while mapped: deleting the file, renaming it, replacing it by renaming
    /// another file over it (the map keeps the old inode and its bytes), appending to it (the
    /// map keeps its length), reading or mapping it again. When the promise cannot be kept
    /// (shared volumes, files other programs rewrite), use [`LoadMode::Copy`].
    #[allow(unsafe_code)]
    pub const unsafe fn new() -> MmapAck {
        MmapAck { _private: () }
    }
}

/// One 64-byte, 64-aligned unit of an owned buffer.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C, align(64))]
struct Chunk([u8; OWNED_ALIGN]);

const _: () = assert!(std::mem::size_of::<Chunk>() == OWNED_ALIGN);
const _: () = assert!(std::mem::align_of::<Chunk>() == OWNED_ALIGN);

/// Owned bytes whose first byte is aligned to [`OWNED_ALIGN`].
pub(super) struct OwnedBytes {
    /// Backing memory; the tail of the last chunk past `len` is zero.
    chunks: Vec<Chunk>,
    /// Number of meaningful bytes; always `<= chunks.len() * OWNED_ALIGN`.
    len: usize,
}

impl OwnedBytes {
    /// A zeroed buffer of `len` bytes, or `None` if the memory cannot be had.
    pub(super) fn try_zeroed(len: usize) -> Option<OwnedBytes> {
        let n = len.div_ceil(OWNED_ALIGN);
        let mut chunks = Vec::new();
        chunks.try_reserve_exact(n).ok()?;
        chunks.resize(n, Chunk::zeroed());
        Some(OwnedBytes { chunks, len })
    }

    pub(super) fn as_bytes(&self) -> &[u8] {
        let all: &[u8] = bytemuck::cast_slice(&self.chunks);
        // `len <= all.len()` by the field invariant; `get` keeps this panic-free regardless.
        all.get(..self.len).unwrap_or(all)
    }

    pub(super) fn as_bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        let all: &mut [u8] = bytemuck::cast_slice_mut(&mut self.chunks);
        let all_len = all.len();
        &mut all[..len.min(all_len)]
    }
}

/// The bytes behind a [`Weights`](super::Weights): a read-only map of the file, or an owned
/// buffer.
pub(super) enum Storage {
    /// The whole file, mapped read-only. Keeps the file's inode alive until dropped. Sound
    /// because an [`MmapAck`] was given for it (see [`MmapAck::new`]).
    Mapped(Mmap),
    /// An owned, aligned copy (of the whole file, or of packed tensors).
    Owned(OwnedBytes),
}

impl Storage {
    /// Gets the bytes of the file at `path` as `mode` says.
    pub(super) fn load(path: &Path, mode: LoadMode) -> Result<Storage, WeightsError> {
        Ok(match mode {
            LoadMode::Mmap(ack) => Storage::Mapped(map_read_only(path, ack)?),
            LoadMode::Copy => Storage::Owned(read_to_owned(path)?),
        })
    }

    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(map) => map,
            Storage::Owned(owned) => owned.as_bytes(),
        }
    }
}

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
fn map_read_only(path: &Path, _ack: MmapAck) -> Result<Mmap, WeightsError> {
    let (file, _len) = open_file(path)?;
    // SAFETY: `Mmap::map` is sound while the file is not modified in place or truncated for
    // as long as the map lives. The caller promised exactly that for this file when it made
    // `_ack` with the `unsafe` `MmapAck::new` (its `# Safety` lists what is and is not
    // allowed); the map is read-only, so this process never writes through it.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_bytes_are_aligned() {
        for len in [0, 1, 63, 64, 65, 1000] {
            let b = OwnedBytes::try_zeroed(len).unwrap();
            assert_eq!(b.as_bytes().len(), len);
            assert_eq!(b.as_bytes().as_ptr() as usize % OWNED_ALIGN, 0);
        }
    }

    #[test]
    fn copy_is_the_default_mode() {
        assert_eq!(LoadMode::default(), LoadMode::Copy);
    }
}
