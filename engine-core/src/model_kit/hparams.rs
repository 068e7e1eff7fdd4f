//! Range-checked hyper-parameters. Every value a family reads from GGUF
//! metadata goes through [`HparamReader`] with the range docs/gguf.md gives
//! for it, so a zero head count, a NaN scale or a 2³⁰ dimension is an error
//! that names the key, not a crash, a hang or silence later.

use super::error::{Error, Result};
use ggml_sys::gguf::{GgufFile, Metadata};
use std::ops::RangeInclusive;

/// Dimensions (widths, inner sizes, vocabularies) a family may declare.
pub const DIM: RangeInclusive<usize> = 1..=65536;
/// Layer and block counts.
pub const LAYERS: RangeInclusive<usize> = 1..=256;
/// Attention head counts.
pub const HEADS: RangeInclusive<usize> = 1..=256;
/// Convolution kernels.
pub const KERNEL: RangeInclusive<usize> = 1..=255;
/// Convolution dilations and strides.
pub const DILATION: RangeInclusive<usize> = 1..=64;
/// Normalisation epsilons.
pub const EPS: RangeInclusive<f32> = 1e-30..=0.1;
/// Output sample rates.
pub const SAMPLE_RATE: RangeInclusive<usize> = 8000..=192_000;

/// Typed, range-checked access to `<arch>.<key>`; every error names the file
/// and the full key.
pub struct HparamReader<'a> {
    meta: Metadata<'a>,
    file: &'a GgufFile,
    arch: String,
}

fn show<T: std::fmt::Debug>(r: &RangeInclusive<T>) -> String {
    format!("{:?}..={:?}", r.start(), r.end())
}

impl<'a> HparamReader<'a> {
    pub fn new(file: &'a GgufFile, arch: &str) -> Self {
        HparamReader { meta: Metadata::new(file, arch), file, arch: arch.to_string() }
    }

    fn out_of_range(&self, key: &str, value: impl std::fmt::Display, range: String) -> Error {
        Error::msg(format!("{}: metadata {}.{key} = {value} is out of range ({range})", self.file.path().display(), self.arch))
    }

    /// An error about the file (relations between keys and tensors).
    pub fn error(&self, message: impl std::fmt::Display) -> Error {
        Error::msg(format!("{}: {message}", self.file.path().display()))
    }

    /// `Err(self.error(message))` unless `ok`.
    pub fn require(&self, ok: bool, message: impl FnOnce() -> String) -> Result<()> {
        if ok {
            Ok(())
        } else {
            Err(self.error(message()))
        }
    }

    /// A u32 count or size within `range`.
    pub fn count(&self, key: &str, range: RangeInclusive<usize>) -> Result<usize> {
        let v = self.meta.u32(key)? as usize;
        if range.contains(&v) {
            Ok(v)
        } else {
            Err(self.out_of_range(key, v, show(&range)))
        }
    }

    /// A u32 array with `len` entries, each within `each`.
    pub fn counts(&self, key: &str, len: RangeInclusive<usize>, each: RangeInclusive<usize>) -> Result<Vec<usize>> {
        let v = self.meta.usizes(key)?;
        if !len.contains(&v.len()) {
            return Err(format!("{}: metadata {}.{key} has {} entries (allowed: {})", self.file.path().display(), self.arch, v.len(), show(&len)).into());
        }
        match v.iter().find(|x| !each.contains(x)) {
            Some(bad) => Err(self.out_of_range(key, format!("[.., {bad}, ..]"), format!("each {}", show(&each)))),
            None => Ok(v),
        }
    }

    /// A finite f32 within `range` (NaN is never within a range).
    pub fn real(&self, key: &str, range: RangeInclusive<f32>) -> Result<f32> {
        let v = self.meta.f32(key)?;
        if range.contains(&v) {
            Ok(v)
        } else {
            Err(self.out_of_range(key, v, show(&range)))
        }
    }

    /// A token id below `vocab`.
    pub fn token(&self, key: &str, vocab: usize) -> Result<u32> {
        let v = self.meta.u32(key)?;
        if (v as usize) < vocab {
            Ok(v)
        } else {
            Err(self.out_of_range(key, v, format!("a token below the vocabulary size {vocab}")))
        }
    }

    pub fn string(&self, key: &str) -> Result<String> {
        Ok(self.meta.str(key)?)
    }

    /// A string that may be absent, read as empty: GGUF writers (gguf-py, and
    /// `model_kit::convert::GgufWriter` after it) leave empty strings out.
    pub fn string_or_empty(&self, key: &str) -> Result<String> {
        let full = format!("{}.{key}", self.arch);
        if self.file.keys().contains(&full) {
            self.string(key)
        } else {
            Ok(String::new())
        }
    }

    /// One of `allowed`.
    pub fn choice(&self, key: &str, allowed: &[&str]) -> Result<String> {
        let v = self.meta.str(key)?;
        if allowed.contains(&v.as_str()) {
            Ok(v)
        } else {
            Err(format!("{}: metadata {}.{key} = '{v}' is not one of: {}", self.file.path().display(), self.arch, allowed.join(", ")).into())
        }
    }

    pub fn strings(&self, key: &str, len: RangeInclusive<usize>) -> Result<Vec<String>> {
        let v = self.meta.strs(key)?;
        if len.contains(&v.len()) {
            Ok(v)
        } else {
            Err(format!("{}: metadata {}.{key} has {} entries (allowed: {})", self.file.path().display(), self.arch, v.len(), show(&len)).into())
        }
    }

    pub fn flag(&self, key: &str) -> Result<bool> {
        Ok(self.meta.bool(key)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ggml_sys::gguf::GgufWriter;

    #[test]
    fn ranges_name_the_key_and_the_range() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let mut w = GgufWriter::new();
        w.set_u32("fam.heads", 0).set_u32("fam.dim", 8).set_f32("fam.eps", f32::NAN).set_f32("fam.scale", 0.5).set_str("fam.kind", "odd");
        w.write_metadata(&path).unwrap();
        let file = GgufFile::open(&path).unwrap();
        let r = HparamReader::new(&file, "fam");
        let e = r.count("heads", HEADS).unwrap_err();
        assert!(e.ends_with("m.gguf: metadata fam.heads = 0 is out of range (1..=256)"), "{e}");
        assert_eq!(r.count("dim", DIM).unwrap(), 8);
        let e = r.real("eps", EPS).unwrap_err();
        assert!(e.contains("metadata fam.eps = NaN is out of range"), "{e}");
        assert_eq!(r.real("scale", 0.0..=1.0).unwrap(), 0.5);
        assert!(r.token("dim", 8).unwrap_err().contains("a token below the vocabulary size 8"));
        assert!(r.choice("kind", &["a", "b"]).unwrap_err().ends_with("metadata fam.kind = 'odd' is not one of: a, b"));
        assert!(r.count("missing", DIM).unwrap_err().contains("metadata key 'fam.missing' is missing"));
    }
}
