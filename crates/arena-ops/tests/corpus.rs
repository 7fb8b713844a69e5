//! Every fuzz target as a plain test over its checked-in corpus: each file
//! in `fuzz/corpus/<target>/` goes through the same function the target
//! calls, so `cargo test` replays what the fuzzer found.

use std::path::PathBuf;

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "empty corpus {}", dir.display());
    files
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).expect("read corpus file");
            (p, bytes)
        })
        .collect()
}

/// Runs `f` on every corpus file of `target`, naming the file that fails.
fn replay(target: &str, f: fn(&[u8])) {
    let files = corpus(target);
    for (path, bytes) in &files {
        let r = std::panic::catch_unwind(|| f(bytes));
        if let Err(e) = r {
            eprintln!("corpus file {} failed", path.display());
            std::panic::resume_unwind(e);
        }
    }
    println!("{target}: {} corpus files replayed", files.len());
}

#[test]
fn arena_ops_corpus() {
    replay("arena_ops", tensor_arena_ops::fuzz_arena_ops);
}

#[test]
fn budget_corpus() {
    replay("budget", tensor_arena_ops::fuzz_budget);
}

#[test]
fn plans_corpus() {
    replay("plans", tensor_arena_ops::fuzz_plans);
}

#[test]
fn plan_store_corpus() {
    replay("plan_store", tensor_arena_ops::fuzz_plan_store);
}

/// The `plan_store` seeds load (they reach past the checks) and their
/// families predict: the corpus reaches loading and predicting.
#[test]
fn plan_store_seeds_load_and_predict() {
    let seeds: Vec<_> = corpus("plan_store")
        .into_iter()
        .filter(|(p, _)| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("seed-learned"))
        })
        .collect();
    assert!(seeds.len() >= 2, "seeds: {}", seeds.len());
    for (path, bytes) in &seeds {
        let file = if bytes[0] % 2 == 1 {
            tensor_arena::plan::store::seal(&bytes[1..])
        } else {
            bytes[1..].to_vec()
        };
        let (contents, _) = tensor_arena::plan::store::decode::<String>(&file)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let cache = tensor_arena::PlanCache::<String>::new(64);
        let store = tensor_arena::PlanStore::new("/nonexistent", contents.key);
        let loaded = store.load_bytes(&file, &cache);
        assert_eq!(loaded.warning, None, "{}", path.display());
        assert!(
            loaded.plans > 0 && loaded.shapes >= 2,
            "{}: {loaded:?}",
            path.display()
        );
        let predicted = cache.lookup("5x40");
        assert_eq!(
            predicted.source,
            tensor_arena::PlanSource::Predicted,
            "{}",
            path.display()
        );
    }
}

/// A small fuzzer in the test suite: the `plan_store` body seeds with
/// bytes changed (deterministically), sealed with a valid checksum, so that
/// what the checks let through (odd dimensions, sizes, alignments) reaches
/// loading, fitting and serving on every `cargo test`.
#[test]
fn plan_store_seeds_survive_mutations() {
    let seeds: Vec<Vec<u8>> = corpus("plan_store")
        .into_iter()
        .filter(|(p, _)| p.file_name().is_some_and(|n| n == "seed-learned-body"))
        .map(|(_, b)| b)
        .collect();
    assert_eq!(seeds.len(), 1);
    let seed = &seeds[0];
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for _ in 0..400 {
        let mut input = seed.clone();
        for _ in 0..1 + next() % 4 {
            let at = 1 + (next() as usize) % (input.len() - 1);
            match next() % 3 {
                0 => input[at] ^= 1 << (next() % 8),
                1 => input[at] = next() as u8,
                _ => input[at] = input[at].wrapping_add(1),
            }
        }
        tensor_arena_ops::fuzz_plan_store(&input);
    }
}

/// Writes the `plan_store` seeds: a store of a toy model's runs at three
/// shapes, as a whole file and as a body to seal.
/// `cargo test -p tensor-arena-ops --test corpus write_plan_store_seeds -- --ignored`
#[test]
#[ignore = "a tool: writes fuzz/corpus/plan_store/seed-*"]
fn write_plan_store_seeds() {
    use tensor_arena::{
        DynamicReason, Lookup, ModelKey, PlanCache, PlanStore, Recording, RunReport,
    };
    let cache = PlanCache::<String>::new(16);
    for (b, w) in [(1usize, 8usize), (2, 8), (2, 16), (4, 32)] {
        let mut r = Recording::new();
        let x = r.alloc(64 * b * w, 64);
        let y = r.alloc(128 * w + 64, 64);
        r.free(x);
        let z = r.alloc(64 * b, 64);
        r.free(y);
        r.alloc(256, 64);
        r.free(z);
        let lookup = Lookup::none(DynamicReason::NewFamily);
        cache.after_run(
            format!("{b}x{w}").as_str(),
            &lookup,
            &RunReport::default(),
            &r,
            true,
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let store = PlanStore::new(dir.path(), ModelKey::new(b"seed model", "seed 1", ""));
    store.save(&cache).unwrap();
    let file = std::fs::read(store.path()).unwrap();
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/plan_store");
    std::fs::create_dir_all(&out).unwrap();
    let mut whole = vec![0u8];
    whole.extend_from_slice(&file);
    std::fs::write(out.join("seed-learned-file"), whole).unwrap();
    let mut body = vec![1u8];
    body.extend_from_slice(&file[32..]);
    std::fs::write(out.join("seed-learned-body"), body).unwrap();
    std::fs::write(out.join("seed-empty"), [0u8]).unwrap();
}

#[test]
fn weights_load_corpus() {
    replay("weights_load", tensor_arena_ops::fuzz_weights_load);
}

/// Prints the operations a fuzz input decodes to:
/// `ARENA_OPS_INPUT=fuzz/artifacts/arena_ops/crash-... cargo test -p tensor-arena-ops --test corpus show_input -- --ignored --nocapture`
#[test]
#[ignore = "a tool: run by hand with ARENA_OPS_INPUT set"]
fn show_input() {
    let Some(path) = std::env::var_os("ARENA_OPS_INPUT") else {
        eprintln!("set ARENA_OPS_INPUT to a fuzz input file");
        return;
    };
    let bytes = std::fs::read(&path).expect("read the input");
    for (step, op) in tensor_arena_ops::decode(&bytes).iter().enumerate() {
        println!("{step:4}: {op:?}");
    }
}

/// The plan family seeds make valid run structures (their runs are driven,
/// not stopped at validation), and their families serve runs on predicted
/// plans: the corpus reaches the predicted path.
#[test]
fn family_seeds_reach_predicted_serving() {
    let seeds: Vec<_> = corpus("plans")
        .into_iter()
        .filter(|(p, _)| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("family-seed"))
        })
        .collect();
    assert!(seeds.len() >= 4, "family seeds: {}", seeds.len());
    let mut predicted = 0;
    let mut kept = 0;
    for (path, bytes) in &seeds {
        let counts = tensor_arena_ops::plans_reported(bytes)
            .unwrap_or_else(|| panic!("{}: no valid run structure", path.display()));
        assert!(counts.runs() >= 4, "{}: {counts:?}", path.display());
        println!("{}: {counts:?}", path.display());
        predicted += counts.predicted;
        kept += counts.predicted - counts.fell_back();
    }
    assert!(
        predicted > 0 && kept > 0,
        "no seed served a run on a predicted plan"
    );
}
