//! The pure part of `tts serve`'s request handling: parsing and validating a
//! `POST /v1/audio/speech` body, checking the API key, and OpenAI's error
//! bodies. Nothing here touches the network, a model or the filesystem, so the
//! fuzz target `server_request` drives it directly (docs/server.md).

use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// OpenAI's model names, answered by the first profile's model, so clients
/// written for OpenAI work unchanged.
pub const OPENAI_MODEL_ALIASES: [&str; 3] = ["tts-1", "tts-1-hd", "gpt-4o-mini-tts"];

/// OpenAI's bounds on `speed`.
pub const SPEED_RANGE: std::ops::RangeInclusive<f64> = 0.25..=4.0;

/// An error as OpenAI reports it: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: u16, message: impl Into<String>, param: Option<&str>, code: Option<&'static str>) -> ApiError {
        ApiError { status, message: message.into(), param: param.map(str::to_string), code }
    }

    /// The 413 for a body over [`body_limit`].
    pub fn body_too_large() -> ApiError {
        ApiError::new(413, "the request body is too large", Some("input"), None)
    }

    /// OpenAI's `type`: clients retry `server_error` (5xx) and 429, and give up
    /// on the rest.
    pub fn kind(&self) -> &'static str {
        match self.status {
            401 => "authentication_error",
            429 => "rate_limit_error",
            s if s >= 500 => "server_error",
            _ => "invalid_request_error",
        }
    }

    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind(), "param": self.param, "code": self.code}})
    }
}

/// The response formats of `/v1/audio/speech`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseFormat {
    Mp3,
    Opus,
    Aac,
    Flac,
    Wav,
    Pcm,
}

impl ResponseFormat {
    pub const SUPPORTED: &'static str = "mp3, opus, aac, flac, wav, pcm";

    /// OpenAI's names (all six it lists); anything else is refused with the
    /// supported list.
    pub fn parse(name: &str) -> Result<ResponseFormat, String> {
        match name {
            "mp3" => Ok(ResponseFormat::Mp3),
            "opus" => Ok(ResponseFormat::Opus),
            "aac" => Ok(ResponseFormat::Aac),
            "wav" => Ok(ResponseFormat::Wav),
            "pcm" => Ok(ResponseFormat::Pcm),
            "flac" => Ok(ResponseFormat::Flac),
            other => Err(format!("response_format `{other}` is not supported; supported: {}", ResponseFormat::SUPPORTED)),
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            ResponseFormat::Mp3 => "audio/mpeg",
            // Opus in Ogg pages, as OpenAI sends it.
            ResponseFormat::Opus => "audio/ogg",
            ResponseFormat::Aac => "audio/aac",
            ResponseFormat::Wav => "audio/wav",
            ResponseFormat::Pcm => "audio/pcm",
            ResponseFormat::Flac => "audio/flac",
        }
    }
}

/// OpenAI's voice names. Each maps to a voice of the served model through
/// [`OPENAI_VOICE_DEFAULTS`], or a profile's `[server.voices]`.
pub const OPENAI_VOICES: [&str; 13] = ["alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse", "marin", "cedar"];

/// The built-in voice each OpenAI name takes by default: OpenAI's female
/// voices on Supertonic's F1..F5, its male ones on M1..M5, in order (wrapping
/// round). A model without the named voice (Chatterbox has one built-in
/// voice, unnamed) speaks every OpenAI name with its default voice.
pub const OPENAI_VOICE_DEFAULTS: [(&str, &str); 13] = [
    ("alloy", "F1"),
    ("ash", "M1"),
    ("ballad", "M2"),
    ("coral", "F2"),
    ("echo", "M3"),
    ("fable", "M4"),
    ("nova", "F3"),
    ("onyx", "M5"),
    ("sage", "F4"),
    ("shimmer", "F5"),
    ("verse", "M1"),
    ("marin", "F1"),
    ("cedar", "M2"),
];

/// The longest `instructions` taken, in characters (OpenAI's limit for
/// `input`); longer is refused with 400. No served model reads them yet.
pub const MAX_INSTRUCTIONS_CHARS: usize = 4096;

/// How the audio is sent: the encoded bytes as they are made (`audio`), or
/// server-sent events carrying them in base64 (`sse`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamFormat {
    Audio,
    Sse,
}

impl StreamFormat {
    pub const SUPPORTED: &'static str = "audio, sse";

    pub fn parse(name: &str) -> Result<StreamFormat, String> {
        match name {
            "audio" => Ok(StreamFormat::Audio),
            "sse" => Ok(StreamFormat::Sse),
            other => Err(format!("stream_format `{other}` is not supported; supported: {}", StreamFormat::SUPPORTED)),
        }
    }
}

/// The JSON body as sent; unknown fields are ignored.
#[derive(Deserialize)]
struct RawRequest {
    model: String,
    input: String,
    /// A name, or OpenAI's custom voice object `{"id": NAME}`.
    #[serde(default)]
    voice: Option<Value>,
    #[serde(default)]
    instructions: Option<String>,
    #[serde(default)]
    speed: Option<f64>,
    #[serde(default)]
    response_format: Option<String>,
    #[serde(default)]
    stream_format: Option<String>,
    /// Not OpenAI's: the language of a multilingual model.
    #[serde(default)]
    language: Option<String>,
}

/// A speech request whose fields passed every check that needs no model:
/// `input` is not blank and holds at most the allowed characters, `voice` is
/// given, `speed` is in OpenAI's range, the formats are supported.
#[derive(Debug, Clone, PartialEq)]
pub struct SpeechRequest {
    pub model: String,
    pub input: String,
    /// The name given, or the `id` of a voice object.
    pub voice: String,
    /// None when absent or empty.
    pub instructions: Option<String>,
    pub speed: Option<f64>,
    pub format: ResponseFormat,
    pub stream: StreamFormat,
    /// None when absent or empty.
    pub language: Option<String>,
}

/// The voice a request names: a string, or `{"id": "..."}` (OpenAI's custom
/// voice object); required, as OpenAI's API has it.
fn voice_name(voice: Option<Value>) -> Result<String, ApiError> {
    let bad = |message: &str| ApiError::new(400, message, Some("voice"), None);
    let name = match voice {
        None | Some(Value::Null) => return Err(bad("voice is required: a voice name (`alloy`, a model's own voice) or {\"id\": NAME}")),
        Some(Value::String(s)) => s,
        Some(Value::Object(o)) => match o.get("id") {
            Some(Value::String(id)) => id.clone(),
            Some(_) => return Err(bad("the voice object's `id` must be a string")),
            None => return Err(bad("the voice object has no `id`")),
        },
        Some(_) => return Err(bad("voice must be a name or an object {\"id\": NAME}")),
    };
    if name.is_empty() {
        return Err(bad("voice is empty"));
    }
    Ok(name)
}

/// The largest body taken for `max_input_chars`: four bytes per character of
/// `input` and of `instructions` at most, plus room for the other fields. Larger gets 413.
pub fn body_limit(max_input_chars: usize) -> usize {
    max_input_chars.saturating_add(MAX_INSTRUCTIONS_CHARS).saturating_mul(4).saturating_add(64 << 10)
}

/// Which top-level field of a JSON object body a prefix of it ends in: fed
/// the bytes of a body that went over [`body_limit`], it names the field
/// whose value was being read at the cut (`instructions`: a 400 of its own;
/// anything else: 413). It keeps only its state and the current key (at most
/// [`OverflowScanner::KEY_CAP`] bytes), whatever it is fed.
#[derive(Debug, Default)]
pub struct OverflowScanner {
    /// Open objects and arrays.
    depth: usize,
    /// The body opened with `{` (a top-level array has no fields).
    object: bool,
    in_string: bool,
    escaped: bool,
    /// The string being read at depth 1 is a key (not a value).
    reading_key: bool,
    key: Vec<u8>,
    /// The key whose value is being read (from its `:` to the next `,`).
    field: Option<Vec<u8>>,
}

impl OverflowScanner {
    /// Longer keys are none of the speech request's.
    pub const KEY_CAP: usize = 32;

    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.in_string {
                match (self.escaped, b) {
                    (true, _) => self.escaped = false,
                    (false, b'\\') => self.escaped = true,
                    (false, b'"') => {
                        self.in_string = false;
                        if self.reading_key {
                            self.reading_key = false;
                            self.field = None;
                        }
                    }
                    _ => {}
                }
                if self.in_string && self.reading_key && self.key.len() < Self::KEY_CAP {
                    self.key.push(b);
                }
                continue;
            }
            match b {
                b'"' => {
                    self.in_string = true;
                    // A string at depth 1 with no field open is a key.
                    if self.depth == 1 && self.object && self.field.is_none() {
                        self.reading_key = true;
                        self.key.clear();
                    }
                }
                b':' if self.depth == 1 && self.object => self.field = Some(std::mem::take(&mut self.key)),
                b',' if self.depth == 1 => self.field = None,
                b'{' | b'[' => {
                    if self.depth == 0 {
                        self.object = b == b'{';
                    }
                    self.depth += 1;
                }
                b'}' | b']' => self.depth = self.depth.saturating_sub(1),
                _ => {}
            }
        }
    }

    /// The field being read where the bytes ended, if any.
    pub fn field(&self) -> Option<&str> {
        self.field.as_deref().and_then(|f| std::str::from_utf8(f).ok())
    }

    /// The error for a body over the limit that ends here: instructions
    /// over their cap are a 400 naming them (OpenAI's status for a field too
    /// long), anything else the 413 for the body.
    pub fn error(&self) -> ApiError {
        match self.field() {
            Some("instructions") => ApiError::new(
                400,
                format!("instructions hold more than {MAX_INSTRUCTIONS_CHARS} characters; this server takes at most {MAX_INSTRUCTIONS_CHARS}"),
                Some("instructions"),
                None,
            ),
            _ => ApiError::body_too_large(),
        }
    }
}

/// Parses and validates a speech request's body.
pub fn parse_speech(body: &[u8], max_input_chars: usize) -> Result<SpeechRequest, ApiError> {
    // The server's body reader stops at the same limit; this holds the
    // function to it for any other caller (the fuzz target).
    let limit = body_limit(max_input_chars);
    if body.len() > limit {
        let mut scanner = OverflowScanner::default();
        scanner.feed(&body[..limit]);
        return Err(scanner.error());
    }
    let raw: RawRequest =
        serde_json::from_slice(body).map_err(|e| ApiError::new(400, format!("the request body is not valid JSON for this endpoint: {e}"), None, None))?;
    if raw.input.trim().is_empty() {
        return Err(ApiError::new(400, "input is empty", Some("input"), None));
    }
    let chars = raw.input.chars().count();
    if chars > max_input_chars {
        return Err(ApiError::new(413, format!("input holds {chars} characters; this server takes at most {max_input_chars}"), Some("input"), None));
    }
    let voice = voice_name(raw.voice)?;
    let instructions = raw.instructions.filter(|i| !i.is_empty());
    if let Some(n) = instructions.as_ref().map(|i| i.chars().count()).filter(|&n| n > MAX_INSTRUCTIONS_CHARS) {
        return Err(ApiError::new(
            400,
            format!("instructions hold {n} characters; this server takes at most {MAX_INSTRUCTIONS_CHARS}"),
            Some("instructions"),
            None,
        ));
    }
    let format = ResponseFormat::parse(raw.response_format.as_deref().unwrap_or("mp3")).map_err(|e| ApiError::new(400, e, Some("response_format"), None))?;
    let stream = StreamFormat::parse(raw.stream_format.as_deref().unwrap_or("audio")).map_err(|e| ApiError::new(400, e, Some("stream_format"), None))?;
    if let Some(speed) = raw.speed.filter(|s| !SPEED_RANGE.contains(s)) {
        return Err(ApiError::new(400, format!("speed must be in 0.25..=4.0, got {speed}"), Some("speed"), None));
    }
    let language = raw.language.filter(|l| !l.is_empty());
    Ok(SpeechRequest { model: raw.model, input: raw.input, voice, instructions, speed: raw.speed, format, stream, language })
}

/// The token of an `Authorization` header's `Bearer` credentials. The scheme
/// is matched case-insensitively (RFC 7235 §2.1), one or more spaces follow it.
pub fn bearer_token(authorization: &[u8]) -> Option<&[u8]> {
    let space = authorization.iter().position(|&b| b == b' ')?;
    let (scheme, rest) = authorization.split_at(space);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let start = rest.iter().position(|&b| b != b' ')?;
    Some(&rest[start..])
}

/// The server's API key, kept as its SHA-256 digest: every comparison is of
/// two 32-byte digests, whatever the lengths of the key and the guess, so
/// neither its content nor its length shows in the time a refusal takes.
#[derive(Clone)]
pub struct ApiKey {
    digest: [u8; 32],
}

impl ApiKey {
    /// An empty key is refused: `--api-key "$KEY"` with KEY unset would
    /// otherwise serve with no authentication at all.
    pub fn new(key: &str) -> Result<ApiKey, String> {
        if key.is_empty() {
            return Err("the API key is empty".into());
        }
        Ok(ApiKey { digest: Sha256::digest(key.as_bytes()).into() })
    }

    fn matches(&self, given: &[u8]) -> bool {
        let digest: [u8; 32] = Sha256::digest(given).into();
        // No early exit: every byte is compared.
        let difference = digest.iter().zip(&self.digest).fold(0u8, |acc, (a, b)| std::hint::black_box(acc | (a ^ b)));
        difference == 0
    }

    /// Checks an `Authorization` header value (None: absent).
    pub fn check(&self, authorization: Option<&[u8]>) -> Result<(), ApiError> {
        let Some(value) = authorization else {
            return Err(ApiError::new(401, "no API key given: send `Authorization: Bearer KEY`", None, Some("invalid_api_key")));
        };
        match bearer_token(value) {
            None => Err(ApiError::new(401, "the Authorization header is not `Bearer KEY`", None, Some("invalid_api_key"))),
            Some(token) if self.matches(token) => Ok(()),
            Some(_) => Err(ApiError::new(401, "incorrect API key", None, Some("invalid_api_key"))),
        }
    }
}

/// Whether a synthesis error is about the request's text (400, `param`
/// `input`): blank text, or text with nothing the model can speak. The model
/// families report these in these words; anything else is the server's (500).
pub fn is_text_error(message: &str) -> bool {
    ["text is empty", "unsupported characters for this model", "nothing speakable remains", "nothing to speak"].iter().any(|m| message.contains(m))
}

/// `--max-connections` when the command line does not set it.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// Open files kept beyond one per connection: the listener, stdio, model and
/// plugin files, the runtime's own.
pub const FD_RESERVE: u64 = 256;

/// How many connections to serve under the hard open-file limit `hard`
/// (None: unlimited), with `requested` the `--max-connections` the user set
/// (None: the default). The default shrinks to what the limit leaves, with a
/// warning naming both numbers (many hosts have a hard limit of 4096, which
/// the default plus the reserve exceeds); a number the user chose that does
/// not fit is an error, since serving fewer would silently break it.
pub fn connection_cap(requested: Option<usize>, hard: Option<u64>) -> Result<(usize, Option<String>), String> {
    let want = requested.unwrap_or(DEFAULT_MAX_CONNECTIONS);
    let needed = (want as u64).saturating_add(FD_RESERVE);
    let Some(hard) = hard.filter(|&h| h < needed) else {
        return Ok((want, None));
    };
    if requested.is_some() {
        return Err(format!(
            "--max-connections {want} needs {needed} open files, and the hard limit is {hard} (lower --max-connections or raise `ulimit -Hn`)"
        ));
    }
    match usize::try_from(hard - FD_RESERVE.min(hard)).unwrap_or(usize::MAX) {
        0 => Err(format!("the hard open-file limit is {hard}, and the server keeps {FD_RESERVE} open files for itself: none are left for connections (raise `ulimit -Hn`)")),
        cap => Ok((
            cap,
            Some(format!(
                "the hard open-file limit is {hard}: serving at most {cap} connections instead of the default {DEFAULT_MAX_CONNECTIONS} (raise `ulimit -Hn` or set --max-connections)"
            )),
        )),
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_default_connection_cap_shrinks_to_the_hard_limit_and_a_chosen_one_does_not() {
        // Unlimited, or room enough: as asked, no warning.
        assert_eq!(connection_cap(None, None), Ok((4096, None)));
        assert_eq!(connection_cap(None, Some(4352)), Ok((4096, None)));
        assert_eq!(connection_cap(Some(10_000), None), Ok((10_000, None)));
        assert_eq!(connection_cap(Some(3840), Some(4096)), Ok((3840, None)));
        // The default under a hard limit of 4096 (before: refused to start).
        let (cap, warning) = connection_cap(None, Some(4096)).unwrap();
        assert_eq!(cap, 3840);
        let warning = warning.unwrap();
        assert!(warning.contains("4096") && warning.contains("3840") && !warning.contains('\n'), "{warning}");
        assert_eq!(connection_cap(None, Some(257)).unwrap().0, 1);
        // A limit that leaves nothing, and a chosen number that does not fit: one line each.
        for (requested, hard, want) in [
            (None, 256, "none are left"),
            (None, 0, "none are left"),
            (Some(3841), 4096, "--max-connections 3841 needs 4097 open files, and the hard limit is 4096"),
        ] {
            let e = connection_cap(requested, Some(hard)).unwrap_err();
            assert!(e.contains(want) && !e.contains('\n'), "{e}");
        }
    }
    use super::*;

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        let key = ApiKey::new("s3cret").unwrap();
        for header in ["Bearer s3cret", "bearer s3cret", "BEARER s3cret", "bEaReR   s3cret"] {
            assert_eq!(key.check(Some(header.as_bytes())), Ok(()), "{header}");
        }
        for header in ["Bearer s3cre", "Bearer s3cret ", "Basic s3cret", "Bearers3cret", "Bearer", "s3cret", ""] {
            assert_eq!(key.check(Some(header.as_bytes())).unwrap_err().status, 401, "{header}");
        }
        assert_eq!(key.check(None).unwrap_err().code, Some("invalid_api_key"));
    }

    #[test]
    fn an_empty_key_is_refused() {
        assert_eq!(ApiKey::new("").err().as_deref(), Some("the API key is empty"));
    }

    #[test]
    fn requests_are_validated_without_a_model() {
        let ok = parse_speech(br#"{"model": "m", "input": "Hi.", "voice": "alloy", "speed": 1.5, "language": ""}"#, 10).unwrap();
        assert_eq!((ok.format, ok.stream, ok.speed, ok.language, ok.voice.as_str()), (ResponseFormat::Mp3, StreamFormat::Audio, Some(1.5), None, "alloy"));
        let status = |body: &str, max: usize| parse_speech(body.as_bytes(), max).unwrap_err();
        assert_eq!(status(r#"{"model": "m", "input": " ", "voice": "a"}"#, 10).param.as_deref(), Some("input"));
        assert_eq!(status(r#"{"model": "m", "input": "abcdefghijk", "voice": "a"}"#, 10).status, 413);
        assert_eq!(status(r#"{"model": "m", "input": "a", "voice": "a", "speed": 10}"#, 10).param.as_deref(), Some("speed"));
        assert_eq!(status(r#"{"model": "m", "input": "a", "voice": "a", "response_format": "ogg"}"#, 10).param.as_deref(), Some("response_format"));
        assert_eq!(
            status(r#"{"model": "m", "input": "a", "voice": "a", "stream_format": "ws"}"#, 10).message,
            "stream_format `ws` is not supported; supported: audio, sse"
        );
        assert_eq!(status(r#"{"model": "m""#, 10).status, 400);
        assert_eq!(parse_speech(&vec![b' '; body_limit(1) + 1], 1).unwrap_err().status, 413);
    }

    #[test]
    fn voice_is_required_as_a_name_or_an_object_with_an_id() {
        let parse = |voice: &str| parse_speech(format!(r#"{{"model": "m", "input": "a"{voice}}}"#).as_bytes(), 10);
        assert_eq!(parse(r#", "voice": {"id": "nova"}"#).unwrap().voice, "nova");
        assert_eq!(parse(r#", "voice": "F1""#).unwrap().voice, "F1");
        for (voice, message) in [
            ("", "voice is required: a voice name (`alloy`, a model's own voice) or {\"id\": NAME}"),
            (r#", "voice": null"#, "voice is required: a voice name (`alloy`, a model's own voice) or {\"id\": NAME}"),
            (r#", "voice": """#, "voice is empty"),
            (r#", "voice": {}"#, "the voice object has no `id`"),
            (r#", "voice": {"id": 3}"#, "the voice object's `id` must be a string"),
            (r#", "voice": 3"#, "voice must be a name or an object {\"id\": NAME}"),
        ] {
            let e = parse(voice).unwrap_err();
            assert_eq!((e.status, e.param.as_deref(), e.message.as_str()), (400, Some("voice"), message), "{voice}");
        }
        // Every OpenAI name has a default.
        assert_eq!(OPENAI_VOICE_DEFAULTS.map(|(name, _)| name), OPENAI_VOICES);
    }

    #[test]
    fn instructions_and_stream_format_are_taken_within_their_limits() {
        let body = |extra: &str| format!(r#"{{"model": "m", "input": "a", "voice": "a"{extra}}}"#);
        let ok = parse_speech(body(r#", "instructions": "Speak softly.", "stream_format": "sse""#).as_bytes(), 10).unwrap();
        assert_eq!((ok.instructions.as_deref(), ok.stream), (Some("Speak softly."), StreamFormat::Sse));
        assert_eq!(parse_speech(body(r#", "instructions": """#).as_bytes(), 10).unwrap().instructions, None);
        let at_cap = body(&format!(r#", "instructions": "{}""#, "é".repeat(MAX_INSTRUCTIONS_CHARS)));
        assert!(parse_speech(at_cap.as_bytes(), 10).is_ok(), "the cap fits the body limit");
        let over = body(&format!(r#", "instructions": "{}""#, "x".repeat(MAX_INSTRUCTIONS_CHARS + 1)));
        let e = parse_speech(over.as_bytes(), 10).unwrap_err();
        assert_eq!(
            (e.status, e.param.as_deref(), e.message.as_str()),
            (400, Some("instructions"), "instructions hold 4097 characters; this server takes at most 4096")
        );
    }

    #[test]
    fn a_body_over_the_limit_is_blamed_on_the_field_it_ends_in() {
        let field = |prefix: &str| {
            let mut scanner = OverflowScanner::default();
            // Fed in pieces, as the body arrives.
            for piece in prefix.as_bytes().chunks(3) {
                scanner.feed(piece);
            }
            scanner.field().map(str::to_string)
        };
        assert_eq!(field(r#"{"model": "m", "instructions": "speak \"softly\", {or: not"#).as_deref(), Some("instructions"));
        assert_eq!(field(r#"{"instructions": "x", "input": "aaaa"#).as_deref(), Some("input"));
        assert_eq!(field(r#"{"voice": {"id": "a", "instructions": "x"#).as_deref(), Some("voice"));
        assert_eq!(field(r#"{"input": "a", "#).as_deref(), None);
        assert_eq!(field(r#"{"input": "a", "instr"#).as_deref(), None);
        assert_eq!(field(r#"[1, 2, "instructions": "x"#).as_deref(), None);
        let long = format!(r#"{{"model": "m", "voice": "a", "input": "a", "instructions": "{}"}}"#, "x".repeat(body_limit(10)));
        let e = parse_speech(long.as_bytes(), 10).unwrap_err();
        assert_eq!((e.status, e.param.as_deref()), (400, Some("instructions")), "{e:?}");
        let long = format!(r#"{{"model": "m", "voice": "a", "input": "{}"}}"#, "a".repeat(body_limit(10)));
        assert_eq!(parse_speech(long.as_bytes(), 10).unwrap_err(), ApiError::body_too_large());
    }

    #[test]
    fn error_bodies_are_openais() {
        let e = ApiError::new(400, "bad", Some("input"), None);
        assert_eq!(e.body(), json!({"error": {"message": "bad", "type": "invalid_request_error", "param": "input", "code": null}}));
        assert_eq!(ApiError::new(503, "x", None, None).kind(), "server_error");
    }

    #[test]
    fn text_errors_are_the_requests_fault() {
        assert!(is_text_error("unsupported characters for this model: '☃' (U+2603) (set unsupported_chars = \"skip\" to leave them out)"));
        assert!(is_text_error("nothing to speak: the text is empty after normalisation"));
        assert!(!is_text_error("ggml: out of memory"));
    }
}
