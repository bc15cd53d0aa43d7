//! What haul shows of text it did not write (a channel service's answer, a model
//! endpoint's error, a caller's bad input): phone numbers to their last four digits,
//! credentials not at all, and no more than a glimpse of anything long.
//!
//! Services echo requests back in their errors, and haul quotes the start of an error
//! answer in the log, the failed outcome and the OpsAlert. The request carried the
//! driver's phone and a bearer token, so every such snippet goes through a [`Masker`]
//! (the literal values of the secrets this process was given, then [`mask_secrets`]'s
//! shapes) before it is stored, logged or forwarded, and is clipped only after: a clip
//! could cut a number short of what the masking recognises and leave most of it
//! readable.
//!
//! Error messages that quote a caller's input (an unknown field name, a value of the
//! wrong type, as the JSON parser words them) go through [`clip_quotes`], so a 60 KB
//! name costs its sender a 400 and the log a line, not 60 KB of each.

use std::sync::Arc;

/// The last four digits only: what the prompt and the logs show of a phone number.
pub fn mask_phone(p: &str) -> String {
    let tail: String = p.chars().rev().take(4).collect::<Vec<_>>().into_iter().rev().collect();
    format!("***{tail}")
}

/// Fewest digits after `+` taken for a phone number (E.164 has 8 to 15 in practice;
/// a longer run is masked too, a shorter one is left, as times and offsets are).
const MIN_PHONE_DIGITS: usize = 8;

/// Fewest digits of a run without `+` taken for a phone number: a national number
/// with its country code (`15555550100`) or without (`5555550100`). Shorter runs
/// (times, counts, HTTP statuses) are left.
const MIN_BARE_PHONE_DIGITS: usize = 10;

/// Authorization schemes whose credentials are masked, lower case.
const AUTH_SCHEMES: [&str; 2] = ["bearer", "basic"];

/// `text` with every phone number as `***` and its last four digits, and every
/// `Bearer x` or `Basic x` credential as `Bearer ***`. A phone number is:
/// - `+` (or its form encoding `%2B`) and at least eight digits, in groups parted by
///   single spaces, `-`, `.` or an area code's parentheses (`+1 (555) 555-0100`);
/// - a run of ten or more digits standing alone (`15555550100`);
/// - a North American number written with separators (`(555) 555-0100`,
///   `1-555-555-0100`, `555.555.0100`).
pub fn mask_secrets(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        let before = out.chars().next_back();
        if let Some(n) = phone_len(rest, before) {
            out.push_str(&mask_phone(&digits(&rest[..n])));
            rest = &rest[n..];
        } else if let Some((scheme, n)) = credential_len(rest, before) {
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

fn digits(s: &str) -> String {
    s.chars().filter(char::is_ascii_digit).collect()
}

/// The length of the phone number `s` starts with, if it does (`before`: the character
/// before it, which must not be a letter or digit of the same word).
fn phone_len(s: &str, before: Option<char>) -> Option<usize> {
    let plus = if s.starts_with('+') {
        1
    } else if s.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("%2b")) {
        3
    } else {
        0
    };
    if plus > 0 {
        let (len, digits) = grouped_digits(&s[plus..]);
        return (digits >= MIN_PHONE_DIGITS).then_some(plus + len);
    }
    if before.is_some_and(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    let run = s.bytes().take_while(u8::is_ascii_digit).count();
    if run >= MIN_BARE_PHONE_DIGITS {
        return alone(s, run).then_some(run);
    }
    north_american_len(s).filter(|&n| alone(s, n))
}

/// Whether the `n` bytes `s` starts with end a word (no letter or digit follows).
fn alone(s: &str, n: usize) -> bool {
    !s[n..].chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
}

/// The length and digit count of digit groups parted by one separator each (a space,
/// `-`, `.`, or parentheses around a group), from the start of `s`.
fn grouped_digits(s: &str) -> (usize, usize) {
    let b = s.as_bytes();
    let (mut i, mut end, mut count) = (0, 0, 0);
    loop {
        // An optional separator before a group (none before the first but `(`).
        let mut j = i;
        if j > 0 && j < b.len() && matches!(b[j], b' ' | b'-' | b'.') {
            j += 1;
        }
        let open = j < b.len() && b[j] == b'(';
        if open {
            j += 1;
        }
        let group = b[j..].iter().take_while(|c| c.is_ascii_digit()).count();
        if group == 0 {
            return (end, count);
        }
        j += group;
        if open {
            if j >= b.len() || b[j] != b')' {
                return (end, count);
            }
            j += 1;
        }
        count += group;
        end = j;
        i = j;
    }
}

/// The length of a North American number with separators that `s` starts with:
/// `[1 sep] (ddd) ddd-dddd` or `[1 sep] ddd sep ddd sep dddd`, sep one of ` -.`.
fn north_american_len(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let sep = |i: usize| i < b.len() && matches!(b[i], b' ' | b'-' | b'.');
    let digits_at = |i: usize, n: usize| b.len() >= i + n && b[i..i + n].iter().all(u8::is_ascii_digit);
    let mut i = 0;
    if b.first() == Some(&b'1') && sep(1) {
        i = 2;
    }
    if b.get(i) == Some(&b'(') && digits_at(i + 1, 3) && b.get(i + 4) == Some(&b')') {
        i += 5;
        if b.get(i) == Some(&b' ') || sep(i) {
            i += 1;
        }
    } else if digits_at(i, 3) && sep(i + 3) {
        i += 4;
    } else {
        return None;
    }
    if !(digits_at(i, 3) && sep(i + 3) && digits_at(i + 4, 4)) {
        return None;
    }
    let end = i + 8;
    // Not the start of a longer run of digits.
    (!b.get(end).is_some_and(u8::is_ascii_digit)).then_some(end)
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

/// Fewest characters of a configured secret masked by its value: a shorter one would
/// mask ordinary words (the tokens haul takes are longer; a channel's may be anything).
pub const MIN_SECRET_CHARS: usize = 6;

/// The literal values of the secrets a process was configured with (channel tokens,
/// the model's key, the Twilio auth token, the API and operator tokens), each masked
/// as `***` wherever it stands, as written and percent-encoded, before
/// [`mask_secrets`]'s shapes: a service that echoes `tok=…` with no `Bearer` before it
/// shows `tok=***`. Cheap to clone; its `Debug` names how many secrets it holds, never
/// one of them.
#[derive(Clone, Default)]
pub struct Masker {
    /// Every form to mask, longest first (a secret inside another is masked after it).
    forms: Arc<[String]>,
}

impl std::fmt::Debug for Masker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Masker({} forms)", self.forms.len())
    }
}

impl Masker {
    /// A masker of `secrets` (those shorter than [`MIN_SECRET_CHARS`] are left out).
    pub fn new<S: AsRef<str>>(secrets: impl IntoIterator<Item = S>) -> Self {
        Masker::default().with(secrets)
    }

    /// This masker with `more` secrets too.
    pub fn with<S: AsRef<str>>(&self, more: impl IntoIterator<Item = S>) -> Self {
        let mut forms: Vec<String> = self.forms.to_vec();
        for secret in more {
            let secret = secret.as_ref();
            if secret.chars().count() < MIN_SECRET_CHARS {
                continue;
            }
            forms.push(secret.to_owned());
            forms.push(percent_encoded(secret));
        }
        forms.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        forms.dedup();
        Masker { forms: forms.into() }
    }

    /// `text` with every configured secret as `***`, then [`mask_secrets`].
    pub fn mask(&self, text: &str) -> String {
        let mut text = std::borrow::Cow::Borrowed(text);
        for form in self.forms.iter() {
            if text.contains(form.as_str()) {
                text = std::borrow::Cow::Owned(text.replace(form.as_str(), "***"));
            }
        }
        mask_secrets(&text)
    }
}

/// `s` as a form or a query string carries it: every byte but the unreserved ones
/// (RFC 3986) as `%XX`.
fn percent_encoded(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
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
        // Without a plus: ten or more digits alone, or a North American number with separators.
        check("15555550100 without a plus", "***0100 without a plus");
        check("to=5555550100&x", "to=***0100&x");
        check("tel:15555550100.", "tel:***0100.");
        check("(555) 555-0100, 555-555-0100, 555.555.0100", "***0100, ***0100, ***0100");
        check("1-555-555-0100 and 1 555 555 0100", "***0100 and ***0100");
        // With a plus, in groups.
        check("+1 555-555-0100", "***0100");
        check("call +1 (555) 555-0100 now", "call ***0100 now");
        check("+44 7700 900123.", "***0123.");
        check("%2B1 555 555 0100", "***0100");
        // Not phone numbers: ids with digits inside, dates, times, short runs, prices.
        check("SM12345678901234567890ab", "SM12345678901234567890ab");
        check("id 123456789 and 555-0100", "id 123456789 and 555-0100");
        check("2026-12-05 07:00:00 UTC", "2026-12-05 07:00:00 UTC");
        check("HTTP 503, 1.555.555", "HTTP 503, 1.555.555");
        check("555-555-01000", "555-555-01000");
        check("+1 555-555", "+1 555-555");
        // A number runs into a word: not a number of its own.
        check("5555550100x and 555-555-0100x", "5555550100x and 555-555-0100x");
        // A separator parts groups, never opens a number; an area code's parentheses close.
        check("+ 5555550100", "+ ***0100");
        check("+12345678 (555", "***5678 (555");
        check("+1 (555 555 0100", "+1 (***0100");
        check("2 555 555 0100", "2 ***0100");
        check("5555) 555-0100 and (55a) 555-0100", "5555) 555-0100 and (55a) 555-0100");
        check("(555)-555-0100 and (555)555-0100", "***0100 and ***0100");
        check("555-555-01x0", "555-555-01x0");
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
        // A scheme needs a space, then a credential.
        check("Bearerabc", "Bearerabc");
        check("Bearer !", "Bearer !");
    }

    #[test]
    fn other_text_is_unchanged() {
        check("", "");
        check("HTTP 503: try again later", "HTTP 503: try again later");
        check("ünïcødé 🚚 +", "ünïcødé 🚚 +");
    }
}

#[cfg(test)]
mod masker_tests {
    use super::Masker;

    #[test]
    fn configured_secrets_are_masked_by_their_value_whatever_stands_around_them() {
        let m = Masker::new(["chan-sms-secret-1", "sk-live/Key+1=", "short"]);
        let check = |input: &str, expected: &str| assert_eq!(m.mask(input), expected, "{input:?}");
        check("400: tok=chan-sms-secret-1 is not valid", "400: tok=*** is not valid");
        check("{\"key\":\"sk-live/Key+1=\"}", "{\"key\":\"***\"}");
        check("key=sk-live%2FKey%2B1%3D&to=%2B15555550100", "key=***&to=***0100");
        check("chan-sms-secret-1chan-sms-secret-1", "******");
        // Too short to mask by value: an ordinary word would go with it.
        check("a short answer", "a short answer");
        assert_eq!(format!("{m:?}"), "Masker(3 forms)", "Debug never shows a secret");
        assert_eq!(Masker::default().mask("+15555550100"), "***0100");
        // Six characters are enough to mask by value; five are not.
        assert_eq!(Masker::new(["abcdef", "abcde"]).mask("abcdef abcde"), "*** abcde");
        let more = m.with(["op-token-0123456789"]);
        assert_eq!(more.mask("op-token-0123456789 chan-sms-secret-1"), "*** ***");
    }
}
