//! A device arena's plans outlive the process: [`DeviceArena::load_plans`]
//! adds a model's plans and families from a plan store
//! ([`tensor_arena::PlanStore`]: one checksummed file per model, loaded as
//! untrusted input) and [`DeviceArena::save_plans`] writes what the runs
//! learned back, so that the next process is planned from its first run.
//!
//! The store's key ([`plan_store_key`]) names the model, the runtime
//! ([`RUNTIME`]) and the setting: the arena's granule and alignment, its
//! driver, and the caller's own options (PyTorch's version, the GPU's
//! name: whatever changes the order or sizes of the model's allocations).
//! A file saved under another key is refused whole with one line saying
//! which part differs; the next save replaces it.
//!
//! The arena keeps one plan cache for every model it serves; a save writes
//! all of it under the model's key (a process that runs one model, as
//! `tools/gpu-check/gpu_check.py`'s children do, saves that model's plans).

use crate::{CudaError, DeviceArena, DEVICE_ALIGN};
use std::path::Path;
use tensor_arena::plan::store::{Loaded, Saved};
use tensor_arena::{ModelKey, PlanStore};

/// The runtime a device arena's stores are keyed by.
pub const RUNTIME: &str = "torch-cuda";

/// The store key of `model` on an arena mapping `granule`-byte granules
/// through `driver`, with the caller's `options` (text; empty for none).
///
/// The C ABI passes the model as text. Where that text names a regular
/// file (the model's weights or its exported program), the key hashes the
/// file's bytes: a model re-exported under the same path keys another
/// store, not the old plans. Otherwise the text itself is hashed: pass a
/// digest of the model's bytes (or anything that changes with them), not
/// a bare name.
pub fn plan_store_key(model: &str, granule: usize, driver: &str, options: &str) -> ModelKey {
    let path = Path::new(model);
    let bytes = match std::fs::metadata(path) {
        Ok(m) if m.is_file() => std::fs::read(path).ok(),
        _ => None,
    };
    let identity = bytes.as_deref().unwrap_or(model.as_bytes());
    let mut setting = format!(
        "granule={granule} align={DEVICE_ALIGN} driver={driver} tensor-arena-cuda={}",
        env!("CARGO_PKG_VERSION")
    );
    if !options.is_empty() {
        setting.push(' ');
        setting.push_str(options);
    }
    ModelKey::new(identity, RUNTIME, setting)
}

impl DeviceArena {
    /// The store of `model`'s plans in directory `dir` for this arena, with
    /// the caller's `options` ([`plan_store_key`]).
    pub fn plan_store(&self, dir: &Path, model: &str, options: &str) -> PlanStore {
        PlanStore::new(
            dir,
            plan_store_key(model, self.granule(), self.driver().name(), options),
        )
    }

    /// Adds the plans and families of `store` to the arena's cache: a key
    /// among them is served from its plan at its first run, a shape never
    /// seen is predicted from its family. A store with no file yet adds
    /// nothing (the first process of a model). A loaded file whose
    /// families this build cannot use keeps its exact plans and says so
    /// in [`Loaded::warning`].
    ///
    /// # Errors
    /// [`CudaError::PlanStore`] when the store's directory is missing or
    /// not a directory, or its file is refused (empty, truncated, corrupt,
    /// another format version, another model's or setting's, a plan a run
    /// could not have made): nothing is added.
    pub fn load_plans(&mut self, store: &PlanStore) -> Result<Loaded, CudaError> {
        let dir = store
            .path()
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        if !dir.is_dir() {
            return Err(CudaError::PlanStore(format!(
                "plan store directory {} does not exist or is not a directory",
                dir.display()
            )));
        }
        let loaded = store.load(&self.plans);
        if loaded.plans == 0 && loaded.families == 0 {
            if let Some(why) = loaded.warning {
                return Err(CudaError::PlanStore(why));
            }
        }
        if let Some(plan) = self.plans.largest() {
            self.largest_plan = self.largest_plan.max(plan.size());
        }
        Ok(loaded)
    }

    /// Saves the arena's plans and families to `store` (merged with what
    /// its file holds, written atomically; the directory is made if
    /// missing).
    ///
    /// # Errors
    /// [`CudaError::PlanStore`] when the directory or the file cannot be
    /// written.
    pub fn save_plans(&self, store: &PlanStore) -> Result<Saved, CudaError> {
        store
            .save(&self.plans)
            .map_err(|e| CudaError::PlanStore(format!("saving plan store: {e}")))
    }
}

#[cfg(test)]
mod key_tests {
    use super::plan_store_key;

    #[test]
    fn a_model_file_re_exported_under_its_name_keys_another_store() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("model.pt");
        std::fs::write(&model, b"first export").unwrap();
        let name = model.to_str().unwrap();
        let first = plan_store_key(name, 2 << 20, "sim", "");
        std::fs::write(&model, b"second export").unwrap();
        let second = plan_store_key(name, 2 << 20, "sim", "");
        assert_ne!(first.model, second.model);
        assert_ne!(first.file_name(), second.file_name());
        // Text that names no file is hashed as text.
        assert_eq!(
            plan_store_key("resnet@sha256:abc", 2 << 20, "sim", "").model,
            tensor_arena::ModelKey::hash_model(b"resnet@sha256:abc")
        );
    }
}
