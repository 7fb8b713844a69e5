"""Outputs bitwise equal to onnxruntime's on the real models at several
shapes, and the session's description equal to onnxruntime's."""

import numpy as np
import onnxruntime as ort
import pytest

from conftest import same
from tensor_arena import onnxruntime as ta

CASES = {
    "ppocr_det.onnx": [(1, 3, 640, 480), (1, 3, 320, 320), (1, 3, 960, 544), (1, 3, 640, 480)],
    "ppocr_cls.onnx": [(1, 3, 48, 192), (6, 3, 48, 192), (3, 3, 48, 192), (6, 3, 48, 192)],
    "ppocr_rec.onnx": [(1, 3, 48, 320), (6, 3, 48, 100), (6, 3, 48, 800), (1, 3, 48, 320)],
    "densenet121_batch.onnx": [(1, 3, 224, 224), (4, 3, 224, 224), (2, 3, 224, 224), (4, 3, 224, 224)],
}


def feed(sess, shape, seed):
    rng = np.random.default_rng(seed)
    return {sess.get_inputs()[0].name: rng.standard_normal(shape).astype(np.float32)}


@pytest.mark.parametrize("model", sorted(CASES))
def test_outputs_equal_onnxruntime(assets, model):
    path = str(assets / model)
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    sess = ta.InferenceSession(path, providers=["CPUExecutionProvider"])
    for i, shape in enumerate(CASES[model]):
        f = feed(ref, shape, i)
        same(ref.run(None, f), sess.run(None, f))
    # The last shape repeats an earlier one: served from its plan.
    assert sess.last_run()["plan"] == "exact"


def test_silero_vad_equal_onnxruntime(assets):
    path = str(assets / "silero_vad_16k_sequence.onnx")
    ref = ort.InferenceSession(path)
    sess = ta.InferenceSession(path)
    rng = np.random.default_rng(3)
    for n in (1, 8, 31, 8):
        f = {
            "input": rng.uniform(-0.5, 0.5, (n, 576)).astype(np.float32),
            "h": rng.standard_normal((1, 1, 128)).astype(np.float32),
            "c": rng.standard_normal((1, 1, 128)).astype(np.float32),
        }
        same(ref.run(None, f), sess.run(None, f))
        # Output names picked and ordered as asked.
        same(ref.run(["cn", "speech_probs"], f), sess.run(["cn", "speech_probs"], f))


@pytest.mark.parametrize("model", sorted(CASES) + ["silero_vad_16k_sequence.onnx"])
def test_description_equals_onnxruntime(assets, model):
    path = str(assets / model)
    ref = ort.InferenceSession(path)
    sess = ta.InferenceSession(path)
    for a, b in ((ref.get_inputs(), sess.get_inputs()), (ref.get_outputs(), sess.get_outputs())):
        assert [(x.name, x.shape, x.type) for x in a] == [(x.name, x.shape, x.type) for x in b]
    ma, mb = ref.get_modelmeta(), sess.get_modelmeta()
    for k in ("producer_name", "graph_name", "domain", "description", "version", "custom_metadata_map"):
        assert getattr(ma, k) == getattr(mb, k), k
    assert sess.get_providers() == ["CPUExecutionProvider"]


def test_bytes_and_session_options(assets):
    path = assets / "ppocr_cls.onnx"
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    ref = ort.InferenceSession(str(path), sess_options=so)
    sess = ta.InferenceSession(path.read_bytes(), sess_options=so)
    assert sess.get_session_options() is so
    f = feed(ref, (2, 3, 48, 192), 9)
    same(ref.run(None, f), sess.run(None, f))


def test_outputs_are_owned_and_writable(assets):
    sess = ta.InferenceSession(str(assets / "ppocr_cls.onnx"))
    f = feed(sess, (2, 3, 48, 192), 1)
    (out,) = sess.run(None, f)
    assert out.flags.owndata and out.flags.writeable and out.flags.c_contiguous
    out[...] = 0  # the app's to change
    (again,) = sess.run(None, f)
    assert again.any()


def test_non_contiguous_inputs_are_copied(assets):
    path = str(assets / "ppocr_cls.onnx")
    ref = ort.InferenceSession(path)
    sess = ta.InferenceSession(path)
    x = np.random.default_rng(2).standard_normal((2, 3, 48, 384)).astype(np.float32)[..., ::2]
    assert not x.flags.c_contiguous
    same(ref.run(None, {"x": x}), sess.run(None, {"x": x}))
