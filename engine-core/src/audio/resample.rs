//! Sample-rate conversion of whole clips through `rubato`'s synchronous FFT
//! resampler: one Blackman-Harris² windowed low-pass per clip, applied in the
//! frequency domain, f64 inside. The output is aligned with the input (the
//! resampler's delay is trimmed) and holds `ceil(len · (to / from))` samples,
//! the length `librosa.resample` gives (44 100 samples at 44.1 → 24 kHz make
//! 24 001).
//!
//! The server converts its output to a client's rate with this
//! ([`StreamResampler`]). Model code that must see the samples a reference
//! pipeline saw from `librosa.load` / `librosa.resample` uses `tts_soxr`
//! instead: libsoxr itself, bit for bit, since a look-alike moves samples by
//! ~1e-4 and that flips speech tokens.
//!
//! The filter is shaped like soxr's "HQ" recipe, which `librosa.load` uses:
//! flat (< 0.01 dB) to 0.9 of the lower rate's Nyquist frequency, −2.1 dB at
//! 0.95 (soxr: −2.8 dB), stopband from Nyquist on. A steeper filter would ring longer at a clip's
//! edges than soxr's does and so differ from it there; this one agrees with
//! soxr to about 130 dB inside a clip (tests/audio_input.rs).
//!
//! Quality, measured by this module's tests against analytic tones away from
//! the clip's edges: better than 120 dB SNR up to 0.9 of the lower Nyquist
//! frequency for the conversions cloning needs (44.1/48/96/8 kHz → 24/16 kHz,
//! 24 ↔ 16 kHz); a tone past the new Nyquist frequency is suppressed below
//! −100 dB.

use audioadapter_buffers::direct::InterleavedSlice;
use rubato::{Fft, FixedSync, Resampler, WindowFunction};

/// The FFT block on the lower rate's side, in frames. rubato sizes the filter
/// to the block: 320 frames put its transition band between 0.92 and 1.0 of
/// the lower Nyquist frequency, where soxr's HQ recipe has it.
const LOWER_RATE_BLOCK: usize = 320;

/// The FFT resampler [`resample`] and [`StreamResampler`] share.
fn fft_resampler(from: u32, to: u32) -> Result<Fft<f64>, String> {
    // Whole blocks of the reduced ratio, an even number of them: rubato trims
    // half its output block as the delay, which is off by half a sample when
    // that block is odd.
    let g = gcd(from, to);
    let (units_in, units_out) = ((from / g) as usize, (to / g) as usize);
    let blocks = LOWER_RATE_BLOCK.div_ceil(units_in.min(units_out));
    let chunk = (blocks + blocks % 2) * units_in;
    Fft::<f64>::new_custom(from as usize, to as usize, chunk, 1, 1, WindowFunction::BlackmanHarris2, FixedSync::Input)
        .map_err(|e| format!("resampling {from} Hz to {to} Hz: {e}"))
}

/// `samples` at `from` Hz, resampled to `to` Hz (a copy when they are equal).
pub fn resample(samples: &[f32], from: u32, to: u32) -> Result<Vec<f32>, String> {
    if from == 0 || to == 0 {
        return Err(format!("cannot resample from {from} Hz to {to} Hz"));
    }
    if from == to || samples.is_empty() {
        return Ok(samples.to_vec());
    }
    let mut resampler = fft_resampler(from, to)?;
    let input: Vec<f64> = samples.iter().map(|&s| s as f64).collect();
    let adapter = InterleavedSlice::new(&input, 1, input.len()).map_err(|e| format!("resampling: {e}"))?;
    let out = resampler.process_all(&adapter, input.len(), None).map_err(|e| format!("resampling {from} Hz to {to} Hz: {e}"))?;
    Ok(out.take_data().into_iter().map(|s| s as f32).collect())
}

/// [`resample`] for audio that arrives in pieces (a stream being encoded as it
/// is synthesized): the same filter and the same output, sample for sample,
/// once [`StreamResampler::finish`] has flushed the tail; each piece comes out
/// as soon as whole FFT blocks of input are there (at most one block, ~13 ms at
/// 24 kHz, is held back).
pub struct StreamResampler {
    resampler: Option<Fft<f64>>,
    from: u32,
    to: u32,
    /// Input not yet resampled (less than one block).
    pending: Vec<f64>,
    /// Output samples still to drop: the filter's delay.
    delay_left: usize,
    consumed: u64,
    produced: u64,
}

impl StreamResampler {
    pub fn new(from: u32, to: u32) -> Result<StreamResampler, String> {
        if from == 0 || to == 0 {
            return Err(format!("cannot resample from {from} Hz to {to} Hz"));
        }
        let resampler = if from == to { None } else { Some(fft_resampler(from, to)?) };
        let delay_left = resampler.as_ref().map_or(0, |r| r.output_delay());
        Ok(StreamResampler { resampler, from, to, pending: Vec::new(), delay_left, consumed: 0, produced: 0 })
    }

    /// Resamples what whole blocks of `samples` (after what was held back) allow.
    pub fn push(&mut self, samples: &[f32]) -> Result<Vec<f32>, String> {
        self.consumed += samples.len() as u64;
        if self.resampler.is_none() {
            self.produced += samples.len() as u64;
            return Ok(samples.to_vec());
        }
        self.pending.extend(samples.iter().map(|&s| s as f64));
        self.drain(false)
    }

    /// The rest: the held-back input and the filter's tail, up to
    /// `ceil(input · to / from)` samples in all.
    pub fn finish(&mut self) -> Result<Vec<f32>, String> {
        if self.resampler.is_none() {
            return Ok(Vec::new());
        }
        let mut out = self.drain(true)?;
        let total = (self.consumed * self.to as u64).div_ceil(self.from as u64);
        let keep = out.len() as u64 - self.produced.saturating_sub(total).min(out.len() as u64);
        out.truncate(keep as usize);
        self.produced = self.produced.min(total);
        Ok(out)
    }

    /// Runs whole blocks; with `flush`, pads with silence until the output
    /// covers the input.
    fn drain(&mut self, flush: bool) -> Result<Vec<f32>, String> {
        let (from, to) = (self.from, self.to);
        let Some(resampler) = self.resampler.as_mut() else { return Ok(Vec::new()) };
        let total = (self.consumed * to as u64).div_ceil(from as u64);
        let mut out = Vec::new();
        loop {
            let need = resampler.input_frames_next();
            if self.pending.len() < need {
                if !flush || self.produced >= total {
                    break;
                }
                self.pending.resize(need, 0.0);
            }
            let block: Vec<f64> = self.pending.drain(..need).collect();
            let adapter = InterleavedSlice::new(&block, 1, need).map_err(|e| format!("resampling: {e}"))?;
            let data = resampler.process(&adapter, None).map_err(|e| format!("resampling {from} Hz to {to} Hz: {e}"))?.take_data();
            let skip = self.delay_left.min(data.len());
            self.delay_left -= skip;
            self.produced += (data.len() - skip) as u64;
            out.extend(data[skip..].iter().map(|&s| s as f32));
        }
        Ok(out)
    }
}

/// `torchaudio.transforms.Resample(from, to)` with its defaults
/// (`sinc_interp_hann`, 6 zero crossings, roll-off 0.99), reproduced: a
/// polyphase Hann-windowed sinc over the reduced ratio, the input zero-padded
/// by the filter's half-width, `ceil(len · to / from)` samples out. The kernel
/// is computed in f64 and rounded to f32, as torchaudio stores it; sums run in
/// f64. Reference paths that resample through torchaudio (Chatterbox's S3Gen
/// prompt) use this to see the samples their model saw.
pub fn windowed_sinc(samples: &[f32], from: u32, to: u32) -> Result<Vec<f32>, String> {
    const ZERO_CROSSINGS: f64 = 6.0;
    const ROLLOFF: f64 = 0.99;
    if from == 0 || to == 0 {
        return Err(format!("cannot resample from {from} Hz to {to} Hz"));
    }
    if from == to {
        return Ok(samples.to_vec());
    }
    let g = gcd(from, to);
    let (orig, new) = ((from / g) as usize, (to / g) as usize);
    if orig > 4096 || new > 4096 {
        return Err(format!("{from} Hz to {to} Hz reduces to {orig}:{new}; the windowed-sinc resampler takes ratios of at most 4096"));
    }
    let base = orig.min(new) as f64 * ROLLOFF;
    let width = (ZERO_CROSSINGS * orig as f64 / base).ceil() as usize;
    let taps = 2 * width + orig;
    let kernel: Vec<Vec<f64>> = (0..new)
        .map(|phase| {
            (0..taps)
                .map(|i| {
                    let t = ((-(phase as f64) / new as f64 + (i as f64 - width as f64) / orig as f64) * base).clamp(-ZERO_CROSSINGS, ZERO_CROSSINGS);
                    let window = (t * std::f64::consts::PI / ZERO_CROSSINGS / 2.0).cos().powi(2);
                    let t = t * std::f64::consts::PI;
                    let sinc = if t == 0.0 { 1.0 } else { t.sin() / t };
                    (sinc * window * base / orig as f64) as f32 as f64
                })
                .collect()
        })
        .collect();
    let target = (new as f64 * samples.len() as f64 / orig as f64).ceil() as usize;
    // Sample `j` of the padded input is `samples[j - width]`, zero outside.
    let at = |j: usize| j.checked_sub(width).and_then(|k| samples.get(k)).map_or(0.0, |&x| x as f64);
    Ok((0..target)
        .map(|n| {
            let (frame, phase) = (n / new, n % new);
            kernel[phase].iter().enumerate().map(|(i, w)| w * at(frame * orig + i)).sum::<f64>() as f32
        })
        .collect())
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tones(rate: u32, seconds: f64, freqs: &[f64]) -> Vec<f64> {
        let n = (rate as f64 * seconds) as usize;
        (0..n)
            .map(|i| {
                let t = i as f64 / rate as f64;
                freqs.iter().enumerate().map(|(k, f)| 0.2 * (2.0 * std::f64::consts::PI * f * t + k as f64).sin()).sum::<f64>()
            })
            .collect()
    }

    /// SNR of `got` against the analytic signal, ignoring 300 ms at each edge:
    /// there the filter (one block long) reaches past the clip, where the
    /// analytic tone goes on and the recording does not.
    fn snr_db(got: &[f32], want: &[f64], rate: u32) -> f64 {
        let edge = (rate as f64 * 0.3) as usize;
        let want: Vec<f32> = want[edge..want.len() - edge].iter().map(|&w| w as f32).collect();
        // `got` may hold one sample more (the length is rounded up).
        crate::compare::snr_db(&got[edge..edge + want.len()], &want).unwrap()
    }

    #[test]
    fn tones_survive_every_conversion_cloning_needs() {
        for (from, to) in [(44_100, 24_000), (48_000, 16_000), (96_000, 24_000), (8000, 16_000), (24_000, 16_000), (16_000, 24_000)] {
            let nyquist = from.min(to) as f64 / 2.0;
            let freqs = [110.0, 1234.5, 0.5 * nyquist, 0.9 * nyquist];
            let input: Vec<f32> = tones(from, 2.0, &freqs).iter().map(|&s| s as f32).collect();
            let got = resample(&input, from, to).unwrap();
            let want = tones(to, 2.0, &freqs);
            assert_eq!(got.len(), (input.len() as f64 * (to as f64 / from as f64)).ceil() as usize, "{from} -> {to}");
            let snr = snr_db(&got, &want, to);
            // f32 input itself limits the SNR to about 150 dB.
            assert!(snr >= 120.0, "{from} -> {to}: SNR {snr:.1} dB");
        }
    }

    /// Gain in dB of a tone at `freq` through `from -> to`, away from the edges.
    fn gain_db(from: u32, to: u32, freq: f64) -> f64 {
        let input: Vec<f32> = tones(from, 2.0, &[freq]).iter().map(|&s| s as f32).collect();
        let got = resample(&input, from, to).unwrap();
        let edge = (to as f64 * 0.3) as usize;
        let inner = &got[edge..got.len() - edge];
        let rms = (inner.iter().map(|&s| (s as f64).powi(2)).sum::<f64>() / inner.len() as f64).sqrt();
        20.0 * (rms / (0.2 / 2f64.sqrt())).log10()
    }

    #[test]
    fn the_response_has_soxr_hqs_shape() {
        for (from, to) in [(44_100, 24_000), (44_100, 16_000), (24_000, 16_000), (16_000, 24_000)] {
            let nyquist = from.min(to) as f64 / 2.0;
            let flat = gain_db(from, to, 0.9 * nyquist);
            let knee = gain_db(from, to, 0.95 * nyquist);
            let stop = gain_db(from, to, 1.02 * nyquist);
            eprintln!("{from} -> {to}: {flat:.4} dB at 0.9, {knee:.2} dB at 0.95, {stop:.1} dB at 1.02 of Nyquist");
            assert!(flat.abs() < 0.01, "{from} -> {to}: {flat:.4} dB at 0.9 Nyquist");
            assert!((-6.0..-1.0).contains(&knee), "{from} -> {to}: {knee:.2} dB at 0.95 Nyquist");
            // Upsampling has nothing past the old Nyquist frequency to remove.
            if from > to {
                assert!(stop < -100.0, "{from} -> {to}: {stop:.1} dB at 1.02 Nyquist");
            }
        }
    }

    #[test]
    fn content_above_the_new_nyquist_is_removed() {
        // A 10 kHz tone does not exist at 16 kHz: what is left must be tiny.
        let input: Vec<f32> = tones(48_000, 2.0, &[10_000.0]).iter().map(|&s| s as f32).collect();
        let got = resample(&input, 48_000, 16_000).unwrap();
        let edge = 4800;
        let rms = (got[edge..got.len() - edge].iter().map(|&s| (s as f64).powi(2)).sum::<f64>() / (got.len() - 2 * edge) as f64).sqrt();
        let level_db = 20.0 * (rms / (0.2 / 2f64.sqrt())).log10();
        assert!(level_db < -100.0, "alias at {level_db:.1} dB");
    }

    #[test]
    fn equal_rates_and_empty_input_are_copies() {
        assert_eq!(resample(&[0.1, 0.2], 16_000, 16_000).unwrap(), vec![0.1, 0.2]);
        assert!(resample(&[], 16_000, 24_000).unwrap().is_empty());
        assert!(resample(&[0.1], 0, 24_000).unwrap_err().contains("0 Hz"));
    }

    #[test]
    fn streamed_pieces_give_the_whole_clips_samples() {
        let clip: Vec<f32> = tones(44_100, 0.77, &[440.0, 3000.0, 9000.0]).into_iter().map(|v| v as f32).collect();
        for (from, to) in [(44_100, 24_000), (24_000, 24_000), (16_000, 24_000)] {
            let whole = resample(&clip, from, to).unwrap();
            let mut stream = StreamResampler::new(from, to).unwrap();
            let mut got = Vec::new();
            // Pieces of uneven sizes, an empty one among them.
            let mut at = 0;
            for (i, len) in [1usize, 0, 700, 13, 4410, 999].iter().cycle().enumerate() {
                if at >= clip.len() {
                    break;
                }
                let end = (at + len + i % 3).min(clip.len());
                got.extend(stream.push(&clip[at..end]).unwrap());
                at = end;
            }
            got.extend(stream.finish().unwrap());
            assert_eq!(got.len(), whole.len(), "{from} -> {to}");
            let diff = got.iter().zip(&whole).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(diff <= 1e-6, "{from} -> {to}: max diff {diff}");
        }
        assert!(StreamResampler::new(0, 24_000).is_err());
    }
}
