//! `librosa_resample` against `librosa.resample` itself on the committed
//! audio fixtures (`tools/audio/make_audio_fixtures.py`: a 44.1 kHz stereo
//! WAV read as librosa reads it, then taken to 24 and 16 kHz, and the 24 kHz
//! copy to 16 kHz as Chatterbox's T3 prompt is): the same samples, bit for
//! bit, edges included.

use engine_core::audio::input::read_mono;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/audio")
}

fn npy(name: &str) -> Vec<f32> {
    let bytes = std::fs::read(fixtures().join(name)).unwrap();
    npyz::NpyFile::new(&bytes[..]).unwrap().into_vec::<f32>().unwrap()
}

fn identical(name: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    let differing = got.iter().zip(want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    println!("  {name}: {} samples, {differing} differ from librosa's", want.len());
    assert_eq!(differing, 0, "{name}: {differing} samples differ from librosa.resample's");
}

#[test]
fn the_samples_are_librosas_bit_for_bit() {
    let clip = read_mono(&fixtures().join("wav44k.wav"), 60.0).unwrap();
    assert_eq!(clip.samples, npy("wav44k.wav.npy"), "the decoded clip is librosa's");
    identical("44.1 -> 24 kHz", &tts_soxr::librosa_resample(&clip.samples, 44_100, 24_000).unwrap(), &npy("wav44k_to_24k.npy"));
    identical("44.1 -> 16 kHz", &tts_soxr::librosa_resample(&clip.samples, 44_100, 16_000).unwrap(), &npy("wav44k_to_16k.npy"));
    identical("24 -> 16 kHz", &tts_soxr::librosa_resample(&npy("wav44k_to_24k.npy"), 24_000, 16_000).unwrap(), &npy("24k_to_16k.npy"));
}
