//! Human-readable `tts devices`.

use engine_core::engine::DevicesReport;
use std::fmt::Write;

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Appends one line (writing to a String cannot fail).
macro_rules! line {
    ($out:expr) => {{
        $out.push('\n');
    }};
    ($out:expr, $($arg:tt)*) => {{
        let _ = writeln!($out, $($arg)*);
    }};
}

pub fn render(r: &DevicesReport) -> String {
    let mut out = String::new();
    line!(out, "tts {} · plugin ABI {} · ggml {}", r.host_version, r.plugin_abi, r.ggml_version);
    line!(out, "profile: {}", r.profile);
    line!(out, "libggml-base: {}", r.ggml_base_loaded.join(", "));
    line!(out, "plugin dirs: {}", r.plugin_dirs.join(", "));
    line!(out);
    line!(out, "plugins:");
    if r.plugins.is_empty() {
        line!(out, "  (none found)");
    }
    for p in &r.plugins {
        match &p.error {
            None => line!(out, "  {:<7} {:<12} {}  ABI {}  {}", p.kind, p.name, p.version.as_deref().unwrap_or("?"), p.abi.as_deref().unwrap_or("?"), p.path),
            Some(e) => line!(out, "  {:<7} {:<12} FAILED: {e}", p.kind, p.name),
        }
    }
    for b in &r.backends {
        line!(out);
        let pref = if b.preferred { "" } else { " (not in profile's prefer list)" };
        if !b.available {
            line!(out, "backend {}: unavailable{pref}: {}", b.name, b.reason.as_deref().unwrap_or(""));
            continue;
        }
        line!(out, "backend {}{pref}", b.name);
        let fact = |k: &str| b.module.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str()).unwrap_or("?");
        let features: Vec<String> = b.module.iter().filter_map(|(k, v)| k.strip_prefix("feature.").map(|k| format!("{k}={v}"))).collect();
        line!(out, "  module {} (ggml {}, score {})", fact("module"), fact("ggml_version"), fact("module_score"));
        for (_, why) in b.module.iter().filter(|(k, _)| k == "rejected_module") {
            line!(out, "  skipped module: {why}");
        }
        if !features.is_empty() {
            line!(out, "  features {}", features.join(" "));
        }
        for why in engine_core::backend_kit::refused_devices(&b.module) {
            line!(out, "  refused device: {why}");
        }
        if let Some(reason) = &b.reason {
            line!(out, "  {reason}");
        }
        for d in &b.devices {
            let bus = d.bus_id.as_deref().map(|b| format!(", bus {b}")).unwrap_or_default();
            line!(out, "  [{}] {} — {} ({}{bus}, {} free of {})", d.index, d.name, d.description, d.kind, gib(d.memory_free), gib(d.memory_total));
            line!(out, "      probes:");
            for p in &d.probes {
                line!(out, "        {:<24} {:<3}  {}", p.name, if p.supported { "yes" } else { "no" }, p.detail);
            }
            if let Some(res) = &d.policies {
                line!(out, "      policies (kv cache: {}, matmul weights: {}):", res.kv_type, res.matmul_weights);
                for dec in &res.decisions {
                    let state = if dec.enabled { "on" } else { "off" };
                    line!(out, "        {:<18} {:<4} -> {:<3}  {}", dec.feature, dec.setting.as_str(), state, dec.reason);
                }
                if !res.denied_ops.is_empty() {
                    line!(out, "        denied ops: {}", res.denied_ops.join(", "));
                }
            }
            if let Some(e) = &d.policy_error {
                line!(out, "      policies: ERROR: {e}");
            }
        }
    }
    line!(out);
    if let Some(s) = &r.selected {
        line!(out, "selected: {} device {} ({})", s.backend, s.device, s.device_name);
    }
    if let Some(e) = &r.selection_error {
        line!(out, "selected: none: {e}");
    }
    out
}
