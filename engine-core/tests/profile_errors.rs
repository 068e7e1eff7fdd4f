//! Profile parsing: every error names the file, the line and the key.

use engine_core::abi::{OptionKind, OptionSpec, OptionValue};
use engine_core::policy::Policy;
use engine_core::profile::{DeviceChoice, Profile};
use std::path::Path;

fn parse(src: &str) -> Result<Profile, String> {
    Profile::parse(src, "p.toml", Path::new("/base")).map_err(|e| e.to_string())
}

#[test]
fn embedded_default_parses() {
    let p = Profile::embedded_default();
    assert_eq!(p.prefer.last().map(String::as_str), Some("cpu"));
    assert_eq!(p.device, DeviceChoice::Auto);
    assert_eq!(p.policies.kv_bf16, Policy::Off);
}

#[test]
fn unknown_key_names_key_and_line() {
    let e = parse("[backend]\nprefer = [\"cpu\"]\n\n[policies]\nflash_atn = \"on\"\n").unwrap_err();
    assert!(e.starts_with("p.toml:5:1: unknown field `flash_atn`"), "{e}");
}

#[test]
fn unknown_section_is_rejected() {
    let e = parse("[backendz]\nprefer = [\"cpu\"]\n").unwrap_err();
    assert!(e.starts_with("p.toml:1:"), "{e}");
    assert!(e.contains("unknown field `backendz`"), "{e}");
}

#[test]
fn bad_policy_value_names_key_and_line() {
    let e = parse("[policies]\nkv_f16 = \"maybe\"\n").unwrap_err();
    assert!(e.starts_with("p.toml:2:10: key `kv_f16`: unknown variant `maybe`, expected one of `auto`, `on`, `off`"), "{e}");
}

#[test]
fn wrong_type_names_key_and_line() {
    let e = parse("[backend]\nprefer = \"cpu\"\n").unwrap_err();
    assert!(e.starts_with("p.toml:2:10: key `prefer`: invalid type: string \"cpu\", expected a sequence"), "{e}");
}

#[test]
fn deny_rule_with_unknown_feature_or_op() {
    let e = parse("[[deny]]\ndevice = \"*Mali*\"\nfeatures = [\"flash_attention\"]\n").unwrap_err();
    assert!(e.starts_with("p.toml:3:13: deny rule 1: unknown feature `flash_attention`"), "{e}");
    let e = parse("[[deny]]\ndevice = \"*Mali*\"\nops = [\"FLASH_ATN_EXT\"]\n").unwrap_err();
    assert_eq!(e, "p.toml:3:8: deny rule 1: unknown ggml op `FLASH_ATN_EXT`");
    assert!(parse("[[deny]]\ndevice = \"*Mali*\"\nops = [\"flash_attn_ext\"]\n").is_ok(), "op names are case-insensitive");
}

#[test]
fn device_choice_forms() {
    assert_eq!(parse("[backend]\ndevice = 1\n").unwrap().device, DeviceChoice::Index(1));
    assert_eq!(parse("[backend]\ndevice = \"Vulkan0\"\n").unwrap().device, DeviceChoice::Name("Vulkan0".into()));
    let expect = |found: &str| {
        format!("key `device`: use \"auto\", a device name like \"Vulkan0\", a bus id like \"0000:01:00.0\", or a device index 0..=4294967295; found {found}")
    };
    assert_eq!(parse("[backend]\ndevice = \"\"\n").unwrap_err(), format!("p.toml:2:10: {}", expect("an empty name")));
    assert_eq!(parse("[backend]\ndevice = -1\n").unwrap_err(), format!("p.toml:2:10: {}", expect("-1")));
    assert_eq!(parse("[backend]\ndevice = 1.5\n").unwrap_err(), format!("p.toml:2:10: {}", expect("a float")));
}

#[test]
fn relative_paths_resolve_against_the_profile() {
    let p = parse("[model]\nfiles = [\"m.gguf\", \"/abs/x.gguf\"]\n[plugins]\ndirs = [\"plug\"]\n").unwrap();
    assert_eq!(p.model_files, vec![Path::new("/base/m.gguf").to_path_buf(), Path::new("/abs/x.gguf").to_path_buf()]);
    assert_eq!(p.plugin_dirs, vec![Path::new("/base/plug").to_path_buf()]);
}

fn specs() -> Vec<OptionSpec> {
    vec![
        OptionSpec { key: "threads".into(), kind: OptionKind::Int, default: OptionValue::Int(0), help: "".into() },
        OptionSpec { key: "cache_dir".into(), kind: OptionKind::Path, default: OptionValue::Str("".into()), help: "".into() },
    ]
}

#[test]
fn backend_options_are_validated_against_plugin_specs() {
    let p = parse("[backends.cpu]\nthreads = 4\ncache_dir = \"c\"\n").unwrap();
    let opts = p.backend_options("cpu", &specs()).unwrap();
    assert_eq!(opts[0].1, OptionValue::Int(4));
    assert_eq!(opts[1].1, OptionValue::Str("/base/c".into()));
    let defaults = p.backend_options("vulkan", &specs()).unwrap();
    assert_eq!(defaults[0].1, OptionValue::Int(0));

    let p = parse("[backends.cpu]\nthreads = \"two\"\n").unwrap();
    assert_eq!(p.backend_options("cpu", &specs()).unwrap_err().to_string(), "p.toml:2:11: key `threads` in [backends.cpu]: expected an integer, found string");
    let p = parse("[backends.cpu]\n\nthreds = 2\n").unwrap();
    assert_eq!(
        p.backend_options("cpu", &specs()).unwrap_err().to_string(),
        "p.toml:3:10: unknown key `threds` in [backends.cpu]: the cpu backend takes threads, cache_dir"
    );
}

#[test]
fn synthesis_overrides_are_typed() {
    let p = parse("[synthesis]\nthreads = 3\n").unwrap();
    let list = p.synthesis_options("tone", &specs(), &[("threads".into(), "5".into())]).unwrap();
    assert_eq!(list[0].1, OptionValue::Int(5));
    let e = p.synthesis_options("tone", &specs(), &[("threads".into(), "five".into())]).unwrap_err();
    assert_eq!(e.to_string(), "command line: option `threads`: `five` is not an integer");
    let e = p.synthesis_options("tone", &specs(), &[("threads".into(), "18446744073709551616".into())]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "command line: option `threads`: `18446744073709551616` is out of range for an integer option (-9223372036854775808..=9223372036854775807)"
    );
    let e = p.synthesis_options("tone", &specs(), &[("speed".into(), "1".into())]).unwrap_err();
    assert_eq!(e.to_string(), "command line: unknown synthesis option `speed` for the tone model (known: threads, cache_dir)");
    // A profile written for another family names the real cause.
    let p = parse(
        "[synthesis]
temperature = 0.8
",
    )
    .unwrap();
    let e = p.synthesis_options("supertonic", &specs(), &[]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "p.toml:2:15: unknown key `temperature` in [synthesis]: the supertonic model takes threads, cache_dir (is this profile written for another model family?)"
    );
}

#[test]
fn server_voices_keep_their_order_and_lines() {
    let p = parse("[model]\nfiles = []\n\n[server.voices]\nnova = \"M1\"\nalloy = \"F2\"\n").unwrap();
    assert_eq!(p.server_voices(), [("nova".to_string(), "M1".to_string()), ("alloy".to_string(), "F2".to_string())]);
    assert_eq!(p.server_voice_error("alloy", "bad".into()).to_string(), "p.toml:6:9: bad");
    assert!(parse("").unwrap().server_voices().is_empty());
    let e = parse("[server]\nvoice = \"F1\"\n").unwrap_err();
    assert!(e.starts_with("p.toml:2:1: unknown field `voice`"), "{e}");
    let e = parse("[server.voices]\nalloy = 3\n").unwrap_err();
    assert!(e.starts_with("p.toml:2:9:") && e.contains("alloy"), "{e}");
}
