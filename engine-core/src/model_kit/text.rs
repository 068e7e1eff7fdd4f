//! Text helpers both families' front ends need.

use unicode_segmentation::UnicodeSegmentation;

/// Whitespace as Python's `str.isspace` and `re`'s `\s` define it (what the
/// reference front ends split and strip on): Unicode White_Space plus the
/// information separators U+001C..U+001F.
pub fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// The words of `text` (split where `is_space`) packed into pieces of at most
/// `max_chars` characters, joined by single spaces; a word longer than that is
/// cut between grapheme clusters (never inside one, so a piece exceeds the
/// limit only when one cluster does).
pub fn pack_words(text: &str, max_chars: usize, is_space: impl Fn(char) -> bool) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut current = String::new();
    let mut current_chars = 0;
    for word in text.split(is_space).filter(|w| !w.is_empty()).flat_map(|w| cut_word(w, max_chars)) {
        let n = word.chars().count();
        if current_chars > 0 && current_chars + 1 + n > max_chars {
            out.push(std::mem::take(&mut current));
            current_chars = 0;
        }
        if current_chars > 0 {
            current.push(' ');
            current_chars += 1;
        }
        current.push_str(word);
        current_chars += n;
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// `word` in pieces of at most `max_chars` characters (one piece when it fits).
fn cut_word(word: &str, max_chars: usize) -> Vec<&str> {
    let mut pieces = Vec::new();
    let (mut start, mut chars) = (0, 0);
    for (at, g) in word.grapheme_indices(true) {
        let n = g.chars().count();
        if chars > 0 && chars + n > max_chars {
            pieces.push(&word[start..at]);
            (start, chars) = (at, 0);
        }
        chars += n;
    }
    pieces.push(&word[start..]);
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_pack_and_long_words_cut_between_clusters() {
        assert_eq!(pack_words("alpha beta gamma", 10, char::is_whitespace), ["alpha beta", "gamma"]);
        assert_eq!(pack_words(&"a".repeat(7), 3, char::is_whitespace), ["aaa", "aaa", "a"]);
        assert_eq!(pack_words(&"e\u{301}".repeat(3), 3, char::is_whitespace), ["e\u{301}", "e\u{301}", "e\u{301}"]);
        assert!(pack_words("  ", 5, char::is_whitespace).is_empty());
    }
}
