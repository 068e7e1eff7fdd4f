//! Text helpers both families' front ends need.
//!
//! Cost bound: every length here is counted in code points (`char`s), and a
//! grapheme cluster keeps at most [`MAX_CLUSTER_CHARS`] of them, so no piece a
//! chunker hands to a model is longer than its limit however the text is
//! built (one letter followed by thousands of combining marks is one
//! extended grapheme cluster; left whole it became one chunk whose attention
//! grew with the square of its length).

use std::borrow::Cow;
use unicode_segmentation::UnicodeSegmentation;

/// Whitespace as Python's `str.isspace` and `re`'s `\s` define it (what the
/// reference front ends split and strip on): Unicode White_Space plus the
/// information separators U+001C..U+001F.
pub fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// The most code points a grapheme cluster keeps. Unicode's Stream-Safe Text
/// Format (UAX #15) allows at most 30 non-starters in a row, and the longest
/// emoji ZWJ sequences in use are about 10 code points, so real text never
/// reaches it.
pub const MAX_CLUSTER_CHARS: usize = 32;

/// `text` with every grapheme cluster cut to its first `max` code points (the
/// base and its first marks), and how many code points were dropped. Text
/// without such a cluster is borrowed unchanged.
pub fn cap_clusters(text: &str, max: usize) -> (Cow<'_, str>, usize) {
    let max = max.max(1);
    // A cluster of at most `max` bytes has at most `max` code points: the
    // common case needs no counting.
    let long = |g: &str| g.len() > max && g.chars().nth(max).is_some();
    let Some(first) = text.grapheme_indices(true).find(|(_, g)| long(g)).map(|(at, _)| at) else {
        return (Cow::Borrowed(text), 0);
    };
    let mut out = String::with_capacity(text.len());
    out.push_str(&text[..first]);
    let mut dropped = 0;
    for g in text[first..].graphemes(true) {
        match g.char_indices().nth(max) {
            Some((cut, _)) => {
                out.push_str(&g[..cut]);
                dropped += g[cut..].chars().count();
            }
            None => out.push_str(g),
        }
    }
    (Cow::Owned(out), dropped)
}

/// [`cap_clusters`] at [`MAX_CLUSTER_CHARS`], with a warning when it dropped
/// anything (counts only: the text itself is not logged).
pub fn cap_clusters_logged(text: &str) -> Cow<'_, str> {
    let (capped, dropped) = cap_clusters(text, MAX_CLUSTER_CHARS);
    if dropped > 0 {
        tracing::warn!(
            "{dropped} combining characters were left out: a grapheme cluster (a letter and the marks on it) keeps at most {MAX_CLUSTER_CHARS} code points"
        );
    }
    capped
}

/// The words of `text` (split where `is_space`) packed into pieces of at most
/// `max_chars` code points, joined by single spaces; a word longer than that
/// is cut between grapheme clusters, and a cluster longer than the limit by
/// itself between its code points: no piece exceeds the limit.
pub fn pack_words(text: &str, max_chars: usize, is_space: impl Fn(char) -> bool) -> Vec<String> {
    let max_chars = max_chars.max(1);
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

/// `word` in pieces of at most `max_chars` code points (one piece when it
/// fits): cut between grapheme clusters, and inside one only when that
/// cluster alone is longer than the limit.
fn cut_word(word: &str, max_chars: usize) -> Vec<&str> {
    let mut pieces = Vec::new();
    let (mut start, mut chars) = (0, 0);
    for (at, g) in word.grapheme_indices(true) {
        let n = g.chars().count();
        if chars > 0 && chars + n > max_chars {
            pieces.push(&word[start..at]);
            (start, chars) = (at, 0);
        }
        if n > max_chars {
            for (i, (offset, _)) in g.char_indices().enumerate() {
                if i > 0 && i % max_chars == 0 {
                    pieces.push(&word[start..at + offset]);
                    start = at + offset;
                }
            }
            chars = n - (n - 1) / max_chars * max_chars;
            continue;
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

    #[test]
    fn a_cluster_longer_than_the_limit_is_cut_by_code_points() {
        // One letter with 4000 combining acutes: one grapheme cluster.
        let huge = format!("a{}", "\u{301}".repeat(4000));
        assert_eq!(huge.graphemes(true).count(), 1);
        let pieces = pack_words(&format!("say {huge} now"), 300, char::is_whitespace);
        assert!(pieces.iter().all(|p| p.chars().count() <= 300), "{:?}", pieces.iter().map(|p| p.chars().count()).collect::<Vec<_>>());
        assert_eq!(pieces.concat().chars().filter(|c| *c != ' ').count(), 3 + 4001 + 3, "nothing lost");
        assert_eq!(pieces.len(), 15);
        // Exact multiples and a limit of one.
        assert_eq!(cut_word("e\u{301}\u{301}\u{301}", 2), ["e\u{301}", "\u{301}\u{301}"]);
        assert_eq!(cut_word("ae\u{301}\u{301}b", 2), ["a", "e\u{301}", "\u{301}b"]);
        assert_eq!(pack_words("e\u{301}\u{302} x", 1, char::is_whitespace), ["e", "\u{301}", "\u{302}", "x"]);
        assert_eq!(pack_words("ab", 0, char::is_whitespace), ["a", "b"], "a limit of 0 reads as 1");
    }

    #[test]
    fn clusters_are_capped_to_their_first_code_points() {
        let (t, n) = cap_clusters("plain text, e\u{301}", MAX_CLUSTER_CHARS);
        assert!(matches!(t, Cow::Borrowed(_)) && n == 0);
        let huge = format!("x a{} b", "\u{301}".repeat(4000));
        let (t, n) = cap_clusters(&huge, MAX_CLUSTER_CHARS);
        assert_eq!(t, format!("x a{} b", "\u{301}".repeat(MAX_CLUSTER_CHARS - 1)));
        assert_eq!(n, 4000 - (MAX_CLUSTER_CHARS - 1));
        // Every cluster, not only the first; one of exactly the cap stays.
        let exact = format!("o{}", "\u{308}".repeat(MAX_CLUSTER_CHARS - 1));
        let text = format!("{exact} e{} u{}", "\u{301}".repeat(40), "\u{300}".repeat(33));
        let (t, n) = cap_clusters(&text, MAX_CLUSTER_CHARS);
        assert_eq!(t.graphemes(true).map(|g| g.chars().count()).max(), Some(MAX_CLUSTER_CHARS));
        assert!(t.starts_with(&exact));
        assert_eq!(n, (40 - 31) + (33 - 31));
        // Emoji ZWJ sequences stay whole.
        let family = "\u{1F468}\u{200D}\u{1F469}\u{200D}\u{1F467}\u{200D}\u{1F466}";
        assert_eq!(cap_clusters(family, MAX_CLUSTER_CHARS).0, family);
    }
}
