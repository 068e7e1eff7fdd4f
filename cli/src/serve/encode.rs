//! The response formats of `/v1/audio/speech`, encoded piece by piece as the
//! model produces audio through engine-core's one encoder layer
//! ([`engine_core::audio::encode`]). What is particular to the API is here:
//! OpenAI's `pcm` is 24 kHz whatever the model's rate, and FLAC is sent whole
//! at the end (its header holds the totals, and a response cannot go back).

use engine_core::audio::encode::{AudioFormat, StreamEncoder};
use engine_core::audio::resample::StreamResampler;

/// OpenAI's `pcm` is 24 kHz 16-bit mono whatever the model's rate: clients
/// play it without a header telling them otherwise.
pub const PCM_RATE: u32 = 24_000;

pub use tts_serve_api::ResponseFormat;

/// The encoder layer's format for a response format.
pub fn audio_format(format: ResponseFormat) -> AudioFormat {
    match format {
        ResponseFormat::Mp3 => AudioFormat::Mp3,
        ResponseFormat::Opus => AudioFormat::Opus,
        ResponseFormat::Aac => AudioFormat::Aac,
        ResponseFormat::Flac => AudioFormat::Flac,
        ResponseFormat::Wav => AudioFormat::Wav,
        ResponseFormat::Pcm => AudioFormat::Pcm,
    }
}

/// The sampling rate a response of `format` carries for a model at `rate`
/// (what `x-sample-rate` says: Opus is 48 kHz whatever the model's rate).
pub fn response_rate(format: ResponseFormat, rate: u32) -> u32 {
    match format {
        ResponseFormat::Pcm => PCM_RATE,
        other => audio_format(other).output_rate(rate),
    }
}

/// One response's encoder. `piece` returns the bytes ready to send (possibly
/// none while a codec's frame fills, and always none for FLAC), `finish` the
/// rest.
pub struct Encoder {
    format: ResponseFormat,
    /// Started by the first piece, which brings the model's rate.
    stream: Option<Stream>,
}

struct Stream {
    encoder: StreamEncoder,
    /// `pcm` from a model whose rate is not 24 kHz.
    to_pcm_rate: Option<StreamResampler>,
    /// FLAC: everything so far, sent by `finish` with the final header.
    held: Option<Vec<u8>>,
}

impl Stream {
    fn new(format: ResponseFormat, rate: u32) -> Result<Stream, String> {
        let (to_pcm_rate, encoder_rate) = match format {
            ResponseFormat::Pcm if rate != PCM_RATE => {
                engine_core::audio::check_samples(&[], rate)?;
                (Some(StreamResampler::new(rate, PCM_RATE)?), PCM_RATE)
            }
            _ => (None, rate),
        };
        let held = (format == ResponseFormat::Flac).then(Vec::new);
        Ok(Stream { encoder: StreamEncoder::new(audio_format(format), encoder_rate)?, to_pcm_rate, held })
    }

    fn push(&mut self, samples: &[f32]) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        match &mut self.to_pcm_rate {
            Some(r) => self.encoder.push(&r.push(samples)?, &mut out)?,
            None => self.encoder.push(samples, &mut out)?,
        }
        if let Some(held) = &mut self.held {
            held.append(&mut out);
        }
        Ok(out)
    }

    fn finish(mut self) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        if let Some(r) = &mut self.to_pcm_rate {
            self.encoder.push(&r.finish()?, &mut out)?;
        }
        let header = self.encoder.finish(&mut out)?;
        match (self.held, header) {
            (Some(mut held), Some(header)) => {
                held.append(&mut out);
                held[..header.len()].copy_from_slice(&header);
                Ok(held)
            }
            (Some(mut held), None) => {
                held.append(&mut out);
                Ok(held)
            }
            // A stream's own header stays: WAV's sizes are unknown, as
            // OpenAI's own WAV stream states them.
            (None, _) => Ok(out),
        }
    }
}

impl Encoder {
    pub fn new(format: ResponseFormat) -> Encoder {
        Encoder { format, stream: None }
    }

    pub fn piece(&mut self, samples: &[f32], rate: u32) -> Result<Vec<u8>, String> {
        if self.stream.is_none() {
            self.stream = Some(Stream::new(self.format, rate)?);
        }
        self.stream.as_mut().expect("set above").push(samples)
    }

    /// The bytes after the last piece: the codec's last frames, the whole
    /// FLAC stream, the resampler's tail; a whole empty stream when no audio
    /// came at all.
    pub fn finish(&mut self, rate: u32) -> Result<Vec<u8>, String> {
        match self.stream.take() {
            Some(stream) => stream.finish(),
            None => Stream::new(self.format, rate)?.finish(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine_core::audio::{wav_header, RawFormat};

    fn tone(rate: u32, n: usize) -> Vec<f32> {
        (0..n).map(|i| 0.3 * (i as f32 * 440.0 * std::f32::consts::TAU / rate as f32).sin()).collect()
    }

    fn encode(format: ResponseFormat, samples: &[f32], rate: u32) -> Vec<u8> {
        let mut e = Encoder::new(format);
        let mut out = Vec::new();
        for piece in samples.chunks(1000) {
            out.extend(e.piece(piece, rate).unwrap());
        }
        out.extend(e.finish(rate).unwrap());
        out
    }

    #[test]
    fn streamed_wav_is_a_header_then_the_samples() {
        let samples = tone(44_100, 2500);
        let bytes = encode(ResponseFormat::Wav, &samples, 44_100);
        assert_eq!(bytes.len(), 44 + 2 * samples.len());
        assert_eq!(&bytes[..44], &wav_header(44_100, None));
        let mut raw = Vec::new();
        RawFormat::Pcm16.encode(&samples, &mut raw);
        assert_eq!(&bytes[44..], &raw[..]);
        // Nothing synthesized: an empty but valid WAV.
        assert_eq!(encode(ResponseFormat::Wav, &[], 44_100), wav_header(44_100, Some(0)).to_vec());
    }

    #[test]
    fn pcm_is_24_khz_whatever_the_model_rate() {
        let samples = tone(44_100, 44_100 / 2);
        let bytes = encode(ResponseFormat::Pcm, &samples, 44_100);
        assert_eq!(bytes.len(), 2 * 12_000);
        let at_24k = encode(ResponseFormat::Pcm, &tone(24_000, 5000), 24_000);
        let mut raw = Vec::new();
        RawFormat::Pcm16.encode(&tone(24_000, 5000), &mut raw);
        assert_eq!(at_24k, raw);
        assert_eq!(response_rate(ResponseFormat::Pcm, 44_100), 24_000);
    }

    #[test]
    fn mp3_and_flac_decode_back_to_the_audio() {
        let samples = tone(44_100, 44_100);
        for format in [ResponseFormat::Mp3, ResponseFormat::Flac] {
            let bytes = encode(format, &samples, 44_100);
            let clip = engine_core::audio::input::decode_mono(&bytes, 10.0).unwrap();
            assert_eq!(clip.sample_rate, 44_100, "{format:?}");
            // MP3 adds the encoder's delay and pads the last frame.
            let extra = clip.samples.len() as i64 - samples.len() as i64;
            assert!((0..=2 * 1152 + 576).contains(&extra), "{format:?}: {} samples for {}", clip.samples.len(), samples.len());
            if format == ResponseFormat::Flac {
                let worst = clip.samples.iter().zip(&samples).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(worst <= 1.0 / 32768.0 + 1e-6, "FLAC holds 16-bit samples: {worst}");
            }
        }
    }

    #[test]
    fn opus_and_aac_are_the_encoder_layers_streams() {
        let samples = tone(44_100, 30_000);
        for (format, audio) in [(ResponseFormat::Opus, AudioFormat::Opus), (ResponseFormat::Aac, AudioFormat::Aac)] {
            let bytes = encode(format, &samples, 44_100);
            let mut e = StreamEncoder::new(audio, 44_100).unwrap();
            let mut want = Vec::new();
            for piece in samples.chunks(1000) {
                e.push(piece, &mut want).unwrap();
            }
            e.finish(&mut want).unwrap();
            assert_eq!(bytes, want, "{format:?}");
            assert_eq!(format.content_type(), audio.content_type());
        }
        assert!(encode(ResponseFormat::Opus, &samples, 44_100).starts_with(b"OggS"));
        assert_eq!(response_rate(ResponseFormat::Opus, 44_100), 48_000);
        assert_eq!(response_rate(ResponseFormat::Aac, 44_100), 44_100);
        // Nothing synthesized: still a stream with its headers.
        assert!(encode(ResponseFormat::Opus, &[], 24_000).starts_with(b"OggS"));
    }

    #[test]
    fn streamed_flac_is_encode_flac_over_the_whole_signal() {
        for n in [0, 1, 999, 4096, 44_100] {
            let samples = tone(44_100, n);
            assert_eq!(encode(ResponseFormat::Flac, &samples, 44_100), engine_core::audio::encode_flac(&samples, 44_100).unwrap(), "{n} samples");
        }
        let mut bad = tone(24_000, 3000);
        bad[5] = f32::NAN;
        bad[2500] = f32::INFINITY;
        let mut e = Encoder::new(ResponseFormat::Flac);
        for piece in bad.chunks(1000) {
            assert!(e.piece(piece, 24_000).unwrap().is_empty(), "FLAC sends nothing before the end");
        }
        assert_eq!(e.finish(24_000), engine_core::audio::encode_flac(&bad, 24_000));
        // A rate out of range is refused at the first piece, as encode_flac refuses it.
        let mut e = Encoder::new(ResponseFormat::Flac);
        assert_eq!(e.piece(&bad[..10], 10).map(|_| ()), engine_core::audio::encode_flac(&bad[..10], 10).map(|_| ()));
    }

    #[test]
    fn every_openai_format_is_supported_and_others_name_them() {
        for (name, format) in [
            ("mp3", ResponseFormat::Mp3),
            ("opus", ResponseFormat::Opus),
            ("aac", ResponseFormat::Aac),
            ("flac", ResponseFormat::Flac),
            ("wav", ResponseFormat::Wav),
            ("pcm", ResponseFormat::Pcm),
        ] {
            assert_eq!(ResponseFormat::parse(name), Ok(format));
            assert_eq!(audio_format(format).name(), name);
        }
        for name in ["ogg", "m4a", ""] {
            let e = ResponseFormat::parse(name).unwrap_err();
            assert_eq!(e, format!("response_format `{name}` is not supported; supported: mp3, opus, aac, flac, wav, pcm"));
        }
    }
}
