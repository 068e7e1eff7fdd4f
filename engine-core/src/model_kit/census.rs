//! What a built graph is made of: its nodes' ops and first-operand types, as
//! the census tests (which ops each policy lets into a graph) read them.

use ggml_sys::{ComputeGraph, Type};

#[derive(Debug, Clone, PartialEq)]
pub struct NodeUse {
    /// ggml op name (`MUL_MAT`, `FLASH_ATTN_EXT`, ...).
    pub op: String,
    /// Type of the first operand (the weight of a matrix product).
    pub src0: Option<Type>,
}

/// Every node of `graph`, in order.
pub fn census(graph: &ComputeGraph) -> Vec<NodeUse> {
    let g = graph.graph();
    (0..g.n_nodes()).filter_map(|i| g.node(i)).map(|n| NodeUse { op: ggml_sys::op_name(n.op()), src0: n.src(0).map(|s| s.ty()) }).collect()
}
