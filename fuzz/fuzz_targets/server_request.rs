//! The server's request handling on arbitrary bytes: the speech body's
//! parsing and validation (`tts_serve_api::parse_speech`, under a large and a
//! tiny input limit) and the `Authorization` check. Every refusal must be a
//! 4xx with OpenAI's error body, and whatever passes must hold what the
//! server relies on.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tts_serve_api::{bearer_token, body_limit, parse_speech, ApiKey, SPEED_RANGE};

fuzz_target!(|data: &[u8]| {
    for max_chars in [4096, 3] {
        match parse_speech(data, max_chars) {
            Ok(request) => {
                assert!(data.len() <= body_limit(max_chars));
                assert!(!request.input.trim().is_empty());
                assert!(request.input.chars().count() <= max_chars);
                assert!(request.speed.is_none_or(|s| SPEED_RANGE.contains(&s)));
                assert!(request.language.as_deref() != Some(""));
            }
            Err(e) => {
                assert!(matches!(e.status, 400 | 413), "{e:?}");
                assert!(!e.message.is_empty());
                let body = e.body().to_string();
                assert!(body.starts_with("{\"error\":"), "{body}");
            }
        }
    }
    // The bytes as an Authorization header value.
    let key = ApiKey::new("fuzz-key").unwrap();
    let token = bearer_token(data);
    if let Some(t) = token {
        assert!(t.len() + 7 <= data.len());
    }
    match key.check(Some(data)) {
        Ok(()) => assert_eq!(token, Some(&b"fuzz-key"[..])),
        Err(e) => assert_eq!((e.status, e.code), (401, Some("invalid_api_key"))),
    }
});
