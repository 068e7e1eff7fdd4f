//! The converter's own tests (`tools/chatterbox/tests`, Python's unittest),
//! run here so that `cargo test` covers the rule `convert.py` shares with the
//! loader: every id a T3 tokenizer can produce is below the text vocabulary.
//! They need a Python with the `tokenizers` package: `TTS_CHATTERBOX_PYTHON`,
//! else the venv of tools/chatterbox/README.md; without one the test reports
//! itself skipped, unless `TTS_REQUIRE_CONVERTER_PYTHON` is set (`cargo xtask
//! test` sets it once it has installed them).

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).unwrap().to_path_buf()
}

fn python() -> Option<PathBuf> {
    let candidates = std::env::var_os("TTS_CHATTERBOX_PYTHON").map(PathBuf::from).into_iter().chain([repo().join("target/chatterbox-venv/bin/python")]);
    candidates.into_iter().find(|p| Command::new(p).args(["-c", "import tokenizers"]).output().is_ok_and(|o| o.status.success()))
}

#[test]
fn converter_refuses_tokenizer_ids_beyond_the_text_vocabulary() {
    let Some(python) = python() else {
        // `cargo xtask test` installs the packages and sets this: there a
        // missing Python is a failure, not a skip.
        assert!(std::env::var_os("TTS_REQUIRE_CONVERTER_PYTHON").is_none(), "TTS_REQUIRE_CONVERTER_PYTHON is set but no Python with `tokenizers` was found");
        eprintln!("skipped: no Python with `tokenizers` (set TTS_CHATTERBOX_PYTHON or create target/chatterbox-venv)");
        return;
    };
    let o = Command::new(&python).args(["-m", "unittest", "discover", "-s", "tools/chatterbox/tests"]).current_dir(repo()).output().unwrap();
    let report = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{report}");
    assert!(report.contains("OK"), "{report}");
}
