//! Plans that outlive the process: a model's [`Plans`] loaded from a plan
//! store when they are made ([`Plans::with_store`]) and saved back to it
//! off the runs' threads ([`Plans::save`], [`PlanSaver`]), so that a new
//! replica of a server is planned from its first request.

use crate::plans::{Plans, Stored};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;
use tensor_arena::plan::store::{Saved, StoreError};
use tensor_arena::{ModelKey, PlanStore};

impl Plans {
    /// Plans for up to `capacity` shapes that start from `store`: its
    /// plans and families are loaded now (a file that cannot be used is
    /// reported in one line on stderr, and the plans start empty), and
    /// [`Plans::save`] (or a [`PlanSaver`]) writes what the runs learn back
    /// to it, merged with what other replicas saved there.
    ///
    /// Build the store's key with [`model_key`]: the model's bytes, ONNX
    /// Runtime's version and the session options that change the order
    /// of allocations.
    pub fn with_store(capacity: usize, store: PlanStore) -> Self {
        let mut plans = Plans::new(capacity);
        let loaded = store.load(plans.cache());
        if let Some(w) = &loaded.warning {
            eprintln!("tensor-arena-ort: {w}");
        }
        let saved = AtomicU64::new(plans.cache().stats().inserts);
        plans.store = Some(Stored { store, saved });
        plans
    }

    /// The store the plans were loaded from, if any.
    pub fn plan_store(&self) -> Option<&PlanStore> {
        self.store.as_ref().map(|s| &s.store)
    }

    /// Saves the plans to their store (merged with what the file holds)
    /// if anything was learned since the last load or save, or, when
    /// nothing was, if the file changed since this process wrote it and
    /// lacks some of its plans (another process's save replaced it
    /// without them: [`PlanStore::save_missing`]). `None` with no store,
    /// or nothing to write.
    ///
    /// Reads, merges and writes the whole file: call it off the runs'
    /// threads ([`PlanSaver`] does).
    pub fn save(&self) -> Option<Result<Saved, StoreError>> {
        let stored = self.store.as_ref()?;
        let _section = crate::learn::section();
        let now = self.cache().stats().inserts;
        let learned = stored.saved.swap(now, Ordering::Relaxed) != now;
        let result = if learned {
            stored.store.save(self.cache()).map(Some)
        } else if now > 0 && stored.store.changed() {
            stored.store.save_missing(self.cache())
        } else {
            return None;
        };
        match result {
            Ok(saved) => saved.map(Ok),
            Err(e) => {
                // Try again next time.
                stored.saved.store(u64::MAX, Ordering::Relaxed);
                Some(Err(e))
            }
        }
    }
}

/// The key of a model's plan store for ONNX Runtime: the model's bytes
/// (hashed), ONNX Runtime's version (e.g. [`Runtime::version`](crate::Runtime::version)
/// with `load-dynamic`), and `options`: the session options that change
/// the order or sizes of allocations, as text (for instance
/// `"intra_threads=4 opt=all mode=sequential ep=cpu"`; leave out options
/// that change no allocation, so that they do not split the store).
pub fn model_key(model: &[u8], runtime_version: &str, options: &str) -> ModelKey {
    ModelKey::new(model, format!("onnxruntime {runtime_version}"), options)
}

/// A thread that saves plans every so often, off the runs' threads, and
/// once more when it is dropped (or [`PlanSaver::stop`]ped): what a server
/// starts beside its sessions so that a replica started later, or after a
/// restart, begins from what this one learned.
///
/// ```no_run
/// # use std::sync::Arc;
/// # use std::time::Duration;
/// # use tensor_arena_ort::{model_key, PlanSaver, PlanStore, Plans};
/// let key = model_key(&std::fs::read("model.onnx")?, "1.22.0", "intra_threads=1");
/// let plans = Arc::new(Plans::with_store(64, PlanStore::new("/var/cache/plans", key)));
/// let saver = PlanSaver::start(Duration::from_secs(30), {
///     let plans = Arc::clone(&plans);
///     move || {
///         if let Some(Err(e)) = plans.save() {
///             eprintln!("plans not saved: {e}");
///         }
///     }
/// })?;
/// // ... serve with `&plans` ...
/// saver.stop(); // saves once more
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct PlanSaver {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl PlanSaver {
    /// Starts a thread (named `tensor-arena-plan-saver`) that calls `save`
    /// about every `every` (each wait drawn between 3/4 and 5/4 of it, so
    /// that workers started together do not save at the same moments),
    /// and once more when the saver stops.
    ///
    /// # Errors
    /// If the thread cannot be started.
    pub fn start(
        every: Duration,
        mut save: impl FnMut() + Send + 'static,
    ) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("tensor-arena-plan-saver".into())
            .spawn(move || loop {
                match rx.recv_timeout(jittered(every)) {
                    Err(mpsc::RecvTimeoutError::Timeout) => save(),
                    _ => {
                        save();
                        return;
                    }
                }
            })?;
        Ok(Self {
            stop: Some(tx),
            thread: Some(thread),
        })
    }

    /// Stops the thread after one last save, and waits for it.
    pub fn stop(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `every` times a factor between 3/4 and 5/4, drawn from the clock and
/// the process id (no random source needed: it only has to differ
/// between processes and between waits).
fn jittered(every: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64);
    let mut x = nanos ^ (u64::from(std::process::id()) << 32);
    // splitmix64's finaliser.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    let unit = (x >> 11) as f64 / (1u64 << 53) as f64;
    every.mul_f64(0.75 + 0.5 * unit)
}

impl Drop for PlanSaver {
    /// As [`PlanSaver::stop`].
    fn drop(&mut self) {
        self.finish();
    }
}
