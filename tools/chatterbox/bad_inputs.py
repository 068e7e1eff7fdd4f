#!/usr/bin/env python3
"""Small GGUF files for the bad-input tests, derived from the converted fixtures, metadata only
(no tensors): each must be refused before any weights load.

- `<turbo>/bad/s3gen-standard-meta.gguf`: the Turbo S3Gen's metadata with `meanflow` false and
  variant `standard` (what Multilingual's decoder converts to); paired with a Turbo T3.
- `<mtl>/bad/t3-mtl-turbo-tokenizer.gguf`: the Multilingual T3's metadata with the Turbo T3's
  GPT-2 tokenizer embedded in place of the grapheme one.

Usage: bad_inputs.py TURBO_FIXTURE_DIR MTL_FIXTURE_DIR
"""

import sys
from pathlib import Path

import gguf


def rewrite_metadata(src, out, arch, replace):
    """Copies the `arch.*` keys of `src` into a tensor-less `out`, values in `replace` swapped."""
    r = gguf.GGUFReader(str(src))
    out.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(out), arch)
    for name, field in r.fields.items():
        if not name.startswith(arch + "."):
            continue
        value = replace.get(name, field.contents())
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_array(name, value)
        else:
            w.add_key_value(name, value, vtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    print(f"{out}: {len(r.fields)} keys, no tensors")


def main() -> int:
    turbo, mtl = Path(sys.argv[1]), Path(sys.argv[2])
    s3 = "chatterbox-s3gen"
    rewrite_metadata(turbo / "s3gen-meanflow.gguf", turbo / "bad" / "s3gen-standard-meta.gguf", s3,
                     {f"{s3}.meanflow": False, f"{s3}.variant": "standard"})
    key = "chatterbox.tokenizer_json"
    gpt2 = gguf.GGUFReader(str(turbo / "t3-turbo.gguf")).fields[key].contents()
    rewrite_metadata(mtl / "t3-mtl.gguf", mtl / "bad" / "t3-mtl-turbo-tokenizer.gguf", "chatterbox", {key: gpt2})
    return 0


if __name__ == "__main__":
    sys.exit(main())
