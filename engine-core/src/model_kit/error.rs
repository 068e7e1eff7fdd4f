//! The one error type of model plugins: a one-line message for the user.
//! ggml errors, I/O errors and formatted messages convert with `?`, so a
//! family's code needs no adapters; the plugin boundary turns it into the
//! ABI's string ([`super::guarded`]).

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(String);

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn msg(message: impl Into<String>) -> Self {
        Error(message.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

/// The message, for tests and callers that match on text.
impl std::ops::Deref for Error {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<&str> for Error {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for Error {
    fn eq(&self, other: &String) -> bool {
        self.0 == *other
    }
}

impl From<String> for Error {
    fn from(message: String) -> Self {
        Error(message)
    }
}

impl From<&str> for Error {
    fn from(message: &str) -> Self {
        Error(message.to_string())
    }
}

impl From<ggml_sys::Error> for Error {
    fn from(e: ggml_sys::Error) -> Self {
        Error(e.to_string())
    }
}

impl From<Error> for String {
    fn from(e: Error) -> Self {
        e.0
    }
}
