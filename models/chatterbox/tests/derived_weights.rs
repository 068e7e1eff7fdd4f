//! Tensors a family derives from checked weights at load (`Weights::add_derived`):
//! served by name beside the file's, and refused when a name or size is wrong.

mod common;

use common::{open, t3_file};
use engine_core::abi::WeightStorage;
use engine_core::model_kit::{DerivedTensor, Weights};
use ggml_sys::gguf::GgufTensors;

fn derived(name: &str, ne: &[i64], values: &[f32]) -> DerivedTensor {
    DerivedTensor { name: name.to_string(), ne: ne.to_vec(), values: values.to_vec() }
}

#[test]
fn derived_tensors_are_served_by_name_and_refused_when_wrong() {
    let handle = open("cpu");
    let backend = handle.ggml_backend();
    let gguf = GgufTensors::open(&t3_file()).unwrap();
    let (_, table) = tts_model_chatterbox::t3::check_file(&gguf).unwrap();
    let mut weights = Weights::load(gguf, &backend, table, WeightStorage::AsStored, |_| false).unwrap();
    assert!(weights.names().any(|n| n == "t3.wpe"), "the table's names are listed");

    weights.add_derived(&backend, vec![derived("t3.test.reciprocal", &[1, 3], &[0.5, 0.25, 2.0])]).unwrap();
    assert_eq!(weights.host_f32("t3.test.reciprocal").unwrap(), [0.5, 0.25, 2.0]);
    // An empty batch is nothing to add.
    weights.add_derived(&backend, Vec::new()).unwrap();

    let err = |tensors: Vec<DerivedTensor>, weights: &mut Weights| weights.add_derived(&backend, tensors).unwrap_err().to_string();
    assert_eq!(err(vec![derived("t3.wpe", &[1], &[1.0])], &mut weights), "derived tensor 't3.wpe' is already defined (a bug in the plugin)");
    assert_eq!(
        err(vec![derived("t3.test.reciprocal", &[1], &[1.0])], &mut weights),
        "derived tensor 't3.test.reciprocal' is already defined (a bug in the plugin)"
    );
    assert_eq!(
        err(vec![derived("t3.twice", &[1], &[1.0]), derived("t3.twice", &[1], &[2.0])], &mut weights),
        "derived tensor 't3.twice' is already defined (a bug in the plugin)"
    );
    assert_eq!(
        err(vec![derived("t3.short", &[2, 2], &[1.0; 3])], &mut weights),
        "derived tensor 't3.short' has 3 values for shape [2, 2] (a bug in the plugin)"
    );
    let long = "t3.".to_string() + &"x".repeat(70);
    assert_eq!(err(vec![derived(&long, &[1], &[1.0])], &mut weights), format!("derived tensor name '{long}' is longer than ggml keeps (a bug in the plugin)"));
    // A refused batch adds nothing.
    assert!(weights.host_f32("t3.twice").is_err());
}

/// `Weights::load_part` (what a cloning-only load uses): the whole file is
/// checked, only the kept tensors are read, and the others are refused by
/// name. A NaN in a tensor left out does not fail the load (it is never
/// read), while the full load refuses it.
#[test]
fn a_partial_load_reads_only_the_tensors_it_keeps() {
    let handle = open("cpu");
    let backend = handle.ggml_backend();
    let full = Weights::load(GgufTensors::open(&t3_file()).unwrap(), &backend, table_of(&t3_file()), WeightStorage::AsStored, |_| false).unwrap();
    let keep = tts_model_chatterbox::tensors::is_t3_cloning_tensor;
    let part = Weights::load_part(GgufTensors::open(&t3_file()).unwrap(), &backend, table_of(&t3_file()), WeightStorage::AsStored, |_| false, keep).unwrap();
    assert!(part.names().count() > 0 && part.names().all(keep), "only the voice encoder's tensors are served");
    assert_eq!(part.host_f32("ve.proj.weight").unwrap(), full.host_f32("ve.proj.weight").unwrap());
    assert_eq!(
        part.host_f32("t3.wpe").unwrap_err().to_string(),
        "tensor 't3.wpe' was not loaded: the model was loaded for part of its work (a bug in the plugin)"
    );
    assert_eq!(part.host_f32("t3.nothing").unwrap_err().to_string(), "tensor 't3.nothing' is not in the model's tensor table (a bug in the plugin)");

    let dir = tempfile::tempdir().unwrap();
    let nan = dir.path().join("t3-nan.gguf");
    let mut edit = ggml_sys::gguf::GgufEditor::open(&t3_file()).unwrap();
    edit.fill_f32("t3.wpe", f32::NAN).unwrap();
    edit.write(&nan).unwrap();
    let refused = Weights::load(GgufTensors::open(&nan).unwrap(), &backend, table_of(&nan), WeightStorage::AsStored, |_| false).err().unwrap();
    assert!(refused.to_string().contains("tensor 't3.wpe' holds"), "{refused}");
    let part = Weights::load_part(GgufTensors::open(&nan).unwrap(), &backend, table_of(&nan), WeightStorage::AsStored, |_| false, keep).unwrap();
    assert_eq!(part.host_f32("ve.proj.bias").unwrap(), full.host_f32("ve.proj.bias").unwrap());
}

/// The T3 tensor table of `path`, checked.
fn table_of(path: &std::path::Path) -> engine_core::model_kit::TensorTable {
    let gguf = GgufTensors::open(path).unwrap();
    tts_model_chatterbox::t3::check_file(&gguf).unwrap().1
}
