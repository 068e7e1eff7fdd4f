//! Chatterbox's load-time checks (T3 with its embedded tokenizer, or S3Gen:
//! hparam ranges, relations, the tensor tables, the built-in voice's tokens)
//! on arbitrary GGUF images, without a device.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tts_fuzz::quiet;

fuzz_target!(|data: &[u8]| {
    quiet();
    let _ = tts_model_chatterbox::check_model_bytes(data);
});
