//! Opus through libopus (the `opus` crate) in an Ogg stream (the `ogg`
//! crate), laid out as RFC 7845 says: an identification header page, a
//! comment header page, then 20 ms audio packets, the packets of each pushed
//! piece on one page so a player gets them at once. Opus codes 48 kHz: other
//! rates go through engine-core's resampler first; the header keeps the
//! model's rate as the input rate, for decoders that want it back.

use super::Codec;
use crate::audio::resample::StreamResampler;
use ogg::writing::{PacketWriteEndInfo, PacketWriter};

/// The rate Opus codes (and Ogg Opus granule positions count) in.
pub(super) const OPUS_RATE: u32 = 48_000;
/// 20 ms: Opus's usual frame.
const FRAME: usize = 960;
/// Mono speech is transparent well below this.
const BITRATE: i32 = 64_000;
/// A packet of one 20 ms frame stays far below this (libopus's own bound is 1275 bytes a frame).
const MAX_PACKET: usize = 4000;
/// The Ogg stream's serial number; one logical stream per file, so any value.
const SERIAL: u32 = 0x7474_7331;

pub(super) struct OggOpus {
    encoder: opus::Encoder,
    /// None at 48 kHz.
    resampler: Option<StreamResampler>,
    /// 48 kHz samples not yet making a whole frame.
    pending: Vec<f32>,
    pages: PacketWriter<'static, Vec<u8>>,
    /// The encoder's lookahead: decoders drop this many samples at the start.
    pre_skip: u64,
    /// 48 kHz samples given to the encoder (whole frames, padding included).
    encoded: u64,
    /// 48 kHz samples of real audio.
    audio: u64,
    headers_written: bool,
    input_rate: u32,
}

fn opus_error(e: opus::Error) -> String {
    format!("Opus encoding: {e}")
}

impl OggOpus {
    pub(super) fn new(rate: u32) -> Result<OggOpus, String> {
        let mut encoder = opus::Encoder::new(OPUS_RATE, opus::Channels::Mono, opus::Application::Audio).map_err(opus_error)?;
        encoder.set_bitrate(opus::Bitrate::Bits(BITRATE)).map_err(opus_error)?;
        let pre_skip = encoder.get_lookahead().map_err(opus_error)?.max(0) as u64;
        let resampler = if rate == OPUS_RATE { None } else { Some(StreamResampler::new(rate, OPUS_RATE)?) };
        Ok(OggOpus {
            encoder,
            resampler,
            pending: Vec::new(),
            pages: PacketWriter::new(Vec::new()),
            pre_skip,
            encoded: 0,
            audio: 0,
            headers_written: false,
            input_rate: rate,
        })
    }

    /// The identification header (RFC 7845 5.1) and the comment header
    /// (5.2), each on its own page as the format requires.
    fn write_headers(&mut self) -> Result<(), String> {
        let mut head = Vec::with_capacity(19);
        head.extend_from_slice(b"OpusHead");
        head.push(1); // version
        head.push(1); // channels
        head.extend_from_slice(&(self.pre_skip as u16).to_le_bytes());
        head.extend_from_slice(&self.input_rate.to_le_bytes());
        head.extend_from_slice(&0i16.to_le_bytes()); // output gain
        head.push(0); // channel mapping family 0: mono or stereo
        let vendor = concat!("tts ", env!("CARGO_PKG_VERSION"), " (libopus)").as_bytes();
        let mut tags = Vec::with_capacity(16 + vendor.len());
        tags.extend_from_slice(b"OpusTags");
        tags.extend_from_slice(&(vendor.len() as u32).to_le_bytes());
        tags.extend_from_slice(vendor);
        tags.extend_from_slice(&0u32.to_le_bytes()); // no user comments
        self.page(head, PacketWriteEndInfo::EndPage, 0)?;
        self.page(tags, PacketWriteEndInfo::EndPage, 0)?;
        self.headers_written = true;
        Ok(())
    }

    fn page(&mut self, packet: Vec<u8>, end: PacketWriteEndInfo, granule: u64) -> Result<(), String> {
        self.pages.write_packet(packet, SERIAL, end, granule).map_err(|e| format!("writing Ogg pages: {e}"))
    }

    /// Encodes the whole frames in `pending`; the last packet ends a page
    /// (`last`: the stream, with `end_granule`).
    fn encode_frames(&mut self, last: Option<u64>, out: &mut Vec<u8>) -> Result<(), String> {
        let frames = self.pending.len() / FRAME;
        for i in 0..frames {
            let packet = self.encoder.encode_vec_float(&self.pending[i * FRAME..(i + 1) * FRAME], MAX_PACKET).map_err(opus_error)?;
            self.encoded += FRAME as u64;
            let (end, granule) = match (i + 1 == frames, last) {
                (true, Some(end_granule)) => (PacketWriteEndInfo::EndStream, end_granule),
                (true, None) => (PacketWriteEndInfo::EndPage, self.encoded),
                (false, _) => (PacketWriteEndInfo::NormalPacket, self.encoded),
            };
            self.page(packet, end, granule)?;
        }
        self.pending.drain(..frames * FRAME);
        out.append(self.pages.inner_mut());
        Ok(())
    }
}

impl Codec for OggOpus {
    fn push(&mut self, samples: &[f32], _first: bool, out: &mut Vec<u8>) -> Result<(), String> {
        if !self.headers_written {
            self.write_headers()?;
        }
        let resampled = match &mut self.resampler {
            Some(r) => r.push(samples)?,
            None => samples.to_vec(),
        };
        self.audio += resampled.len() as u64;
        self.pending.extend_from_slice(&resampled);
        self.encode_frames(None, out)
    }

    /// The resampler's tail, then silence until the encoder has given out
    /// every real sample past its lookahead; the last page's granule position
    /// tells decoders where the audio ends (RFC 7845 4.4).
    fn finish(mut self: Box<Self>, _samples: u64, out: &mut Vec<u8>) -> Result<Option<Vec<u8>>, String> {
        if !self.headers_written {
            self.write_headers()?;
        }
        if let Some(r) = &mut self.resampler {
            let tail = r.finish()?;
            self.audio += tail.len() as u64;
            self.pending.extend_from_slice(&tail);
        }
        let needed = self.audio + self.pre_skip;
        let have = self.encoded + self.pending.len() as u64;
        let missing = needed.saturating_sub(have) as usize;
        let whole = (self.pending.len() + missing).div_ceil(FRAME).max(1) * FRAME;
        self.pending.resize(whole, 0.0);
        let end_granule = self.audio + self.pre_skip;
        self.encode_frames(Some(end_granule), out)?;
        Ok(None)
    }
}
