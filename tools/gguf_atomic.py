"""Shared by the converters: write a filled `gguf.GGUFWriter` to its final path
through `<path>.part`, so a failed conversion never leaves a partial model file."""

from pathlib import Path


def write_atomically(writer, path: Path) -> None:
    tmp = path.with_name(path.name + ".part")
    try:
        writer.write_header_to_file(path=tmp)
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
