//! HiFT over an utterance that arrives in mel windows (streaming synthesis),
//! as CosyVoice2's `token2wav` continues its vocoder: each window is vocoded
//! with the last `CACHE_FRAMES` mel frames before it and the excitation they
//! had, so the source goes on unbroken; the last `CACHE_FRAMES` frames'
//! samples of each window are held back and cross-faded (Hamming halves) with
//! the next window's version of them, which had the frames after them to see.

use super::blocks::BlockKind;
use super::source::{apply_trim_fade, NoiseStreams, SourcePhase};
use super::{S3Gen, VocoderGraphs};
use crate::Result;

/// Mel frames carried into the next window (CosyVoice2: 8, 3840 samples at 24 kHz).
pub const CACHE_FRAMES: usize = 8;

pub struct VocoderStream {
    noise: NoiseStreams,
    phase: SourcePhase,
    /// The last window's last frames: mel, and the excitation they had.
    mel_cache: Vec<f32>,
    excitation_cache: Vec<f32>,
    /// Samples of the cached frames, held back for the cross-fade.
    tail: Vec<f32>,
    started: bool,
}

impl VocoderStream {
    pub fn new(s3: &S3Gen, noise_seed: u64) -> VocoderStream {
        VocoderStream {
            noise: NoiseStreams::seeded(s3.hp.hift.harmonics, noise_seed),
            phase: SourcePhase::default(),
            mel_cache: Vec::new(),
            excitation_cache: Vec::new(),
            tail: Vec::new(),
            started: false,
        }
    }

    /// Vocodes the next mel frames `[frames][mel_channels]`; returns the
    /// samples now final (all of them when `last`).
    pub fn push(&mut self, s3: &mut S3Gen, mel: &[f32], last: bool) -> Result<Vec<f32>> {
        let channels = s3.hp.mel_channels;
        let per_frame = s3.hp.hift.samples_per_frame();
        let new_frames = mel.len() / channels;
        let cached = self.mel_cache.len() / channels;
        if new_frames == 0 {
            return Ok(if last { std::mem::take(&mut self.tail) } else { Vec::new() });
        }
        let window: Vec<f32> = [&self.mel_cache[..], mel].concat();
        // A chunk in one window (one block) is vocoded as a whole utterance.
        let graphs = match (self.started, last) {
            (false, true) => VocoderGraphs::Whole,
            (false, false) => VocoderGraphs::Window(BlockKind::First),
            (true, false) => VocoderGraphs::Window(BlockKind::Hop),
            (true, true) => VocoderGraphs::Window(BlockKind::Last),
        };
        let f0 = s3.predict_f0_with(graphs, &window)?;
        let draws = self.noise.next(new_frames * per_frame);
        let excitation_new = s3.excitation_from(&f0[cached..], &draws, &mut self.phase)?;
        let excitation: Vec<f32> = [&self.excitation_cache[..], &excitation_new[..]].concat();
        let mut wav = s3.hift_waveform_with(graphs, &window, &excitation)?;
        if !self.started {
            apply_trim_fade(&mut wav, s3.hp.hift.trim_fade_samples);
            self.started = true;
        }
        // The cached frames' samples: the held tail fades out, this window's in.
        let overlap = (cached * per_frame).min(self.tail.len()).min(wav.len());
        let mut out = Vec::with_capacity(wav.len());
        let window_fn = hamming(2 * overlap);
        for i in 0..overlap {
            out.push(self.tail[i] * window_fn[overlap + i] + wav[i] * window_fn[i]);
        }
        let rest = &wav[cached * per_frame..];
        // `rest` is the new frames' samples; the last of them wait for the next window.
        let keep = if last { 0 } else { CACHE_FRAMES.min(new_frames) * per_frame };
        out.extend_from_slice(&rest[..rest.len() - keep]);
        self.tail = rest[rest.len() - keep..].to_vec();
        let kept_frames = keep / per_frame;
        self.mel_cache = window[window.len() - kept_frames * channels..].to_vec();
        self.excitation_cache = excitation[excitation.len() - kept_frames * per_frame..].to_vec();
        Ok(out)
    }
}

/// Symmetric Hamming window of `n` points (numpy's `hamming`): its rising
/// half fades in, its falling half out, and the halves sum to ~1.08 at most.
fn hamming(n: usize) -> Vec<f32> {
    if n < 2 {
        return vec![1.0; n];
    }
    (0..n).map(|i| (0.54 - 0.46 * (std::f64::consts::TAU * i as f64 / (n - 1) as f64).cos()) as f32).collect()
}
