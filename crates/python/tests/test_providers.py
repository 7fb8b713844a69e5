"""Providers and the scope of patch(): a session asking only for an
accelerator (or for one onnxruntime would run) is never silently moved to
the CPU, a list with the CPU and an accelerator the library lacks is what
onnxruntime makes of it, and leaving `with ta.patch():` puts
onnxruntime's class back everywhere the patch put its own, libraries
imported inside the block included."""

import importlib
import sys
import warnings

import numpy as np
import onnxruntime
import pytest

from conftest import same
from tensor_arena import onnxruntime as ta

ACCEL = ["CUDAExecutionProvider", "CPUExecutionProvider"]


def test_direct_session_asking_only_for_an_accelerator_raises(assets):
    # The project's rule: a session asking only for an accelerator is never
    # moved to the CPU.
    path = str(assets / "ppocr_cls.onnx")
    for providers in (["CUDAExecutionProvider"], [("CUDAExecutionProvider", {"device_id": 0})], ["TensorrtExecutionProvider"]):
        with pytest.raises(ta.InvalidArgument, match="CPU only") as e:
            ta.InferenceSession(path, providers=providers)
        assert "onnxruntime.InferenceSession" in str(e.value)
        assert "without the CPU" in str(e.value)
    s = ta.InferenceSession(path, providers=[("CPUExecutionProvider", {})])
    assert s.get_providers() == ["CPUExecutionProvider"]
    with pytest.raises(ta.InvalidArgument, match="CUDAExecutionProvider"):
        s.set_providers(["CUDAExecutionProvider"])
    assert s.get_providers() == ["CPUExecutionProvider"]
    with pytest.raises(ta.InvalidArgument):
        ta.InferenceSession(path, providers="CPUExecutionProvider")


def _messages(record):
    return [str(w.message) for w in record if issubclass(w.category, UserWarning)]


def test_an_accelerator_the_library_lacks_beside_the_cpu_is_what_onnxruntime_makes(assets):
    # The common idiom on a machine with the CPU wheel: onnxruntime warns
    # for each provider it lacks and makes a CPU session; a drop-in does
    # the same, in onnxruntime's words.
    path = str(assets / "ppocr_cls.onnx")
    x = np.random.default_rng(5).random((2, 3, 48, 192), dtype=np.float32)
    assert "CUDAExecutionProvider" not in onnxruntime.get_available_providers()
    with warnings.catch_warnings(record=True) as theirs:
        warnings.simplefilter("always")
        o = onnxruntime.InferenceSession(path, providers=ACCEL)
    assert o.get_providers() == ["CPUExecutionProvider"]
    with warnings.catch_warnings(record=True) as ours:
        warnings.simplefilter("always")
        s = ta.InferenceSession(path, providers=ACCEL)
    assert s.get_providers() == ["CPUExecutionProvider"]
    assert _messages(ours) == _messages(theirs) != []
    same(o.run(None, {"x": x}), s.run(None, {"x": x}))
    # Options beside the names, and set_providers, alike.
    with pytest.warns(UserWarning, match="Specified provider 'CUDAExecutionProvider' is not in available provider names"):
        ta.InferenceSession(path, providers=[("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"])
    with pytest.warns(UserWarning, match="CUDAExecutionProvider"):
        s.set_providers(ACCEL)
    assert s.get_providers() == ["CPUExecutionProvider"]


def test_an_accelerator_the_library_has_is_refused_even_beside_the_cpu(assets, monkeypatch):
    # Where onnxruntime would run the session on the accelerator (a GPU
    # build lists CUDA), a CPU session would be the silent move the rule
    # forbids.
    path = str(assets / "ppocr_cls.onnx")
    monkeypatch.setattr(ta, "_library_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ta.InvalidArgument, match="CPU only"):
            ta.InferenceSession(path, providers=ACCEL)


def test_patched_session_asking_for_an_accelerator_is_left_to_onnxruntime(assets):
    path = str(assets / "ppocr_cls.onnx")
    x = np.random.default_rng(3).random((2, 3, 48, 192), dtype=np.float32)
    ref = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    original = onnxruntime.InferenceSession
    with ta.patch():
        with pytest.warns(ta.ProviderNotice, match="CUDAExecutionProvider.*left to onnxruntime"):
            gpu = onnxruntime.InferenceSession(path, providers=ACCEL)
        # onnxruntime's own session, made exactly as asked (this CPU-only
        # build then runs it on the CPU, as onnxruntime itself decides).
        assert type(gpu) is original
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            cpu = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
            default = onnxruntime.InferenceSession(path)
    assert isinstance(cpu, ta.InferenceSession) and isinstance(default, ta.InferenceSession)
    same(ref, gpu.run(None, {"x": x}))
    same(ref, cpu.run(None, {"x": x}))


def test_patch_scope_covers_modules_imported_inside_the_block(tmp_path, monkeypatch):
    # A library imported for the first time inside the block binds the
    # patched class (as rapidocr does with `from onnxruntime import
    # InferenceSession`), under its own name or another.
    (tmp_path / "lib_in_block.py").write_text(
        "from onnxruntime import InferenceSession\n"
        "from onnxruntime import InferenceSession as OrtSession\n"
        "import onnxruntime as ort\n"
        "def make():\n    return ort.InferenceSession\n"
    )
    (tmp_path / "lib_before.py").write_text("from onnxruntime import InferenceSession as Renamed\n")
    (tmp_path / "lib_chooses_ours.py").write_text(
        "from tensor_arena.onnxruntime import InferenceSession\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for m in ("lib_in_block", "lib_before", "lib_chooses_ours"):
        sys.modules.pop(m, None)
    original = onnxruntime.InferenceSession
    before = importlib.import_module("lib_before")
    try:
        with ta.patch():
            inside = importlib.import_module("lib_in_block")
            ours = importlib.import_module("lib_chooses_ours")
            assert inside.InferenceSession is ta.PatchedInferenceSession
            assert inside.OrtSession is ta.PatchedInferenceSession
            assert before.Renamed is ta.PatchedInferenceSession
            with ta.patch():  # nested: a no-op, the outer one undoes
                pass
            assert onnxruntime.InferenceSession is ta.PatchedInferenceSession
        assert onnxruntime.InferenceSession is original
        assert inside.InferenceSession is original
        assert inside.OrtSession is original
        assert inside.make() is original
        assert before.Renamed is original
        # A module that chose tensor-arena's class keeps it.
        assert ours.InferenceSession is ta.InferenceSession
        # onnxruntime's defining module was never touched.
        capi = sys.modules[original.__module__]
        assert capi.InferenceSession is original
    finally:
        for m in ("lib_in_block", "lib_before", "lib_chooses_ours"):
            sys.modules.pop(m, None)


def test_rapidocr_imported_inside_the_block_is_unpatched_after(assets):
    # The README's pattern: rapidocr imported inside the block. A fresh
    # import (its modules dropped first) binds the name while patched.
    for m in [m for m in sys.modules if m == "rapidocr_onnxruntime" or m.startswith("rapidocr_onnxruntime.")]:
        del sys.modules[m]
    with ta.patch():
        from rapidocr_onnxruntime import RapidOCR
        from rapidocr_onnxruntime.utils import infer_engine

        engine = RapidOCR()
    assert isinstance(engine.text_det.infer.session, ta.InferenceSession)
    assert infer_engine.InferenceSession is onnxruntime.InferenceSession
    later = RapidOCR()
    assert type(later.text_det.infer.session) is onnxruntime.InferenceSession


def test_a_subclass_defined_under_patch_asking_for_an_accelerator_is_an_instance_of_it(assets):
    path = str(assets / "ppocr_cls.onnx")
    x = np.random.default_rng(4).random((1, 3, 48, 192), dtype=np.float32)
    ref = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    original = onnxruntime.InferenceSession
    with ta.patch():

        class Mine(onnxruntime.InferenceSession):
            def __init__(self, p, **kw):
                super().__init__(p, **kw)
                self.tag = "mine"

            def first(self, feeds):
                return self.run(None, feeds)[0]

        with pytest.warns(ta.ProviderNotice, match="left to onnxruntime"):
            gpu = Mine(path, providers=ACCEL)
        cpu = Mine(path, providers=["CPUExecutionProvider"])
    # Both are the application's class, with its own methods and state;
    # the accelerator's is onnxruntime's session underneath.
    assert isinstance(gpu, Mine) and isinstance(cpu, Mine)
    assert isinstance(gpu, original) and not isinstance(cpu, original)
    assert gpu.tag == "mine" and cpu.tag == "mine"
    same(ref, [gpu.first({"x": x})])
    same(ref, [cpu.first({"x": x})])
    assert type(Mine(path, providers=ACCEL)) is type(gpu)
