//! Audio output: checks what a model produced and encodes it as WAV; the file
//! itself is written by [`crate::output`]. Every output format, streamed, is
//! [`encode`]. Reading recordings is [`input`],
//! converting rates [`resample`], measuring loudness [`loudness`],
//! changing the speed at the same pitch [`stretch`].

pub mod encode;
pub mod input;
pub mod loudness;
pub mod resample;
pub mod stretch;

/// Sample rates the engine writes (a model reporting another is refused).
pub const SAMPLE_RATE_RANGE: std::ops::RangeInclusive<u32> = 1000..=384_000;

/// Refuses audio a WAV file cannot honestly hold: an out-of-range sample rate,
/// or NaN / infinite samples (a corrupt model must not become silence).
pub fn check_samples(samples: &[f32], sample_rate: u32) -> Result<(), String> {
    check_sample_counts(sample_rate, || crate::model_kit::finite::count_non_finite_f32(samples), samples.len())
}

/// [`check_samples`] for audio counted as it went by: `non_finite` of `total`
/// samples were NaN or infinite (asked only once the rate is in range).
pub fn check_sample_counts(sample_rate: u32, non_finite: impl FnOnce() -> usize, total: usize) -> Result<(), String> {
    if !SAMPLE_RATE_RANGE.contains(&sample_rate) {
        return Err(format!(
            "the model reports a sample rate of {sample_rate} Hz (supported: {}..={} Hz); the model file may be corrupt",
            SAMPLE_RATE_RANGE.start(),
            SAMPLE_RATE_RANGE.end()
        ));
    }
    let bad = non_finite();
    if bad > 0 {
        return Err(format!("the model produced {bad} non-finite samples (NaN or infinity) of {total}; the model file may be corrupt"));
    }
    Ok(())
}

/// One sample as 16-bit PCM: clamped to [-1, 1], scaled by 32767, rounded.
pub fn pcm16(sample: f32) -> i16 {
    (sample.clamp(-1.0, 1.0) * i16::MAX as f32).round() as i16
}

/// Raw sample encodings for streams and files without a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawFormat {
    /// 16-bit signed little-endian, as in a WAV's data chunk.
    Pcm16,
    /// 32-bit IEEE float little-endian, unclamped.
    F32,
}

impl RawFormat {
    pub fn encode(self, samples: &[f32], out: &mut Vec<u8>) {
        match self {
            RawFormat::Pcm16 => out.extend(samples.iter().flat_map(|s| pcm16(*s).to_le_bytes())),
            RawFormat::F32 => out.extend(samples.iter().flat_map(|s| s.to_le_bytes())),
        }
    }
}

/// The 44-byte header of a mono 16-bit PCM WAV whose data chunk holds
/// `data_bytes`; `None` for a stream whose length is not known yet: both
/// sizes are then 0xFFFFFFFF, which readers of piped WAV take as "until the
/// end of the stream".
pub fn wav_header(sample_rate: u32, data_bytes: Option<u32>) -> [u8; 44] {
    let data = data_bytes.unwrap_or(u32::MAX);
    let riff = data_bytes.map_or(u32::MAX, |d| d.saturating_add(36));
    let mut h = [0u8; 44];
    let fields: [&[u8]; 13] = [
        b"RIFF",
        &riff.to_le_bytes(),
        b"WAVEfmt ",
        &16u32.to_le_bytes(),
        &1u16.to_le_bytes(), // PCM
        &1u16.to_le_bytes(), // mono
        &sample_rate.to_le_bytes(),
        &(sample_rate * 2).to_le_bytes(), // bytes per second
        &2u16.to_le_bytes(),              // block align
        &16u16.to_le_bytes(),             // bits per sample
        b"data",
        &data.to_le_bytes(),
        &[],
    ];
    let mut at = 0;
    for f in fields {
        h[at..at + f.len()].copy_from_slice(f);
        at += f.len();
    }
    h
}

/// Mono 16-bit PCM WAV bytes (samples clamped to [-1, 1]).
pub fn encode_wav(samples: &[f32], sample_rate: u32) -> Result<Vec<u8>, String> {
    check_samples(samples, sample_rate)?;
    let spec = hound::WavSpec { channels: 1, sample_rate, bits_per_sample: 16, sample_format: hound::SampleFormat::Int };
    let mut bytes = std::io::Cursor::new(Vec::with_capacity(44 + 2 * samples.len()));
    let mut w = hound::WavWriter::new(&mut bytes, spec).map_err(|e| format!("encoding WAV: {e}"))?;
    for s in samples {
        w.write_sample(pcm16(*s)).map_err(|e| format!("encoding WAV: {e}"))?;
    }
    w.finalize().map_err(|e| format!("encoding WAV: {e}"))?;
    Ok(bytes.into_inner())
}

/// Encodes `samples` and writes them to `path` safely ([`crate::output::write_file`]).
/// Mono 16-bit FLAC bytes (lossless over the same samples a WAV holds), through `flacenc`.
pub fn encode_flac(samples: &[f32], sample_rate: u32) -> Result<Vec<u8>, String> {
    check_samples(samples, sample_rate)?;
    let mut stream = FlacStream::new(sample_rate)?;
    let mut body = Vec::new();
    stream.push(samples, &mut body)?;
    let mut bytes = stream.finish_with(&mut body, false)?;
    bytes.append(&mut body);
    Ok(bytes)
}

/// Mono 16-bit FLAC encoded as the samples arrive, frame by frame: the same
/// bytes as [`encode_flac`] without holding the signal. [`FlacStream::header`]
/// starts the stream with the totals unknown (what a stream can say before its
/// end); [`FlacStream::finish`] gives the header with the real totals, the same
/// length, for an output that can seek back to its start.
pub struct FlacStream {
    config: flacenc::error::Verified<flacenc::config::Encoder>,
    info: flacenc::component::StreamInfo,
    block: usize,
    pending: Vec<i32>,
    framebuf: (flacenc::source::FrameBuf, flacenc::source::Context),
}

fn flac_error(e: impl std::fmt::Display) -> String {
    format!("encoding FLAC: {e}")
}

impl FlacStream {
    pub fn new(sample_rate: u32) -> Result<Self, String> {
        use flacenc::error::Verify;
        check_samples(&[], sample_rate)?;
        let config = flacenc::config::Encoder::default().into_verified().map_err(|(_, e)| flac_error(e))?;
        let block = config.block_size;
        let mut info = flacenc::component::StreamInfo::new(sample_rate as usize, 1, 16).map_err(flac_error)?;
        info.set_block_sizes(block, block).map_err(flac_error)?;
        let framebuf = (flacenc::source::FrameBuf::with_size(1, block).map_err(flac_error)?, flacenc::source::Context::new(16, 1));
        Ok(FlacStream { config, info, block, pending: Vec::with_capacity(block), framebuf })
    }

    /// `fLaC` and the stream information block, as `info` says.
    fn header_of(info: flacenc::component::StreamInfo) -> Result<Vec<u8>, String> {
        use flacenc::component::BitRepr;
        let mut sink = flacenc::bitsink::ByteSink::new();
        flacenc::component::Stream::with_stream_info(info).write(&mut sink).map_err(flac_error)?;
        Ok(sink.as_slice().to_vec())
    }

    /// The stream's start with frame sizes, sample count and checksum unknown (0).
    pub fn header(&self) -> Result<Vec<u8>, String> {
        let mut info = self.info.clone();
        info.set_frame_sizes(0, 0).map_err(flac_error)?;
        Self::header_of(info)
    }

    /// Adds `samples`; the frames they complete are appended to `out`.
    pub fn push(&mut self, samples: &[f32], out: &mut Vec<u8>) -> Result<(), String> {
        for s in samples {
            self.pending.push(pcm16(*s) as i32);
            if self.pending.len() == self.block {
                self.encode_pending(out)?;
            }
        }
        Ok(())
    }

    fn encode_pending(&mut self, out: &mut Vec<u8>) -> Result<(), String> {
        use flacenc::component::BitRepr;
        use flacenc::source::Fill;
        self.framebuf.fill_interleaved(&self.pending).map_err(flac_error)?;
        self.pending.clear();
        let number = self.framebuf.1.current_frame_number().unwrap_or(0);
        let frame = flacenc::encode_fixed_size_frame(&self.config, &self.framebuf.0, number, &self.info).map_err(flac_error)?;
        self.info.update_frame_info(&frame);
        let mut sink = flacenc::bitsink::ByteSink::new();
        frame.write(&mut sink).map_err(flac_error)?;
        out.extend_from_slice(sink.as_slice());
        Ok(())
    }

    /// Appends the last, shorter frame to `out`; returns the header with the
    /// real totals (as long as [`FlacStream::header`]).
    pub fn finish(self, out: &mut Vec<u8>) -> Result<Vec<u8>, String> {
        self.finish_with(out, true)
    }

    /// [`FlacStream::finish`]; `zero_empty_frame_sizes` false leaves a stream
    /// without frames with the frame sizes flacenc starts from (minimum
    /// 0xFFFFFF, maximum 0), as [`encode_flac`] has always written it.
    fn finish_with(mut self, out: &mut Vec<u8>, zero_empty_frame_sizes: bool) -> Result<Vec<u8>, String> {
        if !self.pending.is_empty() {
            self.encode_pending(out)?;
        }
        let (_, context) = &self.framebuf;
        self.info.set_md5_digest(&context.md5_digest());
        self.info.set_total_samples(context.total_samples());
        // A fixed-blocksize stream states its block size as both bounds: the
        // format leaves the shorter last block out of the minimum (flacenc
        // counts it, and strict readers such as symphonia then refuse the
        // stream).
        self.info.set_block_sizes(self.block, self.block).map_err(flac_error)?;
        if zero_empty_frame_sizes && context.total_samples() == 0 {
            self.info.set_frame_sizes(0, 0).map_err(flac_error)?;
        }
        Self::header_of(self.info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic samples in [-0.5, 0.5).
    fn noise(n: usize, seed: u64) -> Vec<f32> {
        crate::compare::grid_values(n, seed, 1024).into_iter().map(|v| v * 0.25).collect()
    }

    #[test]
    fn flac_streamed_in_pieces_is_the_whole_encoding() {
        let samples = noise(30011, 7);
        let whole = encode_flac(&samples, 44100).unwrap();
        let mut stream = FlacStream::new(44100).unwrap();
        let start = stream.header().unwrap();
        let mut body = Vec::new();
        for piece in samples.chunks(997) {
            stream.push(piece, &mut body).unwrap();
        }
        let header = stream.finish(&mut body).unwrap();
        assert_eq!(header.len(), start.len());
        assert_eq!([&header[..], &body[..]].concat(), whole, "the same bytes");
        // Before the end, the header is a valid stream start with unknown totals.
        assert_eq!(&start[..12], &whole[..12], "fLaC, the block header, the block sizes");
        assert_eq!(&start[12..18], &[0; 6], "frame sizes unknown");
        // No samples at all: still a whole, empty stream.
        let empty = FlacStream::new(24000).unwrap();
        let mut body = Vec::new();
        let header = empty.finish(&mut body).unwrap();
        assert!(body.is_empty() && header.starts_with(b"fLaC"));
    }

    #[test]
    fn the_wav_header_is_the_one_hound_writes() {
        let samples = [0.0, 0.5, -1.0, 2.0, -0.25];
        let whole = encode_wav(&samples, 24000).unwrap();
        let mut data = Vec::new();
        RawFormat::Pcm16.encode(&samples, &mut data);
        assert_eq!(&whole[..44], &wav_header(24000, Some(data.len() as u32)));
        assert_eq!(&whole[44..], &data[..]);
        // A stream of unknown length: both sizes all ones, the rest the same.
        let stream = wav_header(24000, None);
        assert_eq!((&stream[4..8], &stream[40..44]), (&[0xff; 4][..], &[0xff; 4][..]));
        assert_eq!((&stream[8..40], &stream[..4]), (&whole[8..40], &whole[..4]));
    }

    #[test]
    fn flac_decodes_to_the_wavs_samples() {
        let samples = noise(48000, 1);
        let flac = encode_flac(&samples, 24000).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.flac");
        std::fs::write(&path, &flac).unwrap();
        let decoded = input::read_mono(&path, 10.0).unwrap();
        assert_eq!(decoded.sample_rate, 24000);
        let want: Vec<i16> = samples.iter().map(|s| pcm16(*s)).collect();
        let got: Vec<i16> = decoded.samples.iter().map(|s| (s * 32768.0).round() as i16).collect();
        assert_eq!(got, want, "lossless");
        assert!(flac.len() < 2 * samples.len(), "compressed: {} bytes for {} samples", flac.len(), samples.len());
    }

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
