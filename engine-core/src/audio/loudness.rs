//! Integrated loudness (ITU-R BS.1770-4, LUFS) of a mono clip, measured as
//! `pyloudnorm.Meter(rate).integrated_loudness` measures it, and the gain step
//! built on it (Chatterbox Turbo normalises a reference recording to −27 LUFS
//! with that meter before cloning).
//!
//! Written here rather than taken from a BS.1770 crate because the reference's
//! numbers depend on pyloudnorm's own choices, which a conforming meter does
//! not share: RBJ-cookbook biquads designed at the clip's rate (a high shelf of
//! +4 dB at 1.5 kHz, Q 1/√2, then a high pass at 38 Hz, Q 0.5) instead of the
//! standard's 48 kHz coefficients, each stage's output rounded to f32, and its
//! block grid (`round((T − 0.4) / 0.1) + 1` blocks of 400 ms every 100 ms, with
//! bounds truncated to whole samples). Gating: blocks at or above −70 LUFS
//! give a mean whose level −10 LU is the relative gate; blocks strictly above
//! both gates give the result.

/// The gating block (s), its step (s) and the absolute gate (LUFS).
const BLOCK_SECONDS: f64 = 0.4;
const BLOCK_STEP: f64 = 0.25;
const ABSOLUTE_GATE: f64 = -70.0;
const RELATIVE_GATE: f64 = -10.0;

/// One biquad, coefficients normalised by `a0`, applied in f64 (scipy's
/// `lfilter`, direct form II transposed).
struct Biquad {
    b: [f64; 3],
    a: [f64; 3],
}

impl Biquad {
    /// pyloudnorm's `IIRfilter(G, Q, fc, rate, 'high_shelf')`.
    fn high_shelf(gain_db: f64, q: f64, fc: f64, rate: f64) -> Self {
        let a = 10f64.powf(gain_db / 40.0);
        let w0 = 2.0 * std::f64::consts::PI * (fc / rate);
        let alpha = w0.sin() / (2.0 * q);
        let (cos, sq) = (w0.cos(), a.sqrt());
        let b0 = a * ((a + 1.0) + (a - 1.0) * cos + 2.0 * sq * alpha);
        let b1 = -2.0 * a * ((a - 1.0) + (a + 1.0) * cos);
        let b2 = a * ((a + 1.0) + (a - 1.0) * cos - 2.0 * sq * alpha);
        let a0 = (a + 1.0) - (a - 1.0) * cos + 2.0 * sq * alpha;
        let a1 = 2.0 * ((a - 1.0) - (a + 1.0) * cos);
        let a2 = (a + 1.0) - (a - 1.0) * cos - 2.0 * sq * alpha;
        Self::normalised([b0, b1, b2], [a0, a1, a2])
    }

    /// pyloudnorm's `IIRfilter(0, Q, fc, rate, 'high_pass')`.
    fn high_pass(q: f64, fc: f64, rate: f64) -> Self {
        let w0 = 2.0 * std::f64::consts::PI * (fc / rate);
        let alpha = w0.sin() / (2.0 * q);
        let cos = w0.cos();
        Self::normalised([(1.0 + cos) / 2.0, -(1.0 + cos), (1.0 + cos) / 2.0], [1.0 + alpha, -2.0 * cos, 1.0 - alpha])
    }

    fn normalised(b: [f64; 3], a: [f64; 3]) -> Self {
        Biquad { b: b.map(|v| v / a[0]), a: a.map(|v| v / a[0]) }
    }

    /// Filters `x` in place; the output is rounded to f32 as pyloudnorm
    /// stores it back into the f32 array it measures.
    fn apply(&self, x: &mut [f32]) {
        let (mut z1, mut z2) = (0.0f64, 0.0f64);
        for s in x.iter_mut() {
            let v = *s as f64;
            let y = self.b[0] * v + z1;
            z1 = self.b[1] * v - self.a[1] * y + z2;
            z2 = self.b[2] * v - self.a[2] * y;
            *s = y as f32;
        }
    }
}

/// The integrated loudness of `samples` at `rate` Hz in LUFS: `-inf` when no
/// block passes the gates (silence). An error for a clip shorter than one
/// gating block, as pyloudnorm raises.
pub fn integrated_loudness(samples: &[f32], rate: u32) -> Result<f64, String> {
    let rate_f = rate as f64;
    if rate == 0 || (samples.len() as f64) < BLOCK_SECONDS * rate_f {
        return Err(format!("loudness needs at least {BLOCK_SECONDS} s of audio; the clip has {:.3} s", samples.len() as f64 / rate_f.max(1.0)));
    }
    let mut x = samples.to_vec();
    Biquad::high_shelf(4.0, 1.0 / 2f64.sqrt(), 1500.0, rate_f).apply(&mut x);
    Biquad::high_pass(0.5, 38.0, rate_f).apply(&mut x);

    let seconds = samples.len() as f64 / rate_f;
    let blocks = ((seconds - BLOCK_SECONDS) / (BLOCK_SECONDS * BLOCK_STEP)).round_ties_even() as usize + 1;
    let norm = 1.0 / (BLOCK_SECONDS * rate_f);
    let power: Vec<f64> = (0..blocks)
        .map(|j| {
            let lower = ((BLOCK_SECONDS * (j as f64 * BLOCK_STEP) * rate_f) as usize).min(x.len());
            let upper = ((BLOCK_SECONDS * (j as f64 * BLOCK_STEP + 1.0) * rate_f) as usize).clamp(lower, x.len());
            norm * x[lower..upper].iter().map(|&v| v as f64 * v as f64).sum::<f64>()
        })
        .collect();
    let level = |z: f64| -0.691 + 10.0 * z.log10();
    let mean_of = |keep: &dyn Fn(f64) -> bool| -> Option<f64> {
        let kept: Vec<f64> = power.iter().copied().filter(|&z| keep(level(z))).collect();
        (!kept.is_empty()).then(|| kept.iter().sum::<f64>() / kept.len() as f64)
    };
    let Some(absolute) = mean_of(&|l| l >= ABSOLUTE_GATE) else {
        return Ok(f64::NEG_INFINITY);
    };
    let relative = level(absolute) + RELATIVE_GATE;
    Ok(mean_of(&|l| l > relative && l > ABSOLUTE_GATE).map_or(f64::NEG_INFINITY, level))
}

/// Turbo's `norm_loudness`: `samples` scaled to `target_lufs`. The clip is
/// left as it is when its loudness cannot be measured (shorter than a block)
/// or the gain is not a finite positive number (silence); the returned
/// loudness says which (`None`: not measured).
pub fn normalize(samples: &mut [f32], rate: u32, target_lufs: f64) -> Option<f64> {
    let loudness = integrated_loudness(samples, rate).ok()?;
    let gain = 10f64.powf((target_lufs - loudness) / 20.0);
    if gain.is_finite() && gain > 0.0 {
        let gain = gain as f32;
        samples.iter_mut().for_each(|s| *s *= gain);
    }
    Some(loudness)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(freq: f64, amplitude: f64, rate: u32, seconds: f64) -> Vec<f32> {
        let n = (seconds * rate as f64) as usize;
        (0..n).map(|i| (amplitude * (2.0 * std::f64::consts::PI * freq * i as f64 / rate as f64).sin()) as f32).collect()
    }

    /// BS.1770's calibration: a 997 Hz sine at 0 dBFS peak on one channel
    /// reads −3.01 LUFS (the K-weighting is within 0.01 dB of unity there).
    #[test]
    fn full_scale_sine_reads_minus_three() {
        let l = integrated_loudness(&tone(997.0, 1.0, 48_000, 5.0), 48_000).unwrap();
        assert!((l + 3.01).abs() < 0.05, "{l}");
    }

    /// Halving the amplitude lowers the level by 6.02 dB, and the gain step
    /// lands on its target.
    #[test]
    fn level_scales_and_normalises() {
        let a = integrated_loudness(&tone(440.0, 0.5, 24_000, 6.0), 24_000).unwrap();
        let b = integrated_loudness(&tone(440.0, 0.25, 24_000, 6.0), 24_000).unwrap();
        assert!((a - b - 20.0 * 2f64.log10()).abs() < 1e-4, "{a} {b}");
        let mut x = tone(440.0, 0.25, 24_000, 6.0);
        normalize(&mut x, 24_000, -27.0);
        let after = integrated_loudness(&x, 24_000).unwrap();
        assert!((after + 27.0).abs() < 1e-3, "{after}");
    }

    /// Silence has no loudness and is left alone; a clip shorter than a block is refused.
    #[test]
    fn silence_and_short_clips() {
        let mut silent = vec![0f32; 24_000];
        assert_eq!(integrated_loudness(&silent, 24_000).unwrap(), f64::NEG_INFINITY);
        assert_eq!(normalize(&mut silent, 24_000, -27.0), Some(f64::NEG_INFINITY));
        assert!(silent.iter().all(|&s| s == 0.0));
        let err = integrated_loudness(&[0.1; 100], 24_000).unwrap_err();
        assert_eq!(err, "loudness needs at least 0.4 s of audio; the clip has 0.004 s");
        let mut short = vec![0.1f32; 100];
        assert_eq!(normalize(&mut short, 24_000, -27.0), None);
        assert_eq!(short, vec![0.1f32; 100]);
    }
}
