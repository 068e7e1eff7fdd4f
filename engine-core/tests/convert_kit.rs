//! model_kit::convert against its references: the GGUF writer and every
//! encoder byte for byte against gguf-py 0.19 (the committed fixture made by
//! tools/gguf/make_writer_fixture.py, and random plans through the same script
//! where the Python venv exists), the weight-norm fusion and NumPy's sums bit
//! for bit against tools/chatterbox/convert.py and NumPy, and the checkpoint
//! readers' one-line errors for broken files.

use engine_core::model_kit::convert::{
    fuse_weight_norm, numpy_sum_f64, pairwise_sum_f64, Checkpoint, GgmlType, GgufWriter, MetaValue, PlannedTensor, SafetensorsFile, Values,
};
use engine_core::model_kit::Error;
use ndarray::{ArrayD, IxDyn};
use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn fixture_dir() -> PathBuf {
    workspace().join("tests/fixtures/gguf-writer")
}

/// The reference venv's Python, when this checkout has one.
fn python() -> Option<PathBuf> {
    let p = workspace().join("target/chatterbox-venv/bin/python");
    if p.is_file() {
        Some(p)
    } else {
        eprintln!("skipped: {} is absent (the committed fixture covers the writer)", p.display());
        None
    }
}

// ---------------------------------------------------------------- .npy files

enum Npy {
    F32(Vec<usize>, Vec<f32>),
    F64(Vec<usize>, Vec<f64>),
    I64(Vec<usize>, Vec<i64>),
}

fn read_npy(path: &Path) -> Npy {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let npy = npyz::NpyFile::new(&bytes[..]).unwrap();
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let descr = npy.dtype().descr().trim_matches('\'').to_string();
    match descr.as_str() {
        "<f4" => Npy::F32(shape, npy.into_vec().unwrap()),
        "<f8" => Npy::F64(shape, npy.into_vec().unwrap()),
        "<i8" => Npy::I64(shape, npy.into_vec().unwrap()),
        other => panic!("{}: dtype {other}", path.display()),
    }
}

fn write_npy(path: &Path, descr: &str, shape: &[usize], payload: &[u8]) {
    let dims = match shape {
        [] => "()".to_string(),
        [n] => format!("({n},)"),
        _ => format!("({})", shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {dims}, }}").into_bytes();
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(b' ');
    }
    header.push(b'\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(&header);
    bytes.extend_from_slice(payload);
    std::fs::write(path, bytes).unwrap();
}

fn write_npy_f32(path: &Path, shape: &[usize], values: &[f32]) {
    write_npy(path, "<f4", shape, &values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>());
}

fn write_npy_i64(path: &Path, shape: &[usize], values: &[i64]) {
    write_npy(path, "<i8", shape, &values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>());
}

// ------------------------------------------------------------------- plans

/// The writer filled from a plan directory (tools/gguf/make_writer_fixture.py's format).
fn writer_from_plan(dir: &Path) -> GgufWriter<'static> {
    let plan: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("plan.json")).unwrap()).unwrap();
    let mut w = GgufWriter::new(plan["arch"].as_str().unwrap());
    for m in plan["meta"].as_array().unwrap() {
        let (key, kind, value) = (m[0].as_str().unwrap(), m[1].as_str().unwrap(), &m[2]);
        let v = match kind {
            "u32" => MetaValue::U32(value.as_u64().unwrap() as u32),
            "i32" => MetaValue::I32(value.as_i64().unwrap() as i32),
            "f32" => MetaValue::F32(value.as_f64().unwrap() as f32),
            "bool" => MetaValue::Bool(value.as_bool().unwrap()),
            "str" | "name" => MetaValue::Str(value.as_str().unwrap().to_string()),
            "arr" => {
                let items = value.as_array().unwrap();
                match items.first() {
                    None => MetaValue::ArrI32(Vec::new()),
                    Some(x) if x.is_string() => MetaValue::ArrStr(items.iter().map(|x| x.as_str().unwrap().to_string()).collect()),
                    Some(x) if x.is_i64() || x.is_u64() => MetaValue::ArrI32(items.iter().map(|x| x.as_i64().unwrap() as i32).collect()),
                    Some(_) => MetaValue::ArrF32(items.iter().map(|x| x.as_f64().unwrap() as f32).collect()),
                }
            }
            other => panic!("kind {other}"),
        };
        w.add(key, v);
    }
    for t in plan["tensors"].as_array().unwrap() {
        let (name, storage, file) = (t[0].as_str().unwrap().to_string(), t[1].as_str().unwrap(), dir.join(t[2].as_str().unwrap()));
        let storage = match storage {
            "f16_astype" => GgmlType::F16,
            s => GgmlType::from_name(s).unwrap(),
        };
        // Shape from the file's header; the values only when the writer asks.
        // Float tensors pass through `np.ascontiguousarray` in the Python
        // converters (and the fixture script), which makes a 0-d array [1].
        let promote = move |s: Vec<usize>| if s.is_empty() && storage.is_float() { vec![1] } else { s };
        let shape = match read_npy(&file) {
            Npy::F32(s, _) | Npy::F64(s, _) | Npy::I64(s, _) => promote(s),
        };
        w.add_tensor(PlannedTensor::new(name, shape, storage, move || {
            Ok(match (read_npy(&file), storage) {
                (Npy::F32(s, v), _) => Values::F32(ArrayD::from_shape_vec(IxDyn(&promote(s)), v).unwrap()),
                (Npy::F64(s, v), _) => Values::F32(ArrayD::from_shape_vec(IxDyn(&promote(s)), v.into_iter().map(|x| x as f32).collect()).unwrap()),
                (Npy::I64(s, v), GgmlType::I16) => Values::I16(ArrayD::from_shape_vec(IxDyn(&s), v.into_iter().map(|x| x as i16).collect()).unwrap()),
                (Npy::I64(s, v), _) => Values::I32(ArrayD::from_shape_vec(IxDyn(&s), v.into_iter().map(|x| x as i32).collect()).unwrap()),
            })
        }));
    }
    w
}

/// Panics at the first differing byte, naming its offset.
fn assert_same_bytes(native: &[u8], reference: &[u8], what: &str) {
    if let Some(at) = native.iter().zip(reference).position(|(a, b)| a != b) {
        panic!("{what}: first difference at byte {at} of {} (native {:#04x}, gguf-py {:#04x})", reference.len(), native[at], reference[at]);
    }
    assert_eq!(native.len(), reference.len(), "{what}: native {} bytes, gguf-py {}", native.len(), reference.len());
}

#[test]
fn writer_matches_gguf_py_on_the_committed_fixture() {
    let dir = fixture_dir();
    let out = tempfile::tempdir().unwrap();
    let path = out.path().join("native.gguf");
    let written = writer_from_plan(&dir).write_atomically(&path).unwrap();
    let native = std::fs::read(&path).unwrap();
    let reference = std::fs::read(dir.join("expected.gguf")).unwrap();
    assert_same_bytes(&native, &reference, "tests/fixtures/gguf-writer/expected.gguf");
    assert_eq!(written.bytes, reference.len() as u64);
    assert_eq!(written.tensors, 14);
    assert!(!out.path().join("native.gguf.part").exists());
}

/// Each encoder alone against the fixture's bytes for its tensors (a failure
/// here names the encoder, where the whole-file comparison names an offset).
#[test]
fn each_encoder_matches_gguf_py() {
    let dir = fixture_dir();
    let file = ggml_sys::gguf::GgufFile::open(&dir.join("expected.gguf")).unwrap();
    let plan: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("plan.json")).unwrap()).unwrap();
    let reference = std::fs::read(dir.join("expected.gguf")).unwrap();
    let infos = file.tensors();
    for t in plan["tensors"].as_array().unwrap() {
        let (name, storage) = (t[0].as_str().unwrap(), t[1].as_str().unwrap());
        let Npy::F32(_, values) = read_npy(&dir.join(t[2].as_str().unwrap())) else { continue };
        let ty = if storage == "f16_astype" { GgmlType::F16 } else { GgmlType::from_name(storage).unwrap() };
        let info = infos.iter().find(|i| i.name == name).unwrap();
        assert_eq!(info.size, ty.bytes_for(values.len()), "{name}");
        let expected = &reference[info.offset..info.offset + info.size];
        assert_same_bytes(&ty.encode(&values), expected, &format!("{name} as {}", ty.name()));
    }
}

// ------------------------------------------------ random plans through Python

/// splitmix64: reproducible draws without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Values of every kind an encoder meets: wide magnitudes, exact halves
    /// and quarters (ties after scaling), zeros, repeated maxima of both signs.
    fn value(&mut self) -> f32 {
        match self.below(8) {
            0 => 0.0,
            1 => (self.below(64) as f32 - 32.0) * 0.5,
            2 => (self.below(32) as f32 - 16.0) * 0.25,
            3 => ((self.unit() - 0.5) * 2.0 * (self.unit() * 40.0 - 20.0).exp()) as f32,
            4 => {
                if self.below(2) == 0 {
                    8.0
                } else {
                    -8.0
                }
            }
            _ => (self.unit() * 2.0 - 1.0) as f32,
        }
    }
}

#[test]
fn writer_matches_gguf_py_on_random_plans() {
    let Some(python) = python() else { return };
    let script = workspace().join("tools/gguf/make_writer_fixture.py");
    let mut rng = Rng(0x5eed_0033);
    for round in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let mut tensors = Vec::new();
        for i in 0..24 {
            let storage = ["f32", "f16", "f16_astype", "bf16", "q8_0", "q4_0", "i32", "i16"][rng.below(8) as usize];
            let block = if storage.starts_with('q') { 32 } else { 1 };
            let ndim = 1 + rng.below(3) as usize;
            let mut shape: Vec<usize> = (0..ndim).map(|_| 1 + rng.below(6) as usize).collect();
            *shape.last_mut().unwrap() = block * (1 + rng.below(if block == 1 { 70 } else { 6 }) as usize);
            let n: usize = shape.iter().product();
            let file = format!("t{i}.npy");
            if storage.starts_with('i') {
                let bound = if storage == "i16" { 1 << 15 } else { 1 << 31 };
                let values: Vec<i64> = (0..n).map(|_| rng.below(2 * bound) as i64 - bound as i64).collect();
                write_npy_i64(&dir.path().join(&file), &shape, &values);
            } else {
                // Blocks of one repeated value, all-zero blocks and mixed ones.
                let mut values: Vec<f32> = (0..n).map(|_| rng.value()).collect();
                for b in values.chunks_mut(32) {
                    match rng.below(6) {
                        0 => b.fill(0.0),
                        1 => b.fill(-1.5),
                        _ => {}
                    }
                }
                write_npy_f32(&dir.path().join(&file), &shape, &values);
            }
            tensors.push(serde_json::json!([format!("blk.{i}.{storage}"), storage, file]));
        }
        let meta = serde_json::json!([
            ["r.u32", "u32", rng.below(1 << 32)],
            ["r.f32", "f32", rng.unit() * 1e6],
            ["r.ints", "arr", [rng.below(100), 3, 5]],
            ["r.flag", "bool", round % 2 == 0],
            ["r.text", "str", format!("round {round}")],
        ]);
        let plan = serde_json::json!({"arch": "random", "meta": meta, "tensors": tensors});
        std::fs::write(dir.path().join("plan.json"), serde_json::to_string(&plan).unwrap()).unwrap();
        let reference = dir.path().join("python.gguf");
        let run = Command::new(&python).arg(&script).arg("write").arg(dir.path()).arg(&reference).output().unwrap();
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
        let native = dir.path().join("native.gguf");
        writer_from_plan(dir.path()).write_atomically(&native).unwrap();
        assert_same_bytes(&std::fs::read(&native).unwrap(), &std::fs::read(&reference).unwrap(), &format!("random plan {round}"));
    }
}

// ------------------------------------------------------- NumPy arithmetic

#[test]
fn weight_norm_and_sums_match_the_python_converter() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x77);
    // Rows of 1..300 values, and long rows that cross NumPy's 8192-value buffer.
    let mut shapes: Vec<Vec<usize>> = (1..=300).map(|n| vec![1 + rng.below(4) as usize, n]).collect();
    shapes.extend([vec![3, 8192], vec![2, 8193], vec![2, 20000], vec![4, 40, 1000], vec![1, 100_000], vec![5, 3, 7]]);
    for (i, shape) in shapes.iter().enumerate() {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| ((rng.unit() - 0.5) * (rng.unit() * 20.0 - 10.0).exp()) as f32).collect();
        let mut g_shape = vec![shape[0]];
        g_shape.extend(std::iter::repeat_n(1, shape.len() - 1));
        let g: Vec<f32> = (0..shape[0]).map(|_| (rng.unit() * 3.0) as f32).collect();
        write_npy_f32(&dir.path().join(format!("v{i}.npy")), shape, &v);
        write_npy_f32(&dir.path().join(format!("g{i}.npy")), &g_shape, &g);
    }
    let code = r#"
import sys
from pathlib import Path
import numpy as np
sys.path.insert(0, sys.argv[2])
from convert import fuse_weight_norm
d = Path(sys.argv[1])
for i in range(int(sys.argv[3])):
    g, v = np.load(d / f"g{i}.npy"), np.load(d / f"v{i}.npy")
    out = fuse_weight_norm({"m.parametrizations.weight.original0": g, "m.parametrizations.weight.original1": v})
    np.save(d / f"w{i}.npy", out["m.weight"])
    vv = v.astype(np.float64)
    np.save(d / f"s{i}.npy", (vv ** 2).reshape(vv.shape[0], -1).sum(axis=1))
"#;
    let run =
        Command::new(&python).arg("-c").arg(code).arg(dir.path()).arg(workspace().join("tools/chatterbox")).arg(shapes.len().to_string()).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    for (i, shape) in shapes.iter().enumerate() {
        let load = |p: &str| match read_npy(&dir.path().join(format!("{p}{i}.npy"))) {
            Npy::F32(s, v) => ArrayD::from_shape_vec(IxDyn(&s), v).unwrap(),
            _ => unreachable!(),
        };
        let (g, v, expected) = (load("g"), load("v"), load("w"));
        let native = fuse_weight_norm(&g, &v).unwrap();
        assert_eq!(native.shape(), expected.shape());
        let same = native.iter().zip(expected.iter()).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "weight norm of shape {shape:?} differs from tools/chatterbox/convert.py");
        let Npy::F64(_, sums) = read_npy(&dir.path().join(format!("s{i}.npy"))) else { unreachable!() };
        let row = v.len() / shape[0];
        for (r, sum) in sums.iter().enumerate() {
            let squares: Vec<f64> = v.iter().skip(r * row).take(row).map(|&x| (x as f64) * (x as f64)).collect();
            assert_eq!(numpy_sum_f64(&squares).to_bits(), sum.to_bits(), "row {r} of shape {shape:?}");
            if row <= 8192 {
                assert_eq!(pairwise_sum_f64(&squares).to_bits(), sum.to_bits(), "row {r} of shape {shape:?}");
            }
        }
    }
}

// ------------------------------------------------------ atomic writing

fn f32_tensor(name: &str, shape: &[usize]) -> PlannedTensor<'static> {
    let n: usize = shape.iter().product();
    PlannedTensor::ready(name, GgmlType::F32, Values::F32(ArrayD::from_shape_vec(IxDyn(shape), vec![1.0; n]).unwrap()))
}

#[test]
fn a_failed_write_leaves_no_part_file_and_the_old_model_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("model.gguf");
    let part = dir.path().join("model.gguf.part");
    std::fs::write(&target, b"the previous model").unwrap();

    type AddTensors = Box<dyn Fn(&mut GgufWriter<'static>)>;
    let cases: Vec<(AddTensors, &str)> = vec![
        (
            Box::new(|w| w.add_tensor(PlannedTensor::new("blk.0.w", vec![2, 32], GgmlType::Q8_0, || Err(Error::msg("ckpt.safetensors: no tensor 'w'"))))),
            "ckpt.safetensors: no tensor 'w'",
        ),
        (
            Box::new(|w| {
                w.add_tensor(PlannedTensor::new("blk.0.w", vec![2, 3], GgmlType::F32, || Ok(Values::F32(ArrayD::zeros(IxDyn(&[3, 2]))))));
            }),
            "tensor 'blk.0.w': produced shape [3, 2], the plan says [2, 3]",
        ),
        (
            Box::new(|w| {
                w.add_tensor(PlannedTensor::new("ids", vec![4], GgmlType::F32, || Ok(Values::I32(ArrayD::zeros(IxDyn(&[4]))))));
            }),
            "tensor 'ids': produced i32 values for F32 storage",
        ),
        (
            Box::new(|w| w.add_tensor(PlannedTensor::new("odd", vec![3, 40], GgmlType::Q4_0, || unreachable!("never produced")))),
            "tensor 'odd': rows of 40 values are not whole Q4_0 blocks of 32",
        ),
        (
            Box::new(|w| {
                w.add_tensor(f32_tensor("twice", &[2]));
                w.add_tensor(f32_tensor("twice", &[2]));
            }),
            "tensor 'twice' is planned twice",
        ),
    ];
    for (plan, expected) in cases {
        let mut w = GgufWriter::new("test");
        w.add_tensor(f32_tensor("first", &[64]));
        plan(&mut w);
        let e = w.write_atomically(&target).unwrap_err();
        assert_eq!(e, expected);
        assert!(!part.exists(), "{expected}: the .part file was left behind");
        assert_eq!(std::fs::read(&target).unwrap(), b"the previous model", "{expected}: the old file changed");
    }

    // A producer that panics: the .part goes too.
    let mut w = GgufWriter::new("test");
    w.add_tensor(f32_tensor("first", &[64]));
    w.add_tensor(PlannedTensor::new("boom", vec![1], GgmlType::F32, || panic!("producer failed")));
    let target2 = target.clone();
    assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || w.write_atomically(&target2))).is_err());
    assert!(!part.exists());
    assert_eq!(std::fs::read(&target).unwrap(), b"the previous model");

    // A complete write replaces the old file; a link planted at the `.part`
    // name is replaced, not followed.
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"not to be overwritten").unwrap();
    std::os::unix::fs::symlink(&victim, &part).unwrap();
    let mut w = GgufWriter::new("test");
    w.add_tensor(f32_tensor("first", &[64]));
    let written = w.write_atomically(&target).unwrap();
    assert_eq!(written.bytes, std::fs::metadata(&target).unwrap().len());
    assert!(std::fs::read(&target).unwrap().starts_with(b"GGUF"));
    assert!(std::fs::symlink_metadata(&part).is_err());
    assert_eq!(std::fs::read(&victim).unwrap(), b"not to be overwritten");
}

#[test]
fn metadata_follows_gguf_py_s_rules() {
    // `general.architecture` first, a repeated key keeps its place with the
    // last value, empty strings and arrays are left out.
    let mut w = GgufWriter::new("arch");
    w.add("a", MetaValue::U32(1));
    w.add("b", MetaValue::Str(String::new()));
    w.add("c", MetaValue::ArrStr(Vec::new()));
    w.add("d", MetaValue::Bool(true));
    w.add("a", MetaValue::U32(2));
    let keys: Vec<(String, MetaValue)> = w.keys().map(|(k, v)| (k.to_string(), v.clone())).collect();
    assert_eq!(
        keys,
        vec![
            ("general.architecture".to_string(), MetaValue::Str("arch".into())),
            ("a".to_string(), MetaValue::U32(2)),
            ("d".to_string(), MetaValue::Bool(true)),
        ]
    );
}

// ---------------------------------------------------------- checkpoints

/// A safetensors file from a header text and data bytes.
fn safetensors_bytes(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

fn le_f32(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[test]
fn safetensors_values_are_widened_as_torch_does() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let mut data = le_f32(&[1.0, -2.5, 3.25, 1e-3]);
    data.extend(half::f16::from_f32(0.333).to_le_bytes());
    data.extend(half::f16::from_f32(-7.0).to_le_bytes());
    data.extend(half::bf16::from_f32(0.1).to_le_bytes());
    data.extend(half::bf16::from_f32(300.0).to_le_bytes());
    data.extend(0.1f64.to_le_bytes());
    data.extend((-3i64).to_le_bytes());
    data.extend(7i64.to_le_bytes());
    data.extend(9i32.to_le_bytes());
    let header = r#"{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"h":{"dtype":"F16","shape":[2],"data_offsets":[16,20]},"b":{"dtype":"BF16","shape":[2],"data_offsets":[20,24]},"d":{"dtype":"F64","shape":[],"data_offsets":[24,32]},"ids":{"dtype":"I64","shape":[2],"data_offsets":[32,48]},"n":{"dtype":"I32","shape":[1],"data_offsets":[48,52]}}"#;
    std::fs::write(&path, safetensors_bytes(header, &data)).unwrap();
    let ck = Checkpoint::open(&path).unwrap();
    assert_eq!(ck.names(), ["w", "h", "b", "d", "ids", "n"]);
    assert_eq!(ck.shape("w").unwrap(), [2, 2]);
    assert_eq!(ck.read_f32("w").unwrap().into_raw_vec_and_offset().0, [1.0, -2.5, 3.25, 1e-3]);
    assert_eq!(ck.read_f32("h").unwrap().into_raw_vec_and_offset().0, [half::f16::from_f32(0.333).to_f32(), -7.0]);
    assert_eq!(ck.read_f32("b").unwrap().into_raw_vec_and_offset().0, [half::bf16::from_f32(0.1).to_f32(), 300.0]);
    let d = ck.read_f32("d").unwrap();
    assert_eq!((d.shape(), d.iter().next().copied()), (&[][..], Some(0.1f32)));
    assert_eq!(ck.read_i64("ids").unwrap().into_raw_vec_and_offset().0, [-3, 7]);
    assert_eq!(ck.read_i64("n").unwrap().into_raw_vec_and_offset().0, [9]);
    assert!(ck.is_float("b").unwrap() && !ck.is_float("n").unwrap());
}

#[test]
fn broken_safetensors_give_one_line_naming_file_and_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let two = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}"#;
    let good = safetensors_bytes(two, &le_f32(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
    let cases: Vec<(&str, Vec<u8>, String)> = vec![
        ("truncated", good[..good.len() - 5].to_vec(), "tensor 'b': data offsets [8, 24] run past the end of the file's 19 data bytes (truncated?)".into()),
        ("short", vec![1, 2, 3], "truncated: 3 bytes, fewer than the 8 of a safetensors header's length".into()),
        ("cut header", good[..40].to_vec(), format!("truncated: the header is {} bytes but only 32 follow its length", two.len())),
        ("not json", safetensors_bytes("{not json", &[]), "not a safetensors file (invalid JSON in header: key must be a string at line 1 column 2)".into()),
        (
            "beyond",
            safetensors_bytes(r#"{"a":{"dtype":"F32","shape":[1000],"data_offsets":[0,4000]}}"#, &le_f32(&[1.0; 4])),
            "tensor 'a': data offsets [0, 4000] run past the end of the file's 16 data bytes (truncated?)".into(),
        ),
        (
            "gap",
            safetensors_bytes(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}}"#, &[0; 20]),
            "tensor 'b': data offsets [12, 20] do not start where the previous tensor ends (8): the header lies about offsets".into(),
        ),
        (
            "shape",
            safetensors_bytes(r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}}"#, &[0; 16]),
            "tensor 'a': F32 [3] takes 12 bytes but its data offsets [0, 16] give 16".into(),
        ),
        (
            "extra",
            safetensors_bytes(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#, &[0; 12]),
            "4 bytes after the last tensor's data: the header does not describe the file".into(),
        ),
    ];
    for (what, bytes, expected) in cases {
        let path = dir.path().join(format!("{}.safetensors", what.replace(' ', "-")));
        std::fs::write(&path, bytes).unwrap();
        let e = SafetensorsFile::open(&path).unwrap_err();
        assert_eq!(e, format!("{}: {expected}", path.display()), "{what}");
        assert!(!e.contains('\n'), "{what}");
    }

    // Missing tensors and wrong dtypes, through the one checkpoint API.
    let path = dir.path().join("ok.safetensors");
    let header = r#"{"ids":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},"w":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},"u":{"dtype":"U16","shape":[2],"data_offsets":[12,16]}}"#;
    std::fs::write(&path, safetensors_bytes(header, &[0; 16])).unwrap();
    let ck = Checkpoint::open(&path).unwrap();
    let p = path.display();
    assert_eq!(ck.read_f32("nope").unwrap_err(), format!("{p}: no tensor 'nope'"));
    assert_eq!(ck.shape("nope").unwrap_err(), format!("{p}: no tensor 'nope'"));
    assert_eq!(ck.read_f32("ids").unwrap_err(), format!("{p}: tensor 'ids' is I64, not a float tensor"));
    assert_eq!(ck.read_i64("w").unwrap_err(), format!("{p}: tensor 'w' is F32, not an integer tensor"));
    assert_eq!(ck.read_f32("u").unwrap_err(), format!("{p}: tensor 'u' has dtype U16, which is not supported"));
    assert!(!ck.contains("nope") && ck.contains("w"));
}

#[test]
fn pt_state_dicts_read_through_the_same_api() {
    let path = workspace().join("tests/fixtures/chatterbox/mtl-tiny/official/ve.pt");
    let ck = Checkpoint::open(&path).unwrap();
    assert!(matches!(ck, Checkpoint::Pt(_)));
    let names = ck.names();
    assert!(names.iter().any(|n| n == "proj.weight"), "{names:?}");
    for name in &names {
        let shape = ck.shape(name).unwrap();
        let values = ck.read_f32(name).unwrap();
        assert_eq!(values.shape(), shape.as_slice(), "{name}");
    }
    assert_eq!(ck.read_f32("nope").unwrap_err(), format!("{}: no tensor 'nope'", path.display()));
}
