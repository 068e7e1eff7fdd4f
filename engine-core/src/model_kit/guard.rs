//! Panics stay inside a plugin. `abi_stable` aborts the process when a panic
//! reaches an `extern "C"` boundary, so every entry of a model plugin runs its
//! body through [`guarded`], which turns a panic into a one-line error.
//!
//! Each plugin library carries its own copy of the standard library and so its
//! own panic hook: the hook installed here records the message for the error
//! instead of printing a multi-line report to stderr.

use abi_stable::std_types::{RResult, RString};
use std::cell::RefCell;
use std::panic::AssertUnwindSafe;
use std::sync::Once;

thread_local! {
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

fn install_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let message = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
            let text = format!("{}{at}", message.replace('\n', " "));
            tracing::debug!(panic = %text, "plugin panicked");
            LAST_PANIC.with(|p| *p.borrow_mut() = Some(text));
        }));
    });
}

/// Runs a plugin entry's body: its error, or a panic turned into
/// `"<who>: internal error (a bug, please report it): <message> at <file:line>"`.
pub fn guarded<T>(who: &str, body: impl FnOnce() -> super::Result<T>) -> RResult<T, RString> {
    install_hook();
    match std::panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(v)) => RResult::ROk(v),
        Ok(Err(e)) => RResult::RErr(e.to_string().replace('\n', " ").into()),
        Err(_) => {
            let message = LAST_PANIC.with(|p| p.borrow_mut().take()).unwrap_or_else(|| "unknown panic".into());
            RResult::RErr(format!("{who}: internal error (a bug, please report it): {message}").into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_one_line_and_errors_pass_through() {
        let r: RResult<(), RString> = guarded("tone", || panic!("index out of bounds\nsecond line"));
        let e = r.unwrap_err().to_string();
        assert!(e.starts_with("tone: internal error (a bug, please report it): index out of bounds second line at "), "{e}");
        assert!(!e.contains('\n'));
        let r: RResult<u8, RString> = guarded("tone", || Err(super::super::Error::msg("bad\ninput")));
        assert_eq!(r.unwrap_err().as_str(), "bad input");
        assert_eq!(guarded("tone", || Ok(7u8)).unwrap(), 7);
    }
}
