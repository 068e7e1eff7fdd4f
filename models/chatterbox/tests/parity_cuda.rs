//! The parity suite on the CUDA plugin, where a CUDA module and device exist
//! (the GPU host); elsewhere the test says it is skipped. ggml-cuda's f32
//! matrix products run on tensor cores with TF32 inputs, hence tolerances
//! like Vulkan's; token streams are reported, not required to match, and so is
//! the waveform from the mel (see `Tolerances::waveform_from_mel`).

mod common;

use common::suites::{self, Tolerances};
use engine_core::model_kit::OpPolicy;
use ggml_sys::{TYPE_F16, TYPE_F32};
use tts_model_chatterbox::t3::T3;

const CUDA: Tolerances = Tolerances { logits: 2e-3, encoder: 2e-3, cfm: 5e-3, hift_body: 5e-3, waveform: 5e-3, waveform_from_mel: None, exact_tokens: false };

#[test]
fn parity_suite_on_cuda() {
    if !common::available("cuda") {
        return;
    }
    // Every stage on both paths: composed ops and explicit attention (what a
    // deny rule falls back to), then the device's native ops and fused attention.
    for policy in [OpPolicy::reference(), OpPolicy::native(TYPE_F32)] {
        suites::t3("cuda", &policy, &CUDA);
        suites::encoder("cuda", &policy, &CUDA);
        suites::cfm("cuda", &policy, &CUDA);
        suites::hift("cuda", &policy, &CUDA);
        suites::pipeline("cuda", &policy, &CUDA);
    }
    // The cache GPUs run with: fused attention over F16 K/V (bound as on the CPU).
    let handle = common::open("cuda");
    let mut t3 = T3::load(&common::t3_file(), handle.ggml_backend(), &OpPolicy::native(TYPE_F16)).unwrap();
    let e = suites::teacher_forced(&mut t3);
    println!("  cuda: T3 teacher-forced logits (flash, F16 K/V): rel err {e:.3e} (tolerance 1e-2)");
    assert!(e <= 1e-2, "F16 cache drift {e:.3e}");
}
