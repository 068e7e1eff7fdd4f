//! `tracing` output: stderr, filter from `TTS_LOG` (default `warn,ggml=off,symphonia=off`:
//! the audio decoders log what the reader then reports as one error line).
//!
//! Every plugin is its own shared library with its own copy of `tracing`'s
//! global dispatcher, so the host's subscriber never sees a plugin's events.
//! The host and each plugin therefore install the same subscriber in their own
//! copy: the host at start-up, plugins when they are opened or load a model.
//!
//! Log lines quote user text (characters of the text, file names, option
//! values). Every field of every event passes through [`escape`], so no input
//! can move the cursor, recolour the terminal, start a forged log line or
//! reorder what a reader sees with bidirectional overrides.

use std::borrow::Cow;
use std::fmt::Write as _;
use tracing_subscriber::field::MakeExt;
use tracing_subscriber::EnvFilter;

/// Installs the stderr subscriber in the calling library's copy of `tracing`
/// (a no-op when one is already installed there).
pub fn init_from_env() {
    let filter = EnvFilter::try_from_env("TTS_LOG").unwrap_or_else(|_| EnvFilter::new("warn,ggml=off,symphonia=off"));
    // The fields are escaped, not the whole line: the formatter's own colours
    // (ANSI on a terminal) must stay codes.
    let fields = tracing_subscriber::fmt::format::debug_fn(|writer, field, value| {
        let text = format!("{value:?}");
        match field.name() {
            "message" => write!(writer, "{}", escape(&text)),
            name => write!(writer, "{name}={}", escape(&text)),
        }
    })
    .delimited(" ");
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .fmt_fields(fields)
        .with_env_filter(filter)
        .with_target(false)
        .try_init();
}

/// Whether `c` must not reach a log line or a terminal as itself: C0 and C1
/// controls and DEL (cursor movement, colours, terminal queries, line breaks),
/// the Unicode line and paragraph separators, and the bidirectional controls
/// (embeddings, overrides, isolates, marks) that reorder how a line displays.
fn needs_escape(c: char) -> bool {
    matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{61c}' | '\u{2028}' | '\u{2029}')
}

/// `text` with every control character and bidirectional control written as
/// an escape: `\t`, `\n`, `\r`, otherwise `\u{202e}` (Rust's notation).
/// Everything else, quotes and backslashes included, stays as it is: unlike
/// `char::escape_debug` this keeps paths and quoted text readable, at the cost
/// of not being reversible (a literal `\u{7}` in the text looks the same as an
/// escaped BEL), which a log line does not need.
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn controls_and_bidi_overrides_are_escaped() {
        assert_eq!(escape("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(escape("x\ty\nz\r"), "x\\ty\\nz\\r");
        assert_eq!(escape("\u{0}\u{7f}\u{85}\u{9f}"), "\\u{0}\\u{7f}\\u{85}\\u{9f}");
        assert_eq!(escape("abc\u{202e}fed\u{202c}"), "abc\\u{202e}fed\\u{202c}");
        for c in ['\u{202a}', '\u{202b}', '\u{202d}', '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}', '\u{200e}', '\u{200f}', '\u{61c}', '\u{2028}', '\u{2029}']
        {
            let escaped = escape(&c.to_string()).into_owned();
            assert_eq!(escaped, format!("\\u{{{:x}}}", c as u32));
        }
    }

    #[test]
    fn ordinary_text_is_left_alone() {
        for text in ["plain", "quotes \" and ' and \\ stay", "Grüße, naïve café", "日本語", "emoji 🎙", "a\u{301}", "שלום", "zero\u{200b}width"] {
            assert!(matches!(escape(text), std::borrow::Cow::Borrowed(t) if t == text), "{text}");
        }
    }
}
