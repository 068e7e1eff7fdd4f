//! The parity suite on the Vulkan plugin (lavapipe on CI), in one test so one
//! Vulkan device serves it from one thread. Vulkan's f32 matrix products may
//! round through f16, hence the wider tolerances; token streams are reported,
//! not required to match (a flip between two near-equal logits is legitimate),
//! and so is the waveform from the mel (see `Tolerances::waveform_from_mel`).

mod common;

use common::suites::{self, Tolerances};
use engine_core::model_kit::OpPolicy;
use ggml_sys::TYPE_F32;

const VULKAN: Tolerances = Tolerances { logits: 2e-3, encoder: 2e-3, cfm: 5e-3, hift_body: 5e-3, waveform: 5e-3, waveform_from_mel: None, exact_tokens: false };

#[test]
fn parity_suite_on_vulkan() {
    // Every stage on both paths: composed ops and explicit attention (what a
    // deny rule falls back to), then the device's native ops and fused attention.
    for policy in [OpPolicy::reference(), OpPolicy::native(TYPE_F32)] {
        suites::t3("vulkan", &policy, &VULKAN);
        suites::encoder("vulkan", &policy, &VULKAN);
        suites::cfm("vulkan", &policy, &VULKAN);
        suites::hift("vulkan", &policy, &VULKAN);
        suites::pipeline("vulkan", &policy, &VULKAN);
    }
}
