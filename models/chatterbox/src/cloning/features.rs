//! The four spectral front ends voice cloning runs on a reference recording,
//! each reproducing the reference package's own code path:
//!
//! | function | reference | input | output |
//! |---|---|---|---|
//! | [`voice_encoder_mel`] | `voice_encoder/melspec.py` (librosa) | 16 kHz | 40-bin power mel |
//! | [`s3tokenizer_log_mel`] | `S3Tokenizer.log_mel_spectrogram` | 16 kHz | 128-bin clamped log10 mel |
//! | [`campplus_fbank`] | `xvector.extract_feature` (torchaudio Kaldi fbank) | 16 kHz | 80-bin log fbank, mean-subtracted |
//! | [`s3gen_mel`] | `s3gen/utils/mel.py` (Matcha) | 24 kHz | 80-bin log mel |
//!
//! Spectra are computed in f64 (realfft); the references run f32, so the two
//! agree to f32 rounding. Every output is frame-major: `data[frame * dims + bin]`.

use crate::dsp::{hann_periodic, reflect_index};
use engine_core::model_kit::{Error, Result};
use realfft::RealFftPlanner;

/// Frame-major features: `frames` rows of `dims` values.
#[derive(Clone, Debug, PartialEq)]
pub struct Features {
    pub frames: usize,
    pub dims: usize,
    pub data: Vec<f32>,
}

impl Features {
    pub fn row(&self, frame: usize) -> &[f32] {
        &self.data[frame * self.dims..(frame + 1) * self.dims]
    }

    /// Keeps at most the first `frames` frames (the reference's `mel[..., :n]`).
    pub fn truncate(&mut self, frames: usize) {
        self.frames = self.frames.min(frames);
        self.data.truncate(self.frames * self.dims);
    }
}

/// `librosa.filters.mel` with its defaults (Slaney mel scale, Slaney area
/// normalisation): `n_mels` rows of `n_fft / 2 + 1` weights.
pub fn slaney_mel_filters(sample_rate: f64, n_fft: usize, n_mels: usize, fmin: f64, fmax: f64) -> Vec<Vec<f64>> {
    const F_SP: f64 = 200.0 / 3.0;
    const MIN_LOG_HZ: f64 = 1000.0;
    const MIN_LOG_MEL: f64 = MIN_LOG_HZ / F_SP;
    let log_step = 6.4f64.ln() / 27.0;
    let hz_to_mel = |f: f64| if f >= MIN_LOG_HZ { MIN_LOG_MEL + (f / MIN_LOG_HZ).ln() / log_step } else { f / F_SP };
    let mel_to_hz = |m: f64| if m >= MIN_LOG_MEL { MIN_LOG_HZ * (log_step * (m - MIN_LOG_MEL)).exp() } else { F_SP * m };
    let bins = n_fft / 2 + 1;
    let fft_freqs: Vec<f64> = (0..bins).map(|k| k as f64 * (sample_rate / 2.0) / (bins - 1) as f64).collect();
    let (lo, hi) = (hz_to_mel(fmin), hz_to_mel(fmax));
    let mel_f: Vec<f64> = (0..n_mels + 2).map(|i| mel_to_hz(lo + (hi - lo) * i as f64 / (n_mels + 1) as f64)).collect();
    (0..n_mels)
        .map(|i| {
            let enorm = 2.0 / (mel_f[i + 2] - mel_f[i]);
            fft_freqs
                .iter()
                .map(|&f| {
                    let lower = (f - mel_f[i]) / (mel_f[i + 1] - mel_f[i]);
                    let upper = (mel_f[i + 2] - f) / (mel_f[i + 2] - mel_f[i + 1]);
                    lower.min(upper).max(0.0) * enorm
                })
                .collect()
        })
        .collect()
}

/// Kaldi's mel banks (`torchaudio.compliance.kaldi.get_mel_banks`, no VTLN):
/// HTK mel scale, triangles evenly spaced in mel between `low` and `high` Hz,
/// over the `padded / 2` lowest FFT bins (the Nyquist bin gets no weight).
fn kaldi_mel_banks(sample_rate: f64, padded: usize, n_mels: usize, low: f64, high: f64) -> Vec<Vec<f64>> {
    let mel = |f: f64| 1127.0 * (1.0 + f / 700.0).ln();
    let (lo, hi) = (mel(low), mel(high));
    let delta = (hi - lo) / (n_mels + 1) as f64;
    let bin_width = sample_rate / padded as f64;
    (0..n_mels)
        .map(|b| {
            let (left, center, right) = (lo + b as f64 * delta, lo + (b + 1) as f64 * delta, lo + (b + 2) as f64 * delta);
            (0..=padded / 2)
                .map(|k| {
                    if k == padded / 2 {
                        return 0.0;
                    }
                    let m = mel(bin_width * k as f64);
                    let up = (m - left) / (center - left);
                    let down = (right - m) / (right - center);
                    up.min(down).max(0.0)
                })
                .collect()
        })
        .collect()
}

/// Power spectra |X|² of `frames` frames of `n_fft` samples; `fill(f, buf)`
/// writes frame `f` (windowed, zero-padded) into the zeroed buffer.
fn power_spectra_of(n_fft: usize, frames: usize, mut fill: impl FnMut(usize, &mut [f64])) -> Vec<Vec<f64>> {
    let fft = RealFftPlanner::<f64>::new().plan_fft_forward(n_fft);
    let (mut buf, mut spec, mut scratch) = (fft.make_input_vec(), fft.make_output_vec(), fft.make_scratch_vec());
    (0..frames)
        .map(|f| {
            buf.fill(0.0);
            fill(f, &mut buf);
            fft.process_with_scratch(&mut buf, &mut spec, &mut scratch).expect("buffer lengths come from the plan");
            spec.iter().map(|c| c.norm_sqr()).collect()
        })
        .collect()
}

/// STFT power spectra: frame `f` starts at `f·hop − pad` of `x` reflected at
/// its edges and is multiplied by `window`.
fn power_spectra(x: &[f32], n_fft: usize, hop: usize, pad: usize, frames: usize, window: &[f64]) -> Vec<Vec<f64>> {
    power_spectra_of(n_fft, frames, |f, buf| {
        for (k, w) in window.iter().enumerate() {
            buf[k] = x[reflect_index((f * hop + k) as isize - pad as isize, x.len())] as f64 * w;
        }
    })
}

/// Each filter applied to each spectrum, then `map`. A triangular filter is
/// zero outside a few bins: only its nonzero span is summed, in bin order, so
/// the sums equal the dense ones exactly.
fn apply_filters(spectra: &[Vec<f64>], filters: &[Vec<f64>], map: impl Fn(f64) -> f64) -> Features {
    let spans: Vec<(usize, &[f64])> = filters
        .iter()
        .map(|f| match (f.iter().position(|&w| w != 0.0), f.iter().rposition(|&w| w != 0.0)) {
            (Some(first), Some(last)) => (first, &f[first..=last]),
            _ => (0, &f[..0]),
        })
        .collect();
    let dims = filters.len();
    let mut data = Vec::with_capacity(spectra.len() * dims);
    for power in spectra {
        for &(first, weights) in &spans {
            data.push(map(weights.iter().zip(&power[first..]).map(|(w, p)| w * p).sum()) as f32);
        }
    }
    Features { frames: spectra.len(), dims, data }
}

fn need(x: &[f32], samples: usize, what: &str) -> Result<()> {
    if x.len() < samples {
        return Err(Error::msg(format!("{what} needs at least {samples} samples, the recording has {}", x.len())));
    }
    Ok(())
}

/// VoiceEncoder input: `librosa.stft(n_fft 400, hop 160, hann, center,
/// reflect)`, |X|², `n_mels` (the encoder's input width: 40) Slaney mel
/// bins 0–8 kHz, no log. `1 + len / 160` frames of a 16 kHz recording.
pub fn voice_encoder_mel(wav16k: &[f32], n_mels: usize) -> Result<Features> {
    need(wav16k, 201, "the VoiceEncoder mel")?;
    let spectra = power_spectra(wav16k, 400, 160, 200, 1 + wav16k.len() / 160, &hann_periodic(400));
    Ok(apply_filters(&spectra, &slaney_mel_filters(16000.0, 400, n_mels, 0.0, 8000.0), |m| m))
}

/// The frames [`s3tokenizer_log_mel`] makes of `samples` samples.
pub fn s3tokenizer_mel_frames(samples: usize) -> usize {
    samples / 160
}

/// The frames [`campplus_fbank`] makes of `samples` samples (at least 400).
pub fn campplus_fbank_frames(samples: usize) -> usize {
    1 + samples.saturating_sub(400) / 160
}

/// S3Tokenizer input: `torch.stft(n_fft 400, hop 160, hann, center)`, the
/// last frame dropped, |X|², 128 Slaney mel bins 0–8 kHz, `log10(max(m,
/// 1e-10))` floored at the clip's maximum − 8, then `(x + 4) / 4`. `len / 160`
/// frames.
pub fn s3tokenizer_log_mel(wav16k: &[f32]) -> Result<Features> {
    need(wav16k, 201, "the S3Tokenizer mel")?;
    let spectra = power_spectra(wav16k, 400, 160, 200, s3tokenizer_mel_frames(wav16k.len()), &hann_periodic(400));
    let mut f = apply_filters(&spectra, &slaney_mel_filters(16000.0, 400, 128, 0.0, 8000.0), |m| m.max(1e-10).log10());
    let floor = f.data.iter().copied().fold(f32::NEG_INFINITY, f32::max) - 8.0;
    for v in &mut f.data {
        *v = (v.max(floor) + 4.0) / 4.0;
    }
    Ok(f)
}

/// CAMPPlus input: `torchaudio.compliance.kaldi.fbank(num_mel_bins=80)` at
/// its defaults (25 ms frames every 10 ms that fit whole, DC removal,
/// pre-emphasis 0.97, Povey window, FFT 512, |X|², mel banks 20 Hz–Nyquist,
/// `ln(max(m, f32::EPSILON))`), then each bin minus its mean over the clip.
pub fn campplus_fbank(wav16k: &[f32]) -> Result<Features> {
    const WIN: usize = 400;
    const HOP: usize = 160;
    const PADDED: usize = 512;
    need(wav16k, WIN, "the CAMPPlus fbank")?;
    let frames = campplus_fbank_frames(wav16k.len());
    let povey: Vec<f64> = (0..WIN).map(|i| (0.5 - 0.5 * (std::f64::consts::TAU * i as f64 / (WIN - 1) as f64).cos()).powf(0.85)).collect();
    let spectra = power_spectra_of(PADDED, frames, |f, buf| {
        let frame = &wav16k[f * HOP..f * HOP + WIN];
        let mean = frame.iter().map(|&s| s as f64).sum::<f64>() / WIN as f64;
        for k in 0..WIN {
            let prev = frame[k.saturating_sub(1)] as f64;
            buf[k] = ((frame[k] as f64 - mean) - 0.97 * (prev - mean)) * povey[k];
        }
    });
    let banks = kaldi_mel_banks(16000.0, PADDED, 80, 20.0, 8000.0);
    let mut f = apply_filters(&spectra, &banks, |m| m.max(f32::EPSILON as f64).ln());
    for bin in 0..f.dims {
        let mean = (0..f.frames).map(|t| f.data[t * f.dims + bin] as f64).sum::<f64>() / f.frames as f64;
        for t in 0..f.frames {
            f.data[t * f.dims + bin] = (f.data[t * f.dims + bin] as f64 - mean) as f32;
        }
    }
    Ok(f)
}

/// The frames [`s3gen_mel`] makes of `samples` samples (at least 721).
pub fn s3gen_mel_frames(samples: usize) -> usize {
    (samples + 1440 - 1920) / 480 + 1
}

/// S3Gen's prompt mel: reflect-pad 720 samples each side, `torch.stft(n_fft
/// 1920, hop 480, hann, center=False)`, `sqrt(|X|² + 1e-9)`, 80 Slaney mel bins
/// 0–8 kHz, `ln(max(m, 1e-5))`. `(len − 480) / 480 + 1` frames of a 24 kHz
/// recording.
pub fn s3gen_mel(wav24k: &[f32]) -> Result<Features> {
    need(wav24k, 721, "the S3Gen mel")?;
    let frames = s3gen_mel_frames(wav24k.len());
    let spectra = power_spectra(wav24k, 1920, 480, 720, frames, &hann_periodic(1920));
    let magnitudes: Vec<Vec<f64>> = spectra.iter().map(|p| p.iter().map(|&v| (v + 1e-9).sqrt()).collect()).collect();
    Ok(apply_filters(&magnitudes, &slaney_mel_filters(24000.0, 1920, 80, 0.0, 8000.0), |m| m.max(1e-5).ln()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slaney_filters_have_unit_area_in_hz() {
        // Slaney normalisation: each triangle's area (weight × Hz) is 1.
        let filters = slaney_mel_filters(16000.0, 4096, 40, 0.0, 8000.0);
        let bin_hz = 8000.0 / 2048.0;
        for (i, f) in filters.iter().enumerate().skip(2) {
            let area: f64 = f.iter().sum::<f64>() * bin_hz;
            assert!((area - 1.0).abs() < 0.02, "filter {i}: area {area}");
        }
    }

    #[test]
    fn too_short_recordings_are_refused() {
        let e = voice_encoder_mel(&[0.0; 100], 40).unwrap_err().to_string();
        assert_eq!(e, "the VoiceEncoder mel needs at least 201 samples, the recording has 100");
        assert!(campplus_fbank(&[0.0; 399]).is_err());
        assert!(s3gen_mel(&[0.0; 720]).is_err());
    }
}
