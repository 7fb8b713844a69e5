"""Marks the first dimension of every graph input that is not an initializer,
and of every graph output, of an ONNX model
free (dim_param "N"), editing the protobuf wire format directly (no onnx or
protobuf package needed). Used by fetch-ort-assets.sh for DenseNet-121, whose
file declares a fixed batch of 1.

Usage: python3 onnx-free-batch.py IN.onnx OUT.onnx
"""
import sys


def varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def enc_varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def fields(buf):
    """Yields (field, wire_type, raw_value) over a message."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        field, wt = key >> 3, key & 7
        if wt == 0:
            start = i
            _, i = varint(buf, i)
            yield field, wt, buf[start:i]
        elif wt == 1:
            yield field, wt, buf[i:i + 8]
            i += 8
        elif wt == 2:
            n, i = varint(buf, i)
            yield field, wt, buf[i:i + n]
            i += n
        elif wt == 5:
            yield field, wt, buf[i:i + 4]
            i += 4
        else:
            raise ValueError(f"unsupported wire type {wt}")


def encode(items):
    out = bytearray()
    for field, wt, raw in items:
        out += enc_varint(field << 3 | wt)
        if wt == 2:
            out += enc_varint(len(raw))
        out += raw
    return bytes(out)


def edit(buf, path, leaf):
    """Applies `leaf` to every length-delimited submessage reached by `path`
    (a list of field numbers; a field given as (n, 'first') edits only the
    first occurrence)."""
    if not path:
        return leaf(buf)
    head, rest = path[0], path[1:]
    first_only = isinstance(head, tuple)
    num = head[0] if first_only else head
    out, done = [], False
    for field, wt, raw in fields(buf):
        if field == num and wt == 2 and not (first_only and done):
            raw = edit(raw, rest, leaf)
            done = True
        out.append((field, wt, raw))
    return encode(out)


def free_dim(dim):
    # Dimension: dim_value = 1 (varint), dim_param = 2 (string).
    kept = [(f, wt, raw) for f, wt, raw in fields(dim) if f not in (1, 2)]
    return encode(kept + [(2, 2, b"N")])


def name_of(value_info):
    for field, wt, raw in fields(value_info):
        if field == 1 and wt == 2:
            return raw
    return b""


def main():
    src, dst = sys.argv[1:]
    model = open(src, "rb").read()

    def graph(g):
        # GraphProto.initializer=5 (TensorProto.name=8), input=11, output=12.
        inits = set()
        for field, wt, raw in fields(g):
            if field == 5 and wt == 2:
                inits.update(r for f, w, r in fields(raw) if f == 8 and w == 2)
        out = []
        for field, wt, raw in fields(g):
            if (field == 12 or (field == 11 and name_of(raw) not in inits)) and wt == 2:
                # ValueInfoProto.type=2; TypeProto.tensor_type=1;
                # Tensor.shape=2; TensorShapeProto.dim=1 (the first one).
                raw = edit(raw, [2, 1, 2, (1, "first")], free_dim)
            out.append((field, wt, raw))
        return encode(out)

    # ModelProto.graph=7.
    open(dst, "wb").write(edit(model, [7], graph))


main()
