//! `BadInput`: the one error of input that is not of its contract's form.
//!
//! Its own module, at the bottom of the crate, because every layer refuses input with
//! it: ids, durations, events. Kept in `event.rs` it made ids, time and events import
//! each other.

/// Input that is not of its contract's form. `code` is stable (it goes on the wire as
/// `error.code`); `message` says what was wrong for a person.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct BadInput {
    pub code: &'static str,
    pub message: String,
}

impl BadInput {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        BadInput { code, message: message.into() }
    }
}

/// Shortens untrusted text for error messages, so a huge bad id cannot flood a log.
pub(crate) fn clip(s: &str) -> String {
    const MAX: usize = 80;
    if s.len() <= MAX {
        return s.to_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
