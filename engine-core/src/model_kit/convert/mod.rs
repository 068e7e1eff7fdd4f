//! What every family's native converter shares: reading official checkpoints
//! and writing GGUFs byte-identical to the Python converters' (tools/*/convert.py
//! with gguf-py 0.19).
//!
//! - [`checkpoint`]: one reader over `.safetensors` ([`safetensors`],
//!   memory-mapped) and torch `.pt` state dicts (the restricted pickle reader,
//!   [`crate::model_kit::torch_pickle`]); tensors come out as f32 or i64
//!   arrays, errors name the file and the tensor.
//! - [`plan`]: a planned output tensor, its values made only when written.
//! - [`gguf_writer`]: the streaming, atomic GGUF writer (one tensor's values
//!   in memory at a time; `<path>.part` renamed at the end).
//! - [`ggml_type`]: the storage types and their bit-exact encoders (F16, BF16,
//!   Q8_0, Q4_0).
//! - [`onnx`]: ONNX graphs' initializers, nodes and constants.
//! - [`numeric`]: NumPy-exact arithmetic the converters reproduce (pairwise
//!   summation, weight-norm fusion).
//!
//! A family's converter opens its checkpoints, plans every output tensor with
//! its name, shape, storage and a closure that reads and transforms the
//! inputs, adds the metadata in the Python converter's order, and calls
//! [`GgufWriter::write_atomically`].

pub mod checkpoint;
pub mod ggml_type;
pub mod gguf_writer;
pub mod numeric;
pub mod onnx;
pub mod plan;
pub mod safetensors;

pub use checkpoint::Checkpoint;
pub use ggml_type::GgmlType;
pub use gguf_writer::{GgufWriter, MetaValue, WrittenGguf};
pub use numeric::{fuse_weight_norm, numpy_sum_f64, pairwise_sum_f64};
pub use plan::{PlannedTensor, Values};
pub use safetensors::SafetensorsFile;

pub use super::torch_pickle::{DType, PtFile};
