//! A `.safetensors` checkpoint, memory-mapped: the header is parsed and
//! checked by the `safetensors` crate (offsets contiguous, sizes matching
//! shapes and dtypes, the data covering the file exactly), and a tensor's
//! values are read only when asked for, straight from the mapping into an
//! array of its own, so reading one tensor allocates only that tensor.
//!
//! The crate's errors say what is wrong but not always where; when it refuses
//! a header, the header is examined again here to name the tensor (the first
//! whose offsets leave a gap, disagree with its shape or run past the end of
//! a truncated file), so each error is one line naming the file and the
//! tensor.

use super::super::error::{Error, Result};
use super::super::files::{caps, open_regular};
use super::super::torch_pickle::DType;
use memmap2::Mmap;
use ndarray::{ArrayD, IxDyn};
use safetensors::tensor::{Dtype, Metadata, SafeTensorError, TensorInfo};
use safetensors::SafeTensors;
use std::path::{Path, PathBuf};

/// An opened `.safetensors` file.
pub struct SafetensorsFile {
    path: PathBuf,
    map: Mmap,
    /// Where the data section starts (8 + the header's length).
    data_start: usize,
    metadata: Metadata,
    /// Tensor names in file (data offset) order.
    names: Vec<String>,
}

impl std::fmt::Debug for SafetensorsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsFile").field("path", &self.path).field("tensors", &self.names.len()).finish()
    }
}

/// The element types this reader converts, as [`DType`] (shared with the
/// `.pt` reader); others (FP8, unsigned 16-64-bit, complex) are refused when
/// read.
fn dtype_of(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I64 => DType::I64,
        Dtype::I32 => DType::I32,
        Dtype::I16 => DType::I16,
        Dtype::I8 => DType::I8,
        Dtype::U8 => DType::U8,
        Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

impl SafetensorsFile {
    /// Maps `path` (a regular file of at most [`caps::SAFETENSORS`] bytes)
    /// and checks its header; errors are one line starting with the path.
    pub fn open(path: &Path) -> Result<SafetensorsFile> {
        let at = |what: String| Error::msg(format!("{}: {what}", path.display()));
        let file = open_regular(path, "", caps::SAFETENSORS).map_err(Error::msg)?;
        let len = file.metadata().map_err(|e| at(e.to_string()))?.len();
        if len < 8 {
            return Err(at(format!("truncated: {len} bytes, fewer than the 8 of a safetensors header's length")));
        }
        // SAFETY: the mapping is read-only and private to this reader; a
        // file truncated by another process while it is mapped would fault,
        // which is the price of not copying multi-gigabyte checkpoints.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| at(format!("cannot map the file ({e})")))?;
        let (n, metadata) = SafeTensors::read_metadata(&map).map_err(|e| at(explain(&map, e)))?;
        let names = metadata.offset_keys();
        Ok(SafetensorsFile { path: path.to_path_buf(), map, data_start: 8 + n, metadata, names })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tensor names in file order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    pub fn contains(&self, name: &str) -> bool {
        self.metadata.info(name).is_some()
    }

    fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.metadata.info(name).ok_or_else(|| Error::msg(format!("{}: no tensor '{name}'", self.path.display())))
    }

    pub fn shape(&self, name: &str) -> Result<Vec<usize>> {
        Ok(self.info(name)?.shape.clone())
    }

    /// `name`'s element type; an error names a type this reader does not convert.
    pub fn dtype(&self, name: &str) -> Result<DType> {
        let info = self.info(name)?;
        dtype_of(info.dtype).ok_or_else(|| Error::msg(format!("{}: tensor '{name}' has dtype {}, which is not supported", self.path.display(), info.dtype)))
    }

    /// `name`'s bytes as stored (little-endian), a view of the mapping.
    fn bytes(&self, name: &str) -> Result<(&TensorInfo, &[u8])> {
        let info = self.info(name)?;
        let (s, e) = info.data_offsets;
        // The header was checked to cover the file exactly at open.
        Ok((info, &self.map[self.data_start + s..self.data_start + e]))
    }

    /// Tells the kernel the pages of `name` are no longer needed, so a
    /// conversion that reads every tensor once does not keep the whole file
    /// resident (the pages come back from the file if read again).
    fn release(&self, name: &str) {
        if let Some(info) = self.metadata.info(name) {
            let (s, e) = info.data_offsets;
            // SAFETY: the mapping is a read-only shared file mapping; after
            // MADV_DONTNEED its pages read the file's bytes again, so no slice
            // into it changes.
            unsafe {
                let _ = self.map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, self.data_start + s, e - s);
            }
        }
    }

    /// `name`'s values as f32: F32 as is, F16 and BF16 exactly, F64 rounded
    /// to nearest (what torch's `.to(torch.float32)` gives).
    pub fn read_f32(&self, name: &str) -> Result<ArrayD<f32>> {
        let dtype = self.dtype(name)?;
        let (info, bytes) = self.bytes(name)?;
        let values: Vec<f32> = match dtype {
            DType::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            DType::F16 => bytes.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            DType::BF16 => bytes.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            DType::F64 => bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap()) as f32).collect(),
            other => return Err(Error::msg(format!("{}: tensor '{name}' is {}, not a float tensor", self.path.display(), other.name()))),
        };
        let shape = info.shape.clone();
        self.release(name);
        Ok(ArrayD::from_shape_vec(IxDyn(&shape), values).expect("the header's sizes were checked at open"))
    }

    /// `name`'s values as i64 (I64, I32, I16, I8, U8 and BOOL).
    pub fn read_i64(&self, name: &str) -> Result<ArrayD<i64>> {
        let dtype = self.dtype(name)?;
        let (info, bytes) = self.bytes(name)?;
        let values: Vec<i64> = match dtype {
            DType::I64 => bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect(),
            DType::I32 => bytes.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64).collect(),
            DType::I16 => bytes.chunks_exact(2).map(|c| i16::from_le_bytes([c[0], c[1]]) as i64).collect(),
            DType::I8 => bytes.iter().map(|&b| b as i8 as i64).collect(),
            DType::U8 | DType::Bool => bytes.iter().map(|&b| b as i64).collect(),
            other => return Err(Error::msg(format!("{}: tensor '{name}' is {}, not an integer tensor", self.path.display(), other.name()))),
        };
        let shape = info.shape.clone();
        self.release(name);
        Ok(ArrayD::from_shape_vec(IxDyn(&shape), values).expect("the header's sizes were checked at open"))
    }

    /// The file's size in bytes.
    pub fn file_len(&self) -> u64 {
        self.map.len() as u64
    }
}

/// One line for the crate's refusal of `file`, naming the tensor where the
/// header shows which.
fn explain(file: &[u8], e: SafeTensorError) -> String {
    let len = file.len() as u64;
    let n = u64::from_le_bytes(file[..8].try_into().unwrap());
    match e {
        SafeTensorError::HeaderTooLarge => return format!("header of {n} bytes is larger than a safetensors header may be (100 MB)"),
        SafeTensorError::InvalidHeaderLength => {
            return format!("truncated: the header is {n} bytes but only {} follow its length", len - 8);
        }
        SafeTensorError::InvalidHeader(_) | SafeTensorError::InvalidHeaderDeserialization(_) => {
            return format!("not a safetensors file ({e})");
        }
        _ => {}
    }
    let header = &file[8..8 + n as usize];
    let available = len - 8 - n;
    diagnose(header, available).unwrap_or_else(|| format!("invalid safetensors header ({e})"))
}

/// The first tensor, in data-offset order, whose offsets leave a gap or
/// overlap, disagree with its shape and dtype, or run past the `available`
/// data bytes; or data left over after the last tensor.
fn diagnose(header: &[u8], available: u64) -> Option<String> {
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(header).ok()?;
    let mut entries: Vec<(String, TensorInfo)> =
        map.into_iter().filter(|(k, _)| k != "__metadata__").filter_map(|(k, v)| serde_json::from_value::<TensorInfo>(v).ok().map(|i| (k, i))).collect();
    entries.sort_by_key(|(_, i)| i.data_offsets);
    let mut end = 0usize;
    for (name, info) in &entries {
        let (s, e) = info.data_offsets;
        if s != end || e < s {
            return Some(format!(
                "tensor '{name}': data offsets [{s}, {e}] do not start where the previous tensor ends ({end}): the header lies about offsets"
            ));
        }
        let need = info.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).and_then(|n| n.checked_mul(info.dtype.bitsize())).map(|bits| bits.div_ceil(8));
        match need {
            Some(need) if need == e - s => {}
            Some(need) => {
                return Some(format!("tensor '{name}': {} {:?} takes {need} bytes but its data offsets [{s}, {e}] give {}", info.dtype, info.shape, e - s));
            }
            None => return Some(format!("tensor '{name}': shape {:?} is too large", info.shape)),
        }
        if e as u64 > available {
            return Some(format!("tensor '{name}': data offsets [{s}, {e}] run past the end of the file's {available} data bytes (truncated?)"));
        }
        end = e;
    }
    if (end as u64) < available {
        return Some(format!("{} bytes after the last tensor's data: the header does not describe the file", available - end as u64));
    }
    None
}
