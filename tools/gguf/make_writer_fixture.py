#!/usr/bin/env python3
"""The reference GGUFs the native writer (engine-core's model_kit::convert) is
compared with: gguf-py's GGUFWriter driven exactly as tools/chatterbox/convert.py
and tools/supertonic/convert.py drive it, from a plan a test can also read.

A plan is a directory holding `plan.json` and one `.npy` per tensor:
    {"arch": "...",
     "meta": [[key, kind, value], ...],      # kind: u32 i32 f32 bool str name arr
     "tensors": [[name, storage, "file.npy"], ...]}
storage: f32, f16 (gguf.quants.quantize, as the Chatterbox converter), f16_astype
(`astype(np.float16)`, as the Supertonic converter), bf16, q8_0, q4_0 (quantize
with raw_dtype), i32, i16.

Usage:
    make_writer_fixture.py write PLAN_DIR OUT.gguf   # the GGUF of an existing plan
    make_writer_fixture.py fixture OUT_DIR           # the committed edge-case plan + its GGUF
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gguf_atomic import write_atomically  # noqa: E402

RAW = {"bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0,
       "q4_0": gguf.GGMLQuantizationType.Q4_0, "f16": gguf.GGMLQuantizationType.F16}


def write(plan_dir: Path, out: Path) -> None:
    plan = json.loads((plan_dir / "plan.json").read_text())
    w = gguf.GGUFWriter(str(out), plan["arch"])
    for key, kind, value in plan["meta"]:
        if kind == "u32":
            w.add_uint32(key, int(value))
        elif kind == "i32":
            w.add_int32(key, int(value))
        elif kind == "f32":
            w.add_float32(key, float(value))
        elif kind == "bool":
            w.add_bool(key, bool(value))
        elif kind == "str":
            w.add_string(key, value)
        elif kind == "name":
            w.add_name(value)
        elif kind == "arr":
            w.add_array(key, value)
        else:
            raise ValueError(f"unknown metadata kind {kind}")
    for name, storage, file in plan["tensors"]:
        v = np.load(plan_dir / file)
        if storage == "f32":
            w.add_tensor(name, np.ascontiguousarray(v, dtype=np.float32))
        elif storage == "f16_astype":
            w.add_tensor(name, np.ascontiguousarray(v, dtype=np.float32).astype(np.float16))
        elif storage in RAW:
            w.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(v, dtype=np.float32), RAW[storage]), raw_dtype=RAW[storage])
        elif storage == "i32":
            w.add_tensor(name, v.astype(np.int32))
        elif storage == "i16":
            w.add_tensor(name, v.astype(np.int16))
        else:
            raise ValueError(f"unknown storage {storage}")
    write_atomically(w, out)


def edge_plan(out_dir: Path) -> None:
    """Every storage type and metadata kind, with the values encoders get wrong."""
    rng = np.random.default_rng(33)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = []

    def add(name: str, storage: str, value: np.ndarray) -> None:
        file = f"{name}.npy"
        np.save(out_dir / file, value)
        tensors.append([name, storage, file])

    def spread(*shape) -> np.ndarray:
        """Normal values over magnitudes from 1e-8 to 1e8."""
        return (rng.standard_normal(shape) * np.exp(rng.uniform(-18, 18, shape))).astype(np.float32)

    # Q8_0: a zero block, exact .5 ties after scaling (max 127 makes d = 1),
    # negatives, huge and subnormal values, a lone maximum.
    q8 = spread(6, 64)
    q8[0, :32] = 0
    q8[1, :32] = np.arange(32, dtype=np.float32) - 15.5
    q8[1, 0] = 127
    q8[1, 32:] = -(np.arange(32, dtype=np.float32) + 0.5)
    q8[1, 63] = -127
    q8[2, :32] = 1e-41  # subnormal
    q8[2, 32:] = rng.standard_normal(32).astype(np.float32) * 5e37
    q8[3, :32] = 0
    q8[3, 5] = -1e-3
    add("q8_0.edges", "q8_0", q8)
    add("q8_0.random", "q8_0", rng.standard_normal((16, 96)).astype(np.float32))
    add("q8_0.cube", "q8_0", spread(2, 3, 32))

    # Q4_0: a zero block, the largest magnitude negative, equal magnitudes of
    # both signs (the first wins), values landing on .5 after scaling.
    q4 = spread(6, 64)
    q4[0, :32] = 0
    q4[1, :32] = rng.standard_normal(32).astype(np.float32)
    q4[1, 7] = -8
    q4[1, 32:] = np.linspace(-8, 8, 32, dtype=np.float32)
    q4[2, :32] = rng.standard_normal(32).astype(np.float32)
    q4[2, 3], q4[2, 20] = -5.0, 5.0
    q4[2, 32:] = rng.standard_normal(32).astype(np.float32)
    q4[2, 40], q4[2, 41] = 5.0, -5.0
    q4[3, :32] = np.float32(16) - np.arange(32, dtype=np.float32) * 0.5
    q4[4, :32] = 1e-41
    q4[4, 32:] = rng.standard_normal(32).astype(np.float32) * 5e37
    add("q4_0.edges", "q4_0", q4)
    add("q4_0.random", "q4_0", rng.standard_normal((16, 96)).astype(np.float32))

    # F16: subnormals, the smallest subnormal and half of it (a tie to zero),
    # ties between neighbours, the largest finite value and past it, signed zero.
    f16 = spread(4, 40)
    f16[0, :12] = [6e-8, 2.98e-8, 5.96e-8, 1e-5, -1e-6, 65504, 65519, 65520, -70000, -0.0, 1 + 2 ** -11, 1 + 3 * 2 ** -11]
    f16[1, :8] = [np.inf, -np.inf, 1e-30, -1e-30, 2049, 2051, 4097, 0.1]
    # NaNs: quiet, signalling (NumPy keeps them so), negative, with payloads.
    f16[2, :6] = np.array([0x7FC00000, 0x7F800001, 0xFFC00001, 0x7FA00000, 0x7F802000, 0xFFFFFFFF], dtype=np.uint32).view(np.float32)
    add("f16.edges", "f16", f16)
    add("f16.astype", "f16_astype", spread(5, 33))

    # BF16: ties (odd and even), the largest finite float (rounds to infinity),
    # subnormals, infinities, NaNs (made quiet).
    bf = spread(3, 16)
    bits = np.array([0x3F808000, 0x3F818000, 0x3F807FFF, 0x7F7FFFFF, 0x00000001, 0x80008000, 0x7F800000, 0xFF800000],
                    dtype=np.uint32)
    bf[0, :8] = bits.view(np.float32)
    bf[1, :4] = np.array([0x7FC00000, 0x7F800001, 0xFFC00001, 0xFFFFFFFF], dtype=np.uint32).view(np.float32)
    add("bf16.edges", "bf16", bf)
    add("bf16.cube", "bf16", spread(2, 2, 24))

    add("f32.plain", "f32", spread(3, 5, 7))
    add("f32.scalar", "f32", np.array(1.5, dtype=np.float32))
    add("f32.vector", "f32", spread(13))
    add("i32.values", "i32", rng.integers(-2 ** 31, 2 ** 31 - 1, size=(3, 7), dtype=np.int64))
    add("i16.values", "i16", rng.integers(-2 ** 15, 2 ** 15 - 1, size=65, dtype=np.int64))

    meta = [
        ["general.name", "name", "Writer fixture"],
        ["fixture.u32", "u32", 4000000000],
        ["fixture.i32", "i32", -123456],
        ["fixture.f32", "f32", 0.1],
        ["fixture.f32_small", "f32", 1e-40],
        ["fixture.true", "bool", True],
        ["fixture.false", "bool", False],
        ["fixture.text", "str", "Grüße, 世界 \"quoted\"\nnew line"],
        ["fixture.empty_text", "str", ""],
        ["fixture.ints", "arr", [1, -2, 3, 2147483647]],
        ["fixture.floats", "arr", [0.5, -1e-3, 3.0e38]],
        ["fixture.strings", "arr", ["en", "ko", ""]],
        ["fixture.empty_array", "arr", []],
        ["fixture.u32", "u32", 7],  # added again: keeps its place, takes the value
    ]
    (out_dir / "plan.json").write_text(json.dumps({"arch": "writer-fixture", "meta": meta, "tensors": tensors}, indent=1,
                                                  ensure_ascii=False) + "\n")


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "write":
        write(Path(argv[1]), Path(argv[2]))
    elif len(argv) == 2 and argv[0] == "fixture":
        out = Path(argv[1])
        edge_plan(out)
        write(out, out / "expected.gguf")
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
