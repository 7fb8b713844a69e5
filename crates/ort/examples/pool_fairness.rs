//! The pool's fairness under a server that holds its checkout across
//! awaits: CLIENTS tasks on a 2-thread tokio runtime share a
//! [`WorkerPool`] of WORKERS; each request checks a worker out
//! asynchronously, hands the checkout to `spawn_blocking` for a run of
//! RUN_MS milliseconds of work, awaits it back, yields once more while
//! still holding it, gives it back and asks again at once. Prints the
//! requests per second and the request latency's p50, p99 and maximum
//! (from asking for a worker to giving it back), and whether p99 is within
//! 2 x p50 + one run.
//!
//! `cargo run --release -p tensor-arena-ort --example pool_fairness -- [CLIENTS] [WORKERS] [RUN_MS] [SECS]`
//! (defaults 64 2 5 10).

use std::time::{Duration, Instant};
use tensor_arena_ort::{WorkerOptions, WorkerPool};

type Error = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, default: u64| -> Result<u64, Error> {
        Ok(args.get(i).map_or(Ok(default), |v| v.parse())?)
    };
    let clients = arg(1, 64)? as usize;
    let workers = arg(2, 2)? as usize;
    let run = Duration::from_millis(arg(3, 5)?);
    let secs = Duration::from_secs(arg(4, 10)?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let pool = WorkerPool::new(workers, WorkerOptions::default())?;
    let lat = rt.block_on(async move {
        let end = Instant::now() + secs;
        let mut tasks = Vec::new();
        for _ in 0..clients {
            let pool = pool.clone();
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                while Instant::now() < end {
                    let t0 = Instant::now();
                    let c = pool.checkout_async().await;
                    let c = tokio::task::spawn_blocking(move || {
                        let until = Instant::now() + run;
                        while Instant::now() < until {
                            std::hint::spin_loop();
                        }
                        c
                    })
                    .await
                    .expect("the run's thread");
                    tokio::task::yield_now().await;
                    drop(c);
                    lat.push(t0.elapsed());
                }
                lat
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.expect("a client"));
        }
        all
    });
    let mut lat: Vec<f64> = lat.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    lat.sort_by(f64::total_cmp);
    let q = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize];
    let (p50, p99, max) = (q(0.5), q(0.99), lat[lat.len() - 1]);
    let run_ms = run.as_secs_f64() * 1e3;
    println!(
        "clients={clients} workers={workers} run_ms={run_ms:.0} requests={} rps={:.1} p50_ms={p50:.1} p99_ms={p99:.1} max_ms={max:.1} p99<=2*p50+run: {}",
        lat.len(),
        lat.len() as f64 / secs.as_secs_f64(),
        p99 <= 2.0 * p50 + run_ms
    );
    Ok(())
}
