//! Wake-ups across processes: a forwarded wake-up reaches a listener on the same schema,
//! and only there.

use std::sync::Arc;
use std::time::Duration;

use haul_postgres::testing::{database_url, fresh_schema_url};
use haul_postgres::wake::{Direction, Link, Wake, bridge};
use tokio::sync::Notify;

/// Liveness bound only: a local NOTIFY arrives in milliseconds.
const ARRIVES: Duration = Duration::from_secs(10);

async fn woken(n: &Notify, within: Duration) -> bool {
    tokio::time::timeout(within, n.notified()).await.is_ok()
}

fn link(wake: Wake, direction: Direction, local: &Arc<Notify>) -> Vec<Link> {
    vec![Link { wake, direction, local: local.clone() }]
}

#[tokio::test]
async fn a_forwarded_wake_up_reaches_the_listener_of_its_schema_and_kind_only() {
    let url = database_url();
    let (_, here) = fresh_schema_url(&url).await;
    let (_, elsewhere) = fresh_schema_url(&url).await;
    let (api, worker, dispatcher, other) =
        (Arc::new(Notify::new()), Arc::new(Notify::new()), Arc::new(Notify::new()), Arc::new(Notify::new()));
    let _w = tokio::spawn(bridge(here.clone(), link(Wake::Work, Direction::Listen, &worker)));
    let _d = tokio::spawn(bridge(here.clone(), link(Wake::Dispatch, Direction::Listen, &dispatcher)));
    let _o = tokio::spawn(bridge(elsewhere, link(Wake::Work, Direction::Listen, &other)));
    // Each listener wakes its side once when it starts listening (to catch up).
    for n in [&worker, &dispatcher, &other] {
        assert!(woken(n, ARRIVES).await, "a listener wakes its side once it listens");
    }
    let _a = tokio::spawn(bridge(here, link(Wake::Work, Direction::Forward, &api)));
    for round in 0..3 {
        api.notify_one();
        assert!(woken(&worker, ARRIVES).await, "round {round}: the worker is woken across processes");
    }
    assert!(!woken(&dispatcher, Duration::from_millis(500)).await, "a work wake-up does not wake the dispatcher");
    assert!(!woken(&other, Duration::from_millis(500)).await, "another schema is not woken");
}

#[tokio::test]
async fn the_bridge_comes_back_after_its_connection_is_killed() {
    let url = database_url();
    let (schema, here) = fresh_schema_url(&url).await;
    let (api, worker) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let _w = tokio::spawn(bridge(here.clone(), link(Wake::Work, Direction::Listen, &worker)));
    assert!(woken(&worker, ARRIVES).await);
    let _a = tokio::spawn(bridge(here, link(Wake::Work, Direction::Forward, &api)));
    api.notify_one();
    assert!(woken(&worker, ARRIVES).await);
    // Kill every connection listening in this schema's channels.
    let admin = haul_postgres::testing::client_in_schema(&url, "public").await;
    let killed = admin
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND query LIKE $1",
            &[&format!("%haul_work:{schema}%")],
        )
        .await
        .unwrap();
    assert!(!killed.is_empty(), "the listener's connection was found");
    // The listener reconnects and wakes its side to catch up; then forwarding works again.
    assert!(woken(&worker, ARRIVES).await, "a reconnect wakes the local side");
    api.notify_one();
    assert!(woken(&worker, ARRIVES).await, "wake-ups flow again after the reconnect");
}
