//! A model file's tensors, checked against the family's [`TensorTable`] and
//! resident in backend buffers, plus the tensors a family derives from them
//! once at load. Graphs get weights only through [`Weights::tensor`], which
//! serves only names the table checked, its stacks (matrices kept side by
//! side in one tensor, [`TensorTable::stack`]) and derived ones.

use super::tensors::TensorTable;
use crate::abi::WeightStorage;
use ggml_sys::gguf::GgufTensors;
use ggml_sys::{Backend, Buffer, Context, Error, Result, Tensor};

pub struct Weights {
    // Dropped first: the buffers hold the data of `gguf.ctx`'s tensors.
    _buffers: Vec<Buffer>,
    gguf: GgufTensors,
    /// The tensors loaded: the whole checked table, or the part a
    /// [`load_part`](Self::load_part) kept.
    table: TensorTable,
    /// Table entries left unloaded by [`load_part`](Self::load_part).
    left_out: usize,
    /// Tensors computed at load from checked weights, each batch in its own
    /// buffer (dropped before its context; none when measuring), with the
    /// bytes it takes.
    derived: Vec<(Option<Buffer>, Context, usize)>,
    /// Made by [`for_measuring`](Self::for_measuring): nothing has memory,
    /// and host reads come from the file.
    measuring: bool,
    /// Matrices placed in a device-specific layout (CPU: repacked / AMX).
    pub in_extra_buffers: usize,
}

/// An F32 tensor a family computes on the host from checked weights, so that
/// graphs read it instead of recomputing it every run (a reciprocal, say).
pub struct DerivedTensor {
    pub name: String,
    /// ggml order.
    pub ne: Vec<i64>,
    pub values: Vec<f32>,
}

impl DerivedTensor {
    /// Weight `source`, whose ne0 are a convolution's taps, with the taps moved
    /// outermost: `[rest…, taps]` where `rest` are its other axes (ggml order),
    /// so that each tap's matrix or vector is contiguous.
    pub fn taps_outermost(weights: &Weights, source: &str, name: String, rest: &[i64]) -> Result<DerivedTensor> {
        let w = weights.host_f32(source)?;
        let taps = weights.ne(source)?[0] as usize;
        let others = w.len() / taps.max(1);
        if rest.iter().product::<i64>() as usize != others {
            return Err(Error::Msg(format!("{source}: {others} values per tap, not {rest:?}")));
        }
        let values = (0..taps).flat_map(|tap| (0..others).map(move |r| (tap, r))).map(|(tap, r)| w[r * taps + tap]).collect();
        Ok(DerivedTensor { name, ne: rest.iter().copied().chain([taps as i64]).collect(), values })
    }
}

impl Weights {
    /// Checks `gguf` against `table` (unless the caller already did), then
    /// loads every tensor, refusing one that holds a NaN or infinity
    /// ([`super::finite`]). The table's matrix-product weights are stored as
    /// `storage` says (F32 ↔ F16; quantized ones as they are); those
    /// `is_matmul_weight` accepts (only ever the first operand of a matrix
    /// product) may go to the device's extra buffers.
    pub fn load(
        gguf: GgufTensors,
        backend: &Backend,
        table: TensorTable,
        storage: WeightStorage,
        is_matmul_weight: impl Fn(&str) -> bool,
    ) -> super::Result<Self> {
        Self::load_part(gguf, backend, table, storage, is_matmul_weight, |_| true)
    }

    /// [`load`](Self::load) for a model loaded for part of its work (a
    /// Chatterbox model that only clones voices): the whole file is checked
    /// against the whole table as `load` checks it, then only the tensors
    /// `keep` accepts are read and given memory. The others cost no memory
    /// and no reading; asking for one is an error naming it.
    pub fn load_part(
        mut gguf: GgufTensors,
        backend: &Backend,
        mut table: TensorTable,
        storage: WeightStorage,
        is_matmul_weight: impl Fn(&str) -> bool,
        keep: impl Fn(&str) -> bool,
    ) -> super::Result<Self> {
        if !table.is_checked() {
            table.check(&gguf)?;
        }
        let left_out = table.retain(&keep);
        apply_storage(&mut gguf, &table, storage)?;
        gguf.stack(&table.stacks())?;
        // Every float weight is checked finite as it is read (docs/reliability.md,
        // "Model files"): a NaN weight must be an error, not silence.
        let path = gguf.file.path().display().to_string();
        let file_types: std::collections::HashMap<String, ggml_sys::Type> = gguf.file.tensors().into_iter().map(|t| (t.name, t.ty)).collect();
        // Only the table's tensors: those a file carries unused get no memory.
        let keep = |name: &str| table.contains(name);
        let (buffers, in_extra) = gguf.load_some_into_with_extra(backend, keep, is_matmul_weight, |name, ty, bytes| {
            let converted_from = file_types.get(name).copied().filter(|&from| from != ty);
            super::finite::check_weight(&path, name, ty, converted_from, bytes).map_err(|e| Error::Msg(e.to_string()))
        })?;
        Ok(Weights { _buffers: buffers, gguf, table, left_out, derived: Vec::new(), measuring: false, in_extra_buffers: in_extra })
    }

    /// The file's tensors typed as [`load`](Self::load) would store them, with
    /// no memory and nothing read: for sizing a model before it is loaded
    /// ([`size_on`](Self::size_on)) and measuring its graphs
    /// ([`super::builder::measure_graph`]). Host reads
    /// ([`host_f32`](Self::host_f32)) come from the file, so a family derives
    /// its tensors as at load ([`add_derived`](Self::add_derived) then only
    /// sizes them, [`derived_bytes`](Self::derived_bytes)).
    pub fn for_measuring(mut gguf: GgufTensors, mut table: TensorTable, storage: WeightStorage) -> super::Result<Self> {
        if !table.is_checked() {
            table.check(&gguf)?;
        }
        apply_storage(&mut gguf, &table, storage)?;
        gguf.stack(&table.stacks())?;
        Ok(Weights { _buffers: Vec::new(), gguf, table, left_out: 0, derived: Vec::new(), measuring: true, in_extra_buffers: 0 })
    }

    /// The bytes [`load`](Self::load) allocates for these weights on
    /// `backend` with the same `is_matmul_weight` (the matrices some devices
    /// keep in buffers of their own), without allocating anything.
    pub fn size_on(&self, backend: &Backend, is_matmul_weight: impl Fn(&str) -> bool) -> usize {
        self.gguf.placement_bytes(backend, |name| self.table.contains(name), is_matmul_weight)
    }

    /// The bytes of the buffers the weights were loaded into (derived
    /// tensors not included).
    pub fn buffer_bytes(&self) -> usize {
        self._buffers.iter().map(Buffer::size).sum()
    }

    /// The bytes the derived tensors take on the device: their buffers, or
    /// when measuring, what those buffers would be.
    pub fn derived_bytes(&self) -> usize {
        self.derived.iter().map(|(_, _, bytes)| bytes).sum()
    }

    /// Names of the file's tensors, as the table declares them.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.table.names()
    }

    /// Places `tensors` on `backend` beside the weights; [`tensor`](Self::tensor)
    /// serves them by name from then on (when measuring, only their shapes
    /// and the bytes they would take). A name the file or an earlier
    /// derivation already uses is a plugin bug, reported as an error.
    pub fn add_derived(&mut self, backend: &Backend, tensors: Vec<DerivedTensor>) -> Result<()> {
        if tensors.is_empty() {
            return Ok(());
        }
        let ctx = Context::new_no_alloc(tensors.len(), 0)?;
        for t in &tensors {
            if self.table.contains(&t.name) || self.table.is_stack(&t.name) || self.derived_tensor(&t.name).is_some() || ctx.get_tensor(&t.name).is_some() {
                return Err(Error::Msg(format!("derived tensor '{}' is already defined (a bug in the plugin)", t.name)));
            }
            let n: i64 = t.ne.iter().product();
            if n < 0 || n as usize != t.values.len() {
                return Err(Error::Msg(format!("derived tensor '{}' has {} values for shape {:?} (a bug in the plugin)", t.name, t.values.len(), t.ne)));
            }
            let tensor = ctx.new_tensor(ggml_sys::TYPE_F32, &t.ne)?.set_name(&t.name);
            if tensor.name() != t.name {
                return Err(Error::Msg(format!("derived tensor name '{}' is longer than ggml keeps (a bug in the plugin)", t.name)));
            }
        }
        if self.measuring {
            let bytes = backend.buffer_type().size_for(&ctx);
            self.derived.push((None, ctx, bytes));
            return Ok(());
        }
        let buffer = backend.alloc_ctx_tensors(&ctx)?;
        for t in &tensors {
            ctx.get_tensor(&t.name).expect("created above").set_f32(&t.values)?;
        }
        let bytes = buffer.size();
        self.derived.push((Some(buffer), ctx, bytes));
        Ok(())
    }

    fn derived_tensor(&self, name: &str) -> Option<Tensor<'_>> {
        self.derived.iter().find_map(|(_, ctx, _)| ctx.get_tensor(name))
    }

    fn checked(&self, name: &str) -> Result<Tensor<'_>> {
        if let Some(t) = self.derived_tensor(name) {
            return Ok(t);
        }
        if self.table.is_stack(name) {
            return self.gguf.stacked(name).ok_or_else(|| Error::Msg(format!("stack '{name}' was not made (a bug in the plugin)")));
        }
        if !self.table.contains(name) {
            if self.left_out > 0 && self.gguf.ctx.get_tensor(name).is_some() {
                return Err(Error::Msg(format!("tensor '{name}' was not loaded: the model was loaded for part of its work (a bug in the plugin)")));
            }
            return Err(Error::Msg(format!("tensor '{name}' is not in the model's tensor table (a bug in the plugin)")));
        }
        self.gguf.ctx.get_tensor(name).ok_or_else(|| Error::Msg(format!("{}: tensor '{name}' is missing", self.gguf.file.path().display())))
    }

    /// A weight usable in a graph built in `ctx`. Graphs are owned next to the
    /// weights and dropped before them, so the rebinding is sound.
    pub fn tensor<'c>(&self, ctx: &'c Context, name: &str) -> Result<Tensor<'c>> {
        Ok(unsafe { self.checked(name)?.rebind(ctx) })
    }

    /// A weight's shape (ggml order).
    pub fn ne(&self, name: &str) -> Result<[i64; 4]> {
        Ok(self.checked(name)?.ne())
    }

    /// An F32 weight's values, read on the host (when measuring, from the file).
    pub fn host_f32(&self, name: &str) -> Result<Vec<f32>> {
        let t = self.checked(name)?;
        match self.measuring && self.derived_tensor(name).is_none() {
            true => self.gguf.read_f32(name),
            false => t.get_f32(),
        }
    }

    /// An I32 tensor's values, read on the host (token lists).
    pub fn host_i32(&self, name: &str) -> Result<Vec<i32>> {
        let t = self.checked(name)?;
        if t.ty() != ggml_sys::TYPE_I32 {
            return Err(Error::Msg(format!("{}: tensor '{name}' is not I32", self.gguf.file.path().display())));
        }
        let bytes = if self.measuring { self.gguf.read_bytes(name)? } else { t.get_bytes()? };
        Ok(bytes.chunks_exact(4).map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
}

/// Retypes the table's matrix-product weights as `storage` says (F32 ↔ F16;
/// quantized ones stay as they are).
fn apply_storage(gguf: &mut GgufTensors, table: &TensorTable, storage: WeightStorage) -> super::Result<()> {
    let to = match storage {
        WeightStorage::AsStored => return Ok(()),
        WeightStorage::F16 => ggml_sys::TYPE_F16,
        WeightStorage::F32 => ggml_sys::TYPE_F32,
    };
    let float = [ggml_sys::TYPE_F32, ggml_sys::TYPE_F16];
    for name in table.matrices() {
        if gguf.ctx.get_tensor(name).is_some_and(|t| float.contains(&t.ty())) {
            gguf.store_as(name, to)?;
        }
    }
    Ok(())
}
