//! The response formats of `/v1/audio/speech`, encoded piece by piece as the
//! model produces audio (FLAC alone is sent whole at the end: its header
//! holds the totals).

use engine_core::audio::resample::StreamResampler;
use engine_core::audio::{wav_header, FlacStream, RawFormat};

/// OpenAI's `pcm` is 24 kHz 16-bit mono whatever the model's rate: clients
/// play it without a header telling them otherwise.
pub const PCM_RATE: u32 = 24_000;

pub use tts_serve_api::ResponseFormat;

/// One response's encoder. `piece` returns the bytes ready to send (possibly
/// none while an MP3 frame fills), `finish` the rest.
pub struct Encoder {
    state: State,
    started: bool,
}

enum State {
    Wav,
    Pcm(Option<Box<StreamResampler>>),
    Mp3(Option<Box<mp3lame_encoder::Encoder>>),
    Flac(Box<FlacBody>),
}

/// FLAC encoded as the pieces come, kept until the end: the frames so far,
/// and what `finish` checks as [`engine_core::audio::encode_flac`] did over
/// the whole signal.
#[derive(Default)]
struct FlacBody {
    /// None before the first piece (or when the rate was refused).
    stream: Option<FlacStream>,
    frames: Vec<u8>,
    samples: usize,
    non_finite: usize,
    /// The first encoder error, reported by `finish`.
    error: Option<String>,
}

impl FlacBody {
    fn push(&mut self, samples: &[f32], rate: u32) {
        self.samples += samples.len();
        self.non_finite += engine_core::model_kit::finite::count_non_finite_f32(samples);
        if self.error.is_some() {
            return;
        }
        if self.stream.is_none() {
            match FlacStream::new(rate) {
                Ok(s) => self.stream = Some(s),
                Err(e) => return self.error = Some(e),
            }
        }
        if let Err(e) = self.stream.as_mut().expect("set above").push(samples, &mut self.frames) {
            self.error = Some(e);
        }
    }

    /// The whole stream: the header with the real totals, then the frames.
    fn finish(&mut self, rate: u32) -> Result<Vec<u8>, String> {
        engine_core::audio::check_sample_counts(rate, || self.non_finite, self.samples)?;
        if self.samples == 0 {
            return engine_core::audio::encode_flac(&[], rate);
        }
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let stream = self.stream.take().expect("samples came");
        let mut frames = std::mem::take(&mut self.frames);
        let mut out = stream.finish(&mut frames)?;
        out.append(&mut frames);
        Ok(out)
    }
}

impl Encoder {
    pub fn new(format: ResponseFormat) -> Encoder {
        let state = match format {
            ResponseFormat::Wav => State::Wav,
            ResponseFormat::Pcm => State::Pcm(None),
            ResponseFormat::Mp3 => State::Mp3(None),
            ResponseFormat::Flac => State::Flac(Box::default()),
        };
        Encoder { state, started: false }
    }

    pub fn piece(&mut self, samples: &[f32], rate: u32) -> Result<Vec<u8>, String> {
        let first = !self.started;
        self.started = true;
        let mut out = Vec::new();
        match &mut self.state {
            State::Wav => {
                if first {
                    // Sizes unknown while streaming (0xFFFFFFFF), as OpenAI's own WAV stream.
                    out.extend_from_slice(&wav_header(rate, None));
                }
                RawFormat::Pcm16.encode(samples, &mut out);
            }
            State::Pcm(resampler) => {
                if resampler.is_none() {
                    *resampler = Some(Box::new(StreamResampler::new(rate, PCM_RATE)?));
                }
                let resampled = resampler.as_mut().expect("set above").push(samples)?;
                RawFormat::Pcm16.encode(&resampled, &mut out);
            }
            State::Mp3(encoder) => {
                if encoder.is_none() {
                    *encoder = Some(Box::new(mp3_encoder(rate)?));
                }
                let encoder = encoder.as_mut().expect("set above");
                out.reserve(mp3lame_encoder::max_required_buffer_size(samples.len()));
                encoder.encode_to_vec(mp3lame_encoder::MonoPcm(samples), &mut out).map_err(|e| format!("MP3 encoding: {e:?}"))?;
            }
            State::Flac(flac) => flac.push(samples, rate),
        }
        Ok(out)
    }

    /// The bytes after the last piece: the MP3 encoder's last frames, the
    /// whole FLAC stream, the resampler's tail; a header alone when no audio
    /// came at all.
    pub fn finish(&mut self, rate: u32) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        match &mut self.state {
            State::Wav if !self.started => out.extend_from_slice(&wav_header(rate, Some(0))),
            State::Wav => {}
            State::Pcm(resampler) => {
                if let Some(r) = resampler {
                    RawFormat::Pcm16.encode(&r.finish()?, &mut out);
                }
            }
            State::Mp3(encoder) => {
                if let Some(e) = encoder {
                    out.reserve(7200);
                    e.flush_to_vec::<mp3lame_encoder::FlushGap>(&mut out).map_err(|e| format!("MP3 encoding: {e:?}"))?;
                }
            }
            State::Flac(flac) => out = flac.finish(rate)?,
        }
        self.started = true;
        Ok(out)
    }
}

fn mp3_encoder(rate: u32) -> Result<mp3lame_encoder::Encoder, String> {
    let bad = |what: &str| format!("MP3 encoder: {what} (model rate {rate} Hz)");
    let mut b = mp3lame_encoder::Builder::new().ok_or_else(|| bad("LAME did not start"))?;
    b.set_num_channels(1).map_err(|e| bad(&format!("{e:?}")))?;
    b.set_sample_rate(rate).map_err(|e| bad(&format!("{e:?}")))?;
    b.set_brate(mp3lame_encoder::Bitrate::Kbps96).map_err(|e| bad(&format!("{e:?}")))?;
    b.set_quality(mp3lame_encoder::Quality::Good).map_err(|e| bad(&format!("{e:?}")))?;
    // No Xing/LAME tag: LAME writes it before the audio and fills it in only
    // at the end, which a stream cannot go back to; decoders would trim the
    // audio by the tag's unfilled fields.
    b.set_to_write_vbr_tag(false).map_err(|e| bad(&format!("{e:?}")))?;
    b.build().map_err(|e| bad(&format!("{e:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let mut e = Encoder::new(ResponseFormat::Flac);
        e.piece(&bad[..10], 10).unwrap();
        assert_eq!(e.finish(10), engine_core::audio::encode_flac(&bad[..10], 10));
    }

    #[test]
    fn unsupported_formats_name_the_supported_ones() {
        for name in ["opus", "aac", "ogg", ""] {
            let e = ResponseFormat::parse(name).unwrap_err();
            assert_eq!(e, format!("response_format `{name}` is not supported; supported: mp3, wav, pcm, flac"));
        }
    }
}
