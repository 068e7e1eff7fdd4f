//! T3, the speech-token generator: the official state dict → the engine's
//! names (docs/gguf.md, `t3-<variant>.gguf`), as convert.py's `t3_tensors`
//! (GPT-2: Turbo, Nano) and `t3_llama_tensors` (Llama: Multilingual) map it.
//! GPT-2's Conv1D weights (`[in, out]`) are transposed to Linear ones; the
//! Llama's Q, K, V projections are stacked into one `attn.qkv` (rows Q, K, V)
//! and gate and up into one `ffn.gate_up` (ggml's SwiGLU takes the pair).
//! Every tensor read is checked against the shape the derived
//! hyper-parameters imply, so a mislabelled file is refused naming the tensor.

use super::plan::Planned;
use super::source::Source;
use engine_core::model_kit::convert::MetaValue;
use engine_core::model_kit::Result;
use indexmap::IndexMap;

/// GPT-2 fixes the head width at 64 for every size (small 12×64, medium 16×64).
pub const GPT2_HEAD_DIM: usize = 64;
/// Perceiver(): AttentionBlock2(1024, 4 heads).
pub const PERCEIVER_HEADS: usize = 4;
/// AlignmentStreamAnalyzer's LLAMA_ALIGNED_HEADS: (layer, head) pairs whose
/// attention over the text tracks where speech is.
pub const ALIGNED_HEADS: [(usize, usize); 3] = [(12, 15), (13, 11), (9, 2)];

/// The planned tensors, the hyper-parameters (`chatterbox.<key>`, all u32, in
/// convert.py's order) and any further metadata of one T3.
pub struct T3Plan<'a> {
    pub tensors: IndexMap<String, Planned<'a>>,
    pub hparams: Vec<(&'static str, usize)>,
    pub extra: Vec<(&'static str, MetaValue)>,
}

impl T3Plan<'_> {
    pub fn hparam(&self, key: &str) -> usize {
        self.hparams.iter().find(|(k, _)| *k == key).map_or(0, |&(_, v)| v)
    }
}

/// Plans `name` as read, after checking it is float of shape `want`.
fn plain<'a>(src: &'a Source, out: &mut IndexMap<String, Planned<'a>>, engine: String, name: &str, want: &[usize]) -> Result<()> {
    expect(src, name, want)?;
    out.insert(engine, Planned { shape: want.to_vec(), integer: false, produce: src.plain(name) });
    Ok(())
}

fn expect(src: &Source, name: &str, want: &[usize]) -> Result<()> {
    src.float(name)?;
    src.shapes().expect(name, want)
}

/// The GPT-2 T3 of Turbo and Nano.
pub fn plan_gpt2(src: &Source, n_head: Option<usize>) -> Result<T3Plan<'_>> {
    let s = src.shapes();
    let n_layer = s.count("tfmr.h")?;
    let wpe = s.shape("tfmr.wpe.weight")?;
    let [n_ctx, n_embd] = *wpe else {
        return Err(s.error(format_args!("tensor 'tfmr.wpe.weight' has shape {wpe:?}, expected [positions, width]")));
    };
    let n_head = match n_head {
        Some(h) => h,
        None if !n_embd.is_multiple_of(GPT2_HEAD_DIM) => {
            return Err(s.error(format_args!("GPT-2 width {n_embd} is not a multiple of the head width {GPT2_HEAD_DIM}; give t3_heads")));
        }
        None => n_embd / GPT2_HEAD_DIM,
    };
    if n_head == 0 || !n_embd.is_multiple_of(n_head) {
        return Err(s.error(format_args!("GPT-2 width {n_embd} does not split into {n_head} heads")));
    }
    let n_ff = s.dim("tfmr.h.0.mlp.c_fc.weight", 1)?;
    let text_vocab = s.dim("text_emb.weight", 0)?;
    let speech_vocab = s.dim("speech_emb.weight", 0)?;
    let speaker_dim = s.dim("cond_enc.spkr_enc.weight", 1)?;

    let mut out = IndexMap::new();
    plain(src, &mut out, "t3.wpe".into(), "tfmr.wpe.weight", &[n_ctx, n_embd])?;
    plain(src, &mut out, "t3.ln_f.weight".into(), "tfmr.ln_f.weight", &[n_embd])?;
    plain(src, &mut out, "t3.ln_f.bias".into(), "tfmr.ln_f.bias", &[n_embd])?;
    for i in 0..n_layer {
        let (p, q) = (format!("tfmr.h.{i}"), format!("t3.blk.{i}"));
        for (a, b) in [("ln_1", "ln1"), ("ln_2", "ln2")] {
            plain(src, &mut out, format!("{q}.{b}.weight"), &format!("{p}.{a}.weight"), &[n_embd])?;
            plain(src, &mut out, format!("{q}.{b}.bias"), &format!("{p}.{a}.bias"), &[n_embd])?;
        }
        // Conv1D weights are [in, out]: transposed to a Linear's [out, in].
        for (a, b, inner, outer) in [
            ("attn.c_attn", "attn.qkv", n_embd, 3 * n_embd),
            ("attn.c_proj", "attn.out", n_embd, n_embd),
            ("mlp.c_fc", "ffn.up", n_embd, n_ff),
            ("mlp.c_proj", "ffn.down", n_ff, n_embd),
        ] {
            let w = format!("{p}.{a}.weight");
            expect(src, &w, &[inner, outer])?;
            out.insert(format!("{q}.{b}.weight"), Planned { shape: vec![outer, inner], integer: false, produce: src.transposed(&w) });
            plain(src, &mut out, format!("{q}.{b}.bias"), &format!("{p}.{a}.bias"), &[outer])?;
        }
    }
    plain(src, &mut out, "t3.text_emb".into(), "text_emb.weight", &[text_vocab, n_embd])?;
    plain(src, &mut out, "t3.speech_emb".into(), "speech_emb.weight", &[speech_vocab, n_embd])?;
    plain(src, &mut out, "t3.speech_head.weight".into(), "speech_head.weight", &[speech_vocab, n_embd])?;
    plain(src, &mut out, "t3.speech_head.bias".into(), "speech_head.bias", &[speech_vocab])?;
    plain(src, &mut out, "t3.cond.spkr.weight".into(), "cond_enc.spkr_enc.weight", &[n_embd, speaker_dim])?;
    plain(src, &mut out, "t3.cond.spkr.bias".into(), "cond_enc.spkr_enc.bias", &[n_embd])?;
    let hparams = vec![
        ("n_layer", n_layer),
        ("n_embd", n_embd),
        ("n_head", n_head),
        ("n_ctx", n_ctx),
        ("n_ff", n_ff),
        ("text_vocab", text_vocab),
        ("speech_vocab", speech_vocab),
        ("speaker_dim", speaker_dim),
    ];
    Ok(T3Plan { tensors: out, hparams, extra: Vec::new() })
}

/// The Llama T3 of Multilingual.
pub fn plan_llama<'a>(src: &'a Source, n_head: Option<usize>, aligned_heads: Option<&[(usize, usize)]>) -> Result<T3Plan<'a>> {
    let s = src.shapes();
    if s.contains("model") && !s.names().any(|k| k.starts_with("tfmr.")) {
        return Err(s.error("the T3 file is a legacy {'model': [...]} wrapper; save its state dict as safetensors"));
    }
    let n_layer = s.count("tfmr.layers")?;
    let q_width = s.dim("tfmr.layers.0.self_attn.q_proj.weight", 0)?;
    let kv_width = s.dim("tfmr.layers.0.self_attn.k_proj.weight", 0)?;
    let n_embd = s.dim("tfmr.norm.weight", 0)?;
    let n_head = match n_head {
        Some(h) => h,
        None if !q_width.is_multiple_of(GPT2_HEAD_DIM) || !kv_width.is_multiple_of(GPT2_HEAD_DIM) => {
            return Err(s.error(format_args!("Llama query width {q_width} / key width {kv_width} are not multiples of 64; give t3_heads")));
        }
        None => q_width / GPT2_HEAD_DIM,
    };
    if n_head == 0 || q_width == 0 || !q_width.is_multiple_of(n_head) {
        return Err(s.error(format_args!("Llama query width {q_width} does not split into {n_head} heads")));
    }
    let head_dim = q_width / n_head;
    if kv_width == 0 || !kv_width.is_multiple_of(head_dim) || !n_head.is_multiple_of(kv_width / head_dim) {
        return Err(s.error(format_args!("Llama key width {kv_width} is not a divisor count of {head_dim}-wide heads of {n_head}")));
    }
    let n_ff = s.dim("tfmr.layers.0.mlp.gate_proj.weight", 0)?;
    let text_vocab = s.dim("text_emb.weight", 0)?;
    let speech_vocab = s.dim("speech_emb.weight", 0)?;
    let speaker_dim = s.dim("cond_enc.spkr_enc.weight", 1)?;
    let text_positions = s.dim("text_pos_emb.emb.weight", 0)?;
    let speech_positions = s.dim("speech_pos_emb.emb.weight", 0)?;

    let mut out = IndexMap::new();
    plain(src, &mut out, "t3.norm_f.weight".into(), "tfmr.norm.weight", &[n_embd])?;
    for i in 0..n_layer {
        let (p, q) = (format!("tfmr.layers.{i}"), format!("t3.blk.{i}"));
        plain(src, &mut out, format!("{q}.attn_norm.weight"), &format!("{p}.input_layernorm.weight"), &[n_embd])?;
        plain(src, &mut out, format!("{q}.ffn_norm.weight"), &format!("{p}.post_attention_layernorm.weight"), &[n_embd])?;
        let qkv: Vec<String> = ["q", "k", "v"].iter().map(|x| format!("{p}.self_attn.{x}_proj.weight")).collect();
        for (name, rows) in qkv.iter().zip([q_width, kv_width, kv_width]) {
            expect(src, name, &[rows, n_embd])?;
        }
        out.insert(format!("{q}.attn.qkv.weight"), Planned { shape: vec![q_width + 2 * kv_width, n_embd], integer: false, produce: src.stacked(qkv) });
        plain(src, &mut out, format!("{q}.attn.out.weight"), &format!("{p}.self_attn.o_proj.weight"), &[n_embd, q_width])?;
        let gate_up: Vec<String> = ["gate", "up"].iter().map(|x| format!("{p}.mlp.{x}_proj.weight")).collect();
        for name in &gate_up {
            expect(src, name, &[n_ff, n_embd])?;
        }
        out.insert(format!("{q}.ffn.gate_up.weight"), Planned { shape: vec![2 * n_ff, n_embd], integer: false, produce: src.stacked(gate_up) });
        plain(src, &mut out, format!("{q}.ffn.down.weight"), &format!("{p}.mlp.down_proj.weight"), &[n_embd, n_ff])?;
    }
    plain(src, &mut out, "t3.text_emb".into(), "text_emb.weight", &[text_vocab, n_embd])?;
    plain(src, &mut out, "t3.speech_emb".into(), "speech_emb.weight", &[speech_vocab, n_embd])?;
    plain(src, &mut out, "t3.text_pos".into(), "text_pos_emb.emb.weight", &[text_positions, n_embd])?;
    plain(src, &mut out, "t3.speech_pos".into(), "speech_pos_emb.emb.weight", &[speech_positions, n_embd])?;
    plain(src, &mut out, "t3.speech_head.weight".into(), "speech_head.weight", &[speech_vocab, n_embd])?;
    plain(src, &mut out, "t3.cond.spkr.weight".into(), "cond_enc.spkr_enc.weight", &[n_embd, speaker_dim])?;
    plain(src, &mut out, "t3.cond.spkr.bias".into(), "cond_enc.spkr_enc.bias", &[n_embd])?;
    plain(src, &mut out, "t3.cond.emotion.weight".into(), "cond_enc.emotion_adv_fc.weight", &[n_embd, 1])?;

    let c = "cond_enc.perceiver";
    let query = format!("{c}.pre_attention_query");
    let size: usize = src.float(&query)?.iter().product();
    if n_embd == 0 || !size.is_multiple_of(n_embd) {
        return Err(s.error(format_args!("tensor '{query}' has {size} values, not rows of the width {n_embd}")));
    }
    let queries = size / n_embd;
    out.insert("t3.perceiver.query".into(), Planned { shape: vec![queries, n_embd], integer: false, produce: src.reshaped(&query, vec![queries, n_embd]) });
    for (a, b) in [("norm", "norm"), ("to_q", "q"), ("to_k", "k"), ("to_v", "v"), ("proj_out", "out")] {
        let weight_shape: &[usize] = if a == "norm" { &[n_embd] } else { &[n_embd, n_embd] };
        plain(src, &mut out, format!("t3.perceiver.{b}.weight"), &format!("{c}.attn.{a}.weight"), weight_shape)?;
        plain(src, &mut out, format!("t3.perceiver.{b}.bias"), &format!("{c}.attn.{a}.bias"), &[n_embd])?;
    }
    let aligned = aligned_heads.unwrap_or(&ALIGNED_HEADS);
    for &(layer, head) in aligned {
        if layer >= n_layer || head >= n_head {
            return Err(s.error(format_args!("aligned head ({layer}, {head}) is outside {n_layer} layers of {n_head} heads; give aligned_heads")));
        }
    }
    if !n_embd.is_multiple_of(PERCEIVER_HEADS) {
        return Err(s.error(format_args!("the perceiver's width {n_embd} does not split into {PERCEIVER_HEADS} heads")));
    }
    let hparams = vec![
        ("n_layer", n_layer),
        ("n_embd", n_embd),
        ("n_head", n_head),
        ("n_head_kv", kv_width / head_dim),
        ("head_dim", head_dim),
        ("n_ff", n_ff),
        ("text_vocab", text_vocab),
        ("speech_vocab", speech_vocab),
        ("speaker_dim", speaker_dim),
        ("text_positions", text_positions),
        ("speech_positions", speech_positions),
        ("perceiver.queries", queries),
        ("perceiver.n_head", PERCEIVER_HEADS),
    ];
    let pairs = aligned.iter().flat_map(|&(l, h)| [l as i32, h as i32]).collect();
    Ok(T3Plan { tensors: out, hparams, extra: vec![("aligned_heads", MetaValue::ArrI32(pairs))] })
}
