//! What a built graph is made of: its nodes' ops and first-operand types, as
//! the census tests (which ops each policy lets into a graph) read them.

use crate::abi::{DeniedOp, KvType, ResolvedPolicies, WeightStorage};
use ggml_sys::{ComputeGraph, Type};
use std::collections::BTreeSet;

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

/// Each stage's nodes, as a census test collects them.
pub type StageNodes = Vec<(&'static str, Vec<NodeUse>)>;

/// The stages whose graph has a node of `op`.
pub fn stages_with(nodes: &StageNodes, op: &str) -> BTreeSet<&'static str> {
    nodes.iter().filter(|(_, n)| n.iter().any(|u| u.op == op)).map(|(s, _)| *s).collect()
}

/// A set of stage names, to compare with [`stages_with`].
pub fn stage_set(stages: &[&'static str]) -> BTreeSet<&'static str> {
    stages.iter().copied().collect()
}

/// `OP (stage)` for every node whose op `declared` (a family's `GRAPH_OPS`) lacks.
pub fn undeclared(nodes: &StageNodes, declared: &[&str]) -> BTreeSet<String> {
    nodes.iter().flat_map(|(s, n)| n.iter().filter(|u| !declared.contains(&u.op.as_str())).map(move |u| format!("{} ({s})", u.op))).collect()
}

/// Panics unless every op in the graphs is in `declared` (a family's
/// `GRAPH_OPS`, what load-time deny checks read).
pub fn assert_declared(nodes: &StageNodes, declared: &[&str]) {
    let missing = undeclared(nodes, declared);
    assert!(missing.is_empty(), "ops GRAPH_OPS does not declare: {missing:?}");
}

/// The rule name census tests deny ops with, as errors quote it.
pub const CENSUS_RULE: &str = "deny rule 1 (device \"CPU\"): census";

/// Every feature on (F16 K/V, weights as stored) and `ops` denied by
/// [`CENSUS_RULE`]: what a census test feeds `OpPolicy::from_resolved`.
pub fn all_on_denying(ops: &[&str]) -> ResolvedPolicies {
    let rule = CENSUS_RULE;
    ResolvedPolicies {
        flash_attn: true,
        kv_type: KvType::F16,
        matmul_weights: WeightStorage::AsStored,
        native_leaky_relu: true,
        conv_transpose_1d: true,
        pinned_host: false,
        denied_ops: ops.iter().map(|op| DeniedOp { op: (*op).into(), rule: rule.into() }).collect(),
        forced: Default::default(),
    }
}
