//! The Rust text frontend against the Python one (`tools/supertonic/text.py`)
//! on `tests/fixtures/supertonic/text_cases.json`: normalised and wrapped text,
//! ids from the real Supertonic 2 indexer (read from `../shared`, not
//! committed), unsupported characters, and chunking at 300 and 120 characters.

use std::path::{Path, PathBuf};
use tts_model_supertonic::text::{chunk_text, normalize, wrap, Indexer};

#[derive(serde::Deserialize)]
struct Cases {
    cases: Vec<Case>,
}

#[derive(serde::Deserialize)]
struct Case {
    name: String,
    input: String,
    lang: String,
    preprocessed: String,
    prepared: String,
    ids: Vec<i32>,
    unsupported: Vec<String>,
    chunks_300: Vec<String>,
    chunks_120: Vec<String>,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn real_v2_indexer() -> Indexer {
    let path = repo_root().join("../shared/data/supertonic-v2/unicode_indexer.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e} (the shared data directory sits beside the repository)", path.display()));
    let table: Vec<i32> = serde_json::from_str(&text).unwrap();
    let rows = *table.iter().max().unwrap() as usize + 1;
    Indexer::new(table, rows).unwrap()
}

#[test]
fn matches_the_python_frontend_on_the_real_v2_indexer() {
    let cases: Cases = serde_json::from_str(&std::fs::read_to_string(repo_root().join("tests/fixtures/supertonic/text_cases.json")).unwrap()).unwrap();
    let indexer = real_v2_indexer();
    assert!(cases.cases.len() >= 20);
    for c in &cases.cases {
        let normalized = normalize(&c.input);
        assert_eq!(normalized, c.preprocessed, "{}: normalisation", c.name);
        let prepared = wrap(&normalized, &c.lang, true);
        assert_eq!(prepared, c.prepared, "{}: wrapping", c.name);
        match indexer.encode(&prepared) {
            Ok(ids) => {
                assert!(c.unsupported.is_empty(), "{}: Python found unsupported {:?}", c.name, c.unsupported);
                assert_eq!(ids, c.ids, "{}: ids", c.name);
            }
            Err(bad) => {
                let bad: Vec<String> = bad.iter().map(|ch| ch.to_string()).collect();
                assert_eq!(bad, c.unsupported, "{}: unsupported characters", c.name);
            }
        }
        assert_eq!(chunk_text(&c.input, 300), c.chunks_300, "{}: chunks at 300", c.name);
        assert_eq!(chunk_text(&c.input, 120), c.chunks_120, "{}: chunks at 120", c.name);
    }
}
