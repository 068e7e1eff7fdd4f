#!/usr/bin/env python3
"""Voice cloning: `tts bench --reference` against the PyTorch reference's `prepare_conditionals`
on the same full-size random weights and the same recording, in one run.

The recording is 10 s of a synthetic voiced signal at 24 kHz (16-bit WAV, so `librosa.load`
does not resample). The reference side runs the official `prepare_conditionals` of the
variant (`ChatterboxMultilingualTTS` or `ChatterboxTurboTTS`, the latter with its 5 s check
and −27 LUFS step) on the checkpoint's VoiceEncoder and S3Gen (CAMPPlus, S3Tokenizer), F32,
CPU, `torch.set_num_threads(THREADS)`: from the file to the conditionals. T3's backbone is
not needed for cloning and is not loaded; its prompt length comes from the variant's config.
The `tts` side is `tts bench --reference` on the GGUF files converted from the same
directory: the sum of its `clone.*` stage medians (read, resample, prompt mel, CAMPPlus,
S3Tokenizer, VoiceEncoder). Each side runs warm-up calls first, then the median of `--runs`.
The ratio is reference time / tts time (above 1: tts is faster).

    target/chatterbox-venv/bin/python bench/cloning_vs_torch.py [--variant mtl|turbo] [--threads 2] [--runs 5]

Checkpoint directories as in bench/chatterbox_vs_torch.py: target/chatterbox-mtl-full (gguf-f32/
inside), target/chatterbox-full for Turbo.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import wave

import numpy as np

from benchlib import cpu_name, run, tts_profile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = {
    "mtl": ("chatterbox-mtl-full", "t3-mtl.gguf", "s3gen.gguf"),
    "turbo": ("chatterbox-full", "t3-turbo.gguf", "s3gen-meanflow.gguf"),
}


def write_recording(path, seconds=10, rate=24000):
    t = np.arange(seconds * rate) / rate
    rng = np.random.default_rng(5)
    env = 0.55 + 0.45 * np.sin(2 * np.pi * 2.5 * t)
    x = env * (0.35 * np.sin(2 * np.pi * 140 * t) + 0.2 * np.sin(2 * np.pi * 280 * t + 0.5)
               + 0.1 * np.sin(2 * np.pi * 1130 * t)) + 0.03 * rng.uniform(-1, 1, t.size)
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.round(x * 32767).astype("<i2").tobytes())


def reference_ms(variant, ckpt, wav, threads, runs, warmup):
    import torch
    torch.set_num_threads(threads)
    from chatterbox.models.s3gen import S3Gen
    from chatterbox.models.voice_encoder import VoiceEncoder
    from chatterbox.models.t3.modules.t3_config import T3Config
    if variant == "mtl":
        from chatterbox.mtl_tts import ChatterboxMultilingualTTS as Tts
        hp, s3 = T3Config.multilingual(), S3Gen(meanflow=False)
        s3.load_state_dict(torch.load(os.path.join(ckpt, "s3gen.pt"), weights_only=True), strict=False)
    else:
        from chatterbox.tts_turbo import ChatterboxTurboTTS as Tts
        from safetensors.torch import load_file
        hp, s3 = T3Config(text_tokens_dict_size=50276), S3Gen(meanflow=True)
        hp.speech_cond_prompt_len = 375  # as ChatterboxTurboTTS.from_local sets it
        s3.load_state_dict(load_file(os.path.join(ckpt, "s3gen_meanflow.safetensors")), strict=True)
    ve = VoiceEncoder()
    if os.path.exists(os.path.join(ckpt, "ve.pt")):
        ve.load_state_dict(torch.load(os.path.join(ckpt, "ve.pt"), weights_only=True))
    else:
        from safetensors.torch import load_file
        ve.load_state_dict(load_file(os.path.join(ckpt, "ve.safetensors")))
    s3.eval()
    ve.eval()

    class Stub:  # what prepare_conditionals reads of the model
        pass
    stub = Stub()
    stub.s3gen, stub.ve, stub.device = s3, ve, "cpu"
    stub.t3 = Stub()
    stub.t3.hp = hp
    stub.ENC_COND_LEN, stub.DEC_COND_LEN = Tts.ENC_COND_LEN, Tts.DEC_COND_LEN
    if hasattr(Tts, "norm_loudness"):
        stub.norm_loudness = lambda w, sr: Tts.norm_loudness(stub, w, sr)
    times = []
    with torch.inference_mode():
        for i in range(warmup + runs):
            start = time.perf_counter()
            Tts.prepare_conditionals(stub, wav)
            if i >= warmup:
                times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def tts_ms(t3, s3, wav, threads, runs, warmup):
    release = os.path.join(ROOT, "target", "release")
    with tempfile.TemporaryDirectory() as d:
        profile = os.path.join(d, "profile.toml")
        with open(profile, "w") as f:
            f.write(tts_profile("cpu", threads))
        out = run([os.path.join(release, "tts"), "bench", "--profile", profile, "--plugin-dir", release, "--model", t3, "--model", s3,
                   "--reference", wav, "--runs", str(runs), "--warmup", str(warmup), "--json"])
    stages = json.loads(out)["stages_ms"]
    return {k: v for k, v in stages.items() if k.startswith("clone.")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", choices=VARIANTS, default="mtl")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    args = ap.parse_args()
    ckpt_name, t3_name, s3_name = VARIANTS[args.variant]
    ckpt = os.path.join(ROOT, "target", ckpt_name)
    gguf = os.path.join(ckpt, "gguf-f32")
    if not os.path.isdir(gguf):
        sys.exit(f"{gguf} is missing: generate and convert the full-size checkpoint (see bench/chatterbox_vs_torch.py)")
    with tempfile.TemporaryDirectory() as d:
        wav = os.path.join(d, "reference.wav")
        write_recording(wav)
        ours = tts_ms(os.path.join(gguf, t3_name), os.path.join(gguf, s3_name), wav, args.threads, args.runs, args.warmup)
        theirs = reference_ms(args.variant, ckpt, wav, args.threads, args.runs, args.warmup)
    total = sum(ours.values())
    print(f"Voice cloning, Chatterbox {args.variant}, full-size random weights, 10 s reference at 24 kHz, "
          f"{args.threads} CPU threads, {cpu_name()}; medians of {args.runs} runs after {args.warmup} warm-up")
    for k, v in ours.items():
        print(f"  tts {k:<22} {v:8.1f} ms")
    print(f"  tts total                  {total:8.1f} ms")
    print(f"  PyTorch prepare_conditionals {theirs:8.1f} ms")
    print(f"  ratio (PyTorch / tts)      {theirs / total:8.2f}")


if __name__ == "__main__":
    main()
