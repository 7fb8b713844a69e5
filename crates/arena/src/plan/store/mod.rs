//! Plans that outlive the process: a model's plans and families saved to
//! a file and loaded, as untrusted input, by the next process or another
//! replica, so that it is planned from its first request ([`PlanStore`]).
//!
//! # What is stored
//! - Every exact plan of the [`PlanCache`], by key (written through
//!   [`PlanKey`]), with its recording and offsets.
//! - Every family's structures (events and alignments) and the shapes each
//!   was seen at (dimensions, each block's size, lower bound): the
//!   family's recordings, not its fits. Loading adds each shape as a run
//!   would, and the fits are made later by the same code as any process's
//!   (by the cache's learner, or by a family's first prediction), so a
//!   change to how families fit needs no new format, and a load costs no
//!   fit (a fit costs far more than the bytes that describe it).
//!
//! # The file
//! One file per model key (model, runtime, options),
//! `<model hash>-<runtime and options hash>.plans` in a directory the
//! program names ([`ModelKey::file_name`]). A versioned header (magic, format
//! version), a checksum of the body, and the body: the [`ModelKey`], then
//! the plans and the families ([`FORMAT_VERSION`]; the layout is on the
//! private `format` module). Written atomically: a temporary file in the
//! same directory, flushed, renamed over the old.
//!
//! # Loading is untrusted
//! A file that is empty, truncated, not a store, of another format
//! version, fails its checksum, is another model's (or runtime's, or
//! options'), or holds anything a run could not have made (every plan
//! passes [`Plan::validate`], every shape's recording
//! [`Recording::validate`](crate::Recording::validate), with its lower
//! bound its own) is refused whole: [`PlanStore::load`] adds nothing and
//! returns one line saying why ([`Loaded::warning`]). What passes can make
//! at worst a wrong prediction, and a plan that does not fit its run falls
//! back as any plan does.
//!
//! # Many replicas, one store
//! [`PlanStore::save`] reads the file first and merges what it holds with
//! what this process learned (by key and by family; conflicts keep this
//! process's side: the private `merge` module says how), then writes the
//! union atomically, all under an advisory lock (`flock` on a lock file
//! beside the store), so that replicas saving at the same moment each
//! merge the last one's file. Where the file system has no locks, the
//! later rename wins; [`PlanStore::save_missing`] (a later save) finds
//! this process's plans missing and saves them again.
//!
//! # Only regular files
//! The store's path is opened without following a symbolic link and
//! without blocking, and read only if it is a regular file (a FIFO, a
//! device, a directory or a link is refused in one line, and never
//! written through nor replaced by a save), at most
//! [`MAX_FILE_BYTES`] of it.

mod check;
mod file;
mod format;
mod key;
mod merge;
mod snapshot;
#[cfg(test)]
mod tests;

pub use format::{FORMAT_VERSION, OLDEST_VERSION};
pub use key::{decode_dims, encode_dims, ModelKey, PlanKey};
pub use snapshot::{FamilySnapshot, ShapeSnapshot, StructureSnapshot};

use super::{KeyDims, Plan, PlanCache, PlanError};
use parking_lot::Mutex;
use std::hash::Hash;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The largest store file read: a bigger one is refused unread (and
/// replaced by the next save).
pub const MAX_FILE_BYTES: u64 = file::MAX_FILE;

/// The most dimensions a stored shape may have.
pub(crate) const MAX_DIMS: usize = 1024;

/// A model's plan store: the file `dir/<model hash>-<key hash>.plans`
/// ([`ModelKey::file_name`]).
#[derive(Clone, Debug)]
pub struct PlanStore {
    dir: PathBuf,
    key: ModelKey,
    /// The file as this store (or a clone) last wrote it.
    written: Arc<Mutex<Option<file::Stamp>>>,
    /// The largest alignment the arenas the plans are loaded for can draw
    /// ([`PlanStore::with_max_align`]).
    max_align: usize,
}

/// What [`PlanStore::load`] added to the cache.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Loaded {
    /// Exact plans added.
    pub plans: usize,
    /// Families added.
    pub families: usize,
    /// Shapes added to them.
    pub shapes: usize,
    /// Why the file (or its families) was not loaded, in one line; `None`
    /// when it was, or when there was no file.
    pub warning: Option<String>,
}

/// What [`PlanStore::save`] wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Saved {
    /// Exact plans in the file.
    pub plans: usize,
    /// Of those, plans only the file had before (another replica's).
    pub merged_plans: usize,
    /// Families in the file.
    pub families: usize,
    /// Bytes of the file.
    pub bytes: usize,
}

/// Why a store file was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreError {
    /// The file is empty.
    Empty,
    /// The file ends before its header or body does.
    Truncated,
    /// The file is not a plan store.
    Foreign,
    /// The file is of another format version.
    Version(u32),
    /// The body is not what its header's checksum says.
    Checksum,
    /// The body does not follow the format.
    Malformed(String),
    /// A plan or shape a run could not have made (overlapping offsets, a
    /// block freed twice...).
    Invalid(PlanError),
    /// The file is not this model's (or runtime's, options', key kind's).
    Mismatch(String),
    /// Reading or writing the file failed.
    Io(String),
}

impl StoreError {
    pub(crate) fn malformed(why: impl Into<String>) -> Self {
        StoreError::Malformed(why.into())
    }
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Empty => write!(f, "the file is empty"),
            StoreError::Truncated => write!(f, "the file is truncated"),
            StoreError::Foreign => write!(f, "the file is not a plan store"),
            StoreError::Version(v) => write!(
                f,
                "the file is of format version {v}; this build reads {OLDEST_VERSION} to \
                 {FORMAT_VERSION}"
            ),
            StoreError::Checksum => write!(f, "the file fails its checksum (corrupt)"),
            StoreError::Malformed(why) => write!(f, "the file is malformed: {why}"),
            StoreError::Invalid(e) => write!(f, "the file holds {e}"),
            StoreError::Mismatch(why) => write!(f, "{why}"),
            StoreError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for StoreError {}

/// A store file's contents, checked ([`read`]): for tools that show it.
#[derive(Clone, Debug)]
pub struct StoreContents<K> {
    /// Whose plans they are.
    pub key: ModelKey,
    /// The exact plans by key, least recently used first.
    pub plans: Vec<(K, Plan)>,
    /// The families, least recently used first.
    pub families: Vec<FamilySnapshot>,
}

/// Reads and checks the store file `path` (everything [`PlanStore::load`]
/// checks but the model's key).
///
/// # Errors
/// [`StoreError`] saying why the file is refused.
pub fn read<K: PlanKey>(path: &Path) -> Result<StoreContents<K>, StoreError> {
    let bytes = file::read(path)
        .map_err(|e| StoreError::Io(format!("{}: {e}", path.display())))?
        .ok_or_else(|| StoreError::Io(format!("{}: no such file", path.display())))?;
    decode::<K>(&bytes).map(|(c, _)| c)
}

/// Decodes a store file's bytes: its contents, and whether its family ids
/// are this build's.
pub fn decode<K: PlanKey>(bytes: &[u8]) -> Result<(StoreContents<K>, bool), StoreError> {
    let body = format::decode(bytes)?;
    if body.kind != K::KIND {
        return Err(StoreError::Mismatch(format!(
            "its keys are of kind {:?}, not {:?}",
            body.kind,
            K::KIND
        )));
    }
    let plans = body
        .plans
        .into_iter()
        .map(|(k, p)| match K::decode(&k) {
            Some(k) => Ok((k, p)),
            None => Err(StoreError::malformed("a key its kind cannot read")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let contents = StoreContents {
        key: body.key,
        plans,
        families: merge::bound(body.families),
    };
    Ok((contents, body.probe == family_probe()))
}

/// The checksum a store file's header holds over its body (the bytes
/// after the 32-byte header; for tools that write or repair files).
pub fn checksum(body: &[u8]) -> u64 {
    check::hash64(body)
}

/// A store file of `body` under a header of this format version, with
/// the body's checksum (for tools and fuzzing: the body is checked as any
/// file's when it is loaded).
pub fn seal(body: &[u8]) -> Vec<u8> {
    let mut file = Vec::with_capacity(format::HEADER + body.len());
    file.extend_from_slice(&format::MAGIC);
    file.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    file.extend_from_slice(&[0; 4]);
    file.extend_from_slice(&(body.len() as u64).to_le_bytes());
    file.extend_from_slice(&checksum(body).to_le_bytes());
    file.extend_from_slice(body);
    file
}

/// How this build hashes family ids ([`KeyDims::family`] of fixed keys):
/// saved families are keyed by id, so a file from a build that hashes
/// otherwise keeps its plans and drops its families.
fn family_probe() -> u64 {
    <[usize] as KeyDims>::family(&[1, 2, 3][..])
        ^ <[u8] as KeyDims>::family(&b"1x2"[..]).rotate_left(17)
}

impl PlanStore {
    /// The store of the model keyed `key` in directory `dir` (made by
    /// [`PlanStore::save`] if missing).
    pub fn new(dir: impl Into<PathBuf>, key: ModelKey) -> Self {
        Self {
            dir: dir.into(),
            key,
            written: Arc::default(),
            max_align: crate::ArenaConfig::default().max_align,
        }
    }

    /// The same store, for arenas that draw alignments up to `align`
    /// ([`ArenaConfig::max_align`](crate::ArenaConfig::max_align); the
    /// default config's, 4096, unless set): a stored plan (or family
    /// structure) that needs more is left out at load, with a warning, and
    /// its key is learned again by its next run. Such a plan was used on
    /// every run, never drawn and never relearned.
    pub fn with_max_align(mut self, align: usize) -> Self {
        self.max_align = align;
        self
    }

    /// The store's file.
    pub fn path(&self) -> PathBuf {
        self.dir.join(self.key.file_name())
    }

    /// The model's key.
    pub fn key(&self) -> &ModelKey {
        &self.key
    }

    /// Adds the store's plans and families to `cache`: the plans in one
    /// step, the families' shapes as runs would add them, each structure
    /// owing its fit (made by [`PlanCache::learn`] with deferred learning,
    /// else by the family's first prediction in [`PlanCache::lookup`]).
    /// Time and heap follow the file's size (at most 3 times it at once,
    /// the file included). A missing file adds nothing, quietly; a file refused
    /// adds nothing and says why in [`Loaded::warning`]. Never fails and
    /// never panics on any file.
    pub fn load<K>(&self, cache: &PlanCache<K>) -> Loaded
    where
        K: PlanKey + Hash + Eq + Clone,
    {
        let path = self.path();
        match file::read(&path) {
            Ok(Some(bytes)) => {
                let decoded = decode::<K>(&bytes);
                // The file is let go before its plans join the cache.
                drop(bytes);
                self.install(decoded, cache)
            }
            Ok(None) => Loaded::default(),
            Err(e) => self.refused(e.to_string()),
        }
    }

    /// A load that adds nothing, with one warning naming the store and why.
    fn refused(&self, why: String) -> Loaded {
        Loaded {
            warning: Some(format!(
                "plan store {}: {why}; starting with no saved plans",
                self.path().display()
            )),
            ..Loaded::default()
        }
    }

    /// [`PlanStore::load`] of a file's bytes already read (for tools and
    /// fuzzing; warnings name the store's path all the same).
    pub fn load_bytes<K>(&self, bytes: &[u8], cache: &PlanCache<K>) -> Loaded
    where
        K: PlanKey + Hash + Eq + Clone,
    {
        self.install(decode::<K>(bytes), cache)
    }

    /// Adds a decoded file's contents to `cache` ([`PlanStore::load`]).
    fn install<K>(
        &self,
        decoded: Result<(StoreContents<K>, bool), StoreError>,
        cache: &PlanCache<K>,
    ) -> Loaded
    where
        K: PlanKey + Hash + Eq + Clone,
    {
        let (contents, ids_match) = match decoded {
            Ok(c) => c,
            Err(e) => return self.refused(e.to_string()),
        };
        if let Some(why) = self.key.mismatch(&contents.key) {
            return self.refused(why);
        }
        let mut loaded = Loaded {
            plans: contents.plans.len(),
            ..Loaded::default()
        };
        let max_align = self.max_align;
        let plans_before = contents.plans.len();
        let mut contents = contents;
        contents.plans.retain(|(_, p)| p.align() <= max_align);
        let mut structures_out = 0;
        for f in &mut contents.families {
            let before = f.structures.len();
            f.structures
                .retain(|s| s.aligns.iter().all(|&a| a <= max_align));
            structures_out += before - f.structures.len();
        }
        contents.families.retain(|f| !f.structures.is_empty());
        let plans_out = plans_before - contents.plans.len();
        loaded.plans = contents.plans.len();
        if plans_out + structures_out > 0 {
            loaded.warning = Some(format!(
                "plan store {}: {plans_out} plans and {structures_out} family structures need \
                 an alignment over the arena's {max_align}: left out, learned again",
                self.path().display()
            ));
        }
        let families = if ids_match {
            contents.families
        } else {
            loaded.warning = Some(format!(
                "plan store {}: its families were saved by a build that hashes keys \
                 otherwise; loading its exact plans only",
                self.path().display()
            ));
            Vec::new()
        };
        loaded.families = families.len();
        loaded.shapes = families
            .iter()
            .flat_map(|f| &f.structures)
            .map(|s| s.shapes.len())
            .sum();
        let plans = contents
            .plans
            .into_iter()
            .map(|(k, p)| (k, Arc::new(p)))
            .collect();
        cache.restore(plans, families);
        loaded
    }

    /// Saves `cache`'s plans and families, merged with what the file
    /// already holds (another replica's, or an earlier run's; a file that
    /// is refused, or another model's, is replaced), atomically. At most
    /// the cache's capacity of plans is kept, the most recent.
    ///
    /// Saves of one store take its lock (`flock` on `.<file>.lock` beside
    /// it) around the read, the merge and the rename, so that replicas
    /// saving at once each merge the file the last one wrote. Where the
    /// file system has no locks the save goes on unlocked (a concurrent
    /// save may then replace this one's file: [`PlanStore::save_missing`]
    /// finds that and saves again).
    ///
    /// Costs a read, a merge and a write of the whole file: call it off
    /// the runs' threads.
    ///
    /// # Errors
    /// [`StoreError::Io`] if the directory or the file cannot be written,
    /// the store's path is not a regular file (a link, FIFO, device,
    /// directory: never written through nor replaced), or another
    /// process held the lock for 10 s.
    pub fn save<K>(&self, cache: &PlanCache<K>) -> Result<Saved, StoreError>
    where
        K: PlanKey + Hash + Eq + Clone,
    {
        self.save_with(cache, false)
            .map(|s| s.expect("an unconditional save writes"))
    }

    /// [`PlanStore::save`] if the file lacks any of `cache`'s plans (by
    /// key) or families' shapes (by dimensions) that it has room for:
    /// after another process replaced it without this one's (a save
    /// without a lock), or left them out. `Ok(None)` when the file holds
    /// them all (nothing is written).
    ///
    /// # Errors
    /// As [`PlanStore::save`].
    pub fn save_missing<K>(&self, cache: &PlanCache<K>) -> Result<Option<Saved>, StoreError>
    where
        K: PlanKey + Hash + Eq + Clone,
    {
        self.save_with(cache, true)
    }

    /// Whether the file is not the one this store last wrote (another
    /// process wrote since, or it is gone); `true` before any save.
    pub fn changed(&self) -> bool {
        let path = self.path();
        let now = file::stamp(&path);
        now.is_none() || *self.written.lock() != now
    }

    fn save_with<K>(
        &self,
        cache: &PlanCache<K>,
        only_missing: bool,
    ) -> Result<Option<Saved>, StoreError>
    where
        K: PlanKey + Hash + Eq + Clone,
    {
        let path = self.path();
        let io = |e: std::io::Error| StoreError::Io(format!("{}: {e}", path.display()));
        let refused =
            |e: file::ReadError| StoreError::Io(format!("{}: {e}; not saved", path.display()));
        let (plans, families) = cache.snapshot();
        let ours: Vec<(Vec<u8>, Arc<Plan>)> = plans
            .into_iter()
            .map(|(k, p)| {
                let mut b = Vec::new();
                k.encode(&mut b);
                (b, p)
            })
            .collect();
        std::fs::create_dir_all(&self.dir).map_err(io)?;
        file::replaceable(&path).map_err(refused)?;
        let _lock = file::lock(&path).map_err(io)?;
        // A key this process holds keeps this process's plan: the file's
        // is read past, not built (a save costs what the file's other
        // plans need, not twice its own).
        let held: std::collections::HashSet<&[u8]> =
            ours.iter().map(|(k, _)| k.as_slice()).collect();
        let skip = |k: &[u8]| !only_missing && held.contains(k);
        let (disk_plans, disk_families) = match file::read(&path) {
            Ok(Some(bytes)) => match format::decode_except(&bytes, &skip) {
                Ok(body)
                    if body.kind == K::KIND
                        && body.probe == family_probe()
                        && self.key.mismatch(&body.key).is_none() =>
                {
                    (body.plans, body.families)
                }
                _ => (Vec::new(), Vec::new()),
            },
            Ok(None) | Err(file::ReadError::TooLarge(_)) => (Vec::new(), Vec::new()),
            Err(e) => return Err(refused(e)),
        };
        if only_missing
            && merge::holds(
                &disk_plans,
                &disk_families,
                &ours,
                &families,
                cache.capacity(),
            )
        {
            *self.written.lock() = file::stamp(&path);
            return Ok(None);
        }
        let mine = ours.len();
        let plans = merge::plans(disk_plans, ours, cache.capacity());
        let families = merge::families(disk_families, families);
        let refs: Vec<(Vec<u8>, &Plan)> = plans.iter().map(|(k, p)| (k.clone(), &**p)).collect();
        let bytes = format::encode(&self.key, K::KIND, family_probe(), &refs, &families);
        let stamp = file::write_atomic(&path, &bytes).map_err(io)?;
        *self.written.lock() = Some(stamp);
        Ok(Some(Saved {
            plans: plans.len(),
            merged_plans: plans.len().saturating_sub(mine),
            families: families.len(),
            bytes: bytes.len(),
        }))
    }
}
