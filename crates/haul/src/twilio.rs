//! Twilio request signatures (`X-Twilio-Signature`).
//!
//! HMAC-SHA1 keyed with the auth token over the full URL Twilio called (the configured
//! public URL, never the `Host` header seen behind a proxy), followed by every POST
//! parameter sorted by name, each name then value. Twilio may sign the URL with or
//! without the scheme's default port, so both forms are tried, as Twilio's own
//! validators do. Compared in constant time.

use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha1::Sha1;
use subtle::ConstantTimeEq;

/// The signature Twilio sends for `url` and the form `params`.
pub fn signature(auth_token: &str, url: &str, params: &[(String, String)]) -> String {
    let mut sorted: Vec<&(String, String)> = params.iter().collect();
    sorted.sort();
    sorted.dedup();
    let mut mac = Hmac::<Sha1>::new_from_slice(auth_token.as_bytes()).expect("HMAC takes any key length");
    mac.update(url.as_bytes());
    for (k, v) in sorted {
        mac.update(k.as_bytes());
        mac.update(v.as_bytes());
    }
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

/// `url` with its default port removed, and with it added.
fn port_variants(url: &str) -> Vec<String> {
    let mut out = vec![url.to_owned()];
    let Some((scheme, rest)) = url.split_once("://") else { return out };
    let default = match scheme {
        "https" => "443",
        "http" => "80",
        _ => return out,
    };
    let (authority, path) = rest.find(['/', '?']).map_or((rest, ""), |i| (&rest[..i], &rest[i..]));
    let (userinfo, hostport) = authority.rsplit_once('@').map_or(("", authority), |(u, h)| (u, h));
    let at = if userinfo.is_empty() { String::new() } else { format!("{userinfo}@") };
    match hostport.rsplit_once(':').filter(|(_, p)| p.chars().all(|c| c.is_ascii_digit()) && !p.is_empty()) {
        Some((host, _)) => out.push(format!("{scheme}://{at}{host}{path}")),
        None => out.push(format!("{scheme}://{at}{hostport}:{default}{path}")),
    }
    out
}

/// True when `given` is the signature of the request, for the URL as configured or
/// with/without its default port.
pub fn validate(auth_token: &str, url: &str, params: &[(String, String)], given: &str) -> bool {
    port_variants(url).iter().any(|u| bool::from(signature(auth_token, u, params).as_bytes().ct_eq(given.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    // The vectors twilio-python publishes (tests/unit/test_request_validator.py).
    const URI: &str = "https://mycompany.com/myapp.php?foo=1&bar=2";

    fn params() -> Vec<(String, String)> {
        [
            ("CallSid", "CA1234567890ABCDE"),
            ("Digits", "1234"),
            ("From", "+14158675309"),
            ("To", "+18005551212"),
            ("Caller", "+14158675309"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    #[test]
    fn computes_twilios_signature() {
        assert_eq!(signature("12345", URI, &params()), "RSOYDt4T1cUTdK1PDd93/VVr8B8=");
    }

    #[test]
    fn repeated_parameters_sort_by_value() {
        let p: Vec<(String, String)> =
            [("Sid", "CA123"), ("SidAccount", "AC123"), ("Digits", "5678"), ("Digits", "1234")]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        assert_eq!(signature("12345", URI, &p), "IK+Dwps556ElfBT0I3Rgjkr1wJU=");
    }

    #[test]
    fn validates_with_and_without_default_ports() {
        let p = params();
        assert!(validate("12345", URI, &p, "RSOYDt4T1cUTdK1PDd93/VVr8B8="));
        assert!(validate("12345", &URI.replace(".com", ".com:1234"), &p, "RSOYDt4T1cUTdK1PDd93/VVr8B8="));
        let http_1234 = URI.replace(".com", ".com:1234").replace("https", "http");
        assert!(validate("12345", &http_1234, &p, "Zmvh+3yNM1Phv2jhDCwEM3q5ebU="));
        assert!(validate("12345", URI, &p, "kvajT1Ptam85bY51eRf/AJRuM3w="));
        assert!(validate("12345", &URI.replace("https", "http"), &p, "0ZXoZLH/DfblKGATFgpif+LLRf4="));
    }

    #[test]
    fn rejects_wrong_signatures_tokens_and_params() {
        let p = params();
        assert!(!validate("12345", URI, &p, "RSOYDt4T1cUTdK1PDd93/VVr8B8"));
        assert!(!validate("12345", URI, &p, ""));
        assert!(!validate("54321", URI, &p, "RSOYDt4T1cUTdK1PDd93/VVr8B8="));
        let mut tampered = p.clone();
        tampered[1].1 = "9999".into();
        assert!(!validate("12345", URI, &tampered, "RSOYDt4T1cUTdK1PDd93/VVr8B8="));
        assert!(!validate("12345", "https://evil.example/myapp.php?foo=1&bar=2", &p, "RSOYDt4T1cUTdK1PDd93/VVr8B8="));
    }
}
