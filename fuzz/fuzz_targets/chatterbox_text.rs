//! Chatterbox's text front end on arbitrary text: punctuation normalisation,
//! splitting at a fuzzed length (every piece within it), and the tiny
//! fixture's BPE tokenizer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tts_fuzz::quiet;
use std::sync::OnceLock;
use tts_model_chatterbox::text::{normalize_punctuation, split_sentences, TextTokenizer};

fn tokenizer() -> &'static TextTokenizer {
    static TOKENIZER: OnceLock<TextTokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/chatterbox/turbo-tiny/t3-turbo.gguf");
        let file = ggml_sys::gguf::GgufFile::open(&path).expect("the committed fixture");
        let json = file.get_str("chatterbox.tokenizer_json").expect("a tokenizer");
        TextTokenizer::from_json(&json, file.get_u32("chatterbox.text_vocab").expect("a vocabulary") as usize).expect("loads")
    })
}

fuzz_target!(|data: &[u8]| {
    quiet();
    let Some((&max, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    let max = max as usize;
    for piece in split_sentences(text, max) {
        // No piece over the limit in code points, no cluster over its cap.
        use unicode_segmentation::UnicodeSegmentation;
        if max > 0 {
            assert!(piece.chars().count() <= max, "piece over {max}: {piece:?}");
        }
        // (+1: marks that followed a control character, such as a tab, join
        // the single space that replaces it.)
        assert!(piece.graphemes(true).all(|g| g.chars().count() <= engine_core::model_kit::text::MAX_CLUSTER_CHARS + 1), "cluster over the cap: {piece:?}");
        let _ = tokenizer().encode(&normalize_punctuation(&piece));
    }
});
