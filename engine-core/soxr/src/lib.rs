//! `librosa.resample(y, orig_sr=from, target_sr=to)` for a mono float32 clip,
//! reproduced sample for sample: librosa's default `res_type` is `soxr_hq`,
//! which runs python-soxr's `resample` on libsoxr. This crate runs libsoxr
//! itself (LGPL-2.1, linked dynamically; `docs/licenses.md`) with the same
//! recipe and the same calls:
//!
//! - a resampler with float32 samples in and out, the "HQ" quality recipe
//!   (`SOXR_HQ`, 20-bit precision) and no flags, one thread;
//! - the input fed in pieces of `max(1000, 48000 · from / to)` samples into an
//!   output buffer of `from·len/to + 1` samples, then flushed (python-soxr's
//!   `csoxr_split_ch`, which a 1-D array takes);
//! - the result cut or zero-padded to `ceil(len · (to / from))` samples
//!   (`librosa.util.fix_length`), the ratio in double precision as librosa
//!   computes it.
//!
//! Reference pipelines that load audio with `librosa.load(path, sr=...)`
//! (Chatterbox's cloning) resample through this to see the samples their
//! models saw: a different resampler moves samples by ~1e-4, which flips
//! speech tokens whose rounding margins are smaller than that.

use libsoxr_sys as ffi;
use std::ffi::CStr;

/// The version libsoxr reports (`libsoxr-0.1.3`).
pub fn version() -> String {
    // SAFETY: soxr_version returns a static NUL-terminated string.
    unsafe { CStr::from_ptr(ffi::soxr_version()) }.to_string_lossy().into_owned()
}

/// A libsoxr resampler, deleted when dropped.
struct Resampler(ffi::soxr_t);

impl Drop for Resampler {
    fn drop(&mut self) {
        // SAFETY: created by soxr_create and deleted once.
        unsafe { ffi::soxr_delete(self.0) }
    }
}

fn error_text(e: ffi::soxr_error_t) -> String {
    // SAFETY: libsoxr's errors are static NUL-terminated strings.
    unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
}

/// The length `librosa.resample` gives `len` samples: `ceil(len * ratio)`
/// with the ratio `float(to) / from` (so 396 900 samples at 44.1 → 24 kHz
/// make 216 001, not 216 000: the product rounds up past the integer).
pub fn librosa_length(len: usize, from: u32, to: u32) -> usize {
    (len as f64 * (to as f64 / from as f64)).ceil() as usize
}

/// `samples` at `from` Hz as `librosa.resample(..., res_type="soxr_hq")`
/// returns them at `to` Hz (a copy when the rates are equal, as there).
pub fn librosa_resample(samples: &[f32], from: u32, to: u32) -> Result<Vec<f32>, String> {
    if from == 0 || to == 0 {
        return Err(format!("cannot resample from {from} Hz to {to} Hz"));
    }
    if from == to {
        return Ok(samples.to_vec());
    }
    let (in_rate, out_rate) = (from as f64, to as f64);
    // SAFETY: the specs are plain values; the resampler is checked non-null
    // and owned by `Resampler`.
    let resampler = unsafe {
        let io = ffi::soxr_io_spec(ffi::SOXR_FLOAT32_I, ffi::SOXR_FLOAT32_I);
        let quality = ffi::soxr_quality_spec(ffi::SOXR_HQ as _, 0);
        let mut error: ffi::soxr_error_t = std::ptr::null();
        let handle = ffi::soxr_create(in_rate, out_rate, 1, &mut error, &io, &quality, std::ptr::null());
        if !error.is_null() || handle.is_null() {
            let why = if error.is_null() { "no resampler".to_string() } else { error_text(error) };
            return Err(format!("resampling {from} Hz to {to} Hz: libsoxr: {why}"));
        }
        Resampler(handle)
    };
    // python-soxr's sizes, computed as it computes them (double, truncated).
    let capacity = (samples.len() as f64 * out_rate / in_rate + 1.0) as usize;
    let piece = (48000.0 * in_rate / out_rate).max(1000.0) as usize;
    let mut out = vec![0f32; capacity];
    let mut produced = 0usize;
    let run = |input: &[f32], out: &mut [f32], produced: &mut usize| -> Result<(), String> {
        let mut done = 0usize;
        let input_ptr = if input.is_empty() { std::ptr::null() } else { input.as_ptr().cast() };
        // SAFETY: `input` and the free tail of `out` are valid for the lengths
        // passed; libsoxr writes at most `capacity - produced` samples.
        let error = unsafe {
            ffi::soxr_process(resampler.0, input_ptr, input.len(), std::ptr::null_mut(), out[*produced..].as_mut_ptr().cast(), capacity - *produced, &mut done)
        };
        if !error.is_null() {
            return Err(format!("resampling {from} Hz to {to} Hz: libsoxr: {}", error_text(error)));
        }
        *produced += done;
        Ok(())
    };
    for chunk in samples.chunks(piece) {
        run(chunk, &mut out, &mut produced)?;
    }
    // The flush: no more input.
    run(&[], &mut out, &mut produced)?;
    out.truncate(produced);
    out.resize(librosa_length(samples.len(), from, to), 0.0);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_librosas() {
        assert_eq!(librosa_length(44_100, 44_100, 24_000), 24_001);
        assert_eq!(librosa_length(24_000, 24_000, 16_000), 16_000);
        assert_eq!(librosa_length(24_001, 24_000, 16_000), 16_001);
        let y = librosa_resample(&vec![0.1; 44_101], 44_100, 24_000).unwrap();
        assert_eq!(y.len(), librosa_length(44_101, 44_100, 24_000));
        assert!(librosa_resample(&[], 44_100, 24_000).unwrap().is_empty());
        assert_eq!(librosa_resample(&[0.5, -0.5], 16_000, 16_000).unwrap(), vec![0.5, -0.5]);
        assert!(librosa_resample(&[0.5], 0, 16_000).unwrap_err().contains("0 Hz"));
    }

    /// A tone well inside the passband keeps its level and shape away from
    /// the edges; the linear-phase filter leaves it in time with the input.
    #[test]
    fn a_tone_passes_unchanged() {
        let (from, to) = (44_100u32, 16_000u32);
        let tone =
            |rate: u32, n: usize| -> Vec<f32> { (0..n).map(|i| (0.3 * (2.0 * std::f64::consts::PI * 440.0 * i as f64 / rate as f64).sin()) as f32).collect() };
        let got = librosa_resample(&tone(from, 2 * from as usize), from, to).unwrap();
        let want = tone(to, got.len());
        let edge = to as usize / 10;
        let worst = got[edge..got.len() - edge].iter().zip(&want[edge..]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-4, "worst {worst}");
        assert!(version().starts_with("libsoxr-"), "{}", version());
    }
}
