//! Policy resolution. Each policy in a profile is `auto`, `on` or `off`:
//! `auto` follows the device's probe, `on` for an unsupported or denied feature is
//! an error, `off` is off. Deny rules match device names (globs) and switch features
//! or ggml ops off for those devices.

use crate::abi::{DeniedOp, KvType, ProbeResult, ResolvedPolicies, WeightStorage};
use crate::probes;
use abi_stable::std_types::RString;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    #[default]
    Auto,
    On,
    Off,
}

impl Policy {
    pub fn as_str(&self) -> &'static str {
        match self {
            Policy::Auto => "auto",
            Policy::On => "on",
            Policy::Off => "off",
        }
    }
}

/// The `[policies]` table.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// Fused flash attention (F32 K/V).
    pub flash_attn: Policy,
    /// F16 K/V cache through flash attention.
    pub kv_f16: Policy,
    /// BF16 K/V cache (off by default: precision).
    pub kv_bf16: Policy,
    /// Q8_0 K/V cache (off by default: precision).
    pub kv_q8_0: Policy,
    /// Matrix-product weights in F16: `auto` keeps the file's types (widening
    /// F16 where the device lacks F16 products), `on` narrows F32 to F16, `off`
    /// widens F16 to F32.
    pub f16_weights: Policy,
    /// The backend's own LEAKY_RELU instead of a decomposition.
    pub native_leaky_relu: Policy,
    /// The backend's own CONV_TRANSPOSE_1D instead of a decomposition.
    pub conv_transpose_1d: Policy,
    /// Pinned host staging buffers for uploads.
    pub pinned_host: Policy,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            flash_attn: Policy::Auto,
            kv_f16: Policy::Auto,
            kv_bf16: Policy::Off,
            kv_q8_0: Policy::Off,
            f16_weights: Policy::Auto,
            native_leaky_relu: Policy::Auto,
            conv_transpose_1d: Policy::Auto,
            pinned_host: Policy::Auto,
        }
    }
}

/// Feature names (the `[policies]` keys), valid in deny rules' `features`.
pub const FEATURES: [&str; 8] = ["flash_attn", "kv_f16", "kv_bf16", "kv_q8_0", "f16_weights", "native_leaky_relu", "conv_transpose_1d", "pinned_host"];

impl PolicyConfig {
    fn get(&self, feature: &str) -> Policy {
        match feature {
            "flash_attn" => self.flash_attn,
            "kv_f16" => self.kv_f16,
            "kv_bf16" => self.kv_bf16,
            "kv_q8_0" => self.kv_q8_0,
            "f16_weights" => self.f16_weights,
            "native_leaky_relu" => self.native_leaky_relu,
            "conv_transpose_1d" => self.conv_transpose_1d,
            "pinned_host" => self.pinned_host,
            _ => Policy::Off,
        }
    }
}

/// The probe a feature follows.
pub fn feature_probe(feature: &str) -> &'static str {
    match feature {
        "flash_attn" => probes::FLASH_ATTN_F32_KV,
        "kv_f16" => probes::FLASH_ATTN_F16_KV,
        "kv_bf16" => probes::FLASH_ATTN_BF16_KV,
        "kv_q8_0" => probes::FLASH_ATTN_Q8_0_KV,
        "f16_weights" => probes::MUL_MAT_F16_WEIGHT,
        "native_leaky_relu" => probes::NATIVE_LEAKY_RELU,
        "conv_transpose_1d" => probes::CONV_TRANSPOSE_1D,
        _ => probes::PINNED_HOST_BUFFER,
    }
}

/// One `[[deny]]` rule.
#[derive(Debug, Clone)]
pub struct DenyRule {
    /// 1-based position in the profile, for messages.
    pub number: usize,
    pub device_pattern: String,
    pub matcher: globset::GlobMatcher,
    pub backend: Option<String>,
    pub features: Vec<String>,
    pub ops: Vec<String>,
    pub reason: Option<String>,
}

impl DenyRule {
    /// Matches the glob against the device name and its description.
    pub fn matches(&self, backend: &str, device_name: &str, device_description: &str) -> bool {
        self.backend.as_deref().is_none_or(|b| b.eq_ignore_ascii_case(backend))
            && (self.matcher.is_match(device_name) || self.matcher.is_match(device_description))
    }

    fn describe(&self) -> String {
        let reason = self.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
        format!("deny rule {} (device \"{}\"){reason}", self.number, self.device_pattern)
    }
}

/// How one feature was decided, for `tts devices`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Decision {
    pub feature: String,
    pub setting: Policy,
    pub enabled: bool,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Resolution {
    pub decisions: Vec<Decision>,
    pub kv_type: String,
    /// How matrix-product weights are stored: "as stored", "f16" or "f32".
    pub matmul_weights: String,
    pub denied_ops: Vec<String>,
    #[serde(skip)]
    pub policies: ResolvedPolicies,
}

/// The device a resolution is for.
pub struct DeviceRef<'a> {
    pub backend: &'a str,
    pub name: &'a str,
    pub description: &'a str,
}

/// `auto` settings that measurements overrule on one backend: the probe says
/// the op runs, but the path without it is faster, so `auto` leaves the
/// feature off there (`on` in a profile still turns it on). Each names the
/// measurement in docs/performance.md.
const SLOWER_THAN_ITS_ALTERNATIVE: [(&str, &str, &str); 1] =
    [("vulkan", "conv_transpose_1d", "ggml-vulkan's CONV_TRANSPOSE_1D is slower than the matrix product and shifted sums on HiFT's shapes")];

fn slower_than_its_alternative(backend: &str, feature: &str) -> Option<&'static str> {
    SLOWER_THAN_ITS_ALTERNATIVE.iter().find(|(b, f, _)| b.eq_ignore_ascii_case(backend) && *f == feature).map(|(_, _, why)| *why)
}

pub fn resolve(config: &PolicyConfig, deny: &[DenyRule], device: &DeviceRef<'_>, probes: &[ProbeResult]) -> Result<Resolution, String> {
    let rules: Vec<&DenyRule> = deny.iter().filter(|r| r.matches(device.backend, device.name, device.description)).collect();
    let mut denied_ops: Vec<String> = rules.iter().flat_map(|r| r.ops.iter().cloned()).collect();
    denied_ops.sort();
    denied_ops.dedup();
    let denied_with_rules: Vec<DeniedOp> = denied_ops
        .iter()
        .map(|op| {
            let rule = rules.iter().find(|r| r.ops.contains(op)).map(|r| r.describe()).unwrap_or_default();
            DeniedOp { op: op.as_str().into(), rule: rule.into() }
        })
        .collect();

    let mut decisions = Vec::new();
    for feature in FEATURES {
        let setting = config.get(feature);
        let probe_name = feature_probe(feature);
        let probe = probes.iter().find(|p| p.name.as_str() == probe_name);
        let denying_rule =
            rules.iter().find(|r| r.features.iter().any(|f| f == feature) || probes::probe_op(probe_name).is_some_and(|op| r.ops.iter().any(|o| o == op)));
        let slower = slower_than_its_alternative(device.backend, feature);
        let (enabled, reason) = match (setting, denying_rule, probe) {
            (Policy::Off, _, _) => (false, "off in profile".to_string()),
            (Policy::On, Some(rule), _) => {
                return Err(format!("policy `{feature}` is on, but {} disables it on {} ({})", rule.describe(), device.name, device.description))
            }
            (Policy::Auto, Some(rule), _) => (false, rule.describe()),
            (Policy::Auto, None, Some(p)) if p.supported && slower.is_some() => {
                (false, format!("probe {probe_name}: supported, but {}", slower.unwrap_or_default()))
            }
            (_, None, Some(p)) if p.supported => (true, format!("probe {probe_name}: supported")),
            (Policy::On, None, p) => {
                let detail = p.map(|p| p.detail.to_string()).unwrap_or_else(|| "not probed".into());
                return Err(format!(
                    "policy `{feature}` is on, but {} ({}) does not support it (probe {probe_name}: {detail})",
                    device.name, device.description
                ));
            }
            (Policy::Auto, None, _) => (false, format!("probe {probe_name}: unsupported")),
        };
        decisions.push(Decision { feature: feature.into(), setting, enabled, reason });
    }

    let on = |f: &str| decisions.iter().any(|d| d.feature == f && d.enabled);
    let forced_kv: Vec<&str> = ["kv_f16", "kv_bf16", "kv_q8_0"].into_iter().filter(|f| config.get(f) == Policy::On).collect();
    if forced_kv.len() > 1 {
        return Err(format!("policies {} are all on; a K/V cache has one type, turn all but one off", forced_kv.join(" and ")));
    }
    // Most compact enabled type wins: kv_bf16 / kv_q8_0 are off unless asked for.
    let kv_type = if on("kv_q8_0") {
        KvType::Q8_0
    } else if on("kv_bf16") {
        KvType::Bf16
    } else if on("kv_f16") {
        KvType::F16
    } else {
        KvType::F32
    };
    // `auto` keeps the file's types where the device multiplies F16; only an
    // explicit `on` narrows F32 weights.
    let matmul_weights = match (on("f16_weights"), config.f16_weights) {
        (false, _) => WeightStorage::F32,
        (true, Policy::On) => WeightStorage::F16,
        (true, _) => WeightStorage::AsStored,
    };
    let policies = ResolvedPolicies {
        flash_attn: on("flash_attn"),
        kv_type,
        matmul_weights,
        native_leaky_relu: on("native_leaky_relu"),
        conv_transpose_1d: on("conv_transpose_1d"),
        pinned_host: on("pinned_host"),
        denied_ops: denied_with_rules.into(),
        forced: FEATURES.iter().filter(|f| config.get(f) == Policy::On).map(|f| RString::from(*f)).collect(),
    };
    Ok(Resolution { decisions, kv_type: kv_type.as_str().into(), matmul_weights: matmul_weights.as_str().into(), denied_ops, policies })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(name: &str, supported: bool) -> ProbeResult {
        ProbeResult { name: name.into(), supported, detail: "synthetic".into() }
    }

    fn all_probes(supported: bool) -> Vec<ProbeResult> {
        probes::ALL.iter().map(|n| probe(n, supported)).collect()
    }

    fn rule(pattern: &str, features: &[&str], ops: &[&str]) -> DenyRule {
        DenyRule {
            number: 1,
            device_pattern: pattern.into(),
            matcher: globset::GlobBuilder::new(pattern).case_insensitive(true).build().unwrap().compile_matcher(),
            backend: None,
            features: features.iter().map(|s| s.to_string()).collect(),
            ops: ops.iter().map(|s| s.to_string()).collect(),
            reason: Some("test".into()),
        }
    }

    const DEV: DeviceRef<'static> = DeviceRef { backend: "vulkan", name: "Vulkan0", description: "Mali-G78" };

    #[test]
    fn auto_leaves_a_measured_slower_op_off_and_on_still_enables_it() {
        let r = resolve(&PolicyConfig::default(), &[], &DEV, &all_probes(true)).unwrap();
        assert!(!r.policies.conv_transpose_1d, "vulkan: auto takes the decomposed path");
        let d = r.decisions.iter().find(|d| d.feature == "conv_transpose_1d").unwrap();
        assert!(!d.enabled && d.reason.contains("slower than the matrix product"), "{}", d.reason);
        let forced = PolicyConfig { conv_transpose_1d: Policy::On, ..PolicyConfig::default() };
        assert!(resolve(&forced, &[], &DEV, &all_probes(true)).unwrap().policies.conv_transpose_1d);
        let cuda = DeviceRef { backend: "cuda", name: "CUDA0", description: "NVIDIA H100" };
        assert!(resolve(&PolicyConfig::default(), &[], &cuda, &all_probes(true)).unwrap().policies.conv_transpose_1d);
    }

    #[test]
    fn auto_follows_probes() {
        let r = resolve(&PolicyConfig::default(), &[], &DEV, &all_probes(true)).unwrap();
        assert!(r.policies.flash_attn && r.policies.native_leaky_relu);
        assert_eq!(r.policies.matmul_weights, WeightStorage::AsStored);
        assert_eq!(r.policies.kv_type, KvType::F16, "bf16/q8_0 are off by default");
        let r = resolve(&PolicyConfig::default(), &[], &DEV, &all_probes(false)).unwrap();
        assert!(!r.policies.flash_attn);
        assert_eq!(r.policies.matmul_weights, WeightStorage::F32);
        assert_eq!(r.policies.kv_type, KvType::F32);
    }

    #[test]
    fn the_policies_set_on_reach_the_plugin_as_forced() {
        let cfg = PolicyConfig { flash_attn: Policy::On, kv_bf16: Policy::On, kv_f16: Policy::Off, ..Default::default() };
        let r = resolve(&cfg, &[], &DEV, &all_probes(true)).unwrap();
        let forced: Vec<&str> = r.policies.forced.iter().map(|f| f.as_str()).collect();
        assert_eq!(forced, ["flash_attn", "kv_bf16"]);
        let r = resolve(&PolicyConfig::default(), &[], &DEV, &all_probes(true)).unwrap();
        assert!(r.policies.forced.is_empty(), "auto forces nothing: {:?}", r.policies.forced);
    }

    #[test]
    fn forced_on_unsupported_is_an_error() {
        let cfg = PolicyConfig { kv_bf16: Policy::On, kv_f16: Policy::Off, ..Default::default() };
        let mut p = all_probes(true);
        p.iter_mut().find(|p| p.name.as_str() == probes::FLASH_ATTN_BF16_KV).unwrap().supported = false;
        let e = resolve(&cfg, &[], &DEV, &p).unwrap_err();
        assert!(e.starts_with("policy `kv_bf16` is on, but Vulkan0 (Mali-G78) does not support it"), "{e}");
    }

    #[test]
    fn deny_rule_disables_auto_and_rejects_on() {
        let deny = [rule("*mali*", &["flash_attn"], &[])];
        let r = resolve(&PolicyConfig::default(), &deny, &DEV, &all_probes(true)).unwrap();
        let d = r.decisions.iter().find(|d| d.feature == "flash_attn").unwrap();
        assert!(!d.enabled);
        assert_eq!(d.reason, "deny rule 1 (device \"*mali*\"): test");
        let cfg = PolicyConfig { flash_attn: Policy::On, ..Default::default() };
        let e = resolve(&cfg, &deny, &DEV, &all_probes(true)).unwrap_err();
        assert_eq!(e, "policy `flash_attn` is on, but deny rule 1 (device \"*mali*\"): test disables it on Vulkan0 (Mali-G78)");
    }

    #[test]
    fn denied_op_switches_off_every_feature_using_it() {
        let deny = [rule("Vulkan*", &[], &["FLASH_ATTN_EXT"])];
        let r = resolve(&PolicyConfig::default(), &deny, &DEV, &all_probes(true)).unwrap();
        assert!(!r.policies.flash_attn);
        assert_eq!(r.policies.kv_type, KvType::F32);
        assert_eq!(r.denied_ops, vec!["FLASH_ATTN_EXT".to_string()]);
        assert_eq!(r.policies.denied_ops[0].rule.as_str(), "deny rule 1 (device \"Vulkan*\"): test");
        assert!(r.policies.native_leaky_relu);
    }

    #[test]
    fn weight_storage_follows_the_setting() {
        let storage = |setting: Policy, supported: bool| {
            let cfg = PolicyConfig { f16_weights: setting, ..Default::default() };
            resolve(&cfg, &[], &DEV, &all_probes(supported)).map(|r| r.policies.matmul_weights)
        };
        assert_eq!(storage(Policy::Auto, true), Ok(WeightStorage::AsStored));
        assert_eq!(storage(Policy::Auto, false), Ok(WeightStorage::F32));
        assert_eq!(storage(Policy::On, true), Ok(WeightStorage::F16));
        assert_eq!(storage(Policy::Off, true), Ok(WeightStorage::F32));
        assert!(storage(Policy::On, false).is_err());
    }

    #[test]
    fn non_matching_rule_is_ignored() {
        let deny = [rule("*Adreno*", &["flash_attn"], &[])];
        let r = resolve(&PolicyConfig::default(), &deny, &DEV, &all_probes(true)).unwrap();
        assert!(r.policies.flash_attn);
    }

    #[test]
    fn two_forced_kv_types_conflict() {
        let cfg = PolicyConfig { kv_bf16: Policy::On, kv_q8_0: Policy::On, ..Default::default() };
        let e = resolve(&cfg, &[], &DEV, &all_probes(true)).unwrap_err();
        assert!(e.contains("kv_bf16 and kv_q8_0"), "{e}");
    }

    #[test]
    fn most_compact_enabled_kv_type_wins() {
        let cfg = PolicyConfig { kv_q8_0: Policy::Auto, ..Default::default() };
        let r = resolve(&cfg, &[], &DEV, &all_probes(true)).unwrap();
        assert_eq!(r.policies.kv_type, KvType::Q8_0);
    }
}
