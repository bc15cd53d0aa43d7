//! HTML escaping, for the pages haul renders (the operator console, the replay
//! report): everything they show may come from strangers (SMS bodies) or from a model
//! (rationales), so it is written as text, never as markup.

/// `s` as HTML text or a quoted attribute value: `& < > " '` escaped.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn markup_and_quotes_become_text() {
        let check = |input: &str, expected: &str| assert_eq!(super::escape(input), expected);
        check("plain ETA 8:10", "plain ETA 8:10");
        check("<script>x</script>", "&lt;script&gt;x&lt;/script&gt;");
        check("a & b", "a &amp; b");
        check(r#"" onerror='x'"#, "&quot; onerror=&#39;x&#39;");
        check("&amp;", "&amp;amp;");
    }
}
