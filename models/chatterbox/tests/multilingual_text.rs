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
    let e = MultilingualTokenizer::from_json(&fixture("tokenizer.json"), 704).err().unwrap().to_string();
    assert!(e.starts_with("the embedded tokenizer has 516 tokens, T3's text vocabulary 704"), "{e}");
}
