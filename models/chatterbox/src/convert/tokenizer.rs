//! The tokenizer a T3 file embeds (`chatterbox.tokenizer_json`), built as
//! `tools/chatterbox/convert.py` builds it so the JSON string is the same
//! bytes: Turbo and Nano ship GPT-2's `vocab.json` + `merges.txt` (plus the
//! paralinguistic tags in `added_tokens.json`), which become one `tokenizers`
//! JSON; Multilingual ships its grapheme tokenizer as a JSON, stored as read.
//! Either way every id it can produce must be a row of T3's text embedding
//! (`tools/chatterbox/tokenizer_check.py`, docs/gguf.md).

use super::{read_text, source_error};
use engine_core::model_kit::{Error, Result};
use std::path::Path;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

/// The GPT-2 tokenizer of a Turbo or Nano directory as one JSON: the
/// directory's `tokenizer.json` when it has one, else built from
/// `vocab.json` + `merges.txt` and `added_tokens.json`.
pub fn gpt2_tokenizer_json(ckpt: &Path, text_vocab: usize) -> Result<String> {
    let tj = ckpt.join("tokenizer.json");
    if tj.is_file() {
        return checked(read_text(&tj)?, text_vocab, &tj);
    }
    let (vocab, merges) = (ckpt.join("vocab.json"), ckpt.join("merges.txt"));
    if !vocab.is_file() || !merges.is_file() {
        return Err(Error::msg(format!("{}: neither tokenizer.json nor vocab.json + merges.txt", ckpt.display())));
    }
    let (Some(vocab_s), Some(merges_s)) = (vocab.to_str(), merges.to_str()) else {
        return Err(Error::msg(format!("{}: the tokenizer paths are not UTF-8", ckpt.display())));
    };
    let bpe = BPE::from_file(vocab_s, merges_s).build().map_err(|e| Error::msg(format!("{}: {}", vocab.display(), one_line(&e.to_string()))))?;
    let mut tok = Tokenizer::new(bpe);
    // As Python's `pre_tokenizers.ByteLevel(add_prefix_space=False)`: the
    // other two settings keep their defaults.
    tok.with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)));
    tok.with_decoder(Some(ByteLevel::default()));
    // GPT-2's end-of-text token is special: written literally in text it stays one id.
    if tok.token_to_id("<|endoftext|>").is_some() {
        tok.add_special_tokens(&[AddedToken::from("<|endoftext|>", true)]);
    }
    let added = ckpt.join("added_tokens.json");
    if added.is_file() {
        let text = read_text(&added)?;
        // In the file's order, as Python's `json.loads` keeps it (the sort below is stable).
        let map: indexmap::IndexMap<String, serde_json::Value> =
            serde_json::from_str(&text).map_err(|e| source_error(&added, format!("not a JSON object of token ids ({e})")))?;
        let mut tags = Vec::with_capacity(map.len());
        for (token, id) in map {
            let id = id
                .as_u64()
                .and_then(|i| u32::try_from(i).ok())
                .ok_or_else(|| source_error(&added, format!("token {}: id {id} is not a token id", py_repr(&token))))?;
            tags.push((token, id));
        }
        // Python's `sorted(..., key=id)` is stable: equal ids keep the file's order.
        tags.sort_by_key(|&(_, id)| id);
        let tokens: Vec<AddedToken> = tags.iter().map(|(t, _)| AddedToken::from(t.clone(), false)).collect();
        tok.add_tokens(&tokens);
        for (t, id) in &tags {
            let got = tok.token_to_id(t);
            if got != Some(*id) {
                let got = got.map_or("None".to_string(), |g| g.to_string());
                return Err(source_error(&added, format!("added token {}: id {got}, the checkpoint says {id}", py_repr(t))));
            }
        }
    }
    let json = tok.to_string(false).map_err(|e| source_error(&vocab, format!("the tokenizer does not serialise ({e})")))?;
    checked(json, text_vocab, &vocab)
}

/// `text` when every id the tokenizer it describes can produce is below
/// `text_vocab`; else `SOURCE: ...` as tokenizer_check.py words it.
pub fn checked(text: String, text_vocab: usize, source: &Path) -> Result<String> {
    check_ids(&text, text_vocab).map_err(|e| source_error(source, e))?;
    Ok(text)
}

/// The largest id `json` can produce, or why it is unusable (tokenizer_check.py).
pub fn check_ids(json: &str, text_vocab: usize) -> std::result::Result<u32, String> {
    let tok: Tokenizer = json.parse().map_err(|e: tokenizers::Error| format!("the tokenizer JSON does not load: {}", one_line(&e.to_string())))?;
    let vocab = tok.get_vocab(true);
    // The smallest token among equal ids, so the message does not depend on hash order.
    let Some((token, top)) = vocab.iter().max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0))) else {
        return Err("the tokenizer has no tokens".into());
    };
    if *top as usize >= text_vocab {
        return Err(format!(
            "the tokenizer can produce id {top} ({}), beyond T3's text embedding of {text_vocab} rows (ids 0..{})",
            py_repr(token),
            text_vocab as i64 - 1
        ));
    }
    Ok(*top)
}

fn one_line(s: &str) -> String {
    s.lines().next().unwrap_or("").to_string()
}

/// Python's `repr()` of a string, as the Python converter's messages quote tokens.
pub fn py_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c)
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repr_quotes_as_python() {
        assert_eq!(py_repr("<|endoftext|>"), "'<|endoftext|>'");
        assert_eq!(py_repr("it's"), "\"it's\"");
        assert_eq!(py_repr("a\nb\\"), "'a\\nb\\\\'");
    }
}
