//! `tensor-arena replay` out of memory: under an address-space limit the
//! test sets itself (`ulimit -v` in the shell that starts the program), a
//! trace whose one run asks for more than the process may map. Every
//! strategy reports that run as out of memory, by name, goes on with the
//! next run, and the command exits 1; no strategy dies by a signal.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_tensor-arena");

#[test]
fn a_run_that_cannot_get_memory_fails_cleanly_in_every_strategy() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("huge.trace");
    std::fs::write(
        &trace,
        "# trace v1 model=huge input=1,2,1\n\
         run small\nalloc 1 1000000\nalloc 2 2000000\nfree 1\nfree 2\n\
         run huge\nalloc 1 1000000\nalloc 2 60000000000\nfree 1\nfree 2\n\
         run small-again\nalloc 1 1000000\nfree 1\n",
    )
    .unwrap();
    // 8 GB of address space: 60 GB cannot be mapped, whatever the
    // overcommit mode, and nothing near the machine's memory is touched.
    let out = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 8000000 && exec \"$0\" replay --trace \"$1\"")
        .arg(BIN)
        .arg(&trace)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "{text}");
    for strategy in ["arena", "planned", "system", "mimalloc", "jemalloc", "bump"] {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("FAILED: {strategy} run 1 (huge):")))
            .unwrap_or_else(|| panic!("no failure line for {strategy}:\n{text}"));
        assert!(line.contains("out of memory"), "{line}");
    }
    // The run after the refusal ran in every strategy (a time, not FAILED).
    let again = text
        .lines()
        .filter(|l| l.contains("small-again"))
        .collect::<Vec<_>>();
    assert_eq!(again.len(), 6, "one row per strategy:\n{text}");
    assert!(
        again.iter().all(|l| !l.contains("FAILED")),
        "the run after the refusal failed:\n{text}"
    );
    assert!(
        text.contains("6 run(s) failed (an allocation was refused)"),
        "{text}"
    );
}
