//! Graph-building operations on [`Context`]. Each returns a new tensor node; the
//! arguments follow ggml's own conventions (dimensions in ggml order, ne0 fastest).

use crate::context::{Context, Tensor};
use crate::{sys, Result, Type};

macro_rules! unary {
    ($($(#[$doc:meta])* $name:ident => $f:ident;)*) => {$(
        $(#[$doc])*
        pub fn $name<'a>(&'a self, a: Tensor<'a>) -> Result<Tensor<'a>> {
            self.wrap(unsafe { sys::$f(self.as_ptr(), a.as_ptr()) })
        }
    )*};
}

macro_rules! binary {
    ($($(#[$doc:meta])* $name:ident => $f:ident;)*) => {$(
        $(#[$doc])*
        pub fn $name<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Result<Tensor<'a>> {
            self.wrap(unsafe { sys::$f(self.as_ptr(), a.as_ptr(), b.as_ptr()) })
        }
    )*};
}

impl Context {
    unary! {
        cos => ggml_cos;
        exp => ggml_exp;
        log => ggml_log;
        neg => ggml_neg;
        relu => ggml_relu;
        tanh => ggml_tanh;
        sigmoid => ggml_sigmoid;
        /// The mean of each row (ne0), as `[1, ne1, ne2, ne3]`.
        mean => ggml_mean;
        /// The sum of each row (ne0), as `[1, ne1, ne2, ne3]`.
        sum_rows => ggml_sum_rows;
        sqrt => ggml_sqrt;
        softplus => ggml_softplus;
        /// x·sigmoid(x) (Swish).
        silu => ggml_silu;
        sqr => ggml_sqr;
        abs => ggml_abs;
        /// x for x > 0, exp(x) − 1 otherwise.
        elu => ggml_elu;
        /// GELU with the exact erf form (PyTorch's default).
        gelu_erf => ggml_gelu_erf;
        /// GELU, tanh form. The CPU backend reads it from an F16 table.
        gelu => ggml_gelu;
        cont => ggml_cont;
        transpose => ggml_transpose;
    }

    binary! {
        /// `a + b`, `b` broadcast (repeated) to the shape of `a`.
        add => ggml_add;
        sub => ggml_sub;
        mul => ggml_mul;
        div => ggml_div;
        /// `b` repeated to the shape of `a`.
        repeat => ggml_repeat;
        /// Rows of `a` (ne1 index) selected by the I32 indices in `b`.
        get_rows => ggml_get_rows;
    }

    /// `a` tiled to shape `ne` (each dimension a multiple of `a`'s).
    pub fn repeat_to<'a>(&'a self, a: Tensor<'a>, ne: [i64; 4]) -> Result<Tensor<'a>> {
        self.wrap(unsafe { sys::ggml_repeat_4d(self.as_ptr(), a.as_ptr(), ne[0], ne[1], ne[2], ne[3]) })
    }

    /// `a * s + b` with scalars.
    pub fn scale_bias<'a>(&'a self, a: Tensor<'a>, s: f32, b: f32) -> Result<Tensor<'a>> {
        self.wrap(unsafe { sys::ggml_scale_bias(self.as_ptr(), a.as_ptr(), s, b) })
    }

    /// Normalises along ne0 to zero mean and unit variance (no affine).
    pub fn norm<'a>(&'a self, a: Tensor<'a>, eps: f32) -> Result<Tensor<'a>> {
        self.wrap(unsafe { sys::ggml_norm(self.as_ptr(), a.as_ptr(), eps) })
    }

    /// Normalises along ne0 to unit root mean square (no affine).
    pub fn rms_norm<'a>(&'a self, a: Tensor<'a>, eps: f32) -> Result<Tensor<'a>> {
        self.wrap(unsafe { sys::ggml_rms_norm(self.as_ptr(), a.as_ptr(), eps) })
    }

    /// `silu(gate) * up` where ne0 of `a` is `[gate | up]` (half the width out).
    pub fn swiglu<'a>(&'a self, a: Tensor<'a>) -> Result<Tensor<'a>> {
        self.wrap(unsafe { sys::ggml_swiglu(self.as_ptr(), a.as_ptr()) })
    }

    /// Rotary position embedding, NEOX layout (the two halves of each head
    /// rotate together, as Hugging Face's `rotate_half`), over `a` `[head_dim,
    /// heads, tokens, ...]` at the I32 `positions` `[tokens]`. The angle of pair
    /// `i` is `position · base^(-2i/head_dim) / freq_factors[i]`.
    pub fn rope_neox<'a>(&'a self, a: Tensor<'a>, positions: Tensor<'a>, freq_factors: Option<Tensor<'a>>, base: f32) -> Result<Tensor<'a>> {
        self.rope_neox_impl(a, positions, freq_factors, base, false)
    }

    /// [`rope_neox`](Self::rope_neox) written over `a` itself: the result is
    /// a view of `a`'s memory, so the rotated heads stay where `a` lies (in a
    /// wider tensor, next to what was not rotated). `a` may be a strided view.
    pub fn rope_neox_inplace<'a>(&'a self, a: Tensor<'a>, positions: Tensor<'a>, freq_factors: Option<Tensor<'a>>, base: f32) -> Result<Tensor<'a>> {
        self.rope_neox_impl(a, positions, freq_factors, base, true)
    }

    fn rope_neox_impl<'a>(&'a self, a: Tensor<'a>, positions: Tensor<'a>, freq_factors: Option<Tensor<'a>>, base: f32, inplace: bool) -> Result<Tensor<'a>> {
        const GGML_ROPE_TYPE_NEOX: i32 = 2;
        let ff = freq_factors.map_or(std::ptr::null_mut(), |t| t.as_ptr());
        let n_dims = a.ne()[0] as i32;
        let rope = if inplace { sys::ggml_rope_ext_inplace } else { sys::ggml_rope_ext };
        self.wrap(unsafe { rope(self.as_ptr(), a.as_ptr(), positions.as_ptr(), ff, n_dims, GGML_ROPE_TYPE_NEOX, 0, base, 1.0, 0.0, 1.0, 0.0, 0.0) })
    }

    /// `softmax(a * scale + mask)` along ne0.
    pub fn soft_max_ext<'a>(&'a self, a: Tensor<'a>, mask: Option<Tensor<'a>>, scale: f32) -> Result<Tensor<'a>> {
        let m = mask.map_or(std::ptr::null_mut(), |m| m.as_ptr());
        self.wrap(unsafe { sys::ggml_soft_max_ext(self.as_ptr(), a.as_ptr(), m, scale, 0.0) })
    }

    /// Concatenation along dimension `dim`.
    pub fn concat<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>, dim: i32) -> Result<Tensor<'a>> {
        self.wrap(unsafe { sys::ggml_concat(self.as_ptr(), a.as_ptr(), b.as_ptr(), dim) })
    }

    /// Zero padding, `[left, right]` per dimension.
    pub fn pad_ext<'a>(&'a self, a: Tensor<'a>, pads: [[i32; 2]; 4]) -> Result<Tensor<'a>> {
        let [p0, p1, p2, p3] = pads;
        self.wrap(unsafe { sys::ggml_pad_ext(self.as_ptr(), a.as_ptr(), p0[0], p0[1], p1[0], p1[1], p2[0], p2[1], p3[0], p3[1]) })
    }

    pub fn permute<'a>(&'a self, a: Tensor<'a>, axes: [i32; 4]) -> Result<Tensor<'a>> {
        self.wrap(unsafe { sys::ggml_permute(self.as_ptr(), a.as_ptr(), axes[0], axes[1], axes[2], axes[3]) })
    }

    /// Same data, new shape (1 to 4 dimensions); `a` must be contiguous.
    pub fn reshape<'a>(&'a self, a: Tensor<'a>, ne: &[i64]) -> Result<Tensor<'a>> {
        let (c, p) = (self.as_ptr(), a.as_ptr());
        let t = unsafe {
            match *ne {
                [n0] => sys::ggml_reshape_1d(c, p, n0),
                [n0, n1] => sys::ggml_reshape_2d(c, p, n0, n1),
                [n0, n1, n2] => sys::ggml_reshape_3d(c, p, n0, n1, n2),
                [n0, n1, n2, n3] => sys::ggml_reshape_4d(c, p, n0, n1, n2, n3),
                _ => return crate::err(format!("reshape to rank {} not in 1..=4", ne.len())),
            }
        };
        self.wrap(t)
    }

    /// A view with shape `ne`, byte strides `nb` (nb1.., one fewer than `ne`) and
    /// a byte offset into `a`.
    pub fn view<'a>(&'a self, a: Tensor<'a>, ne: &[i64], nb: &[usize], offset: usize) -> Result<Tensor<'a>> {
        let (c, p) = (self.as_ptr(), a.as_ptr());
        let t = unsafe {
            match (ne, nb) {
                ([n0], []) => sys::ggml_view_1d(c, p, *n0, offset),
                ([n0, n1], [b1]) => sys::ggml_view_2d(c, p, *n0, *n1, *b1, offset),
                ([n0, n1, n2], [b1, b2]) => sys::ggml_view_3d(c, p, *n0, *n1, *n2, *b1, *b2, offset),
                ([n0, n1, n2, n3], [b1, b2, b3]) => sys::ggml_view_4d(c, p, *n0, *n1, *n2, *n3, *b1, *b2, *b3, offset),
                _ => return crate::err(format!("view of rank {} with {} strides", ne.len(), nb.len())),
            }
        };
        self.wrap(t)
    }

    /// Rows of `b` written into `a` at the row indices in `c` (I64 or I32);
    /// returns the updated view of `a`. The index tensor is an input, so one
    /// graph serves every write position (static K/V caches).
    pub fn set_rows<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>, c: Tensor<'a>) -> Result<Tensor<'a>> {
        self.wrap(unsafe { sys::ggml_set_rows(self.as_ptr(), a.as_ptr(), b.as_ptr(), c.as_ptr()) })
    }

    /// Bytes of one row of `ne0` elements of type `ty` (block types included).
    pub fn row_size(ty: Type, ne0: i64) -> usize {
        unsafe { sys::ggml_row_size(ty, ne0) }
    }

    /// 1-D convolution of channels-first data: `x` `[C_in, T, B]`, kernel in
    /// PyTorch's layout (`[k, C_in, C_out]` in ggml order), no implicit padding
    /// (pad `x` first). Returns `[C_out, T_out, B]`, every item's patches in
    /// one product. The patches are gathered in F32 (`ggml_conv_1d` gathers
    /// them in F16, which costs ~1e-3 precision).
    pub fn conv_1d<'a>(&'a self, kernel: Tensor<'a>, x: Tensor<'a>, stride: i32, dilation: i32) -> Result<Tensor<'a>> {
        let [k, cin, cout, _] = kernel.ne();
        let batch = x.ne()[2];
        let time_first = self.cont(self.transpose(x)?)?; // [T, C_in, B]
        let patches = self
            .wrap(unsafe { sys::ggml_im2col(self.as_ptr(), kernel.as_ptr(), time_first.as_ptr(), stride, 0, 0, 0, dilation, 0, false, sys::GGML_TYPE_F32) })?; // [C_in·k, T_out, B]
        let t_out = patches.ne()[1];
        let patches = self.reshape(patches, &[k * cin, t_out * batch])?;
        let y = self.mul_mat(self.reshape(kernel, &[k * cin, cout])?, patches)?;
        if batch == 1 {
            return Ok(y);
        }
        self.reshape(y, &[cout, t_out, batch])
    }

    /// 1-D convolution of time-first data: `x` `[T, C_in]`, kernel in PyTorch's
    /// layout (`[k, C_in, C_out]` in ggml order), symmetric zero padding `pad`.
    /// Returns `[T_out, C_out]`; patches gathered in F32.
    pub fn conv_1d_time_first<'a>(&'a self, kernel: Tensor<'a>, x: Tensor<'a>, stride: i32, pad: i32, dilation: i32) -> Result<Tensor<'a>> {
        let [k, cin, cout, _] = kernel.ne();
        let patches =
            self.wrap(unsafe { sys::ggml_im2col(self.as_ptr(), kernel.as_ptr(), x.as_ptr(), stride, 0, pad, 0, dilation, 0, false, sys::GGML_TYPE_F32) })?; // [C_in·k, T_out]
        let t_out = patches.ne()[1];
        let patches = self.reshape(patches, &[k * cin, t_out])?;
        self.mul_mat(patches, self.reshape(kernel, &[k * cin, cout])?)
    }

    /// 2-D convolution of an image `x` `[W, H, C_in]` (W fastest), kernel in
    /// PyTorch's layout (`[kw, kh, C_in, C_out]` in ggml order), strides and
    /// symmetric zero padding per axis (W, H). Returns `[W_out, H_out, C_out]`;
    /// patches gathered in F32.
    pub fn conv_2d<'a>(&'a self, kernel: Tensor<'a>, x: Tensor<'a>, stride: [i32; 2], pad: [i32; 2]) -> Result<Tensor<'a>> {
        let [kw, kh, cin, cout] = kernel.ne();
        let patches = self.wrap(unsafe {
            sys::ggml_im2col(self.as_ptr(), kernel.as_ptr(), x.as_ptr(), stride[0], stride[1], pad[0], pad[1], 1, 1, true, sys::GGML_TYPE_F32)
        })?; // [C_in·kh·kw, W_out, H_out]
        let [k, w_out, h_out, _] = patches.ne();
        let y = self.mul_mat(self.reshape(patches, &[k, w_out * h_out])?, self.reshape(kernel, &[kw * kh * cin, cout])?)?;
        self.reshape(y, &[w_out, h_out, cout])
    }

    /// [`Context::conv_2d`] as one `CONV_2D` node, with dilation per axis:
    /// no patch matrix in memory where the backend runs the op directly.
    /// Images and outputs may carry a batch in ne3.
    pub fn conv_2d_direct<'a>(&'a self, kernel: Tensor<'a>, x: Tensor<'a>, stride: [i32; 2], pad: [i32; 2], dilation: [i32; 2]) -> Result<Tensor<'a>> {
        let (c, k, p) = (self.as_ptr(), kernel.as_ptr(), x.as_ptr());
        self.wrap(unsafe { sys::ggml_conv_2d_direct(c, k, p, stride[0], stride[1], pad[0], pad[1], dilation[0], dilation[1]) })
    }

    /// Reflection padding of ne0 (`left`, `right` < ne0).
    pub fn pad_reflect_1d<'a>(&'a self, a: Tensor<'a>, left: i32, right: i32) -> Result<Tensor<'a>> {
        self.wrap(unsafe { sys::ggml_pad_reflect_1d(self.as_ptr(), a.as_ptr(), left, right) })
    }
}
