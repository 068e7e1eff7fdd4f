//! A built-once, computed-many-times graph: its own op context, the graph, the
//! allocator holding the intermediates, and named input and output tensors.
//! Model plugins keep one per stage and shape and only upload new inputs.

use crate::backend::{Backend, GraphAllocator};
use crate::context::{Context, Graph, Tensor};
use crate::{err, sys, Result};
use std::ptr::NonNull;

/// What a graph builder returns: named inputs and outputs.
pub struct GraphIo<'c> {
    pub inputs: Vec<(&'static str, Tensor<'c>)>,
    pub outputs: Vec<(&'static str, Tensor<'c>)>,
}

pub struct ComputeGraph {
    // Field order matters: the allocator and pointers die before the context.
    alloc: GraphAllocator,
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
        let ctx = Context::new_no_alloc(max_nodes * 2, max_nodes)?;
        let (graph, inputs, outputs) = {
            let io = build(&ctx)?;
            let mut graph = ctx.new_graph(max_nodes)?;
            for (_, t) in &io.inputs {
                t.set_input();
            }
            for (_, t) in &io.outputs {
                t.set_output();
                graph.build_forward(*t);
            }
            let ptrs = |v: &[(&'static str, Tensor<'_>)]| v.iter().map(|(n, t)| (*n, NonNull::new(t.as_ptr()).unwrap())).collect::<Vec<_>>();
            (NonNull::new(graph.as_ptr()).unwrap(), ptrs(&io.inputs), ptrs(&io.outputs))
        };
        let built = unsafe { Graph::from_raw(graph) };
        check_supported(backend, &built)?;
        let mut alloc = GraphAllocator::new(backend)?;
        alloc.alloc(&built)?;
        Ok(ComputeGraph { alloc, graph, inputs, outputs, ctx })
    }

    /// The built graph (its nodes, for checks and census).
    pub fn graph(&self) -> Graph<'_> {
        unsafe { Graph::from_raw(self.graph) }
    }

    fn find(list: &[(&'static str, NonNull<sys::ggml_tensor>)], name: &str) -> Option<NonNull<sys::ggml_tensor>> {
        list.iter().find(|(n, _)| *n == name).map(|(_, p)| *p)
    }

    pub fn input(&self, name: &str) -> Result<Tensor<'_>> {
        match Self::find(&self.inputs, name) {
            Some(p) => Ok(unsafe { Tensor::from_raw(p, &self.ctx) }),
            None => err(format!("graph has no input '{name}'")),
        }
    }

    pub fn output(&self, name: &str) -> Result<Tensor<'_>> {
        match Self::find(&self.outputs, name) {
            Some(p) => Ok(unsafe { Tensor::from_raw(p, &self.ctx) }),
            None => err(format!("graph has no output '{name}'")),
        }
    }

    pub fn compute(&self, backend: &Backend) -> Result<()> {
        backend.compute(&self.graph())
    }

    pub fn n_nodes(&self) -> usize {
        self.graph().n_nodes()
    }

    /// Bytes of the intermediate buffer.
    pub fn buffer_size(&self) -> usize {
        self.alloc.size()
    }
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

/// One stage's cached graph and the shape key it was built for: a model keeps
/// one slot per stage and rebuilds only when the shape changes.
pub struct GraphSlot<K> {
    cached: Option<(K, ComputeGraph)>,
}

impl<K> Default for GraphSlot<K> {
    fn default() -> Self {
        GraphSlot { cached: None }
    }
}

impl<K: PartialEq> GraphSlot<K> {
    /// The graph for `key`, built by `build` when the slot holds another shape
    /// (the old graph is dropped first, so its buffers are freed before the
    /// new one allocates).
    pub fn get_or_build<E>(&mut self, key: K, build: impl FnOnce() -> std::result::Result<ComputeGraph, E>) -> std::result::Result<&ComputeGraph, E> {
        if self.cached.as_ref().is_none_or(|(k, _)| *k != key) {
            self.cached = None;
            self.cached = Some((key, build()?));
        }
        Ok(&self.cached.as_ref().expect("filled above").1)
    }

    /// The cached graph, whatever its key (after `get_or_build`, when the
    /// caller needs the slot's borrow released between the two).
    pub fn graph(&self) -> Option<&ComputeGraph> {
        self.cached.as_ref().map(|(_, g)| g)
    }

    /// Drops the cached graph (its inputs or weights are about to go away).
    pub fn clear(&mut self) {
        self.cached = None;
    }
}
