//! A GGUF writer that streams: the same bytes as gguf-py 0.19's `GGUFWriter`
//! driven the way the Python converters drive it (`GGUFWriter(path, arch)`,
//! `add_*` calls, `add_tensor` in order, then `tools/gguf_atomic.py`'s
//! `write_atomically`), so a native conversion can be compared with the
//! Python one byte for byte.
//!
//! The layout gguf-py writes (GGUF v3, little-endian):
//! - `GGUF`, version 3, the tensor count and the key count (u64 each);
//! - each key: its name (u64 length + UTF-8), its value type (u32), the value;
//!   `general.architecture` first (the constructor adds it), the others in the
//!   order added, a key added twice keeping its first place with the last
//!   value, and empty strings and empty arrays left out (gguf-py's
//!   `add_string` / `add_array` drop them);
//! - each tensor's info: name, dimension count (u32), dimensions innermost
//!   first (u64 each; a quantized tensor's in values, not bytes), type id
//!   (u32) and data offset (u64), the offsets advancing by each tensor's
//!   bytes rounded up to 32;
//! - zeros up to the next multiple of 32, then each tensor's bytes followed by
//!   zeros up to a multiple of 32.
//!
//! Unlike gguf-py, no tensor's values exist before the writer reaches it:
//! the header is written from the plan, then each [`PlannedTensor`] is
//! produced, checked against its plan, encoded and written in chunks. The
//! file is written as `<path>.part` (created exclusively, after removing a
//! stale one, so a link planted at that name is never followed) and renamed
//! onto `path` only when complete; on any error (or panic) the `.part` is
//! removed, and an existing file at `path` is never touched.

use super::super::error::{Error, Result};
use super::ggml_type::GgmlType;
use super::plan::{PlannedTensor, Values};
use indexmap::IndexMap;
use ndarray::ArrayD;
use std::io::{BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The data alignment gguf-py uses (`GGUF_DEFAULT_ALIGNMENT`).
pub const ALIGNMENT: u64 = 32;
const MAGIC: &[u8; 4] = b"GGUF";
const VERSION: u32 = 3;

// GGUF metadata value types (gguf-py's `GGUFValueType`).
const TYPE_UINT32: u32 = 4;
const TYPE_INT32: u32 = 5;
const TYPE_FLOAT32: u32 = 6;
const TYPE_BOOL: u32 = 7;
const TYPE_STRING: u32 = 8;
const TYPE_ARRAY: u32 = 9;

/// Values encoded per chunk while a tensor is written (a multiple of every
/// block length).
const CHUNK: usize = 1 << 16;

/// A metadata value, as the converters' `add_*` calls type them: `add_uint32`
/// → `U32`, `add_int32` → `I32`, `add_float32` → `F32`, `add_bool` → `Bool`,
/// `add_string` → `Str`, and `add_array` of Python ints, floats or strings →
/// `ArrI32`, `ArrF32`, `ArrStr` (gguf-py types a list by its first item:
/// ints are INT32).
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    ArrI32(Vec<i32>),
    ArrF32(Vec<f32>),
    ArrStr(Vec<String>),
}

impl MetaValue {
    /// What gguf-py leaves out: empty strings and arrays.
    fn dropped(&self) -> bool {
        match self {
            MetaValue::Str(s) => s.is_empty(),
            MetaValue::ArrI32(v) => v.is_empty(),
            MetaValue::ArrF32(v) => v.is_empty(),
            MetaValue::ArrStr(v) => v.is_empty(),
            _ => false,
        }
    }

    fn encode(&self, out: &mut Vec<u8>) {
        let u32le = |out: &mut Vec<u8>, v: u32| out.extend_from_slice(&v.to_le_bytes());
        match self {
            MetaValue::U32(v) => {
                u32le(out, TYPE_UINT32);
                u32le(out, *v);
            }
            MetaValue::I32(v) => {
                u32le(out, TYPE_INT32);
                out.extend_from_slice(&v.to_le_bytes());
            }
            MetaValue::F32(v) => {
                u32le(out, TYPE_FLOAT32);
                out.extend_from_slice(&v.to_le_bytes());
            }
            MetaValue::Bool(v) => {
                u32le(out, TYPE_BOOL);
                out.push(*v as u8);
            }
            MetaValue::Str(s) => {
                u32le(out, TYPE_STRING);
                put_str(out, s);
            }
            MetaValue::ArrI32(v) => {
                u32le(out, TYPE_ARRAY);
                u32le(out, TYPE_INT32);
                out.extend_from_slice(&(v.len() as u64).to_le_bytes());
                v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
            }
            MetaValue::ArrF32(v) => {
                u32le(out, TYPE_ARRAY);
                u32le(out, TYPE_FLOAT32);
                out.extend_from_slice(&(v.len() as u64).to_le_bytes());
                v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
            }
            MetaValue::ArrStr(v) => {
                u32le(out, TYPE_ARRAY);
                u32le(out, TYPE_STRING);
                out.extend_from_slice(&(v.len() as u64).to_le_bytes());
                v.iter().for_each(|s| put_str(out, s));
            }
        }
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn pad(n: u64) -> u64 {
    n.div_ceil(ALIGNMENT) * ALIGNMENT
}

/// What [`GgufWriter::write_atomically`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenGguf {
    pub path: PathBuf,
    /// Tensors written.
    pub tensors: usize,
    /// The file's size in bytes.
    pub bytes: u64,
}

/// A GGUF being planned: metadata and tensors in insertion order; nothing is
/// written before [`GgufWriter::write_atomically`].
pub struct GgufWriter<'a> {
    kv: IndexMap<String, MetaValue>,
    tensors: Vec<PlannedTensor<'a>>,
}

impl std::fmt::Debug for GgufWriter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufWriter").field("kv", &self.kv.len()).field("tensors", &self.tensors).finish()
    }
}

impl<'a> GgufWriter<'a> {
    /// A writer whose first key is `general.architecture` = `arch`, as
    /// gguf-py's constructor adds it.
    pub fn new(arch: &str) -> Self {
        let mut w = GgufWriter { kv: IndexMap::new(), tensors: Vec::new() };
        w.add("general.architecture", MetaValue::Str(arch.to_string()));
        w
    }

    /// Adds a key (kept in insertion order). An empty string or array is left
    /// out and a key added again keeps its place with the new value, as in
    /// gguf-py.
    pub fn add(&mut self, key: impl Into<String>, value: MetaValue) {
        if !value.dropped() {
            self.kv.insert(key.into(), value);
        }
    }

    /// Adds a tensor (kept in insertion order).
    pub fn add_tensor(&mut self, tensor: PlannedTensor<'a>) {
        self.tensors.push(tensor);
    }

    /// The keys added so far, in order.
    pub fn keys(&self) -> impl Iterator<Item = (&str, &MetaValue)> {
        self.kv.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The tensors planned so far, in order.
    pub fn tensors(&self) -> &[PlannedTensor<'a>] {
        &self.tensors
    }

    /// Writes the header, the metadata and the tensor infos, then produces,
    /// checks, encodes and writes each tensor in turn into `<path>.part`, and
    /// renames it onto `path`. On any error the `.part` is removed and `path`
    /// is left as it was; errors are one line naming the file or the tensor.
    pub fn write_atomically(self, path: &Path) -> Result<WrittenGguf> {
        let GgufWriter { kv, tensors } = self;
        let head = header(&kv, &tensors)?;
        let mut part_name = path.file_name().ok_or_else(|| Error::msg(format!("{}: not a file path", path.display())))?.to_os_string();
        part_name.push(".part");
        let part = path.with_file_name(part_name);
        let io = |e: std::io::Error| Error::msg(format!("{}: {e}", part.display()));

        // A stale `.part` (a crashed run) or a link planted at that name is
        // removed, not followed; the new one is created exclusively, so a
        // link that appears in between makes the creation fail.
        match std::fs::symlink_metadata(&part) {
            Ok(meta) if !meta.is_dir() => std::fs::remove_file(&part).map_err(io)?,
            _ => {}
        }
        let file = std::fs::OpenOptions::new().write(true).create_new(true).custom_flags(libc::O_NOFOLLOW).open(&part).map_err(io)?;
        let mut guard = PartFile { path: &part, armed: true };
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&head).map_err(io)?;
        let mut written = head.len() as u64;
        let count = tensors.len();
        let mut chunk = Vec::new();
        for tensor in tensors {
            let (name, storage, shape) = (tensor.name().to_string(), tensor.storage(), tensor.shape().to_vec());
            let values = tensor.produce()?;
            if values.shape() != shape.as_slice() {
                return Err(Error::msg(format!("tensor '{name}': produced shape {:?}, the plan says {shape:?}", values.shape())));
            }
            let bytes = write_values(&mut out, &name, storage, &values, &mut chunk).map_err(|e| match e {
                WriteError::Io(e) => io(e),
                WriteError::Kind(msg) => Error::msg(msg),
            })?;
            drop(values);
            let padded = pad(bytes);
            out.write_all(&vec![0u8; (padded - bytes) as usize]).map_err(io)?;
            written += padded;
        }
        let file = out.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_all().map_err(io)?;
        drop(file);
        std::fs::rename(&part, path).map_err(|e| Error::msg(format!("{}: renaming {} onto it: {e}", path.display(), part.display())))?;
        guard.armed = false;
        Ok(WrittenGguf { path: path.to_path_buf(), tensors: count, bytes: written })
    }
}

/// Removes the `.part` file unless the write completed (also on a panic in a
/// producer).
struct PartFile<'p> {
    path: &'p Path,
    armed: bool,
}

impl Drop for PartFile<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = std::fs::remove_file(self.path);
        }
    }
}

/// Header, metadata, tensor infos and the padding before the data: every
/// check that needs no values happens here, before any file is created.
fn header(kv: &IndexMap<String, MetaValue>, tensors: &[PlannedTensor]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(kv.len() as u64).to_le_bytes());
    for (key, value) in kv {
        put_str(&mut out, key);
        value.encode(&mut out);
    }
    let mut seen = std::collections::HashSet::new();
    let mut offset = 0u64;
    for t in tensors {
        let name = t.name();
        if !seen.insert(name) {
            return Err(Error::msg(format!("tensor '{name}' is planned twice")));
        }
        let storage = t.storage();
        let block = storage.block_len();
        let row = t.shape().last().copied();
        if block > 1 && row.is_none_or(|r| r % block != 0) {
            return Err(Error::msg(format!(
                "tensor '{name}': rows of {} values are not whole {} blocks of {block}",
                row.map_or("no".to_string(), |r| r.to_string()),
                storage.name().to_uppercase()
            )));
        }
        let numel = t.shape().iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        let bytes = numel.and_then(|n| (n / block).checked_mul(storage.block_bytes()));
        let Some(bytes) = bytes else {
            return Err(Error::msg(format!("tensor '{name}': shape {:?} is too large", t.shape())));
        };
        put_str(&mut out, name);
        out.extend_from_slice(&(t.shape().len() as u32).to_le_bytes());
        for &d in t.shape().iter().rev() {
            out.extend_from_slice(&(d as u64).to_le_bytes());
        }
        out.extend_from_slice(&storage.id().to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        offset += pad(bytes as u64);
    }
    out.resize(pad(out.len() as u64) as usize, 0);
    Ok(out)
}

enum WriteError {
    Io(std::io::Error),
    Kind(String),
}

impl From<std::io::Error> for WriteError {
    fn from(e: std::io::Error) -> Self {
        WriteError::Io(e)
    }
}

/// Encodes and writes `values` in `storage`, a chunk at a time; returns the
/// bytes written.
fn write_values(out: &mut impl Write, name: &str, storage: GgmlType, values: &Values, chunk: &mut Vec<u8>) -> Result<u64, WriteError> {
    let bytes = match (values, storage) {
        (Values::F32(a), s) if s.is_float() => encode_chunks(out, a, chunk, |part, buf| s.encode_into(part, buf))?,
        (Values::I32(a), GgmlType::I32) => encode_chunks(out, a, chunk, |part, buf| part.iter().for_each(|v| buf.extend_from_slice(&v.to_le_bytes())))?,
        (Values::I16(a), GgmlType::I16) => encode_chunks(out, a, chunk, |part, buf| part.iter().for_each(|v| buf.extend_from_slice(&v.to_le_bytes())))?,
        (v, s) => return Err(WriteError::Kind(format!("tensor '{name}': produced {} values for {} storage", v.kind(), s.name().to_uppercase()))),
    };
    Ok(bytes)
}

/// Writes `a` encoded by `encode` (a chunk of values appended to the buffer
/// as bytes), a chunk at a time through the reused `chunk`; returns the
/// bytes written.
fn encode_chunks<T: Copy>(out: &mut impl Write, a: &ArrayD<T>, chunk: &mut Vec<u8>, encode: impl Fn(&[T], &mut Vec<u8>)) -> std::io::Result<u64> {
    let mut bytes = 0u64;
    for_chunks(a, |part| {
        chunk.clear();
        encode(part, chunk);
        bytes += chunk.len() as u64;
        out.write_all(chunk)
    })?;
    Ok(bytes)
}

/// `a`'s values in row-major order, [`CHUNK`] at a time (a slice of the
/// array when it is in standard layout, else a small copy).
fn for_chunks<T: Copy>(a: &ArrayD<T>, mut f: impl FnMut(&[T]) -> std::io::Result<()>) -> std::io::Result<()> {
    if let Some(all) = a.as_slice() {
        return all.chunks(CHUNK).try_for_each(f);
    }
    let mut buf = Vec::with_capacity(CHUNK.min(a.len()));
    for &v in a.iter() {
        buf.push(v);
        if buf.len() == CHUNK {
            f(&buf)?;
            buf.clear();
        }
    }
    if !buf.is_empty() {
        f(&buf)?;
    }
    Ok(())
}
