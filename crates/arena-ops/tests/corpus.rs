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
