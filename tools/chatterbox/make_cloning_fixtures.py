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

With a tiny checkpoint directory (`ve.safetensors` or `ve.pt`, as make_fixtures.py
writes it), also the VoiceEncoder end to end, into OUT_DIR/../voice_encoder/:

  recording16k.npy         4.4 s of a voiced signal between quiet noise
  trim.npy                 librosa.effects.trim(top_db=20) interval, int64
  partial_embeds.npy       VoiceEncoder.forward on the partials: (N, E)
  speaker_embedding.npy    embeds_from_wavs([recording16k], 16000): (1, E)

and CAMPPlus (the tiny S3Gen's speaker_encoder), into OUT_DIR/../campplus/:

  xvector_1s.npy           speaker_encoder.inference([wav16k]): (1, 192)
  xvector.npy              speaker_encoder.inference([recording16k]): (1, 192)

and the S3Tokenizer (the tiny S3Gen's tokenizer), into OUT_DIR/../s3tokenizer/:

  projection_1s.npy        FSQ's project_down on the encoder output of wav16k: (T, 8)
  tokens_1s.npy            tokenizer.forward([wav16k]): int64 (T,)
  projection.npy, tokens.npy  the same for recording16k with max_len=60 (mel cut to 240 frames)

and the conditionals `prepare_conditionals` computes from a 24 kHz recording (the steps
after `librosa.load` and before T3, with the tiny Turbo models), into OUT_DIR/../conditionals/:

  recording24k.npy         6 s at 24 kHz
  ref16k_torchaudio.npy    torchaudio Resample(24000, 16000) of it (embed_ref's resampler)
  prompt_feat.npy, prompt_token.npy, embedding.npy   s3gen.embed_ref(recording24k, 24000)
  t3_prompt_tokens.npy     tokenizer.forward([ref_16k[:plen * 640]], max_len=plen), plen the
                           tiny T3's speech_cond_prompt_len, ref_16k = librosa.resample (soxr_hq)
  speaker_emb.npy          ve.embeds_from_wavs([ref_16k], sample_rate=16000)

Usage: make_cloning_fixtures.py OUT_DIR [TINY_CHECKPOINT_DIR]  (the Chatterbox venv)
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


def report(out):
    for p in sorted(out.glob("*.npy")):
        print(p.name, np.load(p).shape)


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
    report(out)
    if len(sys.argv) > 2:
        ckpt = Path(sys.argv[2])
        ve, s3gen = tiny_voice_encoder(ckpt), tiny_s3gen(ckpt)
        longer = voice_encoder(ve, out.parent / "voice_encoder")
        # The networks on a short and a longer recording.
        recordings = [("_1s", wav16), ("", longer)]
        campplus(s3gen.speaker_encoder, recordings, out.parent / "campplus")
        s3_tokenizer(s3gen.tokenizer, recordings, out.parent / "s3tokenizer")
        conditionals(s3gen, ve, out.parent / "conditionals")


def tiny_s3gen(ckpt):
    """The tiny Turbo S3Gen that make_fixtures.py built and saved, with its weights."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import make_fixtures as mf
    from safetensors.torch import load_file
    s3gen = mf.build_s3gen("tiny")
    s3gen.load_state_dict(load_file(ckpt / "s3gen_meanflow.safetensors"), strict=True)
    return s3gen.eval()


def tiny_voice_encoder(ckpt):
    from chatterbox.models.voice_encoder import VoiceEncoder
    from chatterbox.models.voice_encoder.config import VoiceEncConfig
    if (ckpt / "ve.safetensors").is_file():
        from safetensors.torch import load_file
        state = load_file(ckpt / "ve.safetensors")
    else:
        state = torch.load(ckpt / "ve.pt", weights_only=True)
    hp = VoiceEncConfig()
    hp.ve_hidden_size = state["lstm.weight_hh_l0"].shape[1]
    hp.speaker_embed_size = state["proj.weight"].shape[0]
    ve = VoiceEncoder(hp).eval()
    ve.load_state_dict(state)
    return ve


def conditionals(s3gen, ve, out):
    """prepare_conditionals after its librosa.load (Multilingual's order; Turbo adds its
    loudness step before resampling)."""
    import librosa
    import make_fixtures as mf
    from chatterbox.models.s3gen.s3gen import get_resampler
    out.mkdir(parents=True, exist_ok=True)
    plen = mf.SIZES["tiny"]["cond_prompt_len"]
    wav24 = speech_like(24000, 6.0, seed=9)
    np.save(out / "recording24k.npy", wav24)
    ref_16k = librosa.resample(wav24, orig_sr=24000, target_sr=16000)
    with torch.inference_mode():
        np.save(out / "ref16k_torchaudio.npy", get_resampler(24000, 16000, "cpu")(torch.from_numpy(wav24)[None])[0].numpy())
        ref = s3gen.embed_ref(wav24[:10 * 24000], 24000, device="cpu")
        np.save(out / "prompt_feat.npy", np.ascontiguousarray(ref["prompt_feat"][0].numpy(), dtype=np.float32))
        np.save(out / "prompt_token.npy", ref["prompt_token"][0].numpy().astype(np.int64))
        np.save(out / "embedding.npy", ref["embedding"][0].numpy().astype(np.float32))
        tokens, _ = s3gen.tokenizer.forward([ref_16k[:plen * 640]], max_len=plen)
        np.save(out / "t3_prompt_tokens.npy", tokens[0].numpy().astype(np.int64))
    np.save(out / "speaker_emb.npy", ve.embeds_from_wavs([ref_16k], sample_rate=16000).astype(np.float32))
    report(out)


def s3_tokenizer(tokenizer, recordings, out):
    """The whole short recording, the longer one cut to 60 tokens (`max_len`)."""
    out.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode():
        for (suffix, wav), max_len in zip(recordings, [None, 60]):
            tokens, _ = tokenizer.forward([wav], max_len=max_len)
            mel = tokenizer.log_mel_spectrogram(torch.from_numpy(wav))
            if max_len is not None:
                mel = mel[..., :max_len * 4]
            hidden, _ = tokenizer.encoder(mel, torch.tensor([mel.shape[-1]]))
            projection = tokenizer.quantizer._codebook.project_down(hidden)[0]
            np.save(out / f"projection{suffix}.npy", projection.numpy().astype(np.float32))
            np.save(out / f"tokens{suffix}.npy", tokens[0].numpy().astype(np.int64))
    report(out)


def campplus(encoder, recordings, out):
    out.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode():
        for suffix, wav in recordings:
            np.save(out / f"xvector{suffix}.npy", encoder.inference([torch.from_numpy(wav)]).numpy().astype(np.float32))
    report(out)


def speech_like(rate, seconds, seed):
    """Voiced frames with a moving pitch and formant-ish harmonics, pauses between
    syllables, and quiet noise before and after (what trimming removes)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(rate * seconds)) / rate
    f0 = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    x = sum(np.sin(k * phase) / k * (1 + 0.6 * np.sin(2 * np.pi * (0.9 + 0.3 * k) * t)) for k in range(1, 12))
    x *= 0.2 * (0.55 + 0.45 * np.sin(2 * np.pi * 3.1 * t)) ** 2
    x += 0.003 * rng.standard_normal(t.size)
    quiet_head, quiet_tail = int(0.5 * rate), int(0.3 * rate)
    x[:quiet_head] = 0.001 * rng.standard_normal(quiet_head)
    x[-quiet_tail:] = 0.001 * rng.standard_normal(quiet_tail)
    return x.astype(np.float32)


def voice_encoder(ve, out):
    """The tiny VoiceEncoder on a recording with quiet edges; returns the recording."""
    import librosa
    from chatterbox.models.voice_encoder.melspec import melspectrogram
    from chatterbox.models.voice_encoder.voice_encoder import stride_as_partials

    out.mkdir(parents=True, exist_ok=True)
    hp = ve.hp
    wav = speech_like(16000, 4.4, seed=5)
    np.save(out / "recording16k.npy", wav)
    trimmed, interval = librosa.effects.trim(wav, top_db=20)
    np.save(out / "trim.npy", np.asarray(interval, dtype=np.int64))
    partials = stride_as_partials(melspectrogram(trimmed, hp).T, hp, rate=1.3)
    with torch.inference_mode():
        np.save(out / "partial_embeds.npy", ve(torch.from_numpy(np.ascontiguousarray(partials))).numpy())
    np.save(out / "speaker_embedding.npy", ve.embeds_from_wavs([wav], sample_rate=16000).astype(np.float32))
    report(out)
    return wav


if __name__ == "__main__":
    main()
