//! Audio input: a recording on disk becomes mono `f32` samples at the file's
//! own rate, for voice cloning and anything else that listens.
//!
//! WAV goes through `hound` (PCM 8/16/24/32-bit and 32-bit float, plain or
//! WAVE_FORMAT_EXTENSIBLE); FLAC, MP3 and Ogg Vorbis through `symphonia`.
//! Samples are scaled as libsndfile scales them (what `librosa.load` sees):
//! a signed integer of `b` bits divided by 2^(b-1), 8-bit unsigned centred
//! first. Channels are mixed down by their mean (`librosa.to_mono`).
//!
//! Reading is bounded: at most `max_seconds` of audio are decoded, whatever
//! length the file claims, so a two-hour file costs no more memory than the
//! limit. A file is untrusted input: every failure is one line naming the file
//! and what is wrong, and a decoder panic is caught and reported the same way.

use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

/// Sample rates accepted on input. Below 8 kHz a recording lacks the band the
/// speech encoders listen to; above 384 kHz no audio interface records.
pub const INPUT_RATE_RANGE: std::ops::RangeInclusive<u32> = 8000..=384_000;

/// Mono samples decoded from a file.
#[derive(Clone, Debug, PartialEq)]
pub struct Clip {
    pub samples: Vec<f32>,
    pub sample_rate: u32,
    /// The channel count of the file (mixed down in `samples`).
    pub channels: u16,
    /// Whether the file holds more audio than was read (`max_seconds`).
    pub truncated: bool,
}

impl Clip {
    pub fn seconds(&self) -> f64 {
        self.samples.len() as f64 / self.sample_rate as f64
    }
}

/// Reads at most `max_seconds` of `path` as mono samples.
pub fn read_mono(path: &Path, max_seconds: f64) -> Result<Clip, String> {
    let shown = path.display();
    if !(max_seconds.is_finite() && max_seconds > 0.0) {
        return Err(format!("{shown}: the reading limit must be a positive number of seconds, not {max_seconds}"));
    }
    // By kind and size on the opened descriptor: a FIFO would block, a device never end.
    let file = crate::model_kit::files::open_regular(path, "audio file", crate::model_kit::files::caps::AUDIO)?;
    let extension = path.extension().and_then(|e| e.to_str());
    decode(file, extension, max_seconds).map_err(|e| format!("{shown}: {e}"))
}

/// [`read_mono`] on a file image in memory (fuzzing; no extension hint).
pub fn decode_mono(bytes: &[u8], max_seconds: f64) -> Result<Clip, String> {
    if !(max_seconds.is_finite() && max_seconds > 0.0) {
        return Err(format!("the reading limit must be a positive number of seconds, not {max_seconds}"));
    }
    decode(std::io::Cursor::new(bytes.to_vec()), None, max_seconds)
}

fn decode<R: symphonia::core::io::MediaSource + 'static>(mut source: R, extension: Option<&str>, max_seconds: f64) -> Result<Clip, String> {
    let mut magic = [0u8; 12];
    let n = read_up_to(&mut source, &mut magic).map_err(|e| format!("cannot read: {e}"))?;
    if n == 0 {
        return Err("the file is empty".to_string());
    }
    source.seek(SeekFrom::Start(0)).map_err(|e| format!("cannot read: {e}"))?;
    let is_wav = n >= 12 && (&magic[..4] == b"RIFF" || &magic[..4] == b"RF64") && &magic[8..12] == b"WAVE";
    let clip = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if is_wav {
            read_wav(source, max_seconds)
        } else {
            read_compressed(Box::new(source), extension, max_seconds)
        }
    }))
    .unwrap_or_else(|_| Err("the decoder failed on malformed data".to_string()))?;
    if clip.samples.is_empty() {
        return Err("contains no audio samples".to_string());
    }
    if let Some(i) = clip.samples.iter().position(|s| !s.is_finite()) {
        return Err(format!("sample {i} is not a finite number (NaN or infinity)"));
    }
    Ok(clip)
}

fn read_up_to(file: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..])? {
            0 => break,
            k => filled += k,
        }
    }
    Ok(filled)
}

fn check_format(sample_rate: u32, channels: u16) -> Result<(), String> {
    if !INPUT_RATE_RANGE.contains(&sample_rate) {
        return Err(format!("sample rate {sample_rate} Hz is not supported (supported: {}..={} Hz)", INPUT_RATE_RANGE.start(), INPUT_RATE_RANGE.end()));
    }
    if channels == 0 {
        return Err("declares zero channels".to_string());
    }
    Ok(())
}

/// Frames `max_seconds` allows at `rate` (at least one).
fn frame_budget(max_seconds: f64, rate: u32) -> usize {
    ((max_seconds * rate as f64).ceil() as usize).max(1)
}

/// Averages interleaved frames into one channel.
struct Mixdown {
    channels: usize,
    acc: f32,
    in_frame: usize,
    out: Vec<f32>,
}

impl Mixdown {
    fn new(channels: usize, capacity: usize) -> Self {
        Mixdown { channels, acc: 0.0, in_frame: 0, out: Vec::with_capacity(capacity) }
    }
    fn push(&mut self, sample: f32) {
        self.acc += sample;
        self.in_frame += 1;
        if self.in_frame == self.channels {
            self.out.push(self.acc / self.channels as f32);
            self.acc = 0.0;
            self.in_frame = 0;
        }
    }
    fn frames(&self) -> usize {
        self.out.len()
    }
}

fn read_wav(file: impl Read + Seek, max_seconds: f64) -> Result<Clip, String> {
    let mut reader = hound::WavReader::new(BufReader::new(file)).map_err(|e| format!("not a valid WAV file: {e}"))?;
    let spec = reader.spec();
    check_format(spec.sample_rate, spec.channels)?;
    let budget = frame_budget(max_seconds, spec.sample_rate);
    let declared = reader.duration() as usize;
    let channels = spec.channels as usize;
    let mut mix = Mixdown::new(channels, budget.min(declared));
    let wanted = budget.min(declared) * channels;
    match spec.sample_format {
        hound::SampleFormat::Float => {
            if spec.bits_per_sample != 32 {
                return Err(format!("{}-bit float samples are not supported (32-bit float is)", spec.bits_per_sample));
            }
            for s in reader.samples::<f32>().take(wanted) {
                match s {
                    Ok(v) => mix.push(v),
                    Err(e) => return cut_short(e, mix, spec),
                }
            }
        }
        hound::SampleFormat::Int => {
            if !(1..=32).contains(&spec.bits_per_sample) {
                return Err(format!("{}-bit integer samples are not supported", spec.bits_per_sample));
            }
            let scale = 1.0 / (1u64 << (spec.bits_per_sample - 1)) as f64;
            for s in reader.samples::<i32>().take(wanted) {
                match s {
                    Ok(v) => mix.push((v as f64 * scale) as f32),
                    Err(e) => return cut_short(e, mix, spec),
                }
            }
        }
    }
    let truncated = declared > mix.frames();
    Ok(Clip { samples: mix.out, sample_rate: spec.sample_rate, channels: spec.channels, truncated })
}

/// A data chunk shorter than its header says (a recorder that stopped
/// mid-write): like libsndfile, keep the whole frames that are there.
fn cut_short(e: hound::Error, mix: Mixdown, spec: hound::WavSpec) -> Result<Clip, String> {
    // hound reports the short read as ErrorKind::Other with this message.
    match e {
        hound::Error::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof || io.to_string() == "Failed to read enough bytes." => {
            Ok(Clip { samples: mix.out, sample_rate: spec.sample_rate, channels: spec.channels, truncated: false })
        }
        other => Err(format!("reading samples: {other}")),
    }
}

fn read_compressed(source: Box<dyn symphonia::core::io::MediaSource>, extension: Option<&str>, max_seconds: f64) -> Result<Clip, String> {
    use symphonia::core::codecs::audio::AudioDecoderOptions;
    use symphonia::core::errors::Error;
    use symphonia::core::formats::probe::Hint;
    use symphonia::core::formats::{FormatOptions, TrackType};
    use symphonia::core::io::MediaSourceStream;
    use symphonia::core::meta::MetadataOptions;

    const KNOWN: &str = "not a recognised audio file (WAV, FLAC, MP3 or Ogg Vorbis)";
    let mut hint = Hint::new();
    if let Some(ext) = extension {
        hint.with_extension(ext);
    }
    let stream = MediaSourceStream::new(source, Default::default());
    let mut format =
        symphonia::default::get_probe().probe(&hint, stream, FormatOptions::default(), MetadataOptions::default()).map_err(|_| KNOWN.to_string())?;
    let track = format.default_track(TrackType::Audio).ok_or_else(|| "has no audio track".to_string())?;
    let track_id = track.id;
    let params = track.codec_params.as_ref().and_then(|p| p.audio()).ok_or_else(|| "has no audio track".to_string())?.clone();
    let mut decoder =
        symphonia::default::get_codecs().make_audio_decoder(&params, &AudioDecoderOptions::default()).map_err(|e| format!("unsupported audio codec: {e}"))?;

    // The rate and channel count of the first decoded packet hold for the stream.
    let mut mix: Option<(u32, Mixdown)> = None;
    let mut interleaved: Vec<f32> = Vec::new();
    let mut truncated = false;
    loop {
        let packet = match format.next_packet() {
            Ok(Some(p)) => p,
            Ok(None) => break,
            Err(Error::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(format!("reading the audio stream: {e}")),
        };
        if packet.track_id != track_id {
            continue;
        }
        let buf = match decoder.decode(&packet) {
            Ok(b) => b,
            // A damaged packet: the decoders resynchronise on the next one.
            Err(Error::DecodeError(_)) => continue,
            Err(e) => return Err(format!("decoding: {e}")),
        };
        let (packet_rate, channels) = (buf.spec().rate(), buf.spec().channels().count());
        if mix.is_none() {
            check_format(packet_rate, u16::try_from(channels).unwrap_or(0))?;
        }
        let (rate, mix) = mix.get_or_insert_with(|| (packet_rate, Mixdown::new(channels, frame_budget(max_seconds, packet_rate).min(1 << 20))));
        if *rate != packet_rate || mix.channels != channels {
            return Err(format!("the format changes within the stream ({} Hz, {} channels to {packet_rate} Hz, {channels})", rate, mix.channels));
        }
        let frames_budget = frame_budget(max_seconds, *rate);
        interleaved.resize(buf.samples_interleaved(), 0.0);
        buf.copy_to_slice_interleaved(&mut interleaved);
        let room = (frames_budget - mix.frames()) * channels;
        for &s in interleaved.iter().take(room) {
            mix.push(s);
        }
        if mix.frames() >= frames_budget {
            truncated = interleaved.len() > room || format.next_packet().map(|p| p.is_some()).unwrap_or(false);
            break;
        }
    }
    Ok(match mix {
        Some((rate, mix)) => Clip { samples: mix.out, sample_rate: rate, channels: mix.channels as u16, truncated },
        None => Clip { samples: Vec::new(), sample_rate: 0, channels: 0, truncated: false },
    })
}
