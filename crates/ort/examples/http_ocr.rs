//! An HTTP inference server for PP-OCR det and rec (axum on tokio) that
//! adopted tensor-arena as the crate's README says, and a bounded load
//! generator for it, on loopback only.
//!
//! The server keeps a [`WorkerPool`] of N workers, each paired with its own
//! det and rec sessions (`ort`'s `Session::run` takes `&mut self`), and
//! awaits each request's run with [`WorkerPool::run_async`]. With
//! `--memory ort` it is the same server without the arena: the same pool
//! and sessions, built without `with_tensor_arena`, run without a worker
//! (ONNX Runtime's defaults: its own CPU arena per session). A request's
//! body is `MODEL SHAPE SEED` (`det 1x3x960x672 7`): the server makes the
//! input from the seed (as `make_input` does) so that the load measures
//! inference, not uploads; the answer is a hash of the outputs' bits and
//! their shapes.
//!
//! ```text
//! # one server (prints `listening PORT`, then serves until killed)
//! cargo run --release -p tensor-arena-ort --example http_ocr -- serve DIR --memory arena --pool 2
//! # one configuration: starts the server as a child process, runs the
//! # load, samples the child's RSS, waits IDLE seconds, prints one line
//! cargo run --release -p tensor-arena-ort --example http_ocr -- load DIR --memory arena --clients 16 --requests 200 --idle 15
//! # every configuration (ort, arena) x (1, 16, 64 clients), each server in its own process
//! cargo run --release -p tensor-arena-ort --example http_ocr -- bench DIR --requests 200 --idle 15
//! ```
//! `--shrink default|follow1|keep|window:SECONDS` sets the arena's
//! [`Shrink`] policy (default: the crate's). DIR holds `libonnxruntime.so`, `ppocr_det.onnx`, `ppocr_rec.onnx`
//! (`tools/fetch-ort-assets.sh`). Requests follow the OCR stream's shapes
//! (`crates/cli/data/ocr-stream.txt`: each image's det, then its rec
//! batches), in order, from a fixed start.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use ort::session::{Session, SessionOutputs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tensor_arena_ort::{
    make_input, ort, InputSpec, Plans, RunInfo, RunKey, SessionBuilderExt, Shrink, Worker,
    WorkerOptions, WorkerPool,
};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The OCR stream's request shapes (det and rec only), in order.
const STREAM: &str = include_str!("../../cli/data/ocr-stream.txt");

/// Whether the server's sessions take their tensors from the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mem {
    /// Adopted tensor-arena.
    Arena,
    /// ONNX Runtime's defaults (no arena).
    Ort,
}

impl Mem {
    fn parse(s: &str) -> Result<Self, Error> {
        match s {
            "arena" => Ok(Self::Arena),
            "ort" => Ok(Self::Ort),
            _ => Err(format!("--memory {s}: arena or ort").into()),
        }
    }
    fn name(self) -> &'static str {
        match self {
            Self::Arena => "arena",
            Self::Ort => "ort",
        }
    }
}

/// One request: the model (`det` or `rec`) and the input's shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// `det` or `rec`.
    pub model: String,
    /// The input's dimensions.
    pub shape: Vec<usize>,
}

/// The stream's requests: each image's det, then its rec batches.
pub fn stream() -> Vec<Request> {
    let mut out = Vec::new();
    for line in STREAM.lines().filter(|l| !l.starts_with('#')) {
        let mut model = "";
        for word in line.split_whitespace() {
            match word {
                "det" | "cls" | "rec" => model = word,
                dims if model != "cls" => out.push(Request {
                    model: model.to_string(),
                    shape: dims.split('x').filter_map(|d| d.parse().ok()).collect(),
                }),
                _ => {}
            }
        }
    }
    out
}

/// A worker's sessions.
pub struct Models {
    det: Session,
    rec: Session,
}

/// The server's state.
pub struct App {
    mem: Mem,
    pool: WorkerPool<Models>,
    det_plans: Arc<Plans>,
    rec_plans: Arc<Plans>,
    det_spec: InputSpec,
    rec_spec: InputSpec,
}

/// The environment, made once per process, with the allocator registered
/// (sessions opt in with `with_tensor_arena`; the others keep ONNX
/// Runtime's own CPU arena).
fn environment(dir: &Path) -> Result<&'static ort::environment::Environment, Error> {
    static ENV: std::sync::OnceLock<ort::environment::Environment> = std::sync::OnceLock::new();
    if let Some(e) = ENV.get() {
        return Ok(e);
    }
    let env = ort::init_from(dir.join("libonnxruntime.so"))?
        .with_name("http-ocr")
        .build()?;
    tensor_arena_ort::register(&env)?; // tensor-arena: the allocator on this environment
    Ok(ENV.get_or_init(|| env))
}

impl App {
    /// Sessions for `pool` workers, from the models in `dir`, with the
    /// default worker options.
    pub fn new(dir: &Path, mem: Mem, pool: usize) -> Result<Arc<Self>, Error> {
        Self::with_options(dir, mem, pool, WorkerOptions::default())
    }

    /// [`App::new`] with the workers' options.
    pub fn with_options(
        dir: &Path,
        mem: Mem,
        pool: usize,
        options: WorkerOptions,
    ) -> Result<Arc<Self>, Error> {
        let env = environment(dir)?;
        let open = |name: &str| -> ort::Result<Session> {
            let b = Session::builder(env)?.with_intra_threads(1)?;
            let mut b = match mem {
                Mem::Arena => b.with_tensor_arena()?, // tensor-arena: CPU tensors from the arena
                Mem::Ort => b,
            };
            b.commit_from_file(dir.join(name))
        };
        let models = (0..pool)
            .map(|_| {
                Ok(Models {
                    det: open("ppocr_det.onnx")?,
                    rec: open("ppocr_rec.onnx")?,
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let det_spec = InputSpec::of(&models[0].det).remove(0);
        let rec_spec = InputSpec::of(&models[0].rec).remove(0);
        Ok(Arc::new(Self {
            mem,
            // tensor-arena: at most `pool` arenas, whatever tokio's threads
            pool: WorkerPool::with_states(options, models)?,
            det_plans: Arc::new(Plans::default()),
            rec_plans: Arc::new(Plans::default()),
            det_spec,
            rec_spec,
        }))
    }

    /// Serves one request body; the answer is `HASH SHAPE...`.
    pub async fn infer(self: &Arc<Self>, body: &str) -> Result<String, Error> {
        let mut words = body.split_whitespace();
        let (Some(model), Some(dims), Some(seed)) = (words.next(), words.next(), words.next())
        else {
            return Err("a request is `MODEL SHAPE SEED`".into());
        };
        let shape: Vec<usize> = dims
            .split('x')
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("shape {dims}: {e}"))?;
        let seed: u64 = seed.parse().map_err(|e| format!("seed {seed}: {e}"))?;
        let is_det = match model {
            "det" => true,
            "rec" => false,
            _ => return Err(format!("model {model}: det or rec").into()),
        };
        let app = Arc::clone(self);
        self.pool
            .run_async(move |worker, models| app.run(worker, models, is_det, &shape, seed))
            .await?
    }

    fn run(
        &self,
        worker: &mut Worker,
        models: &mut Models,
        is_det: bool,
        shape: &[usize],
        seed: u64,
    ) -> Result<String, Error> {
        let (session, plans, spec) = if is_det {
            (&mut models.det, &self.det_plans, &self.det_spec)
        } else {
            (&mut models.rec, &self.rec_plans, &self.rec_spec)
        };
        if self.mem == Mem::Arena {
            check_input_size(shape)?;
        }
        let x = make_input(spec, shape, seed)?;
        let inputs = ort::inputs![x];
        match self.mem {
            Mem::Arena => {
                let key = RunKey::of(&inputs); // tensor-arena: keyed by the input shapes
                let out = match worker.run(plans, &key, || session.run(inputs)) {
                    Ok(out) => out,
                    // tensor-arena: over the memory limit, this run alone
                    // fails; the worker and the session go on.
                    Err(e) if worker.last_run().is_some_and(RunInfo::out_of_memory) => {
                        return Err(OutOfMemory(e.to_string()).into())
                    }
                    Err(e) => return Err(e.into()),
                };
                worker.last_run().map_or(Ok(()), |r| r.check())?;
                digest(&out)
            }
            Mem::Ort => digest(&session.run(inputs)?),
        }
    }
}

/// A request the process's memory limit cannot serve: answered with 507
/// and the reason, and the server goes on.
#[derive(Debug)]
pub struct OutOfMemory(pub String);

impl std::fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "out of memory: {}", self.0)
    }
}

impl std::error::Error for OutOfMemory {}

/// Refuses, before making it, an f32 input larger than the process's
/// memory limit for its arenas (`tensor_arena_ort::default_memory_limit`):
/// the input is the server's own memory, outside the arenas, and a run
/// needs several times its input besides.
fn check_input_size(shape: &[usize]) -> Result<(), Error> {
    let bytes = shape
        .iter()
        .try_fold(4usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| OutOfMemory(format!("an input of shape {shape:?} overflows")))?;
    if let Some(limit) = tensor_arena_ort::default_memory_limit()? {
        if bytes > limit.bytes {
            return Err(OutOfMemory(format!(
                "the input alone is {bytes} bytes, over the memory limit of {} bytes ({:?})",
                limit.bytes, limit.source
            ))
            .into());
        }
    }
    Ok(())
}

/// FNV-1a over every output's shape and f32 bits.
fn digest(out: &SessionOutputs<'_>) -> Result<String, Error> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    };
    let mut shapes = Vec::new();
    for (_, v) in out.iter() {
        let (shape, data) = v.try_extract_tensor::<f32>()?;
        for d in shape.iter() {
            eat(&d.to_le_bytes());
        }
        for x in data {
            eat(&x.to_bits().to_le_bytes());
        }
        shapes.push(format!("{shape:?}"));
    }
    Ok(format!("{h:016x} {}", shapes.join(" ")))
}

async fn handle(State(app): State<Arc<App>>, body: String) -> (StatusCode, String) {
    match app.infer(&body).await {
        Ok(answer) => (StatusCode::OK, answer),
        // tensor-arena: a request too large for the memory limit
        Err(e) if e.is::<OutOfMemory>() => (StatusCode::INSUFFICIENT_STORAGE, e.to_string()),
        Err(e) => (StatusCode::BAD_REQUEST, e.to_string()),
    }
}

/// The HTTP server on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Arc<App>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let router = Router::new().route("/infer", post(handle)).with_state(app);
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

/// What a load run saw.
#[derive(Debug, Default)]
pub struct LoadReport {
    /// Answers by request index (`None`: failed).
    pub answers: Vec<Option<String>>,
    /// Latencies of the answered requests.
    pub latencies: Vec<Duration>,
    /// Wall time of the whole load.
    pub wall: Duration,
}

impl LoadReport {
    /// Requests that failed (an HTTP error, a refused connection, a time-out).
    pub fn failed(&self) -> usize {
        self.answers.iter().filter(|a| a.is_none()).count()
    }
    fn percentile(&self, p: f64) -> f64 {
        let mut v: Vec<f64> = self
            .latencies
            .iter()
            .map(|d| d.as_secs_f64() * 1e3)
            .collect();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return f64::NAN;
        }
        v[((v.len() - 1) as f64 * p).round() as usize]
    }
    /// A digest of every answer in request order (equal digests: equal
    /// outputs).
    pub fn outputs_digest(&self) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for a in &self.answers {
            for &b in a.as_deref().unwrap_or("FAILED").as_bytes() {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        }
        format!("{h:016x}")
    }
}

/// `requests` requests of the stream (from its start, cycling; seed = the
/// request's index) sent by `clients` connections to 127.0.0.1:`port`, each
/// one request at a time; every request times out after `timeout`.
pub async fn load(port: u16, clients: usize, requests: usize, timeout: Duration) -> LoadReport {
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;
    let stream = Arc::new(stream());
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let results = Arc::new(std::sync::Mutex::new(vec![None; requests]));
    let latencies = Arc::new(std::sync::Mutex::new(Vec::with_capacity(requests)));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients.max(1) {
        let (stream, next, results, latencies) = (
            stream.clone(),
            next.clone(),
            results.clone(),
            latencies.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut sender = None;
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= requests {
                    return;
                }
                let r = &stream[i % stream.len()];
                let dims: Vec<String> = r.shape.iter().map(usize::to_string).collect();
                let body = format!("{} {} {i}", r.model, dims.join("x"));
                let t = Instant::now();
                let answer = tokio::time::timeout(timeout, async {
                    if sender.is_none() {
                        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
                            .await
                            .ok()?;
                        let io = hyper_util::rt::TokioIo::new(tcp);
                        let (s, conn) = hyper::client::conn::http1::handshake(io).await.ok()?;
                        tokio::spawn(conn);
                        sender = Some(s);
                    }
                    let s = sender.as_mut()?;
                    let req = hyper::Request::post("/infer")
                        .header("host", "127.0.0.1")
                        .body(Full::new(Bytes::from(body)))
                        .ok()?;
                    let resp = s.send_request(req).await.ok()?;
                    let ok = resp.status().is_success();
                    let bytes = resp.into_body().collect().await.ok()?.to_bytes();
                    ok.then(|| String::from_utf8_lossy(&bytes).into_owned())
                })
                .await
                .ok()
                .flatten();
                if answer.is_none() {
                    sender = None; // a new connection for the next one
                } else {
                    latencies.lock().unwrap().push(t.elapsed());
                }
                results.lock().unwrap()[i] = answer;
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let wall = start.elapsed();
    let answers = std::mem::take(&mut *results.lock().unwrap());
    let latencies = std::mem::take(&mut *latencies.lock().unwrap());
    LoadReport {
        answers,
        latencies,
        wall,
    }
}

/// Resident memory of process `pid` (bytes; 0 if it cannot be read).
fn rss_of(pid: u32) -> u64 {
    status_of(pid, "VmRSS:")
}

/// A `kB` field of `/proc/PID/status` in bytes (`RssAnon:`: the resident
/// memory that is not file pages such as the libraries' code).
fn status_of(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |k| k * 1024)
}

struct Args {
    dir: PathBuf,
    mem: Mem,
    pool: usize,
    clients: usize,
    requests: usize,
    idle: u64,
    /// `--shrink`: `default`, `follow1`, `keep` or `window:SECONDS`.
    shrink: String,
}

/// The workers' options for `--shrink`.
fn worker_options(shrink: &str) -> Result<WorkerOptions, Error> {
    let shrink = match shrink {
        "default" => Shrink::default(),
        "follow1" => Shrink::FollowInput { runs: 1 },
        "keep" => Shrink::KeepLargest,
        s => match s.strip_prefix("window:").map(str::parse::<f64>) {
            Some(Ok(secs)) if secs >= 0.0 && secs.is_finite() => Shrink::Window {
                time: Duration::from_secs_f64(secs),
            },
            _ => {
                return Err(
                    format!("--shrink {s}: default, follow1, keep or window:SECONDS").into(),
                )
            }
        },
    };
    Ok(WorkerOptions {
        shrink,
        ..WorkerOptions::default()
    })
}

fn parse(a: &[String]) -> Result<Args, Error> {
    let mut args = Args {
        dir: PathBuf::from(a.get(2).ok_or("no DIR")?),
        mem: Mem::Arena,
        pool: 2,
        clients: 16,
        requests: 200,
        idle: 15,
        shrink: "default".into(),
    };
    let mut it = a[3..].iter();
    while let Some(flag) = it.next() {
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--memory" => args.mem = Mem::parse(v)?,
            "--pool" => args.pool = v.parse()?,
            "--clients" => args.clients = v.parse()?,
            "--requests" => args.requests = v.parse()?,
            "--idle" => args.idle = v.parse()?,
            "--shrink" => args.shrink = v.clone(),
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }
    Ok(args)
}

/// Starts `serve` in a child process, loads it, samples its RSS; returns
/// the report line.
async fn one(args: &Args, clients: usize) -> Result<String, Error> {
    use tokio::io::AsyncBufReadExt;
    let mut command = tokio::process::Command::new(std::env::current_exe()?);
    // glibc's heaps are the environment's: `MALLOC_ARENA_MAX=1` in this
    // process's environment reaches the server too (the README says when
    // one heap pays).
    let mut child = command
        .arg("serve")
        .arg(&args.dir)
        .args([
            "--memory",
            args.mem.name(),
            "--pool",
            &args.pool.to_string(),
            "--shrink",
            &args.shrink,
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().ok_or("the server exited")?;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
    let port: u16 = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
        .await??
        .and_then(|l| l.strip_prefix("listening ").and_then(|p| p.parse().ok()))
        .ok_or("the server did not say its port")?;
    let session = rss_of(pid);
    let session_anon = status_of(pid, "RssAnon:");
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(session));
    let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (peak.clone(), sampling.clone());
        tokio::spawn(async move {
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                peak.fetch_max(rss_of(pid), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let report = load(port, clients, args.requests, Duration::from_secs(300)).await;
    let after = rss_of(pid);
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    let _ = sampler.await;
    tokio::time::sleep(Duration::from_secs(args.idle)).await;
    let idle = rss_of(pid);
    let idle_anon = status_of(pid, "RssAnon:");
    child.kill().await?;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    Ok(format!(
        "memory={} shrink={} clients={clients} pool={} requests={} failed={} rps={:.2} p50_ms={:.1} p99_ms={:.1} session_mib={:.1} peak_mib={:.1} end_mib={:.1} idle{}s_mib={:.1} session_anon_mib={:.1} idle_anon_mib={:.1} outputs={}",
        args.mem.name(),
        args.shrink,
        args.pool,
        args.requests,
        report.failed(),
        (args.requests - report.failed()) as f64 / report.wall.as_secs_f64(),
        report.percentile(0.5),
        report.percentile(0.99),
        mib(session),
        mib(peak.load(std::sync::atomic::Ordering::Relaxed)),
        mib(after),
        args.idle,
        mib(idle),
        mib(session_anon),
        mib(idle_anon),
        report.outputs_digest(),
    ))
}

fn main() -> Result<(), Error> {
    let a: Vec<String> = std::env::args().collect();
    let usage = "usage: http_ocr serve|load|bench DIR [--memory arena|ort] [--pool N] [--clients N] [--requests N] [--idle SECONDS]";
    let (Some(mode), true) = (a.get(1), a.len() >= 3) else {
        return Err(usage.into());
    };
    let args = parse(&a)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        match mode.as_str() {
            "serve" => {
                let app = App::with_options(
                    &args.dir,
                    args.mem,
                    args.pool,
                    worker_options(&args.shrink)?,
                )?;
                let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
                println!("listening {}", listener.local_addr()?.port());
                if std::env::var_os("HTTP_OCR_DEBUG").is_some() {
                    // Every 5 s on standard error: the arenas and their
                    // reserved bytes, and this process's anonymous RSS.
                    tokio::spawn(async {
                        loop {
                            tokio::time::sleep(Duration::from_secs(5)).await;
                            let (n, st) = tensor_arena_ort::arenas();
                            eprintln!(
                                "arenas {n} reserved {} in_use {} rss_anon {}",
                                st.reserved,
                                st.in_use,
                                status_of(std::process::id(), "RssAnon:")
                            );
                        }
                    });
                }
                serve(listener, app, std::future::pending()).await
            }
            "load" => {
                println!("{}", one(&args, args.clients).await?);
                Ok(())
            }
            "bench" => {
                for clients in [1, 16, 64] {
                    for mem in [Mem::Ort, Mem::Arena] {
                        let args = Args { mem, ..parse(&a)? };
                        println!("{}", one(&args, clients).await?);
                    }
                }
                Ok(())
            }
            _ => Err(usage.into()),
        }
    })
}
