//! The converter's view of one ONNX graph's weights, and the output tensors
//! made from them.
//!
//! [`Weights`] names every initializer as the official module it belongs to
//! (tools/supertonic/convert.py's `canonical_weights`): anonymous
//! `onnx::MatMul_<n>`, `onnx::Conv_<n>` and `onnx::PRelu_<n>` initializers are
//! named by graph structure, never by their numbers, which change between
//! exports. [`Lazy`] is an output tensor as a recipe: its shape is known at
//! once (metadata and the GGUF header need it), its values are read from the
//! memory-mapped graph and transformed only when the writer reaches it.

use engine_core::model_kit::convert::numpy_sum_f64;
use engine_core::model_kit::convert::onnx::OnnxGraph;
use engine_core::model_kit::{Error, Result};
use indexmap::IndexMap;
use ndarray::{ArrayD, Axis, IxDyn};

/// One axis operation of numpy's, applied in order to an initializer's values.
#[derive(Clone, Debug)]
pub enum Op {
    /// `.T`: every axis reversed.
    ReverseAxes,
    /// `x[(:,)*axis i]`: one index along `axis`, which disappears.
    Index(usize, usize),
    /// `.transpose(order)`.
    Permute(Vec<usize>),
    /// `.reshape(dims)` (row-major).
    Reshape(Vec<usize>),
}

/// An output tensor, made when written.
#[derive(Clone)]
pub enum Lazy<'g> {
    /// An initializer of `graph` with axis operations applied.
    Initializer { graph: &'g OnnxGraph, name: String, ops: Vec<Op>, shape: Vec<usize> },
    /// `tanh(P Wᵀ + b)`, the style keys of an attention whose keys do not depend on the input.
    TanhKeys { prototype: Box<Lazy<'g>>, weight: Box<Lazy<'g>>, bias: Box<Lazy<'g>>, shape: Vec<usize> },
    /// Values already in memory (voices).
    Ready(ArrayD<f32>),
}

impl<'g> Lazy<'g> {
    pub fn shape(&self) -> &[usize] {
        match self {
            Lazy::Initializer { shape, .. } | Lazy::TanhKeys { shape, .. } => shape,
            Lazy::Ready(a) => a.shape(),
        }
    }

    pub fn ndim(&self) -> usize {
        self.shape().len()
    }

    pub fn len(&self) -> usize {
        self.shape().iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where it comes from, for errors: "text_encoder.onnx: tensor onnx::MatMul_12".
    fn origin(&self) -> String {
        match self {
            Lazy::Initializer { graph, name, .. } => format!("{}: tensor {name}", graph.path().display()),
            Lazy::TanhKeys { weight, .. } => format!("{} (style keys)", weight.origin()),
            Lazy::Ready(_) => "a computed tensor".to_string(),
        }
    }

    fn shape_error(&self, what: &str) -> Error {
        Error::msg(format!("{} has shape {:?}; {what}", self.origin(), self.shape()))
    }

    fn push(self, op: Op, shape: Vec<usize>) -> Lazy<'g> {
        match self {
            Lazy::Initializer { graph, name, mut ops, .. } => {
                ops.push(op);
                Lazy::Initializer { graph, name, ops, shape }
            }
            // Only initializers are transformed (the converter never
            // reshapes a computed tensor).
            other => other,
        }
    }

    /// `.T`.
    pub fn t(self) -> Lazy<'g> {
        let shape = self.shape().iter().rev().copied().collect();
        self.push(Op::ReverseAxes, shape)
    }

    /// `x[:, …, i]` with `i` at `axis`.
    pub fn index(self, axis: usize, i: usize) -> Result<Lazy<'g>> {
        if axis >= self.ndim() || i >= self.shape()[axis] {
            return Err(self.shape_error(&format!("expected at least {} axes with {} or more entries on axis {axis}", axis + 1, i + 1)));
        }
        let mut shape = self.shape().to_vec();
        shape.remove(axis);
        Ok(self.push(Op::Index(axis, i), shape))
    }

    /// `.transpose(order)` (as many axes as `order`).
    pub fn permute(self, order: &[usize]) -> Result<Lazy<'g>> {
        if self.ndim() != order.len() {
            return Err(self.shape_error(&format!("expected {} axes", order.len())));
        }
        let shape = order.iter().map(|&a| self.shape()[a]).collect();
        Ok(self.push(Op::Permute(order.to_vec()), shape))
    }

    /// `.reshape(dims)`, one of which may be `None` (numpy's -1).
    pub fn reshape(self, dims: &[Option<usize>]) -> Result<Lazy<'g>> {
        let len = self.len();
        let known: usize = dims.iter().flatten().product();
        let free = dims.iter().filter(|d| d.is_none()).count();
        let fits = match free {
            0 => known == len,
            1 => known > 0 && len.is_multiple_of(known),
            _ => false,
        };
        if !fits {
            let shown: Vec<String> = dims.iter().map(|d| d.map_or("-1".to_string(), |d| d.to_string())).collect();
            return Err(self.shape_error(&format!("cannot reshape it to ({})", shown.join(", "))));
        }
        let shape: Vec<usize> = dims.iter().map(|d| d.unwrap_or(len.checked_div(known).unwrap_or(0))).collect();
        Ok(self.push(Op::Reshape(shape.clone()), shape))
    }

    /// `.reshape(-1)`.
    pub fn flatten(self) -> Lazy<'g> {
        let len = self.len();
        self.push(Op::Reshape(vec![len]), vec![len])
    }

    /// `x.reshape(x.shape[-2], x.shape[-1])`.
    pub fn last_two(self) -> Result<Lazy<'g>> {
        let n = self.ndim();
        if n < 2 {
            return Err(self.shape_error("expected at least 2 axes"));
        }
        let (a, b) = (self.shape()[n - 2], self.shape()[n - 1]);
        self.reshape(&[Some(a), Some(b)])
    }

    /// The values, in row-major order of [`Lazy::shape`].
    pub fn values(&self) -> Result<ArrayD<f32>> {
        match self {
            Lazy::Initializer { graph, name, ops, shape } => {
                let tensor = graph.value(name).ok_or_else(|| Error::msg(format!("{}: no tensor {name}", graph.path().display())))?;
                let mut a = tensor.to_f32();
                // Read once: its pages of the file map are not needed any more.
                graph.release(name);
                for op in ops {
                    a = match op {
                        Op::ReverseAxes => a.reversed_axes(),
                        Op::Index(axis, i) => a.index_axis_move(Axis(*axis), *i),
                        Op::Permute(order) => a.permuted_axes(IxDyn(order)),
                        Op::Reshape(dims) => {
                            standard(a).into_shape_with_order(IxDyn(dims)).map_err(|e| Error::msg(format!("{}: reshape to {dims:?}: {e}", self.origin())))?
                        }
                    };
                }
                debug_assert_eq!(a.shape(), shape.as_slice());
                Ok(standard(a))
            }
            Lazy::TanhKeys { prototype, weight, bias, shape } => tanh_keys(&prototype.values()?, &weight.values()?, &bias.values()?, shape),
            Lazy::Ready(a) => Ok(a.clone()),
        }
    }

    /// The style keys `tanh(P Wᵀ + b)`: [tokens, units] from the prototype
    /// (its last two axes are [tokens, dim]), the key projection's weight
    /// ([units, dim]) and bias ([units]).
    pub fn tanh_keys(prototype: Lazy<'g>, weight: Lazy<'g>, bias: Lazy<'g>) -> Result<Lazy<'g>> {
        let prototype = prototype.last_two()?;
        let (tokens, dim) = (prototype.shape()[0], prototype.shape()[1]);
        if weight.ndim() != 2 || weight.shape()[1] != dim {
            return Err(weight.shape_error(&format!("the style key projection must be [units, {dim}]")));
        }
        let units = weight.shape()[0];
        if bias.shape() != [units] {
            return Err(bias.shape_error(&format!("the style key bias must be [{units}]")));
        }
        Ok(Lazy::TanhKeys { prototype: Box::new(prototype), weight: Box::new(weight), bias: Box::new(bias), shape: vec![tokens, units] })
    }
}

/// `a` in row-major order, copied only when it is not already.
fn standard(a: ArrayD<f32>) -> ArrayD<f32> {
    if a.is_standard_layout() {
        a
    } else {
        a.as_standard_layout().into_owned()
    }
}

/// tools/supertonic/convert.py's `tanh_keys`, bit for bit: products in
/// float64, each row summed with numpy's pairwise summation, the bias added,
/// `tanh` in float64, rounded to float32 once.
fn tanh_keys(p: &ArrayD<f32>, w: &ArrayD<f32>, b: &ArrayD<f32>, shape: &[usize]) -> Result<ArrayD<f32>> {
    let (tokens, units) = (shape[0], shape[1]);
    let dim = p.shape()[1];
    let (p, w, b) = (p.as_slice().unwrap_or_default(), w.as_slice().unwrap_or_default(), b.as_slice().unwrap_or_default());
    let mut products = vec![0f64; dim];
    let mut out = Vec::with_capacity(tokens * units);
    for t in 0..tokens {
        let row = &p[t * dim..(t + 1) * dim];
        for u in 0..units {
            let wrow = &w[u * dim..(u + 1) * dim];
            for ((x, &a), &c) in products.iter_mut().zip(row).zip(wrow) {
                *x = a as f64 * c as f64;
            }
            out.push((numpy_sum_f64(&products) + b[u] as f64).tanh() as f32);
        }
    }
    ArrayD::from_shape_vec(IxDyn(shape), out).map_err(|e| Error::msg(format!("style keys: {e}")))
}

/// A graph's float initializers under their official module names, in file
/// order (the order the Python converter's dict iterates them in).
pub struct Weights<'g> {
    pub graph: &'g OnnxGraph,
    /// Official name → (initializer, whether stored transposed: a MatMul
    /// weight is kept in PyTorch's [out, in] layout).
    names: IndexMap<String, (String, bool)>,
}

/// `/decoder/head/act/PRelu` → `<root>.decoder.head.act`.
pub fn module_path(node_name: &str, root: &str) -> String {
    let parts: Vec<&str> = node_name.split('/').filter(|p| !p.is_empty()).collect();
    let parts = &parts[..parts.len().saturating_sub(1)];
    std::iter::once(root).chain(parts.iter().copied()).collect::<Vec<_>>().join(".")
}

impl<'g> Weights<'g> {
    /// Names every initializer of `graph` (`root`: the official module path
    /// of the graph's top module, e.g. `tts.dp`).
    pub fn of(graph: &'g OnnxGraph, root: &str) -> Result<Self> {
        let file = graph.path().display();
        let mut names = IndexMap::new();
        for name in graph.initializer_names() {
            if name.starts_with("onnx::MatMul_") {
                let bias = graph
                    .consumer(name, "MatMul")
                    .and_then(|mm| mm.outputs.first())
                    .and_then(|out| graph.consumer(out, "Add"))
                    .and_then(|add| add.inputs.iter().find(|i| i.ends_with(".bias") && graph.contains_value(i)));
                let Some(bias) = bias else {
                    return Err(Error::msg(format!("{file}: cannot name {name}: its MatMul has no named bias")));
                };
                names.insert(format!("{}weight", &bias[..bias.len() - "bias".len()]), (name.clone(), true));
            } else if name.starts_with("onnx::Conv_") {
                let conv = graph.consumer(name, "Conv").ok_or_else(|| Error::msg(format!("{file}: {name} feeds no Conv")))?;
                let role = match conv.inputs.iter().position(|i| i == name) {
                    Some(1) => "weight",
                    Some(2) => "bias",
                    _ => return Err(Error::msg(format!("{file}: {name} is neither the weight nor the bias of Conv node {}", conv.name))),
                };
                names.insert(format!("{}.{role}", module_path(&conv.name, root)), (name.clone(), false));
            } else if name.starts_with("onnx::PRelu_") {
                let prelu = graph.consumer(name, "PRelu").ok_or_else(|| Error::msg(format!("{file}: {name} feeds no PRelu")))?;
                names.insert(format!("{}.weight", module_path(&prelu.name, root)), (name.clone(), false));
            } else if name.starts_with("onnx::") {
                // Other anonymous initializers (shape and scalar constants a
                // real export may fold) carry no weights; anything the
                // converter needs and cannot find is reported by name.
                continue;
            } else {
                names.insert(name.clone(), (name.clone(), false));
            }
        }
        Ok(Weights { graph, names })
    }

    pub fn contains(&self, key: &str) -> bool {
        self.names.contains_key(key)
    }

    /// Official names in file order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.names.keys().map(|k| k.as_str())
    }

    /// The tensor `key`, or `None`.
    pub fn find(&self, key: &str) -> Option<Lazy<'g>> {
        let (init, transposed) = self.names.get(key)?;
        let dims = self.graph.value(init)?.dims().to_vec();
        let t = Lazy::Initializer { graph: self.graph, name: init.clone(), ops: Vec::new(), shape: dims };
        Some(if *transposed { t.t() } else { t })
    }

    /// The tensor `key`; its absence is an error naming it and the file.
    pub fn get(&self, key: &str) -> Result<Lazy<'g>> {
        self.find(key).ok_or_else(|| Error::msg(format!("{}: missing tensor {key}", self.graph.path().display())))
    }

    /// The shape of `key`.
    pub fn shape(&self, key: &str) -> Result<Vec<usize>> {
        Ok(self.get(key)?.shape().to_vec())
    }

    /// The first key (in file order) that `pred` accepts.
    pub fn first(&self, pred: impl Fn(&str) -> bool) -> Option<String> {
        self.keys().find(|k| pred(k)).map(str::to_string)
    }
}
