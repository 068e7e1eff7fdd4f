//! The catalog of pullable models: data (`catalog.toml`, embedded), read
//! into these types. Names map to repositories, revisions, file patterns,
//! the family that converts them and its options.

use serde::Deserialize;

/// The catalog built into `tts`.
const EMBEDDED: &str = include_str!("catalog.toml");

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogFile {
    model: Vec<Entry>,
}

/// One model `tts pull` knows.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub name: String,
    pub family: String,
    pub about: String,
    /// Converter options, in the order given (a TOML table keeps its keys sorted).
    #[serde(default)]
    pub options: indexmap::IndexMap<String, String>,
    /// Fetched files copied beside the GGUFs unchanged.
    #[serde(default)]
    pub keep: Vec<String>,
    pub source: Vec<Source>,
}

/// One repository an entry's files come from.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    pub repo: String,
    pub revision: String,
    pub files: Vec<String>,
}

/// Every entry of the embedded catalog.
pub fn entries() -> Vec<Entry> {
    // The embedded catalog is checked by `embedded_catalog_parses`; a failure
    // here is a build defect, not user input.
    toml::from_str::<CatalogFile>(EMBEDDED).expect("the embedded catalog.toml parses").model
}

/// The entry for `spec` (`NAME` or `NAME@REVISION`; the revision replaces the
/// first source's). An unknown name is a one-line error listing the catalog.
pub fn lookup(spec: &str) -> Result<Entry, String> {
    let (name, revision) = match spec.split_once('@') {
        Some((n, r)) => (n, Some(r)),
        None => (spec, None),
    };
    let all = entries();
    let Some(mut entry) = all.iter().find(|e| e.name == name).cloned() else {
        let names: Vec<&str> = all.iter().map(|e| e.name.as_str()).collect();
        return Err(format!("no model `{name}` in the catalog; known: {}", names.join(", ")));
    };
    if let Some(revision) = revision {
        check_revision(revision)?;
        entry.source[0].revision = revision.to_string();
    }
    Ok(entry)
}

/// A revision is a branch, tag or commit name: it goes into a URL path and a
/// cache file name, so it may not climb out of either.
fn check_revision(revision: &str) -> Result<(), String> {
    let ok =
        !revision.is_empty() && revision.len() <= 256 && revision.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) && !revision.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(format!("revision `{revision}`: use a branch, tag or commit hash (letters, digits, '-', '_', '.')"))
    }
}

/// Whether `path` (a repository file path) matches `pattern`, where `*`
/// matches any run of characters within one path segment.
pub fn matches(pattern: &str, path: &str) -> bool {
    let (pattern, path): (Vec<&str>, Vec<&str>) = (pattern.split('/').collect(), path.split('/').collect());
    pattern.len() == path.len() && pattern.iter().zip(&path).all(|(p, s)| segment_matches(p.as_bytes(), s.as_bytes()))
}

fn segment_matches(p: &[u8], s: &[u8]) -> bool {
    match p.split_first() {
        None => s.is_empty(),
        // Catalog patterns hold one star at most, so this stays linear.
        Some((b'*', rest)) => (0..=s.len()).any(|i| segment_matches(rest, &s[i..])),
        Some((c, rest)) => s.first() == Some(c) && segment_matches(rest, &s[1..]),
    }
}

/// The files of `available` that `patterns` select, in pattern order (each
/// pattern's matches sorted), and the patterns that match nothing.
pub fn select(patterns: &[String], available: &[String]) -> (Vec<String>, Vec<String>) {
    let mut chosen: Vec<String> = Vec::new();
    let mut missing = Vec::new();
    for pattern in patterns {
        let mut hits: Vec<&String> = available.iter().filter(|f| matches(pattern, f)).collect();
        hits.sort();
        if hits.is_empty() {
            missing.push(pattern.clone());
        }
        for hit in hits {
            if !chosen.contains(hit) {
                chosen.push(hit.clone());
            }
        }
    }
    (chosen, missing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_catalog_parses_and_names_the_issue_models() {
        let names: Vec<String> = entries().into_iter().map(|e| e.name).collect();
        for want in ["supertonic-1", "supertonic-2", "supertonic-3", "chatterbox-turbo", "chatterbox-nano", "chatterbox-multilingual"] {
            assert!(names.contains(&want.to_string()), "{want} missing from {names:?}");
        }
        for e in entries() {
            assert!(!e.source.is_empty(), "{}", e.name);
            for s in &e.source {
                check_revision(&s.revision).unwrap();
                assert!(s.repo.split('/').count() == 2, "{}", s.repo);
            }
            for k in &e.keep {
                assert!(e.source.iter().any(|s| s.files.contains(k)), "{}: keep {k} is not fetched", e.name);
            }
        }
    }

    #[test]
    fn nano_takes_files_from_two_repositories() {
        let e = lookup("chatterbox-nano").unwrap();
        assert_eq!(e.source.len(), 2);
        assert_eq!(e.source[0].files, ["t3_nano_v1.safetensors"]);
        assert!(e.source[1].files.contains(&"s3gen_meanflow.safetensors".to_string()));
        assert_eq!(e.options.get("variant").map(String::as_str), Some("nano"));
    }

    #[test]
    fn revision_suffix_replaces_the_first_pin() {
        let e = lookup("chatterbox-turbo@abc123").unwrap();
        assert_eq!(e.source[0].revision, "abc123");
        assert!(lookup("chatterbox-turbo@../x").unwrap_err().contains("revision `../x`"));
        assert!(lookup("chatterbox-turbo@").is_err());
    }

    #[test]
    fn unknown_name_lists_the_catalog() {
        let e = lookup("chatterbox-large").unwrap_err();
        assert!(e.starts_with("no model `chatterbox-large` in the catalog; known: supertonic-1, "), "{e}");
        assert!(e.contains("chatterbox-multilingual"));
    }

    #[test]
    fn patterns_match_within_one_segment() {
        assert!(matches("voice_styles/*.json", "voice_styles/F1.json"));
        assert!(!matches("voice_styles/*.json", "voice_styles/x/F1.json"));
        assert!(!matches("*.json", "voice_styles/F1.json"));
        assert!(matches("conds.pt", "conds.pt"));
        assert!(!matches("conds.pt", "conds.pth"));
        let avail: Vec<String> = ["b.json", "a.json", "c.pt"].iter().map(|s| s.to_string()).collect();
        let (got, missing) = select(&["*.json".into(), "c.pt".into(), "d.pt".into()], &avail);
        assert_eq!(got, ["a.json", "b.json", "c.pt"]);
        assert_eq!(missing, ["d.pt"]);
    }
}
