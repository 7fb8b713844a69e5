"""patch(): onnxruntime.InferenceSession resolves to the drop-in, so that a
library creating its sessions itself (rapidocr-onnxruntime 1.4.4) runs on
tensor-arena, with results identical to onnxruntime's."""

import onnxruntime

from render import images
from tensor_arena import onnxruntime as ta


def ocr(engine, imgs):
    out = []
    for img in imgs:
        result, _ = engine(img)
        out.append(result)
    return out


def test_patch_is_a_context_manager_and_a_call():
    original = onnxruntime.InferenceSession
    with ta.patch():
        assert onnxruntime.InferenceSession is ta.PatchedInferenceSession
    assert onnxruntime.InferenceSession is original
    p = ta.patch()
    try:
        assert onnxruntime.InferenceSession is ta.PatchedInferenceSession
    finally:
        p.undo()
    assert onnxruntime.InferenceSession is original


def test_rapidocr_under_patch_equals_onnxruntime():
    # rapidocr binds the name at import (`from onnxruntime import
    # InferenceSession`): patch() replaces it there too.
    from rapidocr_onnxruntime import RapidOCR
    from rapidocr_onnxruntime.utils import infer_engine

    imgs = images(4)
    expected = ocr(RapidOCR(), imgs)
    assert any(expected), "the rendered images should have text"
    before = ta.stats()["checkouts"]
    with ta.patch():
        assert infer_engine.InferenceSession is ta.PatchedInferenceSession
        engine = RapidOCR()
    assert infer_engine.InferenceSession is onnxruntime.InferenceSession
    assert isinstance(engine.text_det.infer.session, ta.InferenceSession)
    got = ocr(engine, imgs)
    assert ta.stats()["checkouts"] > before
    assert got == expected
