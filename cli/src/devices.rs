//! Human-readable `tts devices`.

use engine_core::engine::DevicesReport;

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

pub fn print(r: &DevicesReport) {
    println!("tts {} · plugin ABI {} · ggml {}", r.host_version, r.plugin_abi, r.ggml_version);
    println!("profile: {}", r.profile);
    println!("libggml-base: {}", r.ggml_base_loaded.join(", "));
    println!("plugin dirs: {}", r.plugin_dirs.join(", "));
    println!();
    println!("plugins:");
    if r.plugins.is_empty() {
        println!("  (none found)");
    }
    for p in &r.plugins {
        match &p.error {
            None => println!("  {:<7} {:<12} {}  {}", p.kind, p.name, p.version.as_deref().unwrap_or("?"), p.path),
            Some(e) => println!("  {:<7} {:<12} FAILED: {e}", p.kind, p.name),
        }
    }
    for b in &r.backends {
        println!();
        let pref = if b.preferred { "" } else { " (not in profile's prefer list)" };
        if !b.available {
            println!("backend {}: unavailable{pref}: {}", b.name, b.reason.as_deref().unwrap_or(""));
            continue;
        }
        println!("backend {}{pref}", b.name);
        if let Some(reason) = &b.reason {
            println!("  {reason}");
        }
        for d in &b.devices {
            println!("  [{}] {} — {} ({}, {} free of {})", d.index, d.name, d.description, d.kind, gib(d.memory_free), gib(d.memory_total));
            println!("      probes:");
            for p in &d.probes {
                println!("        {:<24} {:<3}  {}", p.name, if p.supported { "yes" } else { "no" }, p.detail);
            }
            match (&d.policies, &d.policy_error) {
                (Some(res), _) => {
                    println!("      policies (kv cache: {}):", res.kv_type);
                    for dec in &res.decisions {
                        println!("        {:<18} {:<4} -> {:<3}  {}", dec.feature, dec.setting.as_str(), if dec.enabled { "on" } else { "off" }, dec.reason);
                    }
                    if !res.denied_ops.is_empty() {
                        println!("        denied ops: {}", res.denied_ops.join(", "));
                    }
                }
                (None, Some(e)) => println!("      policies: ERROR: {e}"),
                (None, None) => {}
            }
        }
    }
    println!();
    match (&r.selected, &r.selection_error) {
        (Some(s), _) => println!("selected: {} device {} ({})", s.backend, s.device, s.device_name),
        (None, Some(e)) => println!("selected: none: {e}"),
        _ => {}
    }
}
