//! The ONNX reader (`model_kit::convert::onnx`) against what `onnx.numpy_helper`
//! reads from the same files (a digest made by tools/supertonic/onnx_digest.py
//! from the committed official-format tiny Supertonic bundles), and its
//! one-line refusals of hostile files.

use engine_core::model_kit::convert::onnx::proto::{GraphProto, ModelProto, NodeProto, StringStringEntryProto, TensorProto};
use engine_core::model_kit::convert::onnx::{AttributeValue, OnnxGraph, OnnxTensor};
use prost::Message;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// What the digest holds per tensor: float tensors as float32 bytes, integer
/// ones as int64 bytes (numpy's `astype`).
fn tensor_digest(t: &OnnxTensor) -> serde_json::Value {
    let (kind, bytes): (&str, Vec<u8>) = match t.to_i64() {
        Some(v) => ("i64", v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        None => ("f32", t.to_f32().iter().flat_map(|x| x.to_le_bytes()).collect()),
    };
    serde_json::json!({ "dims": t.dims(), "as": kind, "sha256": sha256(&bytes) })
}

fn node_lines(graph: &OnnxGraph) -> String {
    let mut s = String::new();
    for n in graph.nodes() {
        let attrs: Vec<String> = n
            .attributes
            .iter()
            .map(|a| {
                let v = match &a.value {
                    AttributeValue::Float(f) => format!("f:{:08x}", f.to_bits()),
                    AttributeValue::Int(i) => format!("i:{i}"),
                    AttributeValue::Ints(v) => format!("is:{}", v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",")),
                    AttributeValue::Floats(v) => format!("fs:{}", v.iter().map(|x| format!("{:08x}", x.to_bits())).collect::<Vec<_>>().join(",")),
                    AttributeValue::String(b) => format!("s:{}", hex::encode(b)),
                    AttributeValue::Tensor(t) => format!("t:{}", tensor_digest(t)["sha256"].as_str().unwrap()),
                    AttributeValue::Unread(_) => "other".to_string(),
                };
                format!("{}={v}", a.name)
            })
            .collect();
        s += &format!("{}\t{}\t{}\t{}\t{}\n", n.op_type, n.name, n.inputs.join(","), n.outputs.join(","), attrs.join(";"));
    }
    s
}

#[test]
fn reads_what_numpy_helper_reads() {
    let digest: serde_json::Value = serde_json::from_slice(&std::fs::read(repo().join("tests/fixtures/onnx/tiny_supertonic_digest.json")).unwrap()).unwrap();
    let files = digest.as_object().unwrap();
    assert_eq!(files.len(), 8, "both tiny bundles' four graphs");
    for (file, expected) in files {
        let graph = OnnxGraph::open(&repo().join(file)).unwrap();
        let inits = expected["initializers"].as_array().unwrap();
        let names: Vec<&str> = inits.iter().map(|t| t["name"].as_str().unwrap()).collect();
        assert_eq!(graph.initializer_names(), names.as_slice(), "{file}: initializers in file order");
        for t in inits {
            let name = t["name"].as_str().unwrap();
            let mut want = t.clone();
            want.as_object_mut().unwrap().remove("name");
            assert_eq!(tensor_digest(graph.value(name).unwrap()), want, "{file}: {name}");
        }
        for t in expected["constants"].as_array().unwrap() {
            let name = t["name"].as_str().unwrap();
            let mut want = t.clone();
            want.as_object_mut().unwrap().remove("name");
            assert_eq!(tensor_digest(graph.value(name).unwrap()), want, "{file}: Constant {name}");
        }
        assert_eq!(graph.nodes().len() as u64, expected["nodes"].as_u64().unwrap(), "{file}");
        assert_eq!(sha256(node_lines(&graph).as_bytes()), expected["nodes_sha256"].as_str().unwrap(), "{file}: nodes, inputs, outputs, attributes");
    }
}

/// A tensor whose pages were given back reads the same values again.
#[test]
fn released_tensors_read_the_same_again() {
    let graph = OnnxGraph::open(&repo().join("tests/fixtures/supertonic/tiny-v3/official/onnx/vector_estimator.onnx")).unwrap();
    let before: Vec<_> = graph.initializer_names().iter().map(|n| tensor_digest(graph.value(n).unwrap())).collect();
    for n in graph.initializer_names() {
        graph.release(n);
    }
    graph.release("no such tensor");
    let after: Vec<_> = graph.initializer_names().iter().map(|n| tensor_digest(graph.value(n).unwrap())).collect();
    assert_eq!(before, after);
}

#[test]
fn producers_and_consumers_follow_the_graph() {
    let graph = OnnxGraph::open(&repo().join("tests/fixtures/supertonic/tiny-v2/official/onnx/vocoder.onnx")).unwrap();
    for (index, node) in graph.nodes().iter().enumerate() {
        for out in &node.outputs {
            let producer = graph.producer(out).unwrap();
            assert!(std::ptr::eq(producer, &graph.nodes()[index]) || graph.nodes()[index + 1..].iter().any(|n| n.outputs.contains(out)));
        }
        for input in &node.inputs {
            assert!(graph.consumers(input).any(|n| std::ptr::eq(n, node)), "{} reads {input}", node.name);
        }
    }
    let bn = graph.nodes().iter().find(|n| n.op_type == "BatchNormalization").unwrap();
    assert!(bn.float_attribute("epsilon").is_some());
    let conv = graph.nodes().iter().find(|n| n.op_type == "Conv").unwrap();
    assert!(conv.ints_attribute("dilations").is_some());
    assert!(graph.consumer(&conv.inputs[0], "Conv").is_some());
    assert!(graph.producer("no such tensor").is_none());
    assert_eq!(graph.consumers("no such tensor").count(), 0);
}

/// The typed fields (`float_data`, `int64_data`, `int32_data` with FLOAT16
/// bit patterns, `double_data`) as well as `raw_data`.
#[test]
fn typed_fields_and_scalars() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = vec![
        TensorProto { name: "f".into(), dims: vec![2, 2], data_type: 1, float_data: vec![1.0, -2.5, 3.25, 0.0], ..Default::default() },
        TensorProto { name: "i".into(), dims: vec![3], data_type: 7, int64_data: vec![0, -1, 1 << 40], ..Default::default() },
        TensorProto { name: "h".into(), dims: vec![2], data_type: 10, int32_data: vec![0x3c00, 0xc000], ..Default::default() },
        TensorProto { name: "d".into(), dims: vec![], data_type: 11, double_data: vec![0.1], ..Default::default() },
        TensorProto { name: "r".into(), dims: vec![1], data_type: 6, raw_data: Some((-7i32).to_le_bytes().to_vec().into()), ..Default::default() },
    ];
    let path = write_model(dir.path(), "typed.onnx", tensors, vec![]);
    let g = OnnxGraph::open(&path).unwrap();
    assert_eq!(g.value("f").unwrap().to_f32().into_raw_vec_and_offset().0, vec![1.0, -2.5, 3.25, 0.0]);
    assert_eq!(g.value("f").unwrap().dims(), &[2, 2]);
    assert_eq!(g.value("i").unwrap().to_i64().unwrap().into_raw_vec_and_offset().0, vec![0, -1, 1 << 40]);
    assert_eq!(g.value("h").unwrap().to_f32().into_raw_vec_and_offset().0, vec![1.0, -2.0]);
    assert!(g.value("h").unwrap().to_i64().is_none(), "a float tensor has no int64 view");
    // float64 → float32 rounds to nearest, as numpy's astype does.
    assert_eq!(g.value("d").unwrap().to_f32().into_raw_vec_and_offset().0, vec![0.1f64 as f32]);
    assert_eq!(g.scalar("d"), Some(0.1));
    assert_eq!(g.scalar("r"), Some(-7.0));
    assert_eq!(g.scalar("f"), None, "four elements are no scalar");
}

fn write_model(dir: &Path, name: &str, initializer: Vec<TensorProto>, node: Vec<NodeProto>) -> PathBuf {
    let model = ModelProto { graph: Some(GraphProto { node, initializer }) };
    let path = dir.join(name);
    std::fs::write(&path, model.encode_to_vec()).unwrap();
    path
}

fn open_err(path: &Path) -> String {
    match OnnxGraph::open(path) {
        Ok(_) => panic!("{} opened", path.display()),
        Err(e) => e.to_string(),
    }
}

fn raw_f32(name: &str, dims: Vec<i64>, n: usize) -> TensorProto {
    TensorProto { name: name.into(), dims, data_type: 1, raw_data: Some(vec![0u8; 4 * n].into()), ..Default::default() }
}

#[test]
fn truncated_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let whole = std::fs::read(repo().join("tests/fixtures/supertonic/tiny-v2/official/onnx/duration_predictor.onnx")).unwrap();
    let path = dir.path().join("cut.onnx");
    std::fs::write(&path, &whole[..whole.len() / 2]).unwrap();
    let e = open_err(&path);
    assert!(e.starts_with(&format!("{}: not a readable ONNX model (failed to decode Protobuf message: ", path.display())), "{e}");
    assert!(!e.contains('\n'), "{e}");
    std::fs::write(&path, b"").unwrap();
    assert_eq!(open_err(&path), format!("{}: not an ONNX model (no graph)", path.display()));
    std::fs::write(&path, b"\xff\xff\xff\xff").unwrap();
    assert!(open_err(&path).starts_with(&format!("{}: not a readable ONNX model (", path.display())));
}

#[test]
fn external_data_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let entry = StringStringEntryProto { key: "location".into(), value: "weights.bin".into() };
    let t = TensorProto { name: "w".into(), dims: vec![4], data_type: 1, data_location: 1, external_data: vec![entry], ..Default::default() };
    let path = write_model(dir.path(), "ext.onnx", vec![t], vec![]);
    assert_eq!(
        open_err(&path),
        format!(
            "{}: tensor w keeps its data in an external file; convert a self-contained .onnx (weights inside the file, as the official bundles ship them)",
            path.display()
        )
    );
}

#[test]
fn unknown_data_types_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let t = TensorProto { name: "s".into(), dims: vec![1], data_type: 8, ..Default::default() };
    let path = write_model(dir.path(), "str.onnx", vec![t], vec![]);
    assert_eq!(open_err(&path), format!("{}: tensor s has data type 8 (STRING), which a converter does not read", path.display()));
    let t = TensorProto { name: "q".into(), dims: vec![1], data_type: 99, raw_data: Some(vec![0u8].into()), ..Default::default() };
    let path = write_model(dir.path(), "q.onnx", vec![t], vec![]);
    assert_eq!(open_err(&path), format!("{}: tensor q has data type 99 (unknown), which a converter does not read", path.display()));
}

#[test]
fn dims_that_lie_about_the_data_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_model(dir.path(), "short.onnx", vec![raw_f32("w", vec![1000], 10)], vec![]);
    assert_eq!(open_err(&path), format!("{}: tensor w has dims [1000] of FLOAT: 4000 bytes of raw_data needed, 40 present", path.display()));
    let path = write_model(dir.path(), "huge.onnx", vec![raw_f32("w", vec![1 << 62, 1 << 62], 1)], vec![]);
    assert_eq!(
        open_err(&path),
        format!("{}: tensor w has dims [4611686018427387904, 4611686018427387904], more elements than memory can hold", path.display())
    );
    let path = write_model(dir.path(), "neg.onnx", vec![raw_f32("w", vec![-1, 4], 4)], vec![]);
    assert_eq!(open_err(&path), format!("{}: tensor w has a negative dimension in dims [-1, 4]", path.display()));
    let t = TensorProto { name: "f".into(), dims: vec![3], data_type: 1, float_data: vec![1.0], ..Default::default() };
    let path = write_model(dir.path(), "floats.onnx", vec![t], vec![]);
    assert_eq!(open_err(&path), format!("{}: tensor f has dims [3] (3 elements) but 1 float_data values", path.display()));
    // A Constant node's value is checked as an initializer is.
    let value = engine_core::model_kit::convert::onnx::proto::AttributeProto {
        name: "value".into(),
        r#type: 4,
        t: Some(TensorProto { dims: vec![8], data_type: 7, raw_data: Some(vec![0u8; 8].into()), ..Default::default() }),
        ..Default::default()
    };
    let node = NodeProto { name: "/c/Constant".into(), op_type: "Constant".into(), output: vec!["c".into()], attribute: vec![value], ..Default::default() };
    let path = write_model(dir.path(), "const.onnx", vec![], vec![node]);
    assert_eq!(
        open_err(&path),
        format!("{}: attribute value of Constant node /c/Constant has dims [8] of INT64: 64 bytes of raw_data needed, 8 present", path.display())
    );
}

#[test]
fn missing_and_non_regular_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let e = open_err(&dir.path().join("absent.onnx"));
    assert!(e.starts_with(&format!("ONNX model {}: ", dir.path().join("absent.onnx").display())), "{e}");
    assert_eq!(open_err(dir.path()), format!("ONNX model {} is a directory, not a regular file", dir.path().display()));
}
