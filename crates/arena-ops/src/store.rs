//! [`plan_store`]: arbitrary bytes as a plan store file, loaded into a
//! fresh cache as a new replica would load it.
//!
//! Whatever comes in, loading never panics: it is refused whole with one
//! warning line, or every plan it added passes [`Plan::validate`] and
//! serves a planned run whose live blocks never overlap (the checks of
//! [`plans`](crate::plans)), and every prediction its families make does
//! too.

use arbitrary::Unstructured;
use std::path::Path;
use tensor_arena::plan::store::{self, FamilySnapshot};
use tensor_arena::{ModelKey, PlanCache, PlanStore};

/// Lookups of predicted keys per input, at most.
const MAX_PREDICTIONS: usize = 16;

/// The store file an input stands for ([`plan_store`]'s first step): with
/// an odd first byte, the rest sealed as a body; else the rest as it is.
pub fn plan_store_file(data: &[u8]) -> Option<Vec<u8>> {
    let (&mode, rest) = data.split_first()?;
    Some(if mode % 2 == 1 {
        store::seal(rest)
    } else {
        rest.to_vec()
    })
}

/// Loads `file` as a store's file into a fresh cache, then saves that
/// cache over it (a replica's load and its next save), in a scratch
/// directory: what the `plan_store` fuzz target times and weighs. Returns
/// the plans loaded.
pub fn plan_store_load_and_save(file: &[u8], dir: &Path) -> usize {
    let key = match store::decode::<String>(file) {
        Ok((contents, _)) => contents.key,
        Err(_) => ModelKey::default(),
    };
    let s = PlanStore::new(dir, key);
    let _ = std::fs::write(s.path(), file);
    let cache = PlanCache::<String>::new(64);
    let loaded = s.load(&cache);
    let _ = s.save(&cache);
    loaded.plans
}

/// Runs one fuzz input: the first byte chooses how the rest is read.
/// - odd: as a store file's body, under a header with its checksum
///   ([`store::seal`]), so that the body's parser and checks are reached;
/// - even: as a whole file, header included.
///
/// The file is loaded under its own model key where it has one (so that
/// the checks past the key are reached), else under a fixed one.
///
/// # Panics
/// When a check fails: a warning of more than one line, a refused file
/// that added anything, a plan that fails validation, or a planned run's
/// blocks overlapping.
pub fn plan_store(data: &[u8]) {
    let Some(file) = plan_store_file(data) else {
        return;
    };
    // Either key kind decodes without panicking.
    let _ = store::decode::<Vec<usize>>(&file);
    let (key, families) = match store::decode::<String>(&file) {
        Ok((contents, _)) => (contents.key, contents.families),
        Err(_) => (ModelKey::default(), Vec::new()),
    };
    let cache = PlanCache::<String>::new(64);
    let loaded = PlanStore::new(Path::new("/nonexistent"), key).load_bytes(&file, &cache);
    if let Some(w) = &loaded.warning {
        assert!(!w.contains('\n'), "a warning of more than one line: {w}");
        if loaded.plans == 0 {
            assert_eq!(cache.stats().plans, 0, "a refused file added plans");
            assert_eq!(cache.stats().families, 0, "a refused file added families");
            return;
        }
    }
    for (_, plan) in cache.entries() {
        if let Err(e) = plan.validate() {
            panic!("a loaded plan fails validation: {e}");
        }
        crate::plans::drive(&plan, &mut Unstructured::new(&[]));
    }
    for key in predicted_keys(&families) {
        if let Some(plan) = cache.lookup(key.as_str()).plan {
            if let Err(e) = plan.validate() {
                panic!("a predicted plan fails validation: {e}");
            }
            crate::plans::drive(&plan, &mut Unstructured::new(&[]));
        }
    }
}

/// Keys of the families' names with their `#`s filled in from shapes
/// seen, moved a little (so that some are predicted, not exact).
fn predicted_keys(families: &[FamilySnapshot]) -> Vec<String> {
    let mut keys = Vec::new();
    for f in families {
        for s in &f.structures {
            for shape in &s.shapes {
                if keys.len() >= MAX_PREDICTIONS {
                    return keys;
                }
                let mut dims = shape.dims.iter().map(|d| d.saturating_add(d / 2 + 1));
                let key: String = f
                    .name
                    .chars()
                    .map(|c| match c {
                        '#' => dims.next().unwrap_or(1).to_string(),
                        c => c.to_string(),
                    })
                    .collect();
                keys.push(key);
            }
        }
    }
    keys
}
