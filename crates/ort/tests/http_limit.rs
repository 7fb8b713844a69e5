//! The HTTP example under a memory limit (issue 40 §5): a request too
//! large for it is answered 507 with the reason, alone, and the server
//! goes on. The limit's source is the test's own small value
//! (`TENSOR_ARENA_MEMORY_LIMIT=24M`, set before any worker exists), never
//! the machine's memory. (A binary of its own: the limit is the process's,
//! and so is ONNX Runtime's environment.)

#[allow(dead_code)]
#[path = "all/common.rs"]
mod common;

#[allow(dead_code)]
#[path = "../examples/http_ocr.rs"]
mod http_ocr;

use http_ocr::{serve, App, Mem, OutOfMemory};
use std::time::{Duration, Instant};
use tensor_arena_ort::{default_budget, MEMORY_LIMIT_ENV};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_the_limit_gets_507_and_the_next_is_served() {
    // det at 640x640 needs about 46 MiB of arena, at 160x160 about 4 MiB.
    std::env::set_var(MEMORY_LIMIT_ENV, "24M");
    let app = App::new(common::assets(), Mem::Arena, 1).unwrap();
    let budget = default_budget().unwrap().expect("the limit is in force");
    assert_eq!(budget.limit(), 24 << 20);
    // Through the app: the run over the limit fails as out of memory; an
    // input over the limit is refused before it is made.
    for (body, why) in [
        ("det 1x3x640x640 1", "bad_alloc"),
        ("det 1x3x4000x4000 1", "the input alone"),
    ] {
        let t = Instant::now();
        let err = app.infer(body).await.unwrap_err();
        assert!(err.is::<OutOfMemory>(), "{body}: {err}");
        assert!(err.to_string().contains(why), "{body}: {err}");
        assert!(t.elapsed() < Duration::from_secs(30), "{body}");
    }
    assert!(budget.stats().refusals > 0);
    assert!(budget.stats().peak_committed <= 24 << 20);
    // Over HTTP: 507 and the reason, then the next request is served.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, app, async {
        let _ = stopped.await;
    }));
    let (status, text) = post(port, "det 1x3x640x640 3").await;
    assert_eq!(status, 507, "{text}");
    assert!(text.contains("out of memory"), "{text}");
    let (status, text) = post(port, "det 1x3x160x160 2").await;
    assert_eq!(status, 200, "{text}");
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

/// Posts `body` to the server's `/infer`; its status and text.
async fn post(port: u16, body: &'static str) -> (u16, String) {
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let io = hyper_util::rt::TokioIo::new(tcp);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::post("/infer")
        .header("host", "127.0.0.1")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let res = sender.send_request(req).await.unwrap();
    let status = res.status().as_u16();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}
