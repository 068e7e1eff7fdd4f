#!/usr/bin/env python3
"""Writes tests/fixtures/chatterbox/cloning/features/: synthetic recordings and
the four feature extractors voice cloning runs, computed by the reference
package (chatterbox-tts 0.1.7) itself:

  wav16k.npy, wav24k.npy   1 s of tones + noise + a silent gap, at 16 and 24 kHz
  ve_mel.npy               VoiceEncoder melspectrogram(wav16k): (40, T) power mel
  s3tok_log_mel.npy        S3Tokenizer.log_mel_spectrogram(wav16k): (128, T)
  campplus_fbank.npy       xvector.extract_feature([wav16k]): (T, 80) Kaldi fbank,
                           mean-subtracted
  s3gen_mel.npy            s3gen.utils.mel.mel_spectrogram(wav24k): (80, T) log mel

Usage: make_cloning_fixtures.py OUT_DIR  (run with the Chatterbox venv)
"""
import sys
from pathlib import Path

import numpy as np
import torch


def recording(rate, seconds=1.0, seed=11):
    rng = np.random.default_rng(seed)
    t = np.arange(int(rate * seconds)) / rate
    x = 0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    x += 0.1 * np.sin(2 * np.pi * 2350 * t + 0.4) + 0.02 * rng.standard_normal(t.size)
    x[int(0.4 * rate):int(0.5 * rate)] = 0.0  # a silent gap: the log floors
    return x.astype(np.float32)


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    from chatterbox.models.voice_encoder.config import VoiceEncConfig
    from chatterbox.models.voice_encoder.melspec import melspectrogram
    from chatterbox.models.s3tokenizer import S3Tokenizer
    from chatterbox.models.s3gen.xvector import extract_feature
    from chatterbox.models.s3gen.utils.mel import mel_spectrogram

    wav16, wav24 = recording(16000), recording(24000)
    np.save(out / "wav16k.npy", wav16)
    np.save(out / "wav24k.npy", wav24)
    np.save(out / "ve_mel.npy", melspectrogram(wav16, VoiceEncConfig()).astype(np.float32))
    tok = S3Tokenizer("speech_tokenizer_v2_25hz")
    np.save(out / "s3tok_log_mel.npy", tok.log_mel_spectrogram(torch.from_numpy(wav16)).numpy().astype(np.float32))
    feats, _, _ = extract_feature([torch.from_numpy(wav16)])
    np.save(out / "campplus_fbank.npy", feats[0].numpy().astype(np.float32))
    np.save(out / "s3gen_mel.npy", mel_spectrogram(torch.from_numpy(wav24))[0].numpy().astype(np.float32))
    for p in sorted(out.glob("*.npy")):
        print(p.name, np.load(p).shape)


if __name__ == "__main__":
    main()
