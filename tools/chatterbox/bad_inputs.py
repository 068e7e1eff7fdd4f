#!/usr/bin/env python3
"""Small GGUF files for the bad-input tests, derived from the converted fixture.

- `s3gen-standard-meta.gguf`: the S3Gen metadata with `meanflow` false and variant `standard`
  (what Multilingual's decoder converts to), without tensors: pairing it with a Turbo T3 must
  fail before any weights load.

Usage: bad_inputs.py FIXTURE_DIR
"""

import sys
from pathlib import Path

import gguf


def main() -> int:
    fixture = Path(sys.argv[1])
    r = gguf.GGUFReader(str(fixture / "s3gen-meanflow.gguf"))
    arch = "chatterbox-s3gen"
    out = fixture / "bad" / "s3gen-standard-meta.gguf"
    out.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(out), arch)
    for name, field in r.fields.items():
        if not name.startswith(arch + "."):
            continue
        value = field.contents()
        if name == f"{arch}.meanflow":
            value = False
        elif name == f"{arch}.variant":
            value = "standard"
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_array(name, value)
        else:
            w.add_key_value(name, value, vtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    print(f"{out}: {len(r.fields)} keys, no tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
