//! Text frontend against the reference: `punc_norm` and the tokenizer the
//! reference loads (`AutoTokenizer` on the official file kinds), on the cases
//! in `reference/text_cases.json`, through the tokenizer JSON the converter
//! embeds in the GGUF.

mod common;

use ggml_sys::gguf::GgufFile;
use tts_model_chatterbox::text::{normalize_punctuation, TextTokenizer};

#[derive(serde::Deserialize)]
struct Case {
    text: String,
    normalized: String,
    ids: Vec<i32>,
}

#[test]
fn normalisation_and_token_ids_match_the_reference() {
    let file = GgufFile::open(&common::fixture_dir().join("t3-turbo.gguf")).unwrap();
    let json = file.get_str("chatterbox.tokenizer_json").unwrap();
    let tokenizer = TextTokenizer::from_json(&json, file.get_u32("chatterbox.text_vocab").unwrap() as usize).unwrap();
    let cases: Vec<Case> = serde_json::from_str(&std::fs::read_to_string(common::reference_dir().join("text_cases.json")).unwrap()).unwrap();
    assert!(cases.len() >= 10);
    for c in &cases {
        let normalized = normalize_punctuation(&c.text);
        assert_eq!(normalized, c.normalized, "normalising {:?}", c.text);
        assert_eq!(tokenizer.encode(&normalized).unwrap(), c.ids, "token ids of {:?}", c.normalized);
    }
}

/// What matters is that every id the tokenizer can produce is a row of T3's
/// text embedding: a smaller tokenizer loads, one with an id past the last row
/// does not.
#[test]
fn a_tokenizer_with_ids_beyond_the_vocabulary_is_rejected() {
    let file = GgufFile::open(&common::fixture_dir().join("t3-turbo.gguf")).unwrap();
    let json = file.get_str("chatterbox.tokenizer_json").unwrap();
    assert!(TextTokenizer::from_json(&json, 50276).is_ok(), "384 ids for 50,276 rows");
    assert!(TextTokenizer::from_json(&json, 384).is_ok());
    let e = TextTokenizer::from_json(&json, 383).err().unwrap();
    assert!(e.starts_with("the embedded tokenizer can produce id 383 ("), "{e}");
    assert!(e.ends_with("), beyond T3's text vocabulary of 383 (ids 0..=382)"), "{e}");
}
