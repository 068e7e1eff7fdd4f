//! The Supertonic voice-style JSON reader (`--voice FILE.json`) on arbitrary
//! bytes, through `Voice::from_json_bytes`: with the tiny fixture's shapes
//! (those of the official v2 styles) and with a small shape that short inputs
//! can fill. Whatever it accepts has the shape asked for and only finite
//! values.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tts_fuzz::quiet;
use tts_model_supertonic::voice::{Voice, VoiceShape};

fuzz_target!(|data: &[u8]| {
    quiet();
    for shape in [VoiceShape { ttl: (50, 256), dp: (8, 16) }, VoiceShape { ttl: (2, 3), dp: (2, 2) }] {
        let Ok(voice) = Voice::from_json_bytes(data, "fuzz.json", &shape) else { continue };
        assert_eq!(voice.style_ttl.len(), shape.ttl.0 * shape.ttl.1);
        assert_eq!(voice.style_dp.len(), shape.dp.0 * shape.dp.1);
        assert!(voice.style_ttl.iter().chain(&voice.style_dp).all(|v| v.is_finite()));
    }
});
