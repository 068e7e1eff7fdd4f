//! The built-in voice, `conds.pt` (what the official package's
//! `Conditionals.save` writes: `{"t3": {...}, "gen": {...}}`), read with
//! model_kit's restricted pickle reader, so a hostile file is refused by the
//! name of the global it asks for and nothing in it runs. Cast as convert.py's
//! `load_conds` casts: embeddings and features to f32, token ids to i32.

use engine_core::model_kit::torch_pickle::{DType, PtFile};
use engine_core::model_kit::{Error, Result};
use ndarray::{ArrayD, IxDyn};
use std::path::Path;

pub struct Conds {
    /// `t3.speaker_emb`, flattened.
    pub speaker_emb: ArrayD<f32>,
    /// `t3.cond_prompt_speech_tokens`, flattened.
    pub prompt_speech_tokens: ArrayD<i32>,
    /// `gen.prompt_token`, flattened.
    pub prompt_token: ArrayD<i32>,
    /// `gen.prompt_feat` as `[frames, mel bins]`.
    pub prompt_feat: ArrayD<f32>,
    /// `gen.embedding`, flattened.
    pub embedding: ArrayD<f32>,
}

impl Conds {
    pub fn read(path: &Path) -> Result<Conds> {
        if !path.is_file() {
            return Err(Error::msg(format!("{} is missing", path.display())));
        }
        let pt = PtFile::open(path)?;
        let feat_shape = shape_of(&pt, "gen.prompt_feat")?;
        let Some(&bins) = feat_shape.last() else {
            return Err(Error::msg(format!("{}: tensor 'gen.prompt_feat' is a scalar, not [frames, mel bins]", path.display())));
        };
        let feat = floats(&pt, "gen.prompt_feat")?;
        let frames = feat.len().checked_div(bins).unwrap_or(0);
        Ok(Conds {
            speaker_emb: flat(floats(&pt, "t3.speaker_emb")?),
            prompt_speech_tokens: flat(ints(&pt, "t3.cond_prompt_speech_tokens")?),
            prompt_token: flat(ints(&pt, "gen.prompt_token")?),
            prompt_feat: ArrayD::from_shape_vec(IxDyn(&[frames, bins]), feat)
                .map_err(|e| Error::msg(format!("{}: tensor 'gen.prompt_feat': {e}", path.display())))?,
            embedding: flat(floats(&pt, "gen.embedding")?),
        })
    }
}

fn shape_of(pt: &PtFile, name: &str) -> Result<Vec<usize>> {
    pt.tensors().get(name).map(|t| t.shape.clone()).ok_or_else(|| Error::msg(format!("{}: no tensor '{name}'", pt.path().display())))
}

fn flat<T>(v: Vec<T>) -> ArrayD<T> {
    let n = v.len();
    ArrayD::from_shape_vec(IxDyn(&[n]), v).expect("a vector is one-dimensional")
}

/// `name` as f32 (numpy's `astype(float32)`: integers convert too).
fn floats(pt: &PtFile, name: &str) -> Result<Vec<f32>> {
    shape_of(pt, name)?;
    if is_float(pt.tensors()[name].dtype) {
        pt.read_f32(name)
    } else {
        Ok(pt.read_i64(name)?.into_iter().map(|v| v as f32).collect())
    }
}

/// `name` as i32 token ids (numpy's `astype(int32)` of an integer tensor).
fn ints(pt: &PtFile, name: &str) -> Result<Vec<i32>> {
    shape_of(pt, name)?;
    if is_float(pt.tensors()[name].dtype) {
        return Err(Error::msg(format!("{}: tensor '{name}' is {}, not token ids", pt.path().display(), pt.tensors()[name].dtype.name())));
    }
    Ok(pt.read_i64(name)?.into_iter().map(|v| v as i32).collect())
}

fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
}
