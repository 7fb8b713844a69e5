"""Every user-facing failure is a Python exception, and the session (and
the process) goes on after it."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import onnxruntime as ort
import pytest

from conftest import same
from tensor_arena import onnxruntime as ta


@pytest.fixture(scope="module")
def cls(assets):
    return ta.InferenceSession(str(assets / "ppocr_cls.onnx"))


@pytest.fixture(scope="module")
def good(assets):
    x = np.random.default_rng(0).standard_normal((2, 3, 48, 192)).astype(np.float32)
    ref = ort.InferenceSession(str(assets / "ppocr_cls.onnx")).run(None, {"x": x})
    return x, ref


def still_works(sess, good):
    x, ref = good
    same(ref, sess.run(None, {"x": x}))


@pytest.mark.parametrize(
    "feed, match",
    [
        ({"y": np.zeros((1, 3, 48, 192), np.float32)}, "Invalid input name: y"),
        ({}, "Required input"),
        ({"x": np.zeros((1, 3, 48, 192), np.float64)}, r"Unexpected input data type. Actual: \(tensor\(double\)\)"),
        ({"x": np.zeros((1, 3, 48, 192), np.int64)}, "expected: \\(tensor\\(float\\)\\)"),
        ({"x": np.zeros((3, 48, 192), np.float32)}, "expects rank 4"),
        ({"x": np.zeros((1, 4, 48, 192), np.float32)}, "has shape"),
        ({"x": np.array(["a"])}, "not a supported input type"),
        ({"x": object()}, "not an array|not a supported input type"),
        ({1: np.zeros((1, 3, 48, 192), np.float32)}, "input names must be strings"),
    ],
    ids=["unknown-name", "missing", "float64", "int64", "rank", "fixed-dim", "strings", "object", "name-type"],
)
def test_bad_inputs_raise_invalid_argument(cls, good, feed, match):
    with pytest.raises(ta.InvalidArgument, match=match):
        cls.run(None, feed)
    still_works(cls, good)


def test_unknown_output_name(cls, good):
    with pytest.raises(ta.InvalidArgument, match="Invalid output name: nope"):
        cls.run(["nope"], {"x": good[0]})
    still_works(cls, good)


def test_missing_model_file(tmp_path):
    with pytest.raises(ta.NoSuchFile):
        ta.InferenceSession(str(tmp_path / "absent.onnx"))
    with pytest.raises(ta.NoSuchFile):
        ta.InferenceSession(tmp_path / "absent.onnx")


def test_corrupt_and_truncated_models(assets, tmp_path, cls, good):
    data = (assets / "ppocr_cls.onnx").read_bytes()
    for bad in (data[: len(data) // 2], data[:100], b"not an onnx model at all", b"", bytes(range(256)) * 64):
        with pytest.raises((ta.InvalidProtobuf, ta.Fail, ta.InvalidArgument)):
            ta.InferenceSession(bad)
        p = tmp_path / "bad.onnx"
        p.write_bytes(bad)
        with pytest.raises((ta.InvalidProtobuf, ta.Fail, ta.InvalidArgument)):
            ta.InferenceSession(str(p))
    with pytest.raises(TypeError):
        ta.InferenceSession(12345)
    still_works(cls, good)


def test_bad_options(assets):
    so = ort.SessionOptions()
    with pytest.raises(ta.InvalidArgument):
        so2 = ta.SessionOptions()
        so2.graph_optimization_level = 7
        ta.InferenceSession(str(assets / "ppocr_cls.onnx"), sess_options=so2)
    so2 = ta.SessionOptions()
    so2.intra_op_num_threads = -3
    with pytest.raises(ta.InvalidArgument):
        ta.InferenceSession(str(assets / "ppocr_cls.onnx"), sess_options=so2)
    with pytest.raises(ta.InvalidArgument):
        ta.configure(workers=0)
    with pytest.raises(ta.InvalidArgument):
        ta.configure(shrink="sometimes")
    with pytest.raises(ta.InvalidArgument):
        ta.Budget(1 << 20, wait=-1)
    assert so is not None


def test_spinning_entries_are_passed_on_and_checked(assets, good):
    """The intra/inter-op pools' spinning, set on either class's options,
    reaches ONNX Runtime (read off onnxruntime's, which cannot list its
    entries, by name); a bad value or an entry not passed on is an error,
    not ignored."""
    x, ref = good
    path = str(assets / "ppocr_cls.onnx")
    so = ort.SessionOptions()
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    assert ta._read_options(so)["config_entries"] == [
        ("session.inter_op.allow_spinning", "0"),
        ("session.intra_op.allow_spinning", "0"),
    ]
    sess = ta.InferenceSession(path, sess_options=so)
    same(sess.run(None, {"x": x}), ref)
    ours = ta.SessionOptions()
    ours.add_session_config_entry("session.intra_op.allow_spinning", "1")
    assert ours.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    with pytest.raises(RuntimeError):
        ours.get_session_config_entry("session.inter_op.allow_spinning")
    same(ta.InferenceSession(path, sess_options=ours).run(None, {"x": x}), ref)
    bad = ort.SessionOptions()
    bad.add_session_config_entry("session.intra_op.allow_spinning", "2")
    with pytest.raises(ta.InvalidArgument, match="allow_spinning"):
        ta.InferenceSession(path, sess_options=bad)
    unknown = ta.SessionOptions()
    unknown.add_session_config_entry("session.use_env_allocators", "1")
    with pytest.raises(ta.InvalidArgument, match="use_env_allocators"):
        ta.InferenceSession(path, sess_options=unknown)
    # Nothing set: nothing passed.
    assert "config_entries" not in ta._read_options(ort.SessionOptions())


SPIN_US = "session.intra_op.spin_duration_us"


def test_idle_threads_spin_briefly_unless_the_options_say_otherwise(assets, good):
    """With nothing said of spinning, a session's intra-op threads spin
    50 us before they sleep (ONNX Runtime's default spins far longer, which
    takes the cores from the other runs the pool runs at once). Any intra-op
    spinning entry the options set, either way, leaves ONNX Runtime's
    defaults and theirs alone. The spin settings are checked, not ignored."""
    x, ref = good
    path = str(assets / "ppocr_cls.onnx")
    sess = ta.InferenceSession(path)
    assert sess._sess.config_entries() == [(SPIN_US, "50")]
    same(sess.run(None, {"x": x}), ref)
    for key, value in [("session.intra_op.allow_spinning", "1"), ("session.intra_op.allow_spinning", "0"), (SPIN_US, "200")]:
        so = ort.SessionOptions()
        so.add_session_config_entry(key, value)
        sess = ta.InferenceSession(path, sess_options=so)
        assert sess._sess.config_entries() == [(key, value)]
        same(sess.run(None, {"x": x}), ref)
    # Entries that leave the intra-op spinning to the default get it too.
    so = ort.SessionOptions()
    so.add_session_config_entry("session.force_spinning_stop", "1")
    so.add_session_config_entry("session.intra_op.spin_backoff_max", "8")
    sess = ta.InferenceSession(path, sess_options=so)
    assert sess._sess.config_entries() == [
        ("session.force_spinning_stop", "1"),
        ("session.intra_op.spin_backoff_max", "8"),
        (SPIN_US, "50"),
    ]
    same(sess.run(None, {"x": x}), ref)
    for key, value in [
        (SPIN_US, "-1"),
        (SPIN_US, "50us"),
        (SPIN_US, "+50"),
        (SPIN_US, "2147483648"),
        ("session.inter_op.spin_duration_us", ""),
        ("session.intra_op.spin_backoff_max", "0"),
        ("session.inter_op.spin_backoff_max", "65"),
        ("session.force_spinning_stop", "yes"),
    ]:
        bad = ta.SessionOptions()
        bad.add_session_config_entry(key, value)
        with pytest.raises(ta.InvalidArgument, match=key.split(".")[-1]):
            ta.InferenceSession(path, sess_options=bad)


def test_budget_refusal_fails_the_run_and_the_session_goes_on(assets):
    path = str(assets / "ppocr_det.onnx")
    sess = ta.InferenceSession(path)
    ref = ort.InferenceSession(path)
    small = np.random.default_rng(1).standard_normal((1, 3, 64, 64)).astype(np.float32)
    large = np.random.default_rng(2).standard_normal((1, 3, 1280, 1280)).astype(np.float32)
    before = ta.config()
    budget = ta.Budget(24 << 20)
    try:
        ta.configure(budget=budget)
        with pytest.raises(ta.OutOfMemory):
            sess.run(None, {"x": large})
        assert sess.last_run()["out_of_memory"]
        assert budget.stats()["refusals"] >= 1
        assert ta.stats()["ooms"] >= 1
        same(ref.run(None, {"x": small}), sess.run(None, {"x": small}))
    finally:
        ta.configure(budget=False, workers=before["workers"])
    same(ref.run(None, {"x": large}), sess.run(None, {"x": large}))


SUBPROCESS = textwrap.dedent(
    """
    import sys
    from tensor_arena import onnxruntime as ta
    try:
        ta.InferenceSession(sys.argv[1])
    except ta.LibraryError as e:
        print("LibraryError:", e)
    """
)


def run_child(env_lib, model, extra=""):
    env = dict(os.environ, TENSOR_ARENA_ORT_LIB=str(env_lib))
    r = subprocess.run([sys.executable, "-c", extra + SUBPROCESS, str(model)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_too_old_library_is_refused(assets):
    out = run_child(assets / "libonnxruntime-1.20.so", assets / "ppocr_cls.onnx")
    assert out.startswith("LibraryError:") and "libonnxruntime-1.20.so" in out, out


def test_missing_and_wrong_library_is_refused(assets, tmp_path):
    out = run_child(tmp_path / "nope.so", assets / "ppocr_cls.onnx")
    assert out.startswith("LibraryError:") and "not found" in out, out
    fake = tmp_path / "libonnxruntime.so"
    fake.write_bytes(b"\x7fELF not really")
    out = run_child(fake, assets / "ppocr_cls.onnx")
    assert out.startswith("LibraryError:"), out


def test_without_onnxruntime_import_fails_clearly():
    hide = textwrap.dedent(
        """
        import importlib.abc, importlib.metadata, sys
        class Hide(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "onnxruntime" or name.startswith("onnxruntime."):
                    raise ModuleNotFoundError(name)
        sys.meta_path.insert(0, Hide())
        _files = importlib.metadata.files
        def files(name):
            if name == "onnxruntime":
                raise importlib.metadata.PackageNotFoundError(name)
            return _files(name)
        importlib.metadata.files = files
        try:
            import tensor_arena.onnxruntime
        except ImportError as e:
            print("ImportError:", e)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TENSOR_ARENA_ORT_LIB"}
    r = subprocess.run([sys.executable, "-c", hide], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    # It names commands that work: onnxruntime from PyPI (tensor-arena is not
    # there), and the two ways to get tensor-arena itself.
    assert r.stdout.startswith("ImportError:") and "pip install 'onnxruntime>=1.31'" in r.stdout, r.stdout
    assert "tools/dist.sh" in r.stdout and "pip install ./crates/python" in r.stdout, r.stdout
    assert "tensor-arena[onnxruntime]" not in r.stdout, r.stdout


HEAP_PROBE = r"""
import ctypes, sys
import tensor_arena.onnxruntime as ta
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
if sys.argv[1] == "asked":
    got = ta.system_heap(mmap_threshold=131072)
    assert got == {"mmap_threshold": True, "arena_max": False}, got
n = 8 << 20
p = libc.malloc(n); ctypes.memset(p, 1, n); libc.free(p)   # glibc's default now keeps blocks this large
before = rss()
p = libc.malloc(n); ctypes.memset(p, 1, n); libc.free(p)
print(rss() - before)
"""


def test_system_heap_is_the_programs_choice_and_gives_large_blocks_back():
    """Importing the package leaves glibc's moving mmap threshold alone: an
    8 MiB block freed after another stays resident. Asked for, every block
    of 128 KiB or more is mapped on its own and given back at free. Bad
    values raise; each call runs in a child (the setting is the process's)."""
    import subprocess
    import sys

    def grown(how):
        out = subprocess.run([sys.executable, "-c", HEAP_PROBE, how], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return int(out.stdout.split()[-1])

    assert grown("default") >= 6 << 20
    assert grown("asked") <= 1 << 20
    for kw in [{"mmap_threshold": 0}, {"arena_max": -1}]:
        with pytest.raises(ta.InvalidArgument):
            ta.system_heap(**kw)
    # Nothing given: nothing changed.
    assert ta.system_heap() == {"mmap_threshold": False, "arena_max": False}
    # Over glibc's ceiling (32 MiB): refused, not clamped.
    out = subprocess.run([sys.executable, "-c",
                          "import tensor_arena.onnxruntime as ta; print(ta.system_heap(mmap_threshold=64 << 20))"],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "'mmap_threshold': False" in out.stdout, out


class _Wrapped(Exception):
    pass


def test_out_of_memory_follows_a_cause_set_outside_any_handler():
    # A library that keeps the error and raises its own later, `from` it,
    # outside the handler: only __cause__ leads to the OutOfMemory (there is
    # no __context__), and a server must still answer 503, not 500.
    oom = ta.OutOfMemory("refused")
    try:
        raise _Wrapped("a library's error") from oom
    except _Wrapped as w:
        assert w.__context__ is None and w.__cause__ is oom
        assert ta.out_of_memory(w) is oom
    # Raised from the OutOfMemory while handling another error: the cause
    # is the OutOfMemory, the context the other error.
    try:
        try:
            raise KeyError("unrelated")
        except KeyError:
            raise _Wrapped("during another error") from oom
    except _Wrapped as w:
        assert isinstance(w.__context__, KeyError)
        assert ta.out_of_memory(w) is oom
    # Two wrappers deep, each by __cause__ only.
    middle = RuntimeError("middle")
    middle.__cause__ = oom
    outer = _Wrapped("outer")
    outer.__cause__ = middle
    assert ta.out_of_memory(outer) is oom
    assert ta.out_of_memory(_Wrapped("no cause")) is None
