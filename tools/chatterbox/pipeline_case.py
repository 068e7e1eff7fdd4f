#!/usr/bin/env python3
"""End-to-end reference case: `ChatterboxTurboTTS.generate(text)` on a checkpoint directory
written by make_fixtures.py (tiny size), with every random draw recorded.

The official `generate` runs unchanged: punc_norm, the tokenizer the directory holds, T3
`inference_turbo` with the default sampling parameters, the token filter and the three silence
tokens, `s3gen.inference` (meanflow, 2 steps) and the trim fade. Two things are swapped:
- `torch.multinomial` draws by inverse CDF from a recorded uniform (the engine takes the same
  uniforms), and `max_gen_len` is capped so the case stays small;
- the Perth watermark is skipped (the engine does not watermark).

Output, in OUT_DIR: `case.json` (text, normalised text, token ids, the cap), and the draws the
engine can inject: `t3_uniforms.npy`, `cfm_z.npy` (the initial Euler state as used, (1, 80, T)),
`sine_phase.npy`, `sine_noise.npy`; the result: `speech_tokens.npy`, `wav.npy`.

Usage: pipeline_case.py CKPT_DIR OUT_DIR
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import make_fixtures as mf  # noqa: E402  (registers the tiny configurations)

from chatterbox.tts_turbo import ChatterboxTurboTTS, Conditionals, punc_norm  # noqa: E402

TEXT = "hello there, the quick brown fox jumps over the lazy dog"
MAX_GEN_LEN = 12
SEED = 4321


def main() -> int:
    ckpt, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    t3, s3gen, ve, tokenizer = mf.load_tiny_turbo(ckpt)
    tts = ChatterboxTurboTTS(t3, s3gen, ve, tokenizer, "cpu", conds=Conditionals.load(ckpt / "conds.pt"))
    uniforms, drawn, z, phase, sine_noise, wav = mf.generate_recorded(tts, SEED, MAX_GEN_LEN, TEXT)

    norm = punc_norm(TEXT)
    ids = tokenizer(norm).input_ids
    case = {"text": TEXT, "normalized": norm, "ids": ids, "max_new_tokens": MAX_GEN_LEN,
            "note": "ChatterboxTurboTTS.generate with recorded draws; no watermark"}
    mf.save_pipeline_case(out, uniforms, drawn, z, phase, sine_noise, wav, case)
    print(f"{out}: {len(ids)} text tokens, {len(drawn)} speech tokens, {wav.numel()} samples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
