//! The TOML profile parser and option validation on arbitrary text, with the
//! option schemas of the CPU and Vulkan backends and the Supertonic model.
#![no_main]

use engine_core::abi::{OptionKind, OptionSpec, OptionValue};
use engine_core::backend_kit::spec;
use libfuzzer_sys::fuzz_target;
use tts_fuzz::quiet;

fn specs() -> Vec<(&'static str, Vec<OptionSpec>)> {
    vec![
        ("cpu", vec![spec("threads", OptionKind::Int, OptionValue::Int(0), "")]),
        (
            "vulkan",
            vec![spec("allow_software", OptionKind::Bool, OptionValue::Bool(false), ""), spec("pipeline_cache_dir", OptionKind::Path, OptionValue::Str("".into()), "")],
        ),
    ]
}

fuzz_target!(|data: &[u8]| {
    quiet();
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(profile) = engine_core::profile::Profile::parse(text, "fuzz.toml", std::path::Path::new("/base")) else { return };
    for (backend, specs) in specs() {
        let _ = profile.backend_options(backend, &specs);
    }
    let synthesis = vec![
        spec("voice", OptionKind::Str, OptionValue::Str("".into()), ""),
        spec("steps", OptionKind::Int, OptionValue::Int(-1), ""),
        spec("speed", OptionKind::Float, OptionValue::Float(1.05), ""),
        spec("noise_npy", OptionKind::Path, OptionValue::Str("".into()), ""),
    ];
    let overrides = [("steps".to_string(), text.chars().take(24).collect::<String>()), ("speed".to_string(), text.chars().rev().take(24).collect())];
    let _ = profile.synthesis_options("supertonic", &synthesis, &overrides);
});
