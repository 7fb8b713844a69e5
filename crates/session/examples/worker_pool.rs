//! A pool of workers running a small model over inputs of varying size,
//! then per-worker and pool stats.
//!
//! ```sh
//! cargo run --release -p tensor-session --example worker_pool
//! ```

use std::sync::Arc;
use tensor_session::{Dtype, ModelHandle, Session, SessionConfig, SessionPool, Weights};

const HIDDEN: usize = 256;

/// A two-layer perceptron: 256 -> 1024 -> 256.
fn model() -> Weights {
    let mat = |rows: usize, cols: usize| -> Vec<u8> {
        (0..rows * cols)
            .flat_map(|i| (((i * 7919) % 17) as f32 / 64.0 - 0.125).to_le_bytes())
            .collect()
    };
    Weights::from_tensors([
        (
            "w1",
            Dtype::F32,
            vec![4 * HIDDEN, HIDDEN],
            mat(4 * HIDDEN, HIDDEN),
        ),
        (
            "w2",
            Dtype::F32,
            vec![HIDDEN, 4 * HIDDEN],
            mat(HIDDEN, 4 * HIDDEN),
        ),
    ])
    .expect("valid weights")
}

/// y = W x for every row of `x` (rows x cols) with W (out x cols).
fn matmul(x: &[f32], w: &[f32], cols: usize, y: &mut [f32]) {
    let out = w.len() / cols;
    for (xr, yr) in x.chunks_exact(cols).zip(y.chunks_exact_mut(out)) {
        for (o, wr) in yr.iter_mut().zip(w.chunks_exact(cols)) {
            *o = xr.iter().zip(wr).map(|(a, b)| a * b).sum();
        }
    }
}

/// One inference over `tokens` rows; returns a checksum.
fn infer(session: &mut Session, tokens: usize) -> f32 {
    session.run(&[tokens, HIDDEN], |ctx| {
        let w = ctx.weights();
        let w1 = w.get("w1").unwrap().try_as_slice::<f32>().unwrap();
        let w2 = w.get("w2").unwrap().try_as_slice::<f32>().unwrap();
        let mut x = ctx.alloc_slice::<f32>(tokens * HIDDEN).unwrap();
        for (i, v) in x.iter_mut().enumerate() {
            *v = (i % 13) as f32 / 13.0;
        }
        let mut h = ctx.alloc_slice::<f32>(tokens * 4 * HIDDEN).unwrap();
        matmul(&x, w1, HIDDEN, &mut h);
        drop(x);
        for v in h.iter_mut() {
            *v = v.max(0.0);
        }
        let mut y = ctx.alloc_slice::<f32>(tokens * HIDDEN).unwrap();
        matmul(&h, w2, 4 * HIDDEN, &mut y);
        y.iter().sum()
    })
}

fn main() {
    let workers = 2;
    let pool = SessionPool::new(
        ModelHandle::new(Arc::new(model())),
        SessionConfig::default(),
        workers,
    );
    let sizes = [64usize, 8, 8, 128, 16, 8, 64, 4, 4, 4];
    std::thread::scope(|s| {
        let mut threads = Vec::new();
        for worker in 0..workers {
            let pool = &pool;
            threads.push(s.spawn(move || {
                let mut session = pool.get();
                let mut checksum = 0.0;
                for (i, &tokens) in sizes.iter().enumerate() {
                    if i % workers == worker {
                        checksum += infer(&mut session, tokens);
                    }
                }
                let st = session.stats();
                println!(
                    "worker {worker}: runs {:>2}, shapes {}, reserved {:>8} B, watermark {:>8} B, peak {:>8} B, backing allocs {}, in use {} B, checksum {checksum:.3}",
                    st.runs, st.keys, st.arena.reserved, st.arena.watermark, st.arena.peak_in_use,
                    st.arena.backing_allocs, st.arena.in_use
                );
            }));
        }
        // Join each thread (pthread_join) rather than leaving it to the
        // scope, which only waits for the closures to return: a thread
        // still tearing down when the process exits shows its TLS block as
        // "possibly lost" under valgrind.
        for t in threads {
            t.join().expect("worker thread panicked");
        }
    });
    let before = pool.stats().arena.reserved;
    let released = pool.shrink_idle();
    let st = pool.stats();
    println!(
        "pool: {} clones ({} created), {} runs, reserved {before} B -> {} B after shrink_idle ({released} B released), weights {} B shared",
        st.clones_alive - 1,
        st.clones_created - 1,
        st.runs,
        st.arena.reserved,
        st.weight_bytes_copied + st.weight_bytes_mapped
    );
    pool.trim(0);
    assert_eq!(pool.sessions(), 0);
}
