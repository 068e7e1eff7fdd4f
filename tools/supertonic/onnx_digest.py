#!/usr/bin/env python3
"""Digest of what onnx.numpy_helper reads from ONNX files (every initializer and
Constant value as float32 or int64 bytes, and the node list), for the native ONNX
reader's test (engine-core/tests/onnx_reader.rs).

Usage: onnx_digest.py FILE.onnx ... > tests/fixtures/onnx/tiny_supertonic_digest.json
"""
import hashlib, json, sys, struct
import numpy as np, onnx
from onnx import numpy_helper, helper

def tensor_digest(t):
    a = numpy_helper.to_array(t)
    kind = "f32" if a.dtype.kind == "f" else "i64"
    b = np.ascontiguousarray(a, dtype="<f4" if kind == "f32" else "<i8").tobytes()
    return {"dims": list(a.shape), "as": kind, "sha256": hashlib.sha256(b).hexdigest()}

def node_line(n):
    attrs = []
    for a in n.attribute:
        v = helper.get_attribute_value(a)
        if a.type == onnx.AttributeProto.FLOAT: s = "f:%08x" % struct.unpack("<I", struct.pack("<f", v))[0]
        elif a.type == onnx.AttributeProto.INT: s = "i:%d" % v
        elif a.type == onnx.AttributeProto.INTS: s = "is:" + ",".join(map(str, v))
        elif a.type == onnx.AttributeProto.FLOATS: s = "fs:" + ",".join("%08x" % struct.unpack("<I", struct.pack("<f", x))[0] for x in v)
        elif a.type == onnx.AttributeProto.STRING: s = "s:" + v.hex()
        elif a.type == onnx.AttributeProto.TENSOR: s = "t:" + tensor_digest(v)["sha256"]
        else: s = "other"
        attrs.append(f"{a.name}={s}")
    return "\t".join([n.op_type, n.name, ",".join(n.input), ",".join(n.output), ";".join(attrs)]) + "\n"

out = {}
for path in sys.argv[1:]:
    m = onnx.load(path)
    g = m.graph
    inits = [{"name": t.name, **tensor_digest(t)} for t in g.initializer]
    consts = [{"name": n.output[0], **tensor_digest(a.t)} for n in g.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"]
    nodes = hashlib.sha256("".join(node_line(n) for n in g.node).encode()).hexdigest()
    out[path] = {"initializers": inits, "constants": consts, "nodes": len(g.node), "nodes_sha256": nodes}
json.dump(out, sys.stdout, separators=(",", ":"))
print()
