//! Audio output: checks what a model produced and encodes it as WAV; the file
//! itself is written by [`crate::output`]. Reading recordings is [`input`],
//! converting rates [`resample`], measuring loudness [`loudness`].

use std::path::Path;

pub mod input;
pub mod loudness;
pub mod resample;

/// Sample rates the engine writes (a model reporting another is refused).
pub const SAMPLE_RATE_RANGE: std::ops::RangeInclusive<u32> = 1000..=384_000;

/// Refuses audio a WAV file cannot honestly hold: an out-of-range sample rate,
/// or NaN / infinite samples (a corrupt model must not become silence).
pub fn check_samples(samples: &[f32], sample_rate: u32) -> Result<(), String> {
    if !SAMPLE_RATE_RANGE.contains(&sample_rate) {
        return Err(format!(
            "the model reports a sample rate of {sample_rate} Hz (supported: {}..={} Hz); the model file may be corrupt",
            SAMPLE_RATE_RANGE.start(),
            SAMPLE_RATE_RANGE.end()
        ));
    }
    let bad = samples.iter().filter(|s| !s.is_finite()).count();
    if bad > 0 {
        return Err(format!("the model produced {bad} non-finite samples (NaN or infinity) of {}; the model file may be corrupt", samples.len()));
    }
    Ok(())
}

/// Mono 16-bit PCM WAV bytes (samples clamped to [-1, 1]).
pub fn encode_wav(samples: &[f32], sample_rate: u32) -> Result<Vec<u8>, String> {
    check_samples(samples, sample_rate)?;
    let spec = hound::WavSpec { channels: 1, sample_rate, bits_per_sample: 16, sample_format: hound::SampleFormat::Int };
    let mut bytes = std::io::Cursor::new(Vec::with_capacity(44 + 2 * samples.len()));
    let mut w = hound::WavWriter::new(&mut bytes, spec).map_err(|e| format!("encoding WAV: {e}"))?;
    for s in samples {
        w.write_sample((s.clamp(-1.0, 1.0) * i16::MAX as f32).round() as i16).map_err(|e| format!("encoding WAV: {e}"))?;
    }
    w.finalize().map_err(|e| format!("encoding WAV: {e}"))?;
    Ok(bytes.into_inner())
}

/// Encodes `samples` and writes them to `path` safely ([`crate::output::write_file`]).
pub fn write_wav(path: &Path, samples: &[f32], sample_rate: u32) -> Result<(), String> {
    crate::output::write_file(path, &encode_wav(samples, sample_rate)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_samples_and_bad_rates_are_refused() {
        assert!(encode_wav(&[0.0, 0.5], 24000).is_ok());
        let e = encode_wav(&[0.0, f32::NAN, f32::INFINITY], 24000).unwrap_err();
        assert!(e.starts_with("the model produced 2 non-finite samples (NaN or infinity) of 3"), "{e}");
        let e = encode_wav(&[0.0], 0).unwrap_err();
        assert!(e.starts_with("the model reports a sample rate of 0 Hz"), "{e}");
        assert!(encode_wav(&[0.0], u32::MAX).is_err());
    }

    #[test]
    fn wav_round_trip() {
        let bytes = encode_wav(&[0.0, 0.5, -1.0, 2.0], 16000).unwrap();
        let mut r = hound::WavReader::new(std::io::Cursor::new(bytes)).unwrap();
        assert_eq!(r.spec().sample_rate, 16000);
        let s: Vec<i16> = r.samples::<i16>().map(Result::unwrap).collect();
        assert_eq!(s, vec![0, 16384, -32767, 32767]);
    }
}
