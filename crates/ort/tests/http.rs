//! The HTTP inference server example (`examples/http_ocr.rs`) under load on
//! loopback, briefly: 8 clients send the OCR stream's first det and rec
//! requests to the server that adopted the arena and to the same server
//! without it (ONNX Runtime's defaults); nothing fails, the answers (hashes
//! of every output's bits) are identical, and every run was served by the
//! arena (the server refuses a run that was not). The full measurement is
//! `http_ocr bench` (`BENCHMARKS.md`, "Servers").

#[allow(dead_code)]
#[path = "all/common.rs"]
mod common;

#[allow(dead_code)]
#[path = "../examples/http_ocr.rs"]
mod http_ocr;

use http_ocr::{load, serve, App, Mem};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_server_under_load_answers_as_onnx_runtime_does() {
    let dir = common::assets();
    const REQUESTS: usize = 24;
    let mut digests = Vec::new();
    for mem in [Mem::Ort, Mem::Arena] {
        let app = App::new(dir, mem, 2).unwrap();
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, app, async {
            let _ = stopped.await;
        }));
        let before = tensor_arena_ort::allocator_counters();
        let report = load(port, 8, REQUESTS, Duration::from_secs(120)).await;
        let after = tensor_arena_ort::allocator_counters();
        assert_eq!(report.failed(), 0, "{mem:?}: {:?}", report.answers);
        assert_eq!(report.latencies.len(), REQUESTS);
        if mem == Mem::Arena {
            assert!(after.alloc_calls > before.alloc_calls);
            assert_eq!(
                after.system_bytes, before.system_bytes,
                "the system allocator served tensors"
            );
        }
        digests.push((report.outputs_digest(), report.answers));
        let _ = stop.send(());
        server.await.unwrap().unwrap();
    }
    assert!(
        digests[0] == digests[1],
        "the arena's answers differ from ONNX Runtime's"
    );
    // A bad request is a clear 400, not a crash.
    let app = App::new(dir, Mem::Arena, 1).unwrap();
    let err = app.infer("det 1x3xbad 1").await.unwrap_err();
    assert!(err.to_string().contains("shape"), "{err}");
    let err = app.infer("cls 1x3x48x192 1").await.unwrap_err();
    assert!(err.to_string().contains("det or rec"), "{err}");
}
