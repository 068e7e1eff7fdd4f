//! Multilingual's guided sampling chain against transformers' own logits
//! processors, stage by stage (`tools/chatterbox/mtl_sampler_cases.py`:
//! combine, repetition penalty, temperature, min-p, top-p, probabilities).

use std::path::PathBuf;
use tts_model_chatterbox::sampler::{apply_min_p, apply_repetition_penalty, apply_top_p, combine_guidance, process_guided, softmax, GuidedSamplingParams};

#[derive(serde::Deserialize)]
struct Case {
    cfg_weight: f32,
    repetition_penalty: f32,
    temperature: f32,
    min_p: f32,
    top_p: f64,
    history: Vec<u32>,
    cond: Vec<Option<f32>>,
    uncond: Vec<Option<f32>>,
    combined: Vec<Option<f32>>,
    penalised: Vec<Option<f32>>,
    tempered: Vec<Option<f32>>,
    after_min_p: Vec<Option<f32>>,
    processed: Vec<Option<f32>>,
    probs: Vec<Option<f32>>,
}

#[derive(serde::Deserialize)]
struct Cases {
    cases: Vec<Case>,
}

fn row(values: &[Option<f32>]) -> Vec<f32> {
    values.iter().map(|v| v.unwrap_or(f32::NEG_INFINITY)).collect()
}

/// Largest difference relative to the row's largest finite magnitude; both
/// rows must be −∞ in the same places.
fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.is_finite(), w.is_finite(), "entry {i}: {g} vs {w}");
    }
    let scale = want.iter().filter(|v| v.is_finite()).fold(0f32, |m, v| m.max(v.abs())).max(f32::MIN_POSITIVE);
    got.iter().zip(want).filter(|(g, _)| g.is_finite()).map(|(g, w)| (g - w).abs() / scale).fold(0.0, f32::max)
}

#[test]
fn guided_chain_matches_transformers_processors() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/chatterbox/mtl-sampler/cases.json");
    let cases: Cases = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(cases.cases.len(), 6);
    for (n, c) in cases.cases.iter().enumerate() {
        let (cond, uncond) = (row(&c.cond), row(&c.uncond));
        // Arithmetic stages are exact; the filters compare f32 softmaxes, which
        // differ from torch's in the last bits only.
        let mut l = combine_guidance(&cond, &uncond, c.cfg_weight);
        assert_eq!(l, row(&c.combined), "case {n} combine");
        apply_repetition_penalty(&mut l, &c.history, c.repetition_penalty);
        assert_eq!(l, row(&c.penalised), "case {n} penalty");
        if c.temperature != 1.0 {
            l.iter_mut().for_each(|v| *v /= c.temperature);
        }
        assert_eq!(l, row(&c.tempered), "case {n} temperature");
        apply_min_p(&mut l, c.min_p);
        assert_eq!(l, row(&c.after_min_p), "case {n} min-p");
        apply_top_p(&mut l, c.top_p);
        assert_eq!(l, row(&c.processed), "case {n} top-p");
        let params = GuidedSamplingParams {
            cfg_weight: c.cfg_weight,
            repetition_penalty: c.repetition_penalty,
            temperature: c.temperature,
            min_p: c.min_p,
            top_p: c.top_p,
        };
        assert_eq!(process_guided(&cond, &uncond, &c.history, &params), l, "case {n} chain");
        let e = rel_err(&softmax(&l), &row(&c.probs));
        assert!(e <= 1e-6, "case {n} probabilities rel err {e:.3e}");
    }
}
