//! A session that runs out of memory (the system refusing a commit, under a
//! `RLIMIT_DATA` the child process sets itself) gets an error from its run,
//! keeps working, learns no plan from the failed run, and serves a smaller
//! run at once.

#[path = "../../arena/tests/support/child.rs"]
mod child;

use child::{limit_data_to_now_plus, run_child, GIB, MIB};
use std::sync::Arc;
use tensor_session::{Dtype, Session, SessionConfig, Weights};

fn main() {
    child::main(
        &[("a_refused_run_leaves_the_session_usable", refused_run)],
        run_case,
    );
}

fn refused_run() {
    let out = run_child("session");
    assert!(out.contains("refused: out of memory"), "{out}");
    assert!(out.contains("smaller run served"), "{out}");
}

fn run_case(case: &str) {
    assert_eq!(case, "session");
    let w = Weights::from_tensors([("w", Dtype::F32, vec![4], vec![0u8; 16])]).unwrap();
    let mut s = Session::new(Arc::new(w), SessionConfig::default());
    // A small run first: its plan is learned.
    let sum = infer(&mut s, 1 << 20).expect("a small run");
    assert_eq!(sum, (1 << 20) as f64);
    limit_data_to_now_plus(256 * MIB);
    let err = infer(&mut s, GIB).unwrap_err();
    assert!(err.is_out_of_memory(), "{err:?}");
    println!("child: refused: out of memory: {err}");
    let st = s.stats();
    assert_eq!(st.arena.in_use, 0, "the failed run's buffers went back");
    assert!(!s.arena().in_run());
    assert!(
        s.plans().get(&[GIB][..]).is_none(),
        "a plan was learned from a failed run"
    );
    // The same small shape again: served by its plan, no memory-layer call.
    let calls = s.stats().arena.commits;
    assert_eq!(infer(&mut s, 1 << 20).unwrap(), (1 << 20) as f64);
    assert_eq!(s.stats().last_run.map(|r| r.planned), Some(true));
    assert_eq!(s.stats().arena.commits, calls);
    // A larger one that fits under the limit.
    assert_eq!(infer(&mut s, 16 << 20).unwrap(), (16 << 20) as f64);
    println!("child: smaller run served");
}

/// A run of `bytes` of ones in two buffers, summed; the arena's error if a
/// buffer is refused.
fn infer(s: &mut Session, bytes: usize) -> Result<f64, tensor_arena::ArenaError> {
    s.run(&[bytes], |ctx| {
        // A small buffer first, so a refused run has recorded something.
        let head = ctx.alloc(4096)?;
        let mut a = ctx.alloc(bytes)?;
        drop(head);
        a.fill(1);
        let b = ctx.alloc(bytes / 2)?;
        drop(b);
        Ok(a.iter().map(|&x| f64::from(x)).sum())
    })
}
