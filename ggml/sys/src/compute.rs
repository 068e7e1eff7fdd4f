//! A built-once, computed-many-times graph: its own op context, the graph, the
//! allocator holding the intermediates, and named input and output tensors.
//! Model plugins keep one per stage and shape and only upload new inputs.

use crate::backend::{Backend, Buffer, BufferType, GraphAllocator};
use crate::context::{decode_f32, encode_f32, Context, Graph, Tensor};
use crate::{err, sys, Result};
use std::cell::Cell;
use std::ptr::NonNull;

/// What a graph builder returns: named inputs and outputs.
#[derive(Default)]
pub struct GraphIo<'c> {
    pub inputs: Vec<(&'static str, Tensor<'c>)>,
    pub outputs: Vec<(&'static str, Tensor<'c>)>,
}

impl<'c> GraphIo<'c> {
    /// A new input tensor `name` of type `ty` and shape `ne` in `ctx`, registered here.
    pub fn input(&mut self, ctx: &'c crate::Context, name: &'static str, ty: crate::Type, ne: &[i64]) -> crate::Result<Tensor<'c>> {
        let t = ctx.new_tensor(ty, ne)?.set_name(name);
        self.inputs.push((name, t));
        Ok(t)
    }
}

/// Gives `graph` an identity of its own (ggml's graph uid, as its scheduler
/// gives each split): a ComputeGraph's nodes, shapes and addresses never
/// change after it is built (its inputs' values do), so a backend that keeps
/// state per graph may take an equal uid for an unchanged graph. CUDA then
/// replays its captured graph without comparing every node's properties on
/// every run, host time the device otherwise waits for each decode step.
/// `TTS_GRAPH_UID=0` leaves graphs without one (ggml's default), for
/// measuring what it saves.
fn set_identity(graph: NonNull<sys::ggml_cgraph>) {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if !*ENABLED.get_or_init(|| std::env::var("TTS_GRAPH_UID").map_or(true, |v| v != "0")) {
        return;
    }
    // `ggml_cgraph` is the struct `graph_internals` was generated from;
    // nothing else holds the graph while it is built.
    unsafe {
        let internal = graph.as_ptr().cast::<crate::graph_internals::ggml_cgraph>();
        (*internal).uid = crate::graph_internals::ggml_graph_next_uid();
    }
}

pub struct ComputeGraph {
    // Field order matters: the staging buffer, allocator and pointers die before the context.
    staging: Option<HostStaging>,
    _alloc: GraphAllocator,
    graph: NonNull<sys::ggml_cgraph>,
    inputs: Vec<(&'static str, NonNull<sys::ggml_tensor>)>,
    outputs: Vec<(&'static str, NonNull<sys::ggml_tensor>)>,
    ctx: Context,
}

unsafe impl Send for ComputeGraph {}

impl ComputeGraph {
    /// Builds a graph with room for `max_nodes` nodes and allocates it on `backend`.
    /// Tensors from other contexts (weights) may be used by the builder; they must
    /// outlive the returned graph (see [`Tensor::rebind`]).
    pub fn build<F>(backend: &Backend, max_nodes: usize, build: F) -> Result<Self>
    where
        F: for<'c> FnOnce(&'c Context) -> Result<GraphIo<'c>>,
    {
        let (ctx, graph, inputs, outputs) = Self::assemble(max_nodes, build)?;
        let built = unsafe { Graph::from_raw(graph) };
        check_supported(backend, &built)?;
        let mut alloc = GraphAllocator::new(backend)?;
        alloc.alloc(&built)?;
        set_identity(graph);
        Ok(ComputeGraph { staging: None, _alloc: alloc, graph, inputs, outputs, ctx })
    }

    /// The bytes of intermediates [`build`](Self::build) would allocate for the
    /// same graph in buffers of `buft`, measured without allocating them or
    /// running anything. Tensors the builder takes from other contexts
    /// (weights, caches) are never counted, whether or not they have memory
    /// yet, so a graph can be sized from a model file's metadata alone.
    pub fn measure<F>(buft: BufferType, max_nodes: usize, build: F) -> Result<usize>
    where
        F: for<'c> FnOnce(&'c Context) -> Result<GraphIo<'c>>,
    {
        let (ctx, graph, _, _) = Self::assemble(max_nodes, build)?;
        let built = unsafe { Graph::from_raw(graph) };
        let own: std::collections::HashSet<*mut sys::ggml_tensor> = ctx.tensors().iter().map(|t| t.as_ptr()).collect();
        // ggml's allocator places every source that has no memory. Sources from
        // other contexts without memory get a placeholder address for the
        // measurement, which reads addresses only to tell placed from unplaced
        // tensors and never dereferences them; they are reset before returning.
        let mut placeholders = Vec::new();
        for i in 0..built.n_nodes() {
            let node = built.node(i).expect("index below n_nodes").as_ptr();
            for src in unsafe { (*node).src } {
                let unplaced = !src.is_null() && unsafe { (*src).data.is_null() && (*src).view_src.is_null() };
                if unplaced && !own.contains(&src) && !placeholders.contains(&src) {
                    unsafe { (*src).data = NonNull::<u64>::dangling().as_ptr().cast() };
                    placeholders.push(src);
                }
            }
        }
        let size = GraphAllocator::for_type(buft).map(|mut alloc| alloc.measure(&built));
        for src in placeholders {
            unsafe { (*src).data = std::ptr::null_mut() };
        }
        size
    }

    /// The bytes of the buffer holding this graph's intermediates.
    pub fn buffer_size(&self) -> usize {
        self._alloc.buffer_size()
    }

    /// Builds the graph of `build` in a fresh op context: the context, the
    /// graph and the named inputs and outputs.
    #[allow(clippy::type_complexity)]
    fn assemble<F>(
        max_nodes: usize,
        build: F,
    ) -> Result<(Context, NonNull<sys::ggml_cgraph>, Vec<(&'static str, NonNull<sys::ggml_tensor>)>, Vec<(&'static str, NonNull<sys::ggml_tensor>)>)>
    where
        F: for<'c> FnOnce(&'c Context) -> Result<GraphIo<'c>>,
    {
        let ctx = Context::new_no_alloc(max_nodes * 2, max_nodes)?;
        let (graph, inputs, outputs) = {
            let io = build(&ctx)?;
            let mut graph = ctx.new_graph(max_nodes)?;
            // Unnamed inputs and outputs take their I/O name, so errors name them.
            let name = |n: &str, t: Tensor<'_>| {
                if t.name().is_empty() {
                    t.set_name(n);
                }
            };
            for (n, t) in &io.inputs {
                name(n, *t);
                t.set_input();
            }
            for (n, t) in &io.outputs {
                name(n, *t);
                t.set_output();
                graph.build_forward(*t);
            }
            let ptrs = |v: &[(&'static str, Tensor<'_>)]| v.iter().map(|(n, t)| (*n, NonNull::new(t.as_ptr()).unwrap())).collect::<Vec<_>>();
            (NonNull::new(graph.as_ptr()).unwrap(), ptrs(&io.inputs), ptrs(&io.outputs))
        };
        Ok((ctx, graph, inputs, outputs))
    }

    /// The built graph (its nodes, for checks and census).
    pub fn graph(&self) -> Graph<'_> {
        unsafe { Graph::from_raw(self.graph) }
    }

    fn find(list: &[(&'static str, NonNull<sys::ggml_tensor>)], name: &str) -> Option<NonNull<sys::ggml_tensor>> {
        list.iter().find(|(n, _)| *n == name).map(|(_, p)| *p)
    }

    fn input(&self, name: &str) -> Result<Tensor<'_>> {
        match Self::find(&self.inputs, name) {
            Some(p) => Ok(unsafe { Tensor::from_raw(p, &self.ctx) }),
            None => err(format!("graph has no input '{name}'")),
        }
    }

    fn output(&self, name: &str) -> Result<Tensor<'_>> {
        match Self::find(&self.outputs, name) {
            Some(p) => Ok(unsafe { Tensor::from_raw(p, &self.ctx) }),
            None => err(format!("graph has no output '{name}'")),
        }
    }

    /// Routes uploads and downloads of every input and output through one
    /// buffer of `buft`, a host buffer type (a device's pinned memory): values
    /// are converted straight into memory the device copies from directly,
    /// instead of into a temporary that the backend copies again. Refused for a
    /// buffer type the host cannot address.
    pub fn stage_in(&mut self, buft: BufferType) -> Result<()> {
        self.staging = None;
        if !buft.is_host() {
            return err("staging needs a host buffer type");
        }
        let align = buft.alignment().max(64);
        let mut slots: Vec<(NonNull<sys::ggml_tensor>, usize, Cell<bool>)> = Vec::new();
        let mut size = 0usize;
        for (_, p) in self.inputs.iter().chain(&self.outputs) {
            if slots.iter().any(|(q, ..)| q == p) {
                continue;
            }
            slots.push((*p, size, Cell::new(false)));
            size += unsafe { sys::ggml_nbytes(p.as_ptr()) }.div_ceil(align) * align;
        }
        let buffer = buft.alloc(size.max(align))?;
        let base = buffer.base();
        if base.is_null() || base.align_offset(4) != 0 {
            return err("host staging buffer has no usable base address");
        }
        self.staging = Some(HostStaging { _buffer: buffer, base, slots });
        Ok(())
    }

    /// Whether uploads and downloads go through a host staging buffer.
    pub fn is_staged(&self) -> bool {
        self.staging.is_some()
    }

    /// The staging address of `t` and its upload-pending flag, when staged.
    fn staged(&self, t: &Tensor<'_>) -> Option<(*mut u8, &Cell<bool>)> {
        let s = self.staging.as_ref()?;
        s.slots.iter().find(|(p, ..)| p.as_ptr() == t.as_ptr()).map(|(_, off, pending)| (unsafe { s.base.add(*off) }, pending))
    }

    /// Queues the copies of staged inputs written since the last compute on
    /// `backend`'s stream, ahead of the graph. The slots stay untouched until
    /// the next `set_*`, which callers make only after a compute that waited
    /// for the stream, so the copies always read what was written. A tensor
    /// outside the backend's own buffer type is copied synchronously.
    fn flush_inputs(&self, backend: &Backend) {
        let Some(s) = self.staging.as_ref() else { return };
        for (p, off, pending) in &s.slots {
            if !pending.replace(false) {
                continue;
            }
            let t = p.as_ptr();
            unsafe {
                let src = s.base.add(*off).cast::<std::ffi::c_void>();
                if in_own_buffer(backend, t) {
                    sys::ggml_backend_tensor_set_async(backend.as_ptr(), t, src, 0, sys::ggml_nbytes(t));
                } else {
                    sys::ggml_backend_tensor_set(t, src, 0, sys::ggml_nbytes(t));
                }
            }
        }
    }

    /// Uploads f32 values into the input `name` (converted to its type).
    pub fn set_f32(&self, name: &str, values: &[f32]) -> Result<()> {
        let t = self.input(name)?;
        let Some((dst, pending)) = self.staged(&t) else {
            return t.set_f32(values);
        };
        t.check_f32_upload(values.len())?;
        // The slot holds n_bytes of this tensor; the copy to the device is
        // queued by the next compute (see `flush_inputs`).
        unsafe { encode_f32(values, t.ty(), dst)? };
        pending.set(true);
        Ok(())
    }

    /// Uploads I32 values into the input `name` (widened where it is I64).
    pub fn set_i32(&self, name: &str, values: &[i32]) -> Result<()> {
        let t = self.input(name)?;
        let Some((dst, pending)) = self.staged(&t) else {
            return t.set_i32(values);
        };
        t.check_i32_upload(values.len())?;
        unsafe { crate::context::encode_i32(values, t.ty(), dst) };
        pending.set(true);
        Ok(())
    }

    /// Downloads the output `name` as f32.
    pub fn get_f32(&self, name: &str) -> Result<Vec<f32>> {
        let t = self.output(name)?;
        let Some((src, _)) = self.staged(&t) else {
            return t.get_f32();
        };
        t.check_buffer()?;
        unsafe {
            sys::ggml_backend_tensor_get(t.as_ptr(), src.cast(), 0, t.n_bytes());
            decode_f32(src, t.ty(), t.n_elements())
        }
    }

    pub fn compute(&self, backend: &Backend) -> Result<()> {
        self.flush_inputs(backend);
        backend.compute(&self.graph())
    }

    /// Computes and downloads the output `name`, waiting for the device once:
    /// the staged inputs' copies, the graph and the output's copy are queued
    /// on the backend's stream together (a decode step's round trip).
    /// Unstaged graphs compute, then download.
    pub fn compute_and_get_f32(&self, backend: &Backend, name: &str) -> Result<Vec<f32>> {
        let t = self.output(name)?;
        let queued = match self.staged(&t) {
            Some((slot, _)) if in_own_buffer(backend, t.as_ptr()) => Some(slot),
            _ => None,
        };
        let Some(slot) = queued else {
            self.compute(backend)?;
            return self.get_f32(name);
        };
        self.flush_inputs(backend);
        if let Err(e) = backend.compute_async(&self.graph()) {
            // The queued input copies still read the slots: let them finish.
            backend.synchronize();
            return Err(e);
        }
        unsafe { sys::ggml_backend_tensor_get_async(backend.as_ptr(), t.as_ptr(), slot.cast(), 0, t.n_bytes()) };
        backend.synchronize();
        unsafe { decode_f32(slot, t.ty(), t.n_elements()) }
    }
}

/// Whether `t`'s data (its view source's, for a view) lives in a buffer of
/// `backend`'s own type, the only memory its asynchronous copies take.
fn in_own_buffer(backend: &Backend, t: *const sys::ggml_tensor) -> bool {
    unsafe {
        let buffer = if (*t).view_src.is_null() { (*t).buffer } else { (*(*t).view_src).buffer };
        !buffer.is_null() && sys::ggml_backend_buffer_get_type(buffer) == sys::ggml_backend_get_default_buffer_type(backend.as_ptr())
    }
}

/// A host buffer holding one slot per graph input and output.
struct HostStaging {
    _buffer: Buffer,
    base: *mut u8,
    /// Each tensor's slot offset from `base` (aligned, `ggml_nbytes` long) and,
    /// for inputs, whether it holds values not yet copied to the device.
    slots: Vec<(NonNull<sys::ggml_tensor>, usize, Cell<bool>)>,
}

/// Refuses a graph with a node the device cannot run: a backend computing an
/// unsupported node aborts the process, a refused graph is an error.
fn check_supported(backend: &Backend, graph: &Graph<'_>) -> Result<()> {
    let Some(device) = backend.device() else {
        return Ok(());
    };
    for i in 0..graph.n_nodes() {
        let Some(node) = graph.node(i) else { break };
        if !device.supports_op(node) {
            let ne = node.ne();
            return err(format!(
                "{} cannot run {} ({}, shape {}x{}x{}x{}) that this model needs",
                device.name(),
                crate::op_name(node.op()),
                crate::type_name(node.ty()),
                ne[0],
                ne[1],
                ne[2],
                ne[3]
            ));
        }
    }
    Ok(())
}

/// One stage's cached graphs by the shape key each was built for: a model
/// keeps one slot per stage and builds a graph only for a shape it does not
/// hold. A slot holds up to `capacity` graphs and drops the least recently
/// used first, so work that alternates between a few shapes (the chunks of a
/// long text) keeps its graphs, their buffers and the device's recorded
/// replays, instead of rebuilding each one every time.
pub struct GraphSlot<K, G = ComputeGraph> {
    /// Least recently used first.
    cached: Vec<(K, G)>,
    capacity: usize,
}

impl<K, G> Default for GraphSlot<K, G> {
    /// A slot for one shape.
    fn default() -> Self {
        Self::with_capacity(1)
    }
}

impl<K, G> GraphSlot<K, G> {
    /// A slot that keeps up to `capacity` graphs (at least one).
    pub fn with_capacity(capacity: usize) -> Self {
        GraphSlot { cached: Vec::new(), capacity: capacity.max(1) }
    }
}

impl<K: PartialEq, G> GraphSlot<K, G> {
    /// The graph for `key`, built by `build` when the slot does not hold it
    /// (a full slot drops its least recently used graph first, so that graph's
    /// buffers are freed before the new one allocates). When building fails
    /// while the slot holds other graphs (their buffers may be what the new
    /// one lacks), they are all dropped and the graph is built once more: the
    /// graphs kept for other shapes use memory only while it is spare, and a
    /// model's memory plan counts one graph per stage.
    pub fn get_or_build<E>(&mut self, key: K, mut build: impl FnMut() -> std::result::Result<G, E>) -> std::result::Result<&G, E> {
        match self.cached.iter().position(|(k, _)| *k == key) {
            Some(i) => {
                let hit = self.cached.remove(i);
                self.cached.push(hit);
            }
            None => {
                if self.cached.len() >= self.capacity {
                    self.cached.remove(0);
                }
                let graph = match build() {
                    Err(_) if !self.cached.is_empty() => {
                        self.cached.clear();
                        build()?
                    }
                    built => built?,
                };
                self.cached.push((key, graph));
            }
        }
        Ok(&self.cached.last().expect("filled above").1)
    }

    /// The most recently used graph (after `get_or_build`, when the caller
    /// needs the slot's borrow released between the two).
    pub fn graph(&self) -> Option<&G> {
        self.cached.last().map(|(_, g)| g)
    }

    /// How many graphs the slot holds.
    pub fn len(&self) -> usize {
        self.cached.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cached.is_empty()
    }

    /// Drops every cached graph (their inputs or weights are about to go away).
    pub fn clear(&mut self) {
        self.cached.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::GraphSlot;

    /// The private graph struct `set_identity` writes is laid out as the
    /// library's: its counts read through it agree with ggml's accessors,
    /// and each graph built gets a uid of its own.
    #[test]
    fn graph_identities_are_written_into_the_library_layout() {
        fn build(ctx: &crate::Context) -> crate::Result<super::GraphIo<'_>> {
            let mut io = super::GraphIo { inputs: Vec::new(), outputs: Vec::new() };
            let a = io.input(ctx, "a", crate::TYPE_F32, &[4])?;
            let sum = ctx.add(a, a)?;
            io.outputs.push(("sum", ctx.mul(sum, a)?));
            Ok(io)
        }
        let uid = |graph: std::ptr::NonNull<crate::sys::ggml_cgraph>| {
            let internal = unsafe { &*graph.as_ptr().cast::<crate::graph_internals::ggml_cgraph>() };
            let (size, nodes) = unsafe { (crate::sys::ggml_graph_size(graph.as_ptr()), crate::sys::ggml_graph_n_nodes(graph.as_ptr())) };
            assert_eq!((internal.size, internal.n_nodes), (size, nodes));
            assert_eq!(nodes, 2);
            super::set_identity(graph);
            internal.uid
        };
        let (_ctx1, first, _, _) = super::ComputeGraph::assemble(16, build).unwrap();
        let (_ctx2, second, _, _) = super::ComputeGraph::assemble(16, build).unwrap();
        let (a, b) = (uid(first), uid(second));
        assert!(a != 0 && b != 0 && a != b, "{a} {b}");
    }

    /// Builds through `slot` and records which keys were built.
    fn get(slot: &mut GraphSlot<u32, String>, key: u32, built: &mut Vec<u32>) -> String {
        slot.get_or_build(key, || {
            built.push(key);
            Ok::<_, ()>(format!("graph {key}"))
        })
        .unwrap()
        .clone()
    }

    #[test]
    fn a_slot_keeps_its_most_recently_used_shapes() {
        let mut slot = GraphSlot::with_capacity(2);
        let mut built = Vec::new();
        for key in [1, 2, 1, 2, 1] {
            assert_eq!(get(&mut slot, key, &mut built), format!("graph {key}"));
        }
        assert_eq!(built, [1, 2], "alternating between two shapes builds each once");
        // 1 was used last, so a third shape drops 2.
        get(&mut slot, 3, &mut built);
        get(&mut slot, 1, &mut built);
        get(&mut slot, 2, &mut built);
        assert_eq!(built, [1, 2, 3, 2]);
        assert_eq!(slot.len(), 2);
        assert_eq!(slot.graph().map(String::as_str), Some("graph 2"));
    }

    #[test]
    fn a_default_slot_holds_one_shape_and_a_failed_build_keeps_nothing_new() {
        let mut slot: GraphSlot<u32, String> = GraphSlot::default();
        let mut built = Vec::new();
        get(&mut slot, 1, &mut built);
        get(&mut slot, 2, &mut built);
        get(&mut slot, 1, &mut built);
        assert_eq!(built, [1, 2, 1]);
        assert!(slot.get_or_build(5, || Err::<String, _>("no memory")).is_err());
        assert!(slot.is_empty(), "the full slot dropped its graph before the failed build");
        slot.clear();
        assert!(slot.graph().is_none());
    }

    #[test]
    fn a_build_that_fails_beside_kept_graphs_is_retried_without_them() {
        let mut slot: GraphSlot<u32, String> = GraphSlot::with_capacity(4);
        let mut built = Vec::new();
        get(&mut slot, 1, &mut built);
        get(&mut slot, 2, &mut built);
        // Fails while any other graph is kept (as when their buffers fill the device).
        let mut attempts = 0;
        let kept = slot.len();
        let graph = slot.get_or_build(3, || {
            attempts += 1;
            if attempts == 1 && kept > 0 {
                Err("out of memory")
            } else {
                Ok("graph 3".to_string())
            }
        });
        assert_eq!(graph.unwrap(), "graph 3");
        assert_eq!(attempts, 2);
        assert_eq!(slot.len(), 1, "the kept graphs were dropped for the retry");
        // A build that fails alone fails once, and is not retried.
        let mut tries = 0;
        let mut lone = GraphSlot::<u32, String>::with_capacity(4);
        assert!(lone
            .get_or_build(7, || {
                tries += 1;
                Err::<String, _>("out of memory")
            })
            .is_err());
        assert_eq!(tries, 1);
    }
}
