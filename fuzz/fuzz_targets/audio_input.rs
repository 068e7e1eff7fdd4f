//! The audio reader voice cloning uses (WAV through hound; FLAC, MP3 and Ogg
//! Vorbis through symphonia) on arbitrary file images: an error or a clip of
//! finite samples, never a panic or unbounded memory (at most 2 s decoded).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(clip) = engine_core::audio::input::decode_mono(data, 2.0) {
        assert!(clip.samples.iter().all(|s| s.is_finite()));
        assert!(clip.samples.len() as f64 <= 2.0 * clip.sample_rate as f64 + 1.0);
    }
});
