//! Building blocks shared by the stages: linear layers, LayerNorm, edge-padded
//! depthwise convolution, ConvNeXt, the VITS relative-position attention encoder
//! and multi-head cross-attention.

use crate::hparams::{AttnEncoderHp, ConvNextHp, CrossAttnHp};
use engine_core::model_kit;
use ggml_sys::{Result, Tensor, TYPE_I32};
use std::cell::RefCell;

/// The kit's builder (policy-aware ops, weights, linear layers) plus the
/// LayerNorm epsilon every Supertonic stage shares.
pub struct Builder<'c, 'w> {
    pub kit: model_kit::Builder<'c, 'w>,
    pub ln_eps: f32,
    /// Row indices of the edge paddings built so far, by `(T, left, right,
    /// B)`: every convolution of one padding in a graph shares one.
    pad_rows: RefCell<Vec<([i64; 4], Tensor<'c>)>>,
}

impl<'c, 'w> Builder<'c, 'w> {
    pub fn new(kit: model_kit::Builder<'c, 'w>, ln_eps: f32) -> Self {
        Builder { kit, ln_eps, pad_rows: RefCell::new(Vec::new()) }
    }
}

impl<'c, 'w> std::ops::Deref for Builder<'c, 'w> {
    type Target = model_kit::Builder<'c, 'w>;
    fn deref(&self) -> &Self::Target {
        &self.kit
    }
}

const F32: usize = std::mem::size_of::<f32>();

impl<'c> Builder<'c, '_> {
    /// LayerNorm over channels with affine `prefix.weight` / `prefix.bias`.
    pub fn layer_norm(&self, x: Tensor<'c>, prefix: &str) -> Result<Tensor<'c>> {
        self.kit.layer_norm(x, prefix, self.ln_eps)
    }

    /// Replicates the first and last frames: `[C, T, B]` → `[C, left + T + right, B]`.
    /// One row gather where the device runs it (its indices, clamped to the
    /// frames, are computed on the device once per graph and padding), else
    /// repeats and concatenations.
    pub fn edge_pad(&self, x: Tensor<'c>, left: usize, right: usize) -> Result<Tensor<'c>> {
        if left == 0 && right == 0 {
            return Ok(x);
        }
        let [c, t, b, _] = x.ne();
        if let Some(rows) = self.pad_rows(t, left, right, b)? {
            let x = if x.is_contiguous() { x } else { self.ctx.cont(x)? };
            let padded = self.ctx.get_rows(x, rows)?;
            if self.device.is_none_or(|dev| dev.supports_op(padded)) {
                return Ok(padded);
            }
        }
        let nb = x.nb();
        let mut out = x;
        if left > 0 {
            let first = self.ctx.view(x, &[c, 1, b], &[nb[1], nb[2]], 0)?;
            let rep = self.ctx.repeat_to(first, [c, left as i64, b, 1])?;
            out = self.ctx.concat(rep, out, 1)?;
        }
        if right > 0 {
            let last = self.ctx.view(x, &[c, 1, b], &[nb[1], nb[2]], (t as usize - 1) * nb[1])?;
            let rep = self.ctx.repeat_to(last, [c, right as i64, b, 1])?;
            out = self.ctx.concat(out, rep, 1)?;
        }
        Ok(out)
    }

    /// `clamp(i − left, 0, T − 1)` for `i < left + T + right`, as I32 rows
    /// `[T', B]`; None where the device lacks a node of it.
    fn pad_rows(&self, t: i64, left: usize, right: usize, b: i64) -> Result<Option<Tensor<'c>>> {
        let key = [t, left as i64, right as i64, b];
        if let Some((_, rows)) = self.pad_rows.borrow().iter().find(|(k, _)| *k == key) {
            return Ok(Some(*rows));
        }
        let c = self.ctx;
        let n = t + (left + right) as i64;
        let positions = c.arange(-(left as f32), (t as usize + right) as f32, 1.0)?;
        let clamped = c.clamp(positions, 0.0, (t - 1) as f32)?;
        let index = if b > 1 { c.repeat_to(c.reshape(clamped, &[n, 1])?, [n, b, 1, 1])? } else { clamped };
        let rows = c.cast(index, TYPE_I32)?;
        if !self.device.is_none_or(|dev| [positions, clamped, index, rows].iter().all(|&node| dev.supports_op(node))) {
            return Ok(None);
        }
        self.pad_rows.borrow_mut().push((key, rows));
        Ok(Some(rows))
    }

    /// Depthwise convolution along time with edge-replication padding,
    /// symmetric or all on the left (`causal`); `weight` is `[C, k]` (ggml order).
    pub fn depthwise_conv(&self, x: Tensor<'c>, prefix: &str, kernel: usize, dilation: usize, causal: bool) -> Result<Tensor<'c>> {
        let span = dilation * (kernel - 1);
        let (left, right) = if causal { (span, 0) } else { (span / 2, span - span / 2) };
        // Concatenation leaves the padded frames contiguous; without padding
        // the kit makes a strided input contiguous itself.
        let xp = self.edge_pad(x, left, right)?;
        let y = self.kit.depthwise_conv_1d(self.w(&format!("{prefix}.weight"))?, xp, dilation)?;
        self.ctx.add(y, self.w(&format!("{prefix}.bias"))?)
    }

    /// ConvNeXt block: `x + γ · pw2(gelu(pw1(LN(dwconv(x)))))`.
    pub fn convnext(&self, x: Tensor<'c>, prefix: &str, kernel: usize, dilation: usize, causal: bool) -> Result<Tensor<'c>> {
        let h = self.depthwise_conv(x, &format!("{prefix}.dw"), kernel, dilation, causal)?;
        let h = self.layer_norm(h, &format!("{prefix}.ln"))?;
        let h = self.ctx.gelu_erf(self.linear(h, &format!("{prefix}.pw1"))?)?;
        let h = self.linear(h, &format!("{prefix}.pw2"))?;
        let h = self.ctx.mul(h, self.w(&format!("{prefix}.gamma"))?)?;
        self.ctx.add(x, h)
    }

    pub fn convnext_stack(&self, mut x: Tensor<'c>, prefix: &str, hp: &ConvNextHp, causal: bool) -> Result<Tensor<'c>> {
        for (i, &d) in hp.dilations.iter().enumerate() {
            x = self.convnext(x, &format!("{prefix}.{i}"), hp.kernel, d, causal)?;
        }
        Ok(x)
    }

    /// Splits `[U, T, B]` into heads: `[U/H, T, H, B]` (contiguous).
    pub fn split_heads(&self, x: Tensor<'c>, heads: usize) -> Result<Tensor<'c>> {
        let [u, t, b, _] = x.ne();
        let h = heads as i64;
        let x = if x.is_contiguous() { x } else { self.ctx.cont(x)? };
        let x = self.ctx.reshape(x, &[u / h, h, t, b])?;
        self.ctx.cont(self.ctx.permute(x, [0, 2, 1, 3])?)
    }

    /// Inverse of [`split_heads`](Self::split_heads): `[D, T, H, B]` → `[D·H, T, B]`.
    pub fn merge_heads(&self, x: Tensor<'c>) -> Result<Tensor<'c>> {
        let [d, t, h, b] = x.ne();
        let x = self.ctx.cont(self.ctx.permute(x, [0, 2, 1, 3])?)?;
        self.ctx.reshape(x, &[d * h, t, b])
    }

    /// Multi-head cross-attention over precomputed keys: q from `x`, keys
    /// `[U, S, B]`, values projected from `values_in` `[Cs, S, B]`; output
    /// projected back and added to nothing (callers add their residual).
    pub fn cross_attention(&self, x: Tensor<'c>, keys: Tensor<'c>, values_in: Tensor<'c>, prefix: &str, hp: &CrossAttnHp) -> Result<Tensor<'c>> {
        let q = self.split_heads(self.linear(x, &format!("{prefix}.q"))?, hp.heads)?;
        let k = self.split_heads(keys, hp.heads)?;
        let v = self.split_heads(self.linear(values_in, &format!("{prefix}.v"))?, hp.heads)?;
        let o = self.attention(q, k, v, None, hp.scale)?;
        self.linear(o, &format!("{prefix}.o"))
    }

    /// A relative-position table `[D, 2W+1]` (ne0 = D) cut or zero-padded along
    /// ne1 to the `2T−1` relative offsets a length-T sequence has.
    fn relative_table(&self, table: Tensor<'c>, window: usize, t: usize) -> Result<Tensor<'c>> {
        let [d, n, _, _] = table.ne();
        debug_assert_eq!(n as usize, 2 * window + 1);
        let want = 2 * t - 1;
        if t > window + 1 {
            let pad = (t - window - 1) as i32;
            self.ctx.pad_ext(table, [[0, 0], [pad, pad], [0, 0], [0, 0]])
        } else {
            let start = window + 1 - t;
            self.ctx.view(table, &[d, want as i64], &[table.nb()[1]], start * table.nb()[1])
        }
    }

    /// VITS relative-position self-attention on `[C, T]` (batch 1): scores
    /// `q·k + q·E_k[j−i]`, output `Σ p v + Σ p E_v[j−i]`, window W, heads
    /// sharing the tables.
    pub fn relative_attention(&self, x: Tensor<'c>, prefix: &str, hp: &AttnEncoderHp) -> Result<Tensor<'c>> {
        let ctx = self.ctx;
        let [c, t, _, _] = x.ne();
        let (t_us, heads) = (t as usize, hp.heads);
        let d = c as usize / heads;
        let q = self.split_heads(self.linear(x, &format!("{prefix}.q"))?, heads)?; // [D, T, H]
        let q = ctx.scale(q, 1.0 / (d as f32).sqrt())?;
        let k = self.split_heads(self.linear(x, &format!("{prefix}.k"))?, heads)?;
        let v = self.split_heads(self.linear(x, &format!("{prefix}.v"))?, heads)?;
        let two_t = 2 * t_us - 1;

        // Relative key logits [2T-1, T, H] → absolute [T(j), T(i), H].
        let rel_k = self.relative_table(self.w(&format!("{prefix}.rel_k"))?, hp.window, t_us)?;
        let rel_logits = ctx.mul_mat(ctx.cont(rel_k)?, q)?;
        let abs = self.relative_to_absolute(rel_logits, t_us, heads)?;
        let scores = ctx.add(ctx.mul_mat(k, q)?, abs)?;
        let probs = ctx.soft_max_ext(scores, None, 1.0)?;
        let vt = ctx.cont(ctx.permute(v, [1, 0, 2, 3])?)?;
        let out = ctx.mul_mat(vt, probs)?; // [D, T, H]

        // Relative value term: probabilities to relative offsets, times E_v.
        let rel_p = self.absolute_to_relative(probs, t_us, heads)?; // [2T-1, T, H]
        let rel_v_t = self.relative_table(self.w(&format!("{prefix}.rel_v"))?, hp.window, t_us)?; // [D, 2T-1]
        let rel_v = ctx.cont(ctx.transpose(ctx.cont(rel_v_t)?)?)?; // [2T-1, D]
        debug_assert_eq!(rel_v.ne()[0] as usize, two_t);
        let out = ctx.add(out, ctx.mul_mat(rel_v, rel_p)?)?;
        self.linear(self.merge_heads(out)?, &format!("{prefix}.o"))
    }

    /// `[2T−1 (offset), T (query), H]` → `[T (key), T (query), H]` where entry
    /// (j, i) is the offset j − i + T − 1 (the pad-and-reshape trick).
    fn relative_to_absolute(&self, x: Tensor<'c>, t: usize, heads: usize) -> Result<Tensor<'c>> {
        let ctx = self.ctx;
        let (t64, h) = (t as i64, heads as i64);
        let x = ctx.pad_ext(x, [[0, 1], [0, 0], [0, 0], [0, 0]])?; // [2T, T, H]
        let x = ctx.reshape(ctx.cont(x)?, &[2 * t64 * t64, h])?;
        let x = ctx.pad_ext(x, [[0, t as i32 - 1], [0, 0], [0, 0], [0, 0]])?;
        let x = ctx.cont(x)?; // [2T·T + T − 1, H]
        let row = (2 * t - 1) * F32;
        let plane = (2 * t * t + t - 1) * F32;
        ctx.cont(ctx.view(x, &[t64, t64, h], &[row, plane], (t - 1) * F32)?)
    }

    /// `[T (key), T (query), H]` → `[2T−1 (offset), T (query), H]`.
    fn absolute_to_relative(&self, x: Tensor<'c>, t: usize, heads: usize) -> Result<Tensor<'c>> {
        let ctx = self.ctx;
        let (t64, h) = (t as i64, heads as i64);
        let x = ctx.pad_ext(x, [[0, t as i32 - 1], [0, 0], [0, 0], [0, 0]])?; // [2T-1, T, H]
        let x = ctx.reshape(ctx.cont(x)?, &[(2 * t64 - 1) * t64, h])?;
        let x = ctx.cont(ctx.pad_ext(x, [[t as i32, 0], [0, 0], [0, 0], [0, 0]])?)?; // [2T·T, H]
        ctx.cont(ctx.view(x, &[2 * t64 - 1, t64, h], &[2 * t * F32, 2 * t * t * F32], F32)?)
    }

    /// Post-norm relative attention encoder (VITS): per layer
    /// `x = LN1(x + attn(x)); x = LN2(x + ffn(x))`, ReLU FFN with 1×1 convs.
    pub fn attention_encoder(&self, mut x: Tensor<'c>, prefix: &str, hp: &AttnEncoderHp) -> Result<Tensor<'c>> {
        for i in 0..hp.layers {
            let p = format!("{prefix}.{i}");
            let a = self.relative_attention(x, &p, hp)?;
            x = self.layer_norm(self.ctx.add(x, a)?, &format!("{p}.ln1"))?;
            let f = self.ctx.relu(self.linear(x, &format!("{p}.ffn.up"))?)?;
            let f = self.linear(f, &format!("{p}.ffn.down"))?;
            x = self.layer_norm(self.ctx.add(x, f)?, &format!("{p}.ln2"))?;
        }
        Ok(x)
    }
}
