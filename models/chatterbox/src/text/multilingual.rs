//! Text frontend for Chatterbox Multilingual, as the reference's
//! `ChatterboxMultilingualTTS` prepares text: its `punc_norm` variant, then
//! `MTLTokenizer.encode` (lowercase, NFKD, the language's own step, the
//! `[xx]` language tag, spaces as `[SPACE]`, the grapheme tokenizer), and
//! `[START]` … `[STOP]` around the ids.
//!
//! Four languages need a library for their own step (Japanese kanji to
//! hiragana, Chinese segmentation and Cangjie codes, Hebrew diacritics,
//! Russian stress marks). No Rust crate here reproduces them, so those
//! languages are refused with an error that names what is missing, rather
//! than spoken with a tokenization the model was not trained on.

use super::{load_tokenizer, normalize_punctuation_with};
use engine_core::model_kit::text::is_python_space;
use engine_core::model_kit::{Error, Result};
use tokenizers::Tokenizer;
use unicode_normalization::UnicodeNormalization;

/// The 23 language codes the reference accepts, with their names.
pub const LANGUAGES: [(&str, &str); 23] = [
    ("ar", "Arabic"),
    ("da", "Danish"),
    ("de", "German"),
    ("el", "Greek"),
    ("en", "English"),
    ("es", "Spanish"),
    ("fi", "Finnish"),
    ("fr", "French"),
    ("he", "Hebrew"),
    ("hi", "Hindi"),
    ("it", "Italian"),
    ("ja", "Japanese"),
    ("ko", "Korean"),
    ("ms", "Malay"),
    ("nl", "Dutch"),
    ("no", "Norwegian"),
    ("pl", "Polish"),
    ("pt", "Portuguese"),
    ("ru", "Russian"),
    ("sv", "Swedish"),
    ("sw", "Swahili"),
    ("tr", "Turkish"),
    ("zh", "Chinese"),
];

/// What the reference's step for a language needs that this engine lacks.
fn missing_step(language: &str) -> Option<&'static str> {
    match language {
        "ja" => Some("kanji-to-hiragana conversion (pykakasi in the reference)"),
        "zh" => Some("word segmentation and Cangjie codes (pkuseg and Cangjie5_TC.json in the reference)"),
        "he" => Some("Hebrew diacritics (dicta_onnx in the reference)"),
        "ru" => Some("Russian stress marks (russian_text_stresser in the reference)"),
        _ => None,
    }
}

/// Checks a language code: known, and one whose preprocessing this engine has.
pub fn check_language(language: &str) -> Result<()> {
    if !LANGUAGES.iter().any(|(code, _)| *code == language) {
        let codes: Vec<&str> = LANGUAGES.iter().map(|(code, _)| *code).collect();
        return Err(format!("unknown language '{language}'; Multilingual speaks {}", codes.join(", ")).into());
    }
    match missing_step(language) {
        Some(what) => Err(format!("language '{language}' needs {what}, which this engine does not have").into()),
        None => Ok(()),
    }
}

/// The reference `punc_norm` of `mtl_tts.py`: Turbo's, plus `...`, ` - ` and
/// `;` become commas and CJK full stops, commas and marks end a sentence.
pub fn normalize_punctuation(text: &str) -> String {
    const REPLACE: [(&str, &str); 12] = [
        ("...", ", "),
        ("…", ", "),
        (":", ","),
        (" - ", ", "),
        (";", ", "),
        ("—", "-"),
        ("–", "-"),
        (" ,", ","),
        ("“", "\""),
        ("”", "\""),
        ("‘", "'"),
        ("’", "'"),
    ];
    normalize_punctuation_with(text, &REPLACE, &[".", "!", "?", "-", ",", "、", "，", "。", "？", "！"])
}

/// Hangul syllables as conjoining Jamo (initial, medial, optional final),
/// then surrounding whitespace trimmed (Python's `strip`), as the reference's
/// `korean_normalize`.
/// After NFKD no syllable is left (NFKD decomposes them the same way); the
/// step is kept for what it also does, the trim.
fn korean_jamo(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for c in text.chars() {
        let code = c as u32;
        if !(0xAC00..=0xD7AF).contains(&code) {
            out.push(c);
            continue;
        }
        let base = code - 0xAC00;
        let jamo = |v: u32| char::from_u32(v).expect("Jamo code points are valid");
        out.push(jamo(0x1100 + base / (21 * 28)));
        out.push(jamo(0x1161 + (base % (21 * 28)) / 28));
        if !base.is_multiple_of(28) {
            out.push(jamo(0x11A7 + base % 28));
        }
    }
    out.trim_matches(is_python_space).to_string()
}

/// Multilingual's grapheme tokenizer with the reference's preprocessing.
pub struct MultilingualTokenizer {
    tokenizer: Tokenizer,
    start: u32,
    stop: u32,
}

impl MultilingualTokenizer {
    pub const START: &'static str = "[START]";
    pub const STOP: &'static str = "[STOP]";
    const SPACE: &'static str = "[SPACE]";

    /// The embedded `tokenizers` JSON, which must hold `[START]`, `[STOP]`,
    /// `[SPACE]` and a tag for every language this engine speaks.
    pub fn from_json(json: &str, vocab: usize) -> Result<Self> {
        let tokenizer = load_tokenizer(json, vocab)?;
        let id = |token: &str| tokenizer.token_to_id(token).ok_or_else(|| Error::msg(format!("the embedded tokenizer has no {token} token")));
        let (start, stop) = (id(Self::START)?, id(Self::STOP)?);
        id(Self::SPACE)?;
        for (code, _) in LANGUAGES.iter().filter(|(code, _)| missing_step(code).is_none()) {
            id(&format!("[{code}]"))?;
        }
        Ok(MultilingualTokenizer { tokenizer, start, stop })
    }

    /// `MTLTokenizer.encode` of already normalised text: no `[START]`/`[STOP]`.
    pub fn encode(&self, text: &str, language: &str) -> Result<Vec<i32>> {
        check_language(language)?;
        let mut prepared: String = text.to_lowercase().nfkd().collect();
        if language == "ko" {
            prepared = korean_jamo(&prepared);
        }
        let tagged = format!("[{language}]{prepared}").replace(' ', Self::SPACE);
        let encoding = self.tokenizer.encode(tagged.as_str(), false).map_err(|e| format!("tokenizing {text:?}: {e}"))?;
        Ok(encoding.get_ids().iter().map(|&i| i as i32).collect())
    }

    /// What T3 reads: `[START]`, the ids of `encode`, `[STOP]`.
    pub fn encode_for_t3(&self, text: &str, language: &str) -> Result<Vec<i32>> {
        let ids = self.encode(text, language)?;
        Ok(std::iter::once(self.start as i32).chain(ids).chain(std::iter::once(self.stop as i32)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn punctuation_follows_the_multilingual_reference() {
        assert_eq!(normalize_punctuation("hello... world; yes - no"), "Hello,  world,  yes, no.");
        assert_eq!(normalize_punctuation("你好。"), "你好。");
        assert_eq!(normalize_punctuation("ok!"), "Ok!");
    }

    #[test]
    fn korean_syllables_become_jamo_and_whitespace_is_trimmed() {
        assert_eq!(korean_jamo(" 한 "), "\u{1112}\u{1161}\u{11AB}");
        assert_eq!(korean_jamo("가"), "\u{1100}\u{1161}");
        // NFKD gives the same decomposition, so the step only trims after it.
        let nfkd: String = "한국".nfkd().collect();
        assert_eq!(korean_jamo(&nfkd), korean_jamo("한국"));
        assert_eq!(korean_jamo("\u{1f} 가 \u{1c}"), "\u{1100}\u{1161}");
    }

    #[test]
    fn languages_are_checked_by_name() {
        assert!(check_language("fr").is_ok());
        let unknown = check_language("xx").unwrap_err().to_string();
        assert!(unknown.starts_with("unknown language 'xx'; Multilingual speaks ar, da, de,"), "{unknown}");
        assert!(unknown.ends_with("tr, zh"), "{unknown}");
        assert_eq!(
            check_language("ja").unwrap_err().to_string(),
            "language 'ja' needs kanji-to-hiragana conversion (pykakasi in the reference), which this engine does not have"
        );
        for refused in ["zh", "he", "ru"] {
            assert!(check_language(refused).is_err());
        }
        assert_eq!(LANGUAGES.iter().filter(|(c, _)| check_language(c).is_ok()).count(), 19);
    }
}
