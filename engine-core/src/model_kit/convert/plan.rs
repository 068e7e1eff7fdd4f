//! A converter's plan of one output tensor: its name, shape and storage are
//! known before any value is read, and its values are produced only when the
//! writer reaches it. The GGUF header (which lists every tensor's shape and
//! offset) is written first, then each tensor is produced, encoded and written
//! in turn, so a conversion holds one tensor's values at a time, not the model.

use super::super::error::Result;
use super::ggml_type::GgmlType;
use ndarray::ArrayD;

/// A produced tensor's values, in row-major order of its shape.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    /// Floats, stored as F32, F16, BF16, Q8_0 or Q4_0.
    F32(ArrayD<f32>),
    /// Stored as I32.
    I32(ArrayD<i32>),
    /// Stored as I16.
    I16(ArrayD<i16>),
}

impl Values {
    pub fn shape(&self) -> &[usize] {
        match self {
            Values::F32(a) => a.shape(),
            Values::I32(a) => a.shape(),
            Values::I16(a) => a.shape(),
        }
    }

    /// "float", "i32" or "i16", for errors.
    pub fn kind(&self) -> &'static str {
        match self {
            Values::F32(_) => "float",
            Values::I32(_) => "i32",
            Values::I16(_) => "i16",
        }
    }
}

impl From<ArrayD<f32>> for Values {
    fn from(a: ArrayD<f32>) -> Self {
        Values::F32(a)
    }
}

impl From<ArrayD<i32>> for Values {
    fn from(a: ArrayD<i32>) -> Self {
        Values::I32(a)
    }
}

impl From<ArrayD<i16>> for Values {
    fn from(a: ArrayD<i16>) -> Self {
        Values::I16(a)
    }
}

type Producer<'a> = Box<dyn FnOnce() -> Result<Values> + 'a>;

/// One tensor of the output: what the GGUF's tensor info says, and how to
/// make its values.
pub struct PlannedTensor<'a> {
    name: String,
    shape: Vec<usize>,
    storage: GgmlType,
    produce: Producer<'a>,
}

impl<'a> PlannedTensor<'a> {
    /// `shape` in NumPy order (outermost first, as the Python converters'
    /// arrays have it; the GGUF stores it reversed). `produce` runs once, when
    /// the writer reaches this tensor; it must return values of `shape`
    /// (a different shape is an error naming the tensor) and of the kind
    /// `storage` takes (floats for F32/F16/BF16/Q8_0/Q4_0, i32 for I32, i16
    /// for I16).
    ///
    /// A 0-d float tensor: the Python converters pass float arrays through
    /// `np.ascontiguousarray`, which makes a 0-d array 1-d, so plan such a
    /// tensor as `[1]` to match them (gguf-py itself writes a 0-d array with
    /// no dimensions, as this writer does for an empty `shape`).
    pub fn new(name: impl Into<String>, shape: Vec<usize>, storage: GgmlType, produce: impl FnOnce() -> Result<Values> + 'a) -> Self {
        PlannedTensor { name: name.into(), shape, storage, produce: Box::new(produce) }
    }

    /// A tensor whose values are already in memory (small tensors: built-in
    /// voices, metadata-like tables); the shape is the array's.
    pub fn ready(name: impl Into<String>, storage: GgmlType, values: Values) -> Self {
        let shape = values.shape().to_vec();
        PlannedTensor::new(name, shape, storage, move || Ok(values))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn storage(&self) -> GgmlType {
        self.storage
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs the producer (the writer's step).
    pub(super) fn produce(self) -> Result<Values> {
        (self.produce)()
    }
}

impl std::fmt::Debug for PlannedTensor<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlannedTensor").field("name", &self.name).field("shape", &self.shape).field("storage", &self.storage).finish()
    }
}
