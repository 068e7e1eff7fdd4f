//! The Chatterbox voice-file reader (`--set voice=NAME.voice`) on arbitrary
//! bytes: ggml's GGUF reader, the format keys, the tensor table against the
//! tiny Turbo fixture's hyperparameters, token ids within their vocabularies
//! and finite values, through `tts_model_chatterbox::check_voice_bytes`.
#![no_main]

use ggml_sys::gguf::GgufTensors;
use libfuzzer_sys::fuzz_target;
use std::path::Path;
use std::sync::OnceLock;
use tts_fuzz::quiet;
use tts_model_chatterbox::hparams::{S3GenHparams, T3Hparams};

/// The hyperparameters of the committed tiny Turbo fixture, which wrote the
/// seed voice files (`tts voice save`).
fn model() -> &'static (T3Hparams, S3GenHparams) {
    static MODEL: OnceLock<(T3Hparams, S3GenHparams)> = OnceLock::new();
    MODEL.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/chatterbox/turbo-tiny");
        let open = |name: &str| GgufTensors::open(&dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let (t3, _) = tts_model_chatterbox::t3::check_file(&open("t3-turbo.gguf")).expect("the T3 fixture");
        let (s3, _) = tts_model_chatterbox::s3gen::check_file(&open("s3gen-meanflow.gguf")).expect("the S3Gen fixture");
        (t3, s3)
    })
}

fuzz_target!(|data: &[u8]| {
    quiet();
    let (t3, s3) = model();
    let _ = tts_model_chatterbox::check_voice_bytes(data, t3, s3);
});
