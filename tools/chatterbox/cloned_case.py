#!/usr/bin/env python3
"""Voice cloning end to end: `ChatterboxTurboTTS.generate(text, audio_prompt_path=WAV)` on the
tiny Turbo checkpoint directory (make_fixtures.py), with every random draw recorded.

The reference recording is 10 s of a synthetic voiced signal at 24 kHz, 16-bit PCM, between
quiet noise. It is not committed: `reference_pcm()` defines it sample by sample (sines and a
32-bit LCG, rounded half to even) and the engine's test rebuilds the same bytes; `case.json`
holds their SHA-256 so that a difference shows as such.

The official code runs unchanged: `librosa.load`, the 5 s check, pyloudnorm's −27 LUFS step,
`embed_ref`, the S3Tokenizer prompt, the VoiceEncoder, then generation as pipeline_case.py runs
it (recorded uniforms, capped length, no watermark).

Output, in OUT_DIR:
  case.json        text, the cap, speech tokens, the recording's SHA-256, its loudness before the
                   step (pyloudnorm), the sample count
  reference.voice  the conditionals prepare_conditionals computed, written with gguf-py in the
                   engine's voice-file layout (docs/gguf.md): the engine reads a file it did not write
  t3_uniforms.npy, cfm_z.npy, sine_phase.npy, sine_noise.npy, speech_tokens.npy, wav.npy

Usage: cloned_case.py CKPT_DIR OUT_DIR  (the Chatterbox venv)
"""

import hashlib
import io
import json
import math
import sys
import wave
from pathlib import Path

import gguf
import numpy as np
import pyloudnorm
import torch

sys.path.insert(0, str(Path(__file__).parent))
import make_fixtures as mf  # noqa: E402  (registers the tiny configurations)

from chatterbox.tts_turbo import ChatterboxTurboTTS, Conditionals  # noqa: E402

TEXT = "hello there, the quick brown fox"
MAX_GEN_LEN = 8
SEED = 2468
RATE = 24000
SECONDS = 10


def reference_pcm():
    """The recording's 16-bit samples. Quiet noise for the first and last 0.5 s (trimmed as
    silence), a voiced signal with a 2.5 Hz envelope between."""
    state = 0x2545F491
    out = []
    for n in range(RATE * SECONDS):
        state = (state * 1664525 + 1013904223) % (1 << 32)
        noise = state / 2**32 * 2.0 - 1.0
        t = n / RATE
        if 0.5 <= t < SECONDS - 0.5:
            env = 0.55 + 0.45 * math.sin(2 * math.pi * 2.5 * t)
            x = env * (0.35 * math.sin(2 * math.pi * 140 * t) + 0.2 * math.sin(2 * math.pi * 280 * t + 0.5)
                       + 0.1 * math.sin(2 * math.pi * 1130 * t)) + 0.03 * noise
        else:
            x = 0.002 * noise
        out.append(int(round(x * 32767)))
    return out


def reference_wav_bytes():
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(np.array(reference_pcm(), dtype="<i2").tobytes())
    return buf.getvalue()


def write_voice(path, conds, variant):
    t3, gen = conds.t3, conds.gen
    w = gguf.GGUFWriter(str(path), "chatterbox-voice")
    w.add_uint32("chatterbox-voice.format_version", 1)
    w.add_string("chatterbox-voice.variant", variant)
    prompt = t3.cond_prompt_speech_tokens.reshape(-1).numpy().astype(np.int32)
    w.add_uint32("chatterbox-voice.prompt_speech_tokens", prompt.size)
    w.add_tensor("voice.speaker_emb", t3.speaker_emb.reshape(-1).numpy().astype(np.float32))
    if prompt.size:
        w.add_tensor("voice.prompt_speech_tokens", prompt)
    w.add_tensor("voice.prompt_token", gen["prompt_token"].reshape(-1).numpy().astype(np.int32))
    w.add_tensor("voice.prompt_feat", gen["prompt_feat"][0].numpy().astype(np.float32))  # (frames, 80)
    w.add_tensor("voice.embedding", gen["embedding"].reshape(-1).numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> int:
    ckpt, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    wav_bytes = reference_wav_bytes()
    wav_path = out / "reference.wav"
    wav_path.write_bytes(wav_bytes)

    t3, s3gen, ve, tokenizer = mf.load_tiny_turbo(ckpt)
    tts = ChatterboxTurboTTS(t3, s3gen, ve, tokenizer, "cpu", conds=None)
    import librosa
    loaded, _ = librosa.load(wav_path, sr=RATE)
    loudness = float(pyloudnorm.Meter(RATE).integrated_loudness(loaded))
    uniforms, drawn, z, phase, sine_noise, wav = mf.generate_recorded(tts, SEED, MAX_GEN_LEN, TEXT, audio_prompt_path=str(wav_path))
    wav_path.unlink()

    write_voice(out / "reference.voice", tts.conds, "turbo")
    case = {"text": TEXT, "max_new_tokens": MAX_GEN_LEN, "reference_sha256": hashlib.sha256(wav_bytes).hexdigest(),
            "reference_rate": RATE, "reference_seconds": SECONDS, "loudness_lufs": loudness,
            "note": "ChatterboxTurboTTS.generate(audio_prompt_path=reference) with recorded draws; no watermark"}
    mf.save_pipeline_case(out, uniforms, drawn, z, phase, sine_noise, wav, case)
    print(f"{out}: {len(drawn)} speech tokens, {wav.numel()} samples, reference at {loudness:.2f} LUFS, "
          f"T3 prompt {tts.conds.t3.cond_prompt_speech_tokens.numel()} tokens, "
          f"S3Gen prompt {tts.conds.gen['prompt_token'].numel()} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
