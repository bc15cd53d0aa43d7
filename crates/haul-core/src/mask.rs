//! What haul shows of text it did not write (a channel service's answer, a model
//! endpoint's error, a caller's bad input): phone numbers to their last four digits,
//! credentials not at all, and no more than a glimpse of anything long.
//!
//! Services echo requests back in their errors, and haul quotes the start of an error
//! answer in the log, the failed outcome and the OpsAlert. The request carried the
//! driver's phone and a bearer token, so every such snippet goes through
//! [`mask_secrets`] first, and is clipped only after: a clip could cut a number short
//! of what the masking recognises and leave most of it readable.
//!
//! Error messages that quote a caller's input (an unknown field name, a value of the
//! wrong type, as the JSON parser words them) go through [`clip_quotes`], so a 60 KB
//! name costs its sender a 400 and the log a line, not 60 KB of each.

use crate::tools::mask_phone;

/// Fewest digits after `+` taken for a phone number (E.164 has 8 to 15 in practice;
/// a longer run is masked too, a shorter one is left, as times and offsets are).
const MIN_PHONE_DIGITS: usize = 8;

/// Authorization schemes whose credentials are masked, lower case.
const AUTH_SCHEMES: [&str; 2] = ["bearer", "basic"];

/// `text` with every E.164-looking number (`+` or its form encoding `%2B`, then at
/// least eight digits) as `***` and its last four digits, and every `Bearer x` or
/// `Basic x` credential as `Bearer ***`.
pub fn mask_secrets(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if let Some(n) = phone_len(rest) {
            out.push_str(&mask_phone(&rest[..n]));
            rest = &rest[n..];
        } else if let Some((scheme, n)) = credential_len(rest, out.chars().next_back()) {
            out.push_str(scheme);
            out.push_str(" ***");
            rest = &rest[n..];
        } else {
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// The length of the phone number `s` starts with, if it does.
fn phone_len(s: &str) -> Option<usize> {
    let prefix = if s.starts_with('+') {
        1
    } else if s.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("%2b")) {
        3
    } else {
        return None;
    };
    let digits = s[prefix..].bytes().take_while(u8::is_ascii_digit).count();
    (digits >= MIN_PHONE_DIGITS).then_some(prefix + digits)
}

/// The scheme as written and the length of `Scheme credential` that `s` starts with,
/// if it does (and the scheme is a word of its own, not the end of a longer one).
fn credential_len(s: &str, before: Option<char>) -> Option<(&str, usize)> {
    if before.is_some_and(|b| b.is_alphanumeric()) {
        return None;
    }
    let scheme = AUTH_SCHEMES.iter().find_map(|name| s.get(..name.len()).filter(|w| w.eq_ignore_ascii_case(name)))?;
    let after = &s[scheme.len()..];
    let spaces = after.bytes().take_while(|b| *b == b' ' || *b == b'\t').count();
    // token68 (RFC 7235): letters, digits and -._~+/ then any '='.
    let token = after[spaces..].bytes().take_while(|b| b.is_ascii_alphanumeric() || b"-._~+/=".contains(b)).count();
    (spaces > 0 && token > 0).then_some((scheme, scheme.len() + spaces + token))
}

/// Most characters of one piece of input an error message quotes.
pub const MAX_ECHO_CHARS: usize = 100;

/// Most characters of a whole message quoting input: a few clipped quotes and the words around them.
const MAX_MESSAGE_CHARS: usize = 4 * MAX_ECHO_CHARS;

/// `s` cut to `max_chars` characters, `…` marking the cut.
pub fn clip(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        None => s.to_owned(),
        Some((end, _)) => format!("{}…", &s[..end]),
    }
}

/// A message that quotes input between backticks or double quotes (as serde words
/// "unknown field `x`" and "invalid type: string \"x\""), with every quoted piece and
/// the whole clipped.
pub fn clip_quotes(message: &str) -> String {
    let mut out = String::new();
    let mut rest = message;
    loop {
        let piece = rest.find(['`', '"']).unwrap_or(rest.len());
        out.push_str(&clip(&rest[..piece], MAX_ECHO_CHARS));
        // The delimiter itself, kept so the quote still reads as one.
        let delimiter = rest[piece..].chars().next().map_or(0, char::len_utf8);
        out.push_str(&rest[piece..piece + delimiter]);
        rest = &rest[piece + delimiter..];
        if rest.is_empty() {
            break clip(&out, MAX_MESSAGE_CHARS);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{clip, clip_quotes, mask_secrets};

    #[test]
    fn quoted_input_is_clipped() {
        let long = "x".repeat(500);
        let clipped = format!("{}…", "x".repeat(100));
        assert_eq!(clip("short", 100), "short");
        assert_eq!(clip("ünï", 2), "ün…");
        assert_eq!(clip_quotes("unknown field `a`, expected `b`"), "unknown field `a`, expected `b`");
        assert_eq!(
            clip_quotes(&format!("unknown field `{long}`, expected one of `at`, `lat`")),
            format!("unknown field `{clipped}`, expected one of `at`, `lat`")
        );
        assert_eq!(
            clip_quotes(&format!("invalid type: string \"{long}\", expected f64")),
            format!("invalid type: string \"{clipped}\", expected f64")
        );
        assert_eq!(clip_quotes(&"`a` ".repeat(1000)).chars().count(), 401, "the whole is bounded too");
    }

    fn check(input: &str, expected: &str) {
        assert_eq!(mask_secrets(input), expected, "mask_secrets({input:?})");
    }

    #[test]
    fn phone_numbers_keep_their_last_four_digits() {
        check("to +15555550100.", "to ***0100.");
        check("{\"to\":\"+15555550100\",\"from\":\"+447700900123\"}", "{\"to\":\"***0100\",\"from\":\"***0123\"}");
        check("To=%2B15555550100&Body=hi", "To=***0100&Body=hi");
        check("+12345678", "***5678");
        check("+1234567890123456789", "***6789");
        check("+1234567 is short", "+1234567 is short");
        check("at 12:00+0100 and +1", "at 12:00+0100 and +1");
        check("15555550100 without a plus", "15555550100 without a plus");
    }

    #[test]
    fn credentials_are_dropped() {
        check("Authorization: Bearer abc.def-123", "Authorization: Bearer ***");
        check("{\"auth\":\"Bearer sk-0123456789\"}", "{\"auth\":\"Bearer ***\"}");
        check("bearer  a/b+c==, then", "bearer ***, then");
        check("BEARER\tx", "BEARER ***");
        check("Basic dXNlcjpwYXNz", "Basic ***");
        check("Bearer", "Bearer");
        check("Bearer realm=\"x\"", "Bearer ***\"x\"");
        check("forbearer token", "forbearer token");
        check("the bearer of news", "the bearer *** news");
    }

    #[test]
    fn other_text_is_unchanged() {
        check("", "");
        check("HTTP 503: try again later", "HTTP 503: try again later");
        check("ünïcødé 🚚 +", "ünïcødé 🚚 +");
    }
}
