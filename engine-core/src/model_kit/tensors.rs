//! The tensor table of a model family: every tensor name a family's graphs
//! use, with the shape its hparams imply and the storage types its ops accept
//! (one table per family, like llama.cpp's `llama-arch.cpp`). Checked against
//! a file before any weight is read, so a swapped dimension or an unexpected
//! type is a one-line error, never a `GGML_ASSERT` inside a graph.

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
            Storage::I32 => t == TYPE_I32,
            Storage::Index => t == TYPE_I32 || t == ggml_sys::sys::GGML_TYPE_I16,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Storage::F32 => "f32",
            Storage::Matrix => "f32, f16, bf16, q8_0 or q4_0",
            Storage::I32 => "i32",
            Storage::Index => "i16 or i32",
        }
    }
}

#[derive(Debug, Clone)]
struct Spec {
    /// ggml order (fastest first); trailing dimensions are 1.
    shape: Vec<usize>,
    storage: Storage,
}

/// Expected tensors of one model file.
#[derive(Debug, Clone, Default)]
pub struct TensorTable {
    specs: IndexMap<String, Spec>,
    /// Prefixes of tensors the file carries for stages this plugin does not run
    /// yet (their shapes are not checked, and no graph may use them).
    carried: Vec<String>,
}

impl TensorTable {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&mut self, name: impl Into<String>, shape: &[usize], storage: Storage) -> &mut Self {
        self.specs.insert(name.into(), Spec { shape: shape.to_vec(), storage });
        self
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

    pub fn contains(&self, name: &str) -> bool {
        self.specs.contains_key(name)
    }

    pub fn len(&self) -> usize {
        self.specs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    /// Checks a file: every table entry present with its shape and an allowed
    /// type, and no tensor the table does not know.
    pub fn check(&self, gguf: &GgufTensors) -> Result<(), String> {
        let path = gguf.file.path().display();
        for (name, spec) in &self.specs {
            let t = gguf.ctx.get_tensor(name).ok_or_else(|| format!("{path}: tensor '{name}' is missing"))?;
            if !spec.storage.allows(t.ty()) {
                return Err(format!("{path}: tensor '{name}' is {}, expected {}", ggml_sys::type_name(t.ty()), spec.storage.describe()));
            }
            let ne = t.ne();
            let want: Vec<i64> = (0..4).map(|i| spec.shape.get(i).map_or(1, |&d| d as i64)).collect();
            if spec.shape.len() > 4 || ne[..] != want[..] {
                return Err(format!("{path}: tensor '{name}' has shape {}, the metadata implies {}", show_shape(&ne), show_shape(&want)));
            }
        }
        for t in gguf.ctx.tensors() {
            let name = t.name();
            if !self.specs.contains_key(&name) && !self.carried.iter().any(|p| name.starts_with(p.as_str())) {
                return Err(format!("{path}: unexpected tensor '{name}' (not part of this model's layout; docs/gguf.md)"));
            }
        }
        Ok(())
    }
}

/// `[a, b]` without trailing ones.
fn show_shape(ne: &[i64]) -> String {
    let n = ne.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1);
    format!("[{}]", ne[..n].iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "))
}
