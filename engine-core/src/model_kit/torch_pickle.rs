//! A restricted reader of PyTorch `.pt` checkpoints (the zip format
//! `torch.save` has written since torch 1.6): `DIR/data.pkl`, a pickle that
//! describes the objects, and `DIR/data/KEY`, one entry per storage.
//!
//! A pickle is a program: unpickled by Python, `GLOBAL os system` followed by
//! `REDUCE` runs a shell command. This reader is a small pickle machine that
//! evaluates only the opcodes `torch.save` emits and resolves only the
//! globals a state dict or Chatterbox's `conds.pt` needs ([`ALLOWED_GLOBALS`]):
//! `collections.OrderedDict`, `torch._utils._rebuild_tensor_v2`,
//! `torch._utils._rebuild_parameter` and the typed storages
//! (`torch.FloatStorage`, …). Any other global (`os.system`, `posix.system`,
//! `builtins.eval`, …) stops the reading at that opcode with one line naming
//! the file and the global; nothing is called, since nothing in Rust can be,
//! and nothing is read from the storages before the whole pickle was accepted.
//! `REDUCE` applies only the allowed callables, `BUILD` only sets a dict's
//! attributes (a state dict's `_metadata`), and the opcodes that make
//! arbitrary instances (`INST`, `OBJ`, `NEWOBJ`, `EXT*`) are refused.
//!
//! Bounded by the file: the pickle entry is read up to [`MAX_PICKLE`] bytes,
//! no length field is trusted beyond the bytes that remain, every object the
//! machine makes lives in one arena indexed by memo and stack (each opcode
//! makes at most one, so both are bounded by the pickle's length), the tree
//! the pickle builds is walked at most [`MAX_DEPTH`] deep and visits at most
//! as many nodes as the pickle has bytes, and no tensor is larger than the
//! file itself (a zero-stride view of a few bytes cannot ask for gigabytes).
//!
//! Why not a crate: `candle-core` has a torch pickle reader (`candle_core::pickle`)
//! but it is a module of the whole tensor library, far too heavy for this;
//! `serde-pickle` is well kept but resolves only a fixed set of builtins and
//! has no persistent ids, so torch's storages cannot be read through it;
//! `repugnant-pickle` (0.0.1, "best-effort scraping") evaluates any global to
//! a stand-in value instead of refusing it and is not maintained. The zip
//! container is read with the `zip` crate, stored entries only (torch.save
//! never compresses), and half floats convert with `half`.

use super::error::{Error, Result};
use super::files::{caps, open_regular};
use indexmap::IndexMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The most bytes a `data.pkl` may hold (a 1,500-tensor state dict's is
/// ~200 KB).
pub const MAX_PICKLE: u64 = 64 << 20;
/// The deepest nesting of dicts, lists and tuples walked.
pub const MAX_DEPTH: usize = 64;
/// The most dimensions a tensor may have.
pub const MAX_DIMS: usize = 16;

/// Every global a pickle may name; any other is refused by name.
pub const ALLOWED_GLOBALS: [&str; 14] = [
    "collections.OrderedDict",
    "torch._utils._rebuild_tensor_v2",
    "torch._utils._rebuild_parameter",
    "torch.FloatStorage",
    "torch.DoubleStorage",
    "torch.HalfStorage",
    "torch.BFloat16Storage",
    "torch.LongStorage",
    "torch.IntStorage",
    "torch.ShortStorage",
    "torch.CharStorage",
    "torch.ByteStorage",
    "torch.BoolStorage",
    // Written by torch.save for `torch.Size` arguments in some versions.
    "torch.Size",
];

/// A storage's element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    F32,
    F64,
    F16,
    BF16,
    I64,
    I32,
    I16,
    I8,
    U8,
    Bool,
}

impl DType {
    fn from_storage(name: &str) -> Option<DType> {
        Some(match name {
            "torch.FloatStorage" => DType::F32,
            "torch.DoubleStorage" => DType::F64,
            "torch.HalfStorage" => DType::F16,
            "torch.BFloat16Storage" => DType::BF16,
            "torch.LongStorage" => DType::I64,
            "torch.IntStorage" => DType::I32,
            "torch.ShortStorage" => DType::I16,
            "torch.CharStorage" => DType::I8,
            "torch.ByteStorage" => DType::U8,
            "torch.BoolStorage" => DType::Bool,
            _ => return None,
        })
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 | DType::I16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F64 => "F64",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::I64 => "I64",
            DType::I32 => "I32",
            DType::I16 => "I16",
            DType::I8 => "I8",
            DType::U8 => "U8",
            DType::Bool => "BOOL",
        }
    }
}

/// One tensor as the pickle describes it: a view (`shape`, `strides` and
/// `offset`, in elements) of the storage entry `data/{storage}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
    pub offset: usize,
    pub storage: String,
}

impl TensorInfo {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A value in the checkpoint that is not a tensor (`conds.pt` holds `None`
/// for absent conditionals; a checkpoint may hold step counts or rates).
#[derive(Debug, Clone, PartialEq)]
pub enum Scalar {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

/// An opened `.pt` file: its tensors and other values by dotted name
/// (`t3.speaker_emb`, `gen.prompt_token`, `flow.encoder.embed.weight`), in the
/// pickle's order.
pub struct PtFile {
    path: PathBuf,
    file: File,
    file_len: u64,
    prefix: String,
    tensors: IndexMap<String, TensorInfo>,
    values: IndexMap<String, Scalar>,
    /// Per storage key: the byte offset of its data in the file and its length.
    storages: IndexMap<String, (u64, u64)>,
}

impl std::fmt::Debug for PtFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PtFile").field("path", &self.path).field("tensors", &self.tensors.len()).finish()
    }
}

impl PtFile {
    /// Opens `path` (a regular file of at most [`caps::PT`] bytes), reads and
    /// checks its pickle, and checks that every tensor lies inside its
    /// storage; errors are one line starting with the path.
    pub fn open(path: &Path) -> Result<PtFile> {
        let at = |what: String| Error::msg(format!("{}: {what}", path.display()));
        let file = open_regular(path, "", caps::PT).map_err(Error::msg)?;
        let file_len = file.metadata().map_err(|e| at(e.to_string()))?.len();
        let reader = file.try_clone().map_err(|e| at(e.to_string()))?;
        let mut zip = zip::ZipArchive::new(reader).map_err(|e| at(format!("not a torch zip checkpoint ({e})")))?;

        let mut pkl_names: Vec<String> =
            zip.file_names().filter_map(|n| n.ok().map(|n| n.into_owned())).filter(|n| n.ends_with("/data.pkl") && n.matches('/').count() == 1).collect();
        pkl_names.sort();
        let pkl_name = match pkl_names.as_slice() {
            [one] => one.clone(),
            [] => return Err(at("no data.pkl in the archive: not a torch.save checkpoint".into())),
            _ => return Err(at(format!("{} data.pkl entries in the archive; a checkpoint has one", pkl_names.len()))),
        };
        let prefix = pkl_name.trim_end_matches("data.pkl").to_string();

        if let Some(i) = zip.index_for_name(&format!("{prefix}byteorder")) {
            let entry = zip.by_index(i).map_err(|e| at(format!("{prefix}byteorder: {e}")))?;
            let order = super::files::read_capped(entry, &format!("{}: {prefix}byteorder", path.display()), 16).map_err(Error::msg)?;
            if order != b"little" {
                return Err(at(format!("byte order '{}' is not supported (only little-endian)", String::from_utf8_lossy(&order))));
            }
        }

        let pickle = {
            let entry = zip.by_name(&pkl_name).map_err(|e| at(format!("{pkl_name}: {e}")))?;
            if entry.size() > MAX_PICKLE || entry.size() > file_len {
                return Err(at(format!("{pkl_name} declares {} bytes; the most a checkpoint's pickle may be is {MAX_PICKLE}", entry.size())));
            }
            let cap = entry.size();
            super::files::read_capped(entry, &format!("{}: {pkl_name}", path.display()), cap).map_err(Error::msg)?
        };

        let mut vm = Machine::new(&pickle);
        let root = vm.run().map_err(|e| at(format!("{pkl_name}: {e}")))?;
        let mut walk = Walk { vm: &vm, tensors: IndexMap::new(), values: IndexMap::new(), storage_types: IndexMap::new(), visits: 0, name_bytes: 0 };
        walk.root(root).map_err(|e| at(format!("{pkl_name}: {e}")))?;
        let Walk { tensors, values, storage_types, .. } = walk;

        // Where each storage's bytes are, and that each tensor fits in its own.
        let mut storages = IndexMap::new();
        for (key, &(numel, dtype)) in &storage_types {
            let name = format!("{prefix}data/{key}");
            let entry = zip.by_name(&name).map_err(|e| at(format!("storage {name}: {e}")))?;
            if entry.compression() != zip::CompressionMethod::Stored {
                return Err(at(format!("storage {name} is compressed ({}); torch.save stores entries uncompressed", entry.compression())));
            }
            let start = entry.data_start().ok_or_else(|| at(format!("storage {name}: no data offset")))?;
            let len = entry.size();
            if start.checked_add(len).is_none_or(|end| end > file_len) {
                return Err(at(format!("storage {name} runs past the end of the file (truncated?)")));
            }
            // A tensor may use only elements both declared and present.
            let present = (numel as u64).min(len / dtype.size() as u64);
            storages.insert(key.clone(), (start, len, present));
        }
        for (name, t) in &tensors {
            let (_, len, present) = storages[&t.storage];
            check_view(t, present, len, file_len).map_err(|e| at(format!("tensor '{name}': {e}")))?;
        }
        let storages = storages.into_iter().map(|(k, (start, len, _))| (k, (start, len))).collect();
        Ok(PtFile { path: path.to_path_buf(), file, file_len, prefix, tensors, values, storages })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tensors by dotted name, in the pickle's order.
    pub fn tensors(&self) -> &IndexMap<String, TensorInfo> {
        &self.tensors
    }

    /// The values that are not tensors (None, bools, ints, floats, strings).
    pub fn values(&self) -> &IndexMap<String, Scalar> {
        &self.values
    }

    /// `name`'s elements in row-major order of its shape, as little-endian
    /// bytes of its dtype (a strided or offset view is gathered).
    pub fn read_bytes(&self, name: &str) -> Result<Vec<u8>> {
        let at = |what: String| Error::msg(format!("{}: tensor '{name}': {what}", self.path.display()));
        let t = self.tensors.get(name).ok_or_else(|| Error::msg(format!("{}: no tensor '{name}'", self.path.display())))?;
        let es = t.dtype.size();
        let numel = t.numel();
        if numel == 0 {
            return Ok(Vec::new());
        }
        let (start, len) = self.storages[&t.storage];
        // The span of storage elements the view touches (checked at open).
        let last = t.offset + t.shape.iter().zip(&t.strides).map(|(d, s)| (d - 1) * s).sum::<usize>();
        let span_bytes = (last + 1 - t.offset) * es;
        let first_byte = (t.offset * es) as u64;
        if first_byte + span_bytes as u64 > len {
            return Err(at(format!("needs bytes up to {} of storage {}, which has {len}", first_byte + span_bytes as u64, t.storage)));
        }
        let mut span = vec![0u8; span_bytes];
        self.file.read_exact_at(&mut span, start + first_byte).map_err(|e| at(format!("reading storage {}{}: {e}", self.prefix, t.storage)))?;
        if is_contiguous(t) {
            return Ok(span);
        }
        let mut out = Vec::with_capacity(numel * es);
        let mut index = vec![0usize; t.shape.len()];
        for _ in 0..numel {
            let at_elem: usize = index.iter().zip(&t.strides).map(|(i, s)| i * s).sum();
            out.extend_from_slice(&span[at_elem * es..(at_elem + 1) * es]);
            for d in (0..index.len()).rev() {
                index[d] += 1;
                if index[d] < t.shape[d] {
                    break;
                }
                index[d] = 0;
            }
        }
        Ok(out)
    }

    /// `name`'s elements as f32 (F32, F16 and BF16 exactly; F64 rounded).
    pub fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        match self.dtype_of(name)? {
            DType::F32 => self.read_converted(name, |c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            DType::F16 => self.read_converted(name, |c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()),
            DType::BF16 => self.read_converted(name, |c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()),
            DType::F64 => self.read_converted(name, |c| f64::from_le_bytes(c.try_into().unwrap()) as f32),
            other => Err(Error::msg(format!("{}: tensor '{name}' is {}, not a float tensor", self.path.display(), other.name()))),
        }
    }

    /// `name`'s elements as i64 (I64, I32, I16, I8, U8 and BOOL).
    pub fn read_i64(&self, name: &str) -> Result<Vec<i64>> {
        match self.dtype_of(name)? {
            DType::I64 => self.read_converted(name, |c| i64::from_le_bytes(c.try_into().unwrap())),
            DType::I32 => self.read_converted(name, |c| i32::from_le_bytes(c.try_into().unwrap()) as i64),
            DType::I16 => self.read_converted(name, |c| i16::from_le_bytes([c[0], c[1]]) as i64),
            DType::I8 => self.read_converted(name, |c| c[0] as i8 as i64),
            DType::U8 | DType::Bool => self.read_converted(name, |c| c[0] as i64),
            other => Err(Error::msg(format!("{}: tensor '{name}' is {}, not an integer tensor", self.path.display(), other.name()))),
        }
    }

    fn dtype_of(&self, name: &str) -> Result<DType> {
        self.tensors.get(name).map(|t| t.dtype).ok_or_else(|| Error::msg(format!("{}: no tensor '{name}'", self.path.display())))
    }

    /// `name`'s elements, each converted from its little-endian bytes. A
    /// contiguous tensor (what a state dict holds) is read from the file in
    /// pieces straight into the result, so reading a tensor allocates that
    /// tensor only; a strided view is gathered through [`PtFile::read_bytes`].
    fn read_converted<T>(&self, name: &str, convert: impl Fn(&[u8]) -> T) -> Result<Vec<T>> {
        let t = &self.tensors[name];
        let es = t.dtype.size();
        if !is_contiguous(t) {
            return Ok(self.read_bytes(name)?.chunks_exact(es).map(convert).collect());
        }
        let at = |what: String| Error::msg(format!("{}: tensor '{name}': {what}", self.path.display()));
        let total = (t.numel() * es) as u64;
        let (start, len) = self.storages[&t.storage];
        let first = (t.offset * es) as u64;
        if first + total > len {
            return Err(at(format!("needs bytes up to {} of storage {}, which has {len}", first + total, t.storage)));
        }
        let mut out = Vec::with_capacity(t.numel());
        // 64 KiB pieces (a multiple of every element size): few enough
        // reads, and next to nothing beside the values.
        let mut piece = vec![0u8; total.min(1 << 16) as usize];
        let mut done = 0u64;
        while done < total {
            let n = (total - done).min(piece.len() as u64) as usize;
            self.file.read_exact_at(&mut piece[..n], start + first + done).map_err(|e| at(format!("reading storage {}{}: {e}", self.prefix, t.storage)))?;
            out.extend(piece[..n].chunks_exact(es).map(&convert));
            done += n as u64;
        }
        Ok(out)
    }

    /// The file's size in bytes.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }
}

fn is_contiguous(t: &TensorInfo) -> bool {
    let mut expected = 1usize;
    for (d, s) in t.shape.iter().zip(&t.strides).rev() {
        if *d != 1 && *s != expected {
            return false;
        }
        expected *= d;
    }
    true
}

/// `t` lies inside the `storage_numel` elements its storage holds (an entry
/// of `entry_len` bytes) and is no larger than the file (`file_len` bytes).
fn check_view(t: &TensorInfo, storage_numel: u64, entry_len: u64, file_len: u64) -> std::result::Result<(), String> {
    let es = t.dtype.size() as u64;
    let mut numel: u64 = 1;
    for &d in &t.shape {
        numel = numel.checked_mul(d as u64).ok_or("its shape overflows")?;
    }
    if numel.checked_mul(es).is_none_or(|b| b > file_len) {
        return Err(format!("shape {:?} of {} needs more bytes than the whole file holds ({file_len})", t.shape, t.dtype.name()));
    }
    if numel == 0 {
        return if t.offset as u64 <= storage_numel { Ok(()) } else { Err(format!("offset {} is past the storage's {storage_numel} elements", t.offset)) };
    }
    let mut last = t.offset as u64;
    for (&d, &s) in t.shape.iter().zip(&t.strides) {
        last = (d as u64 - 1).checked_mul(s as u64).and_then(|x| x.checked_add(last)).ok_or("its strides overflow")?;
    }
    if last >= storage_numel {
        return Err(format!(
            "shape {:?}, strides {:?} and offset {} reach element {last} of storage {}, which holds {storage_numel} ({entry_len} bytes): the storage is too short",
            t.shape, t.strides, t.offset, t.storage
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The pickle machine.

/// A value on the stack or in the memo: small and copied freely; containers
/// and strings live in the machine's arena, so a memo hit never copies data.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Global(usize),
    Obj(usize),
}

#[derive(Debug)]
enum Obj {
    Str(String),
    Tuple(Vec<Value>),
    List(Vec<Value>),
    Dict(Vec<(Value, Value)>),
    Storage { dtype: DType, key: String },
    Tensor(TensorInfo),
}

/// The allowed global at `ALLOWED_GLOBALS[i]`.
fn allowed(module: &str, name: &str) -> Option<usize> {
    let full = format!("{module}.{name}");
    ALLOWED_GLOBALS.iter().position(|g| *g == full)
}

struct Machine<'a> {
    code: &'a [u8],
    pos: usize,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: std::collections::HashMap<u32, Value>,
    arena: Vec<Obj>,
    /// Per storage key: its element count and type, as its persistent id said.
    storages: IndexMap<String, (usize, DType)>,
}

type Step<T> = std::result::Result<T, String>;

impl<'a> Machine<'a> {
    fn new(code: &'a [u8]) -> Self {
        Machine { code, pos: 0, stack: Vec::new(), marks: Vec::new(), memo: Default::default(), arena: Vec::new(), storages: IndexMap::new() }
    }

    fn take(&mut self, n: usize) -> Step<&'a [u8]> {
        let code: &'a [u8] = self.code;
        if n > code.len() - self.pos {
            return Err(format!("truncated pickle: needs {n} bytes at offset {}, {} remain", self.pos, code.len() - self.pos));
        }
        let bytes = &code[self.pos..self.pos + n];
        self.pos += n;
        Ok(bytes)
    }

    fn u8(&mut self) -> Step<u8> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Step<u16> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Step<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Step<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }

    fn line(&mut self) -> Step<&'a str> {
        let rest = &self.code[self.pos..];
        let n = rest.iter().position(|&b| b == b'\n').ok_or("truncated pickle: a GLOBAL name has no end of line")?;
        let s = std::str::from_utf8(&rest[..n]).map_err(|_| "a GLOBAL name is not UTF-8")?;
        self.pos += n + 1;
        Ok(s)
    }

    fn alloc(&mut self, obj: Obj) -> Value {
        self.arena.push(obj);
        Value::Obj(self.arena.len() - 1)
    }

    fn pop(&mut self) -> Step<Value> {
        if self.marks.last().is_some_and(|&m| m >= self.stack.len()) {
            return Err("pickle pops past a MARK".into());
        }
        self.stack.pop().ok_or_else(|| "pickle pops an empty stack".into())
    }

    fn top(&mut self) -> Step<Value> {
        self.stack.last().copied().ok_or_else(|| "pickle reads an empty stack".into())
    }

    fn pop_mark(&mut self) -> Step<Vec<Value>> {
        let m = self.marks.pop().ok_or("pickle has no MARK to pop to")?;
        Ok(self.stack.split_off(m))
    }

    fn str_of(&self, v: Value) -> Option<&str> {
        match v {
            Value::Obj(i) => match &self.arena[i] {
                Obj::Str(s) => Some(s),
                _ => None,
            },
            _ => None,
        }
    }

    fn string(&mut self, n: usize) -> Step<Value> {
        let b = self.take(n)?;
        let s = std::str::from_utf8(b).map_err(|_| format!("a string at offset {} is not UTF-8", self.pos - n))?.to_string();
        Ok(self.alloc(Obj::Str(s)))
    }

    fn global(&mut self, module: &str, name: &str) -> Step<Value> {
        match allowed(module, name) {
            Some(i) => Ok(Value::Global(i)),
            None => Err(format!("refused global {module}.{name}: a checkpoint may only name {}", "torch tensors, storages and ordered dicts")),
        }
    }

    fn memo_put(&mut self, key: u32) -> Step<()> {
        let v = self.top()?;
        self.memo.insert(key, v);
        Ok(())
    }

    fn memo_get(&mut self, key: u32) -> Step<()> {
        let v = *self.memo.get(&key).ok_or_else(|| format!("pickle reads memo entry {key}, which was never written"))?;
        self.stack.push(v);
        Ok(())
    }

    fn items_of(&mut self, target: Value, what: &str) -> Step<usize> {
        match target {
            Value::Obj(i) if matches!(self.arena[i], Obj::Dict(_)) && what == "dict" => Ok(i),
            Value::Obj(i) if matches!(self.arena[i], Obj::List(_)) && what == "list" => Ok(i),
            _ => Err(format!("pickle adds items to something that is not a {what}")),
        }
    }

    fn set_items(&mut self, kv: Vec<Value>) -> Step<()> {
        if !kv.len().is_multiple_of(2) {
            return Err("SETITEMS with an odd number of values".into());
        }
        let target = self.top()?;
        let i = self.items_of(target, "dict")?;
        let Obj::Dict(items) = &mut self.arena[i] else { unreachable!() };
        items.extend(kv.chunks_exact(2).map(|p| (p[0], p[1])));
        Ok(())
    }

    fn append(&mut self, vals: Vec<Value>) -> Step<()> {
        let target = self.top()?;
        let i = self.items_of(target, "list")?;
        let Obj::List(items) = &mut self.arena[i] else { unreachable!() };
        items.extend(vals);
        Ok(())
    }

    fn tuple_items(&self, v: Value) -> Option<&[Value]> {
        match v {
            Value::Obj(i) => match &self.arena[i] {
                Obj::Tuple(t) => Some(t),
                _ => None,
            },
            _ => None,
        }
    }

    fn dims(&self, v: Value, what: &str) -> Step<Vec<usize>> {
        let items = self.tuple_items(v).ok_or_else(|| format!("a tensor's {what} is not a tuple"))?;
        if items.len() > MAX_DIMS {
            return Err(format!("a tensor has {} dimensions; the most is {MAX_DIMS}", items.len()));
        }
        items
            .iter()
            .map(|d| match d {
                Value::Int(n) if *n >= 0 => usize::try_from(*n).map_err(|_| format!("a tensor's {what} {n} is too large")),
                other => Err(format!("a tensor's {what} holds {other:?}, not a non-negative int")),
            })
            .collect()
    }

    /// `REDUCE`: an allowed callable applied to its arguments.
    fn reduce(&mut self, func: Value, args: Value) -> Step<Value> {
        let Value::Global(g) = func else {
            return Err("REDUCE on something that is not a global".into());
        };
        let args: Vec<Value> = self.tuple_items(args).ok_or("REDUCE's arguments are not a tuple")?.to_vec();
        match ALLOWED_GLOBALS[g] {
            "collections.OrderedDict" => {
                if !args.is_empty() {
                    return Err("OrderedDict called with arguments".into());
                }
                Ok(self.alloc(Obj::Dict(Vec::new())))
            }
            "torch.Size" => {
                let [dims] = args.as_slice() else { return Err("torch.Size takes one tuple".into()) };
                let dims = self.tuple_items(*dims).ok_or("torch.Size of something that is not a tuple")?.to_vec();
                Ok(self.alloc(Obj::Tuple(dims)))
            }
            "torch._utils._rebuild_tensor_v2" => {
                if !(6..=7).contains(&args.len()) {
                    return Err(format!("_rebuild_tensor_v2 takes 6 or 7 arguments, not {}", args.len()));
                }
                let (dtype, key) = match args[0] {
                    Value::Obj(i) => match &self.arena[i] {
                        Obj::Storage { dtype, key } => (*dtype, key.clone()),
                        _ => return Err("_rebuild_tensor_v2's first argument is not a storage".into()),
                    },
                    _ => return Err("_rebuild_tensor_v2's first argument is not a storage".into()),
                };
                let offset = match args[1] {
                    Value::Int(n) if n >= 0 => n as usize,
                    _ => return Err("a tensor's storage offset is not a non-negative int".into()),
                };
                let shape = self.dims(args[2], "size")?;
                let strides = self.dims(args[3], "stride")?;
                if shape.len() != strides.len() {
                    return Err(format!("a tensor has {} sizes but {} strides", shape.len(), strides.len()));
                }
                Ok(self.alloc(Obj::Tensor(TensorInfo { dtype, shape, strides, offset, storage: key })))
            }
            "torch._utils._rebuild_parameter" => {
                let [data, _requires_grad, _hooks] = args.as_slice() else {
                    return Err(format!("_rebuild_parameter takes 3 arguments, not {}", args.len()));
                };
                match data {
                    Value::Obj(i) if matches!(self.arena[*i], Obj::Tensor(_)) => Ok(*data),
                    _ => Err("_rebuild_parameter of something that is not a tensor".into()),
                }
            }
            other => Err(format!("{other} is not callable")),
        }
    }

    /// `BINPERSID`: torch's `('storage', StorageType, key, location, numel)`.
    fn persistent(&mut self, pid: Value) -> Step<Value> {
        let items = self.tuple_items(pid).ok_or("a persistent id is not a tuple")?.to_vec();
        let [tag, ty, key, _location, numel] = items.as_slice() else {
            return Err(format!("a persistent id has {} fields, not torch's 5", items.len()));
        };
        if self.str_of(*tag) != Some("storage") {
            return Err("a persistent id is not a storage".into());
        }
        let dtype = match ty {
            Value::Global(g) => DType::from_storage(ALLOWED_GLOBALS[*g]).ok_or_else(|| format!("{} is not a storage type", ALLOWED_GLOBALS[*g]))?,
            _ => return Err("a storage's type is not a storage class".into()),
        };
        let key = self.str_of(*key).ok_or("a storage key is not a string")?.to_string();
        if key.is_empty() || key.len() > 64 || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(format!("storage key {key:?} is not a plain name"));
        }
        let numel = match numel {
            Value::Int(n) if *n >= 0 => *n as usize,
            _ => return Err("a storage's size is not a non-negative int".into()),
        };
        match self.storages.get(&key) {
            Some(&(n, d)) if (n, d) != (numel, dtype) => {
                return Err(format!("storage {key} is declared as both {n} {} and {numel} {} elements", d.name(), dtype.name()));
            }
            _ => {
                self.storages.insert(key.clone(), (numel, dtype));
            }
        }
        Ok(self.alloc(Obj::Storage { dtype, key }))
    }

    fn run(&mut self) -> Step<Value> {
        loop {
            let at = self.pos;
            let op = self.u8().map_err(|_| "truncated pickle: no STOP".to_string())?;
            match op {
                0x80 => {
                    let proto = self.u8()?;
                    if proto > 5 {
                        return Err(format!("pickle protocol {proto} is not supported"));
                    }
                }
                0x95 => {
                    self.u64()?; // FRAME: a length hint only
                }
                b'.' => {
                    let v = self.pop()?;
                    if !self.stack.is_empty() || !self.marks.is_empty() {
                        return Err("pickle leaves values on the stack at STOP".into());
                    }
                    return Ok(v);
                }
                b'(' => self.marks.push(self.stack.len()),
                b'0' => {
                    self.pop()?;
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let v = self.top()?;
                    self.stack.push(v);
                }
                b'N' => self.stack.push(Value::None),
                0x88 => self.stack.push(Value::Bool(true)),
                0x89 => self.stack.push(Value::Bool(false)),
                b'J' => {
                    let v = self.u32()? as i32;
                    self.stack.push(Value::Int(v as i64));
                }
                b'K' => {
                    let v = self.u8()?;
                    self.stack.push(Value::Int(v as i64));
                }
                b'M' => {
                    let v = self.u16()?;
                    self.stack.push(Value::Int(v as i64));
                }
                0x8a => {
                    let n = self.u8()? as usize;
                    if n > 8 {
                        return Err(format!("an integer of {n} bytes is larger than this reader takes"));
                    }
                    let b = self.take(n)?;
                    let mut buf = if b.last().is_some_and(|&x| x & 0x80 != 0) { [0xffu8; 8] } else { [0u8; 8] };
                    buf[..n].copy_from_slice(b);
                    self.stack.push(Value::Int(i64::from_le_bytes(buf)));
                }
                b'G' => {
                    let v = f64::from_be_bytes(self.take(8)?.try_into().unwrap());
                    self.stack.push(Value::Float(v));
                }
                b'X' => {
                    let n = self.u32()? as usize;
                    let v = self.string(n)?;
                    self.stack.push(v);
                }
                0x8c => {
                    let n = self.u8()? as usize;
                    let v = self.string(n)?;
                    self.stack.push(v);
                }
                0x8d => {
                    let n = usize::try_from(self.u64()?).map_err(|_| "a string's length is too large")?;
                    let v = self.string(n)?;
                    self.stack.push(v);
                }
                b'}' => {
                    let v = self.alloc(Obj::Dict(Vec::new()));
                    self.stack.push(v);
                }
                b'd' => {
                    let kv = self.pop_mark()?;
                    let v = self.alloc(Obj::Dict(Vec::new()));
                    self.stack.push(v);
                    self.set_items(kv)?;
                }
                b']' => {
                    let v = self.alloc(Obj::List(Vec::new()));
                    self.stack.push(v);
                }
                b'l' => {
                    let items = self.pop_mark()?;
                    let v = self.alloc(Obj::List(items));
                    self.stack.push(v);
                }
                b')' => {
                    let v = self.alloc(Obj::Tuple(Vec::new()));
                    self.stack.push(v);
                }
                b't' => {
                    let items = self.pop_mark()?;
                    let v = self.alloc(Obj::Tuple(items));
                    self.stack.push(v);
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    if self.stack.len() < n || self.marks.last().is_some_and(|&m| m > self.stack.len() - n) {
                        return Err(format!("TUPLE{n} on a stack of fewer values"));
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    let v = self.alloc(Obj::Tuple(items));
                    self.stack.push(v);
                }
                b's' => {
                    let value = self.pop()?;
                    let key = self.pop()?;
                    self.set_items(vec![key, value])?;
                }
                b'u' => {
                    let kv = self.pop_mark()?;
                    self.set_items(kv)?;
                }
                b'a' => {
                    let v = self.pop()?;
                    self.append(vec![v])?;
                }
                b'e' => {
                    let vals = self.pop_mark()?;
                    self.append(vals)?;
                }
                b'q' => {
                    let k = self.u8()? as u32;
                    self.memo_put(k)?;
                }
                b'r' => {
                    let k = self.u32()?;
                    self.memo_put(k)?;
                }
                0x94 => {
                    let k = self.memo.len() as u32;
                    self.memo_put(k)?;
                }
                b'h' => {
                    let k = self.u8()? as u32;
                    self.memo_get(k)?;
                }
                b'j' => {
                    let k = self.u32()?;
                    self.memo_get(k)?;
                }
                b'c' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    let v = self.global(module, name)?;
                    self.stack.push(v);
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    let (Some(module), Some(name)) = (self.str_of(module).map(str::to_string), self.str_of(name).map(str::to_string)) else {
                        return Err("STACK_GLOBAL of values that are not strings".into());
                    };
                    let v = self.global(&module, &name)?;
                    self.stack.push(v);
                }
                b'Q' => {
                    let pid = self.pop()?;
                    let v = self.persistent(pid)?;
                    self.stack.push(v);
                }
                b'R' => {
                    let args = self.pop()?;
                    let func = self.pop()?;
                    let v = self.reduce(func, args)?;
                    self.stack.push(v);
                }
                b'b' => {
                    // A dict's attributes (a state dict's `_metadata`): kept
                    // nowhere, since no tensor depends on them.
                    let state = self.pop()?;
                    let target = self.top()?;
                    let is_dict = |v: Value| matches!(v, Value::Obj(i) if matches!(self.arena[i], Obj::Dict(_)));
                    if !is_dict(target) || !(is_dict(state) || state == Value::None) {
                        return Err("BUILD on something other than a dict".into());
                    }
                }
                other => {
                    return Err(format!("opcode 0x{other:02x} at offset {at} is not one torch.save writes for tensors (refused)"));
                }
            }
        }
    }
}

/// The walk from the pickle's root to named tensors and values.
struct Walk<'m, 'a> {
    vm: &'m Machine<'a>,
    tensors: IndexMap<String, TensorInfo>,
    values: IndexMap<String, Scalar>,
    /// Per storage key: its element count and type.
    storage_types: IndexMap<String, (usize, DType)>,
    visits: usize,
    name_bytes: usize,
}

impl Walk<'_, '_> {
    fn root(&mut self, root: Value) -> Step<()> {
        match root {
            Value::Obj(i) if matches!(self.vm.arena[i], Obj::Dict(_)) => self.node("", root, 0),
            _ => Err("the pickle's top object is not a dict of tensors".into()),
        }
    }

    fn name(&mut self, prefix: &str, key: &str) -> Step<String> {
        let name = if prefix.is_empty() { key.to_string() } else { format!("{prefix}.{key}") };
        self.name_bytes += name.len();
        // Names repeated through the memo could otherwise grow without bound.
        if self.name_bytes > 4 * self.vm.code.len() + (1 << 20) {
            return Err("the pickle's names add up to more than its size allows".into());
        }
        Ok(name)
    }

    fn node(&mut self, name: &str, v: Value, depth: usize) -> Step<()> {
        self.visits += 1;
        if self.visits > self.vm.code.len() {
            return Err("the pickle's objects are shared more often than its size allows".into());
        }
        if depth > MAX_DEPTH {
            return Err(format!("the pickle nests deeper than {MAX_DEPTH} levels at '{name}'"));
        }
        let scalar = match v {
            Value::None => Some(Scalar::None),
            Value::Bool(b) => Some(Scalar::Bool(b)),
            Value::Int(n) => Some(Scalar::Int(n)),
            Value::Float(x) => Some(Scalar::Float(x)),
            Value::Global(g) => return Err(format!("'{name}' is the global {}, not a value", ALLOWED_GLOBALS[g])),
            Value::Obj(_) => None,
        };
        if let Some(s) = scalar {
            self.values.insert(name.to_string(), s);
            return Ok(());
        }
        let Value::Obj(i) = v else { unreachable!() };
        match &self.vm.arena[i] {
            Obj::Str(s) => {
                self.values.insert(name.to_string(), Scalar::Str(s.clone()));
            }
            Obj::Tensor(t) => {
                // Every tensor was made from a storage's persistent id.
                let declared = self.vm.storages[&t.storage];
                self.storage_types.insert(t.storage.clone(), declared);
                self.tensors.insert(name.to_string(), t.clone());
            }
            Obj::Dict(items) => {
                for &(k, v) in items {
                    let key = match k {
                        Value::Int(n) => n.to_string(),
                        _ => self.vm.str_of(k).ok_or_else(|| format!("a key under '{name}' is not a string"))?.to_string(),
                    };
                    let child = self.name(name, &key)?;
                    self.node(&child, v, depth + 1)?;
                }
            }
            Obj::List(items) | Obj::Tuple(items) => {
                for (n, &v) in items.iter().enumerate() {
                    let child = self.name(name, &n.to_string())?;
                    self.node(&child, v, depth + 1)?;
                }
            }
            Obj::Storage { .. } => return Err(format!("'{name}' is a bare storage, not a tensor")),
        }
        Ok(())
    }
}
