//! Hyper-parameters of a converted Supertonic model, read from GGUF metadata
//! (`supertonic.*`, written by `tools/supertonic/convert.py`; see docs/gguf.md).
//! Nothing here has a default: a key the converter did not write is an error.

use ggml_sys::gguf::{GgufFile, Metadata};

pub const ARCH: &str = "supertonic";

/// Model generation, as detected by the converter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
    V3,
}

impl Version {
    pub fn as_str(&self) -> &'static str {
        match self {
            Version::V1 => "v1",
            Version::V2 => "v2",
            Version::V3 => "v3",
        }
    }
}

/// A ConvNeXt stack: depthwise kernel, inner width and one dilation per layer.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvNextHp {
    pub kernel: usize,
    pub inner: usize,
    pub dilations: Vec<usize>,
}

/// VITS-style relative-position self-attention encoder.
#[derive(Debug, Clone, PartialEq)]
pub struct AttnEncoderHp {
    pub layers: usize,
    pub heads: usize,
    pub filter: usize,
    pub window: usize,
}

/// Cross-attention over the style tokens (tanh keys) or the text.
#[derive(Debug, Clone, PartialEq)]
pub struct CrossAttnHp {
    pub heads: usize,
    pub units: usize,
    /// Multiplier of the attention scores (read from the graph: 1/16 officially).
    pub scale: f32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DurationHp {
    pub char_dim: usize,
    pub convnext: ConvNextHp,
    pub attn: AttnEncoderHp,
    pub style_tokens: usize,
    pub style_dim: usize,
    pub predictor_hidden: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TextEncoderHp {
    pub char_dim: usize,
    pub convnext: ConvNextHp,
    pub attn: AttnEncoderHp,
    pub spte: CrossAttnHp,
}

#[derive(Debug, Clone, PartialEq)]
pub struct VectorEstimatorHp {
    pub hidden: usize,
    pub time_dim: usize,
    pub time_hidden: usize,
    /// Factor on t inside the sinusoidal time encoding (1000 officially).
    pub time_scale: f32,
    pub blocks: usize,
    pub convnext0: ConvNextHp,
    pub convnext1: ConvNextHp,
    pub convnext2: ConvNextHp,
    pub last_convnext: ConvNextHp,
    pub text_attn: CrossAttnHp,
    pub style_attn: CrossAttnHp,
    /// Classifier-free guidance inside the estimator (v3): v = cond·v_c − uncond·v_u.
    pub cfg: Option<(f32, f32)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct VocoderHp {
    pub hidden: usize,
    pub kernel_init: usize,
    pub convnext: ConvNextHp,
    pub head_hidden: usize,
    pub head_kernel: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TextHp {
    /// "none" (v1) or "open_close" (`<lang>text</lang>`).
    pub wrap_open_close: bool,
    pub languages: Vec<String>,
    pub default_language: String,
    pub chunk_chars: usize,
    pub short_chunk_chars: usize,
    /// Languages chunked at `short_chunk_chars` (GGUF: comma-separated string).
    pub short_chunk_languages: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Hparams {
    pub version: Version,
    pub tts_version: String,
    pub sample_rate: u32,
    pub base_chunk_size: usize,
    pub chunk_compress_factor: usize,
    pub latent_dim: usize,
    pub normalizer_scale: f32,
    pub layer_norm_eps: f32,
    pub batch_norm_eps: f32,
    pub default_steps: u32,
    /// Style token count and width shared by voices (`style_ttl` is [tokens, dim]).
    pub style_tokens: usize,
    pub style_dim: usize,
    pub text: TextHp,
    pub dp: DurationHp,
    pub te: TextEncoderHp,
    pub ve: VectorEstimatorHp,
    pub vocoder: VocoderHp,
}

impl Hparams {
    /// Latent channels seen by the estimator and vocoder (`latent_dim · compress`).
    pub fn latent_channels(&self) -> usize {
        self.latent_dim * self.chunk_compress_factor
    }

    /// Waveform samples per latent frame.
    pub fn samples_per_frame(&self) -> usize {
        self.base_chunk_size * self.chunk_compress_factor
    }

    pub fn load(gguf: &GgufFile) -> Result<Self, String> {
        let r = Reader(Metadata::new(gguf, ARCH));
        let version = match r.str("version")?.as_str() {
            "v1" => Version::V1,
            "v2" => Version::V2,
            "v3" => Version::V3,
            other => return Err(format!("{}: unknown supertonic.version '{other}'", gguf.path().display())),
        };
        let cfg = if r.bool("ve.cfg")? { Some((r.f32("ve.cfg_cond_scale")?, r.f32("ve.cfg_uncond_scale")?)) } else { None };
        Ok(Hparams {
            version,
            tts_version: r.str("tts_version")?,
            sample_rate: r.u32("sample_rate")?,
            base_chunk_size: r.usize("base_chunk_size")?,
            chunk_compress_factor: r.usize("chunk_compress_factor")?,
            latent_dim: r.usize("latent_dim")?,
            normalizer_scale: r.f32("normalizer_scale")?,
            layer_norm_eps: r.f32("layer_norm_eps")?,
            batch_norm_eps: r.f32("batch_norm_eps")?,
            default_steps: r.u32("default_steps")?,
            style_tokens: r.usize("style_tokens")?,
            style_dim: r.usize("style_dim")?,
            text: TextHp {
                wrap_open_close: match r.str("text.language_wrap")?.as_str() {
                    "none" => false,
                    "open_close" => true,
                    other => return Err(format!("{}: unknown supertonic.text.language_wrap '{other}'", gguf.path().display())),
                },
                languages: r.strs("text.languages")?,
                default_language: r.str("text.default_language")?,
                chunk_chars: r.usize("text.chunk_chars")?,
                short_chunk_chars: r.usize("text.short_chunk_chars")?,
                short_chunk_languages: r.str("text.short_chunk_languages")?.split(',').filter(|l| !l.is_empty()).map(str::to_string).collect(),
            },
            dp: DurationHp {
                char_dim: r.usize("dp.char_dim")?,
                convnext: r.convnext("dp.convnext")?,
                attn: r.attn_encoder("dp.attn")?,
                style_tokens: r.usize("dp.style_tokens")?,
                style_dim: r.usize("dp.style_dim")?,
                predictor_hidden: r.usize("dp.predictor_hidden")?,
            },
            te: TextEncoderHp {
                char_dim: r.usize("te.char_dim")?,
                convnext: r.convnext("te.convnext")?,
                attn: r.attn_encoder("te.attn")?,
                spte: r.cross_attn("te.spte")?,
            },
            ve: VectorEstimatorHp {
                hidden: r.usize("ve.hidden")?,
                time_dim: r.usize("ve.time_dim")?,
                time_hidden: r.usize("ve.time_hidden")?,
                time_scale: r.f32("ve.time_scale")?,
                blocks: r.usize("ve.blocks")?,
                convnext0: r.convnext("ve.convnext0")?,
                convnext1: r.convnext("ve.convnext1")?,
                convnext2: r.convnext("ve.convnext2")?,
                last_convnext: r.convnext("ve.last_convnext")?,
                text_attn: r.cross_attn("ve.text_attn")?,
                style_attn: r.cross_attn("ve.style_attn")?,
                cfg,
            },
            vocoder: VocoderHp {
                hidden: r.usize("voc.hidden")?,
                kernel_init: r.usize("voc.kernel_init")?,
                convnext: r.convnext("voc.convnext")?,
                head_hidden: r.usize("voc.head_hidden")?,
                head_kernel: r.usize("voc.head_kernel")?,
            },
        })
    }
}

/// Typed access to `supertonic.<key>` with errors that name the key, plus the
/// composite entries (ConvNeXt stacks, attention encoders) the stages share.
struct Reader<'a>(Metadata<'a>);

impl<'a> std::ops::Deref for Reader<'a> {
    type Target = Metadata<'a>;
    fn deref(&self) -> &Metadata<'a> {
        &self.0
    }
}

impl Reader<'_> {
    fn convnext(&self, p: &str) -> Result<ConvNextHp, String> {
        Ok(ConvNextHp { kernel: self.usize(&format!("{p}.kernel"))?, inner: self.usize(&format!("{p}.inner"))?, dilations: self.usizes(&format!("{p}.dilations"))? })
    }
    fn attn_encoder(&self, p: &str) -> Result<AttnEncoderHp, String> {
        Ok(AttnEncoderHp {
            layers: self.usize(&format!("{p}.layers"))?,
            heads: self.usize(&format!("{p}.heads"))?,
            filter: self.usize(&format!("{p}.filter"))?,
            window: self.usize(&format!("{p}.window"))?,
        })
    }
    fn cross_attn(&self, p: &str) -> Result<CrossAttnHp, String> {
        Ok(CrossAttnHp { heads: self.usize(&format!("{p}.heads"))?, units: self.usize(&format!("{p}.units"))?, scale: self.f32(&format!("{p}.scale"))? })
    }
}
