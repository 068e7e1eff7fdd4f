//! The native converter (src/convert) against tools/chatterbox/convert.py:
//! the committed tiny official-format checkpoints convert to the committed
//! GGUFs byte for byte; every other storage equals what the Python converter
//! writes (run here when its venv exists, else checked against the SHA-256
//! digests in tests/fixtures/chatterbox/convert-digests.json, which a venv
//! run also checks); Nano is detected from its T3 file; and hostile inputs
//! are one-line errors that leave nothing in the output directory.

use engine_core::abi::{option_list, OptionList, OptionValue};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use tts_model_chatterbox::convert::{convert, ConvertedFile};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).unwrap().to_path_buf()
}

fn fixtures() -> PathBuf {
    repo().join("tests/fixtures/chatterbox")
}

fn opts(pairs: &[(&str, &str)]) -> OptionList {
    option_list(pairs.iter().map(|(k, v)| (k.to_string(), OptionValue::Str((*v).into()))))
}

/// The Python converter's interpreter: `TTS_CHATTERBOX_PYTHON`, else the venv
/// of tools/chatterbox/README.md, when it has torch and gguf.
fn python() -> Option<PathBuf> {
    let candidates = std::env::var_os("TTS_CHATTERBOX_PYTHON").map(PathBuf::from).into_iter().chain([repo().join("target/chatterbox-venv/bin/python")]);
    candidates.into_iter().find(|p| Command::new(p).args(["-c", "import torch, gguf, tokenizers"]).output().is_ok_and(|o| o.status.success()))
}

/// Runs convert.py on `ckpt` into `out` with `options` as its flags; its
/// printed lines.
fn python_convert(python: &Path, ckpt: &Path, out: &Path, options: &[(&str, &str)]) -> Vec<String> {
    let mut cmd = Command::new(python);
    cmd.arg(repo().join("tools/chatterbox/convert.py")).arg(ckpt).arg(out);
    for (k, v) in options {
        cmd.arg(format!("--{}", k.replace('_', "-"))).arg(v);
    }
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "convert.py {options:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap().lines().map(String::from).collect()
}

/// Where `offset` falls in GGUF `bytes`: a metadata key, a tensor's info or
/// data, or the header. Enough of the format to name what differs.
fn locate(bytes: &[u8], offset: usize) -> String {
    let mut at = 24usize;
    let rd_u32 = |at: &mut usize| -> Option<u32> {
        let v = u32::from_le_bytes(bytes.get(*at..*at + 4)?.try_into().ok()?);
        *at += 4;
        Some(v)
    };
    let rd_u64 = |at: &mut usize| -> Option<u64> {
        let v = u64::from_le_bytes(bytes.get(*at..*at + 8)?.try_into().ok()?);
        *at += 8;
        Some(v)
    };
    let rd_str = |at: &mut usize| -> Option<String> {
        let n = rd_u64(at)? as usize;
        let s = String::from_utf8_lossy(bytes.get(*at..*at + n)?).into_owned();
        *at += n;
        Some(s)
    };
    fn skip_value(t: u32, at: &mut usize, bytes: &[u8]) -> Option<()> {
        let size = match t {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            10..=12 => 8,
            8 => {
                let n = u64::from_le_bytes(bytes.get(*at..*at + 8)?.try_into().ok()?) as usize;
                *at += 8 + n;
                return Some(());
            }
            9 => {
                let et = u32::from_le_bytes(bytes.get(*at..*at + 4)?.try_into().ok()?);
                let n = u64::from_le_bytes(bytes.get(*at + 4..*at + 12)?.try_into().ok()?);
                *at += 12;
                for _ in 0..n {
                    skip_value(et, at, bytes)?;
                }
                return Some(());
            }
            _ => return None,
        };
        *at += size;
        Some(())
    }
    if offset < 24 {
        return "the header".into();
    }
    let n_tensors = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
    let n_kv = u64::from_le_bytes(bytes[16..24].try_into().unwrap());
    let mut parse = || -> Option<String> {
        for _ in 0..n_kv {
            let start = at;
            let key = rd_str(&mut at)?;
            let t = rd_u32(&mut at)?;
            skip_value(t, &mut at, bytes)?;
            if offset < at {
                return Some(format!("metadata key '{key}' (bytes {start}..{at})"));
            }
        }
        let mut infos = Vec::new();
        for _ in 0..n_tensors {
            let start = at;
            let name = rd_str(&mut at)?;
            let nd = rd_u32(&mut at)?;
            at += 8 * nd as usize;
            let ty = rd_u32(&mut at)?;
            let off = rd_u64(&mut at)?;
            if offset < at {
                return Some(format!("tensor info of '{name}' (bytes {start}..{at})"));
            }
            infos.push((name, ty, off));
        }
        let data = at.div_ceil(32) * 32;
        let rel = offset.checked_sub(data)? as u64;
        let (name, ty, off) = infos.iter().rev().find(|(_, _, off)| *off <= rel)?;
        Some(format!("data of tensor '{name}' (type {ty}, byte {} of it)", rel - off))
    };
    parse().unwrap_or_else(|| "somewhere the parser did not reach".into())
}

/// `got` equals `want` byte for byte, else a failure naming the first
/// differing offset and the key or tensor there.
fn assert_same(got: &Path, want: &Path) {
    let (g, w) = (std::fs::read(got).unwrap(), std::fs::read(want).unwrap());
    if g == w {
        return;
    }
    let first = g.iter().zip(&w).position(|(a, b)| a != b).unwrap_or(g.len().min(w.len()));
    panic!(
        "{} differs from {} at byte {first} ({} bytes vs {}): expected {}, got {}",
        got.display(),
        want.display(),
        g.len(),
        w.len(),
        locate(&w, first),
        locate(&g, first)
    );
}

fn names(files: &[ConvertedFile]) -> Vec<String> {
    files.iter().map(|f| f.path.file_name().unwrap().to_string_lossy().into_owned()).collect()
}

#[test]
fn turbo_fixture_converts_to_the_committed_ggufs() {
    let out = tempfile::tempdir().unwrap();
    let official = fixtures().join("turbo-tiny/official");
    let files = convert(&official, out.path(), &opts(&[("t3_heads", "2"), ("cfm_heads", "2")])).unwrap();
    assert_eq!(names(&files), ["t3-turbo.gguf", "s3gen-meanflow.gguf"]);
    for f in &files {
        assert_same(&f.path, &fixtures().join("turbo-tiny").join(f.path.file_name().unwrap()));
    }
    assert_eq!(files[0].summary, "T3 turbo, 49 tensors");
    assert_eq!(files[1].summary, "S3Gen meanflow, 1294 tensors");
}

#[test]
fn multilingual_fixture_converts_to_the_committed_ggufs() {
    let official = fixtures().join("mtl-tiny/official");
    let base = [("variant", "mtl"), ("t3_heads", "4"), ("cfm_heads", "2"), ("aligned_heads", "2:3,3:1,1:2")];
    let out = tempfile::tempdir().unwrap();
    let files = convert(&official, out.path(), &opts(&base)).unwrap();
    assert_eq!(names(&files), ["t3-mtl.gguf", "s3gen.gguf"]);
    for f in &files {
        assert_same(&f.path, &fixtures().join("mtl-tiny").join(f.path.file_name().unwrap()));
    }
    let out = tempfile::tempdir().unwrap();
    let files = convert(&official, out.path(), &opts(&[base.as_slice(), &[("decoder_weights", "bf16")]].concat())).unwrap();
    assert_same(&files[1].path, &fixtures().join("mtl-tiny/s3gen-bf16-decoder.gguf"));
    assert_eq!(files[1].summary, "S3Gen standard, 1293 tensors, 36 narrowed (matrices f32, decoder bf16)");
}

fn sha256(path: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(path).unwrap()))
}

fn digests_path() -> PathBuf {
    fixtures().join("convert-digests.json")
}

/// The committed digests: case → file name → SHA-256 of convert.py's output.
fn committed_digests() -> BTreeMap<String, BTreeMap<String, String>> {
    serde_json::from_str(&std::fs::read_to_string(digests_path()).unwrap()).unwrap()
}

/// Every case: a name, the official directory (under fixtures, or made by
/// the test), the options, and whether the native run gives no variant.
struct Case {
    name: String,
    dir: PathBuf,
    options: Vec<(&'static str, &'static str)>,
    /// Options the native run leaves out (the variant it must detect).
    native_skips: &'static [&'static str],
}

fn storage_cases(nano_dir: &Path, cangjie_dir: &Path) -> Vec<Case> {
    let mut cases = Vec::new();
    let storages: [&[(&str, &str)]; 4] = [&[("weights", "f16")], &[("weights", "q8_0")], &[("weights", "q4_0")], &[("decoder_weights", "f16")]];
    for (family, dir, base) in [
        ("turbo", fixtures().join("turbo-tiny/official"), vec![("t3_heads", "2"), ("cfm_heads", "2")]),
        ("mtl", fixtures().join("mtl-tiny/official"), vec![("variant", "mtl"), ("t3_heads", "4"), ("cfm_heads", "2"), ("aligned_heads", "2:3,3:1,1:2")]),
    ] {
        for storage in storages {
            let options: Vec<_> = base.iter().copied().chain(storage.iter().copied()).collect();
            let label = storage.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
            cases.push(Case { name: format!("{family} {label}"), dir: dir.clone(), options, native_skips: &[] });
        }
    }
    for storage in [&[][..], &[("weights", "q4_0")][..]] {
        let options: Vec<_> = [("variant", "nano"), ("t3_heads", "2"), ("cfm_heads", "2")].into_iter().chain(storage.iter().copied()).collect();
        let label = storage.iter().map(|(k, v)| format!(",{k}={v}")).collect::<String>();
        cases.push(Case { name: format!("nano detected{label}"), dir: nano_dir.to_path_buf(), options, native_skips: &["variant"] });
    }
    // Multilingual with the Cangjie table beside it: embedded in T3.
    let mtl = vec![("variant", "mtl"), ("t3_heads", "4"), ("cfm_heads", "2"), ("aligned_heads", "2:3,3:1,1:2")];
    cases.push(Case { name: "mtl with Cangjie5_TC.json".into(), dir: cangjie_dir.to_path_buf(), options: mtl, native_skips: &[] });
    cases
}

/// A copy of the Multilingual directory with a small `Cangjie5_TC.json`
/// (tab-separated character and code, as the official file; a line ending
/// in CR LF, which both converters read as LF).
fn cangjie_dir(parent: &Path) -> PathBuf {
    let dir = copy_official("mtl-tiny", &parent.join("cangjie"));
    std::fs::write(dir.join("Cangjie5_TC.json"), "日\ta\r\n月\tb\n\"\t\\\n").unwrap();
    dir
}

/// A copy of the Turbo directory as Nano ships it: `t3_nano_v1.safetensors`.
fn nano_dir(parent: &Path) -> PathBuf {
    let dir = parent.join("nano");
    std::fs::create_dir(&dir).unwrap();
    for entry in std::fs::read_dir(fixtures().join("turbo-tiny/official")).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().replace("t3_turbo_v1", "t3_nano_v1");
        std::fs::copy(entry.path(), dir.join(name)).unwrap();
    }
    dir
}

#[test]
fn every_storage_equals_the_python_converter() {
    let tmp = tempfile::tempdir().unwrap();
    let nano = nano_dir(tmp.path());
    std::fs::create_dir(tmp.path().join("cangjie")).unwrap();
    let cangjie = cangjie_dir(tmp.path());
    let committed = committed_digests();
    let python = python();
    if python.is_none() {
        eprintln!("no Python converter venv (target/chatterbox-venv or TTS_CHATTERBOX_PYTHON): checking against {}", digests_path().display());
    }
    let mut from_python = BTreeMap::new();
    for (i, case) in storage_cases(&nano, &cangjie).iter().enumerate() {
        let native_out = tmp.path().join(format!("native{i}"));
        let native_options: Vec<_> = case.options.iter().filter(|(k, _)| !case.native_skips.contains(k)).copied().collect();
        let files = convert(&case.dir, &native_out, &opts(&native_options)).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let want = committed.get(&case.name).unwrap_or_else(|| panic!("{}: no digests for case '{}'", digests_path().display(), case.name));
        let mut digests = BTreeMap::new();
        let py_out = tmp.path().join(format!("python{i}"));
        if let Some(python) = &python {
            // The same summary lines, but for the directory.
            let lines = python_convert(python, &case.dir, &py_out, &case.options);
            let native: Vec<String> = files.iter().map(|f| format!("{}: {}", py_out.join(f.path.file_name().unwrap()).display(), f.summary)).collect();
            assert_eq!(native, lines, "{}", case.name);
        }
        for f in &files {
            let file = f.path.file_name().unwrap().to_string_lossy().into_owned();
            if python.is_some() {
                assert_same(&f.path, &py_out.join(&file));
                digests.insert(file.clone(), sha256(&py_out.join(&file)));
            }
            let got = sha256(&f.path);
            assert_eq!(Some(&got), want.get(&file), "{}: {file}: the native output's SHA-256 is not the committed digest of convert.py's", case.name);
        }
        assert_eq!(want.len(), files.len(), "{}", case.name);
        from_python.insert(case.name.clone(), digests);
    }
    if python.is_some() {
        assert_eq!(from_python, committed, "{} is stale: convert.py now writes other bytes", digests_path().display());
    }
}

/// A private copy of the official directory `which` (turbo-tiny or mtl-tiny).
fn copy_official(which: &str, parent: &Path) -> PathBuf {
    let dir = parent.join("official");
    std::fs::create_dir(&dir).unwrap();
    for entry in std::fs::read_dir(fixtures().join(which).join("official")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    dir
}

/// Converting `dir` into a fresh `out` fails with exactly `want` (one line),
/// and `out` holds nothing afterwards.
fn refused(dir: &Path, options: &[(&str, &str)], want: &str) {
    let out = dir.parent().unwrap().join("out");
    let e = convert(dir, &out, &opts(options)).unwrap_err().to_string();
    assert_eq!(e, want);
    assert!(!e.contains('\n'), "{e}");
    let left: Vec<_> = std::fs::read_dir(&out).map(|d| d.map(|e| e.unwrap().file_name()).collect()).unwrap_or_default();
    assert!(left.is_empty(), "{want}: left {left:?} in the output directory");
}

/// `path` rewritten with tensor `name` replaced by `dtype` data of `shape`.
fn replace_tensor(path: &Path, name: &str, dtype: safetensors::Dtype, shape: &[usize]) {
    use safetensors::tensor::{SafeTensors, TensorView};
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let size = shape.iter().product::<usize>() * dtype.bitsize() / 8;
    let filler = vec![0u8; size];
    let mut views = Vec::new();
    for (n, view) in st.tensors() {
        if n == name {
            views.push((n, TensorView::new(dtype, shape.to_vec(), &filler).unwrap()));
        } else {
            views.push((n, view));
        }
    }
    let out = safetensors::tensor::serialize(views, None).unwrap();
    std::fs::write(path, out).unwrap();
}

const TURBO: [(&str, &str); 2] = [("t3_heads", "2"), ("cfm_heads", "2")];

#[test]
fn missing_files_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_official("turbo-tiny", tmp.path());
    std::fs::remove_file(dir.join("s3gen_meanflow.safetensors")).unwrap();
    refused(&dir, &TURBO, &format!("{}: none of s3gen_meanflow.safetensors", dir.display()));
    std::fs::remove_file(dir.join("ve.safetensors")).unwrap();
    refused(&dir, &TURBO, &format!("{}: none of ve.safetensors, ve.pt", dir.display()));
    std::fs::remove_file(dir.join("conds.pt")).unwrap();
    refused(&dir, &TURBO, &format!("{} is missing", dir.join("conds.pt").display()));
    std::fs::remove_file(dir.join("t3_turbo_v1.safetensors")).unwrap();
    refused(
        &dir,
        &TURBO,
        &format!(
            "{}: no T3 checkpoint (t3_turbo_v1.safetensors, t3_nano_v1.safetensors, t3_mtl23ls_v2.safetensors or t3_mtl23ls_v3.safetensors); is this an official Chatterbox directory?",
            dir.display()
        ),
    );
    let nowhere = tmp.path().join("nowhere");
    let e = convert(&nowhere, &tmp.path().join("out"), &opts(&[])).unwrap_err().to_string();
    assert_eq!(e, format!("{}: not a directory (an official Chatterbox checkpoint directory)", nowhere.display()));
}

#[test]
fn wrong_shapes_and_dtypes_are_refused_naming_file_and_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_official("turbo-tiny", tmp.path());
    let t3 = dir.join("t3_turbo_v1.safetensors");
    let good = std::fs::read(&t3).unwrap();
    let name = "tfmr.h.1.attn.c_attn.weight";
    let shape = {
        let st = safetensors::SafeTensors::deserialize(&good).unwrap();
        st.tensor(name).unwrap().shape().to_vec()
    };
    replace_tensor(&t3, name, safetensors::Dtype::F32, &[shape[0], shape[1] + 1]);
    refused(&dir, &TURBO, &format!("{}: tensor '{name}' has shape [{}, {}], expected [{}, {}]", t3.display(), shape[0], shape[1] + 1, shape[0], shape[1]));
    std::fs::write(&t3, &good).unwrap();
    replace_tensor(&t3, name, safetensors::Dtype::I64, &shape);
    refused(&dir, &TURBO, &format!("{}: tensor '{name}' is an integer tensor; the engine reads it as floating-point weights", t3.display()));
    std::fs::write(&t3, &good).unwrap();

    // A weight-normed HiFT kernel whose gain does not match its direction.
    let s3 = dir.join("s3gen_meanflow.safetensors");
    let g = "mel2wav.conv_pre.parametrizations.weight.original0";
    replace_tensor(&s3, g, safetensors::Dtype::F32, &[3, 1, 1]);
    let e = convert(&dir, &tmp.path().join("out"), &opts(&TURBO)).unwrap_err().to_string();
    assert!(e.starts_with(&format!("{}: weight norm of 'mel2wav.conv_pre': gain shape [3, 1, 1] does not match direction shape [", s3.display())), "{e}");
}

#[test]
fn truncated_files_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_official("turbo-tiny", tmp.path());
    for (file, why) in [
        (
            "s3gen_meanflow.safetensors",
            "tensor 'mel2wav.f0_predictor.condnet.8.parametrizations.weight.original1': data offsets [991588, 998500] run past the end of the file's 993398 data bytes (truncated?)",
        ),
        ("t3_turbo_v1.safetensors", "tensor 'speech_head.weight': data offsets [462732, 882764] run past the end of the file's 495050 data bytes (truncated?)"),
        ("conds.pt", "not a torch zip checkpoint (invalid Zip archive: Could not find EOCD)"),
    ] {
        let path = dir.join(file);
        let good = std::fs::read(&path).unwrap();
        std::fs::write(&path, &good[..good.len() / 2]).unwrap();
        refused(&dir, &TURBO, &format!("{}: {why}", path.display()));
        std::fs::write(&path, &good).unwrap();
    }
}

/// tests/fixtures/pt/os_system.pt with the command it carries replaced by a
/// `touch` of a file in `dir` (same length, so the pickle stays valid).
fn armed_os_system(dir: &Path) -> (Vec<u8>, PathBuf) {
    use std::io::{Read, Write};
    let marker = dir.join("ran");
    let pad = |cmd: String| format!("{cmd:<200}");
    let (from, to) = (pad("touch MARKER".into()), pad(format!("touch {}", marker.display())));
    assert_eq!(from.len(), to.len());
    let mut src = zip::ZipArchive::new(std::fs::File::open(repo().join("tests/fixtures/pt/os_system.pt")).unwrap()).unwrap();
    let mut dst = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let mut replaced = false;
    for i in 0..src.len() {
        let mut entry = src.by_index(i).unwrap();
        let name = entry.name().unwrap().into_owned();
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).unwrap();
        if let Some(at) = bytes.windows(from.len()).position(|w| w == from.as_bytes()) {
            bytes[at..at + from.len()].copy_from_slice(to.as_bytes());
            replaced = true;
        }
        dst.start_file(name, zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored)).unwrap();
        dst.write_all(&bytes).unwrap();
    }
    assert!(replaced, "os_system.pt carries no command to replace");
    (dst.finish().unwrap().into_inner(), marker)
}

#[test]
fn a_conds_pt_naming_os_system_is_refused_and_runs_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_official("turbo-tiny", tmp.path());
    let (pt, marker) = armed_os_system(tmp.path());
    let conds = dir.join("conds.pt");
    std::fs::write(&conds, pt).unwrap();
    let out = tmp.path().join("out");
    let e = convert(&dir, &out, &opts(&TURBO)).unwrap_err().to_string();
    assert!(e.starts_with(&format!("{}: ", conds.display())) && e.contains("refused global os.system"), "{e}");
    assert!(!e.contains('\n'), "{e}");
    assert!(!marker.exists(), "the pickle's command ran");
    assert!(!out.exists() || std::fs::read_dir(&out).unwrap().next().is_none());
}

#[test]
fn bad_options_are_refused_before_anything_is_read() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_official("turbo-tiny", tmp.path());
    refused(
        &dir,
        &[("heads", "2")],
        "unknown conversion option `heads` (chatterbox takes variant, weights, decoder_weights, t3_heads, cfm_heads, t3_file, aligned_heads)",
    );
    refused(&dir, &[("weights", "q5_1")], "weights must be one of f32, f16, q8_0, q4_0, got 'q5_1'");
    refused(
        &dir,
        &[("variant", "mtl"), ("t3_file", "t3_other.safetensors")],
        "t3_file t3_other.safetensors: a Multilingual T3 is one of t3_mtl23ls_v2.safetensors, t3_mtl23ls_v3.safetensors",
    );
    // Official widths are multiples of 64-wide heads; the tiny fixture's is not.
    refused(&dir, &[], &format!("{}: GPT-2 width 16 is not a multiple of the head width 64; give t3_heads", dir.join("t3_turbo_v1.safetensors").display()));
}

#[test]
fn a_failed_second_file_leaves_neither() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_official("turbo-tiny", tmp.path());
    let out = tmp.path().join("out");
    // The S3Gen file cannot be renamed into place: a directory holds its name.
    std::fs::create_dir_all(out.join("s3gen-meanflow.gguf")).unwrap();
    let e = convert(&dir, &out, &opts(&TURBO)).unwrap_err().to_string();
    assert!(!e.contains('\n'), "{e}");
    let left: Vec<_> = std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(left, ["s3gen-meanflow.gguf"], "{e}");
}

#[test]
fn nano_is_detected_from_its_t3_file() {
    use tts_model_chatterbox::convert::{convert_with, ConvertOptions, Variant};
    let tmp = tempfile::tempdir().unwrap();
    let dir = nano_dir(tmp.path());
    let options = ConvertOptions { t3_heads: Some(2), cfm_heads: Some(2), ..ConvertOptions::default() };
    let done = convert_with(&dir, &tmp.path().join("first"), &options).unwrap();
    assert_eq!(done.variant, Variant::Nano);
    assert_eq!(names(&done.files), ["t3-nano.gguf", "s3gen-meanflow.gguf"]);
    // Both Turbo and Nano present: which one is meant must be said.
    std::fs::copy(dir.join("t3_nano_v1.safetensors"), dir.join("t3_turbo_v1.safetensors")).unwrap();
    refused(
        &dir,
        &TURBO,
        &format!("{}: holds the T3 checkpoints of several variants (t3_turbo_v1.safetensors, t3_nano_v1.safetensors); give variant", dir.display()),
    );
}

#[test]
fn tokenizer_ids_beyond_the_text_embedding_are_refused_as_convert_py_does() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_official("turbo-tiny", tmp.path());
    let t3 = dir.join("t3_turbo_v1.safetensors");
    let width = {
        let bytes = std::fs::read(&t3).unwrap();
        safetensors::SafeTensors::deserialize(&bytes).unwrap().tensor("text_emb.weight").unwrap().shape()[1]
    };
    // Fewer text-embedding rows than the tokenizer has ids.
    replace_tensor(&t3, "text_emb.weight", safetensors::Dtype::F32, &[100, width]);
    let out = tmp.path().join("out");
    let e = convert(&dir, &out, &opts(&TURBO)).unwrap_err().to_string();
    let vocab = dir.join("vocab.json");
    assert!(e.starts_with(&format!("{}: the tokenizer can produce id ", vocab.display())), "{e}");
    assert!(e.ends_with(", beyond T3's text embedding of 100 rows (ids 0..99)"), "{e}");
    assert!(!out.exists() || std::fs::read_dir(&out).unwrap().next().is_none());
    if let Some(python) = python() {
        let o = Command::new(python)
            .arg(repo().join("tools/chatterbox/convert.py"))
            .arg(&dir)
            .arg(&out)
            .args(["--t3-heads", "2", "--cfm-heads", "2"])
            .output()
            .unwrap();
        assert!(!o.status.success());
        let stderr = String::from_utf8(o.stderr).unwrap();
        assert_eq!(stderr.trim_end(), format!("convert.py: {}: {e}", dir.display()));
    }
}

/// Full-size random checkpoints in the official formats (tools/chatterbox/
/// make_fixtures.py and make_mtl_fixtures.py with `--size full --no-dumps`):
/// `TTS_CHATTERBOX_FULL_TURBO` and/or `TTS_CHATTERBOX_FULL_MTL` name the
/// directories, `TTS_CHATTERBOX_FULL_WEIGHTS` the storages (comma-separated,
/// default f32). Each conversion must equal convert.py's byte for byte. Skips
/// with a message when neither directory or the venv is given: several GB
/// and minutes per storage are too much for every run.
#[test]
fn full_size_checkpoints_equal_the_python_converter() {
    let dirs: Vec<(&str, PathBuf)> = [("turbo", "TTS_CHATTERBOX_FULL_TURBO"), ("mtl", "TTS_CHATTERBOX_FULL_MTL")]
        .iter()
        .filter_map(|(v, var)| Some((*v, PathBuf::from(std::env::var_os(var)?))))
        .collect();
    let Some(python) = python().filter(|_| !dirs.is_empty()) else {
        eprintln!("skipped: set TTS_CHATTERBOX_FULL_TURBO / TTS_CHATTERBOX_FULL_MTL to full-size official-format directories (and have the converter venv)");
        return;
    };
    let weights = std::env::var("TTS_CHATTERBOX_FULL_WEIGHTS").unwrap_or_else(|_| "f32".into());
    for (variant, dir) in &dirs {
        for w in weights.split(',') {
            let tmp = tempfile::tempdir().unwrap();
            let options = [("variant", *variant), ("weights", w)];
            let started = std::time::Instant::now();
            let files = convert(dir, &tmp.path().join("native"), &opts(&options)).unwrap();
            let native_s = started.elapsed().as_secs_f64();
            let started = std::time::Instant::now();
            python_convert(&python, dir, &tmp.path().join("python"), &options);
            let python_s = started.elapsed().as_secs_f64();
            for f in &files {
                assert_same(&f.path, &tmp.path().join("python").join(f.path.file_name().unwrap()));
            }
            eprintln!("{variant} weights={w}: identical ({} files; native {native_s:.1} s, convert.py {python_s:.1} s)", files.len());
        }
    }
}

#[test]
fn a_multilingual_directory_with_only_v3_is_detected_and_read() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_official("mtl-tiny", tmp.path());
    std::fs::rename(dir.join("t3_mtl23ls_v2.safetensors"), dir.join("t3_mtl23ls_v3.safetensors")).unwrap();
    let out = tmp.path().join("first");
    let files = convert(&dir, &out, &opts(&[("t3_heads", "4"), ("cfm_heads", "2"), ("aligned_heads", "2:3,3:1,1:2")])).unwrap();
    assert_eq!(names(&files), ["t3-mtl.gguf", "s3gen.gguf"]);
    assert_same(&files[0].path, &fixtures().join("mtl-tiny/t3-mtl.gguf"));
}

/// The tokenizer JSON of a GPT-2-style directory with tokens JSON must
/// escape (quotes, backslashes, non-ASCII, byte-level `Ġ`), a special
/// end-of-text token and added tags: the tokenizers crate's `to_string`
/// gives what Python's `Tokenizer.to_str()` gives for the same build.
#[test]
fn the_tokenizer_json_equals_pythons_to_str() {
    let Some(python) = python() else {
        eprintln!("skipped: no Python converter venv (the committed fixtures cover the plain case)");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let vocab =
        r#"{"<|endoftext|>": 0, "a": 1, "b": 2, "ab": 3, "Ġ": 4, "Ġab": 5, "\"": 6, "\\": 7, "é": 8, "日": 9, "本": 10, "日本": 11, "'": 12, "\u0001": 13}"#;
    std::fs::write(dir.join("vocab.json"), vocab).unwrap();
    std::fs::write(dir.join("merges.txt"), "#version: 0.2\na b\nĠ ab\n日 本\n").unwrap();
    std::fs::write(dir.join("added_tokens.json"), r#"{"[sigh]": 15, "[laugh]": 14, "\"quoted\"": 16, "日本語": 17}"#).unwrap();
    let native = tts_model_chatterbox::convert::tokenizer::gpt2_tokenizer_json(dir, 18).unwrap();
    let script = format!(
        "import sys; sys.path.insert(0, {:?}); from pathlib import Path; import convert; sys.stdout.write(convert.tokenizer_json(Path(sys.argv[1]), 18))",
        repo().join("tools/chatterbox").display().to_string()
    );
    let o = Command::new(python).args(["-c", &script]).arg(dir).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(native, String::from_utf8(o.stdout).unwrap());
    // One row short of the largest id: the id check refuses, naming the token.
    let e = tts_model_chatterbox::convert::tokenizer::gpt2_tokenizer_json(dir, 17).unwrap_err().to_string();
    assert_eq!(
        e,
        format!("{}: the tokenizer can produce id 17 ('日本語'), beyond T3's text embedding of 17 rows (ids 0..16)", dir.join("vocab.json").display())
    );
}

/// The mismatch report names what is at an offset: the first key, a
/// tensor's info, the last tensor's data.
#[test]
fn a_mismatch_is_located_by_key_or_tensor() {
    let bytes = std::fs::read(fixtures().join("turbo-tiny/t3-turbo.gguf")).unwrap();
    assert_eq!(locate(&bytes, 3), "the header");
    assert!(locate(&bytes, 30).starts_with("metadata key 'general.architecture'"), "{}", locate(&bytes, 30));
    assert!(locate(&bytes, bytes.len() - 1).starts_with("data of tensor 'voice.builtin.speaker_emb'"), "{}", locate(&bytes, bytes.len() - 1));
    // The first tensor info follows the last key.
    let key_end = (0..bytes.len()).find(|&i| !locate(&bytes, i).starts_with("metadata") && i > 24).unwrap();
    assert!(locate(&bytes, key_end).starts_with("tensor info of 't3.blk.0.attn.out.bias'"), "{}", locate(&bytes, key_end));
}
