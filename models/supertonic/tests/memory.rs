//! The memory plan (`memory::plan`, sized from the file alone) against what
//! the pipeline allocates: the tiny v2 model loaded on the CPU and on Vulkan
//! (lavapipe on CI), each stage run once at chosen lengths, and every graph's
//! intermediates and the weights' buffers compared with the plan at those
//! lengths, byte for byte, under the reference and the native op policies.

mod common;

use engine_core::model_kit::OpPolicy;
use ggml_sys::TYPE_F32;
use tts_model_supertonic::memory::{self, Lengths};
use tts_model_supertonic::model::{Supertonic, VoiceChoice};
use tts_model_supertonic::text::UnsupportedChars;

fn model_file() -> std::path::PathBuf {
    common::repo_root().join("tests/fixtures/supertonic/tiny-v2/model.gguf")
}

fn check(backend: &str) {
    let handle = common::open(backend);
    let path = model_file();
    for policy in [OpPolicy::reference(), OpPolicy::native(TYPE_F32)] {
        let mut model = Supertonic::load(&path, handle.ggml_backend(), &policy).unwrap();
        let voice = model.resolve_voice(&VoiceChoice::Named(String::new())).unwrap();
        let ids = model.encode_text("Hello there, my old friend.", "en", UnsupportedChars::Skip).unwrap().ids;
        let latent_frames = 37;
        model.duration(&ids, &voice).unwrap();
        let text_emb = model.text_encoder(&ids, &voice).unwrap();
        let noise = vec![0.25f32; latent_frames * model.hp.latent_channels()];
        let latent = model.denoise(&noise, &text_emb, &voice, 2, |_, _, _| {}).unwrap();
        model.vocoder(&latent).unwrap();

        let (plan, _) = memory::plan(&path, &handle.ggml_backend(), &policy, Some(Lengths { text_ids: ids.len(), latent_frames })).unwrap();
        let what = format!("{backend}, fused attention {}", policy.fused_attention);
        for (stage, graph) in model.graphs() {
            assert_eq!(plan.get(stage), Some(graph.buffer_size() as u64), "{what}: {stage} graph ({} text ids, {latent_frames} frames)", ids.len());
        }
        assert_eq!(plan.get("weights"), Some(model.weight_bytes() as u64), "{what}: weights");
        assert_eq!(plan.total(), plan.items.iter().map(|i| i.bytes).sum::<u64>());
        // Longer input needs more: the plan follows the lengths.
        let (longer, _) =
            memory::plan(&path, &handle.ggml_backend(), &policy, Some(Lengths { text_ids: 4 * ids.len(), latent_frames: 4 * latent_frames })).unwrap();
        for stage in ["duration", "text_encoder", "vector_estimator", "vocoder"] {
            assert!(longer.get(stage) > plan.get(stage), "{what}: {stage} does not grow with its input");
        }
        assert_eq!(longer.get("weights"), plan.get("weights"));
    }
}

#[test]
fn the_plan_is_what_a_synthesis_allocates_on_the_cpu() {
    check("cpu");
}

#[test]
fn the_plan_is_what_a_synthesis_allocates_on_vulkan() {
    if !common::available("vulkan") {
        eprintln!("skipped: no Vulkan device");
        return;
    }
    check("vulkan");
}
