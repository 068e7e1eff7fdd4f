//! The Rust text frontend against the official helper's rules as
//! `tools/supertonic/text.py` implements them: normalised and wrapped text, the
//! ids under each `unsupported_chars` policy, and chunking at 300 and 120
//! characters. Two sets of cases: with the committed tiny-v2 model's indexer
//! (always), and with the real Supertonic 2 indexer, which is not committed
//! (only when `TTS_SHARED_DATA` names the shared data directory).

use std::path::{Path, PathBuf};
use tts_model_supertonic::text::{chunk_text, normalize, wrap, Indexer, UnsupportedChars};

#[derive(serde::Deserialize)]
struct Cases {
    /// Embedding rows of the indexer's model, when known.
    rows: Option<usize>,
    cases: Vec<Case>,
}

#[derive(serde::Deserialize)]
struct Case {
    name: String,
    input: String,
    lang: String,
    preprocessed: String,
    prepared: String,
    /// The official ids: -1 where the indexer has no row.
    ids: Vec<i32>,
    unsupported: Vec<String>,
    chunks_300: Vec<String>,
    chunks_120: Vec<String>,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn load_cases(name: &str) -> Cases {
    serde_json::from_str(&std::fs::read_to_string(repo_root().join("tests/fixtures/supertonic").join(name)).unwrap()).unwrap()
}

fn check(cases: &Cases, table: Vec<i32>, rows: usize) {
    let indexer = Indexer::new(table, rows).unwrap();
    assert!(cases.cases.len() >= 30);
    for c in &cases.cases {
        let normalized = normalize(&c.input);
        assert_eq!(normalized, c.preprocessed, "{}: normalisation", c.name);
        let prepared = wrap(&normalized, &c.lang, true);
        assert_eq!(prepared, c.prepared, "{}: wrapping", c.name);
        let unsupported: Vec<char> = c.unsupported.iter().map(|s| s.chars().next().unwrap()).collect();
        // Official: -1 reads the embeddings' last row.
        let official = indexer.encode(&prepared, UnsupportedChars::Official).unwrap();
        let want: Vec<i32> = c.ids.iter().map(|&id| if id < 0 { rows as i32 - 1 } else { id }).collect();
        assert_eq!(official.ids, want, "{}: official ids", c.name);
        assert_eq!(official.unsupported, unsupported, "{}: unsupported characters", c.name);
        // Skip: the same ids without those characters.
        let skip = indexer.encode(&prepared, UnsupportedChars::Skip).unwrap();
        let want: Vec<i32> = c.ids.iter().copied().filter(|&id| id >= 0).collect();
        assert_eq!(skip.ids, want, "{}: ids with unsupported characters skipped", c.name);
        // Error: refused exactly when the official code would read a -1.
        match indexer.encode(&prepared, UnsupportedChars::Error) {
            Ok(e) => assert!(unsupported.is_empty(), "{}: {e:?}", c.name),
            Err(bad) => assert_eq!(bad, unsupported, "{}: refused characters", c.name),
        }
        assert_eq!(chunk_text(&c.input, 300), c.chunks_300, "{}: chunks at 300", c.name);
        assert_eq!(chunk_text(&c.input, 120), c.chunks_120, "{}: chunks at 120", c.name);
    }
}

/// The tiny fixture's indexer and embedding rows, read from its GGUF.
#[test]
fn matches_the_official_rules_on_the_fixture_indexer() {
    let cases = load_cases("text_cases_tiny_v2.json");
    let gguf = ggml_sys::gguf::GgufTensors::open(&repo_root().join("tests/fixtures/supertonic/tiny-v2/model.gguf")).unwrap();
    let bytes = gguf.read_bytes("text.indexer").unwrap();
    let table: Vec<i32> = bytes.chunks_exact(2).map(|c| i16::from_le_bytes([c[0], c[1]]) as i32).collect();
    let rows = gguf.ctx.get_tensor("dp.char_emb").unwrap().ne()[1] as usize;
    assert_eq!(Some(rows), cases.rows, "the cases were made with this model's indexer");
    check(&cases, table, rows);
}

/// The real Supertonic 2 indexer (`$TTS_SHARED_DATA/supertonic-v2/unicode_indexer.json`).
#[test]
fn matches_the_official_rules_on_the_real_v2_indexer() {
    let Some(shared) = std::env::var_os("TTS_SHARED_DATA") else {
        eprintln!("skipped: TTS_SHARED_DATA does not name the shared data directory");
        return;
    };
    let path = PathBuf::from(shared).join("supertonic-v2/unicode_indexer.json");
    let table: Vec<i32> = serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap();
    // The official v2 model has one row beyond the highest id (what -1 reads).
    let rows = *table.iter().max().unwrap() as usize + 2;
    check(&load_cases("text_cases.json"), table, rows);
}
