//! The tensor table of a model family: every tensor name a family's graphs
//! use, with the shape its hparams imply and the storage types its ops accept
//! (one table per family, like llama.cpp's `llama-arch.cpp`). Checked against
//! a file before any weight is read, so a swapped dimension or an unexpected
//! type is a one-line error, never a `GGML_ASSERT` inside a graph.

use super::error::Result;
use ggml_sys::gguf::GgufTensors;
use ggml_sys::Type;
use indexmap::IndexMap;

/// Storage types a tensor may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// F32 only: norms, biases, convolution taps, embeddings read by row, tables read on the host.
    F32,
    /// The first operand of a matrix product: F32, F16, BF16, Q8_0 or Q4_0.
    Matrix,
    /// A convolution kernel applied as one product after im2col: F32, F16 or
    /// BF16 (block types would cut across its taps).
    Kernel,
    /// I32 values (token lists).
    I32,
    /// An index table: I16 or I32.
    Index,
}

impl Storage {
    fn allows(self, t: Type) -> bool {
        use ggml_sys::{TYPE_BF16, TYPE_F16, TYPE_F32, TYPE_I32, TYPE_Q4_0, TYPE_Q8_0};
        match self {
            Storage::F32 => t == TYPE_F32,
            Storage::Matrix => [TYPE_F32, TYPE_F16, TYPE_BF16, TYPE_Q8_0, TYPE_Q4_0].contains(&t),
            Storage::Kernel => [TYPE_F32, TYPE_F16, TYPE_BF16].contains(&t),
            Storage::I32 => t == TYPE_I32,
            Storage::Index => t == TYPE_I32 || t == ggml_sys::sys::GGML_TYPE_I16,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Storage::F32 => "f32",
            Storage::Matrix => "f32, f16, bf16, q8_0 or q4_0",
            Storage::Kernel => "f32, f16 or bf16",
            Storage::I32 => "i32",
            Storage::Index => "i16 or i32",
        }
    }
}

/// One dimension of an expected shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dim {
    /// Implied by the hparams.
    Is(usize),
    /// A size the metadata does not carry (a vocabulary, a prompt length): the
    /// first tensor that has it binds it, every other must agree, and it must
    /// lie in the range declared with [`TensorTable::free_dim`].
    Free(&'static str),
}

impl From<usize> for Dim {
    fn from(n: usize) -> Self {
        Dim::Is(n)
    }
}

#[derive(Debug, Clone)]
struct Spec {
    /// ggml order (fastest first); trailing dimensions are 1.
    shape: Vec<Dim>,
    storage: Storage,
}

/// Expected tensors of one model file.
#[derive(Debug, Clone, Default)]
pub struct TensorTable {
    specs: IndexMap<String, Spec>,
    free: IndexMap<&'static str, std::ops::RangeInclusive<usize>>,
    /// Prefixes of tensors the file carries for stages this plugin does not run
    /// yet (their shapes are not checked, and no graph may use them).
    carried: Vec<String>,
    /// Values of the free dimensions, once [`check`](Self::check) bound them.
    bound: IndexMap<&'static str, usize>,
    /// Whether [`check`](Self::check) passed.
    checked: bool,
    /// Matrices kept side by side in one tensor at load ([`stack`](Self::stack)).
    stacks: IndexMap<String, Vec<String>>,
}

impl TensorTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares a free dimension and its valid range.
    pub fn free_dim(&mut self, name: &'static str, range: std::ops::RangeInclusive<usize>) -> &mut Self {
        self.free.insert(name, range);
        self
    }

    /// The value a free dimension took in the checked file.
    pub fn dim(&self, name: &str) -> Option<usize> {
        self.bound.get(name).copied()
    }

    pub fn add_dims(&mut self, name: impl Into<String>, shape: &[Dim], storage: Storage) -> &mut Self {
        self.specs.insert(name.into(), Spec { shape: shape.to_vec(), storage });
        self
    }

    pub fn add(&mut self, name: impl Into<String>, shape: &[usize], storage: Storage) -> &mut Self {
        let dims: Vec<Dim> = shape.iter().map(|&d| Dim::Is(d)).collect();
        self.add_dims(name, &dims, storage)
    }

    pub fn f32(&mut self, name: impl Into<String>, shape: &[usize]) -> &mut Self {
        self.add(name, shape, Storage::F32)
    }

    pub fn i32(&mut self, name: impl Into<String>, shape: &[usize]) -> &mut Self {
        self.add(name, shape, Storage::I32)
    }

    /// A matrix applied as `W x`: `[inputs, outputs]` in ggml order.
    pub fn matrix(&mut self, name: impl Into<String>, inputs: usize, outputs: usize) -> &mut Self {
        self.add(name, &[inputs, outputs], Storage::Matrix)
    }

    /// `<prefix>.weight` `[inputs, outputs]` and `<prefix>.bias` `[outputs]`.
    pub fn linear(&mut self, prefix: &str, inputs: usize, outputs: usize) -> &mut Self {
        self.matrix(format!("{prefix}.weight"), inputs, outputs).f32(format!("{prefix}.bias"), &[outputs])
    }

    /// `<prefix>.weight` and `<prefix>.bias`, both `[channels]` (an affine norm).
    pub fn norm(&mut self, prefix: &str, channels: usize) -> &mut Self {
        self.f32(format!("{prefix}.weight"), &[channels]).f32(format!("{prefix}.bias"), &[channels])
    }

    /// Tensors under `prefix` are carried by the file but not used.
    pub fn carry(&mut self, prefix: &str) -> &mut Self {
        self.carried.push(prefix.to_string());
        self
    }

    /// Loads the matrices `members` (declared already, each `[inputs, rows]`
    /// with the same inputs) as one tensor `name` of all their rows, in this
    /// order: graphs multiply by `name` once where they would by each member
    /// (Q, K and V over one input). The file keeps its layout; the members
    /// remain weights of their own names (views of the stack).
    pub fn stack(&mut self, name: impl Into<String>, members: &[String]) -> &mut Self {
        self.stacks.insert(name.into(), members.to_vec());
        self
    }

    /// The [`stack`](Self::stack)s declared, as (name, members).
    pub fn stacks(&self) -> Vec<(String, Vec<String>)> {
        self.stacks.iter().map(|(name, members)| (name.clone(), members.clone())).collect()
    }

    /// Whether `name` is a declared [`stack`](Self::stack).
    pub fn is_stack(&self, name: &str) -> bool {
        self.stacks.contains_key(name)
    }

    /// Names of the matrix-product weights (storage [`Storage::Matrix`]).
    pub fn matrices(&self) -> impl Iterator<Item = &str> {
        self.specs.iter().filter(|(_, s)| s.storage == Storage::Matrix).map(|(n, _)| n.as_str())
    }

    pub fn contains(&self, name: &str) -> bool {
        self.specs.contains_key(name)
    }

    /// Every tensor name of the table, in declaration order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.specs.keys().map(String::as_str)
    }

    /// Checks a file: every table entry present with its shape and an allowed
    /// type, no tensor the table does not know, free dimensions bound
    /// consistently and within range (read them with [`dim`](Self::dim)).
    pub fn check(&mut self, gguf: &GgufTensors) -> Result<()> {
        let path = gguf.file.path().display().to_string();
        let mut bound: IndexMap<&'static str, usize> = IndexMap::new();
        for (name, spec) in &self.specs {
            let t = gguf.ctx.get_tensor(name).ok_or_else(|| format!("{path}: tensor '{name}' is missing"))?;
            if !spec.storage.allows(t.ty()) {
                return Err(format!("{path}: tensor '{name}' is {}, expected {}", ggml_sys::type_name(t.ty()), spec.storage.describe()).into());
            }
            let ne = t.ne();
            let mismatch = |bound: &IndexMap<&'static str, usize>| {
                format!("{path}: tensor '{name}' has shape {}, the metadata implies {}", show_shape(&ne), show_dims(&spec.shape, bound))
            };
            if spec.shape.len() > 4 || ne[spec.shape.len()..].iter().any(|&d| d != 1) {
                return Err(mismatch(&bound).into());
            }
            for (i, dim) in spec.shape.iter().enumerate() {
                match *dim {
                    Dim::Is(n) if ne[i] != n as i64 => return Err(mismatch(&bound).into()),
                    Dim::Is(_) => {}
                    Dim::Free(free) => match bound.get(free) {
                        Some(&n) if ne[i] != n as i64 => return Err(mismatch(&bound).into()),
                        Some(_) => {}
                        None => {
                            let range = self.free.get(free).cloned().unwrap_or(1..=65536);
                            if !range.contains(&(ne[i] as usize)) || ne[i] < 0 {
                                return Err(format!("{path}: tensor '{name}' gives {free} = {} (allowed: {}..={})", ne[i], range.start(), range.end()).into());
                            }
                            bound.insert(free, ne[i] as usize);
                        }
                    },
                }
            }
        }
        for (name, members) in &self.stacks {
            if let Some(m) = members.iter().find(|m| self.specs.get(*m).is_none_or(|s| s.storage != Storage::Matrix)) {
                return Err(format!("stack '{name}': '{m}' is not a matrix of the table (a bug in the plugin)").into());
            }
        }
        for t in gguf.ctx.tensors() {
            let name = t.name();
            if !self.specs.contains_key(&name) && !self.carried.iter().any(|p| name.starts_with(p.as_str())) {
                return Err(format!("{path}: unexpected tensor '{name}' (not part of this model's layout; docs/gguf.md)").into());
            }
        }
        self.bound = bound;
        self.checked = true;
        Ok(())
    }

    /// Whether [`check`](Self::check) passed (on the file it is loaded with).
    pub fn is_checked(&self) -> bool {
        self.checked
    }

    /// Keeps only the tensors `keep` accepts: a model loaded for part of its
    /// work ([`super::Weights::load_part`]) after the whole file was checked.
    /// Free dimensions stay bound as the whole file bound them. Returns how
    /// many were dropped.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) -> usize {
        let before = self.specs.len();
        self.specs.retain(|name, _| keep(name));
        let specs = &self.specs;
        self.stacks.retain(|_, members| members.iter().all(|m| specs.contains_key(m)));
        before - self.specs.len()
    }
}

/// `[a, b]` without trailing ones.
fn show_shape(ne: &[i64]) -> String {
    let n = ne.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1);
    format!("[{}]", ne[..n].iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "))
}

/// An expected shape, free dimensions by value where bound, else by name.
fn show_dims(dims: &[Dim], bound: &IndexMap<&'static str, usize>) -> String {
    let shown: Vec<String> = dims
        .iter()
        .map(|d| match d {
            Dim::Is(n) => n.to_string(),
            Dim::Free(f) => bound.get(f).map_or(f.to_string(), |n| n.to_string()),
        })
        .collect();
    format!("[{}]", shown.join(", "))
}

#[cfg(test)]
mod tests {
    use super::Storage;
    use ggml_sys::{TYPE_BF16, TYPE_F16, TYPE_F32, TYPE_Q4_0, TYPE_Q8_0};

    #[test]
    fn kernels_take_float_types_only() {
        for t in [TYPE_F32, TYPE_F16, TYPE_BF16] {
            assert!(Storage::Kernel.allows(t) && Storage::Matrix.allows(t));
        }
        for t in [TYPE_Q8_0, TYPE_Q4_0] {
            assert!(!Storage::Kernel.allows(t), "a block type cuts across a kernel's taps");
            assert!(Storage::Matrix.allows(t));
        }
        assert!(!Storage::F32.allows(TYPE_BF16));
    }
}
