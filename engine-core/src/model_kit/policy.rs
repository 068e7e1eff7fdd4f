//! The resolved policies as the graph builders obey them: which attention,
//! K/V type, weight storage, native or composed ops, and the ops a deny rule
//! forbids. Every model plugin builds through [`super::Builder`], whose ops
//! read this, so obeying a profile is structural rather than per model.

use super::error::Result;
use crate::abi::{KvType, ResolvedPolicies, WeightStorage};
use ggml_sys::{Graph, Type};

#[derive(Debug, Clone, PartialEq)]
pub struct OpPolicy {
    /// Fused `FLASH_ATTN_EXT` where the device runs the node; else explicit
    /// product, softmax, product.
    pub fused_attention: bool,
    /// Element type of persistent K/V caches (fused attention only).
    pub kv_type: Type,
    pub matmul_weights: WeightStorage,
    /// The backend's `LEAKY_RELU`; else `relu(x)·(1−s) + s·x`.
    pub native_leaky_relu: bool,
    /// The backend's `CONV_TRANSPOSE_1D`; else a matrix product and shifted sums.
    pub native_conv_transpose_1d: bool,
    /// Stage graph inputs and outputs through the device's pinned host buffer.
    pub pinned_host: bool,
    /// `(op, rule)`: ops a deny rule forbids, with the rule as errors name it.
    pub denied: Vec<(String, String)>,
    /// Policies the profile sets to "on": where a model cannot honour one on
    /// this device it refuses to load ([`OpPolicy::refuse_if_forced`]).
    pub forced: Vec<String>,
}

/// The profile policy that selects a K/V cache element type (`flash_attn`
/// for F32), and the probe that policy resolves with.
pub fn kv_cache_policy(kv_type: Type) -> (&'static str, &'static str) {
    let feature = match kv_type {
        ggml_sys::TYPE_F16 => "kv_f16",
        ggml_sys::TYPE_BF16 => "kv_bf16",
        ggml_sys::TYPE_Q8_0 => "kv_q8_0",
        _ => "flash_attn",
    };
    (feature, crate::policy::feature_probe(feature))
}

impl OpPolicy {
    /// What the host resolved for the chosen device.
    pub fn from_resolved(p: &ResolvedPolicies) -> Self {
        let kv_type = match p.kv_type {
            KvType::F32 => ggml_sys::TYPE_F32,
            KvType::F16 => ggml_sys::TYPE_F16,
            KvType::Bf16 => ggml_sys::TYPE_BF16,
            KvType::Q8_0 => ggml_sys::TYPE_Q8_0,
        };
        let denied = |op: &str| p.denied_ops.iter().any(|d| d.op.as_str().eq_ignore_ascii_case(op));
        OpPolicy {
            fused_attention: p.flash_attn && !denied("FLASH_ATTN_EXT"),
            kv_type: if p.flash_attn { kv_type } else { ggml_sys::TYPE_F32 },
            matmul_weights: p.matmul_weights,
            native_leaky_relu: p.native_leaky_relu && !denied("LEAKY_RELU"),
            native_conv_transpose_1d: p.conv_transpose_1d && !denied("CONV_TRANSPOSE_1D"),
            pinned_host: p.pinned_host,
            denied: p.denied_ops.iter().map(|d| (d.op.to_string(), d.rule.to_string())).collect(),
            forced: p.forced.iter().map(|f| f.to_string()).collect(),
        }
    }

    /// The reference path: explicit attention with F32 K/V, weights as
    /// stored, composed ops. What parity tests compare first.
    pub fn reference() -> Self {
        OpPolicy {
            fused_attention: false,
            kv_type: ggml_sys::TYPE_F32,
            matmul_weights: WeightStorage::AsStored,
            native_leaky_relu: false,
            native_conv_transpose_1d: false,
            pinned_host: false,
            denied: Vec::new(),
            forced: Vec::new(),
        }
    }

    /// Every native op, fused attention with `kv_type` K/V, and pinned host
    /// staging where the device offers it.
    pub fn native(kv_type: Type) -> Self {
        OpPolicy { fused_attention: true, kv_type, native_leaky_relu: true, native_conv_transpose_1d: true, pinned_host: true, ..Self::reference() }
    }

    /// Where a model must fall back from what the policies enabled (`why`
    /// says what it cannot do): an error naming the first of `policies` the
    /// profile forced on, or Ok when each was only `auto`, so the caller
    /// warns and falls back.
    pub fn refuse_if_forced(&self, policies: &[&str], why: &str) -> Result<()> {
        match policies.iter().find(|p| self.forced.iter().any(|f| f == *p)) {
            Some(p) => Err(format!("policy `{p}` is on, but {why}").into()),
            None => Ok(()),
        }
    }

    /// The rule that forbids `op`, if one does.
    pub fn denial(&self, op: &str) -> Option<&str> {
        self.denied.iter().find(|(o, _)| o.eq_ignore_ascii_case(op)).map(|(_, rule)| rule.as_str())
    }

    /// Refuses a graph with a node a deny rule forbids (an op the kit has no
    /// fallback for): one line naming the op, the rule and the graph.
    pub fn check_graph(&self, graph: &Graph<'_>, what: &str) -> Result<()> {
        if self.denied.is_empty() {
            return Ok(());
        }
        for i in 0..graph.n_nodes() {
            let Some(node) = graph.node(i) else { break };
            let op = ggml_sys::op_name(node.op());
            if let Some(rule) = self.denial(&op) {
                return Err(format!("{op} is denied on this device by {rule}, and {what} has no fallback for it").into());
            }
        }
        Ok(())
    }
}

/// Ops the kit builds another way when they are denied (or off by policy).
pub const OPS_WITH_FALLBACK: [&str; 5] = ["FLASH_ATTN_EXT", "LEAKY_RELU", "CONV_TRANSPOSE_1D", "CONV_2D_DW", "CONV_2D"];

impl OpPolicy {
    /// At load: refuses a deny rule on an op the family's graphs use
    /// (`graph_ops`) and the kit has no fallback for, naming op and rule.
    pub fn check_denials(&self, family: &str, graph_ops: &[&str]) -> Result<()> {
        for (op, rule) in &self.denied {
            let used = graph_ops.iter().any(|o| o.eq_ignore_ascii_case(op));
            if used && !OPS_WITH_FALLBACK.iter().any(|o| o.eq_ignore_ascii_case(op)) {
                return Err(format!("{op} is denied on this device by {rule}, and {family} has no fallback for it").into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{kv_cache_policy, OpPolicy};

    #[test]
    fn each_cache_type_names_its_policy_and_probe() {
        assert_eq!(kv_cache_policy(ggml_sys::TYPE_BF16), ("kv_bf16", crate::probes::FLASH_ATTN_BF16_KV));
        assert_eq!(kv_cache_policy(ggml_sys::TYPE_Q8_0), ("kv_q8_0", crate::probes::FLASH_ATTN_Q8_0_KV));
        assert_eq!(kv_cache_policy(ggml_sys::TYPE_F16), ("kv_f16", crate::probes::FLASH_ATTN_F16_KV));
        assert_eq!(kv_cache_policy(ggml_sys::TYPE_F32), ("flash_attn", crate::probes::FLASH_ATTN_F32_KV));
    }

    #[test]
    fn a_fallback_from_a_forced_policy_is_an_error_naming_it() {
        let policy = OpPolicy { forced: vec!["kv_bf16".into()], ..OpPolicy::native(ggml_sys::TYPE_BF16) };
        let e = policy.refuse_if_forced(&["flash_attn", "kv_bf16"], "CUDA0 has no kernel").unwrap_err();
        assert_eq!(e.to_string(), "policy `kv_bf16` is on, but CUDA0 has no kernel");
        assert!(policy.refuse_if_forced(&["flash_attn", "kv_f16"], "CUDA0 has no kernel").is_ok(), "auto policies fall back");
    }
}
