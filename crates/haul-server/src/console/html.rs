//! The console's HTML: every value from outside goes through [`esc`] (text and
//! attributes alike), every link built from values through [`seg`] and [`query`].
//! Markup is only ever the literal strings of `pages.rs`.

use std::fmt::Write;

use haul_core::time::Timestamp;

/// `s` as HTML text or a quoted attribute value: `& < > " '` escaped.
pub use haul_core::html::escape as esc;

/// `s` as one path segment: everything but `[A-Za-z0-9_.~-]` percent-encoded.
pub fn seg(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"_.~-".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// `?a=1&b=2` of the pairs (form-encoded), or nothing for none.
pub fn query(pairs: &[(&str, &str)]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    format!("?{}", serde_urlencoded::to_string(pairs).unwrap_or_default())
}

/// A time in UTC, which the console's script also shows in the viewer's zone.
pub fn time(t: Timestamp) -> String {
    let utc = t.strftime("%Y-%m-%d %H:%M:%S UTC").to_string();
    let iso = t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    format!("<time datetime=\"{iso}\">{utc}</time>")
}

/// A time and how long before the answer's `now` it was (`ago_s`, from the API's
/// `age_s`): `2026-03-02 07:00:00 UTC (3h 2m ago)`.
pub fn time_ago(t: Timestamp, ago_s: f64) -> String {
    format!("{} <span class=\"sub\">({} ago)</span>", time(t), age(ago_s))
}

/// An id shown whole, with a button that copies it.
pub fn id(s: &str) -> String {
    let s = esc(s);
    format!(
        "<code class=\"id\" title=\"{s}\">{s}</code> <button type=\"button\" class=\"copy\" data-copy=\"{s}\">Copy</button>"
    )
}

/// A duration in seconds, readable: `3h 2m`, `45s`.
pub fn age(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86400 => format!("{}h {}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {}h", s / 86400, (s % 86400) / 3600),
    }
}

/// The anchor of an outbox row on a load's page: its key in hex (ids hold characters
/// a fragment would need encoded).
pub fn anchor(key: &str) -> String {
    let mut out = String::from("row-");
    for b in key.bytes() {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// Keys whose string values are phone numbers: shown masked, as everywhere in haul.
pub fn is_phone_key(key: &str) -> bool {
    matches!(key, "driver_phone" | "from" | "to" | "phone")
}

/// A JSON value as readable text (one level), phone numbers masked. Escaped.
pub fn value_text(key: &str, v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) if is_phone_key(key) => esc(&haul_core::mask::mask_phone(s)),
        serde_json::Value::String(s) => esc(s),
        serde_json::Value::Null => "–".into(),
        serde_json::Value::Object(m) => {
            let parts: Vec<String> = m.iter().map(|(k, v)| format!("{}: {}", esc(k), value_text(k, v))).collect();
            parts.join(", ")
        }
        other => esc(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_from_outside_is_escaped_and_links_are_encoded() {
        assert_eq!(esc("<script>alert('x')</script>&\""), "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;");
        assert_eq!(seg("481207/ask:x y"), "481207%2Fask%3Ax%20y");
        assert_eq!(query(&[("a", "1 2"), ("b", "&")]), "?a=1+2&b=%26");
        assert_eq!(query(&[]), "");
        assert_eq!(anchor("a/b"), "row-612f62");
        let payload = serde_json::json!({"from": "+15555550100", "body": "<b>hi</b>"});
        assert_eq!(value_text("x", &payload), "body: &lt;b&gt;hi&lt;/b&gt;, from: ***0100");
        assert!(id("a\"b").contains("data-copy=\"a&quot;b\""));
        assert_eq!(
            (age(59.0), age(61.0), age(7200.0), age(90000.0)),
            ("59s".into(), "1m 1s".into(), "2h 0m".into(), "1d 1h".into())
        );
    }
}
