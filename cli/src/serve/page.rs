//! `GET /`: a web page that speaks through the server's own API (model and
//! voice pickers, speed, format, playing while it streams, a download).
//! One static file compiled into the binary: nothing to build or serve
//! besides it, and it needs no key to load (it asks the API with the key
//! typed into it).

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

const PAGE: &str = include_str!("page.html");

/// The page itself loads nothing from elsewhere: scripts, styles and
/// connections are kept to this origin (the inline script and style are the
/// page's own); `blob:` is what the player and the download link play.
const CONTENT_SECURITY_POLICY: &str =
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; media-src 'self' blob:; img-src 'self'";

pub async fn page() -> Response {
    let mut response = ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE).into_response();
    response.headers_mut().insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    response.headers_mut().insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}
