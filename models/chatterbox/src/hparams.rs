//! Hyper-parameters of a converted Chatterbox model, read from GGUF metadata
//! (written by `tools/chatterbox/convert.py`; see docs/gguf.md). Nothing has a
//! default: a key the converter did not write is an error naming the key, and
//! every value is checked against its documented range.

use engine_core::model_kit::HparamReader;
use engine_core::model_kit::Result;
use ggml_sys::gguf::GgufFile;

/// `general.architecture` of the T3 file.
pub const T3_ARCH: &str = "chatterbox";
/// `general.architecture` of the S3Gen (+ HiFT) file.
pub const S3GEN_ARCH: &str = "chatterbox-s3gen";

/// The transformer under T3: GPT-2 (Turbo, Nano) or Llama (Multilingual),
/// each with its own graph builder.
#[derive(Debug, Clone, PartialEq)]
pub enum Backbone {
    Gpt2,
    Llama(LlamaHparams),
}

/// Llama-3-style rotary frequency scaling (Hugging Face's `rope_type = "llama3"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3RopeScaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_context: f32,
}

/// What the Llama T3 adds to [`T3Hparams`]: grouped-query attention, RMSNorm,
/// rotary positions, learned text/speech positions, the perceiver that
/// resamples the voice prompt, and the attention heads the alignment analyzer reads.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaHparams {
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_base: f32,
    pub rope_scaling: Option<Llama3RopeScaling>,
    /// Rows of the learned text position table (text tokens + SOT/EOT at most).
    pub text_positions: usize,
    /// Rows of the learned speech position table.
    pub speech_positions: usize,
    /// Learned queries the perceiver resamples the voice prompt to.
    pub perceiver_queries: usize,
    pub perceiver_heads: usize,
    pub start_text_token: u32,
    pub stop_text_token: u32,
    /// (layer, head) pairs whose attention over the text the analyzer reads;
    /// empty: no analyzer (the reference runs it for Multilingual only).
    pub aligned_heads: Vec<(usize, usize)>,
}

impl LlamaHparams {
    /// Width of the keys (and values): K/V heads × head width.
    pub fn kv_width(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Positions of the conditioning: speaker, perceiver queries (none
    /// without a voice prompt), emotion.
    pub fn cond_len(&self, prompt_tokens: usize) -> usize {
        2 + if prompt_tokens > 0 { self.perceiver_queries } else { 0 }
    }

    /// Per rotary pair `i`, the divisor of its frequency `base^(-2i/head_dim)`
    /// (ggml's `freq_factors`): Hugging Face's llama3 rule keeps high
    /// frequencies, divides low ones by `factor` and blends in between.
    pub fn rope_freq_factors(&self) -> Vec<f32> {
        let half = self.head_dim / 2;
        let Some(s) = self.rope_scaling else { return vec![1.0; half] };
        let (factor, low, high, orig) = (s.factor as f64, s.low_freq_factor as f64, s.high_freq_factor as f64, s.original_context as f64);
        (0..half)
            .map(|i| {
                let inv_freq = (self.rope_base as f64).powf(-((2 * i) as f64) / self.head_dim as f64);
                let wavelen = 2.0 * std::f64::consts::PI / inv_freq;
                let scaled = if wavelen < orig / high {
                    inv_freq
                } else if wavelen > orig / low {
                    inv_freq / factor
                } else {
                    let smooth = (orig / wavelen - low) / (high - low);
                    (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
                };
                (inv_freq / scaled) as f32
            })
            .collect()
    }

    fn load(m: &HparamReader, n_embd: usize, n_head: usize, n_layer: usize, text_vocab: usize) -> Result<Self> {
        use engine_core::model_kit::hparams::{DIM, EPS, HEADS};
        let rope_scaling = match m.choice("rope.scaling", &["llama3", "none"])?.as_str() {
            "llama3" => Some(Llama3RopeScaling {
                factor: m.real("rope.scaling.factor", 1.0..=1024.0)?,
                low_freq_factor: m.real("rope.scaling.low_freq_factor", 1e-3..=1e3)?,
                high_freq_factor: m.real("rope.scaling.high_freq_factor", 1e-3..=1e3)?,
                original_context: m.real("rope.scaling.original_context", 1.0..=1e7)?,
            }),
            _ => None,
        };
        let pairs = m.counts("aligned_heads", 0..=64, 0..=4096)?;
        let hp = LlamaHparams {
            n_head_kv: m.count("n_head_kv", HEADS)?,
            head_dim: m.count("head_dim", DIM)?,
            rms_norm_eps: m.real("rms_norm_eps", EPS)?,
            rope_base: m.real("rope.freq_base", 1.0..=1e9)?,
            rope_scaling,
            text_positions: m.count("text_positions", ranges::CONTEXT)?,
            speech_positions: m.count("speech_positions", ranges::CONTEXT)?,
            perceiver_queries: m.count("perceiver.queries", 1..=4096)?,
            perceiver_heads: m.count("perceiver.n_head", HEADS)?,
            start_text_token: m.token("start_text_token", text_vocab)?,
            stop_text_token: m.token("stop_text_token", text_vocab)?,
            aligned_heads: pairs.chunks(2).map(|p| (p[0], p[1])).collect(),
        };
        m.require(pairs.len() % 2 == 0, || format!("aligned_heads has {} values, not (layer, head) pairs", pairs.len()))?;
        m.require(hp.aligned_heads.iter().all(|&(l, h)| l < n_layer && h < n_head), || {
            format!("an aligned head in {:?} lies outside {n_layer} layers of {n_head} heads", hp.aligned_heads)
        })?;
        m.require(n_head.is_multiple_of(hp.n_head_kv), || format!("{n_head} query heads do not share {} K/V heads evenly", hp.n_head_kv))?;
        m.require(hp.head_dim.is_multiple_of(2), || format!("head_dim {} is odd (rotary pairs)", hp.head_dim))?;
        m.require(n_embd.is_multiple_of(hp.perceiver_heads), || format!("n_embd {n_embd} does not split into {} perceiver heads", hp.perceiver_heads))?;
        if let Some(s) = hp.rope_scaling {
            m.require(s.high_freq_factor > s.low_freq_factor, || "rope.scaling.high_freq_factor must exceed low_freq_factor".into())?;
        }
        Ok(hp)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct T3Hparams {
    /// `turbo` or `nano` (GPT-2), `mtl` (Llama).
    pub variant: String,
    pub backbone: Backbone,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    /// The context limit: GPT-2's position table (`wpe` rows); for Llama,
    /// conditioning + text positions + speech positions.
    pub n_ctx: usize,
    pub n_ff: usize,
    pub text_vocab: usize,
    pub speech_vocab: usize,
    /// Width of the speaker embedding that `cond.spkr` projects.
    pub speaker_dim: usize,
    /// GPT-2's LayerNorms; Llama's perceiver LayerNorm.
    pub layer_norm_eps: f32,
    pub start_speech_token: u32,
    pub stop_speech_token: u32,
    /// Appended three times before S3Gen so the last word is not cut off.
    pub silence_token: u32,
    /// Speech-token prompt length of the built-in voice; a cloned voice's
    /// prompt is cut to it too (the reference's `speech_cond_prompt_len`).
    pub cond_prompt_len: usize,
    pub voice_encoder: VoiceEncoderHparams,
}

/// The LSTM speaker encoder carried in the T3 file (`ve.*`): its embedding is
/// the speaker vector T3 conditions on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VoiceEncoderHparams {
    pub layers: usize,
    pub hidden: usize,
    /// Mel bins of its input.
    pub n_mels: usize,
    /// Width of the speaker embedding it produces.
    pub embedding: usize,
}

/// Ranges of the Chatterbox-specific keys (docs/gguf.md); the shared ones are
/// in [`engine_core::model_kit::hparams`].
pub mod ranges {
    use std::ops::RangeInclusive;
    pub const VOCAB: RangeInclusive<usize> = 1..=262_144;
    pub const CONTEXT: RangeInclusive<usize> = 2..=65_536;
    pub const PROMPT: RangeInclusive<usize> = 0..=4096;
    pub const LOOKAHEAD: RangeInclusive<usize> = 0..=254;
    pub const SLOPE: RangeInclusive<f32> = 0.0..=1.0;
    pub const TIMESTEPS: RangeInclusive<usize> = 1..=100;
    pub const CFG_RATE: RangeInclusive<f32> = 0.0..=10.0;
    pub const TIME_SCALE: RangeInclusive<f32> = 1e-6..=1e9;
    pub const STAGES: RangeInclusive<usize> = 1..=8;
    pub const RATE: RangeInclusive<usize> = 1..=64;
    pub const N_FFT: RangeInclusive<usize> = 2..=4096;
    pub const HARMONICS: RangeInclusive<usize> = 0..=64;
    pub const NSF: RangeInclusive<f32> = 0.0..=10.0;
    pub const VOICED_HZ: RangeInclusive<f32> = 0.0..=10_000.0;
    pub const AUDIO_LIMIT: RangeInclusive<f32> = 1e-6..=1.0;
}

impl T3Hparams {
    pub fn load(file: &GgufFile) -> Result<Self> {
        use engine_core::model_kit::hparams::{DIM, EPS, HEADS, LAYERS};
        let m = HparamReader::new(file, T3_ARCH);
        let speech_vocab = m.count("speech_vocab", ranges::VOCAB)?;
        let (n_layer, n_embd, n_head) = (m.count("n_layer", LAYERS)?, m.count("n_embd", DIM)?, m.count("n_head", HEADS)?);
        let text_vocab = m.count("text_vocab", ranges::VOCAB)?;
        let backbone = match m.string("backbone")?.as_str() {
            "gpt2" => Backbone::Gpt2,
            "llama" => Backbone::Llama(LlamaHparams::load(&m, n_embd, n_head, n_layer, text_vocab)?),
            other => return Err(m.error(format!("T3 backbone '{other}' is not supported by this plugin version"))),
        };
        // A Llama T3 has no position table of its own: its context is what the
        // learned text and speech positions allow after the conditioning.
        let n_ctx = match &backbone {
            Backbone::Gpt2 => m.count("n_ctx", ranges::CONTEXT)?,
            Backbone::Llama(l) => l.cond_len(1) + l.text_positions + l.speech_positions,
        };
        let variants: &[&str] = if matches!(backbone, Backbone::Gpt2) { &["turbo", "nano"] } else { &["mtl"] };
        let hp = T3Hparams {
            variant: m.choice("variant", variants)?,
            backbone,
            n_layer,
            n_embd,
            n_head,
            n_ctx,
            n_ff: m.count("n_ff", DIM)?,
            text_vocab,
            speech_vocab,
            speaker_dim: m.count("speaker_dim", DIM)?,
            layer_norm_eps: m.real("layer_norm_eps", EPS)?,
            start_speech_token: m.token("start_speech_token", speech_vocab)?,
            stop_speech_token: m.token("stop_speech_token", speech_vocab)?,
            silence_token: m.token("silence_token", speech_vocab)?,
            cond_prompt_len: m.count("cond_prompt_len", ranges::PROMPT)?,
            voice_encoder: VoiceEncoderHparams {
                layers: m.count("voice_encoder.layers", 1..=8)?,
                hidden: m.count("voice_encoder.hidden", DIM)?,
                n_mels: m.count("voice_encoder.n_mels", 1..=201)?,
                embedding: m.count("voice_encoder.embedding", DIM)?,
            },
        };
        m.require(hp.voice_encoder.embedding == hp.speaker_dim, || {
            format!("the voice encoder's embedding ({}) is not T3's speaker width {}", hp.voice_encoder.embedding, hp.speaker_dim)
        })?;
        m.require(!matches!(hp.backbone, Backbone::Gpt2) || hp.n_embd.is_multiple_of(hp.n_head), || {
            format!("n_embd {} does not split into {} heads", hp.n_embd, hp.n_head)
        })?;
        m.require(hp.cond_prompt_len + 2 < hp.n_ctx, || {
            format!("the voice prompt ({} tokens) leaves no room in the context of {}", hp.cond_prompt_len, hp.n_ctx)
        })?;
        Ok(hp)
    }

    pub fn head_dim(&self) -> usize {
        match &self.backbone {
            Backbone::Gpt2 => self.n_embd / self.n_head,
            Backbone::Llama(l) => l.head_dim,
        }
    }

    /// The Llama backbone's parameters, if this is one.
    pub fn llama(&self) -> Option<&LlamaHparams> {
        match &self.backbone {
            Backbone::Llama(l) => Some(l),
            Backbone::Gpt2 => None,
        }
    }
}

/// CosyVoice's UpsampleConformerEncoder (the flow front end): speech-token
/// embeddings → pre-lookahead conv → conformer layers → ×`up_stride`
/// upsampling → more conformer layers.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderHparams {
    pub n_embd: usize,
    pub n_head: usize,
    pub n_ff: usize,
    pub n_layer: usize,
    pub n_up_layer: usize,
    /// Future frames the first lookahead conv sees (its kernel is this + 1).
    pub pre_lookahead: usize,
    /// Kernel of the second, causal lookahead conv.
    pub lookahead_conv2_kernel: usize,
    pub leaky_relu_slope: f32,
    /// Mel frames per speech token.
    pub up_stride: usize,
    pub layer_norm_eps: f32,
    pub embed_norm_eps: f32,
    pub after_norm_eps: f32,
}

/// The CFM estimator (Matcha/CosyVoice ConditionalDecoder, causal, one U-Net
/// level): resnet + transformer blocks down, `n_mid` middle stages, up with a skip.
#[derive(Debug, Clone, PartialEq)]
pub struct CfmHparams {
    /// `x ⊕ mu ⊕ spks ⊕ cond` channels (4 × mel).
    pub in_channels: usize,
    pub channels: usize,
    pub time_dim: usize,
    /// Transformer blocks per stage.
    pub n_transformer: usize,
    pub n_mid: usize,
    pub n_head: usize,
    pub head_dim: usize,
    pub ff_dim: usize,
    pub conv_kernel: usize,
    /// Factor on t inside the sinusoidal time embedding.
    pub time_scale: f32,
    pub layer_norm_eps: f32,
}

/// HiFT (HiFi-GAN with a neural-source-filter excitation and an ISTFT head).
#[derive(Debug, Clone, PartialEq)]
pub struct HiftHparams {
    pub sample_rate: u32,
    pub base_channels: usize,
    pub conv_pre_kernel: usize,
    pub conv_post_kernel: usize,
    pub upsample_rates: Vec<usize>,
    pub upsample_kernels: Vec<usize>,
    /// Kernels of the resblocks averaged after each upsampling stage.
    pub resblock_kernels: Vec<usize>,
    /// Kernel of the source branch's resblock at each stage.
    pub source_resblock_kernels: Vec<usize>,
    pub resblock_dilations: Vec<usize>,
    pub n_fft: usize,
    pub hop: usize,
    /// Overtones above the fundamental in the sine source.
    pub harmonics: usize,
    pub nsf_alpha: f32,
    pub nsf_sigma: f32,
    pub voiced_threshold: f32,
    pub lrelu_slope: f32,
    pub audio_limit: f32,
    pub f0_layers: usize,
    pub f0_kernel: usize,
    /// Samples silenced, then faded in, at the start of every waveform.
    pub trim_fade_samples: usize,
}

impl HiftHparams {
    /// Waveform samples per mel frame (∏ rates × hop).
    pub fn samples_per_frame(&self) -> usize {
        self.upsample_rates.iter().product::<usize>() * self.hop
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct S3GenHparams {
    /// `meanflow` (Turbo's distilled decoder) or `standard`.
    pub variant: String,
    pub meanflow: bool,
    pub n_timesteps: usize,
    pub cfg_rate: f32,
    pub speech_vocab: usize,
    pub mel_channels: usize,
    /// Width of the x-vector (CAMPPlus) speaker embedding.
    pub speaker_dim: usize,
    pub encoder: EncoderHparams,
    pub cfm: CfmHparams,
    pub hift: HiftHparams,
    pub campplus: CampplusHparams,
    pub tokenizer: TokenizerHparams,
}

/// CAMPPlus (3D-Speaker's x-vector network, `xvector.py`): fbank → the
/// speaker embedding S3Gen conditions on. A 2-D convolutional head over
/// (frequency, time), a strided TDNN, densely connected CAM blocks each
/// followed by a halving transit layer, statistics pooling and a dense layer.
#[derive(Debug, Clone, PartialEq)]
pub struct CampplusHparams {
    /// Fbank bins of the input (the head's image height).
    pub feat_dim: usize,
    pub head_channels: usize,
    /// Residual blocks in each of the head's two strided stages.
    pub head_blocks: Vec<usize>,
    /// Output channels of the TDNN after the head.
    pub channels: usize,
    pub tdnn_kernel: usize,
    pub tdnn_stride: usize,
    /// Channels each CAM layer adds.
    pub growth: usize,
    /// Bottleneck width inside a CAM layer.
    pub bn_channels: usize,
    /// Width of a CAM layer's context attention.
    pub cam_channels: usize,
    pub block_layers: Vec<usize>,
    pub block_kernels: Vec<usize>,
    pub block_dilations: Vec<usize>,
    /// Frames per segment of the context pooling.
    pub seg_len: usize,
    pub embedding: usize,
    pub bn_eps: f32,
}

impl CampplusHparams {
    /// Fbank bins left after the head's three stride-2 convolutions (k3, p1).
    pub fn head_bins(&self) -> usize {
        (0..3).fold(self.feat_dim, |f, _| (f - 1) / 2 + 1)
    }

    /// Channels into each dense block, and the final width (after the last transit).
    pub fn block_inputs(&self) -> (Vec<usize>, usize) {
        let mut c = self.channels;
        let mut inputs = Vec::new();
        for &layers in &self.block_layers {
            inputs.push(c);
            c = (c + layers * self.growth) / 2;
        }
        (inputs, c)
    }
}

/// S3TokenizerV2 (`s3tokenizer/model_v2.py`): log mel → 25 Hz speech tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenizerHparams {
    pub n_mels: usize,
    pub n_state: usize,
    pub n_head: usize,
    pub n_layer: usize,
    pub n_ff: usize,
    /// Taps of the FSMN memory's depthwise convolution.
    pub fsmn_kernel: usize,
    pub rope_base: f32,
    /// Rows of the reference's rotary table: the longest token sequence.
    pub rope_positions: usize,
    /// Dimensions of the FSQ projection, each rounded to `fsq_levels` values.
    pub fsq_dims: usize,
    pub fsq_levels: usize,
    pub layer_norm_eps: f32,
}

/// Upper bound on HiFT's samples per mel frame (∏ upsample rates × hop).
pub const MAX_SAMPLES_PER_FRAME: usize = 8192;

impl S3GenHparams {
    pub fn load(file: &GgufFile) -> Result<Self> {
        use engine_core::model_kit::hparams::{DILATION, DIM, EPS, HEADS, KERNEL, LAYERS, SAMPLE_RATE};
        let m = HparamReader::new(file, S3GEN_ARCH);
        let encoder = EncoderHparams {
            n_embd: m.count("encoder.n_embd", DIM)?,
            n_head: m.count("encoder.n_head", HEADS)?,
            n_ff: m.count("encoder.n_ff", DIM)?,
            n_layer: m.count("encoder.n_layer", LAYERS)?,
            n_up_layer: m.count("encoder.n_up_layer", LAYERS)?,
            pre_lookahead: m.count("encoder.pre_lookahead", ranges::LOOKAHEAD)?,
            lookahead_conv2_kernel: m.count("encoder.lookahead_conv2_kernel", KERNEL)?,
            leaky_relu_slope: m.real("encoder.leaky_relu_slope", ranges::SLOPE)?,
            up_stride: m.count("encoder.up_stride", DILATION)?,
            layer_norm_eps: m.real("encoder.layer_norm_eps", EPS)?,
            embed_norm_eps: m.real("encoder.embed_norm_eps", EPS)?,
            after_norm_eps: m.real("encoder.after_norm_eps", EPS)?,
        };
        m.require(encoder.n_embd.is_multiple_of(encoder.n_head), || format!("encoder width {} does not split into {} heads", encoder.n_embd, encoder.n_head))?;
        m.require(encoder.n_embd.is_multiple_of(2), || format!("encoder width {} is odd (sine and cosine position pairs)", encoder.n_embd))?;
        let cfm = CfmHparams {
            in_channels: m.count("cfm.in_channels", DIM)?,
            channels: m.count("cfm.channels", DIM)?,
            time_dim: m.count("cfm.time_dim", DIM)?,
            n_transformer: m.count("cfm.n_transformer", LAYERS)?,
            n_mid: m.count("cfm.n_mid", 0..=*LAYERS.end())?,
            n_head: m.count("cfm.n_head", HEADS)?,
            head_dim: m.count("cfm.head_dim", DIM)?,
            ff_dim: m.count("cfm.ff_dim", DIM)?,
            conv_kernel: m.count("cfm.conv_kernel", KERNEL)?,
            time_scale: m.real("cfm.time_scale", ranges::TIME_SCALE)?,
            layer_norm_eps: m.real("cfm.layer_norm_eps", EPS)?,
        };
        let stages = ranges::STAGES;
        let hift = HiftHparams {
            sample_rate: m.count("hift.sample_rate", SAMPLE_RATE)? as u32,
            base_channels: m.count("hift.base_channels", DIM)?,
            conv_pre_kernel: m.count("hift.conv_pre_kernel", KERNEL)?,
            conv_post_kernel: m.count("hift.conv_post_kernel", KERNEL)?,
            upsample_rates: m.counts("hift.upsample_rates", stages.clone(), ranges::RATE)?,
            upsample_kernels: m.counts("hift.upsample_kernels", stages.clone(), KERNEL)?,
            resblock_kernels: m.counts("hift.resblock_kernels", stages.clone(), KERNEL)?,
            source_resblock_kernels: m.counts("hift.source_resblock_kernels", stages.clone(), KERNEL)?,
            resblock_dilations: m.counts("hift.resblock_dilations", stages, DILATION)?,
            n_fft: m.count("hift.n_fft", ranges::N_FFT)?,
            hop: m.count("hift.hop", 1..=4096)?,
            harmonics: m.count("hift.harmonics", ranges::HARMONICS)?,
            nsf_alpha: m.real("hift.nsf_alpha", ranges::NSF)?,
            nsf_sigma: m.real("hift.nsf_sigma", ranges::NSF)?,
            voiced_threshold: m.real("hift.voiced_threshold", ranges::VOICED_HZ)?,
            lrelu_slope: m.real("hift.lrelu_slope", ranges::SLOPE)?,
            audio_limit: m.real("hift.audio_limit", ranges::AUDIO_LIMIT)?,
            f0_layers: m.count("hift.f0_layers", LAYERS)?,
            f0_kernel: m.count("hift.f0_kernel", KERNEL)?,
            trim_fade_samples: m.count("hift.trim_fade_samples", 0..=192_000)?,
        };
        let blocks = 1..=8;
        let campplus = CampplusHparams {
            feat_dim: m.count("campplus.feat_dim", 8..=1024)?,
            head_channels: m.count("campplus.head_channels", DIM)?,
            head_blocks: m.counts("campplus.head_blocks", 2..=2, 1..=16)?,
            channels: m.count("campplus.channels", DIM)?,
            tdnn_kernel: m.count("campplus.tdnn_kernel", KERNEL)?,
            tdnn_stride: m.count("campplus.tdnn_stride", 1..=8)?,
            growth: m.count("campplus.growth", DIM)?,
            bn_channels: m.count("campplus.bn_channels", DIM)?,
            cam_channels: m.count("campplus.cam_channels", DIM)?,
            block_layers: m.counts("campplus.block_layers", blocks.clone(), LAYERS)?,
            block_kernels: m.counts("campplus.block_kernels", blocks.clone(), KERNEL)?,
            block_dilations: m.counts("campplus.block_dilations", blocks, DILATION)?,
            seg_len: m.count("campplus.seg_len", 1..=10_000)?,
            embedding: m.count("campplus.embedding", DIM)?,
            bn_eps: m.real("campplus.bn_eps", EPS)?,
        };
        let tokenizer = TokenizerHparams {
            n_mels: m.count("tokenizer.n_mels", 1..=1024)?,
            n_state: m.count("tokenizer.n_state", DIM)?,
            n_head: m.count("tokenizer.n_head", HEADS)?,
            n_layer: m.count("tokenizer.n_layer", LAYERS)?,
            n_ff: m.count("tokenizer.n_ff", DIM)?,
            fsmn_kernel: m.count("tokenizer.fsmn_kernel", KERNEL)?,
            rope_base: m.real("tokenizer.rope_base", 1.0..=1e9)?,
            rope_positions: m.count("tokenizer.rope_positions", 1..=65_536)?,
            fsq_dims: m.count("tokenizer.fsq_dims", 1..=16)?,
            fsq_levels: m.count("tokenizer.fsq_levels", 2..=16)?,
            layer_norm_eps: m.real("tokenizer.layer_norm_eps", EPS)?,
        };
        let mel_channels = m.count("mel_channels", 1..=1024)?;
        let hp = S3GenHparams {
            variant: m.choice("variant", &["meanflow", "standard"])?,
            meanflow: m.flag("meanflow")?,
            n_timesteps: m.count("n_timesteps", ranges::TIMESTEPS)?,
            cfg_rate: m.real("cfg_rate", ranges::CFG_RATE)?,
            speech_vocab: m.count("speech_vocab", ranges::VOCAB)?,
            mel_channels,
            speaker_dim: m.count("speaker_dim", DIM)?,
            encoder,
            cfm,
            hift,
            campplus,
            tokenizer,
        };
        hp.check_relations(&m)?;
        hp.check_cloning(&m)?;
        Ok(hp)
    }

    /// The voice-cloning encoders' metadata against itself and the rest.
    fn check_cloning(&self, m: &HparamReader) -> Result<()> {
        use engine_core::model_kit::hparams::DIM;
        let c = &self.campplus;
        m.require(c.block_kernels.len() == c.block_layers.len() && c.block_dilations.len() == c.block_layers.len(), || {
            "campplus.block_layers, block_kernels and block_dilations disagree in count".into()
        })?;
        m.require(c.block_kernels.iter().chain([&c.tdnn_kernel]).all(|k| k % 2 == 1), || "CAMPPlus convolutions need odd kernels".into())?;
        m.require(c.embedding == self.speaker_dim, || format!("campplus.embedding {} is not S3Gen's speaker width {}", c.embedding, self.speaker_dim))?;
        // The widths the dense blocks grow to stay within range.
        let mut width = c.channels;
        for &layers in &c.block_layers {
            match layers.checked_mul(c.growth).and_then(|g| g.checked_add(width)).filter(|w| DIM.contains(w)) {
                Some(full) => width = full / 2,
                None => return Err(m.error(format!("a CAMPPlus dense block grows past {} channels", DIM.end()))),
            }
        }
        let t = &self.tokenizer;
        m.require(t.n_state.is_multiple_of(t.n_head) && (t.n_state / t.n_head).is_multiple_of(2), || {
            format!("tokenizer.n_state {} does not split into {} heads of even width", t.n_state, t.n_head)
        })?;
        m.require(t.fsmn_kernel % 2 == 1, || format!("tokenizer.fsmn_kernel {} is even", t.fsmn_kernel))?;
        let codes = (t.fsq_levels as u64).checked_pow(t.fsq_dims as u32);
        m.require(codes.is_some_and(|n| n <= self.speech_vocab as u64), || {
            format!("{}^{} FSQ codes do not fit S3Gen's speech vocabulary of {}", t.fsq_levels, t.fsq_dims, self.speech_vocab)
        })
    }

    fn check_relations(&self, m: &HparamReader) -> Result<()> {
        m.require(self.meanflow == (self.variant == "meanflow"), || format!("variant '{}' disagrees with meanflow = {}", self.variant, self.meanflow))?;
        m.require(self.cfm.in_channels == 4 * self.mel_channels, || {
            format!("cfm.in_channels {} is not 4 x mel_channels {} (x, mu, speaker, cond)", self.cfm.in_channels, self.mel_channels)
        })?;
        let h = &self.hift;
        let stages = h.upsample_rates.len();
        m.require(h.upsample_kernels.len() == stages && h.source_resblock_kernels.len() == stages, || {
            "HiFT upsample rates, kernels and source resblocks disagree in count".into()
        })?;
        m.require(h.upsample_rates.iter().zip(&h.upsample_kernels).all(|(u, k)| k >= u && (k - u) % 2 == 0), || {
            "a HiFT upsampling kernel is not its rate plus an even number".into()
        })?;
        m.require(h.base_channels.is_multiple_of(1 << stages), || format!("hift.base_channels {} does not halve {stages} times", h.base_channels))?;
        // Waveform samples per mel frame bound every HiFT buffer (480 officially).
        let per_frame = h.upsample_rates.iter().try_fold(h.hop, |acc, &r| acc.checked_mul(r));
        m.require(per_frame.is_some_and(|n| n <= MAX_SAMPLES_PER_FRAME), || {
            format!(
                "HiFT makes {} samples per mel frame (upsample rates x hop; at most {MAX_SAMPLES_PER_FRAME})",
                per_frame.map_or("too many".into(), |n| n.to_string())
            )
        })?;
        // The ISTFT's overlap-add runs as n_fft/hop shifted views whose window
        // envelope stays well above zero: whole hops, at least two per frame.
        m.require(h.n_fft.is_multiple_of(2) && h.n_fft.is_multiple_of(h.hop) && 2 * h.hop <= h.n_fft, || {
            format!("hift.n_fft {} must be even, a multiple of hift.hop {} and at least twice it", h.n_fft, h.hop)
        })?;
        // "Same" convolutions pad (k - 1) / 2 on each side: their kernels must be odd.
        let odd = [("conv_pre_kernel", h.conv_pre_kernel), ("conv_post_kernel", h.conv_post_kernel), ("f0_kernel", h.f0_kernel)]
            .into_iter()
            .chain(h.resblock_kernels.iter().chain(&h.source_resblock_kernels).map(|&k| ("resblock kernels", k)));
        for (key, k) in odd {
            m.require(k % 2 == 1, || format!("hift.{key} has an even kernel {k}; these convolutions need odd kernels"))?;
        }
        // The source branch of each stage must land on the upsampled frames.
        for mel_frames in 1..=4 {
            let stft = mel_frames * h.upsample_rates.iter().product::<usize>() + 1;
            let mut frames = mel_frames;
            let mut remaining: usize = h.upsample_rates.iter().product();
            for (i, rate) in h.upsample_rates.iter().enumerate() {
                frames = frames * rate + usize::from(i == stages - 1);
                remaining /= rate;
                let source = if remaining == 1 { stft } else { (stft + 2 * (remaining / 2) - 2 * remaining) / remaining + 1 };
                m.require(source == frames, || format!("HiFT stage {i}: the source branch gives {source} frames, the upsampled mel {frames}"))?;
            }
        }
        Ok(())
    }
}
