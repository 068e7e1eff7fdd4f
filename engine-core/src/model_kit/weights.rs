//! A model file's tensors, checked against the family's [`TensorTable`] and
//! resident in backend buffers. Graphs get weights only through
//! [`Weights::tensor`], which serves only names the table checked.

use super::tensors::TensorTable;
use crate::abi::WeightStorage;
use ggml_sys::gguf::GgufTensors;
use ggml_sys::{Backend, Buffer, Context, Error, Result, Tensor};

pub struct Weights {
    // Dropped first: the buffers hold the data of `gguf.ctx`'s tensors.
    _buffers: Vec<Buffer>,
    gguf: GgufTensors,
    table: TensorTable,
    /// Matrices placed in a device-specific layout (CPU: repacked / AMX).
    pub in_extra_buffers: usize,
}

impl Weights {
    /// Checks `gguf` against `table` (unless the caller already did), then
    /// loads every tensor. The table's matrix-product weights are stored as
    /// `storage` says (F32 ↔ F16; quantized ones as they are); those
    /// `is_matmul_weight` accepts (only ever the first operand of a matrix
    /// product) may go to the device's extra buffers.
    pub fn load(
        mut gguf: GgufTensors,
        backend: &Backend,
        mut table: TensorTable,
        storage: WeightStorage,
        is_matmul_weight: impl Fn(&str) -> bool,
    ) -> super::Result<Self> {
        if !table.is_checked() {
            table.check(&gguf)?;
        }
        let target = match storage {
            WeightStorage::AsStored => None,
            WeightStorage::F16 => Some(ggml_sys::TYPE_F16),
            WeightStorage::F32 => Some(ggml_sys::TYPE_F32),
        };
        if let Some(to) = target {
            let float = [ggml_sys::TYPE_F32, ggml_sys::TYPE_F16];
            for name in table.matrices() {
                if gguf.ctx.get_tensor(name).is_some_and(|t| float.contains(&t.ty())) {
                    gguf.store_as(name, to)?;
                }
            }
        }
        let (buffers, in_extra) = gguf.load_into_with_extra(backend, is_matmul_weight)?;
        Ok(Weights { _buffers: buffers, gguf, table, in_extra_buffers: in_extra })
    }

    fn checked(&self, name: &str) -> Result<Tensor<'_>> {
        if !self.table.contains(name) {
            return Err(Error::Msg(format!("tensor '{name}' is not in the model's tensor table (a bug in the plugin)")));
        }
        self.gguf.ctx.get_tensor(name).ok_or_else(|| Error::Msg(format!("{}: tensor '{name}' is missing", self.gguf.file.path().display())))
    }

    /// A weight usable in a graph built in `ctx`. Graphs are owned next to the
    /// weights and dropped before them, so the rebinding is sound.
    pub fn tensor<'c>(&self, ctx: &'c Context, name: &str) -> Result<Tensor<'c>> {
        Ok(unsafe { self.checked(name)?.rebind(ctx) })
    }

    /// An F32 weight's values, read on the host.
    pub fn host_f32(&self, name: &str) -> Result<Vec<f32>> {
        self.checked(name)?.get_f32()
    }

    /// An I32 tensor's values, read on the host (token lists).
    pub fn host_i32(&self, name: &str) -> Result<Vec<i32>> {
        let t = self.checked(name)?;
        if t.ty() != ggml_sys::TYPE_I32 {
            return Err(Error::Msg(format!("{}: tensor '{name}' is not I32", self.gguf.file.path().display())));
        }
        Ok(t.get_bytes()?.chunks_exact(4).map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
}
