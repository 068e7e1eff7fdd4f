//! The LSTM voice encoder (`ve.safetensors` / `ve.pt`) → `ve.*` in the T3
//! file, as convert.py's `voice_encoder_tensors` maps it: the LSTM's
//! per-layer weights and the projection, unchanged (PyTorch's gate order).

use super::plan::Planned;
use super::source::Source;
use engine_core::model_kit::Result;
use indexmap::IndexMap;

/// The planned tensors and `voice_encoder.{layers, hidden, n_mels, embedding}`.
pub type VoiceEncoderPlan<'a> = (IndexMap<String, Planned<'a>>, Vec<(&'static str, usize)>);

pub fn plan(src: &Source) -> Result<VoiceEncoderPlan<'_>> {
    let s = src.shapes();
    let layers = 1 + s
        .names()
        .filter_map(|k| {
            k.strip_prefix("lstm.weight_ih_l").filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())).and_then(|d| d.parse::<usize>().ok())
        })
        .max()
        .ok_or_else(|| s.error("no tensor named 'lstm.weight_ih_l<N>'"))?;
    let hidden = s.dim("lstm.weight_hh_l0", 1)?;
    let n_mels = s.dim("lstm.weight_ih_l0", 1)?;
    let embedding = s.dim("proj.weight", 0)?;
    let mut out = IndexMap::new();
    for l in 0..layers {
        let input = if l == 0 { n_mels } else { hidden };
        for (a, want) in
            [("weight_ih", vec![4 * hidden, input]), ("weight_hh", vec![4 * hidden, hidden]), ("bias_ih", vec![4 * hidden]), ("bias_hh", vec![4 * hidden])]
        {
            let name = format!("lstm.{a}_l{l}");
            src.float(&name)?;
            s.expect(&name, &want)?;
            out.insert(format!("ve.lstm.{l}.{a}"), Planned { shape: want, integer: false, produce: src.plain(&name) });
        }
    }
    for (name, want) in [("proj.weight", vec![embedding, hidden]), ("proj.bias", vec![embedding])] {
        src.float(name)?;
        s.expect(name, &want)?;
        out.insert(format!("ve.{name}"), Planned { shape: want, integer: false, produce: src.plain(name) });
    }
    Ok((out, vec![("layers", layers), ("hidden", hidden), ("n_mels", n_mels), ("embedding", embedding)]))
}
