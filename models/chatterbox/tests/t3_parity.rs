//! T3 parity on CPU against the reference run (`t3_*` dumps): teacher-forced
//! logits over the prefill and 20 cached steps, greedy tokens, every sampler
//! stage on recorded rows, and the sampled token stream with the reference's
//! uniform draws. Both attention paths (explicit, fused) are checked.

mod common;

use common::{check, npy, npy_i64, open};
use ggml_sys::{TYPE_F16, TYPE_F32};
use tts_model_chatterbox::sampler::{self, SamplingParams, UniformSource};
use tts_model_chatterbox::t3::{self, AttentionConfig, AttentionPath, TokenChoice, T3};

const LOGITS_TOL: f32 = 1e-4;

fn load(handle: &engine_core::abi::BackendHandle, attention: AttentionConfig) -> T3 {
    T3::load(
        &common::fixture_dir().join("t3-turbo.gguf"),
        handle.ggml_backend(),
        attention,
    )
    .unwrap()
}

fn text_ids() -> Vec<i32> {
    npy_i64("t3_text_ids")
        .into_iter()
        .map(|v| v as i32)
        .collect()
}

/// Max relative error over the teacher-forced rows.
fn teacher_forced(t3: &mut T3) -> f32 {
    let (shape, reference) = npy("t3_tf_logits");
    let (rows, vocab) = (shape[0] as usize, shape[1] as usize);
    let tokens = npy_i64("t3_tf_tokens");
    let cond = t3.builtin_voice().unwrap();
    let mut worst = 0f32;
    let mut logits = t3.prefill(&cond, &text_ids(), rows).unwrap();
    for r in 0..rows {
        let e = common::rel_err(&logits, &reference[r * vocab..(r + 1) * vocab]);
        worst = worst.max(e);
        if r + 1 < rows {
            logits = t3.step(tokens[r] as u32).unwrap();
        }
    }
    worst
}

#[test]
fn t3_logits_greedy_and_sampling_match_the_reference() {
    let handle = open("cpu");
    for (name, attention) in [
        ("explicit", AttentionConfig::REFERENCE),
        (
            "flash f32",
            AttentionConfig {
                path: AttentionPath::Flash,
                kv_type: TYPE_F32,
            },
        ),
    ] {
        let mut t3 = load(&handle, attention);
        let e = teacher_forced(&mut t3);
        println!(
            "  T3 teacher-forced logits ({name}): rel err {e:.3e} (tolerance {LOGITS_TOL:.0e})"
        );
        assert!(
            e <= LOGITS_TOL,
            "{name}: teacher-forced logits differ by {e:.3e}"
        );
        // A second sequence on the same cache must not see the first one.
        let e2 = teacher_forced(&mut t3);
        assert!(e2 <= LOGITS_TOL, "{name}: second run differs by {e2:.3e}");

        let cond = t3.builtin_voice().unwrap();
        let greedy: Vec<u32> = npy_i64("t3_greedy_tokens")
            .into_iter()
            .map(|v| v as u32)
            .collect();
        let (tokens, _) = t3::generate(
            &mut t3,
            &cond,
            &text_ids(),
            &mut TokenChoice::Greedy,
            greedy.len() - 1,
        )
        .unwrap();
        assert_eq!(tokens, greedy, "{name}: greedy tokens");

        let sampled: Vec<u32> = npy_i64("t3_sampled_tokens")
            .into_iter()
            .map(|v| v as u32)
            .collect();
        let uniforms = npy("t3_sampled_uniforms").1;
        let mut choice =
            TokenChoice::Sample(SamplingParams::default(), UniformSource::recorded(uniforms));
        let (tokens, _) =
            t3::generate(&mut t3, &cond, &text_ids(), &mut choice, sampled.len() - 1).unwrap();
        assert_eq!(
            tokens, sampled,
            "{name}: sampled tokens with the reference's uniforms"
        );
    }
}

#[test]
fn f16_cache_drift_is_small() {
    let handle = open("cpu");
    let mut t3 = load(
        &handle,
        AttentionConfig {
            path: AttentionPath::Flash,
            kv_type: TYPE_F16,
        },
    );
    let e = teacher_forced(&mut t3);
    println!("  T3 teacher-forced logits (flash, F16 K/V): rel err {e:.3e} (tolerance 1e-2)");
    assert!(e <= 1e-2, "F16 cache drift {e:.3e}");
}

#[test]
fn sampler_stages_match_the_reference_rows() {
    let params = SamplingParams::default();
    for row in [5, 17] {
        let raw = npy(&format!("t3_sampler_r{row}_in")).1;
        let history: Vec<u32> = npy_i64(&format!("t3_sampler_r{row}_input_ids"))
            .into_iter()
            .map(|v| v as u32)
            .collect();
        let stage = |s: &str| npy(&format!("t3_sampler_r{row}_{s}")).1;
        let mut l = raw.clone();
        sampler::apply_temperature(&mut l, params.temperature);
        check(
            &format!("row {row} temperature"),
            &l,
            &stage("temperature"),
            1e-6,
        );
        sampler::apply_top_k(&mut l, params.top_k);
        check(&format!("row {row} top-k"), &l, &stage("top_k"), 1e-6);
        sampler::apply_top_p(&mut l, params.top_p);
        check(&format!("row {row} top-p"), &l, &stage("top_p"), 1e-6);
        sampler::apply_repetition_penalty(&mut l, &history, params.repetition_penalty);
        check(
            &format!("row {row} repetition penalty"),
            &l,
            &stage("rep_penalty"),
            1e-6,
        );
        assert_eq!(l, sampler::process(&raw, &history, &params));
        check(
            &format!("row {row} probabilities"),
            &sampler::softmax(&l),
            &stage("probs"),
            1e-5,
        );
    }
}
