//! The Supertonic tensor table: every tensor the graphs use, with the shape the
//! hparams imply (docs/gguf.md). [`table`] mirrors the graph builders block by
//! block; the loader checks a file against it before reading any weight.

use crate::hparams::{AttnEncoderHp, ConvNextHp, CrossAttnHp, Hparams};
use engine_core::model_kit::{Dim, Storage, TensorTable};

/// The code-point → row table (`unicode_indexer.json`).
pub const INDEXER: &str = "text.indexer";
/// Code points the indexer covers (the official code casts to uint16).
pub const INDEXER_LEN: usize = 65536;

/// `voice.<name>.style_ttl` / `.style_dp`.
pub fn voice_tensors(name: &str) -> (String, String) {
    (format!("voice.{name}.style_ttl"), format!("voice.{name}.style_dp"))
}

/// Rows of the character embeddings: the indexer's vocabulary, which the
/// metadata does not repeat (a free dimension of the table; I16 indexer ids).
pub const VOCAB: &str = "vocab";

/// Every tensor of a Supertonic file with `voices` embedded.
pub fn table(hp: &Hparams, voices: &[String]) -> TensorTable {
    let mut t = TensorTable::new();
    t.free_dim(VOCAB, 1..=i16::MAX as usize);
    let vocab = Dim::Free(VOCAB);
    t.add(INDEXER, &[INDEXER_LEN], Storage::Index);
    for v in voices {
        let (ttl, dp) = voice_tensors(v);
        t.f32(ttl, &[hp.style_dim, hp.style_tokens]).f32(dp, &[hp.dp.style_dim, hp.dp.style_tokens]);
    }

    // Duration predictor.
    let dp = &hp.dp;
    t.add_dims("dp.char_emb", &[dp.char_dim.into(), vocab], Storage::F32).f32("dp.sentence_token", &[dp.char_dim]);
    convnext_stack(&mut t, "dp.convnext", dp.char_dim, &dp.convnext);
    attention_encoder(&mut t, "dp.attn", dp.char_dim, &dp.attn);
    t.matrix("dp.proj_out.weight", dp.char_dim, dp.char_dim);
    t.linear("dp.pred.0", dp.char_dim + dp.style_tokens * dp.style_dim, dp.predictor_hidden);
    t.linear("dp.pred.1", dp.predictor_hidden, 1);
    t.f32("dp.pred.prelu", &[1]);

    // Text encoder.
    let te = &hp.te;
    t.add_dims("te.char_emb", &[te.char_dim.into(), vocab], Storage::F32);
    convnext_stack(&mut t, "te.convnext", te.char_dim, &te.convnext);
    attention_encoder(&mut t, "te.attn", te.char_dim, &te.attn);
    for i in [1, 2] {
        cross_attention(&mut t, &format!("te.spte.{i}"), te.char_dim, hp.style_dim, hp.style_tokens, &te.spte);
    }
    t.norm("te.spte.ln", te.char_dim);

    // Vector estimator.
    let ve = &hp.ve;
    let text_head = ve.text_attn.units / ve.text_attn.heads;
    t.matrix("ve.proj_in.weight", hp.latent_channels(), ve.hidden);
    t.matrix("ve.proj_out.weight", ve.hidden, hp.latent_channels());
    t.f32("ve.time.freqs", &[ve.time_dim / 2]).f32("ve.rope.theta", &[text_head / 2]);
    t.linear("ve.time.mlp0", ve.time_dim, ve.time_hidden);
    t.linear("ve.time.mlp2", ve.time_hidden, ve.time_dim);
    for g in 0..ve.blocks {
        let p = format!("ve.block.{g}");
        convnext_stack(&mut t, &format!("{p}.convnext0"), ve.hidden, &ve.convnext0);
        t.linear(&format!("{p}.time"), ve.time_dim, ve.hidden);
        convnext_stack(&mut t, &format!("{p}.convnext1"), ve.hidden, &ve.convnext1);
        let a = &ve.text_attn;
        t.linear(&format!("{p}.text_attn.q"), ve.hidden, a.units);
        t.linear(&format!("{p}.text_attn.k"), te.char_dim, a.units);
        t.linear(&format!("{p}.text_attn.v"), te.char_dim, a.units);
        t.linear(&format!("{p}.text_attn.o"), a.units, ve.hidden);
        t.norm(&format!("{p}.text_attn.ln"), ve.hidden);
        convnext_stack(&mut t, &format!("{p}.convnext2"), ve.hidden, &ve.convnext2);
        cross_attention(&mut t, &format!("{p}.style_attn"), ve.hidden, hp.style_dim, hp.style_tokens, &ve.style_attn);
        t.norm(&format!("{p}.style_attn.ln"), ve.hidden);
        if ve.cfg.is_some() {
            t.f32(format!("{p}.style_attn.keys_uncond"), &[ve.style_attn.units, hp.style_tokens]);
        }
    }
    convnext_stack(&mut t, "ve.last_convnext", ve.hidden, &ve.last_convnext);
    if ve.cfg.is_some() {
        t.f32("ve.uncond.text_token", &[te.char_dim]).f32("ve.uncond.style_values", &[hp.style_dim, hp.style_tokens]);
    }

    // Vocoder.
    let v = &hp.vocoder;
    t.f32("voc.latent_mean", &[hp.latent_dim]).f32("voc.latent_std", &[hp.latent_dim]);
    t.linear("voc.embed", v.kernel_init * hp.latent_dim, v.hidden);
    convnext_stack(&mut t, "voc.convnext", v.hidden, &v.convnext);
    for name in ["weight", "bias", "mean", "var"] {
        t.f32(format!("voc.bn.{name}"), &[v.hidden]);
    }
    t.linear("voc.head1", v.head_kernel * v.hidden, v.head_hidden);
    t.f32("voc.head.prelu", &[1]);
    t.matrix("voc.head2.weight", v.head_hidden, hp.base_chunk_size);
    t
}

/// ConvNeXt blocks on `c` channels (`graph::blocks::Builder::convnext`); the
/// depthwise taps are read as F32 views.
fn convnext_stack(t: &mut TensorTable, prefix: &str, c: usize, hp: &ConvNextHp) {
    for i in 0..hp.dilations.len() {
        let p = format!("{prefix}.{i}");
        t.f32(format!("{p}.dw.weight"), &[c, hp.kernel]).f32(format!("{p}.dw.bias"), &[c]);
        t.norm(&format!("{p}.ln"), c);
        t.linear(&format!("{p}.pw1"), c, hp.inner);
        t.linear(&format!("{p}.pw2"), hp.inner, c);
        t.f32(format!("{p}.gamma"), &[c]);
    }
}

/// Relative-position attention layers on `c` channels.
fn attention_encoder(t: &mut TensorTable, prefix: &str, c: usize, hp: &AttnEncoderHp) {
    for i in 0..hp.layers {
        let p = format!("{prefix}.{i}");
        for m in ["q", "k", "v", "o"] {
            t.linear(&format!("{p}.{m}"), c, c);
        }
        let rel = [c / hp.heads, 2 * hp.window + 1];
        t.f32(format!("{p}.rel_k"), &rel).f32(format!("{p}.rel_v"), &rel);
        t.norm(&format!("{p}.ln1"), c).norm(&format!("{p}.ln2"), c);
        t.linear(&format!("{p}.ffn.up"), c, hp.filter);
        t.linear(&format!("{p}.ffn.down"), hp.filter, c);
    }
}

/// Cross-attention from `c` channels over style tokens (precomputed tanh keys).
fn cross_attention(t: &mut TensorTable, prefix: &str, c: usize, style_dim: usize, style_tokens: usize, hp: &CrossAttnHp) {
    t.linear(&format!("{prefix}.q"), c, hp.units);
    t.linear(&format!("{prefix}.v"), style_dim, hp.units);
    t.linear(&format!("{prefix}.o"), hp.units, c);
    t.f32(format!("{prefix}.keys"), &[hp.units, style_tokens]);
}
