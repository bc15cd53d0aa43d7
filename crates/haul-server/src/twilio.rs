//! Twilio request signatures (`X-Twilio-Signature`).
//!
//! HMAC-SHA1 keyed with the auth token over the full URL Twilio called (the configured
//! public URL, never the `Host` header seen behind a proxy), followed by every POST
//! parameter sorted by name, each name then value. Twilio may sign the URL with or
//! without the scheme's default port, so both forms are tried, as Twilio's own
//! validators do. Compared in constant time.

use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha1::{Digest, Sha1};
use subtle::ConstantTimeEq;

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use haul_core::action::ActionType;
use haul_core::consent::ConsentChange;
use haul_core::event::{MAX_SMS_BODY_CHARS, MAX_SMS_FROM_CHARS, is_refused_control};
use haul_core::ids::{EventId, LoadId, is_message_sid};
use haul_core::mask::mask_phone;
use haul_core::receipt::DeliveryReport;
use haul_core::trace::TraceParent;
use haul_core::{EventBody, InboundEvent};
use haul_runtime::channels::twilio::STATUS_KEY_PARAM;
use haul_store::{SidClaim, SmsConsent, SmsReport, SmsRoute, UnmatchedSms};
use serde::Deserialize;
use serde_json::json;
use tracing::{debug, error, info, warn};

use crate::events::accept;
use crate::state::{ApiBody, ApiCaller, ApiQuery, ApiState, Trace, error};

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
//
// Past the signature, a request is never refused and never lost: it is checked once,
// then its MessageSid is taken (once across all loads), and only then does it go
// anywhere. One that validates goes to the one active load whose driver phone sent it;
// anything else is kept, cleaned and clipped, in the unmatched list with the reason.
// A replay (Twilio's signatures do not expire) goes where its sid went the first time,
// where the queue or the unmatched list already has it: 200, and nothing new.

const TWIML_EMPTY: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Response></Response>";

/// Longest `To` kept, in characters (a phone number or a short code, like `From`).
const MAX_TO_CHARS: usize = MAX_SMS_FROM_CHARS;

/// The reason an SMS that validates is kept as unmatched.
fn no_single_load(candidates: usize) -> String {
    match candidates {
        0 => "no single active load has this driver phone".into(),
        n => format!("no single active load has this driver phone ({n} do)"),
    }
}

/// An inbound SMS as the webhook keeps it: every field cleaned (control characters
/// replaced, NUL removed) and clipped to its bound, and either the event it is or the
/// reasons it is not one.
#[derive(Debug)]
struct Inbound {
    /// The MessageSid; without a usable one, `nosid:` and a SHA-1 of the request, so a
    /// replay of it still finds its first copy.
    key: String,
    from: String,
    to: String,
    body: String,
    checked: Result<(EventId, EventBody), String>,
}

impl Inbound {
    /// The webhook's one validation, before any routing: a MessageSid of Twilio's form,
    /// `From` and `Body` as an `inbound_sms` takes them (haul_core's bounds, no control
    /// characters but newline, tab and carriage return), `To` bounded like `From`.
    fn check(params: &[(String, String)]) -> Inbound {
        let field = |name: &str| params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        let mut problems = Vec::new();
        let from = clean("From", field("From"), MAX_SMS_FROM_CHARS, &mut problems);
        if field("From") == Some("") {
            problems.push("From is empty".into());
        }
        let to = clean("To", field("To"), MAX_TO_CHARS, &mut problems);
        let body = clean("Body", field("Body"), MAX_SMS_BODY_CHARS, &mut problems);
        let sid = field("MessageSid");
        let key = match sid {
            Some(sid) if is_message_sid(sid) => sid.to_owned(),
            _ => {
                problems.push(match sid {
                    None => "MessageSid is missing".into(),
                    Some(_) => "MessageSid is not a Twilio message id".into(),
                });
                request_key(params)
            }
        };
        let checked = if problems.is_empty() {
            // haul_core has the last word, so a routed SMS is always an event it takes.
            EventId::twilio_sms(&key)
                .and_then(|id| Ok((id, EventBody::from_payload("inbound_sms", json!({"from": from, "body": body}))?)))
                .map_err(|e| e.message)
        } else {
            Err(problems.join("; "))
        };
        Inbound { key, from, to, body, checked }
    }

    fn unmatched(&self, reason: String, received_at: haul_core::Timestamp) -> UnmatchedSms {
        UnmatchedSms {
            message_sid: self.key.clone(),
            from: self.from.clone(),
            to: self.to.clone(),
            body: self.body.clone(),
            received_at,
            reason,
        }
    }
}

/// `value` as kept: NUL removed, other refused control characters replaced (U+FFFD),
/// at most `max_chars`; what was wrong with it goes to `problems`.
fn clean(name: &str, value: Option<&str>, max_chars: usize, problems: &mut Vec<String>) -> String {
    let Some(value) = value else {
        problems.push(format!("{name} is missing"));
        return String::new();
    };
    if value.chars().any(is_refused_control) {
        problems.push(format!("{name} contains a control character"));
    }
    let chars = value.chars().count();
    if chars > max_chars {
        problems.push(format!("{name} is longer than {max_chars} characters ({chars})"));
    }
    value
        .chars()
        .filter(|&c| c != '\0')
        .map(|c| if is_refused_control(c) { char::REPLACEMENT_CHARACTER } else { c })
        .take(max_chars)
        .collect()
}

/// `nosid:` and the SHA-1 of the request's parameters in signature order: the key of a
/// request with no usable MessageSid (no MessageSid has a `:`).
fn request_key(params: &[(String, String)]) -> String {
    let mut sorted: Vec<&(String, String)> = params.iter().collect();
    sorted.sort();
    let mut hash = Sha1::new();
    for (k, v) in sorted {
        hash.update(k.as_bytes());
        hash.update([0]);
        hash.update(v.as_bytes());
        hash.update([0]);
    }
    let hex: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("nosid:{hex}")
}

fn store_unavailable(what: &str, e: &haul_store::StoreError) -> Response {
    error!(error = %e, "{what} failed");
    error(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", "try again")
}

/// A consent keyword's other doors: the driver's other active loads each get it (the
/// same event, so a retry is one per load), and the ledger keeps one that reached no
/// load at all.
async fn share_consent(
    s: &ApiState,
    consent: &ConsentChange,
    (event_id, body): (&EventId, &EventBody),
    loads: &[LoadId],
    trace: TraceParent,
) -> Result<(), Response> {
    if loads.is_empty() {
        let kept = SmsConsent {
            phone: consent.phone.clone(),
            opted_out: consent.opted_out,
            event_id: event_id.to_string(),
            load_id: None,
            changed_at: s.clock.now(),
        };
        s.store.record_consent(&kept).await.map_err(|e| store_unavailable("keeping the sender's consent", &e))?;
        info!(from = %mask_phone(&consent.phone), opted_out = consent.opted_out, "consent of a phone with no active load kept");
        return Ok(());
    }
    for load in loads.iter().skip(1) {
        let event = InboundEvent { load_id: load.clone(), event_id: event_id.clone(), body: body.clone() };
        let answer = accept(s, &event, false, trace).await;
        if answer.status().is_server_error() {
            return Err(answer);
        }
        info!(load_id = %load, from = %mask_phone(&consent.phone), opted_out = consent.opted_out, "consent shared with another load of the driver's");
    }
    Ok(())
}

pub(crate) async fn twilio_sms(
    State(s): State<Arc<ApiState>>,
    headers: HeaderMap,
    Trace(trace): Trace,
    ApiBody(body): ApiBody,
) -> Response {
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
    let sms = Inbound::check(&params);
    if !s.allow_sms_from(&sms.from) {
        warn!(from = %mask_phone(&sms.from), "inbound SMS over the per-sender rate: 429");
        return error(StatusCode::TOO_MANY_REQUESTS, "rate_limited", "too many messages from this number");
    }

    // Where it would go now. A STOP, or a START from a phone the consent ledger has
    // opted out, is the driver's on every load of theirs: it goes to each active one
    // (the first is its route), and one that reached none is kept in the ledger, which
    // the dispatcher sends no SMS against.
    let loads = match &sms.checked {
        Err(_) => vec![],
        Ok(_) => match s.store.loads_by_phone(&sms.from).await {
            Ok(loads) => loads,
            Err(e) => return store_unavailable("looking up the sender's load", &e),
        },
    };
    let consent = match sms.checked.as_ref().ok().and_then(|_| ConsentChange::of_sms(&sms.from, &sms.body)) {
        Some(c) if !c.opted_out => match s.store.opted_out_among(std::slice::from_ref(&c.phone)).await {
            Ok(kept) => (!kept.is_empty()).then_some(c),
            Err(e) => return store_unavailable("reading the sender's consent", &e),
        },
        other => other,
    };
    let (route, reason) = match (&sms.checked, loads.as_slice()) {
        (Err(problems), _) => (SmsRoute::Unmatched, problems.clone()),
        (Ok(_), [load]) => (SmsRoute::Load(load.clone()), String::new()),
        (Ok(_), [first, ..]) if consent.is_some() => (SmsRoute::Load(first.clone()), String::new()),
        (Ok(_), others) => (SmsRoute::Unmatched, no_single_load(others.len())),
    };
    // Where it goes: its sid's first route. Taken before delivering, so a failed
    // delivery is retried to the same place and a replay never reaches a new one.
    let (route, first_time) = match s.store.claim_message_sid(&sms.key, &route, s.clock.now()).await {
        Ok(SidClaim::New) => (route, true),
        Ok(SidClaim::Taken(first)) => {
            metrics::counter!("haul_twilio_replays_total").increment(1);
            info!(from = %mask_phone(&sms.from), "inbound SMS seen before: it goes where its MessageSid went");
            (first, false)
        }
        Err(e) => return store_unavailable("taking a MessageSid", &e),
    };
    if first_time && let (Some(consent), Ok((event_id, body))) = (&consent, &sms.checked) {
        // Only the first time: a replayed STOP must not opt out a load made since,
        // nor an old START undo a later STOP. A fan-out cut short is made good by the
        // ledger, which the route's append writes.
        if let Err(answer) = share_consent(&s, consent, (event_id, body), &loads, trace).await {
            return answer;
        }
    }
    match (route, &sms.checked) {
        (SmsRoute::Load(load), Ok((event_id, body))) => {
            let event = InboundEvent { load_id: load.clone(), event_id: event_id.clone(), body: body.clone() };
            let answer = accept(&s, &event, false, trace).await;
            if answer.status().is_server_error() {
                return answer;
            }
            if answer.status().is_client_error() {
                // An `sms:` id an API caller took before the prefix was reserved.
                warn!(load_id = %load, %event_id, status = %answer.status(), "inbound SMS not queued: its event id was taken");
            } else {
                info!(load_id = %load, from = %mask_phone(&sms.from), %event_id, "inbound SMS matched");
            }
        }
        (_, checked) => {
            let reason = match checked {
                Err(problems) => problems.clone(),
                // Kept as unmatched the first time, when no single load had its number;
                // one has it now.
                Ok(_) if reason.is_empty() => no_single_load(0),
                Ok(_) => reason,
            };
            match s.store.record_unmatched_sms(&sms.unmatched(reason, s.clock.now())).await {
                Ok(true) => {
                    metrics::counter!("haul_unmatched_sms_total").increment(1);
                    info!(from = %mask_phone(&sms.from), "inbound SMS not routed: kept as unmatched");
                }
                Ok(false) => {}
                Err(e) => return store_unavailable("keeping an unmatched SMS", &e),
            }
        }
    }
    ([(header::CONTENT_TYPE, "text/xml")], TWIML_EMPTY).into_response()
}

// ---------------------------------------------------------------------------------
// Delivery receipts.
//
// Twilio posts a message's status as it moves (queued, sent, delivered, undelivered,
// failed, …), to the StatusCallback the Twilio channel gave it: this route with the
// outbox row's key as its query, signed whole. A message that could not be delivered
// (a landline, an unreachable handset, a carrier's filter) becomes the row's failed
// `action_outcome`, so the SOP's SMS-failed rule asks a person at once instead of the
// next ask texting into the same void. Its event id is the dispatcher's own for a
// failed row (`action_outcome_event_id`): the several callbacks of one message, a
// replay, and a row the dispatcher buried itself make one failed outcome, not two.

/// A callback that names no row of haul's (an unknown key, another message's sid):
/// counted and logged, kept for a person when it says how the message ended
/// (`GET /v1/webhooks/twilio/unmatched`), answered 200 so Twilio does not retry it.
async fn unmatched_status(s: &ApiState, report: &DeliveryReport, why: &str) -> Response {
    metrics::counter!("haul_twilio_status_unmatched_total").increment(1);
    warn!(sid = %report.sid, status = %report.status, why, "Twilio status callback matches no SMS of haul's");
    if let Err(answer) = keep_report(s, report, None, Some(why)).await {
        return answer;
    }
    StatusCode::OK.into_response()
}

/// Keeps a report that says how a message ended: on its row (`row`), or for a person
/// with the reason it matched none. Twilio's repeats are kept once.
async fn keep_report(
    s: &ApiState,
    report: &DeliveryReport,
    row: Option<&haul_store::OutboxRow>,
    why: Option<&str>,
) -> Result<(), Response> {
    if !report.is_final() {
        return Ok(());
    }
    let kept = SmsReport {
        message_sid: report.sid.clone(),
        status: report.status.clone(),
        error_code: report.error_code.clone(),
        outbox_id: row.map(|r| r.id.clone()),
        load_id: row.map(|r| r.load_id.clone()),
        reason: why.map(str::to_owned),
        reported_at: s.clock.now(),
    };
    match s.store.record_sms_report(&kept).await {
        Ok(_) => Ok(()),
        Err(e) => Err(store_unavailable("keeping a delivery report", &e)),
    }
}

pub(crate) async fn twilio_status(
    State(s): State<Arc<ApiState>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    Trace(trace): Trace,
    ApiBody(body): ApiBody,
) -> Response {
    let Ok(params) = serde_urlencoded::from_bytes::<Vec<(String, String)>>(&body) else {
        return error(StatusCode::BAD_REQUEST, "bad_form", "the body is not form-encoded UTF-8");
    };
    let Some(token) = &s.twilio_auth_token else {
        warn!("Twilio status callback called but HAUL_TWILIO_AUTH_TOKEN is not set: refused");
        return error(StatusCode::FORBIDDEN, "webhook_not_configured", "HAUL_TWILIO_AUTH_TOKEN is not set");
    };
    // Twilio signs the URL it was given, query and all.
    let mut url = format!("{}/v1/webhooks/twilio/status", s.public_url.trim_end_matches('/'));
    if let Some(q) = &query {
        url = format!("{url}?{q}");
    }
    let given = headers.get("x-twilio-signature").and_then(|v| v.to_str().ok()).unwrap_or("");
    if !validate(token, &url, &params, given) {
        metrics::counter!("haul_twilio_bad_signatures_total").increment(1);
        return error(StatusCode::FORBIDDEN, "bad_signature", "X-Twilio-Signature does not match");
    }
    let report = match DeliveryReport::from_form(&params) {
        Ok(report) => report,
        Err(problem) => return error(StatusCode::BAD_REQUEST, "bad_status_callback", problem),
    };
    metrics::counter!("haul_twilio_status_callbacks_total", "status" => report.status.clone()).increment(1);
    let key = query
        .as_deref()
        .and_then(|q| serde_urlencoded::from_str::<Vec<(String, String)>>(q).ok())
        .and_then(|q| q.into_iter().find(|(k, _)| k == STATUS_KEY_PARAM).map(|(_, v)| v));
    let Some(key) = key else { return unmatched_status(&s, &report, "its URL names no outbox row").await };
    let row = match s.store.get(&key).await {
        Ok(Some(row)) => row,
        Ok(None) => return unmatched_status(&s, &report, "no outbox row has its key").await,
        Err(e) => return store_unavailable("reading the SMS a status callback reports on", &e),
    };
    if row.action_type != ActionType::SendSms {
        return unmatched_status(&s, &report, "its row is not an SMS").await;
    }
    // The receipt is kept once the send's answer is; until then the key alone vouches.
    if row.receipt.as_deref().is_some_and(|r| r != report.sid) {
        return unmatched_status(&s, &report, "its row's SMS is another message").await;
    }
    if let Err(answer) = keep_report(&s, &report, Some(&row), None).await {
        return answer;
    }
    let Some(event) = report.outcome(&row.facts()) else {
        // Several per message, most of them good news: counted above, not logged at info.
        debug!(load_id = %row.load_id, outbox_id = %row.id, status = %report.status, "SMS status");
        return StatusCode::OK.into_response();
    };
    // The outcome continues the trace of the decision that made the SMS, when it has one.
    let trace = row.trace.unwrap_or(trace);
    let answer = accept(&s, &event, false, trace).await;
    if answer.status().is_server_error() {
        return answer;
    }
    if answer.status().is_client_error() {
        // The row's failed outcome is in already (the dispatcher buried it): one is enough.
        info!(load_id = %row.load_id, outbox_id = %row.id, "SMS undelivered; its failed outcome is in already");
    } else {
        warn!(load_id = %row.load_id, outbox_id = %row.id, status = %report.status, error_code = report.error_code.as_deref().unwrap_or(""), "SMS not delivered: its failed outcome is queued");
    }
    StatusCode::OK.into_response()
}

#[derive(Deserialize)]
pub(crate) struct Limit {
    limit: Option<usize>,
}

pub(crate) async fn unmatched(_: ApiCaller, State(s): State<Arc<ApiState>>, ApiQuery(q): ApiQuery<Limit>) -> Response {
    let limit = q.limit.unwrap_or(100).min(1000);
    let reports = match s.store.unmatched_sms_reports(limit).await {
        Ok(reports) => reports,
        Err(e) => return store_unavailable("listing unmatched delivery reports", &e),
    };
    match s.store.unmatched_sms(limit).await {
        Ok(list) => axum::Json(json!({"unmatched": list, "status_callbacks": reports})).into_response(),
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

    fn form(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn an_inbound_sms_is_checked_once_and_kept_clean_and_bounded() {
        let ok = Inbound::check(&form(&[
            ("From", "+15555550100"),
            ("To", "+15555550000"),
            ("Body", "ETA\r\n9:15\t"),
            ("MessageSid", "SM1"),
        ]));
        assert_eq!((ok.key.as_str(), ok.body.as_str()), ("SM1", "ETA\r\n9:15\t"));
        assert_eq!(ok.checked.unwrap().0.as_str(), "sms:SM1");

        let long = "é\u{1b}".repeat(1000);
        let params = form(&[("From", "+1\u{0}5"), ("Body", &long)]);
        let bad = Inbound::check(&params);
        assert_eq!(bad.from, "+15", "NUL removed");
        assert_eq!(bad.body.chars().count(), 1600, "clipped by characters, not bytes");
        assert!(bad.body.starts_with("é\u{FFFD}é"), "other control characters replaced");
        assert_eq!(
            bad.checked.unwrap_err(),
            "From contains a control character; To is missing; Body contains a control character; \
             Body is longer than 1600 characters (2000); MessageSid is missing"
        );
        assert!(bad.key.starts_with("nosid:") && bad.key.len() == 46, "{}", bad.key);
        assert_eq!(Inbound::check(&params).key, bad.key, "a replay finds the same key");
        let other = Inbound::check(&form(&[("From", "+1\u{0}5"), ("Body", "other")]));
        assert_ne!(other.key, bad.key);
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
