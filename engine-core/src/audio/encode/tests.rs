//! Every format decoded by a decoder other than ours: symphonia for WAV,
//! FLAC and MP3; ffmpeg for Opus, AAC and the exact length of an MP3 with
//! its LAME tag (skipped with a message where it is not installed; CI
//! installs it, see xtask's APT list).

use super::*;
use crate::audio::input::decode_mono;
use std::process::Command;

fn tone(rate: u32, n: usize) -> Vec<f32> {
    (0..n).map(|i| 0.3 * (i as f32 * 440.0 * std::f32::consts::TAU / rate as f32).sin()).collect()
}

/// `samples` pushed in pieces of `piece`; the streamed bytes and the final header.
fn stream(format: AudioFormat, samples: &[f32], rate: u32, piece: usize) -> (Vec<u8>, Option<Vec<u8>>) {
    let mut encoder = StreamEncoder::new(format, rate).unwrap();
    let mut out = Vec::new();
    for p in samples.chunks(piece) {
        encoder.push(p, &mut out).unwrap();
    }
    let header = encoder.finish(&mut out).unwrap();
    (out, header)
}

#[test]
fn names_and_extensions() {
    for f in AudioFormat::ALL {
        assert_eq!(AudioFormat::parse(f.name()), Some(f));
        for ext in f.extensions() {
            assert_eq!(AudioFormat::from_extension(Path::new(&format!("a/b.{ext}"))), Ok(Some(f)));
            assert_eq!(AudioFormat::from_extension(Path::new(&format!("B.{}", ext.to_uppercase()))), Ok(Some(f)));
        }
    }
    assert_eq!(AudioFormat::from_extension(Path::new("out")), Ok(None));
    assert_eq!(AudioFormat::from_extension(Path::new("x.ogg")), Ok(Some(AudioFormat::Opus)));
    assert_eq!(AudioFormat::from_extension(Path::new("x.raw")), Ok(Some(AudioFormat::Pcm)));
    assert_eq!(
        AudioFormat::from_extension(Path::new("dir/x.m4a")).unwrap_err(),
        "dir/x.m4a: unknown audio extension `.m4a`; formats: wav (.wav), pcm (.pcm .raw), f32 (.f32), flac (.flac), mp3 (.mp3), opus (.opus .ogg), aac (.aac)"
    );
    assert_eq!(AudioFormat::parse("ogg"), None);
}

#[test]
fn bad_rates_are_refused_for_every_format() {
    for f in AudioFormat::ALL {
        let e = StreamEncoder::new(f, 0).err().unwrap();
        assert!(e.starts_with("the model reports a sample rate of 0 Hz"), "{f:?}: {e}");
    }
}

#[test]
fn streamed_wav_has_unknown_sizes_and_the_whole_one_exact_sizes() {
    let samples = tone(24_000, 2500);
    let (streamed, header) = stream(AudioFormat::Wav, &samples, 24_000, 700);
    assert_eq!(&streamed[..44], &wav_header(24_000, None), "0xFFFFFFFF sizes while streaming");
    assert_eq!(&streamed[4..8], &[0xff; 4]);
    assert_eq!(&streamed[40..44], &[0xff; 4]);
    assert_eq!(header.as_deref(), Some(&wav_header(24_000, Some(5000))[..]));
    let whole = encode_all(AudioFormat::Wav, &samples, 24_000).unwrap();
    assert_eq!(whole, crate::audio::encode_wav(&samples, 24_000).unwrap(), "exact sizes, hound's bytes");
    assert_eq!(&whole[44..], &streamed[44..]);
    let clip = decode_mono(&whole, 10.0).unwrap();
    assert_eq!((clip.sample_rate, clip.samples.len()), (24_000, samples.len()));
    // Nothing at all: a whole, empty WAV.
    assert_eq!(stream(AudioFormat::Wav, &[], 24_000, 1), (wav_header(24_000, Some(0)).to_vec(), None));
}

#[test]
fn raw_formats_are_the_samples() {
    let samples = [0.0, 0.5, -1.0, 2.0];
    let (pcm, header) = stream(AudioFormat::Pcm, &samples, 24_000, 3);
    assert_eq!((pcm, header), ([0i16, 16384, -32767, 32767].iter().flat_map(|s| s.to_le_bytes()).collect(), None));
    let (f32s, _) = stream(AudioFormat::F32, &samples, 24_000, 3);
    assert_eq!(f32s, samples.iter().flat_map(|s| s.to_le_bytes()).collect::<Vec<u8>>());
}

#[test]
fn streamed_flac_is_encode_flac_and_decodes_losslessly() {
    for n in [0, 1, 999, 4096, 44_100] {
        let samples = tone(44_100, n);
        assert_eq!(encode_all(AudioFormat::Flac, &samples, 44_100).unwrap(), encode_flac(&samples, 44_100).unwrap(), "{n} samples");
    }
    let samples = tone(24_000, 30_011);
    let (streamed, header) = stream(AudioFormat::Flac, &samples, 24_000, 997);
    let header = header.unwrap();
    let whole = [&header[..], &streamed[header.len()..]].concat();
    assert_eq!(whole, encode_flac(&samples, 24_000).unwrap());
    let clip = decode_mono(&whole, 10.0).unwrap();
    assert_eq!((clip.sample_rate, clip.samples.len()), (24_000, samples.len()));
    let worst = clip.samples.iter().zip(&samples).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst <= 1.0 / 32768.0 + 1e-6, "16-bit lossless: {worst}");
    let mut bad = samples.clone();
    bad[7] = f32::NAN;
    let mut e = StreamEncoder::new(AudioFormat::Flac, 24_000).unwrap();
    e.push(&bad, &mut Vec::new()).unwrap();
    assert!(e.finish(&mut Vec::new()).unwrap_err().starts_with("the model produced 1 non-finite samples"));
}

#[test]
fn mp3_decodes_with_symphonia() {
    for rate in [24_000, 44_100] {
        let samples = tone(rate, rate as usize);
        let (bytes, header) = stream(AudioFormat::Mp3, &samples, rate, 1000);
        assert!(header.is_none());
        let clip = decode_mono(&bytes, 10.0).unwrap();
        assert_eq!(clip.sample_rate, rate);
        // LAME's delay and the last frame's padding: at most two frames and a granule.
        let extra = clip.samples.len() as i64 - samples.len() as i64;
        assert!((0..=2 * 1152 + 576).contains(&extra), "{} samples for {}", clip.samples.len(), samples.len());
        let middle = &clip.samples[2400..clip.samples.len() - 2400];
        assert!((crossings_hz(middle, rate) - 440.0).abs() < 5.0, "{rate} Hz: {}", crossings_hz(middle, rate));
    }
    // LAME is LGPL: the system's shared library, never compiled in.
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    assert!(maps.contains("libmp3lame.so"), "LAME is not loaded as a shared library");
}

/// The (offset, length) of each MPEG Layer III frame of `bytes`, which must
/// be frames only, end to end; the length from the header's version, bit
/// rate, sampling rate and padding bit (ISO 11172-3 and 13818-3).
fn mp3_frames(bytes: &[u8]) -> Vec<(usize, usize)> {
    const MPEG1_KBPS: [usize; 15] = [0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320];
    const MPEG2_KBPS: [usize; 15] = [0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160];
    let mut frames = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let h = &bytes[at..at + 4];
        assert!(h[0] == 0xff && h[1] & 0xe6 == 0xe2, "a Layer III frame header at {at}: {h:02x?}");
        let mpeg1 = (h[1] >> 3) & 3 == 3;
        let rate =
            [[11_025, 12_000, 8000], [0, 0, 0], [22_050, 24_000, 16_000], [44_100, 48_000, 32_000]][usize::from((h[1] >> 3) & 3)][usize::from((h[2] >> 2) & 3)];
        let kbps = if mpeg1 { MPEG1_KBPS } else { MPEG2_KBPS }[usize::from(h[2] >> 4)];
        let length = if mpeg1 { 144_000 } else { 72_000 } * kbps / rate + usize::from((h[2] >> 1) & 1);
        frames.push((at, length));
        at += length;
    }
    assert_eq!(at, bytes.len(), "the last frame ends with the bytes");
    frames
}

/// Where a mono Layer III frame's Xing/Info tag would start: after the
/// header and the side information (17 bytes for MPEG-1, 9 for MPEG-2).
fn info_offset(frame: &[u8]) -> usize {
    4 + if (frame[1] >> 3) & 3 == 3 { 17 } else { 9 }
}

/// CRC-16/ARC (polynomial 0x8005 reflected, initial 0): the LAME tag's CRCs.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc = 0u16;
    for b in bytes {
        crc ^= u16::from(*b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xa001 } else { crc >> 1 };
        }
    }
    crc
}

/// A whole MP3 (encode_all, or a seekable output) starts with LAME's Info
/// frame: its LAME tag states the encoder delay (576) and the padding that
/// make up the frames with the samples, the frame and byte counts, and
/// CRCs that check; ffmpeg reads it and gives back exactly the samples
/// encoded. The streamed bytes are the same but for that frame, which LAME
/// wrote first as a placeholder of the same length. A stream gets no tag.
#[test]
fn a_whole_mp3_states_its_delay_and_padding_in_a_lame_tag_and_a_stream_does_not() {
    for (rate, n) in [(24_000u32, 24_000usize), (44_100, 30_011), (16_000, 2000), (8000, 8000), (16_000, 7), (22_050, 0)] {
        let samples = tone(rate, n);
        let whole = encode_all(AudioFormat::Mp3, &samples, rate).unwrap();
        let frames = mp3_frames(&whole);
        let info = &whole[..frames[0].1];
        let at = info_offset(info);
        assert_eq!(&info[at..at + 4], b"Info", "{rate} Hz: CBR's Xing tag is named Info");
        let field = |i: usize| u32::from_be_bytes(info[i..i + 4].try_into().unwrap()) as usize;
        assert_eq!(field(at + 4) & 3, 3, "{rate} Hz: frame and byte counts present");
        assert_eq!(field(at + 8), frames.len() - 1, "{rate} Hz: the audio frames");
        assert_eq!(field(at + 12), whole.len(), "{rate} Hz: the bytes");
        let lame = at + 120;
        assert_eq!(&info[lame..lame + 4], b"LAME", "{rate} Hz: the LAME tag");
        let d = &info[lame + 21..lame + 24];
        let (delay, padding) = ((usize::from(d[0]) << 4) | usize::from(d[1] >> 4), (usize::from(d[1] & 15) << 8) | usize::from(d[2]));
        let per_frame = if (info[1] >> 3) & 3 == 3 { 1152 } else { 576 };
        assert_eq!(delay, 576, "{rate} Hz: LAME's encoder delay");
        assert_eq!((frames.len() - 1) * per_frame, delay + n + padding, "{rate} Hz: the frames hold delay, samples and padding");
        assert_eq!(field(lame + 28), whole.len(), "{rate} Hz: the music length");
        let crc = |i: usize| u16::from_be_bytes([info[i], info[i + 1]]);
        assert_eq!(crc(lame + 32), crc16(&whole[info.len()..]), "{rate} Hz: the music CRC");
        assert_eq!(crc(lame + 34), crc16(&info[..lame + 34]), "{rate} Hz: the tag's CRC");
        // Streamed to a seekable output: the placeholder first, the same length.
        let mut encoder = StreamEncoder::to(AudioFormat::Mp3, rate, Destination::Seekable).unwrap();
        let mut streamed = Vec::new();
        for p in samples.chunks(1000) {
            encoder.push(p, &mut streamed).unwrap();
        }
        let header = encoder.finish(&mut streamed).unwrap().unwrap();
        assert_eq!(mp3_frames(&streamed)[0].1, header.len(), "{rate} Hz: the placeholder is as long as the tag frame");
        assert!(!streamed[..header.len()].windows(4).any(|w| w == b"Info"), "{rate} Hz: the placeholder is empty");
        assert_eq!([&header[..], &streamed[header.len()..]].concat(), whole, "{rate} Hz");
        // A stream: audio frames from the first byte.
        let (tagless, header) = stream(AudioFormat::Mp3, &samples, rate, 1000);
        assert!(header.is_none());
        let first = &tagless[..mp3_frames(&tagless)[0].1];
        let at = info_offset(first);
        assert!(!matches!(&first[at..at + 4], b"Info" | b"Xing"), "{rate} Hz: no tag in a stream");
        // ffmpeg's trim is exact from a frame of audio up (7 samples at
        // 16 kHz decode to 536, and a stream of no audio does not open).
        if n < 1152 {
            continue;
        }
        if let Some(p) = ffmpeg(&whole, "t.mp3") {
            assert_eq!((p.codec.as_str(), p.rate, p.samples.len()), ("mp3", rate, n), "{rate} Hz: ffmpeg trims the delay and padding");
            if n > 10_000 {
                let middle = &p.samples[2400..n - 2400];
                assert!((crossings_hz(middle, rate) - 440.0).abs() < 5.0, "{rate} Hz: {}", crossings_hz(middle, rate));
            }
        }
    }
}

/// What ffprobe and ffmpeg make of `bytes` (written as `name`): the
/// container, the codec, the sample rate and the decoded mono samples; None
/// when ffmpeg is not installed.
struct Probed {
    container: String,
    codec: String,
    rate: u32,
    samples: Vec<f32>,
}

fn ffmpeg(bytes: &[u8], name: &str) -> Option<Probed> {
    if Command::new("ffprobe").arg("-version").output().is_err() || Command::new("ffmpeg").arg("-version").output().is_err() {
        // CI installs it (xtask's APT list) and sets TTS_REQUIRE_FFMPEG: there its absence fails.
        assert!(std::env::var_os("TTS_REQUIRE_FFMPEG").is_none(), "TTS_REQUIRE_FFMPEG is set but ffmpeg/ffprobe are not installed");
        eprintln!("skipped: ffmpeg/ffprobe are not installed (Debian package ffmpeg); the Opus and AAC outputs were not decoded");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    let probe = Command::new("ffprobe")
        .args(["-v", "error", "-show_entries", "format=format_name:stream=codec_name,sample_rate,channels", "-of", "json"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(probe.status.success(), "ffprobe: {}", String::from_utf8_lossy(&probe.stderr));
    let json: serde_json::Value = serde_json::from_slice(&probe.stdout).unwrap();
    let stream = &json["streams"][0];
    assert_eq!(stream["channels"], 1, "mono");
    let decoded = Command::new("ffmpeg").args(["-v", "error", "-i"]).arg(&path).args(["-f", "f32le", "-"]).output().unwrap();
    assert!(decoded.status.success(), "ffmpeg: {}", String::from_utf8_lossy(&decoded.stderr));
    Some(Probed {
        container: json["format"]["format_name"].as_str().unwrap().to_string(),
        codec: stream["codec_name"].as_str().unwrap().to_string(),
        rate: stream["sample_rate"].as_str().unwrap().parse().unwrap(),
        samples: decoded.stdout.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
    })
}

/// The frequency of the strongest zero-crossing rate of `samples`: a 440 Hz
/// tone must come back at 440 Hz (a codec that garbles the audio would not).
fn crossings_hz(samples: &[f32], rate: u32) -> f64 {
    let ups = samples.windows(2).filter(|w| w[0] < 0.0 && w[1] >= 0.0).count();
    ups as f64 * rate as f64 / samples.len() as f64
}

#[test]
fn opus_in_ogg_decodes_with_ffmpeg_at_48_khz_with_the_length_kept() {
    for (rate, n) in [(24_000u32, 24_000usize), (44_100, 30_000), (48_000, 47_000)] {
        let samples = tone(rate, n);
        let (bytes, header) = stream(AudioFormat::Opus, &samples, rate, 1234);
        assert!(header.is_none());
        assert!(bytes.starts_with(b"OggS"));
        let Some(p) = ffmpeg(&bytes, "t.opus") else { return };
        assert_eq!((p.container.as_str(), p.codec.as_str(), p.rate), ("ogg", "opus", AudioFormat::Opus.output_rate(rate)), "{rate} Hz");
        let want = (n as f64 * 48_000.0 / rate as f64).round() as i64;
        assert!((p.samples.len() as i64 - want).abs() <= 960, "{rate} Hz: {} samples decoded for {want}", p.samples.len());
        let middle = &p.samples[4800..p.samples.len() - 4800];
        assert!((crossings_hz(middle, 48_000) - 440.0).abs() < 5.0, "{rate} Hz: {}", crossings_hz(middle, 48_000));
    }
    // Streamed in pieces: the first bytes are the two header pages, sent with the first piece.
    let mut e = StreamEncoder::new(AudioFormat::Opus, 24_000).unwrap();
    let mut first = Vec::new();
    e.push(&tone(24_000, 100), &mut first).unwrap();
    assert!(first.starts_with(b"OggS") && first.windows(8).any(|w| w == b"OpusHead") && first.windows(8).any(|w| w == b"OpusTags"));
    // Nothing synthesized: still a stream ffmpeg reads.
    let (empty, _) = stream(AudioFormat::Opus, &[], 24_000, 1);
    if let Some(p) = ffmpeg(&empty, "e.opus") {
        assert_eq!((p.codec.as_str(), p.samples.len()), ("opus", 0));
    }
}

#[test]
fn aac_in_adts_decodes_with_ffmpeg() {
    for (rate, coded, n) in [(24_000u32, 24_000u32, 24_000usize), (44_100, 44_100, 30_000), (22_000, 48_000, 22_000)] {
        let samples = tone(rate, n);
        let (bytes, header) = stream(AudioFormat::Aac, &samples, rate, 1234);
        assert!(header.is_none());
        assert_eq!((bytes[0], bytes[1] & 0xf6), (0xff, 0xf0), "an ADTS sync word");
        let Some(p) = ffmpeg(&bytes, "t.aac") else { return };
        assert_eq!((p.container.as_str(), p.codec.as_str(), p.rate), ("aac", "aac", coded), "{rate} Hz");
        assert_eq!(AudioFormat::Aac.output_rate(rate), coded);
        // ADTS cannot say where the audio starts or ends: the decoded length
        // is FDK's delay (2048 samples here) plus the audio, rounded up to a
        // whole frame of 1024, and the audio is all there: the tone goes on
        // until the delay's end after it.
        let want = (n as f64 * coded as f64 / rate as f64).round() as i64;
        let extra = p.samples.len() as i64 - want;
        assert!((2048..2048 + 1024).contains(&extra), "{rate} Hz: {} samples decoded for {want}", p.samples.len());
        let rms = |s: &[f32]| (s.iter().map(|v| v * v).sum::<f32>() / s.len() as f32).sqrt();
        let end = want as usize + 2048;
        assert!(rms(&p.samples[end - 512..end]) > 0.15, "{rate} Hz: the last audio decodes");
        assert!(rms(&p.samples[..256]) < 0.02, "{rate} Hz: the delay is silence");
        let middle = &p.samples[4096..p.samples.len() - 4096];
        assert!((crossings_hz(middle, coded) - 440.0).abs() < 5.0, "{rate} Hz: {}", crossings_hz(middle, coded));
    }
}

/// Every format takes every rate the engine writes (resampling where its
/// codec needs; a whole MP3 has its Info frame at each), and a stream
/// without audio is still a whole one; FLAC (flacenc) stops at 96 kHz, and
/// says so.
#[test]
fn every_format_takes_every_rate_the_engine_writes() {
    for rate in [1000u32, 8000, 11_025, 16_000, 22_050, 24_000, 44_100, 48_000, 96_000, 192_000, 384_000] {
        let samples = tone(rate, rate as usize / 5);
        for f in AudioFormat::ALL {
            if f == AudioFormat::Flac && rate > 96_000 {
                let e = StreamEncoder::new(f, rate).err().unwrap();
                assert!(e.starts_with("encoding FLAC: ") && e.contains("96000"), "{e}");
                continue;
            }
            let (bytes, _) = stream(f, &samples, rate, 999);
            assert!(!bytes.is_empty(), "{f:?} at {rate} Hz");
            if f == AudioFormat::Mp3 {
                let whole = encode_all(f, &samples, rate).unwrap();
                let info = &whole[..mp3_frames(&whole)[0].1];
                assert_eq!(&info[info_offset(info)..info_offset(info) + 4], b"Info", "MP3 at {rate} Hz: the Info frame");
            }
            let (empty, _) = stream(f, &[], rate, 1);
            let headerless = matches!(f, AudioFormat::Pcm | AudioFormat::F32);
            assert_eq!(empty.is_empty(), headerless, "{f:?} at {rate} Hz without audio");
        }
    }
}
