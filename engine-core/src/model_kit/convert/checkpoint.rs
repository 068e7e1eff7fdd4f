//! One reader over the two checkpoint formats official releases use:
//! `.safetensors` ([`SafetensorsFile`], memory-mapped) and torch's `.pt` /
//! `.bin` state dicts ([`PtFile`], the restricted pickle reader). A converter
//! asks for tensors by name and gets f32 or i64 arrays, whatever the file's
//! format and float width, and every error is one line naming the file and
//! the tensor.

use super::super::error::{Error, Result};
use super::super::torch_pickle::{DType, PtFile};
use super::safetensors::SafetensorsFile;
use ndarray::{ArrayD, IxDyn};
use std::path::Path;

/// An opened checkpoint.
#[derive(Debug)]
pub enum Checkpoint {
    Safetensors(SafetensorsFile),
    Pt(PtFile),
}

impl Checkpoint {
    /// Opens `path` by its extension: `.safetensors` as safetensors, anything
    /// else (`.pt`, `.pth`, `.bin`) as a torch zip checkpoint.
    pub fn open(path: &Path) -> Result<Checkpoint> {
        if path.extension().is_some_and(|e| e == "safetensors") {
            Ok(Checkpoint::Safetensors(SafetensorsFile::open(path)?))
        } else {
            Ok(Checkpoint::Pt(PtFile::open(path)?))
        }
    }

    pub fn path(&self) -> &Path {
        match self {
            Checkpoint::Safetensors(f) => f.path(),
            Checkpoint::Pt(f) => f.path(),
        }
    }

    /// Tensor names in file order (data offsets for safetensors, the
    /// pickle's order for `.pt`; nested `.pt` dicts give dotted names).
    pub fn names(&self) -> Vec<String> {
        match self {
            Checkpoint::Safetensors(f) => f.names().to_vec(),
            Checkpoint::Pt(f) => f.tensors().keys().cloned().collect(),
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        match self {
            Checkpoint::Safetensors(f) => f.contains(name),
            Checkpoint::Pt(f) => f.tensors().contains_key(name),
        }
    }

    fn missing(&self, name: &str) -> Error {
        Error::msg(format!("{}: no tensor '{name}'", self.path().display()))
    }

    /// `name`'s shape (outermost first); an error when there is no such tensor.
    pub fn shape(&self, name: &str) -> Result<Vec<usize>> {
        match self {
            Checkpoint::Safetensors(f) => f.shape(name),
            Checkpoint::Pt(f) => f.tensors().get(name).map(|t| t.shape.clone()).ok_or_else(|| self.missing(name)),
        }
    }

    /// `name`'s element type as stored.
    pub fn dtype(&self, name: &str) -> Result<DType> {
        match self {
            Checkpoint::Safetensors(f) => f.dtype(name),
            Checkpoint::Pt(f) => f.tensors().get(name).map(|t| t.dtype).ok_or_else(|| self.missing(name)),
        }
    }

    /// Whether `name` holds floats (F32, F64, F16 or BF16).
    pub fn is_float(&self, name: &str) -> Result<bool> {
        Ok(matches!(self.dtype(name)?, DType::F32 | DType::F64 | DType::F16 | DType::BF16))
    }

    /// `name`'s values as f32 (F16/BF16 exactly, F64 rounded to nearest, as
    /// torch's `.to(torch.float32)`); an integer tensor is an error.
    pub fn read_f32(&self, name: &str) -> Result<ArrayD<f32>> {
        match self {
            Checkpoint::Safetensors(f) => f.read_f32(name),
            Checkpoint::Pt(f) => {
                let shape = self.shape(name)?;
                let values = f.read_f32(name)?;
                Ok(ArrayD::from_shape_vec(IxDyn(&shape), values).expect("the reader returns the tensor's element count"))
            }
        }
    }

    /// `name`'s values as i64 (any integer or bool tensor); a float tensor is
    /// an error.
    pub fn read_i64(&self, name: &str) -> Result<ArrayD<i64>> {
        match self {
            Checkpoint::Safetensors(f) => f.read_i64(name),
            Checkpoint::Pt(f) => {
                let shape = self.shape(name)?;
                let values = f.read_i64(name)?;
                Ok(ArrayD::from_shape_vec(IxDyn(&shape), values).expect("the reader returns the tensor's element count"))
            }
        }
    }

    /// The file's size in bytes.
    pub fn file_len(&self) -> u64 {
        match self {
            Checkpoint::Safetensors(f) => f.file_len(),
            Checkpoint::Pt(f) => f.file_len(),
        }
    }
}
