//! The restricted `.pt` reader (engine-core/src/model_kit/torch_pickle.rs)
//! on the fixtures tools/pt/make_pt_fixtures.py wrote to tests/fixtures/pt/:
//! values equal what torch read, `conds.pt`'s nested names, malicious pickles
//! refused by name without running their command, and broken files refused
//! with one line naming the file (and the tensor).

use engine_core::model_kit::torch_pickle::{DType, PtFile, Scalar};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/pt").join(name)
}

fn expected(name: &str) -> serde_json::Map<String, serde_json::Value> {
    let text = std::fs::read_to_string(fixture(name)).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn dtype_of(name: &str) -> DType {
    match name {
        "F32" => DType::F32,
        "F16" => DType::F16,
        "BF16" => DType::BF16,
        "I64" => DType::I64,
        "I32" => DType::I32,
        other => panic!("{other}"),
    }
}

/// Every tensor in `json` is in `pt` with its dtype, shape and values.
fn check_against(pt: &PtFile, json: &serde_json::Map<String, serde_json::Value>) -> usize {
    let mut n = 0;
    for (name, want) in json {
        let Some(values) = want.get("values") else { continue };
        let t = pt.tensors().get(name).unwrap_or_else(|| panic!("no tensor {name}"));
        let dtype = dtype_of(want["dtype"].as_str().unwrap());
        assert_eq!(t.dtype, dtype, "{name}");
        let shape: Vec<usize> = want["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
        assert_eq!(t.shape, shape, "{name}");
        let values = values.as_array().unwrap();
        match dtype {
            DType::F32 | DType::F16 | DType::BF16 => {
                // torch's values are f32 (or exact in f32), printed exactly.
                let want: Vec<f32> = values.iter().map(|v| v.as_f64().unwrap() as f32).collect();
                assert_eq!(pt.read_f32(name).unwrap(), want, "{name}");
            }
            _ => {
                let want: Vec<i64> = values.iter().map(|v| v.as_i64().unwrap()).collect();
                assert_eq!(pt.read_i64(name).unwrap(), want, "{name}");
            }
        }
        n += 1;
    }
    n
}

#[test]
fn a_state_dict_reads_as_torch_wrote_it() {
    let pt = PtFile::open(&fixture("state_dict.pt")).unwrap();
    let names: Vec<&str> = pt.tensors().keys().map(String::as_str).collect();
    assert_eq!(names, ["weight", "bias", "f16", "bf16", "ids", "i32", "base", "base_t", "base_tail", "scalar", "param"]);
    assert_eq!(check_against(&pt, &expected("state_dict.json")), 11);

    // The two views share `base`'s storage: transposed, and offset.
    let t = pt.tensors();
    assert_eq!(t["base_t"].storage, t["base"].storage);
    assert_eq!((t["base_t"].shape.clone(), t["base_t"].strides.clone(), t["base_t"].offset), (vec![6, 4], vec![1, 6], 0));
    assert_eq!((t["base_tail"].shape.clone(), t["base_tail"].strides.clone(), t["base_tail"].offset), (vec![3, 4], vec![6, 1], 8));
    assert_eq!(t["scalar"].shape, Vec::<usize>::new());
    assert_eq!(pt.read_bytes("bf16").unwrap().len(), 10);
    let e = pt.read_f32("ids").unwrap_err().to_string();
    assert_eq!(e, format!("{}: tensor 'ids' is I64, not a float tensor", fixture("state_dict.pt").display()));
    let e = pt.read_f32("nope").unwrap_err().to_string();
    assert_eq!(e, format!("{}: no tensor 'nope'", fixture("state_dict.pt").display()));
}

#[test]
fn conds_pt_as_conditionals_save_writes_it() {
    let pt = PtFile::open(&fixture("conds.pt")).unwrap();
    let names: Vec<&str> = pt.tensors().keys().map(String::as_str).collect();
    assert_eq!(
        names,
        ["t3.speaker_emb", "t3.cond_prompt_speech_tokens", "t3.emotion_adv", "gen.prompt_token", "gen.prompt_token_len", "gen.prompt_feat", "gen.embedding"]
    );
    assert_eq!(check_against(&pt, &expected("conds.json")), 7);
    let absent: Vec<(&str, &Scalar)> = pt.values().iter().map(|(k, v)| (k.as_str(), v)).collect();
    assert_eq!(absent, [("t3.clap_emb", &Scalar::None), ("t3.cond_prompt_speech_emb", &Scalar::None), ("gen.prompt_feat_len", &Scalar::None)]);
}

/// A copy of the malicious fixture `name` whose command touches a file in
/// `dir` (same length as the command it carries, so the pickle stays valid); returns
/// the copy and the file the command would create.
fn armed(name: &str, dir: &Path) -> (PathBuf, PathBuf) {
    let marker = dir.join("ran");
    let pad = |cmd: String| format!("{cmd:<200}");
    let (from, to) = (pad("touch MARKER".into()), pad(format!("touch {}", marker.display())));
    assert_eq!(from.len(), to.len());
    let mut src = zip::ZipArchive::new(std::fs::File::open(fixture(name)).unwrap()).unwrap();
    let out = dir.join(name);
    let mut dst = zip::ZipWriter::new(std::fs::File::create(&out).unwrap());
    let mut replaced = false;
    for i in 0..src.len() {
        let mut entry = src.by_index(i).unwrap();
        let entry_name = entry.name().unwrap().into_owned();
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).unwrap();
        if entry_name.ends_with("/data.pkl") {
            if let Some(at) = bytes.windows(from.len()).position(|w| w == from.as_bytes()) {
                bytes[at..at + from.len()].copy_from_slice(to.as_bytes());
                replaced = true;
            }
        }
        let options = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
        dst.start_file(entry_name, options).unwrap();
        dst.write_all(&bytes).unwrap();
    }
    dst.finish().unwrap();
    assert!(replaced, "{name} carries no command to replace");
    (out, marker)
}

#[test]
fn malicious_pickles_are_refused_by_name_and_run_nothing() {
    for (name, global) in [("os_system.pt", "os.system"), ("builtins_eval.pt", "builtins.eval"), ("posix_system.pt", "posix.system")] {
        let dir = tempfile::tempdir().unwrap();
        let (pt, marker) = armed(name, dir.path());
        let e = PtFile::open(&pt).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{}: ", pt.display())), "{e}");
        assert!(e.contains(&format!("refused global {global}")), "{e}");
        assert!(!e.contains('\n'), "{e}");
        assert!(!marker.exists(), "{name}: the command ran");
    }
}

/// A zip laid out as torch.save writes it, holding `pickle` as its data.pkl.
fn with_pickle(dir: &Path, pickle: &[u8]) -> PathBuf {
    let path = dir.join("made.pt");
    let mut z = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
    let options = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    z.start_file("archive/data.pkl", options).unwrap();
    z.write_all(pickle).unwrap();
    z.finish().unwrap();
    path
}

fn refusal(path: &Path) -> String {
    let e = PtFile::open(path).unwrap_err().to_string();
    assert!(e.starts_with(&format!("{}: ", path.display())), "{e}");
    assert!(!e.contains('\n'), "{e}");
    e
}

#[test]
fn broken_checkpoints_are_one_line_errors_naming_file_and_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(fixture("state_dict.pt")).unwrap();

    let truncated = dir.path().join("truncated.pt");
    std::fs::write(&truncated, &good[..good.len() / 2]).unwrap();
    assert!(refusal(&truncated).contains("not a torch zip checkpoint"));

    let garbage = dir.path().join("garbage.pt");
    std::fs::write(&garbage, (0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect::<Vec<_>>()).unwrap();
    assert!(refusal(&garbage).contains("not a torch zip checkpoint"));

    let empty = dir.path().join("empty.pt");
    std::fs::write(&empty, b"").unwrap();
    assert!(refusal(&empty).contains("not a torch zip checkpoint"));

    assert!(refusal(&fixture("missing_pkl.pt")).ends_with("no data.pkl in the archive: not a torch.save checkpoint"));

    let e = refusal(&fixture("short_storage.pt"));
    assert!(e.contains("tensor 'base': ") && e.contains("the storage is too short"), "{e}");

    let e = refusal(&fixture("huge_shape.pt"));
    assert!(e.contains("tensor 'huge': shape [1099511627776] of F32 needs more bytes than the whole file holds"), "{e}");

    let e = refusal(&fixture("huge_string.pt"));
    assert!(e.contains("truncated pickle: needs 2147483648 bytes"), "{e}");

    // A directory is not read.
    let e = PtFile::open(dir.path()).unwrap_err().to_string();
    assert_eq!(e, format!("{} is a directory, not a regular file", dir.path().display()));
}

#[test]
fn hostile_pickles_stay_bounded() {
    let dir = tempfile::tempdir().unwrap();
    // Lists each holding the one below twice: 2^levels nodes if walked
    // naively. 40 levels stay within the depth limit and stop at the visit
    // bound; 80 stop at the depth limit.
    for (levels, says) in [(40u8, "shared more often than its size allows"), (80, "nests deeper than 64 levels")] {
        let mut p = b"\x80\x02]q\x000".to_vec();
        for level in 1..=levels {
            // [memo[level-1], memo[level-1]] as memo[level], popped.
            p.extend_from_slice(&[b']', b'(', b'h', level - 1, b'h', level - 1, b'e', b'q', level, b'0']);
        }
        p.extend_from_slice(&[b'}', b'X', 1, 0, 0, 0, b'a', b'h', levels, b's', b'.']);
        let e = refusal(&with_pickle(dir.path(), &p));
        assert!(e.contains(says), "{e}");
    }
    // A list that holds itself: the walk stops at whichever bound comes first.
    let e = refusal(&with_pickle(dir.path(), b"\x80\x02}X\x01\x00\x00\x00a]q\x00h\x00as."));
    assert!(e.contains("nests deeper than 64 levels") || e.contains("shared more often"), "{e}");

    // An unknown opcode, a memo read of nothing, STOP with a mark left.
    for (pickle, says) in [
        (&b"\x80\x02i__main__\nX\n."[..], "opcode 0x69"),
        (b"\x80\x02h\x07.", "memo entry 7, which was never written"),
        (b"\x80\x02(}.", "values on the stack at STOP"),
        (b"\x80\x02}", "no STOP"),
        (b"\x80\x02N.", "top object is not a dict"),
        (b"\x80\x02ctorch\nFloatStorage\n)R.", "torch.FloatStorage is not callable"),
        (b"\x80\x02ccollections\nOrderedDict\n(]tR.", "OrderedDict called with arguments"),
        (b"\x80\x02cposix\nsystem\n.", "refused global posix.system"),
        (b"\x80\x02X\x05\x00\x00\x00torchX\x04\x00\x00\x00eval\x93.", "refused global torch.eval"),
        (
            b"\x80\x02}(X\x01\x00\x00\x00a(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQ\
              X\x01\x00\x00\x00b(X\x07\x00\x00\x00storagectorch\nLongStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQu.",
            "storage 0 is declared as both 4 F32 and 4 I64 elements",
        ),
        (
            b"\x80\x02(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x04\x00\x00\x00../xX\x03\x00\x00\x00cpuK\x04tQ.",
            "storage key \"../x\" is not a plain name",
        ),
    ] {
        let e = refusal(&with_pickle(dir.path(), pickle));
        assert!(e.contains(says), "{e}");
    }
}

/// The tiny official-format checkpoints tools/chatterbox/make_mtl_fixtures.py
/// writes (seeded, so the values are fixed); not committed, so skipped
/// where absent.
#[test]
fn the_tiny_multilingual_checkpoints_read_as_torch_reads_them() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/chatterbox-fixtures/mtl-tiny");
    if !dir.join("s3gen.pt").exists() {
        eprintln!("skipped: {} is absent (tools/chatterbox/make_mtl_fixtures.py writes it)", dir.display());
        return;
    }
    let conds = PtFile::open(&dir.join("conds.pt")).unwrap();
    assert_eq!((conds.tensors().len(), conds.values().len()), (7, 3));
    let emb = conds.read_f32("gen.embedding").unwrap();
    assert_eq!(emb.len(), 192);
    assert_eq!(emb[..4], [-0.15741698, 0.9089788, -0.086_092_14, -1.4611504]);
    let sum: f64 = emb.iter().map(|&v| v as f64).sum();
    assert!((sum - -8.40640542213805).abs() < 1e-9, "{sum}");

    let s3gen = PtFile::open(&dir.join("s3gen.pt")).unwrap();
    assert_eq!(s3gen.tensors().len(), 1494);
    assert_eq!(s3gen.read_f32("mel2wav.f0_predictor.classifier.bias").unwrap(), [-0.11124028]);
    for name in s3gen.tensors().keys() {
        assert_eq!(s3gen.read_bytes(name).unwrap().len(), s3gen.tensors()[name].numel() * s3gen.tensors()[name].dtype.size());
    }

    let ve = PtFile::open(&dir.join("ve.pt")).unwrap();
    assert_eq!(ve.tensors().len(), 16);
    let bias = ve.read_f32("proj.bias").unwrap();
    assert_eq!(bias.len(), 256);
    assert_eq!(bias[..4], [-0.19622298, 0.19522092, 0.029902654, 0.12728061]);
}
