//! The graph builder every model family starts from: weights by table name,
//! linear layers, LayerNorm, and the ops whose form the policies choose
//! (attention, leaky ReLU, transposed convolution). A family's own blocks
//! wrap this builder (`Deref`) and add what only it needs.

use super::policy::OpPolicy;
use super::weights::Weights;
use ggml_sys::{Backend, ComputeGraph, Context, Device, GraphIo, Result, Tensor};
use std::cell::RefCell;

pub struct Builder<'c, 'w> {
    pub ctx: &'c Context,
    pub weights: &'w Weights,
    pub policy: &'w OpPolicy,
    /// Asked whether it runs a fused node before the builder uses one.
    pub device: Option<Device>,
    /// All-zero attention masks built so far, by `[n_kv, n_q]`: every unmasked
    /// fused attention of one shape in a graph shares one.
    zero_masks: RefCell<Vec<([i64; 2], Tensor<'c>)>>,
}

impl<'c, 'w> Builder<'c, 'w> {
    pub fn new(ctx: &'c Context, weights: &'w Weights, policy: &'w OpPolicy, device: Option<Device>) -> Self {
        Builder { ctx, weights, policy, device, zero_masks: RefCell::new(Vec::new()) }
    }

    /// A weight tensor, usable in this graph (the weights outlive every graph).
    pub fn w(&self, name: &str) -> Result<Tensor<'c>> {
        self.weights.tensor(self.ctx, name)
    }

    /// `W x` for a weight stored `[in, out]` (ggml order) and `x` `[in, T, B]`:
    /// every frame of every batch item as one product (a batch dimension would
    /// split it into one product per item, streaming the weights once per item).
    /// A contiguous `x` is reshaped as it is: a copy would be one more launch
    /// per product (382 a step of the Multilingual CFM's guidance batch).
    pub fn matmul(&self, w: Tensor<'c>, x: Tensor<'c>) -> Result<Tensor<'c>> {
        let [c, t, b, one] = x.ne();
        if b == 1 || one != 1 {
            return self.ctx.mul_mat(w, x);
        }
        let x = if x.is_contiguous() { x } else { self.ctx.cont(x)? };
        let flat = self.ctx.reshape(x, &[c, t * b])?;
        let y = self.ctx.mul_mat(w, flat)?;
        self.ctx.reshape(y, &[y.ne()[0], t, b])
    }

    /// `W x + b` from `prefix.weight` / `prefix.bias`.
    pub fn linear(&self, x: Tensor<'c>, prefix: &str) -> Result<Tensor<'c>> {
        let y = self.matmul(self.w(&format!("{prefix}.weight"))?, x)?;
        self.ctx.add(y, self.w(&format!("{prefix}.bias"))?)
    }

    /// `W x` from the weight `name`.
    pub fn linear_no_bias(&self, x: Tensor<'c>, name: &str) -> Result<Tensor<'c>> {
        self.matmul(self.w(name)?, x)
    }

    /// LayerNorm over ne0 with affine `prefix.weight` / `prefix.bias`.
    pub fn layer_norm(&self, x: Tensor<'c>, prefix: &str, eps: f32) -> Result<Tensor<'c>> {
        let n = self.ctx.norm(x, eps)?;
        let n = self.ctx.mul(n, self.w(&format!("{prefix}.weight"))?)?;
        self.ctx.add(n, self.w(&format!("{prefix}.bias"))?)
    }

    /// RMSNorm over ne0 with the gain `name`.
    pub fn rms_norm(&self, x: Tensor<'c>, name: &str, eps: f32) -> Result<Tensor<'c>> {
        self.ctx.mul(self.ctx.rms_norm(x, eps)?, self.w(name)?)
    }

    /// GELU, tanh form (GPT-2's `gelu_new`): the backend's node on a GPU,
    /// which evaluates the formula in F32 in one launch; elsewhere from
    /// elementary ops, because ggml's CPU `gelu` reads an F16 table whose
    /// ~1e-3 error would break parity.
    pub fn gelu_tanh(&self, x: Tensor<'c>) -> Result<Tensor<'c>> {
        const SQRT_2_OVER_PI: f32 = 0.797_884_6;
        let c = self.ctx;
        if let Some(dev) = self.device.filter(|d| d.kind() != ggml_sys::DeviceKind::Cpu) {
            let native = c.gelu(x)?;
            if dev.supports_op(native) {
                return Ok(native);
            }
        }
        let x3 = c.mul(c.mul(x, x)?, x)?;
        let inner = c.add(x, c.scale(x3, 0.044715)?)?;
        let t = c.tanh(c.scale(inner, SQRT_2_OVER_PI)?)?;
        c.mul(x, c.scale_bias(t, 0.5, 0.5)?)
    }

    /// Leaky ReLU: the backend's `LEAKY_RELU`, or `relu(x)·(1−s) + s·x`.
    pub fn leaky_relu(&self, x: Tensor<'c>, slope: f32) -> Result<Tensor<'c>> {
        if self.policy.native_leaky_relu {
            return self.ctx.leaky_relu(x, slope);
        }
        let c = self.ctx;
        c.add(c.scale(c.relu(x)?, 1.0 - slope)?, c.scale(x, slope)?)
    }

    /// Depthwise 1-D convolution along time, no padding: `weight` `[C, K]`
    /// (ggml order: channel fastest, as PyTorch's `[C, 1, K]` converts) over
    /// `x` `[C, T, B]` → `[C, T − dilation·(K−1), B]`, no bias. The backend's
    /// `CONV_2D_DW` on the channels-fastest layout (one launch), or a sum of
    /// K shifted copies scaled by the per-channel taps where the device lacks
    /// the node or a deny rule forbids it.
    pub fn depthwise_conv_1d(&self, weight: Tensor<'c>, x: Tensor<'c>, dilation: usize) -> Result<Tensor<'c>> {
        let c = self.ctx;
        let [ch, k, _, _] = weight.ne();
        let [_, t, b, _] = x.ne();
        let out_len = t - dilation as i64 * (k - 1);
        let x = if x.is_contiguous() { x } else { c.cont(x)? };
        if self.policy.denial("CONV_2D_DW").is_none() && out_len > 0 && t > 1 {
            // As [W, 1, C, N] with channels fastest in memory; the kernel as
            // [K, 1, 1, C] with the channel stride smallest, as the CPU checks.
            let input = c.permute(c.reshape(x, &[ch, t, 1, b])?, [2, 0, 1, 3])?;
            let kernel = c.permute(c.reshape(weight, &[ch, 1, k, 1])?, [3, 2, 0, 1])?;
            let y = c.conv_2d_dw_direct(kernel, input, [1, 1], [0, 0], [dilation as i32, 1])?; // [T', 1, C, B], channels fastest
            if self.device.is_none_or(|dev| dev.supports_op(y)) {
                return c.reshape(c.permute(y, [1, 2, 0, 3])?, &[ch, out_len, b]);
            }
        }
        const F32: usize = std::mem::size_of::<f32>();
        let nb = x.nb();
        let mut acc: Option<Tensor<'c>> = None;
        for tap in 0..k as usize {
            let shifted = c.view(x, &[ch, out_len, b], &[nb[1], nb[2]], tap * dilation * nb[1])?;
            let w = c.view(weight, &[ch], &[], tap * ch as usize * F32)?;
            let term = c.mul(shifted, w)?;
            acc = Some(match acc {
                None => term,
                Some(a) => c.add(a, term)?,
            });
        }
        Ok(acc.expect("a kernel has at least one tap"))
    }

    /// 2-D convolution of an image `x` `[W, H, C_in]` (W fastest), kernel
    /// `[kw, kh, C_in, C_out]` (ggml order), strides and symmetric zero
    /// padding per axis (W, H) → `[W_out, H_out, C_out]`. On the CPU the direct
    /// `CONV_2D` node (the CPU plugin's patch 0005 computes it without a patch
    /// matrix in memory); elsewhere, or where a deny rule forbids the node,
    /// im2col and a product: GPU backends keep the path their parity suites
    /// verified. (ggml-vulkan's `CONV_2D` crashed lavapipe in about one run of
    /// six of the cloning suite, likely the stale-descriptor fault that
    /// `backends/vulkan` patch 0004 fixes; not measured apart.)
    pub fn conv_2d(&self, kernel: Tensor<'c>, x: Tensor<'c>, stride: [i32; 2], pad: [i32; 2]) -> Result<Tensor<'c>> {
        let c = self.ctx;
        let on_cpu = self.device.is_none_or(|d| d.kind() == ggml_sys::DeviceKind::Cpu);
        if on_cpu && self.policy.denial("CONV_2D").is_none() {
            let y = c.conv_2d_direct(kernel, x, stride, pad, [1, 1])?;
            if self.device.is_none_or(|dev| dev.supports_op(y)) {
                return Ok(y);
            }
        }
        c.conv_2d(kernel, x, stride, pad)
    }

    /// 1-D convolution along time in the time-first layout: `x` `[T, C_in]`
    /// (T fastest; any row stride), kernel `[K, C_in, C_out]` (PyTorch's
    /// `[C_out, C_in, K]` in ggml order), symmetric zero padding →
    /// `[T_out, C_out]`, no bias. On the CPU with an F32 kernel, one direct
    /// `CONV_2D` node of height 1 (patch 0005 gathers the taps of 64 outputs
    /// in cache instead of writing every patch to memory, `K·C_in` times the
    /// input); elsewhere, or where a deny rule forbids the node, im2col and a
    /// product.
    pub fn conv_1d(&self, kernel: Tensor<'c>, x: Tensor<'c>, stride: usize, pad: usize, dilation: usize) -> Result<Tensor<'c>> {
        let c = self.ctx;
        let on_cpu = self.device.is_none_or(|d| d.kind() == ggml_sys::DeviceKind::Cpu);
        if on_cpu && kernel.ty() == ggml_sys::TYPE_F32 && self.policy.denial("CONV_2D").is_none() {
            let [k, c_in, c_out, _] = kernel.ne();
            let [t, x_channels, _, _] = x.ne();
            let row = x.nb()[1];
            // Height 1: the H stride is never followed, the channel stride is the row stride.
            let image = c.view(x, &[t, 1, x_channels, 1], &[row, row, row * x_channels as usize], 0)?;
            let kernel = c.reshape(kernel, &[k, 1, c_in, c_out])?;
            let y = c.conv_2d_direct(kernel, image, [stride as i32, 1], [pad as i32, 0], [dilation as i32, 1])?;
            if self.device.is_none_or(|dev| dev.supports_op(y)) {
                let [t_out, _, _, _] = y.ne();
                return c.reshape(y, &[t_out, c_out]);
            }
        }
        c.conv_1d_time_first(kernel, x, stride as i32, pad as i32, dilation as i32)
    }

    /// Transposed 1-D convolution, no padding, dilation 1: kernel `[K, Cout,
    /// Cin]`, input `[T, Cin]` → `[(T−1)·stride + K, Cout]`. The backend's
    /// `CONV_TRANSPOSE_1D`, or: one product gives every tap's contribution
    /// `Z[k, co, t]`, and the kernel, cut into `m = ⌈K/stride⌉` blocks of
    /// `stride` taps, adds block j shifted by j frames.
    pub fn conv_transpose_1d(&self, kernel: Tensor<'c>, x: Tensor<'c>, stride: usize) -> Result<Tensor<'c>> {
        let c = self.ctx;
        if self.policy.native_conv_transpose_1d {
            return c.conv_transpose_1d(kernel, x, stride as i32, 0, 1);
        }
        let [k, c_out, c_in, _] = kernel.ne();
        let t = x.ne()[0];
        let s = stride as i64;
        let m = (k + s - 1) / s;
        // [Cin, K·Cout] (Cin fastest) times [Cin, T] → Z [K·Cout, T].
        let w = c.reshape(c.cont(c.permute(kernel, [1, 2, 0, 3])?)?, &[c_in, k * c_out])?;
        let xt = c.cont(c.transpose(x)?)?;
        let z = c.reshape(c.mul_mat(w, xt)?, &[k, c_out, t])?;
        let z = if m * s > k { c.pad_ext(z, [[0, (m * s - k) as i32], [0, 0], [0, 0], [0, 0]])? } else { z };
        let z = c.cont(z)?; // [m·s, Cout, T]
        let esz = z.nb()[0];
        let mut sum: Option<Tensor<'c>> = None;
        for j in 0..m {
            // Taps j·s .. j·s+s of every frame: [s, Cout, T] → [s, T, Cout], shifted j frames.
            let block = c.view(z, &[s, c_out, t], &[z.nb()[1], z.nb()[2]], (j * s) as usize * esz)?;
            let block = c.permute(block, [0, 2, 1, 3])?;
            let block = c.pad_ext(block, [[0, 0], [j as i32, (m - 1 - j) as i32], [0, 0], [0, 0]])?;
            sum = Some(match sum {
                None => block,
                Some(acc) => c.add(acc, block)?,
            });
        }
        let sum = c.cont(sum.expect("a kernel has at least one tap"))?; // [s, T+m−1, Cout]
        let frames = s * (t + m - 1);
        let flat = c.reshape(sum, &[frames, c_out])?;
        let out_len = (t - 1) * s + k;
        c.cont(c.view(flat, &[out_len, c_out], &[flat.nb()[1]], 0)?)
    }

    /// Whether fused attention may run on `k` without a mask here. ggml's GPU
    /// kernels read K/V in whole tiles past the last row when no mask bounds
    /// them (lavapipe segfaulted on Supertonic's long text), so an unmasked
    /// fused node runs only on the CPU or where the K/V length fills whole
    /// 256-row tiles; elsewhere the node gets an all-zero mask.
    fn unmasked_fused_attention_safe(&self, k: Tensor<'c>) -> bool {
        const KV_TILE: i64 = 256;
        k.ne()[1] % KV_TILE == 0 || self.device.is_none_or(|dev| dev.kind() == ggml_sys::DeviceKind::Cpu)
    }

    /// Whether a mask keeps this device's fused attention from reading K/V
    /// rows past the end: ggml-cuda's kernels stop at the mask's bounds, and
    /// ggml-vulkan's clamp the reads of a K/V length that is not a whole
    /// number of tiles. (lavapipe faulted on Supertonic's tiny v3 with a zero
    /// mask before Vulkan patch 0004 fixed its stale descriptors, not since.)
    /// Other GPUs keep the explicit path for unmasked attention.
    fn zero_mask_bounds_reads(&self) -> bool {
        self.device.and_then(|d| d.registry()).is_some_and(|r| r.name().eq_ignore_ascii_case("cuda") || r.name().eq_ignore_ascii_case("vulkan"))
    }

    /// An F16 mask `[n_kv, n_q]` of zeros, its rows padded to whole
    /// `MASK_ROW_TILE`s because GPU kernels read the mask in query tiles
    /// (filled on the device: nothing to upload).
    fn zero_mask(&self, n_kv: i64, n_q: i64) -> Result<Tensor<'c>> {
        const MASK_ROW_TILE: i64 = 64;
        let n_q = (n_q + MASK_ROW_TILE - 1) / MASK_ROW_TILE * MASK_ROW_TILE;
        if let Some((_, m)) = self.zero_masks.borrow().iter().find(|(shape, _)| *shape == [n_kv, n_q]) {
            return Ok(*m);
        }
        let c = self.ctx;
        let mask = c.cast(c.fill(c.new_tensor(ggml_sys::TYPE_F32, &[n_kv, n_q])?, 0.0)?, ggml_sys::TYPE_F16)?;
        self.zero_masks.borrow_mut().push(([n_kv, n_q], mask));
        Ok(mask)
    }

    /// Multi-head attention `softmax(scale·kᵀq + mask) v` with q `[D, Tq, H, B]`,
    /// k and v `[D, Tk, H, B]` (views allowed) → `[D·H, Tq, B]`. Fused where
    /// the policy allows and the device runs the node, else explicit.
    pub fn attention(&self, q: Tensor<'c>, k: Tensor<'c>, v: Tensor<'c>, mask: Option<Tensor<'c>>, scale: f32) -> Result<Tensor<'c>> {
        let c = self.ctx;
        let [d, tq, h, b] = q.ne();
        // The mask the fused node takes, or None where it may not run here.
        let fused_mask = match mask {
            _ if !self.policy.fused_attention => None,
            None if !self.unmasked_fused_attention_safe(k) => self.zero_mask_bounds_reads().then(|| self.zero_mask(k.ne()[1], tq)).transpose()?.map(Some),
            m => Some(m),
        };
        if let Some(mask) = fused_mask {
            let fused = c.flash_attn_ext(q, k, v, mask, scale)?; // [D, H, Tq, B]
            if self.device.is_none_or(|dev| dev.supports_op(fused)) {
                return c.reshape(fused, &[d * h, tq, b]);
            }
        }
        let cont = |t: Tensor<'c>| if t.is_contiguous() { Ok(t) } else { c.cont(t) };
        let scores = c.mul_mat(cont(k)?, cont(q)?)?; // [Tk, Tq, H, B]
        let probs = c.soft_max_ext(scores, mask, scale)?;
        let v_t = c.cont(c.permute(v, [1, 0, 2, 3])?)?; // [Tk, D, H, B]
        let o = c.mul_mat(v_t, probs)?; // [D, Tq, H, B]
        c.reshape(c.cont(c.permute(o, [0, 2, 1, 3])?)?, &[d * h, tq, b])
    }
}

/// Builds and allocates one stage graph through a [`Builder`] on `backend`'s
/// device, refusing a node a deny rule forbids (`what` names the stage in the
/// error) or the device cannot run. With the `pinned_host` policy, inputs and
/// outputs travel through the device's pinned host memory.
pub fn compute_graph<F>(backend: &Backend, weights: &Weights, policy: &OpPolicy, max_nodes: usize, what: &str, build: F) -> super::Result<ComputeGraph>
where
    F: for<'c> FnOnce(Builder<'c, '_>) -> Result<GraphIo<'c>>,
{
    let device = backend.device();
    let mut graph = ComputeGraph::build(backend, max_nodes, |ctx| build(Builder::new(ctx, weights, policy, device)))?;
    policy.check_graph(&graph.graph(), what)?;
    if let Some(pinned) = device.filter(|_| policy.pinned_host).and_then(|d| d.host_buffer_type()) {
        graph.stage_in(pinned)?;
    }
    Ok(graph)
}

/// The bytes of intermediates [`compute_graph`] would allocate for the same
/// stage graph in buffers of `buft`, measured without allocating or running
/// it; the weights (loaded or [`Weights::for_measuring`]) are not counted.
/// `device` is the device the graph would run on: the builder's choices
/// between fused and composed ops depend on it, and so does the size.
pub fn measure_graph<F>(
    buft: ggml_sys::BufferType,
    device: Option<Device>,
    weights: &Weights,
    policy: &OpPolicy,
    max_nodes: usize,
    build: F,
) -> super::Result<usize>
where
    F: for<'c> FnOnce(Builder<'c, '_>) -> Result<GraphIo<'c>>,
{
    Ok(ComputeGraph::measure(buft, max_nodes, |ctx| build(Builder::new(ctx, weights, policy, device)))?)
}
