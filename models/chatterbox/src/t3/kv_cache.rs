//! Static K/V cache, sized for the whole context and resident in a backend
//! buffer for the model's lifetime. Graphs write the new rows with `set_rows`
//! at positions given as an input tensor, so a graph built once serves every
//! decode step. A cache may hold several sequences ("rows", e.g. the
//! conditional and unconditional rows of classifier-free guidance): row `r`'s
//! position `p` is cache row `r · n_ctx + p`.

use ggml_sys::{Backend, Buffer, Context, Result, Tensor, Type};

/// How attention reads the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionPath {
    /// `flash_attn_ext` over row-major K and V in `KvCache::ty`. The T3s'
    /// projections lay K and V out side by side (Llama's K rotated in place),
    /// so both live in one tensor whose row per position is K then V
    /// (`KvLayout::Fused`), written with one `set_rows`.
    Flash,
    /// Explicit QK^T, softmax, V products: V is stored transposed (one row per
    /// channel and sequence) so the product reads it contiguously; both F32.
    Explicit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvLayout {
    /// `kv.{l}` `[2·width, n_ctx·rows]` (flash path only).
    Fused,
    /// `k.{l}` `[width, n_ctx·rows]` and `v.{l}`: `[width, n_ctx·rows]` on the
    /// flash path, `[n_ctx, width·rows]` (transposed per row) on the explicit one.
    Split,
}

/// A cache's extent: layers, per-position width, positions and rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvDims {
    pub n_layer: usize,
    pub width: usize,
    pub n_ctx: usize,
    pub rows: usize,
}

pub struct KvCache {
    // Dropped first: the buffer holds the data of `ctx`'s tensors (none in
    // a cache made for measuring).
    buffer: Option<Buffer>,
    ctx: Context,
    bytes: usize,
    pub n_layer: usize,
    /// Width of one position's K (and of its V): K/V heads × head width.
    pub width: usize,
    pub n_ctx: usize,
    /// Sequences held side by side.
    pub rows: usize,
    pub ty: Type,
    pub path: AttentionPath,
    pub layout: KvLayout,
}

impl KvCache {
    pub fn new(backend: &Backend, dims: KvDims, ty: Type, path: AttentionPath, layout: KvLayout) -> Result<Self> {
        let mut kv = Self::describe(dims, ty, path, layout)?;
        let buffer = backend.alloc_ctx_tensors(&kv.ctx)?;
        // Positions past the written ones are masked, but a masked NaN still
        // poisons a fused kernel's sums: start from zeros.
        buffer.clear(0);
        kv.bytes = buffer.size();
        kv.buffer = Some(buffer);
        Ok(kv)
    }

    /// The cache [`new`](Self::new) makes on `backend`, without memory: for
    /// measuring the graphs over it; [`bytes`](Self::bytes) is what `new`
    /// allocates.
    pub fn for_measuring(backend: &Backend, dims: KvDims, ty: Type, path: AttentionPath, layout: KvLayout) -> Result<Self> {
        let mut kv = Self::describe(dims, ty, path, layout)?;
        kv.bytes = backend.buffer_type().size_for(&kv.ctx);
        Ok(kv)
    }

    /// The cache's tensors, in a context of their own.
    fn describe(dims: KvDims, ty: Type, path: AttentionPath, layout: KvLayout) -> Result<Self> {
        let KvDims { n_layer, width, n_ctx, rows } = dims;
        let layout = if path == AttentionPath::Explicit { KvLayout::Split } else { layout };
        let ctx = Context::new_no_alloc(2 * n_layer, 0)?;
        let (w, n, r) = (width as i64, n_ctx as i64, rows as i64);
        for l in 0..n_layer {
            match (path, layout) {
                (_, KvLayout::Fused) => {
                    let _ = ctx.new_tensor(ty, &[2 * w, n * r])?.set_name(&format!("kv.{l}"));
                }
                (AttentionPath::Flash, KvLayout::Split) => {
                    let _ = ctx.new_tensor(ty, &[w, n * r])?.set_name(&format!("k.{l}"));
                    let _ = ctx.new_tensor(ty, &[w, n * r])?.set_name(&format!("v.{l}"));
                }
                (AttentionPath::Explicit, KvLayout::Split) => {
                    let _ = ctx.new_tensor(ty, &[w, n * r])?.set_name(&format!("k.{l}"));
                    let _ = ctx.new_tensor(ty, &[n, w * r])?.set_name(&format!("v.{l}"));
                }
            }
        }
        Ok(KvCache { buffer: None, ctx, bytes: 0, n_layer, width, n_ctx, rows, ty, path, layout })
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Layer `l`'s cache tensor named `part` (`kv` for the fused layout, `k`
    /// and `v` for the split one), usable in a graph built in `ctx`. Graphs are
    /// owned next to the cache and dropped before it, so the rebinding is sound.
    pub fn tensor<'c>(&self, ctx: &'c Context, part: &str, l: usize) -> Tensor<'c> {
        unsafe { self.ctx.get_tensor(&format!("{part}.{l}")).expect("cache tensor").rebind(ctx) }
    }
}
