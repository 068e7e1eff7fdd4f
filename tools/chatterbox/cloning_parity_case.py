#!/usr/bin/env python3
"""Cloning parity from a recording as a user makes one: 44.1 kHz, stereo, 16-bit, with
pauses and a noise floor. For the tiny Turbo and Multilingual checkpoints (make_fixtures.py,
make_mtl_fixtures.py), the official `prepare_conditionals` clones the recording from a WAV,
a FLAC and an MP3 copy, and `generate` runs once from the WAV with every draw recorded.

The recording is not committed: `recording_pcm()` defines it sample by sample (double
precision, a 32-bit LCG for the noise, rounded half to even), and the engine's test rebuilds
the same WAV bytes (`case.json` holds their SHA-256) and its own lossless FLAC copy. The MP3
is committed: encoders differ, so the engine must decode the very bytes the reference did.

Output, in OUT_DIR:
  case.json           the recording (rate, channels, seconds, WAV SHA-256), the SHA-256 of
                      librosa.load(sr=24000)'s float32 samples per format, and per variant the
                      text and draws of the end-to-end case
  recording.mp3       the MP3 copy (libsndfile's LAME encoder, constant bit rate)
  VARIANT/wav.voice   prepare_conditionals(WAV) as a voice file (docs/gguf.md); the FLAC copy
                      gives the same conditionals bit for bit (checked here), so it has none
  VARIANT/mp3.voice   prepare_conditionals(MP3)
  VARIANT/pipeline/   generate(text, audio_prompt_path=WAV) with recorded draws:
                      t3_uniforms, cfm_z, sine_phase, sine_noise, speech_tokens, wav, case.json

Usage (the Chatterbox venv):
  cloning_parity_case.py OUT_DIR --turbo TINY_TURBO_DIR --mtl TINY_MTL_DIR    the committed case
  cloning_parity_case.py OUT_DIR --full [--turbo DIR] [--mtl DIR] [--conditionals-only]
      full-size checkpoints (make_fixtures.py --size full, make_mtl_fixtures.py --size full),
      the same case (--conditionals-only: without T3 and generate()); the ignored test of
      models/chatterbox/tests/cloning_recording.rs reads it (TTS_CLONING_CASE)
"""

import argparse
import hashlib
import io
import json
import math
import os
import sys
import wave
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the Multilingual tokenizer asks the Hub for a Chinese table

import librosa  # noqa: E402
import numpy as np  # noqa: E402
import soundfile  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import make_fixtures as mf  # noqa: E402  (registers the tiny Turbo configuration)
import make_mtl_fixtures as mtl  # noqa: E402
from cloned_case import write_voice  # noqa: E402

RATE = 44100
SECONDS = 9
CHANNELS = 2
# (start, end) seconds of speech; the rest is the noise floor. Speech starts early so that
# the tiny T3's 12-token prompt (0.48 s) holds some.
SEGMENTS = [(0.15, 2.9), (3.5, 6.1), (6.8, 8.6)]
# Formants (Hz) of the vowel each segment glides from and to.
VOWELS = [((730, 1090, 2440), (270, 2290, 3010)), ((300, 870, 2240), (530, 1840, 2480)),
          ((660, 1720, 2410), (440, 1020, 2240))]
BANDWIDTHS = (90.0, 110.0, 170.0)
RAMP = 0.02
TURBO_TEXT = "hello there, the quick brown fox"
TURBO_TOKENS = 8
SEED = 2468


def recording_pcm():
    """Interleaved 16-bit samples (left, right). A glottal pulse train (a raised-cosine pulse
    per period, differentiated) at a gliding f0 through three cascaded two-pole formant
    resonators whose frequencies glide between two vowels; 20 ms raised-cosine ramps at each
    segment's edges; a noise floor at about -56 dBFS on both channels; the right channel the
    left one seven samples later at 0.8 times the level, plus its own noise."""
    state = 0x1234ABCD

    def noise():
        nonlocal state
        state = (state * 1664525 + 1013904223) % (1 << 32)
        return state / 2**32 * 2.0 - 1.0

    n_total = RATE * SECONDS
    voiced = [0.0] * n_total
    phase, pulse_prev = 0.0, 0.0
    y1 = [0.0, 0.0]
    y2 = [0.0, 0.0]
    y3 = [0.0, 0.0]
    for n in range(n_total):
        t = n / RATE
        seg = next((i for i, (a, b) in enumerate(SEGMENTS) if a <= t < b), None)
        f0 = 118.0 + 22.0 * math.sin(2.0 * math.pi * 0.7 * t)
        phase += f0 / RATE
        if phase >= 1.0:
            phase -= 1.0
        rise = math.sin(math.pi * phase / 0.6)
        pulse = rise * rise if phase < 0.6 else 0.0
        excitation = pulse - pulse_prev
        pulse_prev = pulse
        if seg is None:
            # Between segments the resonators ring down on no excitation.
            excitation, env, formants = 0.0, 0.0, VOWELS[0][0]
        else:
            a, b = SEGMENTS[seg]
            x = (t - a) / (b - a)
            start, end = VOWELS[seg]
            formants = tuple(s + (e - s) * x for s, e in zip(start, end))
            env = 1.0
            if t - a < RAMP:
                env = 0.5 - 0.5 * math.cos(math.pi * (t - a) / RAMP)
            elif b - t < RAMP:
                env = 0.5 - 0.5 * math.cos(math.pi * (b - t) / RAMP)
        value = excitation * env
        for state_y, f, bw in zip((y1, y2, y3), formants, BANDWIDTHS):
            r = math.exp(-math.pi * bw / RATE)
            a1 = 2.0 * r * math.cos(2.0 * math.pi * f / RATE)
            a2 = -r * r
            out = (1.0 - r) * value + a1 * state_y[0] + a2 * state_y[1]
            state_y[1] = state_y[0]
            state_y[0] = out
            value = out
        voiced[n] = 6.0 * value
    pcm = []
    for n in range(n_total):
        left = voiced[n] + 0.0015 * noise()
        right = 0.8 * (voiced[n - 7] if n >= 7 else 0.0) + 0.0015 * noise()
        for x in (left, right):
            pcm.append(max(-32768, min(32767, int(round(x * 32767)))))
    return pcm


def wav_bytes(pcm):
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(CHANNELS)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(np.array(pcm, dtype="<i2").tobytes())
    return buf.getvalue()


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def conds_arrays(conds):
    t3, gen = conds.t3, conds.gen
    arrays = dict(speaker_emb=t3.speaker_emb, t3_tokens=t3.cond_prompt_speech_tokens,
                  prompt_token=gen["prompt_token"], prompt_feat=gen["prompt_feat"], embedding=gen["embedding"])
    return {k: v.detach().numpy().copy() for k, v in arrays.items()}


def same_conds(a, b):
    return all(np.array_equal(a[k], b[k]) for k in a)


def clone_all(tts, variant, files, out):
    """prepare_conditionals on each copy; the WAV's and the MP3's written as voice files."""
    found = {}
    for kind, path in files.items():
        with torch.inference_mode():
            tts.prepare_conditionals(str(path))
        found[kind] = conds_arrays(tts.conds)
        if kind in ("wav", "mp3"):
            write_voice(out / f"{kind}.voice", tts.conds, variant)
    assert same_conds(found["wav"], found["flac"]), f"{variant}: the FLAC copy cloned differently"
    return dict(t3_prompt_tokens=int(found["wav"]["t3_tokens"].size),
                s3gen_prompt_tokens=int(found["wav"]["prompt_token"].size),
                prompt_feat_frames=int(found["wav"]["prompt_feat"].shape[1]))


def turbo_case(ckpt, files, out, size):
    from chatterbox.tts_turbo import ChatterboxTurboTTS
    t3, s3gen, ve, tokenizer = mf.load_tiny_turbo(ckpt, size)
    tts = ChatterboxTurboTTS(t3, s3gen, ve, tokenizer, "cpu", conds=None)
    summary = clone_all(tts, "turbo", files, out)
    uniforms, drawn, z, phase, sine_noise, wav = mf.generate_recorded(
        tts, SEED, TURBO_TOKENS, TURBO_TEXT, audio_prompt_path=str(files["wav"]))
    case = {"text": TURBO_TEXT, "max_new_tokens": TURBO_TOKENS,
            "note": "ChatterboxTurboTTS.generate(audio_prompt_path=recording.wav) with recorded draws; no watermark"}
    mf.save_pipeline_case(out / "pipeline", uniforms, drawn, z, phase, sine_noise, wav, case)
    return summary


def mtl_case(ckpt, files, out, size):
    model = mtl.load_tiny(ckpt, size)
    tts = mtl.mtl_mod.ChatterboxMultilingualTTS(*model, "cpu", conds=None)
    summary = clone_all(tts, "mtl", files, out)
    tts.prepare_conditionals(str(files["wav"]), exaggeration=mtl.EXAGGERATION)
    mtl.run_pipeline(tts.conds, *model, out, lambda *a, **k: None)
    return summary


class FullSize:
    """What `prepare_conditionals` reads of a model, for a full-size official checkpoint
    directory (the VoiceEncoder and S3Gen weights; T3's hyperparameters as `from_local` sets
    them): T3 itself is not needed to clone."""

    def __init__(self, variant, ckpt):
        from safetensors.torch import load_file
        from chatterbox.models.s3gen import S3Gen
        from chatterbox.models.t3.modules.t3_config import T3Config
        from chatterbox.models.voice_encoder import VoiceEncoder
        if variant == "mtl":
            from chatterbox.mtl_tts import ChatterboxMultilingualTTS as tts_class
            self.hp_t3, self.s3gen = T3Config.multilingual(), S3Gen(meanflow=False)
            self.s3gen.load_state_dict(torch.load(ckpt / "s3gen.pt", weights_only=True), strict=False)
        else:
            from chatterbox.tts_turbo import ChatterboxTurboTTS as tts_class
            self.hp_t3, self.s3gen = T3Config(text_tokens_dict_size=50276), S3Gen(meanflow=True)
            self.hp_t3.speech_cond_prompt_len = 375  # as ChatterboxTurboTTS.from_local sets it
            self.s3gen.load_state_dict(load_file(ckpt / "s3gen_meanflow.safetensors"), strict=True)
        self.ve = VoiceEncoder()
        if (ckpt / "ve.pt").exists():
            self.ve.load_state_dict(torch.load(ckpt / "ve.pt", weights_only=True))
        else:
            self.ve.load_state_dict(load_file(ckpt / "ve.safetensors"))
        self.s3gen.eval()
        self.ve.eval()
        self.tts_class, self.device, self.conds = tts_class, "cpu", None
        self.t3 = type("T3", (), {"hp": self.hp_t3})()
        self.ENC_COND_LEN, self.DEC_COND_LEN = tts_class.ENC_COND_LEN, tts_class.DEC_COND_LEN

    def norm_loudness(self, wav, sr):
        return self.tts_class.norm_loudness(self, wav, sr)

    def prepare_conditionals(self, path):
        self.tts_class.prepare_conditionals(self, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--turbo", type=Path, help="Turbo checkpoint directory")
    ap.add_argument("--mtl", type=Path, help="Multilingual checkpoint directory")
    ap.add_argument("--full", action="store_true",
                    help="full-size checkpoint directories (make_fixtures.py --size full, with the tokenizer of "
                         "make_tokenizer.py; make_mtl_fixtures.py --size full), into OUT (not committed)")
    ap.add_argument("--conditionals-only", action="store_true",
                    help="with --full: prepare_conditionals only, T3 not loaded, no generate()")
    args = ap.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1 if not args.full else 2)
    torch.use_deterministic_algorithms(True)

    pcm = recording_pcm()
    data = wav_bytes(pcm)
    scratch = out / "scratch"
    scratch.mkdir(exist_ok=True)
    files = {"wav": scratch / "recording.wav", "flac": scratch / "recording.flac", "mp3": out / "recording.mp3"}
    files["wav"].write_bytes(data)
    frames = np.array(pcm, dtype=np.int16).reshape(-1, CHANNELS)
    soundfile.write(files["flac"], frames, RATE, subtype="PCM_16")
    soundfile.write(files["mp3"], frames, RATE, format="MP3", subtype="MPEG_LAYER_III",
                    compression_level=0.95, bitrate_mode="CONSTANT")
    loads = {}
    for kind, path in files.items():
        y, sr = librosa.load(path, sr=24000)
        assert sr == 24000 and y.dtype == np.float32
        loads[kind] = dict(sha256=sha256(y.astype("<f4").tobytes()), samples=int(y.size))
    assert loads["wav"] == loads["flac"], "FLAC decoded differently from the WAV"

    case = {"rate": RATE, "channels": CHANNELS, "seconds": SECONDS, "wav_sha256": sha256(data),
            "mp3_sha256": sha256(files["mp3"].read_bytes()), "librosa_load_24k": loads,
            "reference": f"chatterbox-tts 0.1.7, librosa {librosa.__version__}, soxr "
                         f"{__import__('soxr').__version__}, libsndfile {soundfile.__libsndfile_version__}"}
    for variant, ckpt, run in (("turbo", args.turbo, turbo_case), ("mtl", args.mtl, mtl_case)):
        if ckpt is None:
            continue
        (out / variant).mkdir(exist_ok=True)
        if args.full and args.conditionals_only:
            case[variant] = clone_all(FullSize(variant, ckpt), variant, files, out / variant)
        else:
            case[variant] = run(ckpt, files, out / variant, "full" if args.full else "tiny")
        print(f"{variant}: {case[variant]}")
    for path in (files["wav"], files["flac"]):
        path.unlink()
    scratch.rmdir()
    (out / "case.json").write_text(json.dumps(case, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
