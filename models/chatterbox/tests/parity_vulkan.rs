//! The parity suite on the Vulkan plugin (lavapipe on CI), in one test so one
//! Vulkan device serves it from one thread. Vulkan's f32 matrix products may
//! round through f16, hence the wider tolerances; token streams are reported,
//! not required to match (a flip between two near-equal logits is legitimate),
//! and so is the waveform from the mel (see `Tolerances::waveform_from_mel`).

mod common;

use common::suites::{self, Tolerances};
use ggml_sys::TYPE_F32;
use tts_model_chatterbox::t3::{AttentionConfig, AttentionPath};

const VULKAN: Tolerances = Tolerances { logits: 2e-3, encoder: 2e-3, cfm: 5e-3, hift_body: 5e-3, waveform: 5e-3, waveform_from_mel: None, exact_tokens: false };

#[test]
fn parity_suite_on_vulkan() {
    suites::t3("vulkan", AttentionConfig::REFERENCE, &VULKAN);
    suites::t3("vulkan", AttentionConfig { path: AttentionPath::Flash, kv_type: TYPE_F32 }, &VULKAN);
    suites::encoder("vulkan", &VULKAN);
    suites::cfm("vulkan", &VULKAN);
    suites::hift("vulkan", &VULKAN);
    suites::pipeline("vulkan", AttentionConfig::REFERENCE, &VULKAN);
}
