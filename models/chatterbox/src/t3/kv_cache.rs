//! Static K/V cache: one K and one V tensor per layer, sized for the whole
//! context and resident in a backend buffer for the model's lifetime. Graphs
//! write the new rows with `set_rows` at positions given as an input tensor,
//! so a graph built once serves every decode step.

use ggml_sys::{Backend, Buffer, Context, Result, Tensor, Type};

/// How attention reads the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionPath {
    /// `flash_attn_ext`: K and V stored row per position, in `KvCache::ty`.
    Flash,
    /// Explicit QK^T, softmax, V products: V is stored transposed (one row per
    /// channel) so the product reads it contiguously; both F32.
    Explicit,
}

pub struct KvCache {
    // Dropped first: the buffer holds the data of `ctx`'s tensors.
    buffer: Buffer,
    ctx: Context,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ctx: usize,
    pub ty: Type,
    pub path: AttentionPath,
}

impl KvCache {
    pub fn new(backend: &Backend, n_layer: usize, n_embd: usize, n_ctx: usize, ty: Type, path: AttentionPath) -> Result<Self> {
        let ctx = Context::new_no_alloc(2 * n_layer, 0)?;
        for l in 0..n_layer {
            let _ = ctx.new_tensor(ty, &[n_embd as i64, n_ctx as i64])?.set_name(&format!("k.{l}"));
            let v_shape = match path {
                AttentionPath::Flash => [n_embd as i64, n_ctx as i64],
                AttentionPath::Explicit => [n_ctx as i64, n_embd as i64],
            };
            let _ = ctx.new_tensor(ty, &v_shape)?.set_name(&format!("v.{l}"));
        }
        let buffer = backend.alloc_ctx_tensors(&ctx)?;
        // Positions past the written ones are masked, but a masked NaN still
        // poisons a fused kernel's sums: start from zeros.
        buffer.clear(0);
        Ok(KvCache { buffer, ctx, n_layer, n_embd, n_ctx, ty, path })
    }

    pub fn bytes(&self) -> usize {
        self.buffer.size()
    }

    /// Layer `l`'s K and V, usable in a graph built in `ctx`. Graphs are owned
    /// next to the cache and dropped before it, so the rebinding is sound.
    pub fn layer<'c>(&self, ctx: &'c Context, l: usize) -> (Tensor<'c>, Tensor<'c>) {
        let get = |n: String| unsafe { self.ctx.get_tensor(&n).expect("cache tensor").rebind(ctx) };
        (get(format!("k.{l}")), get(format!("v.{l}")))
    }
}
