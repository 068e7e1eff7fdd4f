//! Inputs the `gguf` fuzz target found (fuzz/regressions/gguf/): each must be
//! refused with an error, not abort the process inside ggml.

use std::path::Path;

#[test]
fn fuzz_finds_are_errors() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions/gguf");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        let e = ggml_sys::gguf::GgufTensors::from_bytes(&bytes, "fuzz.gguf").err().unwrap_or_else(|| panic!("{} was accepted", path.display()));
        eprintln!("{}: {e}", path.file_name().unwrap().to_string_lossy());
        // The same bytes through the file reader.
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), &bytes).unwrap();
        assert!(ggml_sys::gguf::GgufTensors::open(file.path()).is_err());
        assert!(ggml_sys::gguf::GgufFile::open(file.path()).is_err());
        n += 1;
    }
    assert!(n >= 1);
}
