//! include/tts.h is what cbindgen generates from src/lib.rs and the modules
//! it declares: a change to the C API that did not regenerate the header, or
//! one that reorders the modules, fails here. With
//! `TTS_UPDATE_HEADER=1` the test writes the regenerated header instead.

use std::path::Path;

#[test]
fn the_committed_header_is_generated_from_the_source() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).unwrap();
    // The crate root, not `cargo metadata`: cbindgen follows its `mod`
    // declarations into the module files, in their order.
    let bindings = cbindgen::Builder::new().with_config(config).with_src(dir.join("src/lib.rs")).generate().expect("cbindgen reads src/lib.rs");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let header = dir.join("include/tts.h");
    if std::env::var_os("TTS_UPDATE_HEADER").is_some_and(|v| v == "1") {
        std::fs::write(&header, &generated).unwrap();
        return;
    }
    let committed = std::fs::read(&header).unwrap_or_default();
    assert!(
        committed == generated,
        "{} differs from what cbindgen generates from src/lib.rs; regenerate it: TTS_UPDATE_HEADER=1 cargo test -p tts-capi --test header",
        header.display()
    );
}
