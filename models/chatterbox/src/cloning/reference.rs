//! A reference recording read as the reference pipelines read theirs:
//! `librosa.load(path, sr=24000)` (any WAV, FLAC, MP3 or Ogg Vorbis; mixed to
//! mono; resampled to S3Gen's rate by libsoxr's "HQ" recipe, as librosa does,
//! sample for sample: `tts_soxr`), then the variant's own rules. Turbo and
//! Nano (`ChatterboxTurboTTS.prepare_conditionals`) refuse a clip of 5 s or
//! less and normalise it to −27 LUFS; Multilingual takes it as it is.
//!
//! Two bounds the reference lacks, both documented in `docs/models/chatterbox.md`:
//! at most [`MAX_SECONDS`] of a file are read (the voice encoder averages over
//! the whole clip; a two-hour file would cost minutes and gigabytes), and a
//! clip whose peak is below [`SILENCE_DBFS`] is refused as silent (the
//! reference's encoders would see nothing to embed).

use engine_core::audio::{input, loudness};
use engine_core::model_kit::Result;
use std::path::Path;

/// The longest stretch of a reference that is read; the rest is ignored (a warning says so).
pub const MAX_SECONDS: f64 = 60.0;
/// A clip whose peak lies below this is refused as silent.
pub const SILENCE_DBFS: f64 = -60.0;
/// A sample at or above this magnitude counts as clipped.
const CLIP_LEVEL: f32 = 0.999;
/// The share of clipped samples above which a warning is given.
const CLIPPED_SHARE: f64 = 0.001;

/// What a variant's `prepare_conditionals` does to the clip it loads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReferenceRules {
    /// The clip must be longer than this (seconds; 0 = no bound).
    pub longer_than_seconds: f64,
    /// Loudness normalisation target (LUFS), if any.
    pub loudness_lufs: Option<f64>,
}

impl ReferenceRules {
    /// Turbo and Nano: `assert len / sr > 5.0`, then `norm_loudness(-27)`.
    pub const TURBO: ReferenceRules = ReferenceRules { longer_than_seconds: 5.0, loudness_lufs: Some(-27.0) };
    /// Multilingual: neither.
    pub const MULTILINGUAL: ReferenceRules = ReferenceRules { longer_than_seconds: 0.0, loudness_lufs: None };
}

/// Reads `path` as the reference at `rate` Hz, with `rules` applied.
pub fn load(path: &Path, rate: u32, rules: &ReferenceRules) -> Result<Vec<f32>> {
    let shown = path.display();
    let clip = input::read_mono(path, MAX_SECONDS)?;
    if clip.truncated {
        tracing::warn!("{shown}: longer than {MAX_SECONDS} s; the first {MAX_SECONDS} s are used");
    }
    let peak = clip.samples.iter().fold(0f32, |m, s| m.max(s.abs()));
    let peak_dbfs = 20.0 * (peak as f64).log10();
    if peak_dbfs < SILENCE_DBFS {
        let level = if peak == 0.0 { "every sample is zero".to_string() } else { format!("its peak is {peak_dbfs:.1} dBFS") };
        return Err(format!("{shown}: the recording is silent ({level}; a reference needs a peak above {SILENCE_DBFS} dBFS)").into());
    }
    let clipped = clip.samples.iter().filter(|s| s.abs() >= CLIP_LEVEL).count() as f64 / clip.samples.len() as f64;
    if clipped > CLIPPED_SHARE {
        tracing::warn!("{shown}: {:.1} % of the samples are clipped; the cloned voice may sound distorted", clipped * 100.0);
    }
    if clip.sample_rate < super::ENCODER_RATE {
        tracing::warn!("{shown}: recorded at {} Hz; the voice encoders listen up to 8 kHz, so the clone lacks what the recording lacks", clip.sample_rate);
    }
    let mut wav = tts_soxr::librosa_resample(&clip.samples, clip.sample_rate, rate).map_err(|e| format!("{shown}: {e}"))?;
    let seconds = wav.len() as f64 / rate as f64;
    if seconds <= rules.longer_than_seconds {
        return Err(format!("{shown}: the recording is {seconds:.2} s long; this model needs a reference longer than {} s", rules.longer_than_seconds).into());
    }
    if let Some(target) = rules.loudness_lufs {
        let measured = loudness::normalize(&mut wav, rate, target);
        tracing::debug!(loudness = ?measured, target, "reference loudness");
    }
    Ok(wav)
}
