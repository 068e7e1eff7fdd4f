//! One streaming encoder for every output format, shared by the CLI (`tts
//! --out`) and the server (`response_format`): mono f32 pieces at the model's
//! rate go in as the model produces them, bytes ready to write or send come
//! out, and [`StreamEncoder::finish`] gives the last bytes plus, for formats
//! whose header holds totals, the header an output that can seek back should
//! hold instead of the streamed one.
//!
//! Each codec is a well-kept library (docs/licenses.md): WAV and raw PCM are
//! written here, FLAC through `flacenc` ([`super::FlacStream`]), MP3 through
//! LAME, Opus through libopus in Ogg pages (the `ogg` crate), AAC through the
//! Fraunhofer FDK AAC library in ADTS frames.

mod aac;
mod mp3;
mod opus;

use super::{encode_flac, wav_header, FlacStream, RawFormat};
use std::path::Path;

/// The formats audio is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AudioFormat {
    /// 16-bit PCM in a RIFF WAVE file.
    Wav,
    /// Raw 16-bit signed little-endian samples, no header.
    Pcm,
    /// Raw 32-bit float little-endian samples, no header.
    F32,
    /// 16-bit FLAC.
    Flac,
    /// MPEG-1/2 Layer III.
    Mp3,
    /// Opus in an Ogg stream (RFC 7845), 48 kHz.
    Opus,
    /// AAC-LC in ADTS frames.
    Aac,
}

impl AudioFormat {
    /// Every format, in the order lists show them.
    pub const ALL: [AudioFormat; 7] =
        [AudioFormat::Wav, AudioFormat::Pcm, AudioFormat::F32, AudioFormat::Flac, AudioFormat::Mp3, AudioFormat::Opus, AudioFormat::Aac];

    pub fn name(self) -> &'static str {
        match self {
            AudioFormat::Wav => "wav",
            AudioFormat::Pcm => "pcm",
            AudioFormat::F32 => "f32",
            AudioFormat::Flac => "flac",
            AudioFormat::Mp3 => "mp3",
            AudioFormat::Opus => "opus",
            AudioFormat::Aac => "aac",
        }
    }

    /// The file extensions that mean this format, the usual one first.
    pub fn extensions(self) -> &'static [&'static str] {
        match self {
            AudioFormat::Wav => &["wav"],
            AudioFormat::Pcm => &["pcm", "raw"],
            AudioFormat::F32 => &["f32"],
            AudioFormat::Flac => &["flac"],
            AudioFormat::Mp3 => &["mp3"],
            AudioFormat::Opus => &["opus", "ogg"],
            AudioFormat::Aac => &["aac"],
        }
    }

    pub fn extension(self) -> &'static str {
        self.extensions()[0]
    }

    /// The HTTP media type.
    pub fn content_type(self) -> &'static str {
        match self {
            AudioFormat::Wav => "audio/wav",
            AudioFormat::Pcm => "audio/pcm",
            AudioFormat::F32 => "application/octet-stream",
            AudioFormat::Flac => "audio/flac",
            AudioFormat::Mp3 => "audio/mpeg",
            AudioFormat::Opus => "audio/ogg",
            AudioFormat::Aac => "audio/aac",
        }
    }

    /// The sampling rate of the encoded audio for a model at `rate`: Opus
    /// codes 48 kHz, AAC a rate of its list (48 kHz for any other), the rest
    /// keep the model's rate.
    pub fn output_rate(self, rate: u32) -> u32 {
        match self {
            AudioFormat::Opus => opus::OPUS_RATE,
            AudioFormat::Aac => aac::coded_rate(rate),
            _ => rate,
        }
    }

    /// The format named `name` (as [`AudioFormat::name`] gives it).
    pub fn parse(name: &str) -> Option<AudioFormat> {
        AudioFormat::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The format `path`'s extension names (case-insensitive); `Ok(None)` for
    /// a path without one, an error listing the formats for any other.
    pub fn from_extension(path: &Path) -> Result<Option<AudioFormat>, String> {
        let Some(ext) = path.extension() else {
            return Ok(None);
        };
        let ext = ext.to_string_lossy().to_ascii_lowercase();
        AudioFormat::ALL
            .into_iter()
            .find(|f| f.extensions().contains(&ext.as_str()))
            .map(Some)
            .ok_or_else(|| format!("{}: unknown audio extension `.{ext}`; formats: {}", path.display(), AudioFormat::list_with_extensions()))
    }

    /// `wav (.wav), pcm (.pcm .raw), ...` for messages.
    pub fn list_with_extensions() -> String {
        let each = AudioFormat::ALL.iter().map(|f| format!("{} (.{})", f.name(), f.extensions().join(" .")));
        each.collect::<Vec<_>>().join(", ")
    }
}

/// Where the encoded bytes go, which decides what a format may leave to be
/// filled in at the end: the caller knows, and says so once, when it makes
/// the [`StreamEncoder`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// Sent as they come and never gone back to (an HTTP response, a pipe):
    /// MP3 without its Info frame.
    Stream,
    /// An output that can seek back and write the header
    /// [`StreamEncoder::finish`] returns over the start (a regular file,
    /// [`encode_all`]'s buffer): MP3 with the Info frame and LAME tag that
    /// make decoders trim the encoder's delay and padding.
    Seekable,
}

/// What a codec does with the pieces; [`StreamEncoder`] keeps the counts.
trait Codec: Send {
    /// Appends the bytes `samples` complete to `out` (`first`: the first piece).
    fn push(&mut self, samples: &[f32], first: bool, out: &mut Vec<u8>) -> Result<(), String>;
    /// Appends the stream's last bytes to `out` (a whole empty stream when no
    /// sample came); returns the header a seekable output should hold.
    fn finish(self: Box<Self>, samples: u64, out: &mut Vec<u8>) -> Result<Option<Vec<u8>>, String>;
}

/// One stream of audio being encoded; see the module documentation.
pub struct StreamEncoder {
    format: AudioFormat,
    rate: u32,
    codec: Box<dyn Codec>,
    samples: u64,
    non_finite: usize,
}

impl StreamEncoder {
    /// An encoder of `format` for mono audio at `rate` Hz (refused outside
    /// [`super::SAMPLE_RATE_RANGE`]) whose bytes are streamed
    /// ([`Destination::Stream`]).
    pub fn new(format: AudioFormat, rate: u32) -> Result<StreamEncoder, String> {
        StreamEncoder::to(format, rate, Destination::Stream)
    }

    /// An encoder as [`StreamEncoder::new`] makes it, for bytes that go to
    /// `destination`.
    pub fn to(format: AudioFormat, rate: u32, destination: Destination) -> Result<StreamEncoder, String> {
        super::check_samples(&[], rate)?;
        let codec: Box<dyn Codec> = match format {
            AudioFormat::Wav => Box::new(Wav { rate }),
            AudioFormat::Pcm => Box::new(Raw(RawFormat::Pcm16)),
            AudioFormat::F32 => Box::new(Raw(RawFormat::F32)),
            AudioFormat::Flac => Box::new(Flac { stream: FlacStream::new(rate)?, rate }),
            AudioFormat::Mp3 => Box::new(mp3::Mp3::new(rate, destination)?),
            AudioFormat::Opus => Box::new(opus::OggOpus::new(rate)?),
            AudioFormat::Aac => Box::new(aac::Adts::new(rate)?),
        };
        Ok(StreamEncoder { format, rate, codec, samples: 0, non_finite: 0 })
    }

    pub fn format(&self) -> AudioFormat {
        self.format
    }

    pub fn sample_rate(&self) -> u32 {
        self.rate
    }

    /// Samples pushed so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Encodes `samples`, appending the bytes ready now to `out` (possibly
    /// none while a codec's frame fills).
    pub fn push(&mut self, samples: &[f32], out: &mut Vec<u8>) -> Result<(), String> {
        if samples.is_empty() {
            return Ok(());
        }
        if self.format == AudioFormat::Flac {
            self.non_finite += crate::model_kit::finite::count_non_finite_f32(samples);
        }
        let first = self.samples == 0;
        self.samples += samples.len() as u64;
        self.codec.push(samples, first, out)
    }

    /// Appends the stream's last bytes to `out` (a whole, empty stream when
    /// nothing was pushed) and returns the header with the real totals, as
    /// long as the one streamed at the start, for an output that can seek back
    /// to it: WAV's sizes (None when they do not fit 32 bits), FLAC's totals
    /// and checksum, and for [`Destination::Seekable`] MP3's Info frame.
    /// None for every other format, which state no totals.
    /// FLAC refuses non-finite samples here, as [`super::encode_flac`] does.
    pub fn finish(self, out: &mut Vec<u8>) -> Result<Option<Vec<u8>>, String> {
        if self.format == AudioFormat::Flac {
            super::check_sample_counts(self.rate, || self.non_finite, self.samples as usize)?;
        }
        self.codec.finish(self.samples, out)
    }
}

/// `samples` encoded whole as `format`: the streamed bytes with the final
/// header in place of the streamed one (exact WAV sizes, FLAC totals, MP3's
/// Info frame).
pub fn encode_all(format: AudioFormat, samples: &[f32], rate: u32) -> Result<Vec<u8>, String> {
    let mut encoder = StreamEncoder::to(format, rate, Destination::Seekable)?;
    let mut out = Vec::new();
    encoder.push(samples, &mut out)?;
    if let Some(header) = encoder.finish(&mut out)? {
        out[..header.len()].copy_from_slice(&header);
    }
    Ok(out)
}

struct Raw(RawFormat);

impl Codec for Raw {
    fn push(&mut self, samples: &[f32], _first: bool, out: &mut Vec<u8>) -> Result<(), String> {
        self.0.encode(samples, out);
        Ok(())
    }

    fn finish(self: Box<Self>, _samples: u64, _out: &mut Vec<u8>) -> Result<Option<Vec<u8>>, String> {
        Ok(None)
    }
}

/// A WAV stream: the header with the sizes unknown (0xFFFFFFFF, what readers
/// of piped WAV take as "until the end"), then the samples; the exact header
/// at the end.
struct Wav {
    rate: u32,
}

impl Codec for Wav {
    fn push(&mut self, samples: &[f32], first: bool, out: &mut Vec<u8>) -> Result<(), String> {
        if first {
            out.extend_from_slice(&wav_header(self.rate, None));
        }
        RawFormat::Pcm16.encode(samples, out);
        Ok(())
    }

    fn finish(self: Box<Self>, samples: u64, out: &mut Vec<u8>) -> Result<Option<Vec<u8>>, String> {
        if samples == 0 {
            out.extend_from_slice(&wav_header(self.rate, Some(0)));
            return Ok(None);
        }
        Ok(u32::try_from(samples * 2).ok().map(|size| wav_header(self.rate, Some(size)).to_vec()))
    }
}

/// FLAC frame by frame: the header with unknown totals first, the real one
/// at the end (the same length).
struct Flac {
    stream: FlacStream,
    rate: u32,
}

impl Codec for Flac {
    fn push(&mut self, samples: &[f32], first: bool, out: &mut Vec<u8>) -> Result<(), String> {
        if first {
            out.extend_from_slice(&self.stream.header()?);
        }
        self.stream.push(samples, out)
    }

    fn finish(self: Box<Self>, samples: u64, out: &mut Vec<u8>) -> Result<Option<Vec<u8>>, String> {
        if samples == 0 {
            out.extend(encode_flac(&[], self.rate)?);
            return Ok(None);
        }
        self.stream.finish(out).map(Some)
    }
}

#[cfg(test)]
mod tests;
