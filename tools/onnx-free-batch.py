"""Frees the batch dimension of an ONNX model: marks the first dimension of
every graph input that is not an initializer, and of every graph output,
free (dim_param "N"), and frees the batch in the constant targets of its
Reshape nodes, editing the protobuf wire format directly (no onnx or
protobuf package needed). Used by fetch-ort-assets.sh for DenseNet-121,
whose file declares a fixed batch of 1.

Freeing the inputs alone is not enough for a model whose Reshape targets
are constants that repeat the old batch (light_resnet50's [1, 2048]): the
model would accept batch 16 and then fail in that Reshape. So a Reshape
whose shape input is a constant (an initializer, or a Constant node's
`value`) of int64s with a leading value equal to an input's old batch gets
that value replaced by -1 (infer it), which gives the same shape at the old
batch and follows the batch otherwise. Each such edit is said on stderr.
The tool refuses (exit 1, no output written) where it cannot do that
safely: the target already has a -1 elsewhere, the constant also feeds a
node that is not a Reshape, or it is stored outside the file. Reshape
targets computed at run time (Shape, Concat, ...) are left alone, and so
are subgraphs (If, Loop bodies) and other operators taking shapes (Expand,
Tile, ConstantOfShape).

Usage: python3 onnx-free-batch.py IN.onnx OUT.onnx
"""
import struct
import sys


class Refused(Exception):
    """The model cannot be freed safely; the message says why."""


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
    v &= (1 << 64) - 1  # negative int64 as ten bytes, two's complement
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def signed64(v):
    return v - (1 << 64) if v >= 1 << 63 else v


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


def strings(msg, num):
    return [raw.decode() for f, wt, raw in fields(msg) if f == num and wt == 2]


def string(msg, num):
    found = strings(msg, num)
    return found[0] if found else ""


def free_dim(dim):
    # Dimension: dim_value = 1 (varint), dim_param = 2 (string).
    kept = [(f, wt, raw) for f, wt, raw in fields(dim) if f not in (1, 2)]
    return encode(kept + [(2, 2, b"N")])


def first_dim_value(value_info):
    """The fixed first dimension of a tensor ValueInfoProto, or None."""
    # ValueInfoProto.type=2; TypeProto.tensor_type=1; Tensor.shape=2;
    # TensorShapeProto.dim=1; Dimension.dim_value=1.
    for msg_field in (2, 1, 2):
        found = [raw for f, wt, raw in fields(value_info) if f == msg_field and wt == 2]
        if not found:
            return None
        value_info = found[0]
    dims = [raw for f, wt, raw in fields(value_info) if f == 1 and wt == 2]
    if not dims:
        return None
    for f, wt, raw in fields(dims[0]):
        if f == 1 and wt == 0:
            return signed64(varint(raw, 0)[0])
    return None


# TensorProto: dims=1, data_type=2, int64_data=7, name=8, raw_data=9,
# external_data=13, data_location=14; INT64 = 7.
def int64s(tensor):
    """The values of an int64 TensorProto, or None if it is not one."""
    data_type, raw, packed, external = None, None, [], False
    for f, wt, val in fields(tensor):
        if f == 2 and wt == 0:
            data_type = varint(val, 0)[0]
        elif f == 9 and wt == 2:
            raw = val
        elif f == 7 and wt == 2:
            i = 0
            while i < len(val):
                v, i = varint(val, i)
                packed.append(signed64(v))
        elif f == 7 and wt == 0:
            packed.append(signed64(varint(val, 0)[0]))
        elif f == 14 and wt == 0 and varint(val, 0)[0] == 1:
            external = True
    if data_type != 7:
        return None
    if external:
        raise Refused("stored outside the model file")
    if raw is not None:
        return list(struct.unpack(f"<{len(raw) // 8}q", raw))
    return packed


def with_int64s(tensor, values):
    """The TensorProto with its values replaced, kept in the same field."""
    has_raw = any(f == 9 for f, _, _ in fields(tensor))
    kept = [(f, wt, raw) for f, wt, raw in fields(tensor) if f not in (7, 9)]
    if has_raw:
        return encode(kept + [(9, 2, struct.pack(f"<{len(values)}q", *values))])
    return encode(kept + [(7, 2, b"".join(enc_varint(v) for v in values))])


def plan_reshapes(g, batches):
    """The constant Reshape targets to edit: {constant name: new values},
    and a line per edited Reshape. Raises Refused where it cannot."""
    inits = {}
    constants = {}  # output name -> the Constant node's `value` tensor
    nodes = []
    for field, wt, raw in fields(g):
        if field == 5 and wt == 2:
            inits[string(raw, 8)] = raw
        elif field == 1 and wt == 2:
            nodes.append(raw)
            if string(raw, 4) == "Constant":
                for f, w, attr in fields(raw):
                    # AttributeProto: name=1, t=5.
                    if f == 5 and w == 2 and string(attr, 1) == "value":
                        tensors = [t for ff, ww, t in fields(attr) if ff == 5 and ww == 2]
                        if tensors:
                            constants[strings(raw, 2)[0]] = tensors[0]
    edits, lines = {}, []
    for node in nodes:
        op, ins = string(node, 4), strings(node, 1)
        if op != "Reshape" or string(node, 7) not in ("", "ai.onnx") or len(ins) < 2:
            continue
        shape_name = ins[1]
        tensor = inits.get(shape_name, constants.get(shape_name))
        if tensor is None:
            continue  # computed at run time
        label = f"Reshape {string(node, 3)!r} (target {shape_name!r})"
        try:
            values = int64s(tensor)
        except Refused as e:
            raise Refused(f"{label}: its target is {e}") from None
        if not values or values[0] not in batches:
            continue
        if -1 in values[1:]:
            raise Refused(
                f"{label}: its constant target {values} fixes the batch ({values[0]}) and "
                "already infers another dimension (-1), so the batch cannot be freed there; "
                "edit the model (e.g. 0 to copy the input's first dimension)")
        new = [-1] + values[1:]
        if edits.get(shape_name, new) != new:
            raise Refused(f"{label}: conflicting edits")
        if shape_name not in edits:
            lines.append(f"{label}: {values} -> {new}")
        edits[shape_name] = new
    # An edited constant must feed Reshape targets only.
    for node in nodes:
        ins = strings(node, 1)
        for k, name in enumerate(ins):
            if name in edits and not (string(node, 4) == "Reshape" and k == 1):
                raise Refused(
                    f"constant {name!r} is a Reshape target that fixes the batch, and also an "
                    f"input of {string(node, 4)} {string(node, 3)!r}: it cannot be edited for one "
                    "without changing the other")
    outputs = {string(raw, 1) for f, wt, raw in fields(g) if f == 12 and wt == 2}
    for name in edits:
        if name in outputs:
            raise Refused(f"constant {name!r} is a Reshape target and a graph output")
    return edits, lines


def free_batch(model):
    """The edited model and the lines describing the Reshape edits."""
    report = []

    def graph(g):
        # GraphProto: node=1, initializer=5 (TensorProto.name=8), input=11,
        # output=12.
        inits = {string(raw, 8) for f, wt, raw in fields(g) if f == 5 and wt == 2}
        batches = set()
        for field, wt, raw in fields(g):
            if field == 11 and wt == 2 and string(raw, 1) not in inits:
                b = first_dim_value(raw)
                if b is not None and b > 0:
                    batches.add(b)
        edits, lines = plan_reshapes(g, batches)
        report.extend(lines)
        out = []
        for field, wt, raw in fields(g):
            if (field == 12 or (field == 11 and string(raw, 1) not in inits)) and wt == 2:
                # ValueInfoProto.type=2; TypeProto.tensor_type=1;
                # Tensor.shape=2; TensorShapeProto.dim=1 (the first one).
                raw = edit(raw, [2, 1, 2, (1, "first")], free_dim)
            elif field == 5 and wt == 2 and string(raw, 8) in edits:
                raw = with_int64s(raw, edits[string(raw, 8)])
            elif field == 1 and wt == 2 and string(raw, 4) == "Constant" and \
                    strings(raw, 2)[0] in edits:
                new = edits[strings(raw, 2)[0]]
                raw = edit(raw, [5], lambda a: edit(a, [5], lambda t: with_int64s(t, new))
                           if string(a, 1) == "value" else a)
            out.append((field, wt, raw))
        return encode(out)

    # ModelProto.graph=7.
    return edit(model, [7], graph), report


def main():
    if len(sys.argv) != 3:
        print("usage: onnx-free-batch.py IN.onnx OUT.onnx", file=sys.stderr)
        sys.exit(2)
    src, dst = sys.argv[1:]
    model = open(src, "rb").read()
    try:
        out, report = free_batch(model)
    except Refused as e:
        print(f"onnx-free-batch: {src}: refused: {e}", file=sys.stderr)
        sys.exit(1)
    for line in report:
        print(f"onnx-free-batch: {line}", file=sys.stderr)
    if report:
        print(f"onnx-free-batch: {len(report)} Reshape target(s) freed", file=sys.stderr)
    open(dst, "wb").write(out)


main()
