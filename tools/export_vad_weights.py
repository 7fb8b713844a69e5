#!/usr/bin/env python3
"""Export Silero VAD v6 (16 kHz, "sequence" ONNX graph) weights to safetensors.

Usage:
    pip download --no-deps silero-vad==6.2.3 -d /work/scratch/wheel
    python tools/export_vad_weights.py /work/scratch/wheel/silero_vad-6.2.3-py3-none-any.whl

Reads `silero_vad/data/silero_vad_16k_sequence.onnx` and the license from the
wheel (a .whl is a zip file; an already-unzipped .onnx path also works, with
--license), prints a summary of the graph, checks that the graph is the one
crates/vad implements (op sequence, attributes, constant pads/slices), and writes

    crates/vad/data/silero_vad_16k_v6.safetensors   (all tensors F32)
    crates/vad/data/LICENSE-silero-vad.txt

Tensor names: the ONNX initializer names, except the three anonymous LSTM
initializers, renamed (shapes and layout unchanged):

    onnx::LSTM_209 -> recurrent.W  [1, 512, 128]  input weights, gates i,o,f,c
    onnx::LSTM_210 -> recurrent.R  [1, 512, 128]  recurrent weights, gates i,o,f,c
    onnx::LSTM_211 -> recurrent.B  [1, 1024]      Wb (512) then Rb (512)

The graph's other Constant nodes are integer shape/pad/slice parameters and the
exponent 2.0 of the magnitude; they are not tensors the model needs at run time,
so they are checked here and recorded in the safetensors metadata instead.
Note: silero_vad_16k.safetensors in the same wheel holds different weights.
"""

import argparse
import hashlib
import json
import os
import struct
import sys
import zipfile

import numpy as np
import onnx
from onnx import numpy_helper
from safetensors.numpy import load_file

ONNX_MEMBER = "silero_vad/data/silero_vad_16k_sequence.onnx"
RENAME = {
    "onnx::LSTM_209": "recurrent.W",
    "onnx::LSTM_210": "recurrent.R",
    "onnx::LSTM_211": "recurrent.B",
}
EXPECTED_SHAPES = {
    "stft.forward_basis_buffer": [258, 1, 256],
    "encoder.0.weight": [128, 129, 3],
    "encoder.0.bias": [128],
    "encoder.1.weight": [64, 128, 3],
    "encoder.1.bias": [64],
    "encoder.2.weight": [64, 64, 3],
    "encoder.2.bias": [64],
    "encoder.3.weight": [128, 64, 3],
    "encoder.3.bias": [128],
    "recurrent.W": [1, 512, 128],
    "recurrent.R": [1, 512, 128],
    "recurrent.B": [1, 1024],
    "output.weight": [1, 128, 1],
    "output.bias": [1],
}
# Attributes each Conv node must have (absent attributes take the ONNX defaults).
EXPECTED_CONVS = {
    "/stft/Conv": dict(kernel_shape=[256], strides=[128], pads=[0, 0], dilations=[1], group=1),
    "/encoder.0/Conv": dict(kernel_shape=[3], strides=[1], pads=[1, 1], dilations=[1], group=1),
    "/encoder.1/Conv": dict(kernel_shape=[3], strides=[2], pads=[1, 1], dilations=[1], group=1),
    "/encoder.2/Conv": dict(kernel_shape=[3], strides=[2], pads=[1, 1], dilations=[1], group=1),
    "/encoder.3/Conv": dict(kernel_shape=[3], strides=[1], pads=[1, 1], dilations=[1], group=1),
    "/output/Conv": dict(kernel_shape=[1], strides=[1], pads=[0, 0], dilations=[1], group=1),
}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "crates", "vad", "data")


def load(path, license_path):
    if path.endswith(".whl"):
        with zipfile.ZipFile(path) as z:
            model = onnx.load_model_from_string(z.read(ONNX_MEMBER))
            lic = [n for n in z.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
            if len(lic) != 1:
                sys.exit(f"expected one license file in the wheel, found {lic}")
            license_text = z.read(lic[0]).decode("utf-8")
            # "silero_vad-6.2.3.dist-info/..." -> "silero-vad 6.2.3"
            name, version = lic[0].split("/")[0].removesuffix(".dist-info").rsplit("-", 1)
            dist = f"{name.replace('_', '-')} {version}"
    else:
        model = onnx.load(path)
        if not license_path:
            sys.exit("--license is required with a bare .onnx file")
        license_text = open(license_path, encoding="utf-8").read()
        dist = "silero-vad"
    return model, license_text, dist


def attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def is_pad_chain(node):
    """True for the constant-only int64 nodes computing the Pad amounts."""
    return node.name.startswith("/stft/padding/") and node.op_type != "Pad"


def fold_constants(graph):
    """Values of every Constant node, by output name."""
    return {n.output[0]: numpy_helper.to_array(attrs(n)["value"]) for n in graph.node if n.op_type == "Constant"}


def pad_amounts(model):
    """Constant-fold the int64 subgraph (torch's F.pad lowering) feeding Pad's `pads` input."""
    import onnxruntime as ort

    g = model.graph
    pad = next(n for n in g.node if n.op_type == "Pad")
    target = pad.input[1]
    sub = onnx.helper.make_graph(
        [n for n in g.node if is_pad_chain(n)],
        "pads",
        [],
        [onnx.helper.make_tensor_value_info(target, onnx.TensorProto.INT64, None)],
    )
    m = onnx.helper.make_model(sub, opset_imports=model.opset_import)
    m.ir_version = model.ir_version
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {})[0].tolist(), attrs(pad)["mode"].decode()


def concrete_shapes(model):
    """Shape of every tensor, found by running onnxruntime with every node
    output exposed, for L = 3 and L = 5; a dimension equal to L is shown as L."""
    import onnxruntime as ort

    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    for n in m.graph.node:
        for o in n.output:
            if o and o not in have:
                m.graph.output.append(onnx.ValueInfoProto(name=o))
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    runs = []
    for length in (3, 5):
        feeds = {"input": np.random.default_rng(0).standard_normal((length, 576)).astype(np.float32),
                 "h": np.zeros((1, 1, 128), np.float32), "c": np.zeros((1, 1, 128), np.float32)}
        runs.append(dict(zip(names, (np.shape(v) for v in sess.run(None, feeds)))))
    out = {}
    for name in names:
        a, b = runs[0][name], runs[1][name]
        dims = ["L" if (x, y) == (3, 5) else str(x) if x == y else "?" for x, y in zip(a, b)]
        out[name] = "x".join(dims) or "scalar"
    return out


def summarize(model):
    g = model.graph

    def shape(vi):
        dims = (d.dim_param or str(d.dim_value) for d in vi.type.tensor_type.shape.dim)
        return "x".join(dims).replace("sequence_length", "L") or "scalar"

    print(f"opset {[(o.domain or 'ai.onnx', o.version) for o in model.opset_import]}, ir {model.ir_version}")
    for i in g.input:
        print(f"input  {i.name:14s} {shape(i)}")
    for o in g.output:
        print(f"output {o.name:14s} {shape(o)}")
    shapes = concrete_shapes(model)
    shapes.update({i.name: shape(i) for i in g.input})
    shapes.update({t.name: "x".join(map(str, t.dims)) for t in g.initializer})
    print("nodes (Constant nodes and the constant pad-amount chain omitted; L = sequence_length;")
    print("shapes from onnxruntime runs with L = 3 and 5):")
    for n in g.node:
        if n.op_type == "Constant" or is_pad_chain(n):
            continue
        a = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs(n).items()}
        ins = ", ".join(f"{RENAME.get(i, i)}[{shapes.get(i, '?')}]" for i in n.input
                        if i and not i.startswith("/stft/Constant") and not i.endswith("Constant_output_0")
                        and not i.startswith("/stft/padding/Cast"))
        outs = ", ".join(f"{o}[{shapes.get(o, '?')}]" for o in n.output if o)
        print(f"  {n.op_type:9s} {ins} -> {outs} {a if a else ''}".replace("sequence_length", "L").rstrip())


def check_graph(model, consts):
    g = model.graph
    ops = [n.op_type for n in g.node if n.op_type != "Constant" and not is_pad_chain(n)]
    expected = ["Pad", "Unsqueeze", "Conv", "Slice", "Slice", "Slice", "Slice", "Pow", "Pow", "Add", "Sqrt",
                "Conv", "Relu", "Conv", "Relu", "Conv", "Relu", "Conv", "Relu", "Transpose", "LSTM",
                "Squeeze", "Relu", "Transpose", "Conv", "Sigmoid", "Reshape"]
    assert ops == expected, ops
    for n in g.node:
        a = attrs(n)
        if n.op_type == "Conv":
            for k, v in EXPECTED_CONVS[n.name].items():
                assert a.get(k, [0, 0] if k == "pads" else 1) == v, (n.name, k, a.get(k))
        if n.op_type == "LSTM":
            assert a == {"hidden_size": 128}, a  # forward, default activations, no clip
            assert list(n.input) == ["/Transpose_output_0", "onnx::LSTM_209", "onnx::LSTM_210",
                                     "onnx::LSTM_211", "", "h", "c"], n.input
        if n.op_type == "Pow":
            assert float(consts[n.input[1]]) == 2.0
        if n.op_type == "Slice" and n.name.startswith("/stft/Slice"):
            s, e, ax, st = (int(consts[i][0]) for i in n.input[1:])
            print(f"  {n.name}: axis {ax}, [{s}:{e if e < 2**31 else ''}], step {st}")
    slices = {n.name: tuple(int(consts[i][0]) for i in n.input[1:]) for n in g.node
              if n.op_type == "Slice" and n.name.startswith("/stft/Slice")}
    big = 9223372036854775807
    assert slices == {
        "/stft/Slice": (0, 129, 1, 1),      # real part: channels 0..129
        "/stft/Slice_1": (1, big, 2, 1),    # drop STFT frame 0
        "/stft/Slice_2": (129, big, 1, 1),  # imaginary part: channels 129..258
        "/stft/Slice_3": (1, big, 2, 1),    # drop STFT frame 0
    }, slices
    perms = {n.name: attrs(n)["perm"] for n in g.node if n.op_type == "Transpose" and not n.name.startswith("/stft")}
    assert perms == {"/Transpose": [0, 2, 1], "/Transpose_1": [1, 2, 0]}, perms


def save_safetensors(tensors, path, metadata):
    """Write a safetensors file byte-for-byte reproducibly (the library writes
    the metadata map in random order): header keys sorted, tensors in name
    order, header padded with spaces to a multiple of 8 bytes."""
    header = {"__metadata__": dict(sorted(metadata.items()))}
    offset = 0
    blobs = []
    for name in sorted(tensors):
        blob = tensors[name].astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    back = load_file(path)  # check with the reference implementation
    assert set(back) == set(tensors) and all(np.array_equal(back[k], tensors[k]) for k in tensors)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", help="silero_vad-6.2.3-py3-none-any.whl, or the unzipped .onnx file")
    ap.add_argument("--license", help="license file (only with a bare .onnx source)")
    ap.add_argument("--out", default=DATA, help="output directory (default crates/vad/data)")
    args = ap.parse_args()

    model, license_text, dist = load(args.source, args.license)
    onnx.checker.check_model(model)
    summarize(model)
    consts = fold_constants(model.graph)
    pads, mode = pad_amounts(model)
    print(f"  /stft/padding/Pad: pads {pads} (ONNX order: begin per axis, then end per axis), mode {mode}")
    assert pads == [0, 128, 0, 128] and mode == "reflect", (pads, mode)
    check_graph(model, consts)

    tensors = {}
    for init in model.graph.initializer:
        name = RENAME.get(init.name, init.name)
        arr = numpy_helper.to_array(init)
        assert arr.dtype == np.float32, (init.name, arr.dtype)
        assert list(arr.shape) == EXPECTED_SHAPES[name], (name, arr.shape)
        tensors[name] = np.ascontiguousarray(arr)
    assert set(tensors) == set(EXPECTED_SHAPES), set(tensors) ^ set(EXPECTED_SHAPES)

    n_params = sum(t.size for t in tensors.values())
    print(f"{len(tensors)} tensors, {n_params} parameters:")
    for name, t in tensors.items():
        print(f"  {name:26s} {list(t.shape)}")

    metadata = {
        "source": f"{dist} (PyPI wheel), {ONNX_MEMBER}",
        "license": "MIT, Copyright (c) 2020-present Silero Team; see LICENSE-silero-vad.txt",
        "onnx_names": ",".join(f"{v}={k}" for k, v in RENAME.items()),
        "lstm": "hidden 128, forward, gates i,o,f,c; W [1,512,128], R [1,512,128], B = Wb[512] ++ Rb[512]",
        "stft": "reflect pad 128 both sides of each 576-sample row, conv stride 128 kernel 256, "
                "drop frame 0, magnitude sqrt(re^2+im^2) with re = channels 0..129, im = 129..258",
        "encoder": "conv k3 pad1 strides 1,2,2,1, each followed by ReLU",
        "input": "L x 576: 64 samples of context then 512 new samples, 16 kHz",
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "silero_vad_16k_v6.safetensors")
    save_safetensors(tensors, path, metadata)
    lic_path = os.path.join(args.out, "LICENSE-silero-vad.txt")
    with open(lic_path, "w", encoding="utf-8") as f:
        f.write("The file silero_vad_16k_v6.safetensors in this directory holds the weights of\n"
                f"Silero VAD v6 ({dist}, {ONNX_MEMBER}),\n"
                "converted to safetensors by tools/export_vad_weights.py. They are distributed\n"
                "under the license of silero-vad, reproduced below.\n\n")
        f.write(license_text.rstrip() + "\n")
    os.chmod(path, 0o644)
    digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
    print(f"wrote {path} ({os.path.getsize(path)} bytes, sha256 {digest})")
    print(f"wrote {lic_path}")


if __name__ == "__main__":
    main()
