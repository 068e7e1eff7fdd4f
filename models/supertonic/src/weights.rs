//! Model tensors: the GGUF file's tensors, resident in one backend buffer.

use ggml_sys::gguf::GgufTensors;
use ggml_sys::{Backend, Buffer, Context, Error, Result, Tensor};

pub struct Weights {
    // Dropped first: the buffers hold the data of `gguf.ctx`'s tensors.
    _buffers: Vec<Buffer>,
    gguf: GgufTensors,
    /// Matrices placed in a device-specific layout (CPU: AMX / repacked).
    pub in_extra_buffers: usize,
}

/// Weights only ever used as the first operand of a matrix product (the
/// `linear` layers); the rest (embeddings read by row, depthwise taps read as
/// views, norms) must stay in plain memory.
fn is_matmul_weight(name: &str) -> bool {
    name.ends_with(".weight") && ![".dw.", ".ln", ".bn.", "char_emb"].iter().any(|p| name.contains(p))
}

impl Weights {
    pub fn load(gguf: GgufTensors, backend: &Backend) -> Result<Self> {
        let (buffers, in_extra) = gguf.load_into_with_extra(backend, is_matmul_weight)?;
        Ok(Weights { _buffers: buffers, gguf, in_extra_buffers: in_extra })
    }

    pub fn gguf(&self) -> &GgufTensors {
        &self.gguf
    }

    /// A weight usable in a graph built in `ctx`. Graphs are owned next to the
    /// weights and dropped before them, so the rebinding is sound.
    pub fn tensor<'c>(&self, ctx: &'c Context, name: &str) -> Result<Tensor<'c>> {
        let t = self.gguf.ctx.get_tensor(name).ok_or_else(|| Error::Msg(format!("{}: tensor '{name}' is missing", self.gguf.file.path().display())))?;
        Ok(unsafe { t.rebind(ctx) })
    }

    pub fn has(&self, name: &str) -> bool {
        self.gguf.ctx.get_tensor(name).is_some()
    }

    /// Shape (ggml order) of a weight.
    pub fn shape(&self, name: &str) -> Result<[i64; 4]> {
        self.gguf.ctx.get_tensor(name).map(|t| t.ne()).ok_or_else(|| Error::Msg(format!("tensor '{name}' is missing")))
    }

    /// A small F32 weight's values, read on the host (scalars like PReLU slopes).
    pub fn host_f32(&self, name: &str) -> Result<Vec<f32>> {
        let t = self.gguf.ctx.get_tensor(name).ok_or_else(|| Error::Msg(format!("tensor '{name}' is missing")))?;
        t.get_f32()
    }
}
