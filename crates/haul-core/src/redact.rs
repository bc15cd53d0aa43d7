//! A store URL (PostgreSQL's above all) as logs and error lines may show it: where the
//! database is, never a credential.
//!
//! The driver reads a password from the URL's userinfo (`user:pass@`), from query
//! parameters (`password=`, `sslpassword=`, a `passfile` path, `options` carrying one)
//! and, in libpq's key=value form, from `password=…`. Every one of those is dropped
//! rather than masked: a masked value still says how long it was. What is unclear
//! (an unencoded `@` or `?` in a password, an unterminated quote) is dropped too:
//! printing less about an odd string is better than printing a secret.

/// `url` without its credentials.
pub fn redact_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => format!("{scheme}://{}", redact_after_scheme(rest)),
        None if url.contains('=') => redact_key_values(url),
        None => url.to_owned(),
    }
}

/// A parameter whose value is a credential, or may carry one.
fn is_secret(key: &str, value: &str) -> bool {
    let key = percent_decode(key).to_ascii_lowercase();
    ["pass", "secret", "token"].iter().any(|s| key.contains(s))
        || (key == "options" && percent_decode(value).to_ascii_lowercase().contains("pass"))
}

/// `[user[:password]@]host[:port][/db][?query][#fragment]`, as the driver splits it.
fn redact_after_scheme(rest: &str) -> String {
    // The userinfo ends at the last `@` before the query: a password may hold an
    // unencoded `@` or `?`, the query (`options`, `application_name`) an `@`.
    let (userinfo, hostpart) = match rest.find('@') {
        None => (None, rest),
        Some(first) => {
            let query = rest[first..].find(['?', '#']).map_or(rest.len(), |q| first + q);
            let at = rest[..query].rfind('@').unwrap_or(first);
            (Some(&rest[..at]), &rest[at + 1..])
        }
    };
    let mut out = String::new();
    if let Some(userinfo) = userinfo {
        let user = userinfo.split(':').next().unwrap_or("");
        // A "user" holding `/` or `?` means the `@` was not the userinfo's: say nothing of it.
        out.push_str(if user.contains(['/', '?', '#']) { "***" } else { user });
        out.push('@');
    }
    let hostpart = hostpart.split('#').next().unwrap_or("");
    let (base, query) = hostpart.split_once('?').unwrap_or((hostpart, ""));
    out.push_str(base);
    let kept: Vec<&str> = query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .filter(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            !is_secret(k, v)
        })
        .collect();
    if !kept.is_empty() {
        out.push('?');
        out.push_str(&kept.join("&"));
    }
    out
}

/// libpq's `key=value key='quoted value'` form, with the credential pairs left out.
fn redact_key_values(s: &str) -> String {
    let mut kept = Vec::new();
    let mut rest = s.trim_start();
    while !rest.is_empty() {
        match key_value(rest) {
            Some((pair, key, value, after)) => {
                if !is_secret(key, &value) {
                    kept.push(pair);
                }
                rest = after.trim_start();
            }
            None => {
                // Not of the form: the rest may hold anything.
                kept.push("…");
                break;
            }
        }
    }
    kept.join(" ")
}

/// One `key = value` at the start of `s`: (its text, the key, the unescaped value, the rest).
fn key_value(s: &str) -> Option<(&str, &str, String, &str)> {
    let key_end = s.find(|c: char| c == '=' || c.is_whitespace())?;
    let key = &s[..key_end];
    let after_key = s[key_end..].trim_start();
    let after_eq = after_key.strip_prefix('=')?.trim_start();
    let value_start = s.len() - after_eq.len();
    let mut value = String::new();
    let mut chars = after_eq.char_indices();
    let quoted = after_eq.starts_with('\'');
    if quoted {
        chars.next();
    }
    let mut end = None;
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => value.push(chars.next()?.1),
            '\'' if quoted => {
                end = Some(i + 1);
                break;
            }
            c if c.is_whitespace() && !quoted => {
                end = Some(i);
                break;
            }
            c => value.push(c),
        }
    }
    let end = value_start
        + match end {
            Some(e) => e,
            None if quoted => return None,
            None => after_eq.len(),
        };
    Some((&s[..end], key, value, &s[end..]))
}

/// `%XX` decoded (what the driver does to query keys and values); anything else as it is.
pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    fn check(input: &str, expected: &str) {
        assert_eq!(redact_url(input), expected, "redact_url({input:?})");
    }

    #[test]
    fn urls_keep_where_and_drop_every_credential() {
        check("postgres://u:secret@h:5432/db", "postgres://u@h:5432/db");
        check("postgresql://u:secret@h/db", "postgresql://u@h/db");
        check("postgres://u@h/db", "postgres://u@h/db");
        check("postgres://h/db", "postgres://h/db");
        check("postgres://u:p%40ss@h/db", "postgres://u@h/db");
        check("postgres://u:p@ss@h/db", "postgres://u@h/db");
        check("postgres://u:p?x@h/db?sslmode=require", "postgres://u@h/db?sslmode=require");
        check("postgres://u:p/x@h/db", "postgres://u@h/db");
        check("postgres://u:@h/db", "postgres://u@h/db");
        check("postgres://:secret@h/db", "postgres://@h/db");
        check("postgres://u@h/db?application_name=a@b", "postgres://u@h/db?application_name=a@b");
        check("postgres://h/db?password=secret", "postgres://h/db");
        check("postgres://h/db?password=secret&sslmode=disable", "postgres://h/db?sslmode=disable");
        check("postgres://h/db?sslmode=disable&PassWord=secret", "postgres://h/db?sslmode=disable");
        check("postgres://h/db?pass%77ord=secret", "postgres://h/db");
        check("postgres://h/db?password", "postgres://h/db");
        check("postgres://h/db?password=a&password=b", "postgres://h/db");
        check(
            "postgres://h/db?sslpassword=secret&passfile=/home/u/.pgpass&sslkey=/k.pem",
            "postgres://h/db?sslkey=/k.pem",
        );
        check("postgres://h/db?options=-csearch_path%3Dx", "postgres://h/db?options=-csearch_path%3Dx");
        check("postgres://h/db?options=-c%20password%3Dsecret", "postgres://h/db");
        check("postgres://h/db?options=--PASSWORD=secret&sslmode=require", "postgres://h/db?sslmode=require");
        check("postgres://h/db?auth_token=secret", "postgres://h/db");
        check("postgres://u:secret@h/db#secret", "postgres://u@h/db");
        check("postgres://u:secret@/db?host=/run/postgresql", "postgres://u@/db?host=/run/postgresql");
        check("postgres://u:secret@h1:5432,h2:5433/db", "postgres://u@h1:5432,h2:5433/db");
        // An `@` in the query with no userinfo: the driver itself would take what precedes it as credentials.
        check("postgres://h/db?options=a@b", "postgres://***@b");
        check("postgres://u:secret@h/db?password=secret&options=-c%20x%3Dy", "postgres://u@h/db?options=-c%20x%3Dy");
    }

    #[test]
    fn percent_decoding_takes_two_hex_digits() {
        for (input, expected) in
            [("%41", "A"), ("x%41y", "xAy"), ("%7a%7A", "zz"), ("%zz%4", "%zz%4"), ("100%", "100%")]
        {
            assert_eq!(super::percent_decode(input), expected, "{input}");
        }
    }

    #[test]
    fn a_quote_inside_an_unquoted_value_is_part_of_it() {
        check("host=h dbname=it's user=u", "host=h dbname=it's user=u");
        check(r"host=h password='it\'s' user=u", "host=h user=u");
    }

    #[test]
    fn key_value_strings_drop_the_credential_pairs() {
        check("host=h password=secret dbname=d", "host=h dbname=d");
        check("host=h password = secret dbname=d", "host=h dbname=d");
        check("host=h password='sec ret' dbname=d", "host=h dbname=d");
        check("password='a\\'b c' host=h", "host=h");
        check("host=h password=sec\\ ret port=5", "host=h port=5");
        check("host=h options='-c password=secret' user=u", "host=h user=u");
        check("host=h sslpassword=secret passfile=/p", "host=h");
        check("host=h application_name='my app'", "host=h application_name='my app'");
        // Not of the form from some point on: nothing after it is shown.
        check("host=h password='secret", "host=h …");
        check("host=h password", "host=h …");
    }

    #[test]
    fn other_strings_pass_through() {
        check("sqlite::memory:", "sqlite::memory:");
        check("sqlite://haul.db", "sqlite://haul.db");
        check("", "");
    }
}
