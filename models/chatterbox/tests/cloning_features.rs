//! The spectral front ends of voice cloning against the reference package's
//! own functions on the same synthetic recordings
//! (`tools/chatterbox/make_cloning_fixtures.py`). Tolerance 1e-4 relative to
//! each feature's largest magnitude, the bound; the figures print.

mod common;

use std::path::{Path, PathBuf};
use tts_model_chatterbox::cloning::features::{self, Features};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/chatterbox/cloning/features")
}

/// The reference's array as frame-major data: `transposed` when it is stored
/// bins × frames.
fn reference(name: &str, transposed: bool) -> Features {
    let (shape, data) = common::npy_in(&dir(), name);
    let (rows, cols) = (shape[0] as usize, shape[1] as usize);
    if !transposed {
        return Features { frames: rows, dims: cols, data };
    }
    let mut out = vec![0f32; data.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = data[r * cols + c];
        }
    }
    Features { frames: cols, dims: rows, data: out }
}

fn check(name: &str, got: &Features, want: &Features) {
    assert_eq!((got.frames, got.dims), (want.frames, want.dims), "{name}: shape (frames, bins)");
    let err = common::rel_err(&got.data, &want.data);
    eprintln!("{name}: {} frames x {} bins, max |diff| / max |ref| = {err:.2e} (tolerance 1e-4)", got.frames, got.dims);
    assert!(err <= 1e-4, "{name}: {err:e}");
}

#[test]
fn features_match_the_reference() {
    let (_, wav16) = common::npy_in(&dir(), "wav16k");
    let (_, wav24) = common::npy_in(&dir(), "wav24k");
    check("VoiceEncoder mel", &features::voice_encoder_mel(&wav16, 40).unwrap(), &reference("ve_mel", true));
    check("S3Tokenizer log mel", &features::s3tokenizer_log_mel(&wav16).unwrap(), &reference("s3tok_log_mel", true));
    check("CAMPPlus fbank", &features::campplus_fbank(&wav16).unwrap(), &reference("campplus_fbank", false));
    check("S3Gen mel", &features::s3gen_mel(&wav24).unwrap(), &reference("s3gen_mel", true));
}
