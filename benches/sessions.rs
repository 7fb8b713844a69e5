//! Sessions: clone-and-drop time with weights of 1 MiB and 1 GiB (memory
//! mapped and owned), and a `SessionPool` of workers on 1 and 2 threads.
//!
//! The mapped weights are sparse safetensors files in the temp directory
//! (deleted right after mapping), so the 1 GiB case needs neither disk
//! writes nor resident memory; the owned 1 GiB copy does take 1 GiB of RAM
//! for the length of its benchmark.
//!
//! The pool workload is one `densenet121-1x3x224x224` run per call (668
//! buffers, one write per 4 KiB page of each); one iteration is
//! [`POOL_RUNS`] runs split over the threads, so criterion's throughput is
//! runs per second. The ratio of 2 threads to 1 is printed at the end.

use benches::{touch_pages, Op, Trace, TraceRun};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::fs::File;
use std::hint::black_box;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tensor_arena::Block;
use tensor_session::{
    Dtype, LoadMode, MmapAck, ModelHandle, RunContext, Session, SessionConfig, SessionPool, Weights,
};

/// Mapped weights for the benches.
// SAFETY: `weights` maps only files `sparse_safetensors` just wrote under a name unique to
// this process, and deletes them (allowed) right after mapping; nothing writes them again.
const MMAP: LoadMode = LoadMode::Mmap(unsafe { MmapAck::new() });

/// Runs per pool iteration (divided among the threads).
const POOL_RUNS: usize = 32;

/// A safetensors file holding one `U8` tensor of `bytes` zero bytes, sparse.
fn sparse_safetensors(bytes: usize) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "tensor-arena-bench-{}-{bytes}.safetensors",
        std::process::id()
    ));
    let mut header =
        format!(r#"{{"w":{{"dtype":"U8","shape":[{bytes}],"data_offsets":[0,{bytes}]}}}}"#);
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut file = File::create(&path).expect("create the weights file");
    file.write_all(&(header.len() as u64).to_le_bytes())
        .and_then(|()| file.write_all(header.as_bytes()))
        .and_then(|()| file.set_len((8 + header.len() + bytes) as u64))
        .expect("write the weights file");
    path
}

fn weights(bytes: usize, mode: LoadMode) -> Weights {
    match mode {
        LoadMode::Mmap(ack) => {
            let path = sparse_safetensors(bytes);
            let w = Weights::open(&path, LoadMode::Mmap(ack)).expect("map the weights");
            // The map keeps the inode alive; nothing is left on disk.
            let _ = std::fs::remove_file(&path);
            w
        }
        LoadMode::Copy => {
            let zeros = vec![0u8; bytes];
            Weights::from_tensors([("w", Dtype::U8, vec![bytes], zeros)]).expect("build weights")
        }
    }
}

fn clone_drop(c: &mut Criterion) {
    let mut group = c.benchmark_group("sessions/clone_drop");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for (mode, mode_name) in [(MMAP, "mmap"), (LoadMode::Copy, "owned")] {
        for (bytes, size_name) in [(1 << 20, "1MiB"), (1 << 30, "1GiB")] {
            let mut session: Option<Session> = None;
            group.bench_function(BenchmarkId::new(mode_name, size_name), |b| {
                let session = session.get_or_insert_with(|| {
                    let w = weights(bytes, mode);
                    assert_eq!(w.total_bytes(), bytes);
                    Session::new(Arc::new(w), SessionConfig::default())
                });
                b.iter(|| drop(black_box(session.try_clone())));
            });
        }
    }
    group.finish();
}

/// Replays `run` in a session run: allocate, touch, free as traced.
fn replay(ctx: &RunContext<'_>, run: &TraceRun) {
    let mut live: Vec<Option<Block<'_>>> = Vec::with_capacity(run.slots);
    live.resize_with(run.slots, || None);
    for op in &run.ops {
        match *op {
            Op::Alloc { id, bytes } => {
                let mut block = ctx.alloc(bytes).expect("allocation failed");
                touch_pages(&mut block);
                live[id as usize] = Some(block);
            }
            Op::Free { id } => live[id as usize] = None,
        }
    }
}

/// `runs` runs spread over `threads` workers of `pool`.
fn pool_runs(pool: &SessionPool, run: &TraceRun, threads: usize, runs: usize) {
    let key = [1, 3, 224, 224];
    std::thread::scope(|s| {
        for t in 0..threads {
            let mine = runs / threads + usize::from(t < runs % threads);
            s.spawn(move || {
                for _ in 0..mine {
                    let mut session = pool.get();
                    session.run(&key, |ctx| replay(ctx, run));
                }
            });
        }
    });
}

fn pool(c: &mut Criterion) {
    let trace = Trace::load("densenet121-1x3x224x224");
    let run = &trace.runs[0];
    let mut group = c.benchmark_group("sessions/pool");
    group
        .throughput(Throughput::Elements(POOL_RUNS as u64))
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    let mut rates = Vec::new();
    for threads in [1, 2] {
        let mut made: Option<SessionPool> = None;
        let (mut runs, mut elapsed) = (0u64, Duration::ZERO);
        group.bench_function(BenchmarkId::new("threads", threads), |b| {
            let pool = made.get_or_insert_with(|| {
                let model = ModelHandle::new(Arc::new(weights(1 << 20, MMAP)));
                let pool = SessionPool::new(model, SessionConfig::default(), threads);
                pool_runs(&pool, run, threads, 4 * threads);
                pool
            });
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    pool_runs(pool, run, threads, POOL_RUNS);
                }
                let took = start.elapsed();
                runs += iters * POOL_RUNS as u64;
                elapsed += took;
                took
            });
        });
        if runs > 0 {
            rates.push((threads, runs as f64 / elapsed.as_secs_f64()));
        }
    }
    group.finish();
    for &(threads, rate) in &rates {
        println!("sessions/pool: {threads} thread(s): {rate:.0} runs/s (mean)");
    }
    if let [(1, one), (2, two)] = rates[..] {
        println!(
            "sessions/pool: 2 threads / 1 thread = {:.2}x (goal >= 1.8x)\n",
            two / one
        );
    }
}

criterion_group! {
    name = benches;
    config = benches::criterion();
    targets = clone_drop, pool
}
criterion_main!(benches);
