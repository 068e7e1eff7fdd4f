//! Graph census: every Chatterbox graph (T3 prefill and steps, encoder, CFM,
//! HiFT) built under each policy, walked node by node, to show which ops each
//! policy and deny rule lets in. Runs a short synthesis of the tiny fixture on
//! CPU so the graphs are the ones synthesis really builds.

mod common;

use engine_core::abi::WeightStorage;
use engine_core::model_kit::census::{all_on_denying, assert_declared, census, stage_set, stages_with, StageNodes};
use engine_core::model_kit::OpPolicy;
use ggml_sys::TYPE_F32;
use std::collections::BTreeSet;
use tts_model_chatterbox::model::{Chatterbox, SynthesisParams};

fn files() -> [std::path::PathBuf; 2] {
    let dir = common::fixture_dir();
    [dir.join("t3-turbo.gguf"), dir.join("s3gen-meanflow.gguf")]
}

/// Every node of every graph one synthesis builds under `policy`, by stage.
fn nodes(policy: &OpPolicy) -> StageNodes {
    let handle = common::open("cpu");
    let mut model = Chatterbox::load(&files(), &handle.ggml_backend(), policy).unwrap();
    let params = SynthesisParams { max_new_tokens: 6, seed: 3, ..SynthesisParams::default() };
    model.synthesize("Hello there.", &params).unwrap();
    let mut out: StageNodes = model.t3.graphs().into_iter().map(|(s, g)| (s, census(g))).collect();
    out.extend(model.s3gen.graphs().into_iter().map(|(s, g)| (s, census(g))));
    let stages: BTreeSet<&str> = out.iter().map(|(s, _)| *s).collect();
    assert_eq!(stages, ["hift", "hift.f0", "s3gen.cfm", "s3gen.encoder", "t3.prefix", "t3.step", "t3.suffix"].into_iter().collect(), "every stage built");
    out
}

#[test]
fn native_policies_put_their_ops_in_the_graphs_they_serve() {
    let n = nodes(&OpPolicy::native(TYPE_F32));
    assert_eq!(stages_with(&n, "FLASH_ATTN_EXT"), stage_set(&["s3gen.cfm", "t3.prefix", "t3.step", "t3.suffix"]));
    assert_eq!(stages_with(&n, "LEAKY_RELU"), stage_set(&["hift", "s3gen.encoder"]));
    assert_eq!(stages_with(&n, "CONV_TRANSPOSE_1D"), stage_set(&["hift"]));
    assert_declared(&n, tts_model_chatterbox::GRAPH_OPS);
}

#[test]
fn reference_policy_keeps_every_covered_op_out() {
    let n = nodes(&OpPolicy::reference());
    for op in ["FLASH_ATTN_EXT", "LEAKY_RELU", "CONV_TRANSPOSE_1D"] {
        assert_eq!(stages_with(&n, op), BTreeSet::new(), "{op} with every policy off");
    }
    assert_declared(&n, tts_model_chatterbox::GRAPH_OPS);
}

#[test]
fn a_deny_rule_removes_its_op_even_with_the_policy_on() {
    for op in ["FLASH_ATTN_EXT", "LEAKY_RELU", "CONV_TRANSPOSE_1D"] {
        let policy = OpPolicy::from_resolved(&all_on_denying(&[op]));
        let n = nodes(&policy);
        assert_eq!(stages_with(&n, op), BTreeSet::new(), "{op} denied");
    }
    // The others stay native.
    let n = nodes(&OpPolicy::from_resolved(&all_on_denying(&["CONV_TRANSPOSE_1D"])));
    assert_eq!(stages_with(&n, "LEAKY_RELU"), stage_set(&["hift", "s3gen.encoder"]));
    assert!(!stages_with(&n, "FLASH_ATTN_EXT").is_empty());
}

#[test]
fn weight_storage_sets_the_matrix_products_operand_type() {
    let weight_types = |storage: WeightStorage| -> BTreeSet<String> {
        let policy = OpPolicy { matmul_weights: storage, ..OpPolicy::reference() };
        nodes(&policy).into_iter().flat_map(|(_, n)| n).filter(|u| u.op == "MUL_MAT").filter_map(|u| u.src0.map(ggml_sys::type_name)).collect()
    };
    // The fixture is F32: as stored and F32 keep it; F16 narrows every weight.
    assert_eq!(weight_types(WeightStorage::AsStored), ["f32".to_string()].into_iter().collect());
    assert_eq!(weight_types(WeightStorage::F32), ["f32".to_string()].into_iter().collect());
    let narrowed = weight_types(WeightStorage::F16);
    assert!(narrowed.contains("f16"), "{narrowed:?}");
}

#[test]
fn a_denied_op_without_a_fallback_is_a_load_error() {
    let handle = common::open("cpu");
    let policy = OpPolicy::from_resolved(&all_on_denying(&["SOFT_MAX"]));
    let e = Chatterbox::load(&files(), &handle.ggml_backend(), &policy).err().unwrap();
    assert_eq!(e, "SOFT_MAX is denied on this device by deny rule 1 (device \"CPU\"): census, and chatterbox has no fallback for it");
    // An op the model never uses may be denied.
    let policy = OpPolicy::from_resolved(&all_on_denying(&["ROPE"]));
    assert!(Chatterbox::load(&files(), &handle.ggml_backend(), &policy).is_ok());
}
