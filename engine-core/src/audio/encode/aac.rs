//! AAC-LC through the Fraunhofer FDK AAC library (the `fdk-aac` crate) in
//! ADTS frames, which need no container and can be played from any frame
//! on. AAC has a fixed list of sampling rates: a model rate outside it is
//! resampled to 48 kHz first. ADTS has no field for the encoder's delay, so
//! decoders play it (FDK's delay, about two frames of silence) before the audio.

use super::Codec;
use crate::audio::resample::StreamResampler;

/// The sampling rates an ADTS header can state.
const AAC_RATES: [u32; 12] = [8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 64000, 88200, 96000];
/// Mono speech at 64 kbit/s is transparent for AAC-LC.
const BITRATE: u32 = 64_000;
/// Room for one frame's bytes: an ADTS frame of one channel is at most
/// 6144 bits of payload plus its header.
const OUT_CHUNK: usize = 8192;

/// The rate `rate` is coded at: itself where ADTS can state it, else 48 kHz.
pub(super) fn coded_rate(rate: u32) -> u32 {
    if AAC_RATES.contains(&rate) {
        rate
    } else {
        48_000
    }
}

pub(super) struct Adts {
    encoder: fdk_aac::enc::Encoder,
    resampler: Option<StreamResampler>,
    /// Samples per frame, and the encoder's delay, in samples.
    frame: u64,
    delay: u64,
    /// Samples given to the encoder (at the coded rate).
    fed: u64,
}

fn aac_error(e: fdk_aac::enc::EncoderError) -> String {
    format!("AAC encoding: {e}")
}

impl Adts {
    pub(super) fn new(rate: u32) -> Result<Adts, String> {
        let coded = coded_rate(rate);
        let encoder = fdk_aac::enc::Encoder::new(fdk_aac::enc::EncoderParams {
            bit_rate: fdk_aac::enc::BitRate::Cbr(BITRATE),
            sample_rate: coded,
            transport: fdk_aac::enc::Transport::Adts,
            channels: fdk_aac::enc::ChannelMode::Mono,
            audio_object_type: fdk_aac::enc::AudioObjectType::Mpeg4LowComplexity,
        })
        .map_err(aac_error)?;
        let info = encoder.info().map_err(aac_error)?;
        let resampler = if coded == rate { None } else { Some(StreamResampler::new(rate, coded)?) };
        Ok(Adts { encoder, resampler, frame: info.frameLength.max(1) as u64, delay: info.nDelay as u64, fed: 0 })
    }

    /// Feeds `samples` (at the coded rate) and appends the frames that come out.
    fn feed(&mut self, samples: &[f32], out: &mut Vec<u8>) -> Result<(), String> {
        let mut input: Vec<i16> = samples.iter().map(|s| crate::audio::pcm16(*s)).collect();
        self.fed += input.len() as u64;
        let mut buffer = vec![0u8; OUT_CHUNK];
        // Each call takes what fills the encoder's frame buffer and gives at
        // most one frame; bounded by the input's length in frames.
        let mut calls = input.len() / 256 + 4;
        while !input.is_empty() && calls > 0 {
            calls -= 1;
            let info = self.encoder.encode(&input, &mut buffer).map_err(aac_error)?;
            out.extend_from_slice(&buffer[..info.output_size]);
            input.drain(..info.input_consumed.min(input.len()));
        }
        if !input.is_empty() {
            return Err("AAC encoding: the encoder stopped taking samples".into());
        }
        Ok(())
    }
}

impl Codec for Adts {
    fn push(&mut self, samples: &[f32], _first: bool, out: &mut Vec<u8>) -> Result<(), String> {
        match &mut self.resampler {
            Some(r) => {
                let resampled = r.push(samples)?;
                self.feed(&resampled, out)
            }
            None => self.feed(samples, out),
        }
    }

    /// The resampler's tail, then silence until every real sample has come
    /// out of the encoder's delay and the frame holding it is complete (the
    /// crate has no flush call).
    fn finish(mut self: Box<Self>, _samples: u64, out: &mut Vec<u8>) -> Result<Option<Vec<u8>>, String> {
        if let Some(mut r) = self.resampler.take() {
            let tail = r.finish()?;
            self.feed(&tail, out)?;
        }
        let audio = self.fed;
        let needed = (audio + self.delay).div_ceil(self.frame).max(1) * self.frame;
        let silence = vec![0.0; needed.saturating_sub(audio) as usize];
        self.feed(&silence, out)?;
        Ok(None)
    }
}
