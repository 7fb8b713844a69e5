//! Bad input gives a clear error, never a crash. (A library older than 1.31
//! is checked through the CLI: a process loads ONNX Runtime once.)

use crate::common::*;
use tensor_arena_ort::{ArenaOptions, ArenaSession, OrtArenaError, Runtime};

#[test]
fn missing_library() {
    let err = Runtime::load("/nonexistent/libonnxruntime.so").unwrap_err();
    assert!(
        matches!(err, OrtArenaError::LibraryNotFound { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("/nonexistent/libonnxruntime.so"));
}

#[test]
fn a_file_that_is_not_a_library() {
    let dir = std::env::temp_dir().join(format!("ta-ort-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fake = dir.join("libonnxruntime.so");
    std::fs::write(&fake, b"not a shared library").unwrap();
    // In a process that already loaded the real library, any other file is
    // refused as such; in a fresh one, the loader refuses it.
    let _ = runtime();
    let err = Runtime::load(&fake).unwrap_err();
    assert!(
        matches!(
            err,
            OrtArenaError::AlreadyLoaded { .. } | OrtArenaError::Library { .. }
        ),
        "{err:?}"
    );
}

#[test]
fn missing_and_corrupt_models() {
    let err = ArenaSession::open(
        runtime(),
        "/nonexistent/model.onnx",
        ArenaOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(err, OrtArenaError::ModelNotFound { .. }),
        "{err:?}"
    );
    let dir = std::env::temp_dir().join(format!("ta-ort-model-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("corrupt.onnx");
    let mut bytes = std::fs::read(model("ppocr_cls.onnx")).unwrap();
    bytes.truncate(bytes.len() / 3);
    std::fs::write(&bad, &bytes).unwrap();
    let err = ArenaSession::open(runtime(), &bad, ArenaOptions::default()).unwrap_err();
    assert!(matches!(err, OrtArenaError::Model { .. }), "{err:?}");
    std::fs::write(&bad, b"garbage").unwrap();
    let err = ArenaSession::open(runtime(), &bad, ArenaOptions::default()).unwrap_err();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(matches!(err, OrtArenaError::Model { .. }), "{err:?}");
}

#[test]
fn wrong_rank_unknown_and_missing_inputs() {
    let session =
        ArenaSession::open(runtime(), model("ppocr_cls.onnx"), ArenaOptions::default()).unwrap();
    let mut worker = session.worker().unwrap();
    let spec = &session.inputs()[0];
    // The generator refuses a wrong rank before any tensor is made.
    let err = tensor_arena_ort::make_input(spec, &[3, 48, 192], 0).unwrap_err();
    assert!(matches!(err, OrtArenaError::BadShape { .. }), "{err:?}");
    // A tensor of the wrong rank given to a run.
    let rank3 = tensor_arena_ort::ort::value::Tensor::from_array((
        vec![3i64, 48, 192],
        vec![0f32; 3 * 48 * 192],
    ))
    .unwrap()
    .into_dyn();
    let err = worker.run(&[("x", &rank3)]).unwrap_err();
    assert!(matches!(err, OrtArenaError::BadShape { .. }), "{err:?}");
    assert!(err.to_string().contains("rank 4"), "{err}");
    // A fixed dimension that does not match (3 channels).
    let x = tensor_arena_ort::ort::value::Tensor::from_array((
        vec![1i64, 4, 48, 192],
        vec![0f32; 4 * 48 * 192],
    ))
    .unwrap()
    .into_dyn();
    assert!(matches!(
        worker.run(&[("x", &x)]),
        Err(OrtArenaError::BadShape { .. })
    ));
    let good = tensor_arena_ort::make_input(spec, &[1, 3, 48, 192], 0).unwrap();
    let err = worker.run(&[("x", &good), ("y", &good)]).unwrap_err();
    assert!(
        matches!(err, OrtArenaError::UnknownInput { ref name, .. } if name == "y"),
        "{err:?}"
    );
    let err = worker.run(&[]).unwrap_err();
    assert!(matches!(err, OrtArenaError::MissingInput { .. }), "{err:?}");
    // The wrong element type: ONNX Runtime's error, as an `Err`.
    let ints = tensor_arena_ort::ort::value::Tensor::from_array((
        vec![1i64, 3, 48, 192],
        vec![0i64; 3 * 48 * 192],
    ))
    .unwrap()
    .into_dyn();
    let err = worker.run(&[("x", &ints)]).unwrap_err();
    assert!(matches!(err, OrtArenaError::Ort(_)), "{err:?}");
    assert_eq!(worker.stats().in_use, 0);
    // And the worker still works after the errors.
    worker.run(&[("x", &good)]).unwrap();
}

#[test]
fn an_arena_over_its_cap_sends_the_rest_to_the_system_allocator() {
    // ONNX Runtime may crash on a null from `Alloc`, so a cap cannot fail
    // the run: what does not fit goes to the system allocator, counted.
    let options = ArenaOptions {
        arena: tensor_arena::ArenaConfig {
            max_reserved: 1 << 20,
            ..tensor_arena::ArenaConfig::default()
        },
        ..ArenaOptions::default()
    };
    let session = ArenaSession::open(runtime(), model("ppocr_rec.onnx"), options).unwrap();
    let runs = vec![inputs(session.inputs(), &[("x", &[1, 3, 48, 640])], 0)];
    let expected = plain_bits("ppocr_rec.onnx", &runs);
    let mut worker = session.worker().unwrap();
    for _ in 0..2 {
        let input: Vec<(&str, &tensor_arena_ort::ort::value::DynValue)> =
            runs[0].iter().map(|(n, v)| (n.as_str(), v)).collect();
        let out = worker.run(&input).unwrap();
        assert!(
            out.refused_allocs > 0 && out.refused_allocs < out.alloc_calls,
            "{out:?}"
        );
        assert_eq!(out.alloc_calls - out.refused_allocs, out.report.allocs);
        assert!(bits(out.outputs.iter().map(|(n, v)| (n.as_str(), v))) == expected[0]);
        drop(out);
        let stats = worker.stats();
        assert_eq!((stats.in_use, stats.live_blocks), (0, 0));
        assert!(stats.reserved <= 1 << 20);
    }
}

#[test]
fn the_pypi_librarys_providers_are_the_cpus() {
    // The PyPI `onnxruntime` wheel's library: the CPU's provider (and
    // Azure's), no CUDA. The Python module makes a CPU session, with
    // onnxruntime's warning, from a list naming the CPU and a provider
    // missing here.
    let providers = runtime().available_providers().unwrap();
    assert!(
        providers.iter().any(|p| p == "CPUExecutionProvider"),
        "{providers:?}"
    );
    assert!(
        !providers.iter().any(|p| p == "CUDAExecutionProvider"),
        "{providers:?}"
    );
}
