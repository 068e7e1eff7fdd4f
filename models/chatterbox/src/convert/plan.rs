//! The tensors of one output file before any is read: engine name → shape and
//! a producer that reads (and transposes, stacks or fuses) the values only
//! when the GGUF writer reaches the tensor. Hyper-parameters are derived from
//! the shapes alone, as convert.py derives them from its arrays' `.shape`, so
//! a whole conversion holds one tensor's values at a time.

use engine_core::model_kit::convert::Values;
use engine_core::model_kit::{Error, Result};
use indexmap::IndexMap;

pub type Producer<'a> = Box<dyn FnOnce() -> Result<Values> + 'a>;

pub struct Planned<'a> {
    pub shape: Vec<usize>,
    /// An integer tensor (stored I32) rather than a float one.
    pub integer: bool,
    pub produce: Producer<'a>,
}

impl<'a> Planned<'a> {
    pub fn float(shape: Vec<usize>, produce: impl FnOnce() -> Result<Values> + 'a) -> Self {
        Planned { shape, integer: false, produce: Box::new(produce) }
    }

    pub fn int(shape: Vec<usize>, produce: impl FnOnce() -> Result<Values> + 'a) -> Self {
        Planned { shape, integer: true, produce: Box::new(produce) }
    }
}

/// Names → shapes of one source (a checkpoint's state dict, or the planned
/// tensors of an output), with the lookups the hyper-parameter derivations
/// use. `what` prefixes every error (the file).
pub struct Shapes {
    what: String,
    map: IndexMap<String, Vec<usize>>,
}

impl Shapes {
    pub fn new(what: impl Into<String>, map: IndexMap<String, Vec<usize>>) -> Self {
        Shapes { what: what.into(), map }
    }

    pub fn what(&self) -> &str {
        &self.what
    }

    pub fn contains(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.map.keys().map(String::as_str)
    }

    pub fn error(&self, message: impl std::fmt::Display) -> Error {
        Error::msg(format!("{}: {message}", self.what))
    }

    pub fn shape(&self, name: &str) -> Result<&[usize]> {
        self.map.get(name).map(Vec::as_slice).ok_or_else(|| self.error(format_args!("no tensor '{name}'")))
    }

    /// Dimension `axis` of `name` (numpy order).
    pub fn dim(&self, name: &str, axis: usize) -> Result<usize> {
        let shape = self.shape(name)?;
        shape.get(axis).copied().ok_or_else(|| self.error(format_args!("tensor '{name}' has shape {shape:?}, with no dimension {axis}")))
    }

    /// `name`'s shape, which must be `want`.
    pub fn expect(&self, name: &str, want: &[usize]) -> Result<()> {
        let shape = self.shape(name)?;
        if shape == want {
            Ok(())
        } else {
            Err(self.error(format_args!("tensor '{name}' has shape {shape:?}, expected {want:?}")))
        }
    }

    /// The largest N of the names `PREFIX<N>.…` (convert.py's `highest`),
    /// `None` when no name has that form.
    pub fn highest_index(&self, prefix: &str) -> Option<usize> {
        self.map
            .keys()
            .filter_map(|k| {
                let rest = k.strip_prefix(prefix)?;
                let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
                (digits > 0 && rest.as_bytes().get(digits) == Some(&b'.')).then(|| rest[..digits].parse::<usize>().ok())?
            })
            .max()
    }

    /// The largest N of `PREFIX<N>.…`, or an error naming the form.
    pub fn highest(&self, prefix: &str) -> Result<usize> {
        self.highest_index(prefix).ok_or_else(|| self.error(format_args!("no tensor named '{prefix}<N>.…'")))
    }

    /// 1 + the largest N of `PREFIX.<N>.…` (convert.py's `count`).
    pub fn count(&self, prefix: &str) -> Result<usize> {
        Ok(1 + self.highest(&format!("{prefix}."))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_as_convert_py() {
        let names = ["a.blocks.0.w", "a.blocks.11.w", "a.blocks.x.w", "a.blocks.3", "a.block2.tdnnd7.w", "a.block2.tdnnd12.b", "a.blocks.9"];
        let s = Shapes::new("f", names.iter().map(|n| (n.to_string(), vec![1])).collect());
        assert_eq!(s.count("a.blocks").unwrap(), 12);
        assert_eq!(s.highest("a.block").unwrap(), 2);
        assert_eq!(s.highest("a.block2.tdnnd").unwrap(), 12);
        assert_eq!(s.count("b").unwrap_err().as_str(), "f: no tensor named 'b.<N>.…'");
        assert_eq!(s.dim("a.blocks.3", 1).unwrap_err().as_str(), "f: tensor 'a.blocks.3' has shape [1], with no dimension 1");
    }
}
