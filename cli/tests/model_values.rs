//! Values in model files, voices and stage outputs that would have become a
//! silent or empty WAV (issue items 14 and 15): a NaN or infinite weight is
//! refused at load naming the tensor, a voice-style value out of range names
//! the file, a stage whose output overflows names the stage, and a T3
//! tokenizer is judged by the ids it can produce. Every failure is exit 1,
//! one line, no output file.

mod common;

use common::*;
use ggml_sys::gguf::GgufFile;
use std::path::{Path, PathBuf};
use std::process::Output;

fn synth(profile: &Path, plugins: &Path, text: &str, out: &Path, sets: &[&str]) -> Output {
    let mut args = vec!["--profile", profile.to_str().unwrap(), "--plugin-dir", plugins.to_str().unwrap(), "--text", text, "--out", out.to_str().unwrap()];
    for s in sets {
        args.extend_from_slice(&["--set", s]);
    }
    run(&args)
}

/// Runs `files` on the CPU and asserts the one-line error `want`, no output.
fn assert_refused(plugins: &Path, dir: &Path, files: &[PathBuf], sets: &[&str], want: &str) {
    let profile = profile_on(dir, "cpu", files);
    let out = dir.join("o.wav");
    assert_one_line_error(&synth(&profile, plugins, "Hello there.", &out, sets), want);
    assert!(!out.exists(), "{want}: an output file was written");
}

/// The probe's case: Supertonic weights set to NaN or infinity gave an
/// all-zero WAV (the vocoder's leaky ReLU maps NaN to 0). Now the load names
/// the tensor, in any stage.
#[test]
fn supertonic_non_finite_weights_are_refused_naming_the_tensor() {
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let src = supertonic_fixture();
    for (i, (tensor, value)) in
        [("voc.head2.weight", f32::NAN), ("dp.char_emb", f32::INFINITY), ("ve.time.freqs", f32::NEG_INFINITY), ("voc.bn.var", f32::NAN)].into_iter().enumerate()
    {
        let bad = crafted(dir.path(), &format!("bad{i}.gguf"), &src, |e| {
            e.fill_f32(tensor, value).unwrap();
        });
        let want = format!("bad{i}.gguf: tensor '{tensor}' holds ");
        assert_refused(plugins.path(), dir.path(), &[bad], &[], &want);
    }
}

/// The same for both Chatterbox files (T3 and S3Gen).
#[test]
fn chatterbox_non_finite_weights_are_refused_naming_the_tensor() {
    let plugins = plugins_with(&["cpu"], &["chatterbox"]);
    let dir = tempfile::tempdir().unwrap();
    let [t3, s3] = <[PathBuf; 2]>::try_from(chatterbox_fixture()).unwrap();
    let bad_t3 = crafted(dir.path(), "t3-nan.gguf", &t3, |e| {
        e.fill_f32("t3.speech_head.weight", f32::NAN).unwrap();
    });
    assert_refused(plugins.path(), dir.path(), &[bad_t3, s3.clone()], &[], "t3-nan.gguf: tensor 't3.speech_head.weight' holds ");
    let bad_s3 = crafted(dir.path(), "s3-inf.gguf", &s3, |e| {
        e.fill_f32("hift.conv_post.weight", f32::INFINITY).unwrap();
    });
    assert_refused(plugins.path(), dir.path(), &[t3, bad_s3], &[], "s3-inf.gguf: tensor 'hift.conv_post.weight' holds ");
}

/// A BF16 weight (the Multilingual S3Gen converted with
/// `--decoder-weights bf16`) with one NaN, written into a copy's data
/// section: refused at load like an F32 one.
#[test]
fn a_bf16_weight_with_one_nan_is_refused() {
    let plugins = plugins_with(&["cpu"], &["chatterbox"]);
    let dir = tempfile::tempdir().unwrap();
    let mtl = repo().join("tests/fixtures/chatterbox/mtl-tiny");
    let bad = dir.path().join("s3gen-bf16-nan.gguf");
    std::fs::copy(mtl.join("s3gen-bf16-decoder.gguf"), &bad).unwrap();
    let name = "cfm.down_blocks.0.0.res_conv.weight";
    let info = GgufFile::open(&bad).unwrap().tensors().into_iter().find(|t| t.name == name).unwrap();
    assert_eq!(info.ty, ggml_sys::TYPE_BF16);
    let mut bytes = std::fs::read(&bad).unwrap();
    // The third value: a quiet NaN in bfloat16.
    bytes[info.offset + 4..info.offset + 6].copy_from_slice(&0x7fc0u16.to_le_bytes());
    std::fs::write(&bad, bytes).unwrap();
    let want = format!("s3gen-bf16-nan.gguf: tensor '{name}' holds 1 non-finite values (NaN or infinity) of ");
    assert_refused(plugins.path(), dir.path(), &[mtl.join("t3-mtl.gguf"), bad], &["language=en"], &want);
}

/// A duration predictor driven to 0 s (its exp underflows) gave a WAV of 0
/// samples; now it is an error naming the stage.
#[test]
fn a_duration_shorter_than_one_sample_is_an_error() {
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let bad = crafted(dir.path(), "short.gguf", &supertonic_fixture(), |e| {
        e.fill_f32("dp.pred.1.bias", -200.0).unwrap();
    });
    assert_refused(plugins.path(), dir.path(), &[bad], &[], "the duration predictor gave 0 s for a chunk of 12 characters, less than one sample;");
}

/// An F32 matrix value beyond F16's range (65504) becomes infinity where
/// `f16_weights = "on"` stores the matrix as F16: refused at load, saying so.
#[test]
fn a_weight_that_overflows_f16_storage_is_refused() {
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let bad = crafted(dir.path(), "wide.gguf", &supertonic_fixture(), |e| {
        e.fill_f32("voc.head2.weight", 1e5).unwrap();
    });
    let profile = profile_on(dir.path(), "cpu", &[bad]);
    let mut body = std::fs::read_to_string(&profile).unwrap();
    body.push_str("[policies]\nf16_weights = \"on\"\n");
    std::fs::write(&profile, body).unwrap();
    let out = dir.path().join("o.wav");
    let o = synth(&profile, plugins.path(), "Hello there.", &out, &[]);
    assert_one_line_error(&o, "wide.gguf: tensor 'voc.head2.weight' holds ");
    assert!(stderr(&o).contains(" once stored as f16 (it is f32 in the file: a value beyond the smaller type's range)"), "{}", stderr(&o));
    assert!(!out.exists());
}

/// Finite weights so large that a stage overflows pass the load check; the
/// stage's output check names the stage.
#[test]
fn a_stage_whose_output_overflows_is_named() {
    let plugins = plugins_with(&["cpu"], &["supertonic", "chatterbox"]);
    let dir = tempfile::tempdir().unwrap();
    let huge = 1e38;
    let bad = crafted(dir.path(), "huge.gguf", &supertonic_fixture(), |e| {
        e.fill_f32("voc.head2.weight", huge).unwrap();
    });
    assert_refused(plugins.path(), dir.path(), &[bad], &[], "the vocoder produced ");
    let bad = crafted(dir.path(), "huge-te.gguf", &supertonic_fixture(), |e| {
        e.fill_f32("te.attn.0.o.bias", huge).unwrap();
    });
    assert_refused(plugins.path(), dir.path(), &[bad], &[], "the text encoder produced ");
    let [t3, s3] = <[PathBuf; 2]>::try_from(chatterbox_fixture()).unwrap();
    let bad_t3 = crafted(dir.path(), "t3-huge.gguf", &t3, |e| {
        e.fill_f32("t3.speech_head.weight", huge).unwrap();
    });
    assert_refused(plugins.path(), dir.path(), &[bad_t3, s3.clone()], &["max_new_tokens=20"], "T3 produced ");
    let bad_s3 = crafted(dir.path(), "s3-huge.gguf", &s3, |e| {
        e.fill_f32("hift.conv_post.weight", huge).unwrap();
    });
    assert_refused(plugins.path(), dir.path(), &[t3, bad_s3], &["max_new_tokens=20"], "HiFT produced ");
}

fn style_json(ttl: &dyn Fn(usize) -> String, dp: &dyn Fn(usize) -> String) -> String {
    let join = |n: usize, f: &dyn Fn(usize) -> String| (0..n).map(f).collect::<Vec<_>>().join(",");
    format!(
        r#"{{"style_ttl":{{"dims":[1,50,256],"type":"float32","data":[{}]}},"style_dp":{{"dims":[1,8,16],"type":"float32","data":[{}]}}}}"#,
        join(50 * 256, ttl),
        join(128, dp)
    )
}

/// The probe's cases: one style value of 1e39 (beyond f32) gave an all-zero
/// WAV, `style_dp` at 1e30 a WAV of 0 samples. Both name the file and value.
#[test]
fn supertonic_voice_style_values_out_of_range_name_the_file() {
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let plain = |i: usize| format!("{}", ((i as f32) * 0.37).sin() * 0.5);
    let cases: [(&str, String, &str); 3] = [
        ("inf.json", style_json(&|i| if i == 7 { "1e39".into() } else { plain(i) }, &plain), "style_ttl value 7 is beyond f32's range"),
        ("dp.json", style_json(&plain, &|_| "1e30".into()), "style_dp value 0 is 1e30 (allowed: magnitudes up to 1e4)"),
        ("neg.json", style_json(&plain, &|i| if i == 127 { "-2e4".into() } else { plain(i) }), "style_dp value 127 is -2e4"),
    ];
    for (name, json, want) in cases {
        let voice = dir.path().join(name);
        std::fs::write(&voice, json).unwrap();
        let want = format!("voice file {}: {want}", voice.display());
        assert_refused(plugins.path(), dir.path(), &[supertonic_fixture()], &[&format!("voice={}", voice.display())], &want);
    }
    // The control: the same file with plain values speaks.
    let voice = dir.path().join("plain.json");
    std::fs::write(&voice, style_json(&plain, &plain)).unwrap();
    let profile = profile_on(dir.path(), "cpu", &[supertonic_fixture()]);
    let out = dir.path().join("plain.wav");
    let o = synth(&profile, plugins.path(), "Hello there.", &out, &[&format!("voice={}", voice.display())]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!read_wav(&out).1.is_empty());
}

/// A Multilingual T3 whose tokenizer is smaller than its text vocabulary
/// loads and speaks (the official package runs such a pair); one whose
/// tokenizer can produce an id past the vocabulary is refused at load.
#[test]
fn multilingual_tokenizer_is_judged_by_the_ids_it_can_produce() {
    let plugins = plugins_with(&["cpu"], &["chatterbox"]);
    let dir = tempfile::tempdir().unwrap();
    let mtl = repo().join("tests/fixtures/chatterbox/mtl-tiny");
    let (t3, s3) = (mtl.join("t3-mtl.gguf"), mtl.join("s3gen.gguf"));
    let json: serde_json::Value = serde_json::from_str(&GgufFile::open(&t3).unwrap().get_str("chatterbox.tokenizer_json").unwrap()).unwrap();
    let vocab = json["model"]["vocab"].as_object().unwrap().len();
    // Smaller: the last merge ("e s", id vocab - 1) and its token left out.
    let mut smaller = json.clone();
    assert_eq!(smaller["model"]["vocab"]["es"], vocab - 1);
    smaller["model"]["vocab"].as_object_mut().unwrap().remove("es");
    smaller["model"]["merges"].as_array_mut().unwrap().retain(|m| *m != serde_json::json!(["e", "s"]));
    let small_t3 = crafted(dir.path(), "t3-small-tokenizer.gguf", &t3, |e| {
        e.set_str("chatterbox.tokenizer_json", &smaller.to_string());
    });
    let profile = profile_on(dir.path(), "cpu", &[small_t3, s3.clone()]);
    let out = dir.path().join("small.wav");
    let o = synth(&profile, plugins.path(), "Yes, these messages.", &out, &["language=en", "max_new_tokens=20"]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::remove_file(&out).unwrap();
    // An id one past the last row.
    let mut larger = json.clone();
    larger["model"]["vocab"]["es"] = vocab.into();
    let big_t3 = crafted(dir.path(), "t3-big-tokenizer.gguf", &t3, |e| {
        e.set_str("chatterbox.tokenizer_json", &larger.to_string());
    });
    let want = format!(
        "t3-big-tokenizer.gguf: chatterbox.tokenizer_json: the embedded tokenizer can produce id {vocab} (\"es\"), beyond T3's text vocabulary of {vocab}"
    );
    assert_refused(plugins.path(), dir.path(), &[big_t3, s3], &["language=en"], &want);
}
