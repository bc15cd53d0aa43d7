//! Time values: `jiff::Timestamp` in code, epoch milliseconds in stores, and the
//! duration strings of settings and scenario files (`"90s"`, `"30m"`, `"1h 30m"`, `"1d2h"`).

use std::time::Duration;

use crate::error::{BadInput, clip};

pub use jiff::Timestamp;

/// Milliseconds since the epoch: the storage form of every timestamp.
pub fn to_ms(t: Timestamp) -> i64 {
    t.as_millisecond()
}

/// The inverse of [`to_ms`]; out-of-range values (a corrupt row) clamp to the range
/// jiff supports rather than panic.
pub fn from_ms(ms: i64) -> Timestamp {
    Timestamp::from_millisecond(ms).unwrap_or(if ms < 0 { Timestamp::MIN } else { Timestamp::MAX })
}

/// Microseconds since the epoch: a send rate's state (`crate::limit`), finer than a
/// millisecond because a fast rate's interval is (50/s is 20 ms, 3/s 333.333 ms).
pub fn to_us(t: Timestamp) -> i64 {
    t.as_microsecond()
}

/// The inverse of [`to_us`], clamped as [`from_ms`] is.
pub fn from_us(us: i64) -> Timestamp {
    Timestamp::from_microsecond(us).unwrap_or(if us < 0 { Timestamp::MIN } else { Timestamp::MAX })
}

/// `t + d`, saturating at the end of time instead of panicking.
pub fn add(t: Timestamp, d: Duration) -> Timestamp {
    let d = jiff::SignedDuration::try_from(d).unwrap_or(jiff::SignedDuration::MAX);
    t.checked_add(d).unwrap_or(Timestamp::MAX)
}

/// `a - b` as a non-negative duration (zero when `b` is later).
pub fn since(a: Timestamp, b: Timestamp) -> Duration {
    let ms = a.as_millisecond().saturating_sub(b.as_millisecond());
    Duration::from_millis(ms.max(0) as u64)
}

/// Truncates to whole milliseconds, the precision every store keeps, so a value read
/// back equals the value written.
pub fn trunc_ms(t: Timestamp) -> Timestamp {
    from_ms(t.as_millisecond())
}

/// Parses a duration as people write them, with jiff's "friendly" format and ISO 8601:
/// `"90s"`, `"30m"`, `"10min"`, `"1h 30m"`, `"1.5h"`, `"1d2h"`, `"7 days"`, `"500ms"`,
/// `"PT1H30M"`. A day is 24 hours and a week 7 days; years and months (no fixed length)
/// and negative durations are refused. Zero is allowed; an empty string or a number
/// without a unit is an error naming the input.
pub fn parse_duration(s: &str) -> Result<Duration, BadInput> {
    let bad = |why: &str| {
        BadInput::new(
            "bad_duration",
            format!("bad duration {:?}: {why} (use e.g. \"90s\", \"30m\", \"1h 30m\", \"7d\")", clip(s)),
        )
    };
    let text = s.trim();
    if text.is_empty() {
        return Err(bad("empty"));
    }
    if text.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(bad("missing unit"));
    }
    let span: jiff::Span = text.parse().map_err(|e: jiff::Error| {
        let why = e.to_string();
        let why = why.strip_prefix("failed to parse input in the \"friendly\" duration format: ").unwrap_or(&why);
        bad(why)
    })?;
    if span.is_negative() {
        return Err(bad("negative"));
    }
    if span.get_years() != 0 || span.get_months() != 0 {
        return Err(bad("years and months have no fixed length (use days)"));
    }
    let d = span.to_duration(jiff::SpanRelativeTo::days_are_24_hours()).map_err(|_| bad("too large"))?;
    Duration::try_from(d).map_err(|_| bad("too large"))
}

/// The shortest form [`parse_duration`] reads back: `1d2h`, `30m`, `1500ms`.
pub fn format_duration(d: Duration) -> String {
    let mut ms = d.as_millis() as u64;
    if ms == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (unit, size) in [("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1)] {
        if ms >= size {
            out.push_str(&format!("{}{unit}", ms / size));
            ms %= size;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, expected: Option<u64>) {
        assert_eq!(parse_duration(input).ok().map(|d| d.as_millis() as u64), expected, "{input}");
    }

    #[test]
    fn durations() {
        check("90s", Some(90_000));
        check("30m", Some(1_800_000));
        check("2h", Some(7_200_000));
        check("1d2h", Some(93_600_000));
        check("500ms", Some(500));
        check("1m30s", Some(90_000));
        check("0s", Some(0));
        check("1h 30m", Some(5_400_000));
        check("10min", Some(600_000));
        check("1.5h", Some(5_400_000));
        check("7 days", Some(604_800_000));
        check("1w", Some(604_800_000));
        check("2 hours 5 minutes", Some(7_500_000));
        check("PT1H30M", Some(5_400_000));
        check("P1D", Some(86_400_000));
        check("  5m ", Some(300_000));
        check("", None);
        check("30", None);
        check("m", None);
        check("3x", None);
        check("-1s", None);
        check("5m ago", None);
        check("1y", None);
        check("2mo", None);
        check("99999999999999999999d", None);
        check("999999999999999d", None);
    }

    #[test]
    fn errors_name_the_input_and_why() {
        let e = parse_duration("90").unwrap_err();
        assert_eq!(e.code, "bad_duration");
        assert!(e.message.starts_with("bad duration \"90\": missing unit"), "{}", e.message);
        let e = parse_duration("soon").unwrap_err();
        assert!(e.message.contains("\"soon\""), "{}", e.message);
        assert!(!e.message.contains("friendly"), "{}", e.message);
        for input in ["1y", "2mo", "1y 2mo"] {
            let e = parse_duration(input).unwrap_err();
            assert!(e.message.contains("years and months have no fixed length"), "{input}: {}", e.message);
        }
    }

    #[test]
    fn stored_times_clamp_and_truncate() {
        assert_eq!(from_ms(i64::MIN), Timestamp::MIN);
        assert_eq!(from_ms(i64::MAX), Timestamp::MAX);
        assert_eq!(from_ms(-1), "1969-12-31T23:59:59.999Z".parse::<Timestamp>().unwrap());
        let t: Timestamp = "2026-03-02T07:00:00.123456789Z".parse().unwrap();
        assert_eq!(trunc_ms(t), "2026-03-02T07:00:00.123Z".parse::<Timestamp>().unwrap());
    }

    #[test]
    fn format_round_trips() {
        for ms in [0u64, 1, 999, 1000, 90_000, 93_600_000, 1_800_500] {
            let d = Duration::from_millis(ms);
            assert_eq!(parse_duration(&format_duration(d)).unwrap(), d);
        }
    }
}
