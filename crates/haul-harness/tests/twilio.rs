//! The SMS channel on Twilio's Messages API: every request it makes validates against
//! Twilio's own OpenAPI description (served by Prism), and through the whole pipeline
//! on SQLite and PostgreSQL, against a double that keeps what it took, an answer lost
//! after Twilio made the message does not text the driver twice, a first try asks
//! nothing first, and a refusal keeps Twilio's error code.

mod common;

use std::sync::Arc;
use std::time::Duration;

use haul_config::Config;
use haul_core::ids::LoadId;
use haul_core::mask::Masker;
use haul_core::receipt::DeliveryReport;
use haul_core::{Clock, FakeClock, InboundEvent};
use haul_harness::testkit_twilio::{TwilioDouble, prism_url};
use haul_runtime::channels::twilio::{Sender, TwilioChannel, TwilioSettings};
use haul_runtime::channels::{ChannelClient, DeliveryError, http_client};
use haul_runtime::faults::Faults;
use haul_store::{LoadQueue, OutboxStatus, Store};
use serde_json::json;

use common::{DRIVER, H, SMS1, harness_on, init, ping, t0};

const ACCOUNT: &str = "AC0123456789abcdef0123456789abcdef";
const SERVICE: &str = "MG0123456789abcdef0123456789abcdef";
const SECRET: &str = "twilio-auth-token";
const HAUL_NUMBER: &str = "+15555550000";

fn settings(base_url: &str, sender: Sender) -> TwilioSettings {
    TwilioSettings {
        base_url: base_url.into(),
        account_sid: ACCOUNT.into(),
        api_key_sid: None,
        secret: SECRET.into(),
        sender,
        status_callback: Some("https://haul.example.com/v1/webhooks/twilio/status".into()),
        validity: Duration::from_secs(29 * 60),
        timeout: Duration::from_secs(5),
    }
}

fn by_number() -> Sender {
    Sender { from: Some(HAUL_NUMBER.into()), messaging_service_sid: None }
}

fn channel(settings: TwilioSettings) -> TwilioChannel {
    TwilioChannel::new(http_client().unwrap(), settings, &Masker::default())
}

#[tokio::test]
async fn every_request_validates_against_twilios_own_description() {
    let prism = prism_url().await.unwrap_or_else(|e| panic!("Twilio's description is needed: {e}"));
    let load = LoadId::parse("481207").unwrap();
    let sms = json!({"to": DRIVER, "body": "Hi, this is dispatch: what is your ETA?", "load_id": "481207"});
    let senders = [
        ("a number", by_number()),
        ("a Messaging Service", Sender { from: None, messaging_service_sid: Some(SERVICE.into()) }),
        ("both", Sender { from: Some(HAUL_NUMBER.into()), messaging_service_sid: Some(SERVICE.into()) }),
    ];
    for (what, sender) in senders {
        let c = channel(settings(&prism, sender.clone()));
        let sent = c.send("k1", &load, "/v1/messages", &sms, None, t0()).await;
        assert!(matches!(&sent, Ok(sid) if sid.starts_with("SM")), "a send as {what}: {sent:?}");
        // A re-send lists first (Prism's example is no match), then sends.
        let again = c.resend("k1", &load, "/v1/messages", &sms, None, t0(), t0()).await;
        assert!(matches!(&again, Ok(sid) if sid.starts_with("SM")), "a re-send as {what}: {again:?}");
        let with_key = TwilioSettings {
            api_key_sid: Some("SK0123456789abcdef0123456789abcdef".into()),
            ..settings(&prism, sender)
        };
        let sent = channel(with_key).send("k1", &load, "/v1/messages", &sms, None, t0()).await;
        assert!(sent.is_ok(), "a send as {what} signed in with an API key: {sent:?}");
    }
    // Prism does check: an account SID out of its form is refused, and haul says so.
    let bad = TwilioSettings { account_sid: "AC-not-an-account".into(), ..settings(&prism, by_number()) };
    let refused = channel(bad).send("k1", &load, "/v1/messages", &sms, None, t0()).await;
    assert!(
        matches!(&refused, Err(DeliveryError::Permanent(e)) if e.0.starts_with("HTTP 4")),
        "a request Twilio's description refuses: {refused:?}"
    );
}

/// A Twilio channel on `double`, with a short timeout so a late answer is a lost one.
fn on_double(double: &TwilioDouble) -> Arc<dyn ChannelClient> {
    let mut s = settings(&double.url, by_number());
    s.timeout = Duration::from_millis(300);
    Arc::new(channel(s))
}

/// A pipeline whose SMS channel is Twilio's, on a double that shares its clock.
async fn on_twilio(store: Arc<dyn Store>) -> (H, TwilioDouble) {
    let clock = Arc::new(FakeClock::new(t0()));
    let double = TwilioDouble::start(ACCOUNT, SECRET, clock.clone() as Arc<dyn Clock>).await.unwrap();
    let sms = on_double(&double);
    let h = harness_on(store, Config::default(), Faults::default(), None, clock, Some(sms)).await;
    (h, double)
}

async fn a_first_send_asks_nothing_first(store: Arc<dyn Store>) {
    let (h, d) = on_twilio(store).await;
    h.publish(init()).await;
    h.publish(ping("ping_0700")).await;
    h.settle().await;
    assert_eq!(d.calls(), (1, 0), "one create, no list");
    let messages = d.messages();
    assert_eq!(messages.len(), 1);
    let m = &messages[0];
    assert_eq!((m.to.as_str(), m.from.as_deref()), (DRIVER, Some(HAUL_NUMBER)));
    let form = |name: &str| m.form.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    assert_eq!(form("ValidityPeriod").as_deref(), Some("1740"));
    let callback = format!(
        "https://haul.example.com/v1/webhooks/twilio/status?key={}",
        SMS1.replace('/', "%2F").replace(':', "%3A")
    );
    assert_eq!(form("StatusCallback"), Some(callback), "the row's key rides in the URL Twilio signs");
    let row = h.row(SMS1).await;
    assert_eq!((row.status, row.receipt.as_deref()), (OutboxStatus::Dispatched, Some(m.sid.as_str())));
}

async fn an_answer_lost_after_twilio_made_the_message_texts_once(store: Arc<dyn Store>) {
    let (h, d) = on_twilio(store).await;
    d.answer_next_late(Duration::from_secs(2));
    h.publish(init()).await;
    h.publish(ping("ping_0700")).await;
    h.settle().await;
    let row = h.row(SMS1).await;
    assert_eq!((row.status, row.attempts), (OutboxStatus::Pending, 1), "the lost answer is a failed attempt");
    assert_eq!(d.messages().len(), 1, "Twilio made the message all the same");
    h.advance(60);
    h.settle().await;
    let row = h.row(SMS1).await;
    let messages = d.messages();
    assert_eq!(messages.len(), 1, "the driver is texted once");
    assert_eq!(d.calls(), (1, 1), "the retry lists and finds it, and creates nothing");
    assert_eq!((row.status, row.receipt.as_deref()), (OutboxStatus::Dispatched, Some(messages[0].sid.as_str())));
}

async fn a_refusal_keeps_twilios_error_code(store: Arc<dyn Store>) {
    let (h, d) = on_twilio(store).await;
    d.refuse_next(400, 21610);
    h.publish(init()).await;
    h.publish(ping("ping_0700")).await;
    h.settle().await;
    let row = h.row(SMS1).await;
    assert_eq!(row.status, OutboxStatus::Dead, "a refusal is permanent");
    let failure = row.last_failure.unwrap_or_default();
    assert!(failure.starts_with("HTTP 400: twilio error 21610: "), "{failure}");
    assert!(d.messages().is_empty());
    // 21610 is Twilio saying the number opted out: the load knows it, and the step-1
    // timer escalates to a person instead of texting again.
    assert!(h.state().await.sms_opted_out(), "a 21610 refusal opts the phone out");
    // And the phone, in the consent ledger: the driver's other loads text it no more.
    let kept = h.store.opted_out_among(&[DRIVER.to_owned()]).await.unwrap();
    let event_id = format!("evt:out:{SMS1}:failed");
    assert_eq!(kept.iter().map(|c| c.event_id.as_str()).collect::<Vec<_>>(), [event_id.as_str()]);
    h.advance(30 * 60);
    h.settle().await;
    assert_eq!(d.calls().0, 1, "no follow-up SMS is sent to an opted-out phone");
    let escalation = format!("{}/ask:eta_request:ping_0700/2/create_hero_task", h.load);
    assert_eq!(h.svc.sends("hero", &escalation), 1, "a person calls instead");
}

/// What the status route queues when Twilio reports `row`'s message undelivered.
fn undelivered(row: &haul_store::OutboxRow, code: &str) -> InboundEvent {
    let sid = row.receipt.as_deref();
    let report = DeliveryReport::new(sid, Some("undelivered"), Some(code)).unwrap();
    report.outcome(&row.facts()).unwrap()
}

/// Minutes from the ETA ask until a person has an urgent Hero task about the load,
/// advancing the clock a minute at a time; `receipt_after_s`: when Twilio reports the
/// ask undelivered, if it does.
async fn minutes_to_a_person(h: &H, receipt_after_s: Option<u64>) -> f64 {
    h.publish(init()).await;
    h.publish(ping("ping_0700")).await;
    h.settle().await;
    let asked_at = h.now();
    assert_eq!(h.row(SMS1).await.status, OutboxStatus::Dispatched);
    if let Some(after) = receipt_after_s {
        h.advance(after);
        let event = undelivered(&h.row(SMS1).await, "30006");
        h.queue.publish(&event.load_id, event.event_id.as_str(), &event.to_json().to_string(), h.now()).await.unwrap();
        h.settle().await;
    }
    for _ in 0..(4 * 60) {
        let urgent = h.svc.effects().iter().any(|e| e.channel == "hero" && e.payload["urgency"] == "urgent");
        if urgent {
            return haul_core::time::since(h.now(), asked_at).as_secs_f64() / 60.0;
        }
        h.advance(60);
        h.settle().await;
    }
    panic!("no person heard of it in four hours");
}

/// A landline (Twilio's 30006): Twilio takes the ask, then reports it undelivered.
/// With the receipt, a person has the urgent Hero task as soon as it comes; without
/// one, the SOP asks again into the same void until its asks run out.
async fn a_landline_reaches_a_person_as_soon_as_twilio_says_so(store: Arc<dyn Store>) {
    let (h, _double) = on_twilio(store).await;
    let with_receipt = minutes_to_a_person(&h, Some(5)).await;
    assert!(with_receipt <= 5.0 / 60.0 + 1e-9, "{with_receipt} min");
    let task = format!("{}/evt:out:{SMS1}:failed/create_hero_task", h.load);
    assert_eq!(h.svc.sends("hero", &task), 1, "the SOP's SMS-failed rule");
}

async fn without_receipts_a_landline_waits_for_the_asks_to_run_out(store: Arc<dyn Store>) {
    let (h, double) = on_twilio(store).await;
    let without = minutes_to_a_person(&h, None).await;
    eprintln!(
        "without delivery receipts: {without} min of fake clock to a person; {} asks texted",
        double.messages().len()
    );
    assert!(without >= 60.0, "{without} min");
}

on_both_backends!(
    a_landline_reaches_a_person_as_soon_as_twilio_says_so,
    without_receipts_a_landline_waits_for_the_asks_to_run_out,
    a_first_send_asks_nothing_first,
    an_answer_lost_after_twilio_made_the_message_texts_once,
    a_refusal_keeps_twilios_error_code,
);
