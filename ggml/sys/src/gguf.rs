//! GGUF reading: metadata (typed key lookups) and tensor descriptors.
//! Model plugins read every dimension through this, never from constants.

use crate::{cstr_to_string, err, sys, Result};
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

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
        if !path.is_file() {
            return err(format!("GGUF file {} does not exist", path.display()));
        }
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

    pub fn has_key(&self, key: &str) -> bool {
        self.key_id(key).is_some()
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

impl Drop for GgufFile {
    fn drop(&mut self) {
        unsafe { sys::gguf_free(self.ptr.as_ptr()) }
    }
}

/// A GGUF metadata writer (tests and tools write small model files with it).
pub struct GgufWriter {
    ptr: NonNull<sys::gguf_context>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        GgufWriter { ptr: NonNull::new(unsafe { sys::gguf_init_empty() }).expect("gguf_init_empty") }
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

    pub fn set_bool(&mut self, key: &str, value: bool) -> &mut Self {
        unsafe { sys::gguf_set_val_bool(self.ptr.as_ptr(), Self::key(key).as_ptr(), value) };
        self
    }

    /// Writes the metadata (no tensors) to `path`.
    pub fn write_metadata(&self, path: &Path) -> Result<()> {
        let c = CString::new(path.to_string_lossy().as_bytes()).map_err(|e| crate::Error::Msg(e.to_string()))?;
        if unsafe { sys::gguf_write_to_file(self.ptr.as_ptr(), c.as_ptr(), true) } {
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
