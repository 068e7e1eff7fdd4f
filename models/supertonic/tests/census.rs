//! Graph census: every Supertonic graph (duration, text encoder, vector
//! estimator, vocoder) built under each policy, walked node by node, to show
//! which ops each policy and deny rule lets in. Runs a short synthesis of the
//! tiny v2 fixture on CPU so the graphs are the ones synthesis really builds.

mod common;

use engine_core::abi::WeightStorage;
use engine_core::model_kit::census::{all_on_denying, assert_declared, census, stage_set, stages_with, StageNodes};
use engine_core::model_kit::OpPolicy;
use std::collections::BTreeSet;
use tts_model_supertonic::model::{NoiseSource, Supertonic, SynthesisParams, VoiceChoice};
use tts_model_supertonic::text::UnsupportedChars;

fn model_file() -> std::path::PathBuf {
    common::repo_root().join("tests/fixtures/supertonic/tiny-v2/model.gguf")
}

fn params() -> SynthesisParams {
    SynthesisParams {
        voice: VoiceChoice::Named(String::new()),
        language: String::new(),
        steps: Some(2),
        speed: 1.05,
        noise: NoiseSource::Seed(1),
        unsupported_chars: UnsupportedChars::Skip,
        stream_first_chars: 0,
    }
}

/// Every node of every graph one synthesis builds under `policy`, by stage.
fn nodes(policy: &OpPolicy) -> StageNodes {
    let handle = common::open("cpu");
    let mut model = Supertonic::load(&model_file(), handle.ggml_backend(), policy).unwrap();
    model.synthesize("Hello there.", &params()).unwrap();
    let out: StageNodes = model.graphs().into_iter().map(|(s, g)| (s, census(g))).collect();
    let stages: BTreeSet<&str> = out.iter().map(|(s, _)| *s).collect();
    assert_eq!(stages, ["duration", "text_encoder", "vector_estimator", "vocoder"].into_iter().collect(), "every stage built");
    assert_declared(&out, tts_model_supertonic::GRAPH_OPS);
    out
}

#[test]
fn native_policies_put_their_ops_in_the_graphs_they_serve() {
    let n = nodes(&OpPolicy::native(ggml_sys::TYPE_F32));
    assert_eq!(stages_with(&n, "FLASH_ATTN_EXT"), stage_set(&["text_encoder", "vector_estimator"]));
    assert_eq!(stages_with(&n, "LEAKY_RELU"), stage_set(&["duration", "vocoder"]));
}

#[test]
fn reference_policy_keeps_every_covered_op_out() {
    let n = nodes(&OpPolicy::reference());
    for op in ["FLASH_ATTN_EXT", "LEAKY_RELU", "CONV_TRANSPOSE_1D"] {
        assert_eq!(stages_with(&n, op), BTreeSet::new(), "{op} with every policy off");
    }
}

#[test]
fn a_deny_rule_removes_its_op_even_with_the_policy_on() {
    for op in ["FLASH_ATTN_EXT", "LEAKY_RELU"] {
        let n = nodes(&OpPolicy::from_resolved(&all_on_denying(&[op])));
        assert_eq!(stages_with(&n, op), BTreeSet::new(), "{op} denied");
    }
    let n = nodes(&OpPolicy::from_resolved(&all_on_denying(&["LEAKY_RELU"])));
    assert_eq!(stages_with(&n, "FLASH_ATTN_EXT"), stage_set(&["text_encoder", "vector_estimator"]), "the other op stays native");
}

#[test]
fn weight_storage_sets_the_matrix_products_operand_type() {
    let weight_types = |storage: WeightStorage| -> BTreeSet<String> {
        let policy = OpPolicy { matmul_weights: storage, ..OpPolicy::reference() };
        nodes(&policy).into_iter().flat_map(|(_, n)| n).filter(|u| u.op == "MUL_MAT").filter_map(|u| u.src0.map(ggml_sys::type_name)).collect()
    };
    assert_eq!(weight_types(WeightStorage::AsStored), ["f32".to_string()].into_iter().collect(), "the fixture is F32");
    assert!(weight_types(WeightStorage::F16).contains("f16"));
}

#[test]
fn a_denied_op_without_a_fallback_is_a_load_error() {
    let handle = common::open("cpu");
    let e = Supertonic::load(&model_file(), handle.ggml_backend(), &OpPolicy::from_resolved(&all_on_denying(&["SOFT_MAX"]))).err().unwrap();
    assert_eq!(e, "SOFT_MAX is denied on this device by deny rule 1 (device \"CPU\"): census, and supertonic has no fallback for it");
    assert!(Supertonic::load(&model_file(), handle.ggml_backend(), &OpPolicy::from_resolved(&all_on_denying(&["CONV_TRANSPOSE_1D"]))).is_ok());
}
