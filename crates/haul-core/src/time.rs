//! Time values: `jiff::Timestamp` in code, epoch milliseconds in stores, and the
//! duration strings of config.md and scenarios.md (`"90s"`, `"30m"`, `"1d2h"`).

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

/// Parses `"90s"`, `"30m"`, `"2h"`, `"1d2h30m"`, `"500ms"`: one or more
/// number-unit pairs, units `d h m s ms`. Zero is allowed; an empty string,
/// a missing unit or an unknown unit is an error naming the input.
pub fn parse_duration(s: &str) -> Result<Duration, BadInput> {
    let bad = |why: &str| {
        BadInput::new(
            "bad_duration",
            format!("bad duration {:?}: {why} (use e.g. \"90s\", \"30m\", \"1d2h\")", clip(s)),
        )
    };
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(bad("empty"));
    }
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if digits == 0 {
            return Err(bad("expected a number"));
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad("number too large"))?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let unit_ms: u64 = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "" => return Err(bad("missing unit")),
            _ => return Err(bad("unknown unit")),
        };
        rest = &rest[unit_len..];
        total = n.checked_mul(unit_ms).and_then(|v| total.checked_add(v)).ok_or_else(|| bad("too large"))?;
    }
    Ok(Duration::from_millis(total))
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
        check("", None);
        check("30", None);
        check("m", None);
        check("3x", None);
        check("-1s", None);
        check("99999999999999999999d", None);
        check("999999999999999d", None);
    }

    #[test]
    fn format_round_trips() {
        for ms in [0u64, 1, 999, 1000, 90_000, 93_600_000, 1_800_500] {
            let d = Duration::from_millis(ms);
            assert_eq!(parse_duration(&format_duration(d)).unwrap(), d);
        }
    }
}
