//! The Chatterbox tensor tables, one per file: every tensor the graphs and the
//! host-side stages use, with the shape the hparams imply (docs/gguf.md). They
//! mirror the graph builders (`t3/gpt2.rs`, `s3gen/{encoder,cfm,hift}.rs`) block
//! by block; the loaders check a file against them before reading any weight.

use crate::hparams::{
    Backbone, CampplusHparams, CfmHparams, EncoderHparams, HiftHparams, LlamaHparams, S3GenHparams, T3Hparams, TokenizerHparams, VoiceEncoderHparams,
};
use engine_core::model_kit::{Dim, Storage, TensorTable};

pub const T3_SPEAKER_EMB: &str = "voice.builtin.speaker_emb";
pub const T3_PROMPT_TOKENS: &str = "voice.builtin.prompt_speech_tokens";
pub const S3_PROMPT_TOKEN: &str = "voice.builtin.prompt_token";
pub const S3_PROMPT_FEAT: &str = "voice.builtin.prompt_feat";
pub const S3_EMBEDDING: &str = "voice.builtin.embedding";
/// Sizes the metadata does not carry (free dimensions of the S3Gen table): the
/// F0 predictor's width and the built-in voice's prompt lengths.
pub const F0_CHANNELS: &str = "f0_channels";
pub const PROMPT_FRAMES: &str = "prompt_frames";
pub const PROMPT_TOKENS: &str = "prompt_tokens";

/// A saved voice (`cloning/voice_file.rs`): the same five arrays as a built-in voice.
pub const VOICE_SPEAKER_EMB: &str = "voice.speaker_emb";
pub const VOICE_PROMPT_SPEECH_TOKENS: &str = "voice.prompt_speech_tokens";
pub const VOICE_PROMPT_TOKEN: &str = "voice.prompt_token";
pub const VOICE_PROMPT_FEAT: &str = "voice.prompt_feat";
pub const VOICE_EMBEDDING: &str = "voice.embedding";

/// Derived at load (not in the file): the rotary frequency divisors.
pub const T3_ROPE_FREQ_FACTORS: &str = "t3.rope_freq_factors";

/// The T3 file's tensors voice cloning reads: the voice encoder's.
pub fn is_t3_cloning_tensor(name: &str) -> bool {
    name.starts_with("ve.")
}

/// The S3Gen file's tensors voice cloning reads: CAMPPlus's and the
/// S3Tokenizer's (its carried mel filters and window included: the front end
/// computes both, and they are small).
pub fn is_s3gen_cloning_tensor(name: &str) -> bool {
    name.starts_with("campplus.") || name.starts_with("s3tok.")
}

/// `t3-<variant>.gguf`, by backbone.
pub fn t3_table(hp: &T3Hparams) -> TensorTable {
    let mut t = match &hp.backbone {
        Backbone::Gpt2 => t3_gpt2(hp),
        Backbone::Llama(l) => t3_llama(hp, l),
    };
    t.f32(T3_SPEAKER_EMB, &[hp.speaker_dim]).i32(T3_PROMPT_TOKENS, &[hp.cond_prompt_len]);
    voice_encoder(&mut t, &hp.voice_encoder);
    t
}

/// The voice encoder (`cloning/voice_encoder.rs`): PyTorch's LSTM layers with
/// their gate rows in its order (input, forget, cell, output), then the
/// projection. Kept F32 whatever the weight policy: the recurrence compounds
/// rounding over every frame.
fn voice_encoder(t: &mut TensorTable, ve: &VoiceEncoderHparams) {
    let gates = 4 * ve.hidden;
    for l in 0..ve.layers {
        let inputs = if l == 0 { ve.n_mels } else { ve.hidden };
        let p = format!("ve.lstm.{l}");
        t.f32(format!("{p}.weight_ih"), &[inputs, gates]).f32(format!("{p}.weight_hh"), &[ve.hidden, gates]);
        t.f32(format!("{p}.bias_ih"), &[gates]).f32(format!("{p}.bias_hh"), &[gates]);
    }
    t.f32("ve.proj.weight", &[ve.hidden, ve.embedding]).f32("ve.proj.bias", &[ve.embedding]);
}

/// Llama (Multilingual): Q/K/V fused as `attn.qkv` (rows Q, K, V), gate and
/// up as `ffn.gate_up`, no biases; the perceiver's one attention block.
fn t3_llama(hp: &T3Hparams, l: &LlamaHparams) -> TensorTable {
    let d = hp.n_embd;
    let q = hp.n_head * l.head_dim;
    let mut t = TensorTable::new();
    t.f32("t3.text_emb", &[d, hp.text_vocab]).f32("t3.speech_emb", &[d, hp.speech_vocab]);
    t.f32("t3.text_pos", &[d, l.text_positions]).f32("t3.speech_pos", &[d, l.speech_positions]);
    for i in 0..hp.n_layer {
        let p = format!("t3.blk.{i}");
        t.f32(format!("{p}.attn_norm.weight"), &[d]).f32(format!("{p}.ffn_norm.weight"), &[d]);
        t.matrix(format!("{p}.attn.qkv.weight"), d, q + 2 * l.kv_width());
        t.matrix(format!("{p}.attn.out.weight"), q, d);
        t.matrix(format!("{p}.ffn.gate_up.weight"), d, 2 * hp.n_ff);
        t.matrix(format!("{p}.ffn.down.weight"), hp.n_ff, d);
    }
    t.f32("t3.norm_f.weight", &[d]);
    t.matrix("t3.speech_head.weight", d, hp.speech_vocab);
    t.linear("t3.cond.spkr", hp.speaker_dim, d);
    t.f32("t3.cond.emotion.weight", &[1, d]);
    t.f32("t3.perceiver.query", &[d, l.perceiver_queries]);
    t.norm("t3.perceiver.norm", d);
    for m in ["q", "k", "v", "out"] {
        t.linear(&format!("t3.perceiver.{m}"), d, d);
    }
    t
}

/// GPT-2 (Turbo, Nano).
fn t3_gpt2(hp: &T3Hparams) -> TensorTable {
    let d = hp.n_embd;
    let mut t = TensorTable::new();
    t.f32("t3.wpe", &[d, hp.n_ctx]).f32("t3.text_emb", &[d, hp.text_vocab]).f32("t3.speech_emb", &[d, hp.speech_vocab]);
    for l in 0..hp.n_layer {
        let p = format!("t3.blk.{l}");
        t.norm(&format!("{p}.ln1"), d).norm(&format!("{p}.ln2"), d);
        t.linear(&format!("{p}.attn.qkv"), d, 3 * d);
        t.linear(&format!("{p}.attn.out"), d, d);
        t.linear(&format!("{p}.ffn.up"), d, hp.n_ff);
        t.linear(&format!("{p}.ffn.down"), hp.n_ff, d);
    }
    t.norm("t3.ln_f", d);
    t.linear("t3.speech_head", d, hp.speech_vocab);
    t.linear("t3.cond.spkr", hp.speaker_dim, d);
    t
}

/// `s3gen-meanflow.gguf`: flow encoder, CFM estimator, HiFT and the built-in voice.
pub fn s3gen_table(hp: &S3GenHparams) -> TensorTable {
    let mut t = TensorTable::new();
    t.free_dim(F0_CHANNELS, 1..=65536).free_dim(PROMPT_FRAMES, 1..=65536).free_dim(PROMPT_TOKENS, 1..=32768);
    encoder(&mut t, hp);
    cfm(&mut t, &hp.cfm, hp.mel_channels, hp.meanflow);
    hift(&mut t, &hp.hift, hp.mel_channels);
    t.add_dims(S3_PROMPT_FEAT, &[hp.mel_channels.into(), Dim::Free(PROMPT_FRAMES)], Storage::F32);
    t.add_dims(S3_PROMPT_TOKEN, &[Dim::Free(PROMPT_TOKENS)], Storage::I32);
    t.f32(S3_EMBEDDING, &[hp.speaker_dim]);
    campplus(&mut t, &hp.campplus);
    s3_tokenizer(&mut t, &hp.tokenizer);
    t
}

/// The S3Tokenizer (`cloning/s3tokenizer.rs`), F32 as the converter keeps it.
/// Its mel filters and window are carried: the front end computes both.
fn s3_tokenizer(t: &mut TensorTable, tok: &TokenizerHparams) {
    let d = tok.n_state;
    let e = "s3tok.encoder";
    t.f32(format!("{e}.conv1.weight"), &[3, tok.n_mels, d]).f32(format!("{e}.conv1.bias"), &[d]);
    t.f32(format!("{e}.conv2.weight"), &[3, d, d]).f32(format!("{e}.conv2.bias"), &[d]);
    for l in 0..tok.n_layer {
        let p = format!("{e}.blocks.{l}");
        t.norm(&format!("{p}.attn_ln"), d).norm(&format!("{p}.mlp_ln"), d);
        for m in ["query", "value", "out"] {
            t.f32(format!("{p}.attn.{m}.weight"), &[d, d]).f32(format!("{p}.attn.{m}.bias"), &[d]);
        }
        t.f32(format!("{p}.attn.key.weight"), &[d, d]);
        t.f32(format!("{p}.attn.fsmn_block.weight"), &[tok.fsmn_kernel, 1, d]);
        t.f32(format!("{p}.mlp.0.weight"), &[d, tok.n_ff]).f32(format!("{p}.mlp.0.bias"), &[tok.n_ff]);
        t.f32(format!("{p}.mlp.2.weight"), &[tok.n_ff, d]).f32(format!("{p}.mlp.2.bias"), &[d]);
    }
    let q = "s3tok.quantizer._codebook.project_down";
    t.f32(format!("{q}.weight"), &[d, tok.fsq_dims]).f32(format!("{q}.bias"), &[tok.fsq_dims]);
    t.carry("s3tok._mel_filters").carry("s3tok.window");
}

/// A CAMPPlus batch norm: its prefix, width, and whether it is affine.
pub struct BatchNorm {
    pub prefix: String,
    pub channels: usize,
    pub affine: bool,
}

/// Every batch norm of CAMPPlus, in graph order: the table declares their
/// statistics, the loader folds each into a per-channel scale and shift.
pub fn campplus_batch_norms(c: &CampplusHparams) -> Vec<BatchNorm> {
    let bn = |prefix: String, channels: usize| BatchNorm { prefix, channels, affine: true };
    let hc = c.head_channels;
    let mut out = vec![bn("campplus.head.bn1".into(), hc)];
    for (stage, &blocks) in c.head_blocks.iter().enumerate() {
        for j in 0..blocks {
            let p = format!("campplus.head.layer{}.{j}", stage + 1);
            out.push(bn(format!("{p}.bn1"), hc));
            out.push(bn(format!("{p}.bn2"), hc));
            if j == 0 {
                out.push(bn(format!("{p}.shortcut.1"), hc));
            }
        }
    }
    out.push(bn("campplus.head.bn2".into(), hc));
    out.push(bn("campplus.tdnn.nl.bn".into(), c.channels));
    let (inputs, last) = c.block_inputs();
    for (b, (&layers, &input)) in c.block_layers.iter().zip(&inputs).enumerate() {
        for l in 0..layers {
            let p = format!("campplus.block{}.tdnnd{}", b + 1, l + 1);
            out.push(bn(format!("{p}.nl1.bn"), input + l * c.growth));
            out.push(bn(format!("{p}.nl2.bn"), c.bn_channels));
        }
        out.push(bn(format!("campplus.transit{}.nl.bn", b + 1), input + layers * c.growth));
    }
    out.push(bn("campplus.out_nonlinear.bn".into(), last));
    out.push(BatchNorm { prefix: "campplus.dense.nl.bn".into(), channels: c.embedding, affine: false });
    out
}

/// CAMPPlus (`cloning/campplus.rs`), in F32 (the converter keeps it so):
/// 2-D kernels `[kw, kh, in, out]`, 1-D ones `[k, in, out]`.
fn campplus(t: &mut TensorTable, c: &CampplusHparams) {
    let hc = c.head_channels;
    t.f32("campplus.head.conv1.weight", &[3, 3, 1, hc]);
    for (stage, &blocks) in c.head_blocks.iter().enumerate() {
        for j in 0..blocks {
            let p = format!("campplus.head.layer{}.{j}", stage + 1);
            t.f32(format!("{p}.conv1.weight"), &[3, 3, hc, hc]).f32(format!("{p}.conv2.weight"), &[3, 3, hc, hc]);
            if j == 0 {
                t.f32(format!("{p}.shortcut.0.weight"), &[1, 1, hc, hc]);
            }
        }
    }
    t.f32("campplus.head.conv2.weight", &[3, 3, hc, hc]);
    t.f32("campplus.tdnn.linear.weight", &[c.tdnn_kernel, hc * c.head_bins(), c.channels]);
    let (inputs, last) = c.block_inputs();
    for (b, ((&layers, &input), &kernel)) in c.block_layers.iter().zip(&inputs).zip(&c.block_kernels).enumerate() {
        for l in 0..layers {
            let p = format!("campplus.block{}.tdnnd{}", b + 1, l + 1);
            t.f32(format!("{p}.linear1.weight"), &[1, input + l * c.growth, c.bn_channels]);
            t.f32(format!("{p}.cam_layer.linear_local.weight"), &[kernel, c.bn_channels, c.growth]);
            t.f32(format!("{p}.cam_layer.linear1.weight"), &[1, c.bn_channels, c.cam_channels]).f32(format!("{p}.cam_layer.linear1.bias"), &[c.cam_channels]);
            t.f32(format!("{p}.cam_layer.linear2.weight"), &[1, c.cam_channels, c.growth]).f32(format!("{p}.cam_layer.linear2.bias"), &[c.growth]);
        }
        let full = input + layers * c.growth;
        t.f32(format!("campplus.transit{}.linear.weight", b + 1), &[1, full, full / 2]);
    }
    t.f32("campplus.dense.linear.weight", &[1, 2 * last, c.embedding]);
    for n in campplus_batch_norms(c) {
        if n.affine {
            t.norm(&n.prefix, n.channels);
        }
        t.f32(format!("{}.running_mean", n.prefix), &[n.channels]).f32(format!("{}.running_var", n.prefix), &[n.channels]);
    }
}

fn encoder(t: &mut TensorTable, hp: &S3GenHparams) {
    let e: &EncoderHparams = &hp.encoder;
    let d = e.n_embd;
    t.f32("flow.input_embedding.weight", &[d, hp.speech_vocab]);
    for embed in ["enc.embed", "enc.up_embed"] {
        t.linear(&format!("{embed}.out.0"), d, d).norm(&format!("{embed}.out.1"), d);
    }
    t.f32("enc.pre_lookahead_layer.conv1.weight", &[e.pre_lookahead + 1, d, d]).f32("enc.pre_lookahead_layer.conv1.bias", &[d]);
    t.f32("enc.pre_lookahead_layer.conv2.weight", &[e.lookahead_conv2_kernel, d, d]).f32("enc.pre_lookahead_layer.conv2.bias", &[d]);
    t.f32("enc.up_layer.conv.weight", &[2 * e.up_stride + 1, d, d]).f32("enc.up_layer.conv.bias", &[d]);
    for (stack, layers) in [("enc.encoders", e.n_layer), ("enc.up_encoders", e.n_up_layer)] {
        for l in 0..layers {
            let p = format!("{stack}.{l}");
            t.norm(&format!("{p}.norm_mha"), d).norm(&format!("{p}.norm_ff"), d);
            for m in ["linear_q", "linear_k", "linear_v", "linear_out"] {
                t.linear(&format!("{p}.self_attn.{m}"), d, d);
            }
            t.matrix(format!("{p}.self_attn.linear_pos.weight"), d, d);
            t.f32(format!("{p}.self_attn.pos_bias_u"), &[d / e.n_head, e.n_head]).f32(format!("{p}.self_attn.pos_bias_v"), &[d / e.n_head, e.n_head]);
            t.linear(&format!("{p}.feed_forward.w_1"), d, e.n_ff).linear(&format!("{p}.feed_forward.w_2"), e.n_ff, d);
        }
    }
    t.norm("enc.after_norm", d);
    t.linear("flow.encoder_proj", d, hp.mel_channels);
    // Read on the host (speaker projection).
    t.f32("flow.spk_embed_affine_layer.weight", &[hp.speaker_dim, hp.mel_channels]).f32("flow.spk_embed_affine_layer.bias", &[hp.mel_channels]);
}

/// A 1-D convolution `[kernel, inputs, outputs]` with its bias.
fn conv(t: &mut TensorTable, prefix: &str, kernel: usize, inputs: usize, outputs: usize) {
    t.f32(format!("{prefix}.weight"), &[kernel, inputs, outputs]).f32(format!("{prefix}.bias"), &[outputs]);
}

/// A decoder convolution: as [`conv`], its kernel stored F32, F16 or BF16
/// (one product after im2col; `convert.py --decoder-weights`).
fn decoder_conv(t: &mut TensorTable, prefix: &str, kernel: usize, inputs: usize, outputs: usize) {
    t.add(format!("{prefix}.weight"), &[kernel, inputs, outputs], Storage::Kernel).f32(format!("{prefix}.bias"), &[outputs]);
}

fn cfm(t: &mut TensorTable, c: &CfmHparams, mel: usize, meanflow: bool) {
    let (ch, k) = (c.channels, c.conv_kernel);
    t.linear("cfm.time_mlp.linear_1", c.in_channels, c.time_dim).linear("cfm.time_mlp.linear_2", c.time_dim, c.time_dim);
    if meanflow {
        t.matrix("cfm.time_embed_mixer.weight", 2 * c.time_dim, c.time_dim);
    }
    let causal_block = |t: &mut TensorTable, p: &str, inputs: usize| {
        decoder_conv(t, &format!("{p}.block.0"), k, inputs, ch);
        t.norm(&format!("{p}.block.2"), ch);
    };
    let resnet = |t: &mut TensorTable, p: &str, inputs: usize| {
        causal_block(t, &format!("{p}.block1"), inputs);
        t.linear(&format!("{p}.mlp.1"), c.time_dim, ch);
        causal_block(t, &format!("{p}.block2"), ch);
        decoder_conv(t, &format!("{p}.res_conv"), 1, inputs, ch);
    };
    let transformers = |t: &mut TensorTable, p: &str| {
        let inner = c.n_head * c.head_dim;
        for i in 0..c.n_transformer {
            let q = format!("{p}.{i}");
            t.norm(&format!("{q}.norm1"), ch).norm(&format!("{q}.norm3"), ch);
            let qkv: Vec<String> = ["to_q", "to_k", "to_v"].iter().map(|m| format!("{q}.attn1.{m}.weight")).collect();
            for m in &qkv {
                t.matrix(m.as_str(), ch, inner);
            }
            // One product for the three over the same input (cfm.rs).
            t.stack(format!("{q}.attn1.to_qkv.weight"), &qkv);
            t.linear(&format!("{q}.attn1.to_out.0"), inner, ch);
            t.linear(&format!("{q}.ff.net.0.proj"), ch, c.ff_dim).linear(&format!("{q}.ff.net.2"), c.ff_dim, ch);
        }
    };
    resnet(t, "cfm.down_blocks.0.0", c.in_channels);
    transformers(t, "cfm.down_blocks.0.1");
    decoder_conv(t, "cfm.down_blocks.0.2", k, ch, ch);
    for m in 0..c.n_mid {
        resnet(t, &format!("cfm.mid_blocks.{m}.0"), ch);
        transformers(t, &format!("cfm.mid_blocks.{m}.1"));
    }
    resnet(t, "cfm.up_blocks.0.0", 2 * ch);
    transformers(t, "cfm.up_blocks.0.1");
    decoder_conv(t, "cfm.up_blocks.0.2", k, ch, ch);
    causal_block(t, "cfm.final_block", ch);
    decoder_conv(t, "cfm.final_proj", 1, ch, mel);
}

fn hift(t: &mut TensorTable, h: &HiftHparams, mel: usize) {
    let f0 = Dim::Free(F0_CHANNELS);
    for l in 0..h.f0_layers {
        let p = format!("hift.f0_predictor.condnet.{}", 2 * l);
        let inputs = if l == 0 { Dim::Is(mel) } else { f0 };
        t.add_dims(format!("{p}.weight"), &[h.f0_kernel.into(), inputs, f0], Storage::F32).add_dims(format!("{p}.bias"), &[f0], Storage::F32);
    }
    t.add_dims("hift.f0_predictor.classifier.weight", &[f0, 1.into()], Storage::Matrix).f32("hift.f0_predictor.classifier.bias", &[1]);
    // Read on the host (the sine source's merge of the harmonics).
    t.f32("hift.m_source.l_linear.weight", &[h.harmonics + 1, 1]).f32("hift.m_source.l_linear.bias", &[1]);
    conv(t, "hift.conv_pre", h.conv_pre_kernel, mel, h.base_channels);
    let spectrum = h.n_fft + 2;
    let n_res = h.resblock_kernels.len();
    let mut remaining: usize = h.upsample_rates.iter().product();
    for (i, (&rate, &kernel)) in h.upsample_rates.iter().zip(&h.upsample_kernels).enumerate() {
        let (cin, cout) = (h.base_channels >> i, h.base_channels >> (i + 1));
        // ggml's transposed convolution takes `[kernel, outputs, inputs]`.
        t.f32(format!("hift.ups.{i}.weight"), &[kernel, cout, cin]).f32(format!("hift.ups.{i}.bias"), &[cout]);
        remaining /= rate;
        conv(t, &format!("hift.source_downs.{i}"), if remaining == 1 { 1 } else { 2 * remaining }, spectrum, cout);
        resblock(t, h, &format!("hift.source_resblocks.{i}"), h.source_resblock_kernels[i], cout);
        for (j, &k) in h.resblock_kernels.iter().enumerate() {
            resblock(t, h, &format!("hift.resblocks.{}", i * n_res + j), k, cout);
        }
    }
    conv(t, "hift.conv_post", h.conv_post_kernel, h.base_channels >> h.upsample_rates.len(), spectrum);
}

fn resblock(t: &mut TensorTable, h: &HiftHparams, prefix: &str, kernel: usize, c: usize) {
    for i in 0..h.resblock_dilations.len() {
        t.f32(format!("{prefix}.activations1.{i}.alpha"), &[c]).f32(format!("{prefix}.activations2.{i}.alpha"), &[c]);
        conv(t, &format!("{prefix}.convs1.{i}"), kernel, c, c);
        conv(t, &format!("{prefix}.convs2.{i}"), kernel, c, c);
    }
}

/// A saved voice for a model with these hparams, whose T3 prompt holds
/// `t3_prompt_tokens` tokens (that tensor is absent when there are none).
/// The prompt's frames and tokens are bounded by what cloning can make of
/// the longest reference it reads (`cloning::max_prompt_frames`: 500 frames
/// and 250 tokens at 24 kHz); at least one token, so at least two frames.
pub fn voice_table(t3: &T3Hparams, s3: &S3GenHparams, t3_prompt_tokens: usize) -> TensorTable {
    let mut t = TensorTable::new();
    let frames = crate::cloning::max_prompt_frames(s3.hift.sample_rate).max(2);
    t.free_dim(PROMPT_FRAMES, 2..=frames).free_dim(PROMPT_TOKENS, 1..=frames / 2);
    t.f32(VOICE_SPEAKER_EMB, &[t3.speaker_dim]);
    if t3_prompt_tokens > 0 {
        t.i32(VOICE_PROMPT_SPEECH_TOKENS, &[t3_prompt_tokens]);
    }
    t.add_dims(VOICE_PROMPT_FEAT, &[s3.mel_channels.into(), Dim::Free(PROMPT_FRAMES)], Storage::F32);
    t.add_dims(VOICE_PROMPT_TOKEN, &[Dim::Free(PROMPT_TOKENS)], Storage::I32);
    t.f32(VOICE_EMBEDDING, &[s3.speaker_dim]);
    t
}
