//! Static K/V cache, sized for the whole context and resident in a backend
//! buffer for the model's lifetime. Graphs write the new rows with `set_rows`
//! at positions given as an input tensor, so a graph built once serves every
//! decode step.

use ggml_sys::{Backend, Buffer, Context, Result, Tensor, Type};

/// How attention reads the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionPath {
    /// `flash_attn_ext`: one tensor per layer whose row per position is K
    /// then V, in `KvCache::ty`: the projection's adjacent K and V columns go
    /// in with one `set_rows`, and attention reads both through strided views.
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
        let (d, n) = (n_embd as i64, n_ctx as i64);
        for l in 0..n_layer {
            match path {
                AttentionPath::Flash => {
                    let _ = ctx.new_tensor(ty, &[2 * d, n])?.set_name(&format!("kv.{l}"));
                }
                AttentionPath::Explicit => {
                    let _ = ctx.new_tensor(ty, &[d, n])?.set_name(&format!("k.{l}"));
                    let _ = ctx.new_tensor(ty, &[n, d])?.set_name(&format!("v.{l}"));
                }
            }
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

    /// Layer `l`'s cache tensor named `part` (`kv` on the fused path, `k` and
    /// `v` on the explicit one), usable in a graph built in `ctx`. Graphs are
    /// owned next to the cache and dropped before it, so the rebinding is sound.
    pub fn tensor<'c>(&self, ctx: &'c Context, part: &str, l: usize) -> Tensor<'c> {
        unsafe { self.ctx.get_tensor(&format!("{part}.{l}")).expect("cache tensor").rebind(ctx) }
    }
}
