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

#[cfg(test)]
mod tests {
    use super::clip;

    #[test]
    fn clip_keeps_80_bytes_and_cuts_on_a_character_boundary() {
        assert_eq!(clip("short"), "short");
        assert_eq!(clip(&"a".repeat(80)), "a".repeat(80));
        assert_eq!(clip(&"a".repeat(81)), format!("{}…", "a".repeat(80)));
        // "é" is two bytes: byte 80 falls inside the 41st, which is dropped whole.
        assert_eq!(clip(&"é".repeat(41)), format!("{}…", "é".repeat(40)));
        assert_eq!(clip(&format!("a{}", "é".repeat(41))), format!("a{}…", "é".repeat(39)));
    }
}
