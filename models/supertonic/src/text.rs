//! The official text frontend: normalisation, language wrapping, code-point
//! indexing and long-text chunking (Supertonic's `helper.py` behaviour).

use engine_core::model_kit::text::is_python_space;
use engine_core::model_kit::Result;
use unicode_normalization::UnicodeNormalization;

/// Emoji and pictograph ranges removed before indexing.
const EMOJI_RANGES: &[(u32, u32)] = &[
    (0x1F600, 0x1F64F),
    (0x1F300, 0x1F5FF),
    (0x1F680, 0x1F6FF),
    (0x1F700, 0x1F77F),
    (0x1F780, 0x1F7FF),
    (0x1F800, 0x1F8FF),
    (0x1F900, 0x1F9FF),
    (0x1FA00, 0x1FA6F),
    (0x1FA70, 0x1FAFF),
    (0x2600, 0x26FF),
    (0x2700, 0x27BF),
    (0x1F1E6, 0x1F1FF),
];

/// Characters a sentence may end with; anything else gets a final '.'.
const TERMINALS: &[char] = &['.', '!', '?', ';', ':', ',', '\'', '"', ')', ']', '}', '…', '。', '」', '』', '】', '〉', '》', '›', '»'];

/// `text` with every run of whitespace ([`is_python_space`]) as one space, trimmed
/// (`re.sub(r"\s+", " ", text).strip()`).
fn collapse_spaces(text: &str) -> String {
    text.split(is_python_space).filter(|w| !w.is_empty()).collect::<Vec<_>>().join(" ")
}

/// Normalises text as the official pipeline does before wrapping.
pub fn normalize(text: &str) -> String {
    let mut s: String = text
        .nfkd()
        .filter(|c| !EMOJI_RANGES.iter().any(|&(a, b)| (a..=b).contains(&(*c as u32))))
        .filter_map(|c| match c {
            '–' | '‑' | '—' => Some('-'),
            '_' | '[' | ']' | '|' | '/' | '#' | '→' | '←' | '\u{AF}' => Some(' '),
            '“' | '”' => Some('"'),
            '‘' | '’' | '´' | '`' => Some('\''),
            '♥' | '☆' | '♡' | '©' | '\\' => None,
            c => Some(c),
        })
        .collect();
    for (from, to) in [("@", " at "), ("e.g.,", "for example, "), ("i.e.,", "that is, ")] {
        s = s.replace(from, to);
    }
    for p in [",", ".", "!", "?", ";", ":", "'"] {
        s = s.replace(&format!(" {p}"), p);
    }
    // The official loops `while '""' in text: text = text.replace('""', '"')`.
    for (from, to) in [("\"\"", "\""), ("''", "'"), ("``", "`")] {
        while s.contains(from) {
            s = s.replace(from, to);
        }
    }
    let mut s = collapse_spaces(&s);
    if !s.ends_with(TERMINALS) {
        s.push('.');
    }
    s
}

/// Wraps normalised text in the language tags the model expects.
pub fn wrap(text: &str, language: &str, open_close: bool) -> String {
    if open_close {
        format!("<{language}>{text}</{language}>")
    } else {
        text.to_string()
    }
}

/// What happens to characters the model's indexer has no row for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnsupportedChars {
    /// Leave them out (a warning names them); an error when nothing speakable remains.
    Skip,
    /// Refuse the text, naming each one.
    Error,
    /// As the official code: row -1, which the embedding lookup reads as its last row.
    Official,
}

impl UnsupportedChars {
    pub const NAMES: [&'static str; 3] = ["skip", "error", "official"];

    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "skip" => Ok(UnsupportedChars::Skip),
            "error" => Ok(UnsupportedChars::Error),
            "official" => Ok(UnsupportedChars::Official),
            other => Err(format!("unsupported_chars must be one of {}, got '{other}'", Self::NAMES.join(", ")).into()),
        }
    }
}

/// `'c' (U+XXXX)` for messages.
pub fn describe_chars(chars: &[char]) -> String {
    chars.iter().map(|c| format!("'{c}' (U+{:04X})", *c as u32)).collect::<Vec<_>>().join(", ")
}

/// Indexed text: embedding rows, and the distinct characters that had none.
#[derive(Debug, Clone, PartialEq)]
pub struct Encoded {
    pub ids: Vec<i32>,
    pub unsupported: Vec<char>,
}

/// A code-point → embedding-row table (`unicode_indexer.json`): 65536 entries,
/// -1 for characters the model has no row for.
pub struct Indexer {
    table: Vec<i32>,
    rows: usize,
}

impl Indexer {
    /// `rows`: the character embeddings' row count; every entry must be one of
    /// them or -1.
    pub fn new(table: Vec<i32>, rows: usize) -> Result<Self> {
        if table.len() != 65536 {
            return Err(format!("the character indexer has {} entries, expected 65536", table.len()).into());
        }
        if let Some((cp, id)) = table.iter().enumerate().find(|(_, &id)| id < -1 || id >= rows as i32) {
            return Err(format!("the character indexer maps U+{cp:04X} to row {id}, but the embeddings have {rows} rows").into());
        }
        Ok(Indexer { table, rows })
    }

    /// Row ids of `text` (code points wrap to 16 bits as the official code's
    /// uint16 cast does). Characters without a row are left out (`Skip`),
    /// refused (`Error`: the distinct ones, in order) or read as the last row
    /// (`Official`); `unsupported` lists them in every case.
    pub fn encode(&self, text: &str, policy: UnsupportedChars) -> Result<Encoded, Vec<char>> {
        let mut ids = Vec::with_capacity(text.len());
        let mut unsupported: Vec<char> = Vec::new();
        for c in text.chars() {
            match self.table[(c as u32 & 0xFFFF) as usize] {
                id if id >= 0 => ids.push(id),
                _ => {
                    if !unsupported.contains(&c) {
                        unsupported.push(c);
                    }
                    if policy == UnsupportedChars::Official {
                        ids.push(self.rows as i32 - 1);
                    }
                }
            }
        }
        if policy == UnsupportedChars::Error && !unsupported.is_empty() {
            return Err(unsupported);
        }
        Ok(Encoded { ids, unsupported })
    }
}

/// Abbreviations after which a period does not end a sentence.
const ABBREVIATIONS: &[&str] =
    &["Mr.", "Mrs.", "Ms.", "Dr.", "Prof.", "Sr.", "Jr.", "Ph.D.", "etc.", "e.g.", "i.e.", "vs.", "Inc.", "Ltd.", "Co.", "Corp.", "St.", "Ave.", "Blvd."];

/// Splits a paragraph into sentences at whitespace ([`is_python_space`]) after `.`,
/// `!` or `?`, except after the abbreviations above or a single capital letter
/// and period. One pass over the characters, nothing held per character.
fn sentences(paragraph: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut chars = paragraph.char_indices().peekable();
    let space_next = |chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>| chars.peek().is_some_and(|&(_, n)| is_python_space(n));
    while let Some((pos, c)) = chars.next() {
        if matches!(c, '.' | '!' | '?') && space_next(&mut chars) {
            let end = pos + c.len_utf8();
            let before = &paragraph[..end];
            let abbreviation = ABBREVIATIONS.iter().any(|a| before.ends_with(a)) || single_initial(before);
            while space_next(&mut chars) {
                chars.next();
            }
            if !abbreviation {
                out.push(&paragraph[start..end]);
                start = chars.peek().map_or(paragraph.len(), |&(b, _)| b);
            }
        }
    }
    if start < paragraph.len() {
        out.push(&paragraph[start..]);
    }
    out
}

/// Whether the text ends in `\b[A-Z]\.`.
fn single_initial(text: &str) -> bool {
    let mut back = text.chars().rev();
    back.next() == Some('.') && back.next().is_some_and(|c| c.is_ascii_uppercase()) && back.next().is_none_or(|c| !is_word_char(c))
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The longest sentence synthesized whole. The official chunker never cuts a
/// sentence, so an unpunctuated text of any length would be one chunk whose
/// attention grows with the square of its length; a longer sentence (well over a
/// minute of speech) is cut between words instead.
pub const MAX_SENTENCE_CHARS: usize = 1000;

/// Splits long text into chunks of at most `max_len` characters: paragraphs
/// (blank lines) first, then sentences packed greedily (a sentence longer than
/// [`MAX_SENTENCE_CHARS`] first cut between words). Lengths are code points,
/// and a grapheme cluster keeps at most
/// [`MAX_CLUSTER_CHARS`](engine_core::model_kit::text::MAX_CLUSTER_CHARS) of
/// them (a warning says how many were left out), so no chunk is longer than
/// `max(max_len, MAX_SENTENCE_CHARS)` code points whatever the input.
pub fn chunk_text(text: &str, max_len: usize) -> Vec<String> {
    let text = engine_core::model_kit::text::cap_clusters_logged(text);
    let mut chunks = Vec::new();
    for paragraph in split_paragraphs(text.trim_matches(is_python_space)) {
        let paragraph = paragraph.trim_matches(is_python_space);
        if paragraph.is_empty() {
            continue;
        }
        let mut current = String::new();
        let pieces = sentences(paragraph).into_iter().flat_map(|s| {
            let s = s.trim_matches(is_python_space);
            if s.chars().count() > MAX_SENTENCE_CHARS {
                engine_core::model_kit::text::pack_words(s, MAX_SENTENCE_CHARS, is_python_space)
            } else {
                vec![s.to_string()]
            }
        });
        for sentence in pieces {
            let sentence = sentence.as_str();
            if sentence.is_empty() {
                continue;
            }
            let joined = if current.is_empty() { 0 } else { current.chars().count() + 1 };
            if joined + sentence.chars().count() <= max_len {
                if !current.is_empty() {
                    current.push(' ');
                }
                current.push_str(sentence);
            } else {
                if !current.is_empty() {
                    chunks.push(std::mem::take(&mut current));
                }
                current.push_str(sentence);
            }
        }
        if !current.is_empty() {
            chunks.push(current);
        }
    }
    let mut fitted = Vec::with_capacity(chunks.len());
    for chunk in chunks {
        fit_normalized(chunk, &mut fitted);
    }
    fitted
}

/// The most characters a chunk may have after [`normalize`], which may
/// lengthen text: NFKD up to 18 code points for one (U+FDFA), `@` to ` at `.
/// A chunk beyond it is cut between words, so no input makes a chunk longer
/// than the longest sentence spoken whole, with the full stop normalisation
/// may add. The official chunks (300 characters; Hangul, at most three jamo a
/// syllable, 900) stay within it.
pub const MAX_NORMALIZED_CHARS: usize = MAX_SENTENCE_CHARS + 1;

/// `chunk` into `out`, cut between words (or clusters, or code points) until
/// every piece normalises to at most [`MAX_NORMALIZED_CHARS`] characters.
fn fit_normalized(chunk: String, out: &mut Vec<String>) {
    // No byte normalises to more than 6 characters (U+FDFA: 3 bytes, 18 code
    // points; `@`: 4), plus the final stop: an ordinary chunk needs no check.
    if chunk.len() * 6 < MAX_NORMALIZED_CHARS {
        out.push(chunk);
        return;
    }
    let normalized = normalize(&chunk).chars().count();
    if normalized <= MAX_NORMALIZED_CHARS {
        out.push(chunk);
        return;
    }
    // Strictly shorter pieces each time: this ends, at single code points
    // (which normalise to at most 18 characters) at worst.
    let chars = chunk.chars().count();
    let limit = (chars * MAX_NORMALIZED_CHARS / normalized).clamp(1, chars.saturating_sub(1).max(1));
    for piece in engine_core::model_kit::text::pack_words(&chunk, limit, is_python_space) {
        fit_normalized(piece, out);
    }
}

/// Marks a streamed first piece may end at: sentence ends and clause marks (the
/// full-width ones need no space after them).
const CUT_MARKS: &[char] = &['.', '!', '?', ',', ';', ':', '。', '！', '？', '，', '、', '；', '：'];

/// Where streaming cuts a first chunk longer than `max_chars` characters, so
/// the first audio comes sooner: after the last sentence end or clause mark
/// within the limit that leaves at least a third of it before the cut, else after the last whole
/// word within it. A word cut ends the head with a comma, so it is read as a
/// clause, not as a sentence end (the normaliser would add a full stop). None
/// when the chunk fits, or has no cut point within the limit.
pub fn cut_first_piece(chunk: &str, max_chars: usize) -> Option<(String, String)> {
    let chars: Vec<(usize, char)> = chunk.char_indices().collect();
    if max_chars == 0 || chars.len() <= max_chars {
        return None;
    }
    let next_is_space = |i: usize| chars.get(i + 1).is_some_and(|&(_, c)| is_python_space(c));
    let within = &chars[..max_chars];
    let clause = within
        .iter()
        .enumerate()
        .rev()
        .find(|&(i, &(_, c))| CUT_MARKS.contains(&c) && (!c.is_ascii() || next_is_space(i)) && (i + 1) * 3 >= max_chars)
        .map(|(i, _)| (i + 1, false));
    // A space at index `max_chars` still ends a word within the limit.
    let word = || chars[1..=max_chars].iter().rposition(|&(_, c)| is_python_space(c)).map(|i| (i + 1, true));
    let (cut, add_comma) = clause.or_else(word)?;
    let at = chars.get(cut).map_or(chunk.len(), |&(b, _)| b);
    let (head, tail) = (chunk[..at].trim_matches(is_python_space), chunk[at..].trim_matches(is_python_space));
    if head.is_empty() || tail.is_empty() {
        return None;
    }
    let mut head = head.to_string();
    if add_comma && !head.ends_with(TERMINALS) {
        head.push(',');
    }
    Some((head, tail.to_string()))
}

/// Splits on blank lines (`\n`, optional whitespace, one or more `\n`: the
/// official `\n\s*\n+` with Python's whitespace).
fn split_paragraphs(text: &str) -> Vec<&str> {
    static BLANK_LINES: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    BLANK_LINES.get_or_init(|| regex::Regex::new(r"\n[\s\x1c-\x1f]*\n+").expect("static regex")).split(text).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalisation_rules() {
        assert_eq!(normalize("Hello , world"), "Hello, world.");
        assert_eq!(normalize("a — b"), "a - b.");
        assert_eq!(normalize("mail me @ home!"), "mail me at home!");
        assert_eq!(normalize("“quoted”"), "\"quoted\"");
        assert_eq!(normalize("smile 😀 now?"), "smile now?");
        // Runs of quotes collapse whole (the official loops), Python's whitespace.
        assert_eq!(normalize("\"\"\"hi\"\"\""), "\"hi\"");
        assert_eq!(normalize("a''''b"), "a'b.");
        assert_eq!(normalize("a\u{1c}b\u{1f} c\u{85}"), "a b c.");
    }

    #[test]
    fn unsupported_characters_follow_the_policy() {
        let mut table = vec![-1; 65536];
        table['a' as usize] = 0;
        table['b' as usize] = 1;
        let ix = Indexer::new(table, 3).unwrap();
        assert_eq!(ix.encode("a?b?", UnsupportedChars::Skip).unwrap(), Encoded { ids: vec![0, 1], unsupported: vec!['?'] });
        assert_eq!(ix.encode("a?b?", UnsupportedChars::Official).unwrap().ids, vec![0, 2, 1, 2], "the last row");
        assert_eq!(ix.encode("a?b!", UnsupportedChars::Error).unwrap_err(), vec!['?', '!']);
        assert!(Indexer::new(vec![3; 65536], 3).err().unwrap().contains("maps U+0000 to row 3, but the embeddings have 3 rows"));
    }

    #[test]
    fn sentence_split_respects_abbreviations() {
        assert_eq!(sentences("Dr. Smith came. He left! Did J. Doe? Yes."), vec!["Dr. Smith came.", "He left!", "Did J. Doe?", "Yes."]);
    }

    #[test]
    fn a_streamed_first_piece_ends_at_a_clause_or_a_word() {
        let text = "When the lights went out, everyone in the hall stayed calm.";
        assert_eq!(cut_first_piece(text, 100), None, "fits");
        assert_eq!(cut_first_piece(text, 0), None, "off");
        assert_eq!(cut_first_piece(text, 30), Some(("When the lights went out,".into(), "everyone in the hall stayed calm.".into())));
        // The comma lies past the limit: the last whole word, marked as a clause.
        assert_eq!(cut_first_piece(text, 20), Some(("When the lights went,".into(), "out, everyone in the hall stayed calm.".into())));
        assert_eq!(cut_first_piece(text, 19), Some(("When the lights,".into(), "went out, everyone in the hall stayed calm.".into())));
        // A clause mark too early for the limit (under a third of it) loses to a word.
        assert_eq!(cut_first_piece("No, the quick brown fox jumps.", 24), Some(("No, the quick brown fox,".into(), "jumps.".into())));
        // Full-width marks need no space; text without spaces or marks stays whole.
        assert_eq!(cut_first_piece("今天天气很好，我们去公园散步吧。", 8), Some(("今天天气很好，".into(), "我们去公园散步吧。".into())));
        assert_eq!(cut_first_piece("今天天气很好我们去公园散步吧。", 8), None);
        assert_eq!(cut_first_piece("Supercalifragilistic expialidocious", 10), None, "no word ends within the limit");
        assert_eq!(
            cut_first_piece("Hello from the server. It streams as it speaks.", 30),
            Some(("Hello from the server.".into(), "It streams as it speaks.".into()))
        );
    }

    #[test]
    fn a_sentence_past_the_limit_is_cut_between_words() {
        let long = "word ".repeat(400); // 1999 characters, no sentence end
        let chunks = chunk_text(&long, 300);
        assert!(
            chunks.len() >= 2 && chunks.iter().all(|c| c.chars().count() <= MAX_SENTENCE_CHARS),
            "{:?}",
            chunks.iter().map(|c| c.len()).collect::<Vec<_>>()
        );
        assert_eq!(chunks.join(" "), long.trim());
        // Up to the limit the official rule holds: the sentence stays whole.
        let sentence = format!("{}end.", "word ".repeat(100));
        assert_eq!(chunk_text(&sentence, 300), vec![sentence.clone()]);
    }

    #[test]
    fn combining_marks_cannot_make_a_chunk_longer_than_the_limits() {
        use engine_core::model_kit::text::MAX_CLUSTER_CHARS;
        // One letter with 4000 combining acutes is a single grapheme cluster:
        // it keeps its first marks (a warning says so) and is spoken as one
        // short chunk.
        let chunks = chunk_text(&format!("a{}", "\u{301}".repeat(4000)), 300);
        assert_eq!(chunks, vec![format!("a{}", "\u{301}".repeat(MAX_CLUSTER_CHARS - 1))]);
        // Many capped clusters in one unpunctuated run: cut by code points.
        let run = format!("e{}", "\u{301}".repeat(100)).repeat(200);
        let chunks = chunk_text(&run, 300);
        assert!(chunks.iter().all(|c| c.chars().count() <= MAX_SENTENCE_CHARS), "{:?}", chunks.iter().map(|c| c.chars().count()).collect::<Vec<_>>());
        assert_eq!(chunks.iter().map(|c| c.chars().count()).sum::<usize>(), 200 * MAX_CLUSTER_CHARS);
        // 4000 plain letters: four chunks at the sentence cut.
        let letters = chunk_text(&"a".repeat(4000), 300);
        assert_eq!(letters.iter().map(|c| c.chars().count()).collect::<Vec<_>>(), [MAX_SENTENCE_CHARS; 4]);
    }

    #[test]
    fn a_chunk_that_normalisation_lengthens_is_cut_to_the_limit() {
        // U+FDFA decomposes (NFKD) into 18 code points: 1000 of them are one
        // sentence of 1000 characters but 18000 after normalisation.
        let chunks = chunk_text(&"\u{FDFA}".repeat(1000), 300);
        assert!(chunks.len() >= 9, "{}", chunks.len());
        assert!(chunks.iter().all(|c| normalize(c).chars().count() <= MAX_NORMALIZED_CHARS));
        assert_eq!(chunks.concat(), "\u{FDFA}".repeat(1000));
        let at = chunk_text(&"@ ".repeat(900), 300);
        assert!(at.iter().all(|c| normalize(c).chars().count() <= MAX_NORMALIZED_CHARS), "{:?}", at.iter().map(|c| normalize(c).len()).collect::<Vec<_>>());
        // Ordinary chunks are the official ones.
        let korean = "가나다라 ".repeat(50);
        assert_eq!(chunk_text(&korean, 300).len(), 1);
    }

    #[test]
    fn chunks_pack_greedily() {
        let text = "One two. Three four. Five six.\n\nSeven.";
        assert_eq!(chunk_text(text, 20), vec!["One two. Three four.", "Five six.", "Seven."]);
    }
}
