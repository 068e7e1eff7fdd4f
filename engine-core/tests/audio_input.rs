//! Reading recordings (`engine_core::audio::input`) and converting their rate
//! (`engine_core::audio::resample`) against what the reference stack
//! (libsndfile through soundfile, librosa's mono mixdown and soxr_hq
//! resampling) makes of the same files: `tools/audio/make_audio_fixtures.py`
//! wrote `tests/fixtures/audio/`. Bad files give one line naming the file.

use engine_core::audio::input::{read_mono, Clip};
use engine_core::audio::resample::resample;
use engine_core::compare;
use std::io::Write;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/audio")
}

fn npy(name: &str) -> Vec<f32> {
    let bytes = std::fs::read(fixtures().join(name)).unwrap();
    npyz::NpyFile::new(&bytes[..]).unwrap().into_vec::<f32>().unwrap()
}

fn rel_err(ours: &[f32], reference: &[f32]) -> f32 {
    compare::max_rel_err(ours, reference).unwrap_or_else(|e| panic!("{e}"))
}

fn snr_db(ours: &[f32], reference: &[f32]) -> f64 {
    compare::snr_db(ours, reference).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn wav_and_flac_decode_exactly_as_libsndfile() {
    for (file, rate) in [("wav44k.wav", 44_100), ("tone.flac", 22_050)] {
        let clip = read_mono(&fixtures().join(file), 60.0).unwrap();
        let want = npy(&format!("{file}.npy"));
        assert_eq!((clip.sample_rate, clip.channels, clip.samples.len(), clip.truncated), (rate, 2, want.len(), false), "{file}");
        let diff = rel_err(&clip.samples, &want);
        // Both divide the same integers by 2^15 and average two channels.
        assert!(diff <= 1e-7, "{file}: max |diff| / max |ref| {diff:e}");
    }
}

#[test]
fn lossy_formats_decode_close_to_libsndfile() {
    // Two decoders of one lossy stream agree to their arithmetic, not bit for
    // bit (measured: Vorbis 137 dB, MP3 127 dB); the figures are printed.
    for (file, min_snr) in [("tone.ogg", 120.0), ("tone.mp3", 110.0)] {
        let clip = read_mono(&fixtures().join(file), 60.0).unwrap();
        let want = npy(&format!("{file}.npy"));
        assert_eq!((clip.sample_rate, clip.channels), (22_050, 2), "{file}");
        let n = clip.samples.len().min(want.len());
        let snr = snr_db(&clip.samples[..n], &want[..n]);
        eprintln!("{file}: {} frames (libsndfile {}), SNR against libsndfile {snr:.1} dB", clip.samples.len(), want.len());
        assert_eq!(clip.samples.len(), want.len(), "{file}: frames (encoder delay and padding trimmed alike)");
        assert!(snr >= min_snr, "{file}: SNR {snr:.1} dB");
    }
}

#[test]
fn resampling_matches_soxr_hq() {
    let clip = read_mono(&fixtures().join("wav44k.wav"), 60.0).unwrap();
    let to24 = resample(&clip.samples, 44_100, 24_000).unwrap();
    let to16 = resample(&clip.samples, 44_100, 16_000).unwrap();
    // Chatterbox's T3 prompt: a 24 kHz clip taken to 16 kHz.
    let chain = resample(&npy("wav44k_to_24k.npy"), 24_000, 16_000).unwrap();
    for (name, got) in [("wav44k_to_24k.npy", &to24), ("wav44k_to_16k.npy", &to16), ("24k_to_16k.npy", &chain)] {
        let want = npy(name);
        assert_eq!(got.len(), want.len(), "{name}: length");
        let whole = snr_db(got, &want);
        // soxr's first outputs from a 44.1 kHz input are a start-up transient
        // of its own (see `soxr_has_a_start_up_transient`), and its last
        // output too. The clip starts and ends at full level, so they dominate
        // a whole-clip figure there; 10 samples (0.6 ms at most) at each end
        // hold them.
        let edge = 10;
        let trimmed = snr_db(&got[edge..got.len() - edge], &want[edge..want.len() - edge]);
        let inside = {
            let edge = want.len() / 20;
            snr_db(&got[edge..got.len() - edge], &want[edge..want.len() - edge])
        };
        eprintln!("{name}: SNR against soxr_hq {whole:.1} dB whole clip, {trimmed:.1} dB without 10 samples at each end, {inside:.1} dB inside");
        assert!(trimmed >= 90.0, "{name}: {trimmed:.1} dB");
        if name == "24k_to_16k.npy" {
            assert!(whole >= 90.0, "{name}: {whole:.1} dB over the whole clip");
        }
    }
}

/// A unit impulse at a 44.1 kHz clip's first sample leaves soxr_hq (at 24 kHz)
/// noticeably lower than the same impulse mid-clip: its filter is not yet the
/// one it uses everywhere else. A linear-phase filter gives both the same peak.
#[test]
fn soxr_has_a_start_up_transient() {
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(fixtures().join("manifest.json")).unwrap()).unwrap();
    let impulse = &manifest["soxr_hq_impulse_44k_to_24k"];
    let (at_start, mid_clip) = (impulse["at_start"].as_f64().unwrap(), impulse["mid_clip"].as_f64().unwrap());
    let mut unit = vec![0.0f32; 44_100];
    unit[0] = 1.0;
    let ours_at_start = resample(&unit, 44_100, 24_000).unwrap()[0] as f64;
    unit.rotate_right(441);
    let ours_mid_clip = resample(&unit, 44_100, 24_000).unwrap()[240] as f64;
    eprintln!("impulse peak at the start / mid-clip: soxr_hq {at_start:.4} / {mid_clip:.4}, ours {ours_at_start:.4} / {ours_mid_clip:.4}");
    assert!((ours_at_start - ours_mid_clip).abs() < 1e-6, "ours: {ours_at_start} vs {ours_mid_clip}");
    assert!((ours_mid_clip - mid_clip).abs() < 1e-3, "mid-clip: ours {ours_mid_clip}, soxr {mid_clip}");
    assert!(mid_clip - at_start > 0.02, "soxr: {at_start} vs {mid_clip}");
}

fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn write_wav(path: &Path, spec: hound::WavSpec, frames: &[Vec<f64>]) {
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    for frame in frames {
        for &s in frame {
            match (spec.sample_format, spec.bits_per_sample) {
                (hound::SampleFormat::Float, _) => w.write_sample(s as f32).unwrap(),
                (_, 8) => w.write_sample((s * 128.0) as i8).unwrap(),
                (_, 16) => w.write_sample((s * 32768.0) as i16).unwrap(),
                (_, bits) => w.write_sample((s * (1u64 << (bits - 1)) as f64) as i32).unwrap(),
            }
        }
    }
    w.finalize().unwrap();
}

#[test]
fn every_wav_sample_format_scales_like_libsndfile() {
    let dir = scratch();
    // Values every format holds exactly, stereo: the mixdown is their mean.
    let frames = vec![vec![0.5, -0.25], vec![-1.0, 0.0], vec![0.75, 0.25]];
    let mono = [0.125f32, -0.5, 0.5];
    for (bits, format) in [
        (8, hound::SampleFormat::Int),
        (16, hound::SampleFormat::Int),
        (24, hound::SampleFormat::Int),
        (32, hound::SampleFormat::Int),
        (32, hound::SampleFormat::Float),
    ] {
        let path = dir.path().join(format!("{bits}-{format:?}.wav"));
        write_wav(&path, hound::WavSpec { channels: 2, sample_rate: 16_000, bits_per_sample: bits, sample_format: format }, &frames);
        let clip = read_mono(&path, 60.0).unwrap();
        assert_eq!(clip, Clip { samples: mono.to_vec(), sample_rate: 16_000, channels: 2, truncated: false }, "{bits}-bit {format:?}");
    }
}

#[test]
fn reading_stops_at_the_limit_of_a_two_hour_file() {
    let dir = scratch();
    let path = dir.path().join("two-hours.wav");
    // A header for two hours of 16 kHz 16-bit mono, and a sparse body of zeros:
    // the reader must touch only the first minute.
    let rate = 16_000u32;
    let data_len = 2 * 3600 * rate * 2;
    let mut header = Vec::new();
    header.extend_from_slice(b"RIFF");
    header.extend_from_slice(&(36 + data_len).to_le_bytes());
    header.extend_from_slice(b"WAVEfmt ");
    header.extend_from_slice(&16u32.to_le_bytes());
    header.extend_from_slice(&1u16.to_le_bytes()); // PCM
    header.extend_from_slice(&1u16.to_le_bytes()); // mono
    header.extend_from_slice(&rate.to_le_bytes());
    header.extend_from_slice(&(rate * 2).to_le_bytes());
    header.extend_from_slice(&2u16.to_le_bytes());
    header.extend_from_slice(&16u16.to_le_bytes());
    header.extend_from_slice(b"data");
    header.extend_from_slice(&data_len.to_le_bytes());
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&header).unwrap();
    f.set_len(header.len() as u64 + data_len as u64).unwrap();
    drop(f);
    let clip = read_mono(&path, 60.0).unwrap();
    assert_eq!((clip.samples.len(), clip.truncated), (60 * rate as usize, true));
    assert_eq!(clip.seconds(), 60.0);
}

#[test]
fn a_wav_cut_short_keeps_the_frames_it_has() {
    let dir = scratch();
    let path = dir.path().join("cut.wav");
    write_wav(&path, hound::WavSpec { channels: 1, sample_rate: 16_000, bits_per_sample: 16, sample_format: hound::SampleFormat::Int }, &vec![vec![0.5]; 1000]);
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(len - 1000).unwrap();
    let clip = read_mono(&path, 60.0).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(clip.samples, vec![0.5; 500]);
}

#[test]
fn bad_files_are_one_line_errors_naming_the_file() {
    let dir = scratch();
    let p = |name: &str| dir.path().join(name);
    let pcm16 = hound::WavSpec { channels: 1, sample_rate: 16_000, bits_per_sample: 16, sample_format: hound::SampleFormat::Int };

    std::fs::write(p("empty.wav"), b"").unwrap();
    std::fs::write(p("notes.txt"), b"this is not audio at all, only text\n").unwrap();
    write_wav(&p("good.wav"), pcm16, &vec![vec![0.1]; 100]);
    std::fs::write(p("header.wav"), &std::fs::read(p("good.wav")).unwrap()[..30]).unwrap();
    write_wav(&p("silent-header.wav"), pcm16, &[]);
    write_wav(&p("4khz.wav"), hound::WavSpec { sample_rate: 4000, ..pcm16 }, &vec![vec![0.1]; 100]);
    let float = hound::WavSpec { bits_per_sample: 32, sample_format: hound::SampleFormat::Float, ..pcm16 };
    write_wav(&p("nan.wav"), float, &[vec![0.0], vec![f64::NAN]]);
    std::fs::create_dir(p("folder.wav")).unwrap();

    let cases: [(&str, String); 9] = [
        ("empty.wav", "the file is empty".into()),
        ("notes.txt", "not a recognised audio file (WAV, FLAC, MP3 or Ogg Vorbis)".into()),
        ("header.wav", "not a valid WAV file".into()),
        ("silent-header.wav", "contains no audio samples".into()),
        ("4khz.wav", "sample rate 4000 Hz is not supported (supported: 8000..=384000 Hz)".into()),
        ("nan.wav", "sample 1 is not a finite number (NaN or infinity)".into()),
        ("folder.wav", "is a directory, not a regular file".into()),
        ("missing.wav", ": No such file or directory".into()),
        ("good.wav", "the reading limit must be a positive number of seconds, not NaN".into()),
    ];
    for (name, expected) in cases {
        let limit = if name == "good.wav" { f64::NAN } else { 60.0 };
        let e = read_mono(&p(name), limit).unwrap_err();
        // Opening errors name the input kind first ("audio file PATH is a
        // directory, ..."), decoding errors start with the path.
        let path = p(name).display().to_string();
        let want = match name {
            "folder.wav" | "missing.wav" => format!("audio file {path}{}{expected}", if name == "folder.wav" { " " } else { "" }),
            _ => format!("{path}: {expected}"),
        };
        assert!(e.starts_with(&want), "{name}: {e}");
        assert!(!e.contains('\n'), "{name}: {e}");
    }
}

/// A FIFO as a recording blocked the reader for ever (no writer comes); it is
/// refused by kind at once, as a link to it is.
#[test]
fn fifo_recordings_are_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("ref.wav");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let e = read_mono(&fifo, 60.0).unwrap_err();
    assert_eq!(e, format!("audio file {} is a FIFO, not a regular file", fifo.display()));
}
