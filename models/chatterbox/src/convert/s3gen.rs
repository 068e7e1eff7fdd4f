//! S3Gen (flow encoder, CFM estimator, HiFT vocoder, CAMPPlus speaker
//! encoder, S3Tokenizer) → `s3gen-meanflow.gguf` / `s3gen.gguf`, as
//! convert.py maps it: weight norm fused (`g·v/‖v‖`), BatchNorm's
//! `num_batches_tracked` dropped, the official names shortened to fit ggml's
//! 63-byte cap, and every dimension the engine needs derived from the shapes
//! plus the reference modules' constants (docs/gguf.md).

use super::plan::{Planned, Shapes};
use super::source::Source;
use engine_core::model_kit::convert::{numeric, MetaValue, Values};
use engine_core::model_kit::{Error, Result};
use indexmap::IndexMap;

/// ggml's cap on tensor names, in bytes.
pub const GGML_MAX_NAME: usize = 63;
/// Official prefixes → short ones; the first that matches applies.
const PREFIXES: [(&str, &str); 6] = [
    ("flow.decoder.estimator.", "cfm."),
    ("flow.encoder.", "enc."),
    ("mel2wav.", "hift."),
    ("speaker_encoder.xvector.", "campplus."),
    ("speaker_encoder.", "campplus."),
    ("tokenizer.", "s3tok."),
];
/// Words shortened wherever they occur, in this order.
const WORDS: [(&str, &str); 2] = [(".nonlinear", ".nl"), (".batchnorm.", ".bn.")];

const WEIGHT_G: &str = ".parametrizations.weight.original0";
const WEIGHT_V: &str = ".parametrizations.weight.original1";

/// The engine's name of official S3Gen tensor `official`; an error when it
/// is still longer than ggml allows.
pub fn short_name(official: &str) -> Result<String> {
    let mut name = official.to_string();
    if let Some((a, b)) = PREFIXES.iter().find(|(a, _)| official.starts_with(a)) {
        name = format!("{b}{}", &official[a.len()..]);
    }
    for (a, b) in WORDS {
        name = name.replace(a, b);
    }
    if name.len() > GGML_MAX_NAME {
        return Err(Error::msg(format!("S3Gen tensor '{official}' maps to '{name}', longer than ggml's {GGML_MAX_NAME} bytes")));
    }
    Ok(name)
}

/// Every S3Gen tensor under its engine name, weight norm fused, without
/// `num_batches_tracked`.
pub fn plan(src: &Source) -> Result<IndexMap<String, Planned<'_>>> {
    let s = src.shapes();
    let mut out: IndexMap<String, Planned<'_>> = IndexMap::new();
    for name in s.names() {
        let (official, planned) = if let Some(base) = name.strip_suffix(WEIGHT_G) {
            let v = format!("{base}{WEIGHT_V}");
            let (g_shape, v_shape) = (src.float(name)?.to_vec(), src.float(&v)?.to_vec());
            // g is one gain per output row: [rows, 1, 1, …].
            let want_g: Vec<usize> = v_shape.iter().enumerate().map(|(i, &d)| if i == 0 { d } else { 1 }).collect();
            if v_shape.is_empty() || g_shape != want_g {
                return Err(s.error(format_args!("weight norm of '{base}': gain shape {g_shape:?} does not match direction shape {v_shape:?}")));
            }
            let (g, v, base_name) = (name.to_string(), v, base.to_string());
            let produce = move || -> Result<Values> {
                let fused = numeric::fuse_weight_norm(&src.read(&g)?, &src.read(&v)?).map_err(|e| src.shapes().error(format_args!("'{base_name}': {e}")))?;
                Ok(Values::F32(fused))
            };
            (format!("{base}.weight"), Planned::float(v_shape, produce))
        } else if name.ends_with(WEIGHT_V) || name.ends_with("num_batches_tracked") {
            continue;
        } else {
            let shape = src.float(name)?.to_vec();
            (name.to_string(), Planned { shape, integer: false, produce: src.plain(name) })
        };
        out.insert(short_name(&official)?, planned);
    }
    Ok(out)
}

fn u(v: usize) -> MetaValue {
    MetaValue::U32(v as u32)
}

fn f(v: f64) -> MetaValue {
    MetaValue::F32(v as f32)
}

fn list(v: &[usize]) -> MetaValue {
    MetaValue::ArrI32(v.iter().map(|&x| x as i32).collect())
}

/// `value - by`, an error naming `what` when it would go below zero.
fn less(s: &Shapes, value: usize, by: usize, what: &str) -> Result<usize> {
    value.checked_sub(by).ok_or_else(|| s.error(format_args!("{what} is {value}, below {by}")))
}

/// The flow front end (CosyVoice's UpsampleConformerEncoder and its layers).
pub fn flow_hparams(s: &Shapes) -> Result<Vec<(&'static str, MetaValue)>> {
    let e = "enc";
    let up_kernel = s.dim(&format!("{e}.up_layer.conv.weight"), 2)?;
    if up_kernel % 2 != 1 {
        return Err(s.error(format_args!("{e}.up_layer.conv has kernel {up_kernel}; Upsample1D uses 2*stride+1")));
    }
    let lookahead = s.dim(&format!("{e}.pre_lookahead_layer.conv1.weight"), 2)?;
    Ok(vec![
        ("mel_channels", u(s.dim("flow.encoder_proj.weight", 0)?)),
        ("speaker_dim", u(s.dim("flow.spk_embed_affine_layer.weight", 1)?)),
        ("encoder.n_embd", u(s.dim(&format!("{e}.embed.out.0.weight"), 0)?)),
        ("encoder.n_head", u(s.dim(&format!("{e}.encoders.0.self_attn.pos_bias_u"), 0)?)),
        ("encoder.n_ff", u(s.dim(&format!("{e}.encoders.0.feed_forward.w_1.weight"), 0)?)),
        ("encoder.n_layer", u(s.count(&format!("{e}.encoders"))?)),
        ("encoder.n_up_layer", u(s.count(&format!("{e}.up_encoders"))?)),
        // PreLookaheadLayer: conv1 sees `pre_lookahead` future frames, conv2 is causal.
        ("encoder.pre_lookahead", u(less(s, lookahead, 1, "the pre-lookahead kernel")?)),
        ("encoder.lookahead_conv2_kernel", u(s.dim(&format!("{e}.pre_lookahead_layer.conv2.weight"), 2)?)),
        ("encoder.leaky_relu_slope", f(0.01)),
        ("encoder.up_stride", u((up_kernel - 1) / 2)),
        ("encoder.layer_norm_eps", f(1e-12)),
        ("encoder.embed_norm_eps", f(1e-5)),
        ("encoder.after_norm_eps", f(1e-5)),
    ])
}

/// The CFM estimator (ConditionalDecoder, causal, one U-Net level); the head
/// count is not in the shapes: official checkpoints use 64-wide heads.
pub fn cfm_hparams(s: &Shapes, n_head: Option<usize>) -> Result<Vec<(&'static str, MetaValue)>> {
    let c = "cfm";
    if s.names().any(|k| k.starts_with("cfm.down_blocks.1.")) {
        return Err(s.error("the CFM estimator has more than one U-Net level; the engine implements one"));
    }
    let inner = s.dim(&format!("{c}.down_blocks.0.1.0.attn1.to_q.weight"), 0)?;
    let n_head = match n_head {
        Some(h) => h,
        None if !inner.is_multiple_of(64) => return Err(s.error(format_args!("CFM attention width {inner} is not a multiple of 64; give cfm_heads"))),
        None => inner / 64,
    };
    if n_head == 0 || !inner.is_multiple_of(n_head) {
        return Err(s.error(format_args!("CFM attention width {inner} does not split into {n_head} heads")));
    }
    let block = format!("{c}.down_blocks.0.0.block1.block.0.weight");
    Ok(vec![
        ("cfm.in_channels", u(s.dim(&block, 1)?)),
        ("cfm.channels", u(s.dim(&block, 0)?)),
        ("cfm.time_dim", u(s.dim(&format!("{c}.time_mlp.linear_2.weight"), 0)?)),
        ("cfm.n_transformer", u(s.count(&format!("{c}.down_blocks.0.1"))?)),
        ("cfm.n_mid", u(s.count(&format!("{c}.mid_blocks"))?)),
        ("cfm.n_head", u(n_head)),
        ("cfm.head_dim", u(inner / n_head)),
        ("cfm.ff_dim", u(s.dim(&format!("{c}.down_blocks.0.1.0.ff.net.0.proj.weight"), 0)?)),
        ("cfm.conv_kernel", u(s.dim(&block, 2)?)),
        // SinusoidalPosEmb(in_channels) multiplies t by 1000; LayerNorms use PyTorch's default eps.
        ("cfm.time_scale", f(1000.0)),
        ("cfm.layer_norm_eps", f(1e-5)),
    ])
}

/// HiFTGenerator as S3Gen builds it (s3gen.py): what the weights cannot show.
const HIFT_UPSAMPLE_RATES: [usize; 3] = [8, 5, 3];
const HIFT_DILATIONS: [usize; 3] = [1, 3, 5];

pub fn hift_hparams(s: &Shapes) -> Result<Vec<(&'static str, MetaValue)>> {
    let h = "hift";
    let n_up = s.count(&format!("{h}.ups"))?;
    if n_up != HIFT_UPSAMPLE_RATES.len() {
        return Err(s.error(format_args!("HiFT has {n_up} upsampling stages, the reference configuration {}", HIFT_UPSAMPLE_RATES.len())));
    }
    let up_kernels = (0..n_up).map(|i| s.dim(&format!("{h}.ups.{i}.weight"), 2)).collect::<Result<Vec<_>>>()?;
    let n_res = s.count(&format!("{h}.resblocks"))? / n_up;
    let res_kernels = (0..n_res).map(|j| s.dim(&format!("{h}.resblocks.{j}.convs1.0.weight"), 2)).collect::<Result<Vec<_>>>()?;
    let src_kernels = (0..n_up).map(|i| s.dim(&format!("{h}.source_resblocks.{i}.convs1.0.weight"), 2)).collect::<Result<Vec<_>>>()?;
    for prefix in [format!("{h}.resblocks"), format!("{h}.source_resblocks")] {
        let convs = s.count(&format!("{prefix}.0.convs1"))?;
        if convs != HIFT_DILATIONS.len() {
            return Err(s.error(format_args!("{prefix}.0 has {convs} dilated convs, the reference {}", HIFT_DILATIONS.len())));
        }
    }
    let post = format!("{h}.conv_post.weight");
    Ok(vec![
        ("hift.sample_rate", u(24000)),
        ("hift.base_channels", u(s.dim(&format!("{h}.conv_pre.weight"), 0)?)),
        ("hift.conv_pre_kernel", u(s.dim(&format!("{h}.conv_pre.weight"), 2)?)),
        ("hift.conv_post_kernel", u(s.dim(&post, 2)?)),
        ("hift.upsample_rates", list(&HIFT_UPSAMPLE_RATES)),
        ("hift.upsample_kernels", list(&up_kernels)),
        ("hift.resblock_kernels", list(&res_kernels)),
        ("hift.source_resblock_kernels", list(&src_kernels)),
        ("hift.resblock_dilations", list(&HIFT_DILATIONS)),
        ("hift.n_fft", u(less(s, s.dim(&post, 0)?, 2, "conv_post's output width")?)),
        ("hift.hop", u(4)),
        ("hift.harmonics", u(less(s, s.dim(&format!("{h}.m_source.l_linear.weight"), 1)?, 1, "the harmonic source's input width")?)),
        ("hift.nsf_alpha", f(0.1)),
        ("hift.nsf_sigma", f(0.003)),
        ("hift.voiced_threshold", f(10.0)),
        ("hift.lrelu_slope", f(0.1)),
        ("hift.audio_limit", f(0.99)),
        ("hift.f0_layers", u(s.count(&format!("{h}.f0_predictor.condnet"))? / 2 + 1)),
        ("hift.f0_kernel", u(s.dim(&format!("{h}.f0_predictor.condnet.0.weight"), 2)?)),
        // S3Token2Wav: 20 ms of silence, then a 20 ms raised-cosine fade-in.
        ("hift.trim_fade_samples", u(480)),
    ])
}

/// CAMPPlus as S3Gen builds it (xvector.py): what the weights cannot show.
const CAMPPLUS_FEAT_DIM: usize = 80;
const CAMPPLUS_TDNN_STRIDE: usize = 2;
const CAMPPLUS_DILATIONS: [usize; 3] = [1, 2, 2];
const CAMPPLUS_SEG_LEN: usize = 100;
const BATCH_NORM_EPS: f64 = 1e-5;

pub fn campplus_hparams(s: &Shapes) -> Result<Vec<(&'static str, MetaValue)>> {
    let c = "campplus";
    // Blocks and their layers are numbered from 1 (`block1`, `tdnnd1`), the head's from 0.
    let n_blocks = s.highest(&format!("{c}.block"))?;
    if n_blocks != CAMPPLUS_DILATIONS.len() {
        return Err(s.error(format_args!("CAMPPlus has {n_blocks} dense blocks, the reference configuration {}", CAMPPLUS_DILATIONS.len())));
    }
    let local = |i: usize| format!("{c}.block{i}.tdnnd1.cam_layer.linear_local.weight");
    let tdnn = format!("{c}.tdnn.linear.weight");
    Ok(vec![
        ("campplus.feat_dim", u(CAMPPLUS_FEAT_DIM)),
        ("campplus.head_channels", u(s.dim(&format!("{c}.head.conv1.weight"), 0)?)),
        ("campplus.head_blocks", list(&[1 + s.highest(&format!("{c}.head.layer1."))?, 1 + s.highest(&format!("{c}.head.layer2."))?])),
        ("campplus.channels", u(s.dim(&tdnn, 0)?)),
        ("campplus.tdnn_kernel", u(s.dim(&tdnn, 2)?)),
        ("campplus.tdnn_stride", u(CAMPPLUS_TDNN_STRIDE)),
        ("campplus.growth", u(s.dim(&local(1), 0)?)),
        ("campplus.bn_channels", u(s.dim(&format!("{c}.block1.tdnnd1.linear1.weight"), 0)?)),
        ("campplus.cam_channels", u(s.dim(&format!("{c}.block1.tdnnd1.cam_layer.linear1.weight"), 0)?)),
        ("campplus.block_layers", list(&(1..=n_blocks).map(|i| s.highest(&format!("{c}.block{i}.tdnnd"))).collect::<Result<Vec<_>>>()?)),
        ("campplus.block_kernels", list(&(1..=n_blocks).map(|i| s.dim(&local(i), 2)).collect::<Result<Vec<_>>>()?)),
        ("campplus.block_dilations", list(&CAMPPLUS_DILATIONS)),
        ("campplus.seg_len", u(CAMPPLUS_SEG_LEN)),
        ("campplus.embedding", u(s.dim(&format!("{c}.dense.linear.weight"), 0)?)),
        ("campplus.bn_eps", f(BATCH_NORM_EPS)),
    ])
}

/// S3TokenizerV2 (s3tokenizer/model_v2.py): its rotary table is built for 64-wide heads.
const S3TOK_HEAD_DIM: usize = 64;

pub fn tokenizer_hparams(s: &Shapes) -> Result<Vec<(&'static str, MetaValue)>> {
    let t = "s3tok.encoder";
    let conv1 = format!("{t}.conv1.weight");
    let n_state = s.dim(&conv1, 0)?;
    if !n_state.is_multiple_of(S3TOK_HEAD_DIM) {
        return Err(s.error(format_args!("S3Tokenizer width {n_state} is not a multiple of its {S3TOK_HEAD_DIM}-wide rotary heads")));
    }
    Ok(vec![
        ("tokenizer.n_mels", u(s.dim(&conv1, 1)?)),
        ("tokenizer.n_state", u(n_state)),
        ("tokenizer.n_head", u(n_state / S3TOK_HEAD_DIM)),
        ("tokenizer.n_layer", u(s.count(&format!("{t}.blocks"))?)),
        ("tokenizer.n_ff", u(s.dim(&format!("{t}.blocks.0.mlp.0.weight"), 0)?)),
        ("tokenizer.fsmn_kernel", u(s.dim(&format!("{t}.blocks.0.attn.fsmn_block.weight"), 2)?)),
        ("tokenizer.rope_base", f(10000.0)),
        ("tokenizer.rope_positions", u(2048)),
        ("tokenizer.fsq_dims", u(s.dim("s3tok.quantizer._codebook.project_down.weight", 0)?)),
        ("tokenizer.fsq_levels", u(3)),
        ("tokenizer.layer_norm_eps", f(1e-5)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_as_convert_py() {
        assert_eq!(short_name("flow.decoder.estimator.down_blocks.0.0.block1.block.0.weight").unwrap(), "cfm.down_blocks.0.0.block1.block.0.weight");
        assert_eq!(short_name("speaker_encoder.xvector.block1.tdnnd1.nonlinear1.batchnorm.weight").unwrap(), "campplus.block1.tdnnd1.nl1.bn.weight");
        assert_eq!(short_name("speaker_encoder.head.bn1.weight").unwrap(), "campplus.head.bn1.weight");
        assert_eq!(short_name("flow.input_embedding.weight").unwrap(), "flow.input_embedding.weight");
        let long = format!("mel2wav.{}", "x".repeat(60));
        assert_eq!(short_name(&long).unwrap_err().as_str(), format!("S3Gen tensor '{long}' maps to 'hift.{}', longer than ggml's 63 bytes", "x".repeat(60)));
    }
}
