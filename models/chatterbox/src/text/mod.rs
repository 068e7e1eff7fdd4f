//! Text frontend for Turbo/Nano: the reference's punctuation normalisation,
//! sentence splitting for long input, and GPT-2 BPE tokenization through the
//! `tokenizers` crate from the JSON embedded in the GGUF (the paralinguistic
//! tags such as `[laugh]` are added tokens, so they stay single ids).
//! Multilingual's frontend is in [`multilingual`].

pub mod multilingual;

use engine_core::model_kit::Result;
use tokenizers::Tokenizer;

/// What the reference substitutes for empty input.
pub const EMPTY_TEXT_REPLACEMENT: &str = "You need to add some text for me to talk.";

/// The reference `punc_norm` (Turbo): capitalise the first letter, collapse
/// whitespace, replace rare punctuation, end with punctuation.
pub fn normalize_punctuation(text: &str) -> String {
    const REPLACE: [(&str, &str); 9] = [("…", ", "), (":", ","), ("—", "-"), ("–", "-"), (" ,", ","), ("“", "\""), ("”", "\""), ("‘", "'"), ("’", "'")];
    normalize_punctuation_with(text, &REPLACE, &[".", "!", "?", "-", ","])
}

/// `punc_norm` with a variant's replacements (applied in order) and sentence enders.
fn normalize_punctuation_with(text: &str, replace: &[(&str, &str)], enders: &[&str]) -> String {
    if text.is_empty() {
        return EMPTY_TEXT_REPLACEMENT.to_string();
    }
    let mut chars = text.chars();
    let first = chars.next().expect("not empty");
    let mut text = if first.is_lowercase() { first.to_uppercase().chain(chars).collect() } else { text.to_string() };
    text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    for (from, to) in replace {
        text = text.replace(from, to);
    }
    let mut text = text.trim_end_matches(' ').to_string();
    if !enders.iter().any(|p| text.ends_with(p)) {
        text.push('.');
    }
    text
}

/// Splits text into pieces of at most `max_chars` characters at sentence ends
/// (`.`, `!`, `?` followed by whitespace), falling back to clause breaks
/// (`,`, `;`, `:`) and then to spaces for a sentence that is still too long.
/// Whitespace between pieces is dropped; `max_chars == 0` keeps the text whole.
/// Lengths are code points, and a grapheme cluster keeps at most
/// [`MAX_CLUSTER_CHARS`](engine_core::model_kit::text::MAX_CLUSTER_CHARS) of
/// them (a warning says how many were left out): with a limit, no piece is
/// longer than it whatever the input.
pub fn split_sentences(text: &str, max_chars: usize) -> Vec<String> {
    let text = engine_core::model_kit::text::cap_clusters_logged(text);
    let text = text.trim();
    if text.is_empty() {
        return Vec::new();
    }
    if max_chars == 0 || text.chars().count() <= max_chars {
        return vec![text.to_string()];
    }
    let sentences = split_after(text, &['.', '!', '?', '…']);
    let mut pieces = Vec::new();
    for s in sentences {
        if s.chars().count() <= max_chars {
            pieces.push(s);
            continue;
        }
        for clause in split_after(&s, &[',', ';', ':']) {
            if clause.chars().count() <= max_chars {
                pieces.push(clause);
            } else {
                pieces.extend(engine_core::model_kit::text::pack_words(&clause, max_chars, char::is_whitespace));
            }
        }
    }
    merge_short(pieces, max_chars)
}

/// Pieces ending with one of `ends` followed by whitespace (or the end).
fn split_after(text: &str, ends: &[char]) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        current.push(c);
        if ends.contains(&c) && chars.peek().is_none_or(|n| n.is_whitespace()) {
            out.push(current.trim().to_string());
            current.clear();
        }
    }
    if !current.trim().is_empty() {
        out.push(current.trim().to_string());
    }
    out.retain(|s| !s.is_empty());
    out
}

/// Joins neighbouring pieces while they fit, so short sentences share a chunk.
fn merge_short(pieces: Vec<String>, max_chars: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in pieces {
        match out.last_mut() {
            Some(last) if last.chars().count() + 1 + p.chars().count() <= max_chars => {
                last.push(' ');
                last.push_str(&p);
            }
            _ => out.push(p),
        }
    }
    out
}

/// A `tokenizers` JSON embedded in a GGUF, checked against T3's text
/// vocabulary: every id it can produce (its vocabulary's and its added
/// tokens') must be a row of T3's text embedding. A smaller tokenizer is
/// fine (one official Multilingual tokenizer has fewer ids than T3's 2,454
/// rows, and the reference runs it); a larger id would read past the embedding.
fn load_tokenizer(json: &str, vocab: usize) -> Result<Tokenizer> {
    // The tokenizers crate panics (instead of returning an error) on some
    // malformed JSON inside a component (found by the chatterbox_model fuzz
    // target): check the syntax first.
    serde_json::from_str::<serde::de::IgnoredAny>(json).map_err(|e| format!("the embedded tokenizer is not valid JSON: {e}"))?;
    let tokenizer = Tokenizer::from_bytes(json.as_bytes()).map_err(|e| format!("the embedded tokenizer JSON does not load: {e}"))?;
    if let Some((token, id)) = tokenizer.get_vocab(true).into_iter().max_by_key(|(_, id)| *id).filter(|(_, id)| *id as usize >= vocab) {
        return Err(format!(
            "the embedded tokenizer can produce id {id} ({token:?}), beyond T3's text vocabulary of {vocab} (ids 0..={})",
            vocab.saturating_sub(1)
        )
        .into());
    }
    Ok(tokenizer)
}

/// The model's tokenizer.
pub struct TextTokenizer {
    tokenizer: Tokenizer,
}

impl TextTokenizer {
    pub fn from_json(json: &str, vocab: usize) -> Result<Self> {
        Ok(TextTokenizer { tokenizer: load_tokenizer(json, vocab)? })
    }

    /// Token ids of already normalised text; no BOS/EOS (Turbo adds none).
    pub fn encode(&self, text: &str) -> Result<Vec<i32>> {
        let enc = self.tokenizer.encode(text, false).map_err(|e| format!("tokenizing {text:?}: {e}"))?;
        Ok(enc.get_ids().iter().map(|&i| i as i32).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn punctuation_follows_the_reference() {
        assert_eq!(normalize_punctuation(""), EMPTY_TEXT_REPLACEMENT);
        assert_eq!(normalize_punctuation("hello   world"), "Hello world.");
        assert_eq!(normalize_punctuation("wait… what: “this” — it’s fine"), "Wait,  what, \"this\" - it's fine.");
        assert_eq!(normalize_punctuation("ok ,then!"), "Ok,then!");
        assert_eq!(normalize_punctuation("Done ?  "), "Done ?");
        assert_eq!(normalize_punctuation("ßtraße"), "SStraße.");
    }

    #[test]
    fn long_text_splits_at_sentences_then_clauses_then_words() {
        assert_eq!(split_sentences("One. Two! Three?", 0), vec!["One. Two! Three?"]);
        assert_eq!(split_sentences("First one here. Second one. Third.", 16), vec!["First one here.", "Second one.", "Third."]);
        assert_eq!(split_sentences("Aa. Bb. Cc.", 7), vec!["Aa. Bb.", "Cc."]);
        assert_eq!(split_sentences("alpha beta, gamma delta epsilon", 12), vec!["alpha beta,", "gamma delta", "epsilon"]);
        assert_eq!(split_sentences("3.5 is a number. Yes.", 18), vec!["3.5 is a number.", "Yes."]);
        assert!(split_sentences("   ", 10).is_empty());
        // A word longer than the limit is cut, not passed whole.
        let long = "a".repeat(200);
        let pieces = split_sentences(&format!("Say {long} now."), 50);
        assert_eq!(pieces, vec!["Say".to_string(), "a".repeat(50), "a".repeat(50), "a".repeat(50), "a".repeat(50), "now.".to_string()]);
        assert!(pieces.iter().all(|p| p.chars().count() <= 50));
        // Never inside a grapheme cluster: e + combining acute stays together.
        let accented = "e\u{301}".repeat(3);
        assert_eq!(split_sentences(&accented, 3), vec!["e\u{301}", "e\u{301}", "e\u{301}"]);
    }

    #[test]
    fn combining_marks_cannot_make_a_piece_longer_than_the_limit() {
        use engine_core::model_kit::text::MAX_CLUSTER_CHARS;
        // One letter with 4000 combining acutes (one grapheme cluster) keeps
        // its first marks, with or without a limit.
        let capped = format!("A{}.", "\u{301}".repeat(MAX_CLUSTER_CHARS - 1));
        for max in [0, 300] {
            assert_eq!(split_sentences(&format!("A{}.", "\u{301}".repeat(4000)), max), vec![capped.clone()], "max_chars {max}");
        }
        // A cluster longer than a small limit is cut between code points.
        let pieces = split_sentences(&format!("Hi e{} there.", "\u{301}".repeat(20)), 8);
        assert!(pieces.iter().all(|p| p.chars().count() <= 8), "{pieces:?}");
        assert_eq!(pieces.iter().map(|p| p.chars().filter(|c| *c == '\u{301}').count()).sum::<usize>(), 20);
    }
}
