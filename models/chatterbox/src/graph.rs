//! Graph-construction helpers shared by the stage builders: the op context
//! and the weights, linear layers and LayerNorm.

use engine_core::model_kit::Weights;
use ggml_sys::{Context, Result, Tensor};

pub struct Builder<'c, 'w> {
    pub ctx: &'c Context,
    pub weights: &'w Weights,
}

impl<'c> Builder<'c, '_> {
    /// A weight tensor, usable in this graph (the weights outlive every graph).
    pub fn w(&self, name: &str) -> Result<Tensor<'c>> {
        self.weights.tensor(self.ctx, name)
    }

    /// `W x + b`, `W` stored `[in, out]` (ggml order), `x` `[in, n]`.
    pub fn linear(&self, x: Tensor<'c>, prefix: &str) -> Result<Tensor<'c>> {
        let y = self.ctx.mul_mat(self.w(&format!("{prefix}.weight"))?, x)?;
        self.ctx.add(y, self.w(&format!("{prefix}.bias"))?)
    }

    /// LayerNorm over ne0 with affine `prefix.weight` / `prefix.bias`.
    pub fn layer_norm(&self, x: Tensor<'c>, prefix: &str, eps: f32) -> Result<Tensor<'c>> {
        let n = self.ctx.norm(x, eps)?;
        let n = self.ctx.mul(n, self.w(&format!("{prefix}.weight"))?)?;
        self.ctx.add(n, self.w(&format!("{prefix}.bias"))?)
    }

    /// GELU, tanh form (GPT-2's `gelu_new`), from elementary ops: ggml's CPU
    /// `gelu` reads an F16 table, whose ~1e-3 error would break parity.
    pub fn gelu_tanh(&self, x: Tensor<'c>) -> Result<Tensor<'c>> {
        const SQRT_2_OVER_PI: f32 = 0.797_884_6;
        let c = self.ctx;
        let x3 = c.mul(c.mul(x, x)?, x)?;
        let inner = c.add(x, c.scale(x3, 0.044715)?)?;
        let t = c.tanh(c.scale(inner, SQRT_2_OVER_PI)?)?;
        c.mul(x, c.scale_bias(t, 0.5, 0.5)?)
    }
}
