//! What the `chatterbox_model` fuzz target found, each as the condition it
//! hit: the load-time checks must return an error, never panic.

use ggml_sys::gguf::GgufEditor;
use std::path::Path;
use tts_model_chatterbox::text::TextTokenizer;

/// A T3 whose embedded tokenizer JSON has a syntax error inside a component:
/// the tokenizers crate (0.22) panics there ("Helper") instead of returning
/// an error, so the plugin checks the JSON's syntax first.
#[test]
fn tokenizer_json_with_a_syntax_error_is_an_error() {
    let bad = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":{"type":"ByteLevel",x}}"#;
    let upstream = std::panic::catch_unwind(|| tokenizers::Tokenizer::from_bytes(bad.as_bytes()).is_ok());
    assert!(upstream.is_err(), "the tokenizers crate no longer panics here; this guard may be simplified");
    let e = TextTokenizer::from_json(bad, 384).err().unwrap();
    assert!(e.starts_with("the embedded tokenizer is not valid JSON: "), "{e}");

    // Through the file checks the fuzz target drives.
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/chatterbox/turbo-tiny/t3-turbo.gguf");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t3.gguf");
    let mut editor = GgufEditor::open(&fixture).unwrap();
    editor.set_str("chatterbox.tokenizer_json", bad);
    editor.write(&path).unwrap();
    let e = tts_model_chatterbox::check_model_bytes(&std::fs::read(&path).unwrap()).unwrap_err();
    assert!(e.contains("the embedded tokenizer is not valid JSON"), "{e}");
}
