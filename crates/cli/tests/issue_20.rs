//! Issue 20: `tensor-arena ort` on real models (the library and models of
//! `tools/fetch-ort-assets.sh`) and tiny models built here with the `onnx`
//! Python package (installed from PyPI into a virtual environment under
//! the target directory when missing; without Python the tests fail, they
//! do not skip). One test per defect: the RSS of every row read while the
//! workers hold their arenas, a peak per run, memory-layer calls counted,
//! plain error messages, ONNX Runtime's log once and without colour,
//! progress on stderr, the JSON's model/threads/outputs_identical, input
//! values from `--value`, and `tools/onnx-free-batch.py` freeing constant
//! Reshape targets.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;

#[allow(dead_code)]
#[path = "support/ort_assets.rs"]
mod ort_assets;

use ort_assets::{asset, assets, root, BIN};

/// Runs `tensor-arena ort` with the fetched library and extra variables.
fn ort_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.arg("ort")
        .args(args)
        .env("ORT_DYLIB_PATH", asset("libonnxruntime.so"))
        .env_remove("ORT_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run tensor-arena")
}

fn ort(args: &[&str]) -> Output {
    ort_env(args, &[])
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `--json` output of a successful command.
fn json_env(args: &[&str], env: &[(&str, &str)]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let out = ort_env(&all, env);
    assert!(
        out.status.success(),
        "{all:?}: {}\n{}",
        out.status,
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON document")
}

fn json(args: &[&str]) -> Value {
    json_env(args, &[])
}

fn runs<'a>(doc: &'a Value, strategy: &str) -> &'a Vec<Value> {
    doc["strategies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["strategy"] == strategy)
        .unwrap_or_else(|| panic!("no strategy {strategy} in {doc}"))["runs"]
        .as_array()
        .unwrap()
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

const MIB: u64 = 1 << 20;

/// Defect 1: the last row used to be measured while the workers dropped
/// their arenas. The test hook makes the child wait 300 ms after each run
/// before it measures: workers that were not parked would have given their
/// arenas back by then. Two identical runs hold the same memory, so their
/// rows agree, and both include what the arena holds.
#[test]
fn every_row_is_measured_while_the_workers_hold_their_arenas() {
    let det = asset("ppocr_det.onnx");
    for threads in ["1", "2"] {
        let doc = json_env(
            &[
                "--model",
                &det,
                "--inputs",
                "1x3x640x640",
                "1x3x640x640",
                "--strategies",
                "arena",
                "--threads",
                threads,
            ],
            &[("TENSOR_ARENA_TEST_ORT_MEASURE_DELAY_MS", "300")],
        );
        let s = &doc["strategies"][0];
        let session = u(&s["session_rss_bytes"]);
        let rows = runs(&doc, "arena");
        let reserved = u(&rows[1]["reserved"]);
        assert!(reserved > 20 * MIB, "{doc}");
        for r in rows {
            assert!(
                u(&r["rss_bytes"]) >= session + reserved * 3 / 4,
                "threads {threads}: a row without the arenas' memory: {r} (session {session}, reserved {reserved})"
            );
        }
        let (a, b) = (u(&rows[0]["rss_bytes"]), u(&rows[1]["rss_bytes"]));
        assert!(
            a.abs_diff(b) < reserved / 4,
            "threads {threads}: two identical runs, RSS {a} and {b}"
        );
    }
}

/// Whether this process may reset its peak RSS (as the child will).
fn can_reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Defect 2: each run has its own peak. A small run after a large one
/// under ONNX Runtime without its arena (malloc gives the large tensors
/// back: a fixed mmap threshold, so glibc does not keep them in its heap)
/// peaks well below the large one; the process's cumulative peak would
/// not.
#[test]
fn each_run_has_its_own_peak() {
    let det = asset("ppocr_det.onnx");
    let doc = json_env(
        &[
            "--model",
            &det,
            "--inputs",
            "1x3x640x640",
            "1x3x64x64",
            "--strategies",
            "ort-no-arena",
        ],
        &[("MALLOC_MMAP_THRESHOLD_", "65536")],
    );
    let s = &doc["strategies"][0];
    let rows = runs(&doc, "ort-no-arena");
    for r in rows {
        assert!(u(&r["peak_rss_bytes"]) >= u(&r["rss_bytes"]), "{r}");
    }
    if can_reset_peak() {
        assert_eq!(s["peak_rss_per_run"], true, "{s}");
        assert!(s.get("peak_rss_note").is_none(), "{s}");
        let (big, small) = (u(&rows[0]["peak_rss_bytes"]), u(&rows[1]["peak_rss_bytes"]));
        assert!(
            small + 10 * MIB < big,
            "the small run's peak {small} is not its own (the large run's: {big})"
        );
        assert!(u(&s["process_peak_rss_bytes"]) >= big, "{s}");
    } else {
        // Said in the report, not silently cumulative.
        assert_eq!(s["peak_rss_per_run"], false, "{s}");
        assert!(
            s["peak_rss_note"]
                .as_str()
                .unwrap()
                .contains("/proc/self/clear_refs"),
            "{s}"
        );
    }
}

/// Defect 3: the column counted reservations only, and stayed 0 while the
/// arena grew by commits. Every change of what an arena holds is a call
/// to its memory layer.
#[test]
fn memory_calls_count_commits_and_decommits() {
    let det = asset("ppocr_det.onnx");
    let doc = json(&[
        "--model",
        &det,
        "--inputs",
        "1x3x64x64",
        "1x3x256x256",
        "1x3x640x640",
        "1x3x64x64",
        "--strategies",
        "arena,planned",
    ]);
    for strategy in ["arena", "planned"] {
        let mut before = 0;
        let mut changes = 0;
        for r in runs(&doc, strategy) {
            let reserved = u(&r["reserved"]);
            if reserved != before {
                changes += 1;
                assert!(
                    u(&r["backing_calls"]) > 0,
                    "{strategy}: reserved went from {before} to {reserved} with no memory call: {r}"
                );
            }
            before = reserved;
        }
        assert!(changes >= 3, "{strategy}: the arena should grow: {doc}");
    }
}

/// The Python interpreter of a virtual environment with the `onnx`
/// package: `TENSOR_ARENA_ONNX_PYTHON` if set, else one made (once, under
/// a lock) in the target directory with pip, the `onnx` wheel from the
/// assets' cache when it is there.
fn onnx_python() -> &'static Path {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        if let Some(p) = std::env::var_os("TENSOR_ARENA_ONNX_PYTHON") {
            return PathBuf::from(p);
        }
        let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("onnx-python");
        let script = r#"set -eu
venv="$1"; wheels="$2"
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if ! "$venv/bin/python" -c 'import onnx' 2>/dev/null; then
  python=python3; command -v python3 >/dev/null || python=python
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check \
    --find-links "$wheels" onnx==1.19.1
fi"#;
        let out = Command::new("bash")
            .arg("-c")
            .arg(script)
            .arg("onnx-python")
            .arg(&venv)
            .arg(assets().join("wheels"))
            .output()
            .expect("cannot run bash");
        assert!(
            out.status.success(),
            "cannot make a Python environment with the onnx package in {}: {}",
            venv.display(),
            text(&out.stderr)
        );
        venv.join("bin/python")
    })
}

/// Runs `code` with the onnx Python; `args` become `sys.argv[1:]`.
fn python(code: &str, args: &[&str]) -> Output {
    Command::new(onnx_python())
        .arg("-c")
        .arg(code)
        .args(args)
        .output()
        .expect("run python")
}

/// Builds the tiny models of these tests in `dir`.
fn tiny_models(dir: &Path) {
    let code = r#"
import sys, onnx
from onnx import helper as h, TensorProto as T
d = sys.argv[1]
def save(name, nodes, ins, outs, inits=()):
    m = h.make_model(h.make_graph(nodes, name, ins, outs, list(inits)),
                     opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, f"{d}/{name}.onnx")
x = h.make_tensor_value_info("x", T.FLOAT, [1, 3, 4, 4])
# A constant Reshape target that repeats the batch, as an initializer and
# as a Constant node; one that already infers a dimension.
save("reshape_init", [h.make_node("Reshape", ["x", "shape"], ["r"], name="flatten"),
                      h.make_node("Relu", ["r"], ["y"])],
     [x], [h.make_tensor_value_info("y", T.FLOAT, [1, 48])],
     [h.make_tensor("shape", T.INT64, [2], [1, 48])])
save("reshape_const", [h.make_node("Constant", [], ["shape"], name="c",
                                   value=h.make_tensor("v", T.INT64, [3], [1, 3, 16])),
                       h.make_node("Reshape", ["x", "shape"], ["y"], name="split")],
     [x], [h.make_tensor_value_info("y", T.FLOAT, [1, 3, 16])])
save("reshape_ambiguous", [h.make_node("Reshape", ["x", "shape"], ["y"], name="amb")],
     [x], [h.make_tensor_value_info("y", T.FLOAT, [1, 3, 16])],
     [h.make_tensor("shape", T.INT64, [3], [1, -1, 16])])
# Types tensor-arena ort cannot fill or hash.
save("string_input", [h.make_node("Identity", ["x"], ["y"])],
     [h.make_tensor_value_info("x", T.STRING, ["N"])],
     [h.make_tensor_value_info("y", T.STRING, ["N"])])
save("string_output", [h.make_node("Cast", ["x"], ["y"], to=T.STRING)],
     [h.make_tensor_value_info("x", T.FLOAT, ["N"])],
     [h.make_tensor_value_info("y", T.STRING, ["N"])])
"#;
    let out = python(code, &[dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("issue-20-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Expects exit code 2, every needle in stderr, none of the `absent`
/// strings, and nothing on stdout.
fn refused(args: &[&str], needles: &[&str], absent: &[&str]) {
    let out = ort(args);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    for n in needles {
        assert!(stderr.contains(n), "{args:?}: expected {n:?} in: {stderr}");
    }
    for a in absent {
        assert!(!stderr.contains(a), "{args:?}: {a:?} in: {stderr}");
    }
    assert!(out.stdout.is_empty(), "{args:?}");
}

/// Defect 6: no Rust debug text in the messages, and an output is called
/// an output. Both are refused before anything runs (exit 2).
#[test]
fn unsupported_types_are_named_plainly() {
    let dir = scratch("types");
    tiny_models(&dir);
    let model = |n: &str| dir.join(n).to_string_lossy().into_owned();
    let (input, output) = (model("string_input.onnx"), model("string_output.onnx"));
    refused(
        &["--model", &input, "--inputs", "2"],
        &[
            "input \"x\" is a tensor of String",
            "generates inputs only for tensors of f32, f64, i64, i32, u8, i8 and bool",
        ],
        &["Some(", "FAILED"],
    );
    refused(
        &["--model", &output, "--inputs", "2"],
        &[
            "output \"y\" is a tensor of String",
            "the outputs are hashed to compare the strategies",
        ],
        &["Tensor {", "input \"y\"", "FAILED"],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Defects 7 and 8: a run ONNX Runtime fails (PP-OCR det on an image its
/// feature maps cannot add up for), stderr piped. The error is said once
/// per strategy (ONNX Runtime's own log of it is not repeated), with no
/// escape code; progress names every strategy and run as it ends; the
/// other run goes on. With `ORT_LOG=error` the log is there, once, and
/// without colour.
#[test]
fn errors_once_without_colour_and_progress_on_stderr() {
    let det = asset("ppocr_det.onnx");
    let args = [
        "--model",
        &det,
        "--inputs",
        "1x3x33x33",
        "1x3x64x64",
        "--strategies",
        "arena,ort-arena",
    ];
    let error = "Non-zero status code returned while running Add node";
    let out = ort(&args);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!out.stderr.contains(&0x1b), "an escape code: {stderr:?}");
    assert_eq!(stderr.matches(error).count(), 2, "{stderr}");
    for strategy in ["arena", "ort-arena"] {
        let failed = format!("FAILED: {strategy} run 0 (1x3x33x33): ONNX Runtime: {error}");
        assert_eq!(stderr.matches(&failed).count(), 1, "{stderr}");
        for line in [
            format!("[{strategy}] strategy "),
            format!("[{strategy}] session open ("),
            format!("[{strategy}] run 1/2 (1x3x33x33) FAILED after "),
            format!("[{strategy}] run 2/2 (1x3x64x64) done in "),
        ] {
            assert_eq!(stderr.matches(&line).count(), 1, "{line:?} in:\n{stderr}");
        }
    }
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("output hashes: identical across strategies (1 of 2 runs compared"),
        "{stdout}"
    );

    let out = ort_env(&args, &[("ORT_LOG", "error")]);
    let stderr = text(&out.stderr);
    assert!(!out.stderr.contains(&0x1b), "an escape code: {stderr:?}");
    // ONNX Runtime's log line and the report's line, per strategy.
    assert_eq!(stderr.matches("[E:onnxruntime:").count(), 2, "{stderr}");
    assert_eq!(stderr.matches(error).count(), 4, "{stderr}");
}

/// Defect 9: the JSON names the model and the settings and says whether
/// the outputs agree, `null` when nothing was compared; the text does not
/// claim agreement when one strategy ran.
#[test]
fn json_says_what_was_compared() {
    let cls = asset("ppocr_cls.onnx");
    let two = json(&[
        "--model",
        &cls,
        "--inputs",
        "1x3x48x192",
        "--strategies",
        "planned,ort-no-arena",
        "--threads",
        "2",
        "--intra-threads",
        "1",
    ]);
    assert_eq!(two["model"].as_str(), Some(cls.as_str()));
    assert_eq!(two["threads"].as_u64(), Some(2));
    assert_eq!(two["intra_threads"].as_u64(), Some(1));
    assert_eq!(two["outputs_identical"].as_bool(), Some(true));
    let one = json(&[
        "--model",
        &cls,
        "--inputs",
        "1x3x48x192",
        "--strategies",
        "planned",
    ]);
    assert!(one["outputs_identical"].is_null(), "{one}");
    let out = ort(&[
        "--model",
        &cls,
        "--inputs",
        "1x3x48x192",
        "--strategies",
        "arena",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success());
    assert!(
        stdout.contains("output hashes: one strategy ran (arena): nothing to compare")
            && !stdout.contains("identical"),
        "{stdout}"
    );
}

/// Defect 10: `--value` fills an input as asked. A constant input gives
/// the same outputs on every run (the default values change with the run);
/// a range gives values of its own; every strategy gets the same values.
#[test]
fn values_fill_inputs_as_asked() {
    let cls = asset("ppocr_cls.onnx");
    let base = [
        "--model",
        cls.as_str(),
        "--inputs",
        "1x3x48x192",
        "1x3x48x192",
        "--strategies",
        "planned,ort-arena",
    ];
    let hashes = |doc: &Value| -> Vec<String> {
        runs(doc, "planned")
            .iter()
            .map(|r| r["output_hash"].as_str().unwrap().to_string())
            .collect()
    };
    let with = |extra: &[&str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        let doc = json(&a);
        assert_eq!(doc["outputs_identical"].as_bool(), Some(true), "{doc}");
        hashes(&doc)
    };
    let default = with(&[]);
    assert_ne!(default[0], default[1]);
    let constant = with(&["--value", "x=0.5"]);
    assert_eq!(
        constant[0], constant[1],
        "a constant input, the same outputs"
    );
    assert_eq!(with(&["--value", "x=0.5:0.5"]), constant);
    let other = with(&["--value", "x=-0.5"]);
    assert_ne!(other[0], constant[0]);
    let range = with(&["--value", "x=0:1"]);
    assert_ne!(range[0], range[1]);
    assert!(!range.contains(&default[0]) && !range.contains(&constant[0]));
    assert_eq!(with(&["--value", "x=0:1"]), range, "deterministic");

    let run = |v: &str| {
        let mut a = base.to_vec();
        a.extend_from_slice(&["--value", v]);
        a.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    for (v, needle) in [
        ("x", "write NAME=VALUE or NAME=LOW:HIGH"),
        ("=1", "write NAME=VALUE or NAME=LOW:HIGH"),
        ("x=fast", "`fast` is not a finite number"),
        ("x=0:one", "`one` is not a finite number"),
        ("x=2:1", "the low end 2 is above the high end 1"),
        (
            "speed=1.0",
            "--value speed: the model has no input named \"speed\" (its inputs: x)",
        ),
    ] {
        let a = run(v);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        refused(&a, &[needle], &["FAILED"]);
    }
}

/// Runs `tools/onnx-free-batch.py IN OUT` with plain python3 (the tool
/// needs no package).
fn free_batch(src: &Path, dst: &Path) -> Output {
    Command::new("python3")
        .arg(root().join("tools/onnx-free-batch.py"))
        .arg(src)
        .arg(dst)
        .output()
        .expect("run python3")
}

/// Defect 11: a model whose constant Reshape targets repeat the batch
/// gets those freed too (and says so), so it runs at another batch; where
/// the batch cannot be freed safely the tool refuses and writes nothing.
/// Tiny models, and the real light ShuffleNet of the onnx package (33 such
/// Reshapes, which failed at batch 16).
#[test]
fn free_batch_frees_constant_reshape_targets_or_refuses() {
    let dir = scratch("free-batch");
    tiny_models(&dir);
    let check = r#"
import sys, onnx
from onnx import numpy_helper
m = onnx.load(sys.argv[1])
consts = {t.name: numpy_helper.to_array(t).tolist() for t in m.graph.initializer}
for n in m.graph.node:
    if n.op_type == "Constant":
        consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t).tolist()
print([consts[n.input[1]] for n in m.graph.node if n.op_type == "Reshape"],
      m.graph.input[0].type.tensor_type.shape.dim[0].dim_param)
"#;
    for (name, old, new) in [
        ("reshape_init", "[1, 48]", "[[-1, 48]] N"),
        ("reshape_const", "[1, 3, 16]", "[[-1, 3, 16]] N"),
    ] {
        let (src, dst) = (
            dir.join(format!("{name}.onnx")),
            dir.join(format!("{name}_free.onnx")),
        );
        let out = free_batch(&src, &dst);
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{name}: {stderr}");
        let want = format!("{old} -> [-1, ");
        assert!(
            stderr.contains(&want) && stderr.contains("1 Reshape target(s) freed"),
            "{name}: {stderr}"
        );
        let shown = python(check, &[dst.to_str().unwrap()]);
        assert_eq!(text(&shown.stdout).trim(), new, "{}", text(&shown.stderr));
        let dst = dst.to_string_lossy().into_owned();
        let out = ort(&[
            "--model",
            &dst,
            "--inputs",
            "16x3x4x4",
            "1x3x4x4",
            "--strategies",
            "planned,ort-arena",
        ]);
        assert!(
            out.status.success(),
            "{name} at batch 16: {}",
            text(&out.stderr)
        );
    }

    let dst = dir.join("reshape_ambiguous_free.onnx");
    let out = free_batch(&dir.join("reshape_ambiguous.onnx"), &dst);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("refused: Reshape 'amb' (target 'shape'): its constant target [1, -1, 16] fixes the batch (1)"),
        "{stderr}"
    );
    assert!(!dst.exists(), "nothing written when refused");

    let light = python(
        "import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), \
         'backend/test/data/light/light_shufflenet.onnx'))",
        &[],
    );
    let src = PathBuf::from(text(&light.stdout).trim());
    let dst = dir.join("shufflenet_free.onnx");
    let out = free_batch(&src, &dst);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("33 Reshape target(s) freed"), "{stderr}");
    let dst = dst.to_string_lossy().into_owned();
    let out = ort(&[
        "--model",
        &dst,
        "--inputs",
        "16x3x224x224",
        "1x3x224x224",
        "--strategies",
        "planned",
    ]);
    assert!(
        out.status.success(),
        "ShuffleNet at batch 16: {}",
        text(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
