//! The sessions part of the model: the weights every session shares, and
//! an [`Op::SessionRun`](crate::Op::SessionRun) step and its checks.

use super::{At, Model};
use std::sync::{Arc, OnceLock};
use tensor_session::{Dtype, Weights};

/// The weights every session of [`run`](super::run) shares: one `U32` tensor `w` of 16
/// values.
pub(super) fn weights() -> Arc<Weights> {
    static WEIGHTS: OnceLock<Arc<Weights>> = OnceLock::new();
    let w = WEIGHTS.get_or_init(|| {
        let bytes: Vec<u8> = (0..16u32).flat_map(|i| weight(i).to_le_bytes()).collect();
        Arc::new(
            Weights::from_tensors([("w", Dtype::U32, vec![16], bytes)])
                .expect("valid in-memory weights"),
        )
    });
    Arc::clone(w)
}

fn weight(i: u32) -> u32 {
    i.wrapping_mul(2_654_435_761).wrapping_add(1)
}

/// What a session run over `n` inputs computes: `sum(x[i] * w[i % 16])`
/// with `x[i] = i`, in wrapping `u32` arithmetic.
fn session_expected(n: usize) -> u32 {
    (0..n as u32).fold(0u32, |acc, i| {
        acc.wrapping_add(i.wrapping_mul(weight(i % 16)))
    })
}

impl Model<'_, '_, '_> {
    pub(super) fn session_run(&mut self, at: &At<'_>, index: u8, n: usize) {
        if self.sessions.is_empty() {
            return;
        }
        let i = index as usize % self.sessions.len();
        let s = &mut self.sessions[i];
        let runs = s.stats().runs;
        // Keys bucket the sizes: runs of one key differ in size, so once the
        // family has a plan for the key, later runs deviate from it.
        let key = [n >> 8, n % 3];
        let got = s.run(&key, |ctx| {
            if n == 0 {
                let x = ctx.alloc(0).expect("empty buffer");
                assert!(x.is_empty() && x.capacity() == 0);
                return 0;
            }
            let w = ctx.weights().get("w").expect("tensor w");
            let w = w.to_vec_of::<u32>().expect("u32 tensor");
            let mut x = ctx.alloc_slice::<u32>(n).expect("input buffer");
            for (i, v) in x.iter_mut().enumerate() {
                *v = i as u32;
            }
            // Some shapes take a scratch buffer too (a different sequence of
            // events under the same key).
            let scratch = (n % 3 == 0).then(|| ctx.alloc(n * 2).expect("scratch buffer"));
            let mut y = ctx.alloc_slice::<u32>(n).expect("output buffer");
            for (i, (o, &a)) in y.iter_mut().zip(x.iter()).enumerate() {
                *o = a.wrapping_mul(w[i % 16]);
            }
            drop(x);
            drop(scratch);
            y.iter().fold(0u32, |a, &b| a.wrapping_add(b))
        });
        assert_eq!(got, session_expected(n), "{at}: session result");
        let st = s.stats();
        assert_eq!(st.runs, runs + 1, "{at}");
        assert_eq!(st.arena.in_use, 0, "{at}: a session run kept buffers");
        assert!(s.live_blocks().is_empty(), "{at}");
        assert_eq!(st.last_run.map(|r| r.leaked_blocks), Some(0), "{at}");
        #[cfg(any(fuzzing, feature = "check-invariants"))]
        s.arena().check_invariants();
    }
}
