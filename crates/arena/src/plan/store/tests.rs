//! The store: what a fresh process loads is what the earlier one learned;
//! every bad file (empty, truncated at each byte, bit-flipped, another
//! model's, runtime's or options', another version's, another key kind's,
//! overlapping offsets, a hostile shape) is refused whole with one warning
//! and leaves the cache empty; saves merge.

use super::check::hash64;
use super::format::HEADER;
use super::*;
use crate::plan::{DynamicReason, Lookup, PlanSource, Recording};
use crate::RunReport;
use std::sync::Arc;

/// A run of the toy model at `[batch, width]`: four blocks, sizes affine
/// in the dimensions, two of them live together.
fn recording(batch: usize, width: usize) -> Recording {
    let mut r = Recording::new();
    let a = r.alloc(64 * batch * width, 64);
    let b = r.alloc(128 * width + 64, 64);
    r.free(a);
    let c = r.alloc(64 * batch, 64);
    r.free(b);
    let _d = r.alloc(256, 64);
    r.free(c);
    r
}

fn key(batch: usize, width: usize) -> String {
    format!("{batch}x{width}")
}

/// Teaches `cache` the runs at `shapes` as dynamic runs would.
fn learn(cache: &PlanCache<String>, shapes: &[(usize, usize)]) {
    for &(b, w) in shapes {
        let k = key(b, w);
        let lookup = Lookup::none(DynamicReason::NewFamily);
        let rec = recording(b, w);
        let learned = cache.after_run(k.as_str(), &lookup, &RunReport::default(), &rec, true);
        assert!(learned.is_some(), "{k} learned");
    }
}

fn model_key() -> ModelKey {
    ModelKey::new(b"model bytes", "test-runtime 1.0", "threads=1")
}

fn store(dir: &Path) -> PlanStore {
    PlanStore::new(dir, model_key())
}

/// A saved store of three shapes; returns the file's bytes.
fn saved(dir: &Path) -> Vec<u8> {
    let cache = PlanCache::new(16);
    learn(&cache, &[(1, 8), (2, 8), (2, 16)]);
    store(dir).save(&cache).expect("saved");
    std::fs::read(store(dir).path()).unwrap()
}

/// Loads `bytes` as the store's file into a fresh cache: the warning, and
/// the cache.
fn load_bytes(dir: &Path, bytes: &[u8]) -> (Loaded, PlanCache<String>) {
    std::fs::write(store(dir).path(), bytes).unwrap();
    let cache = PlanCache::new(16);
    let loaded = store(dir).load(&cache);
    (loaded, cache)
}

fn assert_refused(loaded: &Loaded, cache: &PlanCache<String>, what: &str) {
    let warning = loaded
        .warning
        .as_deref()
        .unwrap_or_else(|| panic!("{what}: no warning"));
    assert!(!warning.contains('\n'), "{what}: one line: {warning}");
    assert_eq!(cache.stats().plans, 0, "{what}: plans loaded");
    assert_eq!(cache.stats().families, 0, "{what}: families loaded");
    assert_eq!((loaded.plans, loaded.families), (0, 0), "{what}");
}

/// Sets a file's checksum to its body's, so that a change reaches the
/// checks past it.
fn fix_checksum(bytes: &mut [u8]) {
    let sum = hash64(&bytes[HEADER..]);
    bytes[24..32].copy_from_slice(&sum.to_le_bytes());
}

#[test]
fn a_fresh_cache_loads_what_an_earlier_one_learned() {
    let dir = tempfile::tempdir().unwrap();
    let before = PlanCache::new(16);
    learn(&before, &[(1, 8), (2, 8), (2, 16)]);
    let saved = store(dir.path()).save(&before).unwrap();
    assert_eq!((saved.plans, saved.merged_plans, saved.families), (3, 0, 1));

    let after = PlanCache::<String>::new(16);
    let loaded = store(dir.path()).load(&after);
    assert_eq!(loaded.warning, None);
    assert_eq!((loaded.plans, loaded.families, loaded.shapes), (3, 1, 3));
    // A shape seen before: its own plan, the same offsets.
    let exact = after.lookup("2x8");
    assert_eq!(exact.source, PlanSource::Exact);
    assert_eq!(exact.plan.as_deref(), before.peek("2x8").as_deref());
    // A shape never seen: predicted from the loaded family, as the
    // earlier process would have.
    let (here, there) = (after.lookup("4x16"), before.lookup("4x16"));
    assert_eq!(here.source, PlanSource::Predicted);
    assert_eq!(there.source, PlanSource::Predicted);
    assert_eq!(
        here.plan.as_ref().unwrap().recording(),
        there.plan.as_ref().unwrap().recording()
    );
    assert!(here.plan.unwrap().covers(&recording(4, 16)));
}

#[test]
fn no_file_loads_nothing_and_says_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cache = PlanCache::<String>::new(4);
    assert_eq!(store(dir.path()).load(&cache), Loaded::default());
}

#[test]
fn an_empty_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (loaded, cache) = load_bytes(dir.path(), b"");
    assert_refused(&loaded, &cache, "empty");
    assert!(loaded.warning.unwrap().contains("empty"));
}

#[test]
fn a_file_truncated_at_any_byte_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = saved(dir.path());
    assert!(bytes.len() < 4096, "a small file: {}", bytes.len());
    for len in 0..bytes.len() {
        let (loaded, cache) = load_bytes(dir.path(), &bytes[..len]);
        assert_refused(&loaded, &cache, &format!("truncated at {len}"));
    }
    let (loaded, cache) = load_bytes(dir.path(), &bytes);
    assert_eq!(loaded.warning, None);
    assert_eq!(cache.stats().plans, 3);
}

#[test]
fn a_file_with_any_bit_flipped_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = saved(dir.path());
    for byte in 0..bytes.len() {
        for bit in 0..8 {
            let mut b = bytes.clone();
            b[byte] ^= 1 << bit;
            let (loaded, cache) = load_bytes(dir.path(), &b);
            assert_refused(&loaded, &cache, &format!("byte {byte} bit {bit}"));
        }
    }
}

#[test]
fn another_models_runtimes_or_options_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = saved(dir.path());
    let others = [
        (
            ModelKey::new(b"other model", "test-runtime 1.0", "threads=1"),
            "model",
        ),
        (
            ModelKey::new(b"model bytes", "test-runtime 1.1", "threads=1"),
            "runtime",
        ),
        (
            ModelKey::new(b"model bytes", "test-runtime 1.0", "threads=4"),
            "options",
        ),
    ];
    for (other, what) in others {
        let s = PlanStore::new(dir.path(), other);
        std::fs::write(s.path(), &bytes).unwrap();
        let cache = PlanCache::<String>::new(16);
        let loaded = s.load(&cache);
        assert_refused(&loaded, &cache, what);
        assert!(loaded.warning.unwrap().contains(what), "{what}");
    }
}

#[test]
fn another_format_versions_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = saved(dir.path());
    bytes[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    let (loaded, cache) = load_bytes(dir.path(), &bytes);
    assert_refused(&loaded, &cache, "version");
    let warning = loaded.warning.unwrap();
    assert!(
        warning.contains(&format!("format version {}", FORMAT_VERSION + 1)),
        "{warning}"
    );
}

#[test]
fn a_foreign_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (loaded, cache) = load_bytes(dir.path(), b"{\"plans\": []}\n and more text than a header");
    assert_refused(&loaded, &cache, "foreign");
    assert!(loaded.warning.unwrap().contains("not a plan store"));
}

#[test]
fn another_key_kinds_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    saved(dir.path());
    let cache = PlanCache::<Vec<usize>>::new(16);
    let loaded = store(dir.path()).load(&cache);
    assert!(loaded.warning.unwrap().contains("kind"));
    assert_eq!(cache.stats().plans, 0);
}

/// The events of `recording(_, _)` as the file writes them: offsets
/// follow a plan's events.
fn events_bytes() -> Vec<u8> {
    let codes: [u32; 8] = [0, 1, 1 << 31, 2, 1 | 1 << 31, 3, 2 | 1 << 31, 0];
    let mut v = 8u32.to_le_bytes().to_vec();
    let mut n = 0;
    for c in codes.iter().take(7) {
        v.extend_from_slice(&c.to_le_bytes());
        n += 1;
    }
    v[..4].copy_from_slice(&(n as u32).to_le_bytes());
    v
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[test]
fn a_plan_whose_offsets_overlap_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cache = PlanCache::new(16);
    learn(&cache, &[(1, 8)]);
    store(dir.path()).save(&cache).unwrap();
    let mut bytes = std::fs::read(store(dir.path()).path()).unwrap();
    let events = events_bytes();
    let at = find(&bytes, &events).expect("the plan's events") + events.len();
    // Blocks 0 and 1 are live together; put both at offset 0.
    bytes[at..at + 8].copy_from_slice(&0u64.to_le_bytes());
    bytes[at + 8..at + 16].copy_from_slice(&0u64.to_le_bytes());
    fix_checksum(&mut bytes);
    let (loaded, cache) = load_bytes(dir.path(), &bytes);
    assert_refused(&loaded, &cache, "overlap");
    assert!(loaded.warning.unwrap().contains("invalid plan"));
}

#[test]
fn a_shape_no_run_could_make_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cache = PlanCache::new(16);
    learn(&cache, &[(1, 8)]);
    store(dir.path()).save(&cache).unwrap();
    let mut bytes = std::fs::read(store(dir.path()).path()).unwrap();
    let events = events_bytes();
    // The second copy of the events is the family structure's: make its
    // last free free block 0 again.
    let first = find(&bytes, &events).unwrap();
    let second = first + 1 + find(&bytes[first + 1..], &events).expect("the structure's events");
    let last = second + events.len() - 4;
    bytes[last..last + 4].copy_from_slice(&(1u32 << 31).to_le_bytes());
    fix_checksum(&mut bytes);
    let (loaded, cache) = load_bytes(dir.path(), &bytes);
    assert_refused(&loaded, &cache, "hostile shape");
    assert!(loaded.warning.unwrap().contains("already freed"));
}

#[test]
fn saves_merge_what_replicas_learned() {
    let dir = tempfile::tempdir().unwrap();
    let one = PlanCache::new(16);
    learn(&one, &[(1, 8), (2, 8)]);
    let two = PlanCache::new(16);
    learn(&two, &[(2, 8), (4, 32)]);
    store(dir.path()).save(&one).unwrap();
    let saved = store(dir.path()).save(&two).unwrap();
    assert_eq!((saved.plans, saved.merged_plans, saved.families), (3, 1, 1));

    let three = PlanCache::<String>::new(16);
    let loaded = store(dir.path()).load(&three);
    assert_eq!((loaded.plans, loaded.shapes), (3, 3), "{loaded:?}");
    for k in ["1x8", "2x8", "4x32"] {
        assert_eq!(three.lookup(k).source, PlanSource::Exact, "{k}");
    }
    // Nothing but the store's file (and its lock file) is left in the
    // directory.
    let mut names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let name = model_key().file_name();
    assert_eq!(names, [format!(".{name}.lock"), name]);
}

#[test]
fn a_save_replaces_a_file_it_cannot_merge() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(store(dir.path()).path(), b"garbage").unwrap();
    let cache = PlanCache::new(16);
    learn(&cache, &[(1, 8)]);
    let saved = store(dir.path()).save(&cache).unwrap();
    assert_eq!((saved.plans, saved.merged_plans), (1, 0));
    let fresh = PlanCache::<String>::new(16);
    assert_eq!(store(dir.path()).load(&fresh).warning, None);
    assert_eq!(fresh.stats().plans, 1);
}

#[test]
fn a_load_keeps_the_most_recent_plans_within_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let big = PlanCache::new(16);
    learn(&big, &[(1, 8), (2, 8), (3, 8), (4, 8)]);
    store(dir.path()).save(&big).unwrap();
    let small = PlanCache::<String>::new(2);
    let loaded = store(dir.path()).load(&small);
    assert_eq!(loaded.plans, 4);
    assert_eq!(small.stats().plans, 2);
    assert!(small.contains("4x8") && small.contains("3x8"));
}

#[test]
fn seal_makes_the_header_encode_makes() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = saved(dir.path());
    assert_eq!(seal(&bytes[HEADER..]), bytes);
}

/// Makes something at a path.
#[cfg(target_os = "linux")]
type Make = Box<dyn Fn(&Path)>;

/// What is at the store's path when it is not a regular file.
#[cfg(target_os = "linux")]
fn odd_paths() -> Vec<(&'static str, Make)> {
    vec![
        (
            "FIFO",
            Box::new(|p: &Path| {
                rustix::fs::mknodat(
                    rustix::fs::CWD,
                    p,
                    rustix::fs::FileType::Fifo,
                    rustix::fs::Mode::from_raw_mode(0o600),
                    0,
                )
                .unwrap()
            }),
        ),
        (
            "symbolic link",
            Box::new(|p: &Path| std::os::unix::fs::symlink("/dev/zero", p).unwrap()),
        ),
        (
            "directory",
            Box::new(|p: &Path| std::fs::create_dir(p).unwrap()),
        ),
    ]
}

#[cfg(target_os = "linux")]
#[test]
fn a_fifo_a_link_to_a_device_or_a_directory_is_refused_at_once_and_never_written_through() {
    for (what, make) in odd_paths() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        make(&s.path());
        let cache = PlanCache::<String>::new(16);
        let t = std::time::Instant::now();
        // A FIFO blocked this load for good; a link to /dev/zero read 1 GiB.
        let loaded = s.load(&cache);
        let took = t.elapsed();
        assert_refused(&loaded, &cache, what);
        let warning = loaded.warning.unwrap();
        assert!(warning.contains("not a regular file"), "{what}: {warning}");
        assert!(took < std::time::Duration::from_secs(5), "{what}: {took:?}");
        learn(&cache, &[(1, 8)]);
        let e = s.save(&cache).unwrap_err();
        assert!(e.to_string().contains("not saved"), "{what}: {e}");
        // Still what it was: not replaced, nothing written through.
        let m = std::fs::symlink_metadata(s.path()).unwrap();
        assert!(!m.is_file(), "{what} replaced by a file");
    }
}

#[test]
fn each_option_set_and_runtime_keeps_a_file_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let two = PlanStore::new(
        dir.path(),
        ModelKey::new(b"model bytes", "rt 1.0", "threads=2"),
    );
    let four = PlanStore::new(
        dir.path(),
        ModelKey::new(b"model bytes", "rt 1.0", "threads=4"),
    );
    let newer = PlanStore::new(
        dir.path(),
        ModelKey::new(b"model bytes", "rt 1.1", "threads=2"),
    );
    assert_ne!(two.path(), four.path());
    assert_ne!(two.path(), newer.path());
    let cache = PlanCache::new(16);
    learn(&cache, &[(1, 8)]);
    for s in [&two, &four, &newer] {
        s.save(&cache).unwrap();
    }
    // Every save kept the others' files: each starts planned.
    for s in [&two, &four, &newer] {
        let fresh = PlanCache::<String>::new(16);
        let loaded = s.load(&fresh);
        assert_eq!(
            (loaded.plans, loaded.warning),
            (1, None),
            "{}",
            s.path().display()
        );
    }
}

/// A run of the toy model whose blocks are all twice as large: another
/// recording of the same key.
fn recording_large(batch: usize, width: usize) -> Recording {
    let mut r = Recording::new();
    let a = r.alloc(128 * batch * width, 64);
    let b = r.alloc(256 * width + 64, 64);
    r.free(a);
    r.free(b);
    r
}

#[test]
fn the_last_savers_plan_is_the_one_loaded_for_a_key_both_learned() {
    let dir = tempfile::tempdir().unwrap();
    let one = PlanCache::new(16);
    learn(&one, &[(2, 8)]);
    let two = PlanCache::<String>::new(16);
    let lookup = Lookup::none(DynamicReason::NewFamily);
    let rec = recording_large(2, 8);
    two.after_run("2x8", &lookup, &RunReport::default(), &rec, true)
        .expect("learned");
    assert_ne!(one.peek("2x8"), two.peek("2x8"));
    store(dir.path()).save(&one).unwrap();
    store(dir.path()).save(&two).unwrap();
    let fresh = PlanCache::<String>::new(16);
    store(dir.path()).load(&fresh);
    assert_eq!(fresh.peek("2x8"), two.peek("2x8"));
    assert_eq!(fresh.peek("2x8").unwrap().recording(), rec);
}

#[test]
fn a_save_keeps_the_old_file_whole_until_the_new_one_replaces_it() {
    let dir = tempfile::tempdir().unwrap();
    let cache = PlanCache::new(64);
    learn(&cache, &[(1, 8)]);
    store(dir.path()).save(&cache).unwrap();
    let old = std::fs::read(store(dir.path()).path()).unwrap();
    // A hard link holds the old inode across the saves.
    let held = dir.path().join("held");
    std::fs::hard_link(store(dir.path()).path(), &held).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let loader = s.spawn(|| {
            let mut loads = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || loads == 0 {
                let fresh = PlanCache::<String>::new(64);
                let loaded = store(dir.path()).load(&fresh);
                assert_eq!(loaded.warning, None, "load {loads}");
                assert!(loaded.plans >= 1);
                loads += 1;
            }
            loads
        });
        for b in 2..40 {
            learn(&cache, &[(b, 8)]);
            store(dir.path()).save(&cache).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(loader.join().unwrap() > 0);
    });
    // The old inode is the old file, whole, never written into.
    assert_eq!(std::fs::read(&held).unwrap(), old);
    let fresh = PlanCache::<String>::new(64);
    assert_eq!(store(dir.path()).load(&fresh).plans, 39);
}

#[test]
fn a_file_of_more_plans_than_any_cache_holds_is_kept_to_the_most_recent() {
    // 10,000 small valid plans: decoding keeps the last MAX_PLANS only.
    let n = 10_000u32;
    let body = one_block_plans(n, Some(0));
    let (contents, _) = decode::<String>(&seal(&body)).unwrap();
    assert_eq!(contents.plans.len(), super::merge::MAX_PLANS);
    assert_eq!(contents.plans.last().unwrap().0, (n - 1).to_string());
}

#[test]
fn a_plan_that_serves_workspaces_apart_is_loaded_so() {
    let dir = tempfile::tempdir().unwrap();
    let before = PlanCache::new(16);
    learn(&before, &[(1, 8), (2, 8)]);
    let core = before.peek("2x8").unwrap();
    before.insert(key(2, 8), Arc::new((*core).clone().with_workspaces_apart()));
    store(dir.path()).save(&before).unwrap();
    let after = PlanCache::<String>::new(16);
    let loaded = store(dir.path()).load(&after);
    assert_eq!((loaded.warning, loaded.plans), (None, 2));
    assert!(after.peek("2x8").unwrap().workspaces_apart());
    assert!(!after.peek("1x8").unwrap().workspaces_apart());
    assert_eq!(
        *after.peek("2x8").unwrap(),
        (*core).clone().with_workspaces_apart()
    );
}

/// A body of `n` one-block plans (keys `0`, `1`, ...), each with `flags`
/// after its lower bound unless `None` (a version 1 body).
fn one_block_plans(n: u32, flags: Option<u32>) -> Vec<u8> {
    let mut body = Vec::new();
    let key = model_key();
    let put = |b: &mut Vec<u8>, v: &[u8]| {
        b.extend_from_slice(&(v.len() as u32).to_le_bytes());
        b.extend_from_slice(v);
    };
    body.extend_from_slice(&key.model.to_le_bytes());
    put(&mut body, key.runtime.as_bytes());
    put(&mut body, key.options.as_bytes());
    put(&mut body, b"text");
    body.extend_from_slice(&super::family_probe().to_le_bytes());
    body.extend_from_slice(&n.to_le_bytes());
    for i in 0..n {
        put(&mut body, i.to_string().as_bytes());
        body.extend_from_slice(&1u32.to_le_bytes()); // one block
        body.extend_from_slice(&64u64.to_le_bytes());
        body.extend_from_slice(&64u64.to_le_bytes());
        body.extend_from_slice(&2u32.to_le_bytes()); // alloc, free
        body.extend_from_slice(&0u32.to_le_bytes());
        body.extend_from_slice(&(1u32 << 31).to_le_bytes());
        body.extend_from_slice(&0u64.to_le_bytes()); // offset
        for v in [64u64, 64, 64] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        if let Some(f) = flags {
            body.extend_from_slice(&f.to_le_bytes());
        }
    }
    body.extend_from_slice(&0u32.to_le_bytes()); // no families
    body
}

#[test]
fn a_version_1_file_is_loaded_and_its_next_save_writes_this_version() {
    let dir = tempfile::tempdir().unwrap();
    let mut file = seal(&one_block_plans(3, None));
    file[8..12].copy_from_slice(&1u32.to_le_bytes());
    let (loaded, cache) = load_bytes(dir.path(), &file);
    assert_eq!((loaded.warning, loaded.plans), (None, 3));
    assert!(!cache.peek("2").unwrap().workspaces_apart());
    store(dir.path()).save(&cache).unwrap();
    let again = std::fs::read(store(dir.path()).path()).unwrap();
    assert_eq!(again[8..12], FORMAT_VERSION.to_le_bytes());
    let (loaded, _) = load_bytes(dir.path(), &again);
    assert_eq!((loaded.warning, loaded.plans), (None, 3));
    // The same body under this version's header lacks its flags.
    let (loaded, cache) = load_bytes(dir.path(), &seal(&one_block_plans(3, None)));
    assert_refused(&loaded, &cache, "a version 1 body as version 2");
}

#[test]
fn a_plan_flag_this_build_does_not_know_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (loaded, cache) = load_bytes(dir.path(), &seal(&one_block_plans(3, Some(1))));
    assert_eq!((loaded.warning, loaded.plans), (None, 3));
    assert!(cache.peek("1").unwrap().workspaces_apart());
    let (loaded, cache) = load_bytes(dir.path(), &seal(&one_block_plans(3, Some(2))));
    assert_refused(&loaded, &cache, "flag 2");
    assert!(loaded.warning.unwrap().contains("flags 0x2"));
}

/// One of the processes of
/// [`six_processes_saving_together_three_times_lose_no_shape`]: learns
/// two shapes of its own, waits for the start, saves three times (the
/// second and third as a server's saver would: only if the file lost
/// its plans). A plain test (returns at once) unless run as that child.
#[test]
fn saver_child() {
    let (Ok(dir), Ok(me)) = (
        std::env::var("TA_STORE_CHILD_DIR"),
        std::env::var("TA_STORE_CHILD"),
    ) else {
        return;
    };
    let me: usize = me.parse().unwrap();
    let dir = Path::new(&dir);
    let cache = PlanCache::new(64);
    learn(&cache, &[(me + 1, 100), (me + 1, 200)]);
    let s = store(dir);
    while !dir.join("go").exists() {
        std::thread::yield_now();
    }
    s.save(&cache).unwrap();
    for _ in 0..2 {
        if s.changed() {
            s.save_missing(&cache).unwrap();
        }
    }
}

#[test]
fn six_processes_saving_together_three_times_lose_no_shape() {
    if std::env::var("TA_STORE_CHILD").is_ok() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    for trial in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let children: Vec<_> = (0..6)
            .map(|i| {
                std::process::Command::new(&exe)
                    .args([
                        "--exact",
                        "plan::store::tests::saver_child",
                        "--test-threads=1",
                        "-q",
                    ])
                    .env("TA_STORE_CHILD", i.to_string())
                    .env("TA_STORE_CHILD_DIR", dir.path())
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(300));
        std::fs::write(dir.path().join("go"), b"").unwrap();
        for mut c in children {
            assert!(c.wait().unwrap().success(), "trial {trial}");
        }
        let fresh = PlanCache::<String>::new(64);
        let loaded = store(dir.path()).load(&fresh);
        assert_eq!(loaded.warning, None);
        let missing: Vec<String> = (0..6)
            .flat_map(|i| [key(i + 1, 100), key(i + 1, 200)])
            .filter(|k| fresh.lookup(k.as_str()).source != PlanSource::Exact)
            .collect();
        assert!(missing.is_empty(), "trial {trial}: lost {missing:?}");
    }
}

#[test]
fn a_plan_needing_more_alignment_than_the_arena_draws_is_left_out_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let cache = PlanCache::<String>::new(16);
    learn(&cache, &[(1, 8)]);
    let mut rec = Recording::new();
    let a = rec.alloc(8192, 8192);
    rec.free(a);
    let lookup = Lookup::none(DynamicReason::NewFamily);
    cache
        .after_run("wide", &lookup, &RunReport::default(), &rec, true)
        .expect("learned");
    store(dir.path()).save(&cache).unwrap();
    let fresh = PlanCache::<String>::new(16);
    let loaded = store(dir.path()).load(&fresh);
    assert!(
        fresh.peek("wide").is_none(),
        "a plan no arena of 4096 can draw"
    );
    assert!(fresh.peek("1x8").is_some());
    assert_eq!(loaded.plans, 1);
    let warning = loaded.warning.unwrap();
    assert!(
        warning.contains("alignment over the arena's 4096"),
        "{warning}"
    );
    // An arena that draws it loads it.
    let wider = PlanCache::<String>::new(16);
    let loaded = store(dir.path()).with_max_align(1 << 16).load(&wider);
    assert_eq!((loaded.plans, loaded.warning), (2, None));
}

#[test]
fn a_cache_that_learns_off_the_runs_path_leaves_the_loaded_fits_to_its_learner() {
    let dir = tempfile::tempdir().unwrap();
    saved(dir.path());
    let cache = PlanCache::<String>::new(16);
    cache.set_deferred_learning(true);
    let loaded = store(dir.path()).load(&cache);
    assert_eq!((loaded.plans, loaded.shapes, loaded.warning), (3, 3, None));
    // No fit made by the load: the structure owes it.
    assert!(cache.owes());
    assert_ne!(cache.lookup("4x16").source, PlanSource::Predicted);
    assert_eq!(cache.lookup("2x8").source, PlanSource::Exact);
    assert_eq!(cache.learn(), 1);
    assert!(!cache.owes());
    assert_eq!(cache.lookup("4x16").source, PlanSource::Predicted);
}

#[test]
fn a_cache_without_a_learner_fits_a_loaded_structure_at_its_first_prediction() {
    let dir = tempfile::tempdir().unwrap();
    saved(dir.path());
    let cache = PlanCache::<String>::new(16);
    let loaded = store(dir.path()).load(&cache);
    assert_eq!((loaded.plans, loaded.shapes, loaded.warning), (3, 3, None));
    // No fit made by the load (it would cost what the file chooses): the
    // structure owes it, and the first lookup that needs it makes it.
    assert!(cache.owes_fit(family_of("4x16")));
    assert_eq!(cache.lookup("2x8").source, PlanSource::Exact);
    assert_eq!(cache.lookup("4x16").source, PlanSource::Predicted);
    assert!(!cache.owes_fit(family_of("4x16")));
}

/// The family id of key `k`.
fn family_of(k: &str) -> u64 {
    <str as crate::KeyDims>::family(k)
}
