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

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use haul_core::InboundEvent;
use haul_core::ids::EventId;
use haul_core::tools::mask_phone;
use haul_store::UnmatchedSms;
use serde::Deserialize;
use serde_json::json;
use tracing::{error, info, warn};

use crate::api::{ApiBody, ApiCaller, ApiQuery, ApiState, accept, error};

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

// ---------------------------------------------------------------------------------
// The webhook.

const TWIML_EMPTY: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Response></Response>";

pub(crate) async fn twilio_sms(State(s): State<Arc<ApiState>>, headers: HeaderMap, ApiBody(body): ApiBody) -> Response {
    let Ok(params) = serde_urlencoded::from_bytes::<Vec<(String, String)>>(&body) else {
        return error(StatusCode::BAD_REQUEST, "bad_form", "the body is not form-encoded UTF-8");
    };
    let Some(token) = &s.twilio_auth_token else {
        warn!("Twilio webhook called but HAUL_TWILIO_AUTH_TOKEN is not set: refused");
        return error(StatusCode::FORBIDDEN, "webhook_not_configured", "HAUL_TWILIO_AUTH_TOKEN is not set");
    };
    let url = format!("{}/v1/webhooks/twilio/sms", s.public_url.trim_end_matches('/'));
    let given = headers.get("x-twilio-signature").and_then(|v| v.to_str().ok()).unwrap_or("");
    if !validate(token, &url, &params, given) {
        metrics::counter!("haul_twilio_bad_signatures_total").increment(1);
        return error(StatusCode::FORBIDDEN, "bad_signature", "X-Twilio-Signature does not match");
    }
    let field = |name: &str| params.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let (Some(from), Some(to), Some(text), Some(sid)) =
        (field("From"), field("To"), field("Body"), field("MessageSid"))
    else {
        return error(StatusCode::BAD_REQUEST, "bad_form", "From, To, Body and MessageSid are required");
    };
    if sid.is_empty() || sid.len() > 64 || !sid.chars().all(|c| c.is_ascii_alphanumeric()) {
        return error(StatusCode::BAD_REQUEST, "bad_form", "MessageSid is not a Twilio message id");
    }
    if !s.allow_sms_from(&from) {
        warn!(from = %mask_phone(&from), "inbound SMS over the per-sender rate: 429");
        return error(StatusCode::TOO_MANY_REQUESTS, "rate_limited", "too many messages from this number");
    }
    let event_id = match EventId::parse_inbound(&format!("sms:{sid}")) {
        Ok(e) => e,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.code, e.message),
    };
    let loads = match s.store.loads_by_phone(&from).await {
        Ok(l) => l,
        Err(e) => {
            error!(error = %e, "looking up the sender's load failed");
            return error(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", "try again");
        }
    };
    if let [load] = loads.as_slice() {
        let v = json!({"event_id": event_id, "kind": "inbound_sms", "from": from, "body": text});
        let event = match InboundEvent::from_outside(load.clone(), v) {
            Ok(e) => e,
            Err(e) => return error(StatusCode::BAD_REQUEST, e.code, e.message),
        };
        let answer = accept(&s, &event, false).await;
        if !answer.status().is_success() {
            return answer;
        }
        info!(load_id = %load, from = %mask_phone(&from), %event_id, "inbound SMS matched");
    } else {
        let sms = UnmatchedSms { message_sid: sid, from: from.clone(), to, body: text, received_at: s.clock.now() };
        if let Err(e) = s.store.record_unmatched_sms(&sms).await {
            error!(error = %e, "keeping an unmatched SMS failed");
            return error(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", "try again");
        }
        metrics::counter!("haul_unmatched_sms_total").increment(1);
        info!(from = %mask_phone(&from), candidates = loads.len(), "inbound SMS matched no single active load: kept as unmatched");
    }
    ([(header::CONTENT_TYPE, "text/xml")], TWIML_EMPTY).into_response()
}

#[derive(Deserialize)]
pub(crate) struct Limit {
    limit: Option<usize>,
}

pub(crate) async fn unmatched(_: ApiCaller, State(s): State<Arc<ApiState>>, ApiQuery(q): ApiQuery<Limit>) -> Response {
    match s.store.unmatched_sms(q.limit.unwrap_or(100).min(1000)).await {
        Ok(list) => axum::Json(json!({"unmatched": list})).into_response(),
        Err(e) => {
            error!(error = %e, "listing unmatched SMS failed");
            error(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", "try again")
        }
    }
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
