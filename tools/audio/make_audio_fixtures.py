#!/usr/bin/env python3
"""Writes tests/fixtures/audio/: small recordings in the compressed formats the
engine reads (FLAC, Ogg Vorbis, MP3, written by libsndfile through soundfile),
a 16-bit WAV, and what the reference stack makes of them:

  <name>.npy         soundfile's decode mixed to mono by librosa.to_mono (what
                     librosa.load returns at the file's own rate)
  wav44k_to_24k.npy  librosa.resample(..., 44100 -> 24000), soxr_hq (what
                     librosa.load(sr=24000) does)
  wav44k_to_16k.npy  the same to 16 kHz
  24k_to_16k.npy     librosa.resample(wav44k_to_24k, 24000 -> 16000), the
                     chain Chatterbox's prepare_conditionals runs
  manifest.json      rates, channels, lengths

The signal: three tones plus noise band-limited to 5 kHz (an elliptic low-pass
120 dB down by 5.6 kHz: inside the passband of every output rate, where two
good resamplers should agree; their transition bands differ by design),
stereo with different channel gains. Needs numpy, scipy, soundfile and librosa (the Chatterbox venv).
Usage: make_audio_fixtures.py OUT_DIR
"""
import json
import sys
from pathlib import Path

import librosa
import numpy as np
import scipy.signal
import soundfile as sf


def signal(rate, seconds, seed=7):
    rng = np.random.default_rng(seed)
    t = np.arange(int(rate * seconds)) / rate
    tones = 0.2 * np.sin(2 * np.pi * 220 * t) + 0.1 * np.sin(2 * np.pi * 1375.5 * t + 1) + 0.05 * np.sin(2 * np.pi * 5200 * t + 2)
    sos = scipy.signal.ellip(12, 0.01, 120, 5000, fs=rate, output="sos")
    noise = 0.05 * scipy.signal.sosfilt(sos, rng.standard_normal(t.size))
    mono = tones + noise
    return np.stack([mono, 0.5 * mono + 0.02 * np.sin(2 * np.pi * 440 * t)], axis=1).astype(np.float32)


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    manifest = {}
    stereo = signal(44100, 1.0)
    sf.write(out / "wav44k.wav", stereo, 44100, subtype="PCM_16")
    for name, fmt, subtype, rate, seconds in [
        ("flac", "FLAC", "PCM_16", 22050, 0.5),
        ("ogg", "OGG", "VORBIS", 22050, 0.5),
        ("mp3", "MP3", "MPEG_LAYER_III", 22050, 0.5),
    ]:
        path = out / f"tone.{name}"
        sf.write(path, signal(rate, seconds, seed=3), rate, format=fmt, subtype=subtype)
    for path in sorted(out.glob("*.wav")) + sorted(out.glob("tone.*")):
        if path.suffix == ".npy":
            continue
        data, rate = sf.read(path, dtype="float32", always_2d=True)
        mono = librosa.to_mono(data.T)
        np.save(out / f"{path.name}.npy", mono.astype(np.float32))
        manifest[path.name] = {"rate": rate, "channels": data.shape[1], "frames": data.shape[0]}
    wav, _ = sf.read(out / "wav44k.wav", dtype="float32", always_2d=True)
    mono = librosa.to_mono(wav.T)
    to24 = librosa.resample(mono, orig_sr=44100, target_sr=24000)
    to16 = librosa.resample(mono, orig_sr=44100, target_sr=16000)
    np.save(out / "wav44k_to_24k.npy", to24.astype(np.float32))
    np.save(out / "wav44k_to_16k.npy", to16.astype(np.float32))
    np.save(out / "24k_to_16k.npy", librosa.resample(to24, orig_sr=24000, target_sr=16000).astype(np.float32))
    manifest["resampler"] = "librosa %s resample, res_type soxr_hq" % librosa.__version__
    # soxr's own start-up transient at 44.1 kHz: a unit impulse at the first
    # sample and the same impulse mid-clip, each at the output sample it lands on.
    impulse = np.zeros(44100)
    impulse[0] = 1
    at_start = librosa.resample(impulse, orig_sr=44100, target_sr=24000)[0]
    impulse = np.roll(impulse, 441)
    mid_clip = librosa.resample(impulse, orig_sr=44100, target_sr=24000)[240]
    manifest["soxr_hq_impulse_44k_to_24k"] = {"at_start": float(at_start), "mid_clip": float(mid_clip)}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
