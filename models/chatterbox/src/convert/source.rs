//! One checkpoint file of the official directory (safetensors or a `.pt`
//! state dict, through model_kit's [`Checkpoint`]), with its names and shapes
//! read up front and its values read tensor by tensor by the producers the
//! family modules plan.

use super::plan::{Producer, Shapes};
use engine_core::model_kit::convert::{Checkpoint, Values};
use engine_core::model_kit::{Error, Result};
use indexmap::IndexMap;
use ndarray::{ArrayD, Axis, IxDyn};
use std::collections::HashSet;
use std::path::Path;

pub struct Source {
    ckpt: Checkpoint,
    shapes: Shapes,
    integer: HashSet<String>,
}

impl Source {
    pub fn open(path: &Path) -> Result<Source> {
        let ckpt = Checkpoint::open(path)?;
        // As convert.py's `load_state`: a `.pt` must be a state dict of
        // tensors only (a step count or a config beside them means another
        // kind of file).
        if let Checkpoint::Pt(pt) = &ckpt {
            if let Some(key) = pt.values().keys().next() {
                return Err(Error::msg(format!("{} is not a state dict of tensors ('{key}' is not a tensor)", path.display())));
            }
        }
        let mut map = IndexMap::new();
        let mut integer = HashSet::new();
        for name in ckpt.names() {
            map.insert(name.clone(), ckpt.shape(&name)?);
            if !ckpt.is_float(&name)? {
                integer.insert(name);
            }
        }
        Ok(Source { shapes: Shapes::new(path.display().to_string(), map), ckpt, integer })
    }

    /// The first of `names` that exists in `dir` (convert.py's `load_state`).
    pub fn open_first(dir: &Path, names: &[&str]) -> Result<Source> {
        for name in names {
            let path = dir.join(name);
            if path.is_file() {
                return Source::open(&path);
            }
        }
        Err(Error::msg(format!("{}: none of {}", dir.display(), names.join(", "))))
    }

    pub fn shapes(&self) -> &Shapes {
        &self.shapes
    }

    pub fn is_integer(&self, name: &str) -> bool {
        self.integer.contains(name)
    }

    /// `name`'s shape, which must be a floating-point tensor: every weight
    /// the engine uses is (an integer one means a mislabelled file).
    pub fn float(&self, name: &str) -> Result<&[usize]> {
        let shape = self.shapes.shape(name)?;
        if self.is_integer(name) {
            return Err(self.shapes.error(format_args!("tensor '{name}' is an integer tensor; the engine reads it as floating-point weights")));
        }
        Ok(shape)
    }

    /// `name`'s values as f32.
    pub fn read(&self, name: &str) -> Result<ArrayD<f32>> {
        self.ckpt.read_f32(name)
    }

    /// A producer of `name` as stored.
    pub fn plain<'a>(&'a self, name: &str) -> Producer<'a> {
        let name = name.to_string();
        Box::new(move || Ok(Values::F32(self.read(&name)?)))
    }

    /// A producer of `name` with its axes reversed (a 2-D transpose, as
    /// numpy's `.T`), laid out row-major.
    pub fn transposed<'a>(&'a self, name: &str) -> Producer<'a> {
        let name = name.to_string();
        Box::new(move || Ok(Values::F32(self.read(&name)?.reversed_axes().as_standard_layout().into_owned())))
    }

    /// A producer of `names` stacked along the first axis (numpy's
    /// `concatenate(axis=0)`).
    pub fn stacked<'a>(&'a self, names: Vec<String>) -> Producer<'a> {
        Box::new(move || {
            let parts = names.iter().map(|n| self.read(n)).collect::<Result<Vec<_>>>()?;
            let views: Vec<_> = parts.iter().map(|a| a.view()).collect();
            let joined = ndarray::concatenate(Axis(0), &views).map_err(|e| self.shapes.error(format_args!("stacking {}: {e}", names.join(", "))))?;
            Ok(Values::F32(joined))
        })
    }

    /// A producer of `name` reshaped (row-major) to `shape`.
    pub fn reshaped<'a>(&'a self, name: &str, shape: Vec<usize>) -> Producer<'a> {
        let name = name.to_string();
        Box::new(move || {
            let a = self.read(&name)?.as_standard_layout().into_owned();
            let a = a.into_shape_with_order(IxDyn(&shape)).map_err(|e| self.shapes.error(format_args!("tensor '{name}': {e}")))?;
            Ok(Values::F32(a))
        })
    }
}
