//! The official text frontend: normalisation, language wrapping, code-point
//! indexing and long-text chunking (Supertonic's `helper.py` behaviour).

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
    for (from, to) in [("\"\"", "\""), ("''", "'"), ("``", "`")] {
        s = s.replace(from, to);
    }
    let mut s = s.split_whitespace().collect::<Vec<_>>().join(" ");
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

/// A code-point → embedding-row table (`unicode_indexer.json`): 65536 entries,
/// -1 for characters the model has no row for.
pub struct Indexer {
    table: Vec<i32>,
}

impl Indexer {
    /// `rows`: the character embeddings' row count; every entry must be one of
    /// them or -1.
    pub fn new(table: Vec<i32>, rows: usize) -> Result<Self, String> {
        if table.len() != 65536 {
            return Err(format!("the character indexer has {} entries, expected 65536", table.len()));
        }
        if let Some((cp, id)) = table.iter().enumerate().find(|(_, &id)| id < -1 || id >= rows as i32) {
            return Err(format!("the character indexer maps U+{cp:04X} to row {id}, but the embeddings have {rows} rows"));
        }
        Ok(Indexer { table })
    }

    /// Row id per character (code points wrap to 16 bits as the official code's
    /// uint16 cast does), or the distinct unsupported characters, in order.
    pub fn encode(&self, text: &str) -> Result<Vec<i32>, Vec<char>> {
        let mut ids = Vec::with_capacity(text.len());
        let mut bad: Vec<char> = Vec::new();
        for c in text.chars() {
            let id = self.table[(c as u32 & 0xFFFF) as usize];
            if id < 0 {
                if !bad.contains(&c) {
                    bad.push(c);
                }
            } else {
                ids.push(id);
            }
        }
        if bad.is_empty() {
            Ok(ids)
        } else {
            Err(bad)
        }
    }
}

/// Abbreviations after which a period does not end a sentence.
const ABBREVIATIONS: &[&str] = &[
    "Mr.", "Mrs.", "Ms.", "Dr.", "Prof.", "Sr.", "Jr.", "Ph.D.", "etc.", "e.g.", "i.e.", "vs.", "Inc.", "Ltd.", "Co.", "Corp.", "St.", "Ave.", "Blvd.",
];

/// Splits a paragraph into sentences at whitespace after `.`, `!` or `?`,
/// except after the abbreviations above or a single capital letter and period.
fn sentences(paragraph: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let chars: Vec<(usize, char)> = paragraph.char_indices().collect();
    let mut i = 0;
    while i < chars.len() {
        let (pos, c) = chars[i];
        if matches!(c, '.' | '!' | '?') && i + 1 < chars.len() && chars[i + 1].1.is_whitespace() {
            let before = &paragraph[..pos + c.len_utf8()];
            let abbreviation = ABBREVIATIONS.iter().any(|a| before.ends_with(a)) || single_initial(&chars[..=i]);
            let mut j = i + 1;
            while j < chars.len() && chars[j].1.is_whitespace() {
                j += 1;
            }
            if !abbreviation {
                out.push(&paragraph[start..pos + c.len_utf8()]);
                start = if j < chars.len() { chars[j].0 } else { paragraph.len() };
            }
            i = j;
            continue;
        }
        i += 1;
    }
    if start < paragraph.len() {
        out.push(&paragraph[start..]);
    }
    out
}

/// Whether the text ends in `\b[A-Z]\.`.
fn single_initial(chars: &[(usize, char)]) -> bool {
    let n = chars.len();
    if n < 2 || chars[n - 1].1 != '.' || !chars[n - 2].1.is_ascii_uppercase() {
        return false;
    }
    n == 2 || !is_word_char(chars[n - 3].1)
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Splits long text into chunks of at most `max_len` characters: paragraphs
/// (blank lines) first, then sentences packed greedily.
pub fn chunk_text(text: &str, max_len: usize) -> Vec<String> {
    let mut chunks = Vec::new();
    for paragraph in split_paragraphs(text) {
        let paragraph = paragraph.trim();
        if paragraph.is_empty() {
            continue;
        }
        let mut current = String::new();
        for sentence in sentences(paragraph) {
            let sentence = sentence.trim();
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
    chunks
}

/// Splits on blank lines (`\n`, optional whitespace, one or more `\n`).
fn split_paragraphs(text: &str) -> Vec<&str> {
    let re = regex::Regex::new(r"\n\s*\n+").expect("static regex");
    re.split(text).collect()
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
    }

    #[test]
    fn sentence_split_respects_abbreviations() {
        assert_eq!(sentences("Dr. Smith came. He left! Did J. Doe? Yes."), vec!["Dr. Smith came.", "He left!", "Did J. Doe?", "Yes."]);
    }

    #[test]
    fn chunks_pack_greedily() {
        let text = "One two. Three four. Five six.\n\nSeven.";
        assert_eq!(chunk_text(text, 20), vec!["One two. Three four.", "Five six.", "Seven."]);
    }
}
