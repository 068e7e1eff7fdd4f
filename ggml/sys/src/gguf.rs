//! GGUF reading: metadata (typed key lookups) and tensor descriptors.
//! Model plugins read every dimension through this, never from constants.

use crate::{cstr_to_string, err, sys, Result};
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

/// The kind of a directory, FIFO, device or socket as errors name it ("a
/// FIFO"); `None` for a regular file (and any other kind).
pub fn non_regular_kind(kind: std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_dir() {
        Some("a directory")
    } else if kind.is_fifo() {
        Some("a FIFO")
    } else if kind.is_char_device() {
        Some("a character device")
    } else if kind.is_block_device() {
        Some("a block device")
    } else if kind.is_socket() {
        Some("a socket")
    } else {
        None
    }
}

/// Refuses, with the real reason, a model path that is not a readable regular
/// file: missing, a directory, a FIFO or device (which ggml would block on or
/// misread), or unreadable.
pub fn check_model_path(path: &Path) -> Result<()> {
    let shown = path.display();
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return err(format!("GGUF file {shown} does not exist")),
        Err(e) => return err(format!("cannot read GGUF file {shown}: {e}")),
    };
    if let Some(what) = non_regular_kind(meta.file_type()) {
        return err(format!("GGUF file {shown} is {what}, not a regular file"));
    }
    std::fs::File::open(path).map_err(|e| crate::Error::Msg(format!("cannot read GGUF file {shown}: {e}")))?;
    Ok(())
}

/// GGUF value types (`enum gguf_type`).
const GGUF_TYPE_SIZES: [Option<u64>; 13] = [
    Some(1), // u8
    Some(1), // i8
    Some(2), // u16
    Some(2), // i16
    Some(4), // u32
    Some(4), // i32
    Some(4), // f32
    Some(1), // bool
    None,    // string
    None,    // array
    Some(8), // u64
    Some(8), // i64
    Some(8), // f64
];
const GGUF_STRING: u32 = 8;
const GGUF_ARRAY: u32 = 9;

/// Walks a GGUF header before ggml parses it and refuses what would reach an
/// assertion inside ggml instead of an error: ggml's reader accepts a tensor
/// whose element count is exactly `INT64_MAX / ne[i]` at a step where
/// `ggml_new_tensor` asserts it is smaller (found by the `gguf` fuzz target).
/// Anything else malformed is left for ggml's reader to refuse.
fn preflight(mut r: impl std::io::Read + std::io::Seek, len: u64, path: &Path) -> Result<()> {
    let fail = |what: &str| err(format!("{} is not a valid GGUF file ({what})", path.display()));
    let mut pos = 0u64;
    macro_rules! read {
        ($t:ty) => {{
            let mut b = [0u8; std::mem::size_of::<$t>()];
            if pos + b.len() as u64 > len || r.read_exact(&mut b).is_err() {
                return Ok(()); // truncated: ggml's reader says so
            }
            pos += b.len() as u64;
            <$t>::from_le_bytes(b)
        }};
    }
    macro_rules! skip {
        ($n:expr) => {{
            let n: u64 = $n;
            match pos.checked_add(n) {
                Some(end) if end <= len => {
                    // Relative: a buffered reader keeps its buffer (an absolute
                    // seek drops it, one read and one lseek per skipped name).
                    r.seek_relative((end - pos) as i64).map_err(|e| crate::Error::Msg(format!("{}: {e}", path.display())))?;
                    pos = end;
                }
                _ => return Ok(()),
            }
        }};
    }
    if read!(u32) != u32::from_le_bytes(*b"GGUF") {
        return Ok(());
    }
    if !matches!(read!(u32), 2 | 3) {
        return Ok(());
    }
    let n_tensors = read!(i64);
    let n_kv = read!(i64);
    if n_tensors < 0 || n_kv < 0 {
        return Ok(());
    }
    for _ in 0..n_kv {
        let key_len = read!(u64);
        skip!(key_len);
        let mut ty = read!(u32);
        let mut n = 1u64;
        if ty == GGUF_ARRAY {
            ty = read!(u32);
            n = read!(u64);
        }
        match ty {
            GGUF_STRING => {
                for _ in 0..n {
                    let l = read!(u64);
                    skip!(l);
                }
            }
            t => match GGUF_TYPE_SIZES.get(t as usize).copied().flatten() {
                Some(size) => skip!(n.saturating_mul(size)),
                None => return Ok(()),
            },
        }
    }
    for _ in 0..n_tensors {
        let name_len = read!(u64);
        skip!(name_len);
        let n_dims = read!(u32);
        if n_dims > 4 {
            return Ok(());
        }
        let mut ne = [1i64; 4];
        for d in ne.iter_mut().take(n_dims as usize) {
            *d = read!(i64);
        }
        if ne.iter().any(|&d| d < 0) {
            return Ok(()); // ggml's reader refuses negative sizes
        }
        // As ggml_new_tensor checks it (strictly).
        let mut count = ne[0];
        for &d in &ne[1..] {
            if d > 1 {
                if i64::MAX / d <= count {
                    return fail("a tensor has more elements than ggml can address");
                }
                count *= d;
            }
        }
        skip!(4 + 8); // type, offset
    }
    Ok(())
}

fn preflight_file(path: &Path) -> Result<()> {
    let f = std::fs::File::open(path).map_err(|e| crate::Error::Msg(format!("cannot read GGUF file {}: {e}", path.display())))?;
    let len = f.metadata().map_err(|e| crate::Error::Msg(e.to_string()))?.len();
    preflight(std::io::BufReader::new(f), len, path)
}

/// A GGUF file opened for metadata (tensor data is not read).
pub struct GgufFile {
    ptr: NonNull<sys::gguf_context>,
    path: PathBuf,
}

unsafe impl Send for GgufFile {}

/// One tensor's descriptor.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    pub ty: crate::Type,
    pub offset: usize,
    pub size: usize,
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self> {
        check_model_path(path)?;
        preflight_file(path)?;
        let c = CString::new(path.to_string_lossy().as_bytes()).map_err(|e| crate::Error::Msg(e.to_string()))?;
        let params = sys::gguf_init_params { no_alloc: true, ctx: std::ptr::null_mut() };
        match NonNull::new(unsafe { sys::gguf_init_from_file(c.as_ptr(), params) }) {
            Some(ptr) => Ok(GgufFile { ptr, path: path.to_path_buf() }),
            None => err(format!("{} is not a valid GGUF file (bad magic, truncated, or corrupt header)", path.display())),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn key_id(&self, key: &str) -> Option<i64> {
        let c = CString::new(key).ok()?;
        let id = unsafe { sys::gguf_find_key(self.ptr.as_ptr(), c.as_ptr()) };
        (id >= 0).then_some(id)
    }

    fn typed_id(&self, key: &str, want: sys::gguf_type) -> Result<i64> {
        let Some(id) = self.key_id(key) else {
            return err(format!("{}: metadata key '{key}' is missing", self.path.display()));
        };
        let got = unsafe { sys::gguf_get_kv_type(self.ptr.as_ptr(), id) };
        if got != want {
            let name = unsafe { cstr_to_string(sys::gguf_type_name(got)) };
            return err(format!("{}: metadata key '{key}' has type {name}", self.path.display()));
        }
        Ok(id)
    }

    pub fn get_str(&self, key: &str) -> Result<String> {
        let id = self.typed_id(key, sys::GGUF_TYPE_STRING)?;
        Ok(unsafe { cstr_to_string(sys::gguf_get_val_str(self.ptr.as_ptr(), id)) })
    }

    pub fn get_u32(&self, key: &str) -> Result<u32> {
        let id = self.typed_id(key, sys::GGUF_TYPE_UINT32)?;
        Ok(unsafe { sys::gguf_get_val_u32(self.ptr.as_ptr(), id) })
    }

    pub fn get_f32(&self, key: &str) -> Result<f32> {
        let id = self.typed_id(key, sys::GGUF_TYPE_FLOAT32)?;
        Ok(unsafe { sys::gguf_get_val_f32(self.ptr.as_ptr(), id) })
    }

    pub fn get_bool(&self, key: &str) -> Result<bool> {
        let id = self.typed_id(key, sys::GGUF_TYPE_BOOL)?;
        Ok(unsafe { sys::gguf_get_val_bool(self.ptr.as_ptr(), id) })
    }

    fn array_id(&self, key: &str, want: sys::gguf_type) -> Result<(i64, usize)> {
        let id = self.typed_id(key, sys::GGUF_TYPE_ARRAY)?;
        let got = unsafe { sys::gguf_get_arr_type(self.ptr.as_ptr(), id) };
        if got != want {
            let name = unsafe { cstr_to_string(sys::gguf_type_name(got)) };
            return err(format!("{}: metadata key '{key}' is an array of {name}", self.path.display()));
        }
        Ok((id, unsafe { sys::gguf_get_arr_n(self.ptr.as_ptr(), id) }))
    }

    /// An array of unsigned integers (stored as u32, or as non-negative i32 as
    /// some writers store Python ints).
    pub fn get_u32_array(&self, key: &str) -> Result<Vec<u32>> {
        let (id, n) = match self.array_id(key, sys::GGUF_TYPE_UINT32) {
            Ok(found) => found,
            Err(_) => self.array_id(key, sys::GGUF_TYPE_INT32)?,
        };
        let data = unsafe { sys::gguf_get_arr_data(self.ptr.as_ptr(), id) } as *const u32;
        let values: Vec<u32> = (0..n).map(|i| unsafe { *data.add(i) }).collect();
        if values.iter().any(|&v| v > i32::MAX as u32) {
            return err(format!("{}: metadata key '{key}' holds negative values", self.path.display()));
        }
        Ok(values)
    }

    pub fn get_str_array(&self, key: &str) -> Result<Vec<String>> {
        let (id, n) = self.array_id(key, sys::GGUF_TYPE_STRING)?;
        Ok((0..n).map(|i| unsafe { cstr_to_string(sys::gguf_get_arr_str(self.ptr.as_ptr(), id, i)) }).collect())
    }

    /// All metadata keys, in file order.
    pub fn keys(&self) -> Vec<String> {
        let n = unsafe { sys::gguf_get_n_kv(self.ptr.as_ptr()) };
        (0..n).map(|i| unsafe { cstr_to_string(sys::gguf_get_key(self.ptr.as_ptr(), i)) }).collect()
    }

    pub fn tensors(&self) -> Vec<TensorInfo> {
        let ctx = self.ptr.as_ptr();
        let n = unsafe { sys::gguf_get_n_tensors(ctx) };
        (0..n)
            .map(|i| unsafe {
                TensorInfo {
                    name: cstr_to_string(sys::gguf_get_tensor_name(ctx, i)),
                    ty: sys::gguf_get_tensor_type(ctx, i),
                    offset: sys::gguf_get_data_offset(ctx) + sys::gguf_get_tensor_offset(ctx, i),
                    size: sys::gguf_get_tensor_size(ctx, i),
                }
            })
            .collect()
    }
}

/// Metadata keys under one architecture prefix (`<arch>.<key>`), read with
/// errors as strings: what every family's hparams loader needs.
pub struct Metadata<'a> {
    file: &'a GgufFile,
    prefix: String,
}

impl<'a> Metadata<'a> {
    pub fn new(file: &'a GgufFile, arch: &str) -> Self {
        Metadata { file, prefix: format!("{arch}.") }
    }

    fn key(&self, k: &str) -> String {
        format!("{}{k}", self.prefix)
    }

    pub fn str(&self, k: &str) -> std::result::Result<String, String> {
        self.file.get_str(&self.key(k)).map_err(|e| e.to_string())
    }

    pub fn strs(&self, k: &str) -> std::result::Result<Vec<String>, String> {
        self.file.get_str_array(&self.key(k)).map_err(|e| e.to_string())
    }

    pub fn u32(&self, k: &str) -> std::result::Result<u32, String> {
        self.file.get_u32(&self.key(k)).map_err(|e| e.to_string())
    }

    pub fn usizes(&self, k: &str) -> std::result::Result<Vec<usize>, String> {
        self.file.get_u32_array(&self.key(k)).map(|v| v.into_iter().map(|x| x as usize).collect()).map_err(|e| e.to_string())
    }

    pub fn f32(&self, k: &str) -> std::result::Result<f32, String> {
        self.file.get_f32(&self.key(k)).map_err(|e| e.to_string())
    }

    pub fn bool(&self, k: &str) -> std::result::Result<bool, String> {
        self.file.get_bool(&self.key(k)).map_err(|e| e.to_string())
    }
}

/// A GGUF file opened with its tensors: a metadata-only ggml context holds one
/// tensor per GGUF tensor (names, types, shapes); [`GgufTensors::load_into`]
/// reads their data into backend memory.
pub struct GgufTensors {
    pub file: GgufFile,
    pub ctx: crate::Context,
    /// The whole file, when it was opened from memory ([`GgufTensors::from_bytes`]).
    memory: Option<Vec<u8>>,
    /// Tensors that hold several file tensors side by side
    /// ([`stack`](Self::stack)), in a context of their own, with their
    /// members' names in order.
    stacks: Option<(crate::Context, Vec<Stack>)>,
}

/// One [`GgufTensors::stack`]ed tensor: its name and its members', in order.
struct Stack {
    name: String,
    members: Vec<String>,
}

impl GgufTensors {
    pub fn open(path: &Path) -> Result<Self> {
        check_model_path(path)?;
        preflight_file(path)?;
        let c = CString::new(path.to_string_lossy().as_bytes()).map_err(|e| crate::Error::Msg(e.to_string()))?;
        let mut meta: *mut sys::ggml_context = std::ptr::null_mut();
        let params = sys::gguf_init_params { no_alloc: true, ctx: &mut meta };
        let ptr = NonNull::new(unsafe { sys::gguf_init_from_file(c.as_ptr(), params) });
        let len = std::fs::metadata(path).map_err(|e| crate::Error::Msg(e.to_string()))?.len() as usize;
        Self::checked(ptr, meta, path, len, None)
    }

    /// A GGUF image in memory (fuzzing and tests: the same checks as a file).
    pub fn from_bytes(bytes: &[u8], name: &str) -> Result<Self> {
        preflight(std::io::Cursor::new(bytes), bytes.len() as u64, Path::new(name))?;
        let mut meta: *mut sys::ggml_context = std::ptr::null_mut();
        let params = sys::gguf_init_params { no_alloc: true, ctx: &mut meta };
        let ptr = NonNull::new(unsafe { sys::gguf_init_from_buffer(bytes.as_ptr().cast(), bytes.len(), params) });
        Self::checked(ptr, meta, Path::new(name), bytes.len(), Some(bytes.to_vec()))
    }

    fn checked(ptr: Option<NonNull<sys::gguf_context>>, meta: *mut sys::ggml_context, path: &Path, len: usize, memory: Option<Vec<u8>>) -> Result<Self> {
        let Some(ptr) = ptr else {
            return err(format!("{} is not a valid GGUF file (bad magic, truncated, or corrupt header)", path.display()));
        };
        let file = GgufFile { ptr, path: path.to_path_buf() };
        let ctx = unsafe { crate::Context::from_raw(meta) }.ok_or_else(|| crate::Error::Msg("gguf: no tensor context".into()))?;
        // A truncated file passes header parsing; check the data section's extent.
        for t in file.tensors() {
            let end = t.offset.checked_add(t.size);
            if end.is_none_or(|end| end > len) {
                return err(format!(
                    "{} is truncated: tensor '{}' ends at byte {} but the file has {len}",
                    path.display(),
                    t.name,
                    t.offset as u128 + t.size as u128
                ));
            }
        }
        Ok(GgufTensors { file, ctx, memory, stacks: None })
    }

    /// Like [`load_into`](Self::load_into), but the matrices `matmul_weight`
    /// selects go to the first of the device's extra buffer types that runs a
    /// product with them (CPU: AMX or repacked layouts for quantized types); the
    /// rest to the backend's default buffer. `inspect` sees each tensor's
    /// bytes as they will be stored (name, stored type, bytes) while they are
    /// still on the host, and its error stops the load. Returns the buffers
    /// and how many tensors went to extra buffers.
    pub fn load_into_with_extra(
        &self,
        backend: &crate::Backend,
        matmul_weight: impl Fn(&str) -> bool,
        inspect: impl Fn(&str, crate::Type, &[u8]) -> Result<()> + Sync,
    ) -> Result<(Vec<crate::Buffer>, usize)> {
        self.load_some_into_with_extra(backend, |_| true, matmul_weight, inspect)
    }

    /// [`load_into_with_extra`](Self::load_into_with_extra) for the tensors
    /// `keep` accepts only: the others are neither given memory nor read from
    /// the file (their data pointers stay null), so a model loaded for part of
    /// its work costs that part's memory and reading time.
    pub fn load_some_into_with_extra(
        &self,
        backend: &crate::Backend,
        keep: impl Fn(&str) -> bool,
        matmul_weight: impl Fn(&str) -> bool,
        inspect: impl Fn(&str, crate::Type, &[u8]) -> Result<()> + Sync,
    ) -> Result<(Vec<crate::Buffer>, usize)> {
        let (groups, in_extra) = self.placement(backend, &keep, matmul_weight);
        let mut buffers = Vec::new();
        for (buft, tensors) in groups {
            let size = group_bytes(buft, &tensors);
            let raw = unsafe { sys::ggml_backend_buft_alloc_buffer(buft, size) };
            let Some(ptr) = std::ptr::NonNull::new(raw) else {
                return err(format!("could not allocate {size} bytes of {}", unsafe { crate::cstr_to_string(sys::ggml_backend_buft_name(buft)) }));
            };
            unsafe { sys::ggml_backend_buffer_set_usage(raw, sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS) };
            let buffer = crate::Buffer::from_raw(ptr);
            let mut talloc = unsafe { sys::ggml_tallocr_new(raw) };
            for t in &tensors {
                if unsafe { sys::ggml_tallocr_alloc(&mut talloc, t.as_ptr()) } != sys::GGML_STATUS_SUCCESS {
                    return err(format!("could not place tensor '{}'", t.name()));
                }
            }
            buffers.push(buffer);
        }
        self.place_stack_members(&keep)?;
        self.read_data(keep, inspect)?;
        Ok((buffers, in_extra))
    }

    /// The bytes [`load_some_into_with_extra`](Self::load_some_into_with_extra)
    /// would allocate on `backend` for the same tensors, placed the same way,
    /// without allocating or reading anything.
    pub fn placement_bytes(&self, backend: &crate::Backend, keep: impl Fn(&str) -> bool, matmul_weight: impl Fn(&str) -> bool) -> usize {
        self.placement(backend, keep, matmul_weight).0.iter().map(|(buft, tensors)| group_bytes(*buft, tensors)).sum()
    }

    /// The tensors `keep` accepts, grouped by the buffer type they go to: a
    /// matrix-product weight to the first of the device's extra buffer types
    /// that takes it (CPU repacking, AMX), every other tensor to the
    /// backend's own; and how many went to an extra type.
    #[allow(clippy::type_complexity)]
    fn placement(
        &self,
        backend: &crate::Backend,
        keep: impl Fn(&str) -> bool,
        matmul_weight: impl Fn(&str) -> bool,
    ) -> (Vec<(sys::ggml_backend_buffer_type_t, Vec<crate::Tensor<'_>>)>, usize) {
        let device = backend.device();
        let extras = device.as_ref().map(|d| d.extra_buffer_types()).unwrap_or_default();
        let default = backend.buffer_type().as_ptr();
        let mut groups: Vec<(sys::ggml_backend_buffer_type_t, Vec<crate::Tensor<'_>>)> = Vec::new();
        let mut in_extra = 0;
        // A stack whose members are all kept takes its first member's place;
        // the members have no memory of their own.
        let stacks = self.stacks.as_ref().map(|(ctx, list)| (ctx, list.as_slice()));
        let in_stack = |name: &str| {
            stacks.and_then(|(ctx, list)| list.iter().find(|s| s.members.iter().any(|m| m == name) && s.members.iter().all(|m| keep(m))).map(|s| (ctx, s)))
        };
        for t in self.ctx.tensors().into_iter().filter(|t| keep(&t.name())) {
            if let Some((ctx, stack)) = in_stack(&t.name()) {
                if stack.members[0] == t.name() {
                    let whole = ctx.get_tensor(&stack.name).expect("created with the stack");
                    match groups.iter_mut().find(|(b, _)| *b == default) {
                        Some((_, list)) => list.push(whole),
                        None => groups.push((default, vec![whole])),
                    }
                }
                continue;
            }
            let buft = match &device {
                Some(d) if matmul_weight(&t.name()) => extras.iter().copied().find(|b| d.supports_weight_in(*b, t)),
                _ => None,
            };
            in_extra += buft.is_some() as usize;
            let buft = buft.unwrap_or(default);
            match groups.iter_mut().find(|(b, _)| *b == buft) {
                Some((_, list)) => list.push(t),
                None => groups.push((buft, vec![t])),
            }
        }
        (groups, in_extra)
    }

    /// Keeps each group of 2-D tensors `members` (one type, one row length)
    /// in one tensor `name`, their rows one after another in the order given:
    /// a graph multiplies by `name` once where it would by each member (a
    /// transformer's Q, K and V products over one input, one launch instead
    /// of three). Files are unchanged; the members stay readable by their own
    /// names as views of the stack, and cost no memory beyond it. Stacks are
    /// placed in the backend's default buffer (never an extra, repacked one,
    /// whose layout is per tensor). Call after any [`store_as`](Self::store_as),
    /// before loading or sizing; a group whose members differ in type, row
    /// length or rank is refused, naming them.
    pub fn stack(&mut self, groups: &[(String, Vec<String>)]) -> Result<()> {
        if self.stacks.is_some() {
            return err("gguf: tensors were already stacked (a bug in the caller)".to_string());
        }
        if groups.is_empty() {
            return Ok(());
        }
        let path = self.file.path.display().to_string();
        let ctx = crate::Context::new_no_alloc(groups.len(), 0)?;
        let mut stacks: Vec<Stack> = Vec::new();
        for (name, members) in groups {
            let mut rows = 0;
            let mut first: Option<crate::Tensor<'_>> = None;
            for m in members {
                let t = self.ctx.get_tensor(m).ok_or_else(|| crate::Error::Msg(format!("{path}: tensor '{m}' is missing")))?;
                let taken = stacks.iter().any(|s| s.members.contains(m)) || members.iter().filter(|n| *n == m).count() > 1;
                if taken || unsafe { !(*t.as_ptr()).buffer.is_null() } {
                    return err(format!("tensor '{m}' cannot be stacked twice or after loading (a bug in the caller)"));
                }
                let [ne0, ne1, ne2, ne3] = t.ne();
                if let Some(f) = first {
                    if f.ty() != t.ty() || f.ne()[0] != ne0 {
                        return err(format!(
                            "{path}: tensors '{}' ({} [{}, ..]) and '{m}' ({} [{ne0}, ..]) cannot be stored as one '{name}': type or row length differ",
                            f.name(),
                            crate::type_name(f.ty()),
                            f.ne()[0],
                            crate::type_name(t.ty())
                        ));
                    }
                }
                if ne2 != 1 || ne3 != 1 {
                    return err(format!("{path}: tensor '{m}' is not 2-D, so it cannot be stored in '{name}'"));
                }
                first.get_or_insert(t);
                rows += ne1;
            }
            let Some(first) = first else {
                return err(format!("stack '{name}' has no members (a bug in the caller)"));
            };
            if self.ctx.get_tensor(name).is_some() || ctx.get_tensor(name).is_some() {
                return err(format!("{path}: stack name '{name}' is already a tensor's (a bug in the caller)"));
            }
            let whole = ctx.new_tensor(first.ty(), &[first.ne()[0], rows])?.set_name(name);
            if whole.name() != *name {
                return err(format!("stack name '{name}' is longer than ggml keeps (a bug in the caller)"));
            }
            stacks.push(Stack { name: name.clone(), members: members.clone() });
        }
        self.stacks = Some((ctx, stacks));
        Ok(())
    }

    /// A stacked tensor ([`stack`](Self::stack)) by name.
    pub fn stacked(&self, name: &str) -> Option<crate::Tensor<'_>> {
        self.stacks.as_ref().and_then(|(ctx, _)| ctx.get_tensor(name))
    }

    /// Points the members of every placed stack at their rows of it, so
    /// that reading a member's data fills the stack.
    fn place_stack_members(&self, keep: impl Fn(&str) -> bool) -> Result<()> {
        let Some((ctx, stacks)) = &self.stacks else { return Ok(()) };
        for stack in stacks.iter().filter(|s| s.members.iter().all(|m| keep(m))) {
            let whole = ctx.get_tensor(&stack.name).expect("created with the stack");
            let mut offset = 0;
            for m in &stack.members {
                let t = self.ctx.get_tensor(m).expect("checked when stacked");
                // `whole` is allocated and lives as long as `self`; a view
                // takes its buffer and data pointer from it.
                let status = unsafe {
                    let raw = &mut *t.as_ptr();
                    raw.view_src = whole.as_ptr();
                    raw.view_offs = offset;
                    sys::ggml_backend_view_init(t.as_ptr())
                };
                if status != sys::GGML_STATUS_SUCCESS {
                    return err(format!("could not place tensor '{m}' in '{}'", stack.name));
                }
                offset += t.n_bytes();
            }
        }
        Ok(())
    }

    /// Stores tensor `name` as `to` instead of its file type, before the
    /// tensors are loaded: F32 ↔ F16 only (what the `f16_weights` policy asks of
    /// matrix-product weights). The data is converted as it is read.
    pub fn store_as(&mut self, name: &str, to: crate::Type) -> Result<()> {
        let t = self.ctx.get_tensor(name).ok_or_else(|| crate::Error::Msg(format!("{}: tensor '{name}' is missing", self.file.path.display())))?;
        let from = t.ty();
        if from == to {
            return Ok(());
        }
        let convertible = [crate::TYPE_F32, crate::TYPE_F16];
        if !convertible.contains(&from) || !convertible.contains(&to) || unsafe { !(*t.as_ptr()).buffer.is_null() } {
            return err(format!("tensor '{name}' cannot be stored as {} (it is {})", crate::type_name(to), crate::type_name(from)));
        }
        unsafe {
            let raw = &mut *t.as_ptr();
            raw.type_ = to;
            raw.nb[0] = sys::ggml_type_size(to);
            for i in 1..4 {
                raw.nb[i] = raw.nb[i - 1] * raw.ne[i - 1] as usize;
            }
        }
        Ok(())
    }

    /// Reads the data of every tensor `keep` accepts from the file into its
    /// (allocated) buffer, converting those [`store_as`](Self::store_as) retyped.
    /// The first failure in file order is reported.
    fn read_data(&self, keep: impl Fn(&str) -> bool, inspect: impl Fn(&str, crate::Type, &[u8]) -> Result<()> + Sync) -> Result<()> {
        use std::io::{Read, Seek, SeekFrom};
        let mut file = match self.memory {
            Some(_) => None,
            None => Some(std::fs::File::open(&self.file.path).map_err(|e| crate::Error::Msg(format!("{}: {e}", self.file.path.display())))?),
        };
        let path = self.file.path.as_path();
        let reading = |name: &str, e: std::io::Error| crate::Error::Msg(format!("{}: reading tensor '{name}': {e}", path.display()));
        // By name once: a lookup per tensor walks the context's list (thousands of names).
        let tensors: std::collections::HashMap<String, crate::Tensor<'_>> = self.ctx.tensors().into_iter().map(|t| (t.name(), t)).collect();
        let infos: Vec<TensorInfo> = self.file.tensors().into_iter().filter(|t| keep(&t.name)).collect();
        // Tensors stored as the file stores them, in host memory (the CPU
        // backend's default buffer), are read straight into it: no staging
        // copy and no transient buffer as large as the largest tensor. The
        // rest go through ggml's upload.
        let mut direct: Vec<ReadJob<'_>> = Vec::new();
        let mut staged: Vec<(usize, &TensorInfo, crate::Tensor<'_>)> = Vec::new();
        for (i, info) in infos.iter().enumerate() {
            let t = *tensors.get(&info.name).ok_or_else(|| crate::Error::Msg(format!("tensor '{}' missing from context", info.name)))?;
            match (&file, host_bytes(t, info.ty, info.size)) {
                (Some(_), Some(dst)) => direct.push((i, info, dst)),
                _ => staged.push((i, info, t)),
            }
        }
        let mut failures: Vec<(usize, crate::Error)> = match &file {
            Some(f) => read_in_parallel(f, direct, &reading, &inspect),
            None => Vec::new(),
        };
        let mut bytes = Vec::new();
        for (i, info, t) in staged {
            let read = match (&self.memory, file.as_mut()) {
                // In range: checked when the image was opened.
                (Some(memory), _) => Ok(memory[info.offset..info.offset + info.size].to_vec()),
                (None, Some(f)) => {
                    bytes.resize(info.size, 0);
                    f.seek(SeekFrom::Start(info.offset as u64))
                        .and_then(|_| f.read_exact(&mut bytes))
                        .map(|_| std::mem::take(&mut bytes))
                        .map_err(|e| reading(&info.name, e))
                }
                (None, None) => unreachable!("a file is opened when there is no image"),
            };
            let stored = read.and_then(|read| {
                let read = if t.ty() != info.ty { convert(&read, info.ty, t.ty()) } else { read };
                inspect(&info.name, t.ty(), &read)?;
                t.set_bytes(&read)?;
                Ok(read)
            });
            match stored {
                Ok(read) => bytes = read,
                Err(e) => {
                    failures.push((i, e));
                    break;
                }
            }
        }
        match failures.into_iter().min_by_key(|(i, _)| *i) {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }

    /// Reads one F32, F16 or BF16 tensor from the file as f32 values, in the
    /// type the file stores it (a retyping by [`store_as`](Self::store_as)
    /// does not apply): the values of a tensor that was never loaded.
    pub fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        let ty = self.file.tensors().into_iter().find(|t| t.name == name).map(|t| t.ty);
        let bytes = self.read_bytes(name)?;
        let width = match ty {
            Some(sys::GGML_TYPE_F32) => 4,
            Some(sys::GGML_TYPE_F16 | sys::GGML_TYPE_BF16) => 2,
            _ => return Err(crate::Error::Msg(format!("{}: tensor '{name}' is not F32, F16 or BF16", self.file.path.display()))),
        };
        let mut words = vec![0u32; bytes.len().div_ceil(4)];
        copy_into_words(&bytes, &mut words);
        // `words` is 4-byte aligned and holds `bytes.len() / width` values of `ty`.
        unsafe { crate::context::decode_f32(words.as_ptr().cast(), ty.expect("matched above"), bytes.len() / width) }
    }

    /// Reads one tensor's raw bytes from the file (for host-side data).
    pub fn read_bytes(&self, name: &str) -> Result<Vec<u8>> {
        use std::io::{Read, Seek, SeekFrom};
        let info = self
            .file
            .tensors()
            .into_iter()
            .find(|t| t.name == name)
            .ok_or_else(|| crate::Error::Msg(format!("{}: tensor '{name}' is missing", self.file.path.display())))?;
        if let Some(memory) = &self.memory {
            // In range: checked when the image was opened.
            return Ok(memory[info.offset..info.offset + info.size].to_vec());
        }
        let mut f = std::fs::File::open(&self.file.path).map_err(|e| crate::Error::Msg(e.to_string()))?;
        let mut bytes = vec![0u8; info.size];
        f.seek(SeekFrom::Start(info.offset as u64))
            .and_then(|_| f.read_exact(&mut bytes))
            .map_err(|e| crate::Error::Msg(format!("{}: reading tensor '{name}': {e}", self.file.path.display())))?;
        Ok(bytes)
    }
}

/// `bytes` copied into the start of `words`.
fn copy_into_words(bytes: &[u8], words: &mut [u32]) {
    // `words` holds at least `bytes.len()` bytes.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), words.as_mut_ptr().cast::<u8>(), bytes.len()) }
}

/// The memory of tensor `t`, allocated in a host buffer, as `size` bytes it
/// may be read into directly: only when it is stored as the file stores it
/// (`ty`), and holds exactly `size` bytes. `None`: upload through ggml.
fn host_bytes<'t>(t: crate::Tensor<'t>, ty: crate::Type, size: usize) -> Option<&'t mut [u8]> {
    let raw = unsafe { &*t.as_ptr() };
    let host = !raw.buffer.is_null() && !raw.data.is_null() && unsafe { sys::ggml_backend_buffer_is_host(raw.buffer) };
    // The tensor's data lies in a buffer this load allocated and nothing else
    // refers to yet; it is `n_bytes` long.
    (host && t.ty() == ty && t.n_bytes() == size).then(|| unsafe { std::slice::from_raw_parts_mut(raw.data.cast::<u8>(), size) })
}

/// One tensor to read: its index in file order, where it lies in the file,
/// and the host memory it goes to.
type ReadJob<'a> = (usize, &'a TensorInfo, &'a mut [u8]);

/// Reads each tensor of `jobs` (its index in file order, where it lies, its
/// memory) from `file` and hands it to `inspect`, on up to four threads: page
/// faults and the kernel's copy out of the page cache, most of a load's time,
/// scale with cores. Each thread stops at its first failure; the failures
/// come back with their indices.
fn read_in_parallel(
    file: &std::fs::File,
    mut jobs: Vec<ReadJob<'_>>,
    reading: &(impl Fn(&str, std::io::Error) -> crate::Error + Sync),
    inspect: &(impl Fn(&str, crate::Type, &[u8]) -> Result<()> + Sync),
) -> Vec<(usize, crate::Error)> {
    use std::os::unix::fs::FileExt;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 4).min(jobs.len().max(1));
    // Largest first, each to the thread with the fewest bytes so far.
    jobs.sort_by_key(|(_, info, _)| std::cmp::Reverse(info.size));
    let mut shares: Vec<(usize, Vec<ReadJob<'_>>)> = (0..threads).map(|_| (0, Vec::new())).collect();
    for job in jobs {
        let share = shares.iter_mut().min_by_key(|(bytes, _)| *bytes).expect("at least one thread");
        share.0 += job.1.size;
        share.1.push(job);
    }
    std::thread::scope(|scope| {
        let workers: Vec<_> = shares
            .into_iter()
            .map(|(_, share)| {
                scope.spawn(move || {
                    for (i, info, dst) in share {
                        let done =
                            file.read_exact_at(dst, info.offset as u64).map_err(|e| reading(&info.name, e)).and_then(|_| inspect(&info.name, info.ty, dst));
                        if let Err(e) = done {
                            return Some((i, e));
                        }
                    }
                    None
                })
            })
            .collect();
        workers.into_iter().filter_map(|w| w.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    })
}

/// F32 ↔ F16 element conversion (ggml's own rounding).
fn convert(bytes: &[u8], from: crate::Type, to: crate::Type) -> Vec<u8> {
    let n = bytes.len() / unsafe { sys::ggml_type_size(from) };
    let mut out = vec![0u8; n * unsafe { sys::ggml_type_size(to) }];
    if from == crate::TYPE_F32 {
        let src: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        unsafe { sys::ggml_fp32_to_fp16_row(src.as_ptr(), out.as_mut_ptr().cast(), n as i64) };
    } else {
        let src: Vec<u16> = bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
        let mut dst = vec![0f32; n];
        unsafe { sys::ggml_fp16_to_fp32_row(src.as_ptr().cast(), dst.as_mut_ptr(), n as i64) };
        out = dst.iter().flat_map(|v| v.to_le_bytes()).collect();
    }
    out
}

impl Drop for GgufFile {
    fn drop(&mut self) {
        unsafe { sys::gguf_free(self.ptr.as_ptr()) }
    }
}

/// A GGUF writer: metadata, and small tensors held in host memory (tests and
/// tools write small model files with it; saved voices are written with
/// [`GgufWriter::to_bytes`]).
pub struct GgufWriter {
    ptr: NonNull<sys::gguf_context>,
    /// Name, type, shape and little-endian data of each tensor, in order.
    tensors: Vec<(String, crate::Type, Vec<i64>, Vec<u8>)>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        GgufWriter { ptr: NonNull::new(unsafe { sys::gguf_init_empty() }).expect("gguf_init_empty"), tensors: Vec::new() }
    }

    fn key(key: &str) -> CString {
        CString::new(key).expect("GGUF keys contain no NUL")
    }

    pub fn set_str(&mut self, key: &str, value: &str) -> &mut Self {
        let v = CString::new(value).expect("GGUF strings contain no NUL");
        unsafe { sys::gguf_set_val_str(self.ptr.as_ptr(), Self::key(key).as_ptr(), v.as_ptr()) };
        self
    }

    pub fn set_u32(&mut self, key: &str, value: u32) -> &mut Self {
        unsafe { sys::gguf_set_val_u32(self.ptr.as_ptr(), Self::key(key).as_ptr(), value) };
        self
    }

    pub fn set_f32(&mut self, key: &str, value: f32) -> &mut Self {
        unsafe { sys::gguf_set_val_f32(self.ptr.as_ptr(), Self::key(key).as_ptr(), value) };
        self
    }

    pub fn set_u32_array(&mut self, key: &str, values: &[u32]) -> &mut Self {
        unsafe { sys::gguf_set_arr_data(self.ptr.as_ptr(), Self::key(key).as_ptr(), sys::GGUF_TYPE_UINT32, values.as_ptr().cast(), values.len()) };
        self
    }

    /// Adds a tensor with its data (`ne` innermost first, as ggml orders
    /// dimensions); the data's length must be the shape's size in `ty`.
    pub fn add_tensor(&mut self, name: &str, ty: crate::Type, ne: &[i64], data: Vec<u8>) -> Result<&mut Self> {
        if ne.is_empty() || ne.len() > 4 || ne.iter().any(|&n| n < 1) {
            return err(format!("tensor '{name}': shape {ne:?} is not 1 to 4 positive dimensions"));
        }
        let elements = ne.iter().product::<i64>() as usize;
        let block = unsafe { sys::ggml_blck_size(ty) } as usize;
        let expected = elements / block * unsafe { sys::ggml_type_size(ty) };
        if !elements.is_multiple_of(block) || data.len() != expected {
            return err(format!("tensor '{name}': {} bytes of data for shape {ne:?}, which takes {expected}", data.len()));
        }
        if name.is_empty() || name.contains('\0') || name.len() >= sys::GGML_MAX_NAME as usize || self.tensors.iter().any(|t| t.0 == name) {
            return err(format!("tensor name '{name}' is empty, too long, holds a NUL or is given twice"));
        }
        self.tensors.push((name.to_string(), ty, ne.to_vec(), data));
        Ok(self)
    }

    /// The whole file in memory: the header, metadata and tensor table as
    /// ggml lays them out, then each tensor's data padded to the alignment.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let out = GgufWriter::new();
        unsafe { sys::gguf_set_kv(out.ptr.as_ptr(), self.ptr.as_ptr()) };
        let scratch = crate::Context::new_no_alloc(self.tensors.len().max(1), 0)?;
        for (name, ty, ne, _) in &self.tensors {
            let t = scratch.new_tensor(*ty, ne)?.set_name(name);
            unsafe { sys::gguf_add_tensor(out.ptr.as_ptr(), t.as_ptr()) };
        }
        let ctx = out.ptr.as_ptr();
        let mut bytes = vec![0u8; unsafe { sys::gguf_get_meta_size(ctx) }];
        unsafe { sys::gguf_get_meta_data(ctx, bytes.as_mut_ptr().cast()) };
        let (data_start, alignment) = (bytes.len(), unsafe { sys::gguf_get_alignment(ctx) });
        for (i, (name, _, _, data)) in self.tensors.iter().enumerate() {
            let offset = unsafe { sys::gguf_get_tensor_offset(ctx, i as i64) };
            if data_start + offset != bytes.len() {
                return err(format!("tensor '{name}': ggml places it at {offset}, the data so far ends at {}", bytes.len() - data_start));
            }
            bytes.extend_from_slice(data);
            bytes.resize(bytes.len().next_multiple_of(alignment), 0);
        }
        Ok(bytes)
    }

    /// Writes the metadata (no tensors) to `path`.
    pub fn write_metadata(&self, path: &Path) -> Result<()> {
        self.write(path, true)
    }

    /// Writes the file (tensor data too unless `only_meta`).
    fn write(&self, path: &Path, only_meta: bool) -> Result<()> {
        let c = CString::new(path.to_string_lossy().as_bytes()).map_err(|e| crate::Error::Msg(e.to_string()))?;
        if unsafe { sys::gguf_write_to_file(self.ptr.as_ptr(), c.as_ptr(), only_meta) } {
            Ok(())
        } else {
            err(format!("could not write {}", path.display()))
        }
    }
}

impl Drop for GgufWriter {
    fn drop(&mut self) {
        unsafe { sys::gguf_free(self.ptr.as_ptr()) }
    }
}

/// Edits a GGUF file's metadata and tensor shapes and writes the result as a
/// new file: how tests derive malformed model files from good ones by key and
/// tensor name (never by byte offset).
pub struct GgufEditor {
    source: NonNull<sys::gguf_context>,
    /// The source's tensors with their data (read fully).
    data: crate::Context,
    /// The source's key-value pairs with the edits applied.
    kv: GgufWriter,
    /// Tensor name → replacement shape.
    shapes: Vec<(String, Vec<i64>)>,
}

impl GgufEditor {
    pub fn open(path: &Path) -> Result<Self> {
        check_model_path(path)?;
        preflight_file(path)?;
        let c = CString::new(path.to_string_lossy().as_bytes()).map_err(|e| crate::Error::Msg(e.to_string()))?;
        let mut data: *mut sys::ggml_context = std::ptr::null_mut();
        let params = sys::gguf_init_params { no_alloc: false, ctx: &mut data };
        let source = NonNull::new(unsafe { sys::gguf_init_from_file(c.as_ptr(), params) })
            .ok_or_else(|| crate::Error::Msg(format!("{} is not a valid GGUF file", path.display())))?;
        let data = unsafe { crate::Context::from_raw(data) }.ok_or_else(|| crate::Error::Msg("gguf: no tensor context".into()))?;
        let kv = GgufWriter::new();
        unsafe { sys::gguf_set_kv(kv.ptr.as_ptr(), source.as_ptr()) };
        Ok(GgufEditor { source, data, kv, shapes: Vec::new() })
    }

    pub fn set_u32(&mut self, key: &str, value: u32) -> &mut Self {
        self.kv.set_u32(key, value);
        self
    }

    pub fn set_f32(&mut self, key: &str, value: f32) -> &mut Self {
        self.kv.set_f32(key, value);
        self
    }

    pub fn set_str(&mut self, key: &str, value: &str) -> &mut Self {
        self.kv.set_str(key, value);
        self
    }

    pub fn set_u32_array(&mut self, key: &str, values: &[u32]) -> &mut Self {
        self.kv.set_u32_array(key, values);
        self
    }

    /// Gives tensor `name` another shape with the same element count (its bytes
    /// are kept).
    pub fn reshape(&mut self, name: &str, ne: &[i64]) -> Result<&mut Self> {
        let t = self.data.get_tensor(name).ok_or_else(|| crate::Error::Msg(format!("no tensor '{name}'")))?;
        if ne.iter().product::<i64>() != t.ne().iter().product::<i64>() {
            return err(format!("reshaping '{name}' to {ne:?} changes its element count"));
        }
        self.shapes.push((name.to_string(), ne.to_vec()));
        Ok(self)
    }

    /// Sets every value of the F32 tensor `name` to `value`.
    pub fn fill_f32(&mut self, name: &str, value: f32) -> Result<&mut Self> {
        let t = self.data.get_tensor(name).ok_or_else(|| crate::Error::Msg(format!("no tensor '{name}'")))?;
        if t.ty() != sys::GGML_TYPE_F32 {
            return err(format!("tensor '{name}' is not F32"));
        }
        let n = t.n_elements();
        let data = unsafe { std::slice::from_raw_parts_mut((*t.as_ptr()).data as *mut f32, n) };
        data.fill(value);
        Ok(self)
    }

    /// Writes the edited file to `path`.
    pub fn write(&self, path: &Path) -> Result<()> {
        let out = GgufWriter::new();
        unsafe { sys::gguf_set_kv(out.ptr.as_ptr(), self.kv.ptr.as_ptr()) };
        let scratch = crate::Context::new_no_alloc(self.shapes.len() + 1, 0)?;
        let n = unsafe { sys::gguf_get_n_tensors(self.source.as_ptr()) };
        for i in 0..n {
            let name = unsafe { cstr_to_string(sys::gguf_get_tensor_name(self.source.as_ptr(), i)) };
            let t = self.data.get_tensor(&name).ok_or_else(|| crate::Error::Msg(format!("tensor '{name}' missing from context")))?;
            let written = match self.shapes.iter().rev().find(|(n, _)| *n == name) {
                Some((_, ne)) => {
                    let r = scratch.new_tensor(t.ty(), ne)?;
                    unsafe {
                        (*r.as_ptr()).data = (*t.as_ptr()).data;
                        sys::ggml_set_name(r.as_ptr(), (*t.as_ptr()).name.as_ptr());
                    }
                    r
                }
                None => t,
            };
            unsafe { sys::gguf_add_tensor(out.ptr.as_ptr(), written.as_ptr()) };
        }
        out.write(path, false)
    }
}

impl Drop for GgufEditor {
    fn drop(&mut self) {
        unsafe { sys::gguf_free(self.source.as_ptr()) }
    }
}

/// One weight buffer's bytes for `tensors` of `buft`: each tensor's
/// allocation rounded up to the alignment, plus one alignment of slack for
/// the buffer's own base.
fn group_bytes(buft: sys::ggml_backend_buffer_type_t, tensors: &[crate::Tensor<'_>]) -> usize {
    let align = unsafe { sys::ggml_backend_buft_get_alignment(buft) };
    tensors.iter().map(|t| unsafe { sys::ggml_backend_buft_get_alloc_size(buft, t.as_ptr()) }.div_ceil(align) * align).sum::<usize>() + align
}
