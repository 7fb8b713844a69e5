"""Every input dtype the drop-in supports, 0-d tensors and empty
dimensions, on tiny models built here with onnx's helper, bitwise equal to
onnxruntime."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from conftest import same
from tensor_arena import onnxruntime as ta

DTYPES = {
    np.float32: TensorProto.FLOAT,
    np.float16: TensorProto.FLOAT16,
    np.int64: TensorProto.INT64,
    np.int32: TensorProto.INT32,
    np.int8: TensorProto.INT8,
    np.uint8: TensorProto.UINT8,
    np.bool_: TensorProto.BOOL,
}


def model(elem, rank):
    """Y = Identity(X); Z = Concat(X, X) on the first axis (rank >= 1) or
    a reshape to [1] (rank 0); N = Shape(X). Dimensions symbolic."""
    dims = [f"d{i}" for i in range(rank)]
    x = helper.make_tensor_value_info("X", elem, dims)
    nodes = [helper.make_node("Identity", ["X"], ["Y"])]
    if rank:
        nodes.append(helper.make_node("Concat", ["X", "X"], ["Z"], axis=0))
        z = helper.make_tensor_value_info("Z", elem, ["z0"] + dims[1:])
    else:
        one = helper.make_tensor("one", TensorProto.INT64, [1], [1])
        nodes.append(helper.make_node("Reshape", ["X", "one"], ["Z"]))
        z = helper.make_tensor_value_info("Z", elem, [1])
    nodes.append(helper.make_node("Shape", ["X"], ["N"]))
    graph = helper.make_graph(
        nodes, "dtypes", [x],
        [helper.make_tensor_value_info("Y", elem, dims), z,
         helper.make_tensor_value_info("N", TensorProto.INT64, [rank])],
        initializer=[] if rank else [one],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m.SerializeToString()


def values(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    if dtype is np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, endpoint=True, dtype=dtype)
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (0, 4), (2, 5), (7,)], ids=str)
def test_dtype_and_shape(dtype, shape):
    m = model(DTYPES[dtype], len(shape))
    ref = ort.InferenceSession(m)
    sess = ta.InferenceSession(m)
    x = values(dtype, shape, len(shape))
    a, b = ref.run(None, {"X": x}), sess.run(None, {"X": x})
    same(a, b)
    assert b[0].dtype == np.dtype(dtype) and b[0].shape == shape
    assert [i.type for i in sess.get_inputs()] == [i.type for i in ref.get_inputs()]


def test_numpy_scalars_and_lists():
    m = model(TensorProto.FLOAT, 1)
    sess = ta.InferenceSession(m)
    (y, z, n) = sess.run(None, {"X": np.array([1.5, 2.5], dtype=np.float32)})
    assert y.tolist() == [1.5, 2.5] and n.tolist() == [2]
    m0 = model(TensorProto.INT64, 0)
    (y, z, n) = ta.InferenceSession(m0).run(None, {"X": np.int64(7)})
    assert y.shape == () and int(y) == 7 and z.tolist() == [7]


def test_non_native_byte_order_is_converted():
    m = model(TensorProto.INT32, 1)
    x = np.arange(5, dtype=">i4")
    (y, _, _) = ta.InferenceSession(m).run(None, {"X": x})
    assert y.dtype == np.int32 and y.tolist() == list(range(5))


def test_lists_take_the_input_type():
    # onnxruntime converts a list to the input's type (magika feeds lists
    # of ints to an int32 input); an array of another dtype is an error.
    m = model(TensorProto.INT32, 2)
    ref = ort.InferenceSession(m)
    sess = ta.InferenceSession(m)
    feed = {"X": [[1, 2, 3], [4, 5, 6]]}
    same(ref.run(None, feed), sess.run(None, feed))
    with pytest.raises(ta.InvalidArgument):
        sess.run(None, {"X": np.zeros((2, 3), np.int64)})
