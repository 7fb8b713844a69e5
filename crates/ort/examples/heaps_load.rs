//! A malloc-heavy multi-threaded server workload with glibc's default heaps
//! and with one heap, each configuration in a process of its own: what
//! `limit_system_heaps` (or `MALLOC_ARENA_MAX`) costs and saves.
//!
//! `cargo run --release -p tensor-arena-ort --example heaps_load -- compare [THREADS] [SECS] [ROUNDS]`
//!
//! runs, ROUNDS times in turn, each of these in a child process and prints
//! one line each, then the medians and ratios (one heap ÷ default):
//! - `default`: glibc's own heaps (what linking tensor-arena-ort gives);
//! - `env1`: `MALLOC_ARENA_MAX=1` in the child's environment;
//! - `call1`: `limit_system_heaps(Some(1))` first thing in `main`;
//!
//! each in two workloads: `pass` (each thread allocates batches of blocks
//! and hands them to the next thread, which frees them: a request's buffers
//! freed by another thread, as tokio's work stealing does) and `own` (each
//! thread frees its own blocks). Some blocks outlive their request (a cache
//! entry, a connection's state) until the end, as ONNX Runtime's small
//! allocations do: each thread holds 256, one in 4 batches replacing
//! one of them. A child (`run MODE WORKLOAD THREADS SECS`) prints
//! `ops_per_s peak_rss idle_rss heaps`: the allocations per second, the
//! peak RSS (`VmHWM`), the RSS once every thread has ended and
//! `malloc_trim(0)` ran with the long-lived blocks still held (an idle
//! server), and glibc's heap count.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

type Error = Box<dyn std::error::Error>;

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("run") => {
            // First thing in main, as the README says, for `call1`.
            if args.get(2).map(String::as_str) == Some("call1") {
                assert!(tensor_arena_ort::limit_system_heaps(NonZeroUsize::new(1)));
            }
            let pass = args.get(3).map(String::as_str) == Some("pass");
            let threads = args.get(4).ok_or("THREADS")?.parse()?;
            let secs = args.get(5).ok_or("SECS")?.parse()?;
            child(pass, threads, secs);
            Ok(())
        }
        Some("compare") => {
            let threads: usize = args.get(2).map_or(Ok(16), |v| v.parse())?;
            let secs: f64 = args.get(3).map_or(Ok(3.0), |v| v.parse())?;
            let rounds: usize = args.get(4).map_or(Ok(3), |v| v.parse())?;
            compare(threads, secs, rounds)
        }
        _ => Err("usage: heaps_load compare [THREADS] [SECS] [ROUNDS]".into()),
    }
}

/// A small xorshift: sizes without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Mostly small blocks (32 B to 4 KiB), one in 32 up to 64 KiB.
    fn size(&mut self) -> usize {
        let r = self.next();
        if r % 32 == 0 {
            4096 + (r >> 8) as usize % (60 << 10)
        } else {
            32 + (r >> 8) as usize % 4064
        }
    }
}

fn block(rng: &mut Rng) -> Box<[u8]> {
    let mut b = vec![0u8; rng.size()].into_boxed_slice();
    b[0] = 1;
    b
}

/// Long-lived blocks each thread holds (about 0.5 MiB a thread).
const LONG_LIVED: usize = 256;

fn child(pass: bool, threads: usize, secs: f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let kept: Arc<Mutex<Vec<Box<[u8]>>>> = Arc::default();
    let start = Arc::new(Barrier::new(threads + 1));
    // A ring: thread i sends its batches to thread i + 1.
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..threads)
        .map(|_| mpsc::sync_channel::<Vec<Box<[u8]>>>(4))
        .unzip();
    let mut handles = Vec::new();
    for (i, rx) in rxs.into_iter().enumerate() {
        let tx = txs[(i + 1) % threads].clone();
        let (stop, ops, kept, start) = (stop.clone(), ops.clone(), kept.clone(), start.clone());
        handles.push(std::thread::spawn(move || {
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1));
            let mut mine = Vec::new();
            let mut n = 0u64;
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                let batch: Vec<Box<[u8]>> = (0..64).map(|_| block(&mut rng)).collect();
                n += 64;
                // One in 4 batches replaces one of the thread's
                // long-lived blocks (the one it replaces is freed).
                if rng.next() % 4 == 0 {
                    let b = block(&mut rng);
                    n += 1;
                    if mine.len() < LONG_LIVED {
                        mine.push(b);
                    } else {
                        let at = rng.next() as usize % LONG_LIVED;
                        mine[at] = b;
                    }
                }
                if pass {
                    // Free what the previous thread sent, then send ours
                    // (never blocking while the ring is full).
                    while let Ok(got) = rx.try_recv() {
                        drop(got);
                    }
                    if let Err(mpsc::TrySendError::Full(b) | mpsc::TrySendError::Disconnected(b)) =
                        tx.try_send(batch)
                    {
                        drop(b);
                    }
                } else {
                    drop(batch);
                }
            }
            drop(tx);
            while let Ok(got) = rx.recv_timeout(Duration::from_millis(50)) {
                drop(got);
            }
            ops.fetch_add(n, Ordering::Relaxed);
            kept.lock().unwrap().extend(mine);
        }));
    }
    drop(txs);
    start.wait();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let elapsed = t0.elapsed().as_secs_f64();
    for h in handles {
        h.join().expect("a load thread panicked");
    }
    trim();
    let kept = kept.lock().unwrap();
    println!(
        "{:.0} {} {} {}",
        ops.load(Ordering::Relaxed) as f64 / elapsed,
        status("VmHWM:"),
        status("VmRSS:"),
        heaps()
    );
    std::hint::black_box(kept.len());
}

fn trim() {
    // SAFETY: `malloc_trim` only returns free heap memory to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Bytes of `field` in `/proc/self/status` (0 if unreadable).
fn status(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().trim_end_matches(" kB").parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// glibc's heap count (`malloc_info`'s `<heap nr=...>`).
fn heaps() -> usize {
    let mut buf: *mut libc::c_char = std::ptr::null_mut();
    let mut len: libc::size_t = 0;
    // SAFETY: `open_memstream` writes the buffer's address and length
    // through the two pointers, which live until `fclose`; the buffer is
    // read after `fclose` and freed once.
    unsafe {
        let file = libc::open_memstream(&mut buf, &mut len);
        if file.is_null() {
            return 0;
        }
        libc::malloc_info(0, file);
        libc::fclose(file);
        let text = std::slice::from_raw_parts(buf.cast::<u8>(), len);
        let n = String::from_utf8_lossy(text).matches("<heap nr=").count();
        libc::free(buf.cast());
        n
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn compare(threads: usize, secs: f64, rounds: usize) -> Result<(), Error> {
    let exe = std::env::current_exe()?;
    let configs = ["default", "env1", "call1"];
    for workload in ["pass", "own"] {
        // [config] -> (ops, peak, idle) per round
        let mut got: Vec<Vec<[f64; 3]>> = vec![Vec::new(); configs.len()];
        for round in 0..rounds {
            for (c, config) in configs.iter().enumerate() {
                let mut cmd = std::process::Command::new(&exe);
                cmd.env_remove("MALLOC_ARENA_MAX")
                    .env_remove("GLIBC_TUNABLES");
                if *config == "env1" {
                    cmd.env("MALLOC_ARENA_MAX", "1");
                }
                let out = cmd
                    .args(["run", config, workload])
                    .arg(threads.to_string())
                    .arg(secs.to_string())
                    .output()?;
                let line = String::from_utf8(out.stdout)?;
                let f: Vec<f64> = line
                    .split_whitespace()
                    .map(str::parse)
                    .collect::<Result<_, _>>()?;
                if f.len() != 4 {
                    return Err(format!("child said {line:?}").into());
                }
                println!(
                    "{workload} {threads} threads round {round} {config:8} {:>12.0} ops/s peak {:>7.1} MiB idle {:>7.1} MiB heaps {}",
                    f[0],
                    f[1] / 1048576.0,
                    f[2] / 1048576.0,
                    f[3]
                );
                got[c].push([f[0], f[1], f[2]]);
            }
        }
        let med = |c: usize, k: usize| median(&mut got[c].iter().map(|r| r[k]).collect::<Vec<_>>());
        for (c, config) in configs.iter().enumerate() {
            println!(
                "{workload} {threads} threads median {config:8} {:>12.0} ops/s peak {:>7.1} MiB idle {:>7.1} MiB (ratio to default: ops {:.2}x peak {:.2}x idle {:.2}x)",
                med(c, 0),
                med(c, 1) / 1048576.0,
                med(c, 2) / 1048576.0,
                med(c, 0) / med(0, 0),
                med(c, 1) / med(0, 1),
                med(c, 2) / med(0, 2)
            );
        }
    }
    Ok(())
}
