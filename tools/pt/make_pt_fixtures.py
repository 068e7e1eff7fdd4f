"""Tiny `.pt` checkpoints for engine-core's restricted torch pickle reader
(engine-core/src/model_kit/torch_pickle.rs, tests in
engine-core/tests/torch_pickle.rs), written to tests/fixtures/pt/.

Run from the repository root with the Chatterbox venv (torch and
chatterbox-tts 0.1.7):

    target/chatterbox-venv/bin/python tools/pt/make_pt_fixtures.py

Writes:
- state_dict.pt / state_dict.json: an nn.Linear's state dict (with its
  `_metadata`) plus F32, F16, BF16, I64 and I32 tensors, a transposed and an
  offset view sharing one storage, and an nn.Parameter; the JSON holds each
  tensor's dtype, shape and values as torch reads them.
- conds.pt / conds.json: what chatterbox's `Conditionals.save` writes (the real
  class), a dict {"t3": T3Cond.__dict__, "gen": {...}} with None entries.
- os_system.pt, builtins_eval.pt: zips laid out as torch.save writes them whose
  data.pkl calls os.system / builtins.eval (raw opcodes); posix_system.pt:
  torch.save of a state dict with an object whose __reduce__ is os.system
  (pickled as posix.system). Each command is `touch` of MARKER padded with
  spaces to 200 bytes: a test replaces it with a path in its own temporary
  directory (same length, so the pickle stays valid) and proves the file never
  appears. This script checks that Python's pickle does run each command.
- missing_pkl.pt (no data.pkl), short_storage.pt (a storage cut short),
  huge_shape.pt (a tensor declaring 2**40 elements on a 16-byte storage),
  huge_string.pt (a BINUNICODE declaring a 2 GiB string).
"""

import io
import json
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "pt"
PLACEHOLDER = "MARKER"
CMD_LEN = 200


def command(marker: str) -> str:
    cmd = f"touch {marker}"
    assert len(cmd) <= CMD_LEN
    return cmd + " " * (CMD_LEN - len(cmd))


def describe(t: torch.Tensor) -> dict:
    dtype = {
        torch.float32: "F32",
        torch.float16: "F16",
        torch.bfloat16: "BF16",
        torch.int64: "I64",
        torch.int32: "I32",
    }[t.dtype]
    values = t.detach().float().flatten().tolist() if t.is_floating_point() else t.flatten().tolist()
    return {"dtype": dtype, "shape": list(t.shape), "values": values}


def flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat(v, name + "."))
        elif torch.is_tensor(v):
            out[name] = describe(v)
        else:
            out[name] = {"value": v}
    return out


def save_json(name: str, d: dict) -> None:
    (OUT / name).write_text(json.dumps(d, indent=1) + "\n")


def state_dict() -> None:
    torch.manual_seed(33)
    lin = torch.nn.Linear(4, 3)
    sd = lin.state_dict()  # an OrderedDict with _metadata (pickled with BUILD)
    base = torch.randn(4, 6)
    sd["f16"] = torch.randn(2, 3).half()
    sd["bf16"] = torch.randn(5).bfloat16()
    sd["ids"] = torch.tensor([[-3, 0, 2**40], [7, -(2**35), 1]], dtype=torch.int64)
    sd["i32"] = torch.tensor([1, -2, 2**31 - 1], dtype=torch.int32)
    sd["base"] = base
    sd["base_t"] = base.t()  # the same storage, strides (1, 6)
    sd["base_tail"] = base[1:, 2:]  # the same storage, offset 8
    sd["scalar"] = torch.tensor(2.5)
    sd["param"] = torch.nn.Parameter(torch.arange(6, dtype=torch.float32).reshape(2, 3))
    torch.save(sd, OUT / "state_dict.pt")
    save_json("state_dict.json", flat(sd))


def conds() -> None:
    from chatterbox.mtl_tts import Conditionals
    from chatterbox.models.t3.modules.cond_enc import T3Cond

    torch.manual_seed(34)
    t3 = T3Cond(
        speaker_emb=torch.randn(1, 8),
        cond_prompt_speech_tokens=torch.randint(0, 6561, (1, 5)),
        emotion_adv=0.5 * torch.ones(1, 1, 1),
    )
    gen = dict(
        prompt_token=torch.randint(0, 6561, (1, 4)),
        prompt_token_len=torch.tensor([4]),
        prompt_feat=torch.randn(1, 8, 4),
        prompt_feat_len=None,
        embedding=torch.randn(1, 6),
    )
    Conditionals(t3, gen).save(OUT / "conds.pt")
    save_json("conds.json", flat(dict(t3=t3.__dict__, gen=gen)))


def torch_like_zip(path: Path, pkl: bytes, storages: dict, stem: str = "archive", with_pkl: bool = True) -> None:
    """A zip with torch.save's layout and stored (uncompressed) entries."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        if with_pkl:
            z.writestr(f"{stem}/data.pkl", pkl)
        z.writestr(f"{stem}/byteorder", "little")
        for key, data in storages.items():
            z.writestr(f"{stem}/data/{key}", data)
        z.writestr(f"{stem}/version", "3\n")


def raw_call(module: str, name: str, arg: str) -> bytes:
    """PROTO 2; GLOBAL module.name; BINUNICODE arg; TUPLE1; REDUCE; STOP."""
    a = arg.encode()
    return b"\x80\x02c" + f"{module}\n{name}\n".encode() + b"X" + struct.pack("<I", len(a)) + a + b"\x85R."


class Evil:
    def __reduce__(self):
        return (os.system, (command(PLACEHOLDER),))


def check_live(pkl: bytes) -> None:
    """Python's own unpickler runs the command: the fixture is a real attack."""
    with tempfile.TemporaryDirectory() as d:
        marker = os.path.join(d, "m")
        live = pkl.replace(command(PLACEHOLDER).encode(), command(marker).encode())
        code = "import pickle,sys\ntry:\n pickle.loads(sys.stdin.buffer.read())\nexcept Exception:\n pass\n"
        subprocess.run([sys.executable, "-c", code], input=live, check=True)
        assert os.path.exists(marker), "the malicious fixture did not run its command under Python"


def malicious() -> None:
    cmd = command(PLACEHOLDER)
    pkl = raw_call("os", "system", cmd)
    check_live(pkl)
    torch_like_zip(OUT / "os_system.pt", pkl, {})
    pkl = raw_call("builtins", "eval", f"__import__('os').system({cmd!r})")
    check_live(pkl)
    torch_like_zip(OUT / "builtins_eval.pt", pkl, {})
    # As torch.save itself writes it: a tensor first, then the object.
    torch.save({"w": torch.ones(2), "evil": Evil()}, OUT / "posix_system.pt")
    with zipfile.ZipFile(OUT / "posix_system.pt") as z:
        data = z.read("posix_system/data.pkl")
    assert b"posix\nsystem\n" in data or b"os\nsystem\n" in data


def broken() -> None:
    good = OUT / "state_dict.pt"
    with zipfile.ZipFile(good) as z:
        entries = {i.filename: z.read(i.filename) for i in z.infolist()}
    pkl = entries["state_dict/data.pkl"]
    storages = {n.split("/")[-1]: b for n, b in entries.items() if "/data/" in n}

    torch_like_zip(OUT / "missing_pkl.pt", b"", storages, with_pkl=False)

    # The storage of `base` (and its views) cut to 10 bytes.
    key = next(k for k, b in storages.items() if len(b) == 4 * 24)
    short = dict(storages)
    short[key] = storages[key][:10]
    torch_like_zip(OUT / "short_storage.pt", pkl, short, stem="state_dict")

    # A 1-d F32 tensor of 2**40 elements on a storage of 4.
    p = io.BytesIO()
    p.write(b"\x80\x02}q\x00X\x04\x00\x00\x00hugeq\x01ctorch._utils\n_rebuild_tensor_v2\nq\x02(")
    p.write(b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQ")
    p.write(b"K\x00\x8a\x06" + (2**40).to_bytes(6, "little") + b"\x85K\x01\x85\x89ccollections\nOrderedDict\n)Rt")
    p.write(b"Rs.")
    torch_like_zip(OUT / "huge_shape.pt", p.getvalue(), {"0": b"\0" * 16})

    # A BINUNICODE that declares 2 GiB in a pickle of a few bytes.
    torch_like_zip(OUT / "huge_string.pt", b"\x80\x02}X" + struct.pack("<I", 2**31) + b"ab", {})


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    state_dict()
    conds()
    malicious()
    broken()
    for p in sorted(OUT.iterdir()):
        print(p.relative_to(ROOT), p.stat().st_size)


if __name__ == "__main__":
    main()
