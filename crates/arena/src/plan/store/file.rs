//! Reading a store's file, and writing one atomically: a temporary file
//! in the same directory, written, flushed to disk, then renamed over the
//! old one, so that a reader (another replica) sees the old file or the
//! new one, never a torn one.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// The largest store file read (a bigger one is refused unread).
pub(crate) const MAX_FILE: u64 = 1 << 30;

/// The bytes of `path`, or `None` if there is no such file.
pub(crate) fn read(path: &Path) -> io::Result<Option<Vec<u8>>> {
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len();
    if len > MAX_FILE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{len} bytes, over the {MAX_FILE} a store may have"),
        ));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    // A file that grew meanwhile is read no further than the limit.
    f.take(MAX_FILE).read_to_end(&mut bytes)?;
    Ok(Some(bytes))
}

static NEXT_TEMP: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` to `path` atomically: a new temporary file beside it,
/// flushed to disk, renamed over `path`, and the directory flushed too.
/// The temporary file is removed if anything fails.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
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
        fs::rename(&temp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&temp);
        return written;
    }
    // The rename itself reaches the disk when the directory is flushed
    // (where a directory can be opened and flushed; elsewhere the rename
    // is still atomic for readers).
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}
