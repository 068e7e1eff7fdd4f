//! Multilingual text frontend against the reference: `punc_norm` of
//! `mtl_tts.py` and `MTLTokenizer.encode`, run by
//! `tools/chatterbox/mtl_text_cases.py` on a synthetic grapheme tokenizer of
//! the official kind (`tests/fixtures/chatterbox/mtl-text/`). Languages the
//! engine refuses keep the reference's ids in the file but must be refused.

use std::path::PathBuf;
use tts_model_chatterbox::text::multilingual::{normalize_punctuation, MultilingualTokenizer, LANGUAGES};

#[derive(serde::Deserialize)]
struct Cases {
    languages: Vec<String>,
    sot: i32,
    eot: i32,
    cases: Vec<Case>,
}

#[derive(serde::Deserialize)]
struct Case {
    text: String,
    language: String,
    normalised: String,
    ids: Vec<i32>,
    #[serde(default)]
    refused: bool,
}

fn fixture(name: &str) -> String {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/chatterbox/mtl-text");
    std::fs::read_to_string(dir.join(name)).unwrap()
}

fn tokenizer(json: &str) -> MultilingualTokenizer {
    let vocab = tokenizers::Tokenizer::from_bytes(json.as_bytes()).unwrap().get_vocab_size(true);
    MultilingualTokenizer::from_json(json, vocab).unwrap()
}

#[test]
fn normalisation_and_token_ids_match_the_reference() {
    let tokenizer = tokenizer(&fixture("tokenizer.json"));
    let cases: Cases = serde_json::from_str(&fixture("cases.json")).unwrap();
    assert_eq!(cases.languages, LANGUAGES.iter().map(|(c, _)| c.to_string()).collect::<Vec<_>>());
    let (mut spoken, mut refused) = (0, 0);
    for c in &cases.cases {
        let normalised = normalize_punctuation(&c.text);
        assert_eq!(normalised, c.normalised, "normalising {:?}", c.text);
        if c.refused {
            let e = tokenizer.encode(&normalised, &c.language).unwrap_err().to_string();
            assert!(e.starts_with(&format!("language '{}' needs ", c.language)), "{e}");
            refused += 1;
            continue;
        }
        assert_eq!(tokenizer.encode(&normalised, &c.language).unwrap(), c.ids, "{} ids of {:?}", c.language, c.normalised);
        let framed = tokenizer.encode_for_t3(&normalised, &c.language).unwrap();
        assert_eq!((framed[0], framed[framed.len() - 1]), (cases.sot, cases.eot));
        assert_eq!(&framed[1..framed.len() - 1], c.ids.as_slice());
        spoken += 1;
    }
    assert!(spoken >= 20 && refused == 4, "{spoken} spoken, {refused} refused");
}

#[test]
fn a_tokenizer_without_the_frame_tokens_is_refused() {
    let json = fixture("tokenizer.json").replace("\"[START]\"", "\"[BEGIN]\"");
    let vocab = tokenizers::Tokenizer::from_bytes(json.as_bytes()).unwrap().get_vocab_size(true);
    let e = MultilingualTokenizer::from_json(&json, vocab).err().unwrap().to_string();
    assert_eq!(e, "the embedded tokenizer has no [START] token");
}

/// A tokenizer smaller than T3's text vocabulary loads (the official package
/// runs one); one that can produce an id past the last row, through its
/// vocabulary or an added token, is refused.
#[test]
fn a_tokenizer_is_checked_by_the_ids_it_can_produce() {
    let json = fixture("tokenizer.json");
    let tokenizer = MultilingualTokenizer::from_json(&json, 704).unwrap();
    assert!(tokenizer.encode_for_t3("hello", "en").unwrap().iter().all(|&id| (0..516).contains(&id)));
    assert!(MultilingualTokenizer::from_json(&json, 516).is_ok());
    let e = MultilingualTokenizer::from_json(&json, 515).err().unwrap().to_string();
    assert!(e.starts_with("the embedded tokenizer can produce id 515 ("), "{e}");
    // An added token the model's vocabulary lacks: `tokenizers` gives it the
    // next free id (516), one past the vocabulary's own.
    let mut value: serde_json::Value = serde_json::from_str(&json).unwrap();
    value["added_tokens"].as_array_mut().unwrap().push(serde_json::json!({
        "id": 516, "content": "[xx]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true
    }));
    assert!(MultilingualTokenizer::from_json(&value.to_string(), 517).is_ok());
    let e = MultilingualTokenizer::from_json(&value.to_string(), 516).err().unwrap().to_string();
    assert_eq!(e, "the embedded tokenizer can produce id 516 (\"[xx]\"), beyond T3's text vocabulary of 516 (ids 0..=515)");
    // A sparse vocabulary: 516 tokens, but the merge "e s" gives id 704.
    let mut value: serde_json::Value = serde_json::from_str(&json).unwrap();
    value["model"]["vocab"]["es"] = 704.into();
    let e = MultilingualTokenizer::from_json(&value.to_string(), 704).err().unwrap().to_string();
    assert_eq!(e, "the embedded tokenizer can produce id 704 (\"es\"), beyond T3's text vocabulary of 704 (ids 0..=703)");
}
