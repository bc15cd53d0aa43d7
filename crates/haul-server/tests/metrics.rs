//! `/metrics` over real HTTP: the figures read from the store at scrape time (a stopped
//! pump's overdue timer shows), every family with its `# HELP` from the first scrape,
//! and no gauge sharing a family name with a counter.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use haul_core::ids::TimerId;
use haul_core::time::{Timestamp, add};
use haul_core::{Clock, FakeClock};
use haul_server::metrics::{FAMILIES, STORE_FIGURES, zero_series};
use haul_server::{ApiState, router};
use haul_store::LoadQueue;

use common::{Backend, store};

fn t0() -> Timestamp {
    "2026-03-02T07:00:00Z".parse().unwrap()
}

/// `/metrics` of an API (no worker, no dispatcher, no pump) on `store`, its clock at
/// `now`, reading the store's figures or not.
async fn scrape(store: Arc<dyn haul_store::Store>, now: Timestamp, store_figures: bool) -> String {
    zero_series();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let clock: Arc<dyn Clock> = Arc::new(FakeClock::new(now));
    let mut state = ApiState::new(
        store.clone(),
        store.clone() as Arc<dyn LoadQueue>,
        clock,
        vec![common::TOKEN.into()],
        None,
        base.clone(),
    );
    state.store_figures = store_figures;
    let app = router(Arc::new(state), true);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let resp = reqwest::get(format!("{base}/metrics")).await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.text().await.unwrap()
}

/// The value of an unlabelled series.
fn value(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// A timer due 15 minutes ago and nothing firing it: the gauge shows 900 s, whether or
/// not a pump ever ran in this process (the pump's own lag histogram says nothing then).
async fn a_stopped_pumps_overdue_timer_shows_its_age(backend: Backend) {
    let (s, _) = store(backend).await;
    let now = add(t0(), Duration::from_secs(900));
    let late = TimerId::parse("tmr:L1:ask:eta_request:p1:1").unwrap();
    s.schedule(&late, t0(), t0()).await.unwrap();
    let later = TimerId::parse("tmr:L2:ask:eta_request:p1:1").unwrap();
    s.schedule(&later, add(now, Duration::from_secs(60)), t0()).await.unwrap();
    let text = scrape(s.clone(), now, true).await;
    assert_eq!(value(&text, "haul_timers_oldest_due_age_seconds"), Some(900.0), "{text}");
    assert_eq!(value(&text, "haul_outbox_oldest_pending_age_seconds"), Some(0.0));
    // Fired: nothing is due any more.
    s.mark_fired(&late, now).await.unwrap();
    let text = scrape(s, now, true).await;
    assert_eq!(value(&text, "haul_timers_oldest_due_age_seconds"), Some(0.0), "{text}");
}

on_both_backends!(a_stopped_pumps_overdue_timer_shows_its_age);

#[tokio::test]
async fn every_family_has_its_help_from_the_first_scrape_and_no_name_is_two_types() {
    let (s, _) = store(Backend::SqliteFile).await;
    let text = scrape(s, t0(), true).await;
    let mut types = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            types.insert(name.to_owned(), kind.to_owned());
        }
    }
    for (name, _, _) in FAMILIES {
        assert!(types.contains_key(*name), "{name} is missing from the first scrape:\n{text}");
        assert!(text.contains(&format!("# HELP {name} ")), "{name} has no HELP line");
    }
    assert_eq!(types.len(), FAMILIES.len(), "families outside the list: {types:?}");
    for (name, kind) in &types {
        if let Some(base) = name.strip_suffix("_total") {
            assert!(!types.contains_key(base), "{name} ({kind}) and {base} share a family name");
        }
    }
    assert!(text.contains("haul_build_info{"), "{text}");
    assert!(text.contains(r#"haul_outbox_dead_rows_total{action_type="send_sms",class="external"} 0"#), "{text}");
    assert!(text.contains(r#"haul_channel_call_duration_seconds_count{channel="sms",result="delivered"} 0"#), "{text}");
}

#[tokio::test]
async fn a_process_that_does_not_read_the_store_exports_no_store_figures() {
    let (s, _) = store(Backend::SqliteFile).await;
    // Another API of this process that reads the store scrapes first (tests in one
    // binary share the process-wide recorder, as `cargo test` runs them): its figures
    // are its own, never the recorder's.
    let reader = scrape(s.clone(), t0(), true).await;
    assert!(reader.contains("haul_queue_depth 0"), "{reader}");
    let text = scrape(s, t0(), false).await;
    for name in STORE_FIGURES {
        assert!(!text.lines().any(|l| l.starts_with(name)), "{name} in\n{text}");
    }
    assert!(text.contains("haul_runs_total"));
}
