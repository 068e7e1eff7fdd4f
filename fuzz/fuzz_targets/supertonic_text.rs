//! Supertonic's text front end on arbitrary text: normalisation, language
//! wrapping, chunking at a fuzzed length, and indexing under every policy for
//! characters the indexer lacks.
#![no_main]

use libfuzzer_sys::fuzz_target;
use unicode_segmentation::UnicodeSegmentation;
use tts_fuzz::quiet;
use std::sync::OnceLock;
use tts_model_supertonic::text::{chunk_text, normalize, wrap, Indexer, UnsupportedChars};

/// A small indexer: ASCII letters, digits, punctuation and the tags' characters.
fn indexer() -> &'static Indexer {
    static INDEXER: OnceLock<Indexer> = OnceLock::new();
    INDEXER.get_or_init(|| {
        let mut table = vec![-1; 65536];
        for (row, cp) in (0x20u32..0x7f).enumerate() {
            table[cp as usize] = row as i32;
        }
        Indexer::new(table, 96).expect("a valid table")
    })
}

fuzz_target!(|data: &[u8]| {
    quiet();
    let Some((&max, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    for chunk in chunk_text(text, max as usize + 1) {
        // A chunk is over the limit only when it is one sentence, and a sentence
        // is cut past MAX_SENTENCE_CHARS code points (clusters capped, and cut
        // when longer); normalised, it stays within MAX_NORMALIZED_CHARS; a
        // chunk is never empty or padded.
        let limit = (max as usize + 1).max(tts_model_supertonic::text::MAX_SENTENCE_CHARS);
        assert!(chunk.chars().count() <= limit, "chunk over {limit}: {chunk:?}");
        // (+1: marks that followed a control character, such as a tab, join
        // the single space that replaces it.)
        assert!(chunk.graphemes(true).all(|g| g.chars().count() <= engine_core::model_kit::text::MAX_CLUSTER_CHARS + 1), "cluster over the cap: {chunk:?}");
        assert!(normalize(&chunk).chars().count() <= tts_model_supertonic::text::MAX_NORMALIZED_CHARS, "normalised over the limit: {chunk:?}");
        assert!(!chunk.is_empty() && chunk.trim_matches(engine_core::model_kit::text::is_python_space) == chunk, "chunk {chunk:?}");
        let wrapped = wrap(&normalize(&chunk), "en", true);
        for policy in [UnsupportedChars::Skip, UnsupportedChars::Error, UnsupportedChars::Official] {
            if let Ok(e) = indexer().encode(&wrapped, policy) {
                assert!(e.ids.iter().all(|&id| (0..96).contains(&id)));
            }
        }
    }
});
