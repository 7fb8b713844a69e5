//! The trace reader against the shared ONNX traces and their reference
//! figures, and against malformed input.

use std::path::PathBuf;

use tensor_arena::trace::{Event, Lifetime, Trace, TraceError, TraceErrorKind, TraceRun};

/// The traces in the repository (`traces/`, a copy of the shared ONNX traces).
pub(crate) const TRACES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../traces");

/// One line of REFERENCE.md's "Exact bytes per shape" lists.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reference {
    /// Trace file name prefix (the model).
    pub model: &'static str,
    /// Run label (the input shape).
    pub shape: &'static str,
    /// Allocations per run (the `allocs` column).
    pub allocs: usize,
    /// Max bytes live at once.
    pub lower_bound: u64,
    /// Greedy-by-size footprint.
    pub greedy: u64,
    /// Greedy-by-size footprint with every size rounded up to 64.
    pub greedy64: u64,
    /// Sum of all sizes.
    pub naive: u64,
}

const fn reference(
    model: &'static str,
    shape: &'static str,
    allocs: usize,
    [lower_bound, greedy, greedy64, naive]: [u64; 4],
) -> Reference {
    Reference {
        model,
        shape,
        allocs,
        lower_bound,
        greedy,
        greedy64,
        naive,
    }
}

/// Copied from `traces/REFERENCE.md` (external ground truth:
/// computed by the trace generator, not by this crate).
pub(crate) const REFERENCE: &[Reference] = &[
    reference(
        "ppocr-cls",
        "1x3x48x192",
        239,
        [485376, 509952, 509952, 13274276],
    ),
    reference(
        "ppocr-cls",
        "6x3x48x192",
        239,
        [2912256, 3059712, 3059712, 79645276],
    ),
    reference(
        "ppocr-cls",
        "16x3x48x192",
        239,
        [7766016, 8159232, 8159232, 212387276],
    ),
    reference(
        "ppocr-cls",
        "32x3x48x192",
        239,
        [15532032, 16318464, 16318464, 424774476],
    ),
    reference(
        "ppocr-cls",
        "3x3x48x192",
        239,
        [1456128, 1529856, 1529856, 39822676],
    ),
    reference("silero-vad", "1x576", 29, [9804, 9804, 9920, 39612]),
    reference(
        "silero-vad",
        "31x576",
        29,
        [303924, 303924, 304000, 1197252],
    ),
    reference(
        "silero-vad",
        "313x576",
        29,
        [3068652, 3068652, 3068736, 12079068],
    ),
    reference(
        "silero-vad",
        "938x576",
        29,
        [9196152, 9196152, 9196288, 36196568],
    ),
    reference(
        "silero-vad",
        "1875x576",
        29,
        [18382500, 18382500, 18382528, 72353524],
    ),
    reference(
        "densenet121",
        "1x3x224x224",
        668,
        [8429568, 8830976, 8830976, 320482208],
    ),
    reference(
        "densenet121",
        "2x3x224x224",
        668,
        [16859136, 17661952, 17661952, 640964416],
    ),
    reference(
        "densenet121",
        "4x3x224x224",
        668,
        [33718272, 35323904, 35323904, 1281928832],
    ),
    reference(
        "densenet121",
        "8x3x224x224",
        668,
        [67436544, 70647808, 70647808, 2563857664],
    ),
    reference(
        "densenet121",
        "16x3x224x224",
        668,
        [134873088, 141295616, 141295616, 5127715328],
    ),
];

/// Every `.trace` file of the shared folder, sorted by name (asserts the
/// folder exists and is not empty).
pub(crate) fn trace_files() -> Vec<PathBuf> {
    let dir = PathBuf::from(TRACES);
    assert!(dir.is_dir(), "shared traces not found at {}", dir.display());
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "trace"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 16,
        "expected the 16 shared traces, found {}",
        files.len()
    );
    files
}

/// The reference line of a run of the trace file `path`.
pub(crate) fn reference_for(trace: &Trace, run: &TraceRun) -> &'static Reference {
    let model = trace
        .model
        .as_deref()
        .expect("shared traces name their model");
    REFERENCE
        .iter()
        .find(|r| r.model == model && r.shape == run.label)
        .unwrap_or_else(|| panic!("no reference for {model} {}", run.label))
}

#[test]
fn shared_traces_match_reference_bytes() {
    let mut runs = 0;
    for path in trace_files() {
        let trace = Trace::from_file(&path).unwrap();
        assert_eq!(trace.inputs.len(), trace.runs.len(), "{}", path.display());
        for (run, input) in trace.runs.iter().zip(&trace.inputs) {
            let expected = reference_for(&trace, run);
            let name = format!("{} run {}", path.display(), run.label);
            assert_eq!(&run.label, input, "{name}");
            assert_eq!(run.allocs(), expected.allocs, "{name}: allocs");
            assert_eq!(
                run.lower_bound(),
                expected.lower_bound,
                "{name}: lower bound"
            );
            assert_eq!(run.naive(), expected.naive, "{name}: naive");
            runs += 1;
        }
    }
    // 5 + 5 + 4 single-run files, and mixed files of 6, 7 and 7 runs.
    assert_eq!(runs, 14 + 6 + 7 + 7);
}

#[test]
fn shared_traces_round_trip() {
    for path in trace_files() {
        let trace = Trace::from_file(&path).unwrap();
        let text = trace.to_string();
        let mut written = Vec::new();
        trace.write(&mut written).unwrap();
        assert_eq!(String::from_utf8(written).unwrap(), text);
        let again = Trace::parse(&text).unwrap();
        assert_eq!(again, trace, "{}", path.display());
    }
}

#[test]
fn lifetimes_are_event_index_intervals() {
    let trace = Trace::parse("run a\nalloc 0 10\nalloc 1 20\nfree 0\nalloc 2 30\nfree 2\nfree 1\n")
        .unwrap();
    let run = &trace.runs[0];
    let expected = [
        Lifetime {
            size: 10,
            start: 0,
            end: 2,
        },
        Lifetime {
            size: 20,
            start: 1,
            end: 5,
        },
        Lifetime {
            size: 30,
            start: 3,
            end: 4,
        },
    ];
    assert_eq!(run.lifetimes(), expected);
    assert_eq!(run.allocs(), 3);
    assert_eq!(run.lower_bound(), 50);
    assert_eq!(run.naive(), 60);
    assert_eq!(trace.model, None);
    assert!(trace.inputs.is_empty());
}

#[test]
fn outputs_overlap_inputs_that_die_at_their_node() {
    // alloc 1 comes before free 0: both live at event 1.
    let trace = Trace::parse("run a\nalloc 0 100\nalloc 1 100\nfree 0\nfree 1\n").unwrap();
    assert_eq!(trace.runs[0].lower_bound(), 200);
    // free 0 before alloc 1: never both live.
    let trace = Trace::parse("run a\nalloc 0 100\nfree 0\nalloc 1 100\nfree 1\n").unwrap();
    assert_eq!(trace.runs[0].lower_bound(), 100);
}

#[test]
fn header_comments_and_blank_lines() {
    let text = "# trace v1 model=m input=1x2,3x4 future=ok\n\n# comment\n   \nrun 1x2\n# inside\nalloc 0 5\nfree 0\nrun 3x4\n";
    let trace = Trace::parse(text).unwrap();
    assert_eq!(trace.model.as_deref(), Some("m"));
    assert_eq!(trace.inputs, ["1x2", "3x4"]);
    assert_eq!(trace.runs.len(), 2);
    assert_eq!(trace.runs[1].events, []);
    assert_eq!(
        trace.runs[0].events,
        [Event::Alloc { id: 0, bytes: 5 }, Event::Free { id: 0 }]
    );
    // No header at all, and a first-line comment that is not a header.
    assert!(Trace::parse("run a\nalloc 0 1\nfree 0\n")
        .unwrap()
        .model
        .is_none());
    assert!(Trace::parse("# tracer output\nrun a\n").is_ok());
    // A later "# trace v2" line is an ordinary comment.
    assert!(Trace::parse("run a\n# trace v2\n").is_ok());
    // Empty input, CRLF line ends.
    assert_eq!(Trace::parse("").unwrap(), Trace::default());
    assert_eq!(
        Trace::parse("run a\r\nalloc 0 1\r\nfree 0\r\n")
            .unwrap()
            .runs[0]
            .events
            .len(),
        2
    );
}

#[test]
fn write_rejects_what_cannot_be_read_back() {
    let mut trace = Trace::parse("run a\n").unwrap();
    trace.runs[0].label = "two words".into();
    let err = trace.write(&mut Vec::new()).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    trace.runs[0].label = String::new();
    assert!(trace.write(&mut Vec::new()).is_err());
    trace.runs[0].label = "ok".into();
    trace.inputs = vec!["1,2".into()];
    assert!(trace.write(&mut Vec::new()).is_err());
    trace.inputs = vec![];
    trace.model = Some("a b".into());
    assert!(trace.write(&mut Vec::new()).is_err());
    trace.model = Some(String::new());
    let mut out = Vec::new();
    trace.write(&mut out).unwrap();
    assert_eq!(
        Trace::parse(std::str::from_utf8(&out).unwrap()).unwrap(),
        trace
    );
}

/// Parses `text`, expecting an error at `line`; returns its kind.
fn error_at(text: &str, line: usize) -> TraceErrorKind {
    let err: TraceError = Trace::parse(text).unwrap_err();
    assert_eq!(err.line(), Some(line), "{err}");
    assert!(
        err.to_string().starts_with(&format!("line {line}: ")),
        "{err}"
    );
    assert!(err.path().is_none());
    err.into_kind()
}

#[test]
fn header_errors() {
    let kind = error_at("# trace v2 model=m\nrun a\n", 1);
    assert!(matches!(kind, TraceErrorKind::UnsupportedVersion(v) if v == "v2"));
    let kind = error_at("# trace\n", 1);
    assert!(matches!(kind, TraceErrorKind::BadHeader(_)));
    let kind = error_at("# trace v1 model\n", 1);
    assert!(matches!(kind, TraceErrorKind::BadHeader(_)));
    let kind = error_at("# trace v1 input=1x2,,3\n", 1);
    assert!(matches!(kind, TraceErrorKind::BadHeader(_)));
}

#[test]
fn keyword_and_field_errors() {
    let kind = error_at("run a\nalloc 0 1\nmalloc 1 2\n", 3);
    assert!(matches!(kind, TraceErrorKind::UnknownKeyword(k) if k == "malloc"));
    let kind = error_at("run\n", 1);
    assert!(matches!(
        kind,
        TraceErrorKind::MissingField {
            keyword: "run",
            field: "label"
        }
    ));
    let kind = error_at("run a b\n", 1);
    assert!(matches!(kind, TraceErrorKind::ExtraField { keyword: "run", found } if found == "b"));
    let kind = error_at("run a\nalloc 0\n", 2);
    assert!(matches!(
        kind,
        TraceErrorKind::MissingField {
            keyword: "alloc",
            field: "bytes"
        }
    ));
    let kind = error_at("run a\nalloc\n", 2);
    assert!(matches!(
        kind,
        TraceErrorKind::MissingField {
            keyword: "alloc",
            field: "id"
        }
    ));
    let kind = error_at("run a\nalloc 0 1 2\n", 2);
    assert!(matches!(kind, TraceErrorKind::ExtraField { keyword: "alloc", found } if found == "2"));
    let kind = error_at("run a\nalloc 0 1\nfree\n", 3);
    assert!(matches!(
        kind,
        TraceErrorKind::MissingField {
            keyword: "free",
            field: "id"
        }
    ));
    let kind = error_at("run a\nalloc 0 1\nfree 0 0\n", 3);
    assert!(matches!(
        kind,
        TraceErrorKind::ExtraField {
            keyword: "free",
            ..
        }
    ));
}

#[test]
fn number_errors() {
    let kind = error_at("run a\nalloc x 1\n", 2);
    assert!(matches!(kind, TraceErrorKind::BadNumber { field: "id", found } if found == "x"));
    let kind = error_at("run a\nalloc 0 -1\n", 2);
    assert!(matches!(
        kind,
        TraceErrorKind::BadNumber { field: "bytes", .. }
    ));
    let kind = error_at("run a\nalloc 0 +1\n", 2);
    assert!(matches!(
        kind,
        TraceErrorKind::BadNumber { field: "bytes", .. }
    ));
    let kind = error_at("run a\nalloc 0 1.5\n", 2);
    assert!(matches!(
        kind,
        TraceErrorKind::BadNumber { field: "bytes", .. }
    ));
    let kind = error_at("run a\nalloc 0 18446744073709551616\n", 2);
    assert!(matches!(
        kind,
        TraceErrorKind::BadNumber { field: "bytes", .. }
    ));
    let kind = error_at("run a\nalloc 0 1\nfree 0x0\n", 3);
    assert!(matches!(
        kind,
        TraceErrorKind::BadNumber { field: "id", .. }
    ));
    let kind = error_at("run a\nalloc 7 0\n", 2);
    assert!(matches!(kind, TraceErrorKind::ZeroBytes { id: 7 }));
    // The largest u64 is accepted.
    let trace = Trace::parse("run a\nalloc 18446744073709551615 18446744073709551615\nalloc 1 1\nfree 1\nfree 18446744073709551615\n").unwrap();
    assert_eq!(trace.runs[0].lower_bound(), u64::MAX);
    assert_eq!(trace.runs[0].naive(), u64::MAX);
}

#[test]
fn lifetime_errors() {
    let kind = error_at("# c\nalloc 0 1\n", 2);
    assert!(matches!(
        kind,
        TraceErrorKind::OutsideRun { keyword: "alloc" }
    ));
    let kind = error_at("free 0\n", 1);
    assert!(matches!(
        kind,
        TraceErrorKind::OutsideRun { keyword: "free" }
    ));
    let kind = error_at("run a\nalloc 3 1\nalloc 3 2\n", 3);
    assert!(matches!(
        kind,
        TraceErrorKind::DuplicateId {
            id: 3,
            first_line: 2
        }
    ));
    // Never reused within a run, even after a free.
    let kind = error_at("run a\nalloc 3 1\nfree 3\nalloc 3 2\n", 4);
    assert!(matches!(
        kind,
        TraceErrorKind::DuplicateId {
            id: 3,
            first_line: 2
        }
    ));
    let kind = error_at("run a\nalloc 0 1\nfree 1\n", 3);
    assert!(matches!(kind, TraceErrorKind::UnknownFree { id: 1 }));
    let kind = error_at("run a\nalloc 0 1\nfree 0\nfree 0\n", 4);
    assert!(matches!(
        kind,
        TraceErrorKind::DoubleFree {
            id: 0,
            freed_line: 3
        }
    ));
    // Ids are per run: freeing an id of the previous run is unknown.
    let kind = error_at("run a\nalloc 0 1\nfree 0\nrun b\nfree 0\n", 5);
    assert!(matches!(kind, TraceErrorKind::UnknownFree { id: 0 }));
    // Ids restart in every run.
    assert!(Trace::parse("run a\nalloc 0 1\nfree 0\nrun b\nalloc 0 1\nfree 0\n").is_ok());
}

#[test]
fn unfreed_tensors_are_reported_at_their_alloc() {
    // At the next run line...
    let kind = error_at("run a\nalloc 0 1\nalloc 1 1\nalloc 2 1\nfree 0\nrun b\n", 3);
    assert!(matches!(kind, TraceErrorKind::Unfreed { id: 1, run, live: 2 } if run == "a"));
    // ...and at the end of the file.
    let kind = error_at("run a\nalloc 0 1\nfree 0\nrun b\nalloc 9 4\n", 5);
    assert!(matches!(kind, TraceErrorKind::Unfreed { id: 9, run, live: 1 } if run == "b"));
}

#[test]
fn file_errors_carry_the_path() {
    let missing = PathBuf::from(TRACES).join("no-such-file.trace");
    let err = Trace::from_file(&missing).unwrap_err();
    assert!(matches!(err.kind(), TraceErrorKind::Io(_)));
    assert_eq!(err.path(), Some(missing.as_path()));
    assert_eq!(err.line(), None);
    assert!(std::error::Error::source(&err).is_some());
    assert!(err.to_string().contains("no-such-file.trace"), "{err}");

    let path = std::env::temp_dir().join(format!("tensor-arena-bad-{}.trace", std::process::id()));
    std::fs::write(&path, "# trace v1\nrun a\nalloc 0 1\nfree 2\n").unwrap();
    let err = Trace::from_file(&path).unwrap_err();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(err.line(), Some(4));
    assert_eq!(err.path(), Some(path.as_path()));
    assert_eq!(
        err.to_string(),
        format!(
            "{}:4: free of id 2, never allocated in this run",
            path.display()
        )
    );
}

#[test]
fn hand_built_runs_do_not_panic() {
    let run = TraceRun {
        label: "bad".into(),
        events: vec![
            Event::Free { id: 5 },
            Event::Alloc { id: 1, bytes: 10 },
            Event::Alloc { id: 1, bytes: 20 },
            Event::Free { id: 1 },
            Event::Alloc {
                id: 2,
                bytes: u64::MAX,
            },
        ],
    };
    let lifetimes = run.lifetimes();
    assert_eq!(lifetimes.len(), 3);
    assert_eq!(
        lifetimes[0],
        Lifetime {
            size: 10,
            start: 1,
            end: 5
        }
    );
    assert_eq!(
        lifetimes[1],
        Lifetime {
            size: 20,
            start: 2,
            end: 3
        }
    );
    assert_eq!(run.lower_bound(), u64::MAX);
    assert_eq!(run.naive(), u64::MAX);
    assert_eq!(run.allocs(), 3);
}

#[test]
fn a_live_arena_records_its_runs_as_a_trace_that_replays_the_same() {
    use tensor_arena::{Arena, ArenaConfig};
    let original = Trace::from_file(PathBuf::from(TRACES).join("silero-vad-mixed.trace")).unwrap();
    let arena = Arena::new(ArenaConfig::default());
    arena.record_trace(true);
    let first = original.replay(&arena).unwrap();
    let recorded = arena.take_trace();
    assert_eq!(recorded.runs.len(), original.runs.len());
    for (r, o) in recorded.runs.iter().zip(&original.runs) {
        assert_eq!(r.label, o.label);
        assert_eq!(r.allocs(), o.allocs());
        assert_eq!(r.lower_bound(), o.lower_bound());
        assert_eq!(r.lifetimes(), o.lifetimes());
    }
    // Written out and read back, it drives another arena the same way.
    let text = recorded.to_string();
    let again = Trace::parse(&text).unwrap();
    let other = Arena::new(ArenaConfig::default());
    let second = again.replay(&other).unwrap();
    let hw = |v: &[tensor_arena::RunReport]| v.iter().map(|r| r.high_water).collect::<Vec<_>>();
    assert_eq!(hw(&first), hw(&second));
    arena.record_trace(false);
    assert!(arena.take_trace().runs.is_empty());
}

/// A trace started while a run is open leaves that run out (its first
/// blocks were not traced) and takes the next one whole, with the bytes
/// each block asked for.
#[test]
fn a_trace_started_inside_a_run_takes_the_next_run_whole() {
    use tensor_arena::{Arena, ArenaConfig};
    let arena = Arena::new(ArenaConfig::default());
    let r = arena.begin_run();
    let a = r.try_alloc(1000).unwrap();
    arena.record_trace(true);
    let b = r.try_alloc(3000).unwrap();
    drop((a, b));
    r.finish();
    assert!(
        arena.take_trace().runs.is_empty(),
        "the open run is left out"
    );
    let r = arena.begin_run();
    let a = r.try_alloc(1000).unwrap();
    let b = r.try_alloc(3000).unwrap();
    drop((a, b));
    r.finish();
    let trace = arena.take_trace();
    assert_eq!(trace.runs.len(), 1);
    let bytes: Vec<u64> = trace.runs[0]
        .events
        .iter()
        .filter_map(|e| match *e {
            tensor_arena::trace::Event::Alloc { bytes, .. } => Some(bytes),
            _ => None,
        })
        .collect();
    assert_eq!(bytes, [1000, 3000]);
}
