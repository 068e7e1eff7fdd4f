//! Contexts, tensors and graphs. Contexts are created with `no_alloc` by default:
//! tensor data lives in backend buffers ([`crate::Buffer`]), the context holds
//! only metadata.

use crate::{err, sys, Result, Type};
use std::ffi::CString;
use std::marker::PhantomData;
use std::ptr::NonNull;

/// An owned ggml context.
pub struct Context {
    ptr: NonNull<sys::ggml_context>,
}

unsafe impl Send for Context {}

impl Context {
    /// A metadata-only context able to hold `max_tensors` tensors plus one graph of
    /// `graph_nodes` nodes.
    pub fn new_no_alloc(max_tensors: usize, graph_nodes: usize) -> Result<Self> {
        let mem = max_tensors * unsafe { sys::ggml_tensor_overhead() } + unsafe { sys::ggml_graph_overhead_custom(graph_nodes, false) };
        let params = sys::ggml_init_params { mem_size: mem, mem_buffer: std::ptr::null_mut(), no_alloc: true };
        NonNull::new(unsafe { sys::ggml_init(params) }).map(|ptr| Context { ptr }).ok_or_else(|| crate::Error::Msg("ggml_init failed".into()))
    }

    pub fn as_ptr(&self) -> *mut sys::ggml_context {
        self.ptr.as_ptr()
    }

    /// A new tensor with dimensions in ggml order (ne0 fastest), 1 to 4 of them.
    pub fn new_tensor(&self, ty: Type, ne: &[i64]) -> Result<Tensor<'_>> {
        let p = unsafe {
            match *ne {
                [a] => sys::ggml_new_tensor_1d(self.as_ptr(), ty, a),
                [a, b] => sys::ggml_new_tensor_2d(self.as_ptr(), ty, a, b),
                [a, b, c] => sys::ggml_new_tensor_3d(self.as_ptr(), ty, a, b, c),
                [a, b, c, d] => sys::ggml_new_tensor_4d(self.as_ptr(), ty, a, b, c, d),
                _ => return err(format!("tensor rank {} not in 1..=4", ne.len())),
            }
        };
        self.wrap(p)
    }

    pub(crate) fn wrap(&self, p: *mut sys::ggml_tensor) -> Result<Tensor<'_>> {
        NonNull::new(p).map(|ptr| Tensor { ptr, _ctx: PhantomData }).ok_or_else(|| crate::Error::Msg("ggml context out of memory".into()))
    }

    pub fn mul_mat<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Result<Tensor<'a>> {
        self.wrap(unsafe { sys::ggml_mul_mat(self.as_ptr(), a.as_ptr(), b.as_ptr()) })
    }

    pub fn leaky_relu<'a>(&'a self, a: Tensor<'a>, slope: f32) -> Result<Tensor<'a>> {
        self.wrap(unsafe { sys::ggml_leaky_relu(self.as_ptr(), a.as_ptr(), slope, false) })
    }

    pub fn conv_transpose_1d<'a>(&'a self, kernel: Tensor<'a>, input: Tensor<'a>, stride: i32, padding: i32, dilation: i32) -> Result<Tensor<'a>> {
        self.wrap(unsafe { sys::ggml_conv_transpose_1d(self.as_ptr(), kernel.as_ptr(), input.as_ptr(), stride, padding, dilation) })
    }

    /// Fused attention: q `[d, n_q, heads]`, k/v `[d, n_kv, heads]`, optional F16 mask
    /// `[n_kv, n_q_padded]`. Result is `[d, heads, n_q]`.
    pub fn flash_attn_ext<'a>(&'a self, q: Tensor<'a>, k: Tensor<'a>, v: Tensor<'a>, mask: Option<Tensor<'a>>, scale: f32) -> Result<Tensor<'a>> {
        let m = mask.map_or(std::ptr::null_mut(), |m| m.as_ptr());
        self.wrap(unsafe { sys::ggml_flash_attn_ext(self.as_ptr(), q.as_ptr(), k.as_ptr(), v.as_ptr(), m, scale, 0.0, 0.0) })
    }

    pub fn sin<'a>(&'a self, a: Tensor<'a>) -> Result<Tensor<'a>> {
        self.wrap(unsafe { sys::ggml_sin(self.as_ptr(), a.as_ptr()) })
    }

    pub fn scale<'a>(&'a self, a: Tensor<'a>, s: f32) -> Result<Tensor<'a>> {
        self.wrap(unsafe { sys::ggml_scale(self.as_ptr(), a.as_ptr(), s) })
    }

    /// Depthwise 2-D convolution: kernel `[KW, KH, 1, C]`, input `[W, H, C, N]`
    /// (or the same shape with channels fastest in memory, which the result
    /// then keeps).
    pub fn conv_2d_dw_direct<'a>(
        &'a self,
        kernel: Tensor<'a>,
        input: Tensor<'a>,
        stride: [i32; 2],
        padding: [i32; 2],
        dilation: [i32; 2],
    ) -> Result<Tensor<'a>> {
        let [kw, kh, one, kc] = kernel.ne();
        let [_, _, c, _] = input.ne();
        if one != 1 || kc != c || kw < 1 || kh < 1 {
            return crate::err(format!("a depthwise kernel [{kw}, {kh}, {one}, {kc}] does not fit {c} channels"));
        }
        self.wrap(unsafe {
            sys::ggml_conv_2d_dw_direct(self.as_ptr(), kernel.as_ptr(), input.as_ptr(), stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1])
        })
    }

    /// A tensor of `a`'s shape and type holding `value` everywhere.
    pub fn fill<'a>(&'a self, a: Tensor<'a>, value: f32) -> Result<Tensor<'a>> {
        self.wrap(unsafe { sys::ggml_fill(self.as_ptr(), a.as_ptr(), value) })
    }

    /// `[start, start + step, …)` below `stop`, F32, computed on the device.
    pub fn arange(&self, start: f32, stop: f32, step: f32) -> Result<Tensor<'_>> {
        self.wrap(unsafe { sys::ggml_arange(self.as_ptr(), start, stop, step) })
    }

    pub fn clamp<'a>(&'a self, a: Tensor<'a>, min: f32, max: f32) -> Result<Tensor<'a>> {
        self.wrap(unsafe { sys::ggml_clamp(self.as_ptr(), a.as_ptr(), min, max) })
    }

    pub fn cast<'a>(&'a self, a: Tensor<'a>, ty: Type) -> Result<Tensor<'a>> {
        self.wrap(unsafe { sys::ggml_cast(self.as_ptr(), a.as_ptr(), ty) })
    }

    /// Takes ownership of a context created elsewhere (GGUF loading).
    pub(crate) unsafe fn from_raw(ptr: *mut sys::ggml_context) -> Option<Self> {
        NonNull::new(ptr).map(|ptr| Context { ptr })
    }

    /// A tensor of this context by name.
    pub fn get_tensor(&self, name: &str) -> Option<Tensor<'_>> {
        let c = CString::new(name).ok()?;
        NonNull::new(unsafe { sys::ggml_get_tensor(self.as_ptr(), c.as_ptr()) }).map(|ptr| Tensor { ptr, _ctx: PhantomData })
    }

    /// Every tensor of this context, in creation order.
    pub fn tensors(&self) -> Vec<Tensor<'_>> {
        let mut out = Vec::new();
        let mut p = unsafe { sys::ggml_get_first_tensor(self.as_ptr()) };
        while let Some(ptr) = NonNull::new(p) {
            out.push(Tensor { ptr, _ctx: PhantomData });
            p = unsafe { sys::ggml_get_next_tensor(self.as_ptr(), p) };
        }
        out
    }

    pub fn new_graph(&self, nodes: usize) -> Result<Graph<'_>> {
        NonNull::new(unsafe { sys::ggml_new_graph_custom(self.as_ptr(), nodes, false) })
            .map(|ptr| Graph { ptr, _ctx: PhantomData })
            .ok_or_else(|| crate::Error::Msg("ggml context has no room for the graph".into()))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        unsafe { sys::ggml_free(self.ptr.as_ptr()) }
    }
}

/// A tensor owned by a [`Context`].
#[derive(Clone, Copy)]
pub struct Tensor<'ctx> {
    ptr: NonNull<sys::ggml_tensor>,
    _ctx: PhantomData<&'ctx Context>,
}

impl<'ctx> Tensor<'ctx> {
    pub fn as_ptr(&self) -> *mut sys::ggml_tensor {
        self.ptr.as_ptr()
    }

    /// A tensor pointer bound to `ctx`'s lifetime.
    pub(crate) unsafe fn from_raw(ptr: NonNull<sys::ggml_tensor>, _ctx: &'ctx Context) -> Self {
        Tensor { ptr, _ctx: PhantomData }
    }

    /// A tensor of the graph's context, tied to the graph's lifetime.
    pub(crate) unsafe fn from_raw_unbound(ptr: NonNull<sys::ggml_tensor>) -> Self {
        Tensor { ptr, _ctx: PhantomData }
    }

    /// The same tensor with the lifetime of another context, so that tensors of a
    /// long-lived context (weights) can be used in graphs built in a shorter one.
    /// Safety: the tensor's own context must outlive every use through `_ctx`.
    pub unsafe fn rebind<'b>(self, _ctx: &'b Context) -> Tensor<'b> {
        Tensor { ptr: self.ptr, _ctx: PhantomData }
    }

    fn raw(&self) -> &sys::ggml_tensor {
        unsafe { self.ptr.as_ref() }
    }

    pub fn ne(&self) -> [i64; 4] {
        self.raw().ne
    }

    /// Byte strides per dimension.
    pub fn nb(&self) -> [usize; 4] {
        self.raw().nb
    }

    /// Raw bytes of the tensor, downloaded from its backend buffer.
    pub fn get_bytes(&self) -> Result<Vec<u8>> {
        if self.raw().buffer.is_null() {
            return err(format!("tensor '{}' has no backend buffer", self.name()));
        }
        let mut bytes = vec![0u8; self.n_bytes()];
        unsafe { sys::ggml_backend_tensor_get(self.as_ptr(), bytes.as_mut_ptr().cast(), 0, bytes.len()) };
        Ok(bytes)
    }

    /// Uploads raw bytes (the tensor's own type and layout).
    pub fn set_bytes(&self, bytes: &[u8]) -> Result<()> {
        if bytes.len() != self.n_bytes() {
            return err(format!("tensor '{}' holds {} bytes, got {}", self.name(), self.n_bytes(), bytes.len()));
        }
        if self.raw().buffer.is_null() {
            return err(format!("tensor '{}' has no backend buffer", self.name()));
        }
        unsafe { sys::ggml_backend_tensor_set(self.as_ptr(), bytes.as_ptr().cast(), 0, bytes.len()) };
        Ok(())
    }

    /// Uploads I32 values (widened where the tensor is I64).
    pub(crate) fn set_i32(&self, values: &[i32]) -> Result<()> {
        self.check_i32_upload(values.len())?;
        let mut bytes = vec![0u8; self.n_bytes()];
        unsafe { encode_i32(values, self.ty(), bytes.as_mut_ptr()) };
        self.set_bytes(&bytes)
    }

    /// Checks that `n` I32 values can be uploaded into this tensor: an I32
    /// one, or an I64 one (row indices, which some backends' fused kernels
    /// read only as I64).
    pub(crate) fn check_i32_upload(&self, n: usize) -> Result<()> {
        if self.ty() != sys::GGML_TYPE_I32 && self.ty() != sys::GGML_TYPE_I64 {
            return err(format!("tensor '{}' is not I32 or I64", self.name()));
        }
        if n != self.n_elements() {
            return err(format!("tensor '{}' has {} elements, got {n}", self.name(), self.n_elements()));
        }
        self.check_buffer()
    }

    /// Marks the tensor as a graph input (the allocator keeps it addressable).
    pub fn set_input(self) -> Self {
        unsafe { sys::ggml_set_input(self.as_ptr()) };
        self
    }

    /// Marks the tensor as a graph output (its memory is not reused).
    pub fn set_output(self) -> Self {
        unsafe { sys::ggml_set_output(self.as_ptr()) };
        self
    }

    pub fn ty(&self) -> Type {
        self.raw().type_
    }

    pub fn op(&self) -> sys::ggml_op {
        self.raw().op
    }

    /// The `i`-th source of a node (`None` past the last).
    pub fn src(&self, i: usize) -> Option<Tensor<'ctx>> {
        let p = *self.raw().src.get(i)?;
        NonNull::new(p).map(|ptr| Tensor { ptr, _ctx: PhantomData })
    }

    pub fn is_contiguous(&self) -> bool {
        unsafe { sys::ggml_is_contiguous(self.as_ptr()) }
    }

    pub fn n_elements(&self) -> usize {
        unsafe { sys::ggml_nelements(self.as_ptr()) as usize }
    }

    pub fn n_bytes(&self) -> usize {
        unsafe { sys::ggml_nbytes(self.as_ptr()) }
    }

    pub fn set_name(self, name: &str) -> Self {
        let c = CString::new(name).unwrap_or_default();
        unsafe { sys::ggml_set_name(self.as_ptr(), c.as_ptr()) };
        self
    }

    pub fn name(&self) -> String {
        unsafe { crate::cstr_to_string(sys::ggml_get_name(self.as_ptr())) }
    }

    /// Uploads host values, converting from f32 to the tensor's type (F32, F16, BF16).
    pub fn set_f32(&self, values: &[f32]) -> Result<()> {
        self.check_f32_upload(values.len())?;
        // u32 words: every supported type's element fits their alignment.
        let mut words = vec![0u32; self.n_bytes().div_ceil(4)];
        unsafe {
            encode_f32(values, self.ty(), words.as_mut_ptr().cast())?;
            sys::ggml_backend_tensor_set(self.as_ptr(), words.as_ptr().cast(), 0, self.n_bytes());
        }
        Ok(())
    }

    /// Checks that `n` f32 values can be uploaded into this tensor.
    pub(crate) fn check_f32_upload(&self, n: usize) -> Result<()> {
        if n != self.n_elements() {
            return err(format!("tensor '{}' has {} elements, got {n}", self.name(), self.n_elements()));
        }
        self.check_buffer()?;
        encoded_size(self.ty(), n).map(|_| ())
    }

    /// Whether the tensor has memory (an address of its own or through the
    /// tensor it views).
    pub fn has_memory(&self) -> bool {
        !self.raw().data.is_null()
    }

    pub(crate) fn check_buffer(&self) -> Result<()> {
        if self.raw().buffer.is_null() {
            return err(format!("tensor '{}' has no backend buffer", self.name()));
        }
        Ok(())
    }

    /// Downloads the tensor as f32 (F32, F16, BF16).
    pub fn get_f32(&self) -> Result<Vec<f32>> {
        self.check_buffer()?;
        let mut words = vec![0u32; self.n_bytes().div_ceil(4)];
        unsafe {
            sys::ggml_backend_tensor_get(self.as_ptr(), words.as_mut_ptr().cast(), 0, self.n_bytes());
            decode_f32(words.as_ptr().cast(), self.ty(), self.n_elements())
        }
    }
}

/// Bytes of `n` values of `ty` when encoded from f32; an error for types
/// f32 values cannot be written as.
fn encoded_size(ty: Type, n: usize) -> Result<usize> {
    match ty {
        sys::GGML_TYPE_F32 => Ok(4 * n),
        sys::GGML_TYPE_F16 | sys::GGML_TYPE_BF16 => Ok(2 * n),
        other => err(format!("cannot upload f32 values into a {} tensor", crate::type_name(other))),
    }
}

/// Writes `values` as `ty` at `dst`.
///
/// # Safety
/// `dst` is 4-byte aligned and valid for `encoded_size(ty, values.len())` bytes.
pub(crate) unsafe fn encode_f32(values: &[f32], ty: Type, dst: *mut u8) -> Result<()> {
    let n = values.len();
    match ty {
        sys::GGML_TYPE_F32 => std::ptr::copy_nonoverlapping(values.as_ptr(), dst.cast(), n),
        sys::GGML_TYPE_F16 => sys::ggml_fp32_to_fp16_row(values.as_ptr(), dst.cast(), n as i64),
        sys::GGML_TYPE_BF16 => sys::ggml_fp32_to_bf16_row(values.as_ptr(), dst.cast(), n as i64),
        other => return err(format!("cannot upload f32 values into a {} tensor", crate::type_name(other))),
    }
    Ok(())
}

/// Reads `n` values of `ty` at `src` as f32.
///
/// # Safety
/// `src` is 4-byte aligned and valid for `n` values of `ty`.
pub(crate) unsafe fn decode_f32(src: *const u8, ty: Type, n: usize) -> Result<Vec<f32>> {
    let mut out = vec![0f32; n];
    match ty {
        sys::GGML_TYPE_F32 => std::ptr::copy_nonoverlapping(src.cast::<f32>(), out.as_mut_ptr(), n),
        sys::GGML_TYPE_F16 => sys::ggml_fp16_to_fp32_row(src.cast(), out.as_mut_ptr(), n as i64),
        sys::GGML_TYPE_BF16 => sys::ggml_bf16_to_fp32_row(src.cast(), out.as_mut_ptr(), n as i64),
        other => return err(format!("cannot download a {} tensor as f32", crate::type_name(other))),
    }
    Ok(out)
}

/// A compute graph living in a [`Context`].
pub struct Graph<'ctx> {
    ptr: NonNull<sys::ggml_cgraph>,
    _ctx: PhantomData<&'ctx Context>,
}

impl<'ctx> Graph<'ctx> {
    pub(crate) unsafe fn from_raw(ptr: NonNull<sys::ggml_cgraph>) -> Self {
        Graph { ptr, _ctx: PhantomData }
    }

    pub fn as_ptr(&self) -> *mut sys::ggml_cgraph {
        self.ptr.as_ptr()
    }

    pub fn build_forward(&mut self, output: Tensor<'ctx>) {
        unsafe { sys::ggml_build_forward_expand(self.as_ptr(), output.as_ptr()) }
    }

    pub fn n_nodes(&self) -> usize {
        unsafe { sys::ggml_graph_n_nodes(self.as_ptr()) as usize }
    }

    /// The graph's `i`-th node (`i < n_nodes()`).
    pub fn node(&self, i: usize) -> Option<Tensor<'ctx>> {
        if i >= self.n_nodes() {
            return None;
        }
        let p = NonNull::new(unsafe { sys::ggml_graph_node(self.as_ptr(), i as i32) })?;
        Some(unsafe { Tensor::from_raw_unbound(p) })
    }
}

/// Writes `values` at `dst` as the integer type `ty` (I32, or I64 widened).
///
/// # Safety
/// `dst` must hold `values.len()` elements of `ty`, which
/// [`Tensor::check_i32_upload`] has accepted.
pub(crate) unsafe fn encode_i32(values: &[i32], ty: Type, dst: *mut u8) {
    if ty == sys::GGML_TYPE_I64 {
        for (i, v) in values.iter().enumerate() {
            dst.cast::<i64>().add(i).write_unaligned(i64::from(*v));
        }
    } else {
        std::ptr::copy_nonoverlapping(values.as_ptr(), dst.cast::<i32>(), values.len());
    }
}
