//! Reading a store's file, and writing one atomically: a temporary file
//! in the same directory, written, flushed to disk, then renamed over the
//! old one, so that a reader (another replica) sees the old file or the
//! new one, never a torn one.
//!
//! Only regular files are read or replaced. The file is opened without
//! following a symbolic link and without blocking (a FIFO would block a
//! plain open for good), then `fstat`ed: a link, a FIFO, a device, a
//! directory or a socket is refused in one line. The size limit is the
//! opened file's own (`fstat`), and the read stops one byte past it,
//! whatever the file claims.
//!
//! Saves of one store take an advisory lock ([`lock`]: `flock` on a file
//! beside it) around their read, merge and rename, so that replicas
//! saving at once each merge the last one's file.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The largest store file read (a bigger one is refused unread).
pub(crate) const MAX_FILE: u64 = 1 << 30;

/// How long a save waits for another process's lock before it gives up
/// (that save fails; the next one tries again).
const LOCK_WAIT: Duration = Duration::from_secs(10);

/// Why a file at a store's path is not read.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// Not a regular file (a link, FIFO, device, directory, socket): never
    /// read, never written through, never replaced.
    NotRegular(String),
    /// Over [`MAX_FILE`]: not read (a save replaces it).
    TooLarge(u64),
    /// Reading failed.
    Io(io::Error),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::NotRegular(what) => write!(f, "{what}, not a regular file: refused"),
            ReadError::TooLarge(len) => {
                write!(f, "{len} bytes, over the {MAX_FILE} a store may have")
            }
            ReadError::Io(e) => write!(f, "{e}"),
        }
    }
}

/// The identity of a file as written: device, inode, length and change
/// time. A file replaced or rewritten since has another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    ctime: (i64, i64),
}

#[cfg(unix)]
fn stamp_of(m: &fs::Metadata) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    Stamp {
        dev: m.dev(),
        ino: m.ino(),
        len: m.len(),
        ctime: (m.ctime(), m.ctime_nsec()),
    }
}

#[cfg(not(unix))]
fn stamp_of(m: &fs::Metadata) -> Stamp {
    let t = m
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .unwrap_or_default();
    Stamp {
        dev: 0,
        ino: 0,
        len: m.len(),
        ctime: (t.as_secs() as i64, i64::from(t.subsec_nanos())),
    }
}

/// The stamp of the file at `path` now (not following a link), if any.
pub(crate) fn stamp(path: &Path) -> Option<Stamp> {
    fs::symlink_metadata(path).ok().map(|m| stamp_of(&m))
}

/// Opens `path` for reading without following a final symbolic link and
/// without blocking; `None` if there is no such file.
fn open_regular(path: &Path) -> Result<Option<File>, ReadError> {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(target_os = "linux")]
    {
        use rustix::fs::OFlags;
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags((OFlags::NOFOLLOW | OFlags::NONBLOCK).bits() as i32);
    }
    let f = match options.open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        // ELOOP: the path is a symbolic link (O_NOFOLLOW).
        #[cfg(target_os = "linux")]
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => {
            return Err(ReadError::NotRegular("a symbolic link".into()))
        }
        Err(e) => {
            // Elsewhere than Linux, say what the path is if it is no file.
            return match fs::symlink_metadata(path) {
                Ok(m) if !m.is_file() => Err(ReadError::NotRegular(kind(&m))),
                _ => Err(ReadError::Io(e)),
            };
        }
    };
    let meta = f.metadata().map_err(ReadError::Io)?;
    if !meta.is_file() {
        return Err(ReadError::NotRegular(kind(&meta)));
    }
    #[cfg(not(target_os = "linux"))]
    if fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(ReadError::NotRegular("a symbolic link".into()));
    }
    Ok(Some(f))
}

/// What a file that is not regular is, in words.
fn kind(m: &fs::Metadata) -> String {
    let t = m.file_type();
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO".into();
        }
        if t.is_char_device() || t.is_block_device() {
            return "a device".into();
        }
        if t.is_socket() {
            return "a socket".into();
        }
    }
    if t.is_dir() {
        "a directory".into()
    } else if t.is_symlink() {
        "a symbolic link".into()
    } else {
        "not a file".into()
    }
}

/// The bytes of `path` (at most [`MAX_FILE`]), or `None` if there is no
/// such file. Never blocks on what the path is, never reads more than
/// the limit and one byte.
pub(crate) fn read(path: &Path) -> Result<Option<Vec<u8>>, ReadError> {
    let Some(f) = open_regular(path)? else {
        return Ok(None);
    };
    let len = f.metadata().map_err(ReadError::Io)?.len();
    if len > MAX_FILE {
        return Err(ReadError::TooLarge(len));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    // A file that grew meanwhile is read no further than the limit.
    f.take(MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(ReadError::Io)?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(ReadError::TooLarge(bytes.len() as u64));
    }
    Ok(Some(bytes))
}

/// Whether what is at `path` may be replaced by a save: nothing, or a
/// regular file. Anything else is never written through nor replaced.
pub(crate) fn replaceable(path: &Path) -> Result<(), ReadError> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(m) => Err(ReadError::NotRegular(kind(&m))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(ReadError::Io(e)),
    }
}

/// The lock file of the store at `path`: `.<name>.lock` beside it.
fn lock_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.lock"))
}

/// An advisory lock on a store's saves, held until dropped (closing the
/// file lets it go; where the file system has no locks it holds none,
/// and the save goes on unlocked).
pub(crate) struct SaveLock {
    _file: File,
}

/// Takes the save lock of the store at `path` (`flock`, exclusive, on its
/// lock file), waiting up to [`LOCK_WAIT`] for another process's save.
///
/// # Errors
/// The lock file cannot be made or is not a regular file, or another
/// process held the lock for all of [`LOCK_WAIT`].
pub(crate) fn lock(path: &Path) -> io::Result<SaveLock> {
    let lock = lock_path(path);
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(target_os = "linux")]
    {
        use rustix::fs::OFlags;
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags((OFlags::NOFOLLOW | OFlags::NONBLOCK).bits() as i32);
    }
    let f = options
        .open(&lock)
        .map_err(|e| io::Error::new(e.kind(), format!("lock file {}: {e}", lock.display())))?;
    if !f.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("lock file {}: not a regular file", lock.display()),
        ));
    }
    #[cfg(target_os = "linux")]
    {
        use rustix::fs::{flock, FlockOperation};
        let start = Instant::now();
        let mut pause = Duration::from_micros(200);
        loop {
            match flock(&f, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => return Ok(SaveLock { _file: f }),
                Err(rustix::io::Errno::WOULDBLOCK) | Err(rustix::io::Errno::INTR) => {}
                // No locks on this file system (some network ones):
                // saves go on unlocked (docs/decisions.md says what then).
                Err(_) => return Ok(SaveLock { _file: f }),
            }
            if start.elapsed() >= LOCK_WAIT {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "another process held {} for {} s; not saved this time",
                        lock.display(),
                        LOCK_WAIT.as_secs()
                    ),
                ));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = Instant::now();
        Ok(SaveLock { _file: f })
    }
}

static NEXT_TEMP: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` to `path` atomically: a new temporary file beside it,
/// flushed to disk, renamed over `path`, and the directory flushed too.
/// The temporary file is removed if anything fails. Returns the new
/// file's [`Stamp`].
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<Stamp> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a store path with no name"))?;
    let temp = dir.join(format!(
        ".{}.{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        NEXT_TEMP.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        let stamp = stamp_of(&f.metadata()?);
        fs::rename(&temp, path)?;
        Ok(stamp)
    })();
    let Ok(stamp) = written else {
        let _ = fs::remove_file(&temp);
        return written;
    };
    // The rename itself reaches the disk when the directory is flushed
    // (where a directory can be opened and flushed; elsewhere the rename
    // is still atomic for readers).
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    // The rename changes the file's change time on some file systems:
    // the stamp is the file's as it lies now.
    Ok(self::stamp(path).unwrap_or(stamp))
}
