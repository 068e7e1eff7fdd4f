//! The native converter against tools/supertonic/convert.py: the committed
//! official-format tiny bundles convert to the committed GGUFs byte for byte,
//! every storage gives the bytes the Python converter gives (run here when
//! its venv exists; the committed SHA-256s of its outputs cover CI), and
//! hostile bundles are one-line errors that leave no file behind.

mod common;

use common::repo_root;
use engine_core::abi::{option_list, OptionList, OptionValue};
use engine_core::model_kit::convert::onnx::proto::{ModelProto, TensorProto};
use prost::Message;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;
use tts_model_supertonic::convert::{convert, ConvertedFile};

fn fixture(config: &str) -> PathBuf {
    repo_root().join("tests/fixtures/supertonic").join(config)
}

fn options(pairs: &[(&str, &str)]) -> OptionList {
    option_list(pairs.iter().map(|(k, v)| (k.to_string(), OptionValue::Str((*v).into()))))
}

fn sha256(path: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(path).unwrap()))
}

/// Panics with the first differing offset, and the first tensor whose bytes
/// differ (or "metadata" when every tensor is equal).
fn assert_same_bytes(got: &Path, want: &Path) {
    let (a, b) = (std::fs::read(got).unwrap(), std::fs::read(want).unwrap());
    if a == b {
        return;
    }
    let offset = a.iter().zip(&b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
    let (ta, tb) = (ggml_sys::gguf::GgufTensors::open(got), ggml_sys::gguf::GgufTensors::open(want));
    let mut place = "the header or metadata".to_string();
    if let (Ok(ta), Ok(tb)) = (ta, tb) {
        let (ia, ib) = (ta.file.tensors(), tb.file.tensors());
        let names_a: Vec<&str> = ia.iter().map(|t| t.name.as_str()).collect();
        let names_b: Vec<&str> = ib.iter().map(|t| t.name.as_str()).collect();
        if names_a != names_b {
            place = "the tensor list".into();
        } else if let Some(t) = ia.iter().find(|t| ta.read_bytes(&t.name).ok() != tb.read_bytes(&t.name).ok()) {
            place = format!("tensor {}", t.name);
        }
    }
    panic!("{} differs from {} at byte {offset} ({} vs {} bytes; first difference in {place})", got.display(), want.display(), a.len(), b.len());
}

fn convert_into(dir: &Path, config: &str, opts: &[(&str, &str)]) -> Vec<ConvertedFile> {
    convert(&fixture(config).join("official"), dir, &options(opts)).unwrap_or_else(|e| panic!("{config} {opts:?}: {e}"))
}

#[test]
fn tiny_bundles_convert_to_the_committed_ggufs() {
    for (config, version) in [("tiny-v2", "v2"), ("tiny-v3", "v3")] {
        let dir = tempfile::tempdir().unwrap();
        let files = convert_into(dir.path(), config, &[]);
        let path = dir.path().join(format!("supertonic-{version}.gguf"));
        let tensors = if version == "v2" { 308 } else { 312 };
        assert_eq!(files, vec![ConvertedFile { path: path.clone(), summary: format!("Supertonic {version}, {tensors} tensors, voices F1, M1") }]);
        assert_same_bytes(&path, &fixture(config).join("model.gguf"));
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 1, "only the GGUF is left: {left:?}");
    }
}

/// The tiny v1 bundle (tiny-v2's graphs as the English-only release) has
/// no committed GGUF: its conversion is checked against digests below.
#[test]
fn tiny_v1_converts_as_v1() {
    let dir = tempfile::tempdir().unwrap();
    let files = convert_into(dir.path(), "tiny-v1", &[]);
    let path = dir.path().join("supertonic-v1.gguf");
    assert_eq!(files[0].summary, "Supertonic v1, 308 tensors, voices F1, M1");
    let gguf = ggml_sys::gguf::GgufFile::open(&path).unwrap();
    assert_eq!(gguf.get_str("supertonic.version").unwrap(), "v1");
    assert_eq!(gguf.get_str("supertonic.text.language_wrap").unwrap(), "none");
    assert_eq!(gguf.get_str_array("supertonic.text.languages").unwrap(), vec!["en".to_string()]);
    assert!(gguf.get_str("supertonic.text.short_chunk_languages").is_err(), "an empty string is left out, as gguf-py does");
}

/// SHA-256 of what convert.py writes from the tiny bundles per storage
/// (`--weights W`; `f16-keep`: `--weights f16 --keep-f32 've.block.*' --keep-f32 'dp.pred.*'`).
const PYTHON_DIGESTS: &[(&str, &str, &str)] = &[
    ("tiny-v1", "f32", "18be50429117e42146c1b297c55f6637f750b13d6d842991a03aa3f02b346eaf"),
    ("tiny-v1", "f16", "1df395c49f9a2b50f8c5479c940034d262c0fd0e7a449fc8831e2ccff065522e"),
    ("tiny-v1", "bf16", "937f24ea664ac4838321999ffd0148d0990aaf07ae1b14a2329bc5fbc7121716"),
    ("tiny-v1", "q8_0", "57ff5ff749ca6522978897b332f48376bb2c4901b56cbd19d235b34c6ba946f1"),
    ("tiny-v2", "f32", "8066ed913ec3b91fe45131401c1c185897bd6969cbe2d00b5edf5c47a68ef141"),
    ("tiny-v2", "f16", "c456e221499f59bf050f3f2018d743c2ed19e40ca7276c49842ce80acf72afba"),
    ("tiny-v2", "bf16", "8b6bedeeafe12ae24f6a95d8ba58f48b20dd141f29a6c405209da97ec52d613a"),
    ("tiny-v2", "q8_0", "eef1f36ad53171863da568e3eef811e94a7869dce5034dbd6f4e147f1afed7e2"),
    ("tiny-v2", "f16-keep", "49249563b62988bb5761bdec038c3983eb6e52a5f05e75e8ad4e7fff5824be15"),
    ("tiny-v3", "f32", "6b21305d35087d9467ea64d4295ea6d3d38a0f3b1b53167a047d99030e61ddfa"),
    ("tiny-v3", "f16", "d2ed0e0f1ae506d4e3eaa6ee774b2bac23674e3b81de655c2116e635bd47c1f4"),
    ("tiny-v3", "bf16", "edb8a21db928f7c428b01b0eb21fccaa7ac18672f06a54ffc3190c974e79b534"),
    ("tiny-v3", "q8_0", "0b238ce7b2748975b25dded4c505bbd1fa506169475848de4e7232cf3757e0c7"),
    ("tiny-v3", "f16-keep", "182074abc1a3af7fc44801f6c6c51a024717514d97796c58f9658f4924744c79"),
];

fn storage_options(storage: &str) -> (Vec<(&'static str, &'static str)>, Vec<&'static str>) {
    match storage {
        "f16-keep" => {
            (vec![("weights", "f16"), ("keep_f32", "ve.block.*, dp.pred.*")], vec!["--weights", "f16", "--keep-f32", "ve.block.*", "--keep-f32", "dp.pred.*"])
        }
        "f32" => (vec![("weights", "f32")], vec!["--weights", "f32"]),
        "f16" => (vec![("weights", "f16")], vec!["--weights", "f16"]),
        "bf16" => (vec![("weights", "bf16")], vec!["--weights", "bf16"]),
        _ => (vec![("weights", "q8_0")], vec!["--weights", "q8_0"]),
    }
}

#[test]
fn every_storage_matches_the_python_converter() {
    let python = repo_root().join("target/chatterbox-venv/bin/python");
    if !python.exists() {
        eprintln!("skipping the live Python comparison: {} is absent (the committed digests are still checked)", python.display());
    }
    for &(config, storage, digest) in PYTHON_DIGESTS {
        let dir = tempfile::tempdir().unwrap();
        let (native, flags) = storage_options(storage);
        let files = convert_into(dir.path(), config, &native);
        let got = &files[0].path;
        if python.exists() {
            let want = dir.path().join("python.gguf");
            let status = Command::new(&python)
                .arg(repo_root().join("tools/supertonic/convert.py"))
                .arg(fixture(config).join("official"))
                .arg(&want)
                .args(&flags)
                .stdout(std::process::Stdio::null())
                .status()
                .unwrap();
            assert!(status.success(), "convert.py {config} {storage}");
            assert_same_bytes(got, &want);
            assert_eq!(sha256(&want), digest, "{config} {storage}: the Python converter's output changed; update PYTHON_DIGESTS");
        }
        assert_eq!(sha256(got), digest, "{config} {storage}");
    }
}

/// Full-size random bundles (tools/supertonic/make_bundle.py --config v2|v3,
/// 250 and 400 MB of ONNX) against convert.py, every storage: run with
/// `TTS_SUPERTONIC_FULL=1` where the venv exists (about a minute in a release
/// build); skipped otherwise.
#[test]
fn full_size_bundles_match_the_python_converter() {
    let python = repo_root().join("target/chatterbox-venv/bin/python");
    if std::env::var_os("TTS_SUPERTONIC_FULL").is_none() || !python.exists() {
        eprintln!("skipping the full-size comparison: set TTS_SUPERTONIC_FULL=1 with {} present", python.display());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for config in ["v2", "v3"] {
        let bundle = dir.path().join(config);
        let status = Command::new(&python)
            .arg(repo_root().join("tools/supertonic/make_bundle.py"))
            .args(["--config", config, "--seed", "0", "--out"])
            .arg(&bundle)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "make_bundle.py --config {config}");
        for storage in ["f32", "f16", "bf16", "q8_0"] {
            let out = dir.path().join(format!("{config}-{storage}"));
            let files = convert(&bundle, &out, &options(&[("weights", storage)])).unwrap();
            let want = out.join("python.gguf");
            let status = Command::new(&python)
                .arg(repo_root().join("tools/supertonic/convert.py"))
                .arg(&bundle)
                .arg(&want)
                .args(["--weights", storage])
                .stdout(std::process::Stdio::null())
                .status()
                .unwrap();
            assert!(status.success(), "convert.py {config} {storage}");
            assert_same_bytes(&files[0].path, &want);
            std::fs::remove_dir_all(&out).unwrap();
        }
    }
}

/// A copy of the tiny v2 bundle that a test may spoil.
fn bundle_copy(dir: &Path) -> PathBuf {
    let src = fixture("tiny-v2").join("official");
    let dst = dir.join("bundle");
    for sub in ["onnx", "voice_styles"] {
        std::fs::create_dir_all(dst.join(sub)).unwrap();
        for entry in std::fs::read_dir(src.join(sub)).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dst.join(sub).join(entry.file_name())).unwrap();
        }
    }
    dst
}

/// The one-line error of converting `bundle` into a fresh `out`, which must stay empty.
fn convert_err(dir: &Path, bundle: &Path, opts: &[(&str, &str)]) -> String {
    let out = dir.join("out");
    let e = match convert(bundle, &out, &options(opts)) {
        Ok(files) => panic!("converted: {files:?}"),
        Err(e) => e.to_string(),
    };
    assert!(!e.contains('\n'), "{e}");
    let left: Vec<_> = std::fs::read_dir(&out).map(|d| d.map(|e| e.unwrap().file_name()).collect()).unwrap_or_default();
    assert!(left.is_empty(), "{e}: left {left:?}");
    e
}

/// Rewrites one graph of `bundle` with `edit` applied to its model.
fn edit_graph(bundle: &Path, graph: &str, edit: impl FnOnce(&mut ModelProto)) -> PathBuf {
    let path = bundle.join("onnx").join(format!("{graph}.onnx"));
    let mut model = ModelProto::decode(std::fs::read(&path).unwrap().as_slice()).unwrap();
    edit(&mut model);
    std::fs::write(&path, model.encode_to_vec()).unwrap();
    path
}

#[test]
fn an_unnamed_or_unexpected_initializer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = bundle_copy(dir.path());
    // An anonymous MatMul weight that feeds nothing cannot be named.
    let path = edit_graph(&bundle, "text_encoder", |m| {
        let g = m.graph.as_mut().unwrap();
        g.initializer.push(TensorProto { name: "onnx::MatMul_9999".into(), dims: vec![2, 2], data_type: 1, float_data: vec![0.0; 4], ..Default::default() });
    });
    assert_eq!(convert_err(dir.path(), &bundle, &[]), format!("{}: cannot name onnx::MatMul_9999: its MatMul has no named bias", path.display()));

    let bundle = bundle_copy(&dir.path().join("second"));
    let path = edit_graph(&bundle, "vocoder", |m| {
        let g = m.graph.as_mut().unwrap();
        g.initializer.push(TensorProto { name: "onnx::Conv_9999".into(), dims: vec![1], data_type: 1, float_data: vec![0.0], ..Default::default() });
    });
    assert_eq!(convert_err(dir.path(), &bundle, &[]), format!("{}: onnx::Conv_9999 feeds no Conv", path.display()));

    // A second input convolution makes the vocoder's embedding ambiguous.
    let bundle = bundle_copy(&dir.path().join("third"));
    let path = edit_graph(&bundle, "vocoder", |m| {
        let g = m.graph.as_mut().unwrap();
        let w = g
            .initializer
            .iter()
            .find(|t| t.name.ends_with("embed.net.weight") || (t.dims.len() == 3 && t.dims[1] == 24 && !t.name.contains("convnext")))
            .unwrap()
            .clone();
        g.initializer.push(TensorProto { name: "tts.ae.extra.weight".into(), ..w });
    });
    let e = convert_err(dir.path(), &bundle, &[]);
    assert!(e.starts_with(&format!("{}: expected one input convolution, found [", path.display())), "{e}");
    assert!(e.ends_with("\"tts.ae.extra.weight\"]"), "{e}");

    // A weight of the wrong rank: a one-line error, not a panic.
    let bundle = bundle_copy(&dir.path().join("rank"));
    let path = edit_graph(&bundle, "duration_predictor", |m| {
        let g = m.graph.as_mut().unwrap();
        let t = g.initializer.iter_mut().find(|t| t.name == "tts.dp.sentence_encoder.attn_encoder.attn_layers.0.emb_rel_k").unwrap();
        *t = TensorProto { name: t.name.clone(), dims: vec![3], data_type: 1, float_data: vec![0.0; 3], ..Default::default() };
    });
    assert_eq!(convert_err(dir.path(), &bundle, &[]), format!("{}: dp.attn.0.rel_k has shape [], no axis 0", path.display()));

    // A weight the converter needs, missing.
    let bundle = bundle_copy(&dir.path().join("fourth"));
    let path = edit_graph(&bundle, "duration_predictor", |m| {
        m.graph.as_mut().unwrap().initializer.retain(|t| t.name != "tts.dp.predictor.activation.weight" && !t.name.starts_with("onnx::PRelu_"));
    });
    assert_eq!(convert_err(dir.path(), &bundle, &[]), format!("{}: missing tensor tts.dp.predictor.activation.weight", path.display()));
}

#[test]
fn a_missing_or_truncated_graph_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = bundle_copy(dir.path());
    let vocoder = bundle.join("onnx/vocoder.onnx");
    std::fs::remove_file(&vocoder).unwrap();
    assert_eq!(convert_err(dir.path(), &bundle, &[]), format!("{} is missing", vocoder.display()));

    let bundle = bundle_copy(&dir.path().join("second"));
    let te = bundle.join("onnx/text_encoder.onnx");
    let bytes = std::fs::read(&te).unwrap();
    std::fs::write(&te, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let e = convert_err(dir.path(), &bundle, &[]);
    assert!(e.starts_with(&format!("{}: not a readable ONNX model (failed to decode Protobuf message: ", te.display())), "{e}");
}

#[test]
fn a_voice_style_of_the_wrong_shape_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = bundle_copy(dir.path());
    let voice = bundle.join("voice_styles/M1.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&voice).unwrap()).unwrap();
    let dims: Vec<usize> = serde_json::from_value(v["style_ttl"]["dims"].clone()).unwrap();
    // One token fewer: the same values, read as [1, tokens - 1, dim] plus one short row.
    let (tokens, dim) = (dims[1], dims[2]);
    let rows = v["style_ttl"]["data"][0].as_array().unwrap()[..tokens - 1].to_vec();
    v["style_ttl"]["data"] = serde_json::json!([rows]);
    v["style_ttl"]["dims"] = serde_json::json!([1, tokens - 1, dim]);
    std::fs::write(&voice, serde_json::to_vec(&v).unwrap()).unwrap();
    assert_eq!(
        convert_err(dir.path(), &bundle, &[]),
        format!("{}: style_ttl [{}, {dim}] does not fit the model ([{tokens}, {dim}])", voice.display(), tokens - 1)
    );
    // Dims that promise more values than the data holds.
    v["style_ttl"]["dims"] = serde_json::json!([1, tokens, dim]);
    std::fs::write(&voice, serde_json::to_vec(&v).unwrap()).unwrap();
    assert_eq!(
        convert_err(dir.path(), &bundle, &[]),
        format!("{}: style_ttl has {} values, dims [1, {tokens}, {dim}] need {}", voice.display(), (tokens - 1) * dim, tokens * dim)
    );
}

#[test]
fn options_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = fixture("tiny-v2").join("official");
    assert_eq!(convert_err(dir.path(), &bundle, &[("weight", "f16")]), "unknown conversion option `weight` (supertonic takes weights, keep_f32)");
    assert_eq!(convert_err(dir.path(), &bundle, &[("weights", "q4_0")]), "weights must be one of f32, f16, bf16, q8_0, got 'q4_0'");
    let e = convert_err(dir.path(), &bundle, &[("keep_f32", "ve.[block")]);
    assert!(e.starts_with("keep_f32: pattern 've.[block' is not a glob ("), "{e}");
    assert_eq!(
        convert_err(dir.path(), &dir.path().join("absent"), &[]),
        format!("{}: not a directory (expected an official Supertonic bundle)", dir.path().join("absent").display())
    );
}
