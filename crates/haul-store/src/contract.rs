//! The contract suite: written once, run against every backend.
//!
//! Each case is a plain async function taking a fresh, empty store. A backend's tests
//! call [`contract_tests!`](crate::contract_tests) with a factory, which expands to one
//! `#[tokio::test]` per case, so a failure names the case and the backend. Races use
//! real tasks on a multi-threaded runtime.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use haul_core::action::ActionType;
use haul_core::dispatch::{Alert, AlertKind};
use haul_core::ids::{LoadId, TimerId};
use haul_core::time::{Timestamp, add};
use haul_core::trace::TraceParent;
use serde_json::{Value, json};

use crate::{
    AlertState, AppendError, Claim, ClaimCursor, ClaimError, ClaimTake, InboxAlert, InboxCounts, InboxMark, NewEntry,
    NewOutboxRow, OutboxStatus, PruneReport, Published, RowCursor, ShadowCursor, ShadowDecision, SidClaim,
    SmsAssignment, SmsConsent, SmsDismissal, SmsMove, SmsReport, SmsRoute, Store, TimerStatus, UnmatchedSms,
};

/// Expands to one test per contract case. `$factory` is an async fn (or closure)
/// returning a fresh, empty `Arc<dyn Store>`.
#[macro_export]
macro_rules! contract_tests {
    ($factory:path) => {
        $crate::contract_tests!(@cases $factory;
            read_empty_load_has_version_zero,
            append_then_read_round_trips,
            read_after_returns_the_tail_and_the_version,
            read_page_walks_the_log_in_bounded_pages,
            outbox_rows_and_timers_page_in_creation_order,
            append_writes_outbox_rows_with_the_entries,
            append_with_stale_version_is_concurrency_conflict,
            append_with_future_version_is_concurrency_conflict,
            append_duplicate_entry_is_duplicate_entry_error,
            append_duplicate_entry_within_one_call_is_duplicate_entry_error,
            append_duplicate_action_key_is_duplicate_action_key_error,
            append_duplicate_action_key_within_one_call_is_duplicate_action_key_error,
            append_checks_version_before_entries_before_keys,
            append_keeps_loads_apart,
            racing_writers_on_one_version_exactly_one_wins,
            concurrent_appends_to_many_loads_commit_beside_the_failing_ones,
            pending_claims_only_due_rows,
            pending_honours_limit_and_due_order,
            pending_after_a_cursor_skips_the_rows_before_it,
            pending_sets_first_attempt_at_on_first_claim_only,
            live_lease_is_not_claimed_again,
            concurrent_claimers_get_disjoint_rows,
            lapsed_lease_is_taken_over_and_old_token_is_stale,
            stale_claim_changes_nothing,
            check_claim_fails_after_lease_lapses,
            mark_dispatched_stores_receipt_and_leaves_pending,
            publish_and_mark_dispatched_publishes_even_when_the_claim_is_stale,
            a_trace_context_is_kept_with_its_row_its_timer_and_the_outcome,
            mark_failed_with_retry_at_reschedules,
            mark_failed_without_retry_at_buries_the_row,
            oldest_pending_row_is_reported,
            schedule_twice_gives_one_timer,
            due_honours_time_and_limit,
            canceled_timer_is_not_due,
            cancel_before_schedule_stays_canceled,
            an_append_commits_its_timer_writes_or_none,
            mark_fired_is_idempotent,
            load_lock_excludes_a_second_holder,
            recorded_delivery_is_deduplicated_by_channel_and_key,
            dead_rows_without_a_published_outcome_are_found,
            dead_rows_of_one_type_are_found_since_a_time_in_bounds,
            a_deferred_dead_row_waits_and_never_holds_up_the_others,
            ops_alerts_are_kept_with_their_state_and_read_in_pages,
            loads_are_found_by_active_driver_phone,
            a_loads_client_is_kept_with_its_facts,
            unmatched_sms_is_kept_once,
            the_consent_ledger_keeps_each_phones_last_stop_or_start,
            model_spend_is_added_to_its_clients_day_with_its_prompts,
            delivery_reports_are_kept_once_per_message_and_status,
            message_sids_are_taken_once_across_loads,
            racing_claims_of_one_message_sid_have_one_winner,
            an_unmatched_sms_is_assigned_to_one_load_by_one_event,
            racing_assignments_of_one_sms_have_one_winner,
            an_assigned_sms_moves_once_per_event,
            racing_moves_of_one_sms_take_turns,
            a_held_row_spends_no_attempt_and_no_budget,
            rows_held_together_are_each_held_as_alone,
            a_changed_limit_makes_its_channels_held_rows_due_again,
            racing_holds_queue_each_clients_rows_on_their_own_slots,
            a_row_whose_ask_moved_on_is_superseded,
            a_paused_key_sends_nothing_until_the_pause_ends,
            rate_changes_are_kept_once_per_request_and_the_latest_wins,
            send_rates_are_shared_by_racing_dispatchers,
            sends_in_flight_are_capped_across_dispatchers,
            a_claim_takes_sends_for_the_rows_it_claims_as_made,
            a_changed_limit_keeps_a_pause_the_service_asked_for,
            append_refuses_an_outbox_key_of_another_load,
            append_acking_acks_if_and_only_if_the_append_commits,
            an_append_claims_its_rows_for_its_processs_dispatcher,
            a_received_message_carries_its_loads_log_version,
            a_short_receive_took_every_visible_message,
            a_publish_receives_its_message_when_its_load_is_idle,
            racing_publishes_on_a_new_load_receive_one_message,
            a_publish_racing_the_acking_append_is_never_stranded,
            prune_deletes_only_finished_rows_older_than_the_cutoff,
            prune_honours_the_batch_bound,
            store_keeps_working_after_prune,
            oldest_due_timer_is_the_earliest_scheduled_one_due,
            loads_summary_follows_the_log_and_filters_loads,
            loads_pages_walk_every_load_once,
            dead_rows_page_newest_first_by_type,
            overdue_timers_page_most_overdue_first,
            unmatched_sms_page_newest_first,
            the_inbox_follows_the_log_and_dismissals,
            conflicts_are_counted_per_load_most_first,
            shadow_decisions_are_kept_once_read_in_pages_and_pruned,
            the_console_secret_is_made_once_and_shared,
            racing_first_console_secrets_agree,
            ended_sessions_are_kept_until_they_expire,
            operator_requests_are_taken_once_per_load_and_event,
        );
        /// The store's own queue, driven by the suite's clock.
        async fn __queue_under_test() -> $crate::queue_contract::QueueUnderTest {
            $crate::queue_contract::QueueUnderTest::store($factory().await)
        }
        $crate::queue_contract_tests!(__queue_under_test);
    };
    (@cases $factory:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let store = $factory().await;
                $crate::contract::$case(store).await;
            }
        )*
    };
}

pub type DynStore = Arc<dyn Store>;

fn t0() -> Timestamp {
    "2026-03-02T07:00:00Z".parse().unwrap()
}

fn at(secs: u64) -> Timestamp {
    add(t0(), Duration::from_secs(secs))
}

fn load(s: &str) -> LoadId {
    LoadId::parse(s).unwrap()
}

fn entry(id: &str) -> NewEntry {
    NewEntry::stored(id, "inbound_sms", json!({"from": "+15555550100", "body": id}))
}

fn row(id: &str) -> NewOutboxRow {
    NewOutboxRow { id: id.into(), action_type: ActionType::SendSms, action: json!({"key": id}), trace: None }
}

const LEASE: Duration = Duration::from_secs(90);
const VIS: Duration = Duration::from_secs(30);

// The queue helpers the retention cases use (the queue's own cases are in
// `queue_contract.rs`).

async fn publish(s: &DynStore, l: &str, event: &str) -> Published {
    s.publish(&load(l), event, &json!({"event_id": event}).to_string(), t0()).await.unwrap()
}

async fn receive(s: &DynStore, now: Timestamp) -> Vec<(String, String)> {
    s.receive(10, VIS, now).await.unwrap().into_iter().map(|m| (m.load_id.to_string(), m.event_id)).collect()
}

async fn receive_one(s: &DynStore, now: Timestamp) -> crate::QueueMessage {
    let mut got = s.receive(1, VIS, now).await.unwrap();
    assert_eq!(got.len(), 1, "expected one message");
    got.remove(0)
}

fn pair(l: &str, e: &str) -> (String, String) {
    (l.into(), e.into())
}

/// Appends one event+decision pair with the given outbox keys; returns the new version.
async fn commit(s: &DynStore, l: &str, event: &str, expected: u64, keys: &[&str]) -> u64 {
    s.append(
        &load(l),
        vec![entry(event), entry(&format!("dec:{event}"))],
        expected,
        keys.iter().map(|k| row(k)).collect(),
        t0(),
    )
    .await
    .unwrap()
}

async fn pending_ids(s: &DynStore, limit: usize, now: Timestamp) -> Vec<String> {
    s.pending(limit, now, LEASE).await.unwrap().into_iter().map(|c| c.row.id).collect()
}

async fn log_ids(s: &DynStore, l: &str) -> Vec<String> {
    s.read(&load(l)).await.unwrap().0.into_iter().map(|r| r.entry_id).collect()
}

// ---------------------------------------------------------------------------------
// EventStore

pub async fn read_empty_load_has_version_zero(s: DynStore) {
    let (records, version) = s.read(&load("L1")).await.unwrap();
    assert!(records.is_empty());
    assert_eq!(version, 0);
}

pub async fn append_then_read_round_trips(s: DynStore) {
    let payload = json!({"from": "+15555550100", "body": "'; DROP TABLE events; -- ünïcødé \u{1F69A}"});
    let v = s
        .append(
            &load("L1"),
            vec![NewEntry::stored("sms_1", "inbound_sms", payload.clone()), entry("dec:sms_1")],
            0,
            vec![],
            at(5),
        )
        .await
        .unwrap();
    assert_eq!(v, 2);
    let (records, version) = s.read(&load("L1")).await.unwrap();
    assert_eq!(version, 2);
    assert_eq!(records.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!(records[0].entry_id, "sms_1");
    assert_eq!(records[0].kind(), "inbound_sms");
    assert_eq!(records[0].payload(), payload);
    assert_eq!(records[0].recorded_at, at(5));
    assert_eq!(commit(&s, "L1", "e2", 2, &[]).await, 4);
    assert_eq!(s.load_ids(None, 10).await.unwrap(), vec![load("L1")]);
}

pub async fn read_after_returns_the_tail_and_the_version(s: DynStore) {
    commit(&s, "L1", "e1", 0, &[]).await;
    commit(&s, "L1", "e2", 2, &[]).await;
    let (tail, v) = s.read_after(&load("L1"), 2).await.unwrap();
    assert_eq!((tail.iter().map(|r| r.seq).collect::<Vec<_>>(), v), (vec![3, 4], 4));
    let (tail, v) = s.read_after(&load("L1"), 4).await.unwrap();
    assert_eq!((tail.len(), v), (0, 4), "nothing new: the version is the one asked from");
    let (all, v) = s.read_after(&load("L1"), 0).await.unwrap();
    assert_eq!((all, v), s.read(&load("L1")).await.unwrap());
    assert_eq!(s.read_after(&load("L9"), 0).await.unwrap(), (vec![], 0));
}

pub async fn read_page_walks_the_log_in_bounded_pages(s: DynStore) {
    for i in 0..5u64 {
        commit(&s, "L1", &format!("e{i}"), i * 2, &[]).await;
    }
    commit(&s, "L2", "e0", 0, &[]).await;
    let page = async |after: u64, limit: usize| -> Vec<u64> {
        s.read_page(&load("L1"), after, limit).await.unwrap().iter().map(|r| r.seq).collect()
    };
    assert_eq!(page(0, 4).await, vec![1, 2, 3, 4]);
    assert_eq!(page(4, 4).await, vec![5, 6, 7, 8]);
    assert_eq!(page(8, 4).await, vec![9, 10], "the last page is short");
    assert!(page(10, 4).await.is_empty(), "nothing after the last record");
    assert!(page(0, 0).await.is_empty(), "a zero limit reads nothing");
    assert_eq!(page(0, usize::MAX).await.len(), 10, "a limit past every record reads them all");
    assert!(s.read_page(&load("L9"), 0, 4).await.unwrap().is_empty());
    // Pages put together are the log, record for record.
    let mut all: Vec<haul_core::projection::Record> = Vec::new();
    loop {
        let after = all.last().map_or(0, |r| r.seq);
        let next = s.read_page(&load("L1"), after, 3).await.unwrap();
        if next.is_empty() {
            break;
        }
        all.extend(next);
    }
    assert_eq!(all, s.read(&load("L1")).await.unwrap().0);
}

pub async fn outbox_rows_and_timers_page_in_creation_order(s: DynStore) {
    // Created out of id order, two at one instant (then by id), and rows of another load.
    s.append(&load("L1"), vec![entry("e1")], 0, vec![row("L1/e1/z"), row("L1/e1/y")], at(5)).await.unwrap();
    s.append(&load("L1"), vec![entry("e2")], 1, vec![row("L1/e2/b")], at(3)).await.unwrap();
    s.append(&load("L2"), vec![entry("e1")], 0, vec![row("L2/e1/a")], at(4)).await.unwrap();
    let rows = async |after: &RowCursor, limit: usize| -> Vec<String> {
        s.rows_for_load_page(&load("L1"), after, limit).await.unwrap().into_iter().map(|r| r.id).collect()
    };
    assert_eq!(rows(&RowCursor::start(), 2).await, vec!["L1/e2/b", "L1/e1/y"]);
    let y = s.get("L1/e1/y").await.unwrap().unwrap();
    assert_eq!(rows(&RowCursor::after_outbox_row(&y), 2).await, vec!["L1/e1/z"]);
    let z = s.get("L1/e1/z").await.unwrap().unwrap();
    assert!(rows(&RowCursor::after_outbox_row(&z), 2).await.is_empty());
    assert!(rows(&RowCursor::start(), 0).await.is_empty(), "a zero limit reads nothing");
    // A position between rows, as a cursor whose row was pruned since.
    let gone = RowCursor { created_at: at(4), id: "L1/gone".into() };
    assert_eq!(rows(&gone, 10).await, vec!["L1/e1/y", "L1/e1/z"]);
    let whole: Vec<String> = s.rows_for_load(&load("L1")).await.unwrap().into_iter().map(|r| r.id).collect();
    assert_eq!(rows(&RowCursor::start(), usize::MAX).await, whole, "the order of rows_for_load");

    for (n, created) in [(3, 9), (1, 7), (2, 7)] {
        s.schedule(&timer("L1", n), at(100), at(created)).await.unwrap();
    }
    s.schedule(&timer("L2", 1), at(100), at(8)).await.unwrap();
    let timers = async |after: &RowCursor, limit: usize| -> Vec<TimerId> {
        s.timers_for_load_page(&load("L1"), after, limit).await.unwrap().into_iter().map(|t| t.timer_id).collect()
    };
    assert_eq!(timers(&RowCursor::start(), 2).await, vec![timer("L1", 1), timer("L1", 2)]);
    let second = s.get_timer(&timer("L1", 2)).await.unwrap().unwrap();
    assert_eq!(timers(&RowCursor::after_timer(&second), 2).await, vec![timer("L1", 3)]);
    let whole: Vec<TimerId> = s.timers_for_load(&load("L1")).await.unwrap().into_iter().map(|t| t.timer_id).collect();
    assert_eq!(timers(&RowCursor::start(), 100).await, whole, "the order of timers_for_load");
}

pub async fn append_writes_outbox_rows_with_the_entries(s: DynStore) {
    commit(&s, "L1", "e1", 0, &["L1/e1/send_sms", "L1/e1/set_timer"]).await;
    let rows = s.rows_for_load(&load("L1")).await.unwrap();
    assert_eq!(rows.len(), 2);
    let r = s.get("L1/e1/send_sms").await.unwrap().unwrap();
    assert_eq!(r.status, OutboxStatus::Pending);
    assert_eq!(r.load_id, load("L1"));
    assert_eq!(r.action_type, ActionType::SendSms);
    assert_eq!(r.action, json!({"key": "L1/e1/send_sms"}));
    assert_eq!(r.attempts, 0);
    assert_eq!(r.due_at, t0());
    assert_eq!(r.first_attempt_at, None);
    assert_eq!(s.count_by_status(OutboxStatus::Pending).await.unwrap(), 2);
}

pub async fn append_with_stale_version_is_concurrency_conflict(s: DynStore) {
    commit(&s, "L1", "e1", 0, &[]).await;
    let err = s.append(&load("L1"), vec![entry("e2")], 0, vec![row("L1/e2/send_sms")], t0()).await.unwrap_err();
    assert!(matches!(&err, AppendError::ConcurrencyConflict(c) if c.expected == 0 && c.actual == 2), "{err:?}");
    assert_eq!(log_ids(&s, "L1").await, vec!["e1", "dec:e1"]);
    assert_eq!(s.get("L1/e2/send_sms").await.unwrap(), None);
}

pub async fn append_with_future_version_is_concurrency_conflict(s: DynStore) {
    let err = s.append(&load("L1"), vec![entry("e1")], 3, vec![], t0()).await.unwrap_err();
    assert!(matches!(err, AppendError::ConcurrencyConflict(_)), "{err:?}");
    assert!(log_ids(&s, "L1").await.is_empty());
}

pub async fn append_duplicate_entry_is_duplicate_entry_error(s: DynStore) {
    commit(&s, "L1", "e1", 0, &[]).await;
    let err = s
        .append(&load("L1"), vec![entry("e1"), entry("dec:e1x")], 2, vec![row("L1/x/send_sms")], t0())
        .await
        .unwrap_err();
    assert!(matches!(&err, AppendError::DuplicateEntry(d) if d.entry_id == "e1"), "{err:?}");
    assert_eq!(log_ids(&s, "L1").await, vec!["e1", "dec:e1"]);
    assert_eq!(s.get("L1/x/send_sms").await.unwrap(), None);
}

pub async fn append_duplicate_entry_within_one_call_is_duplicate_entry_error(s: DynStore) {
    let err = s.append(&load("L1"), vec![entry("e1"), entry("e1")], 0, vec![], t0()).await.unwrap_err();
    assert!(matches!(err, AppendError::DuplicateEntry(_)), "{err:?}");
    assert!(log_ids(&s, "L1").await.is_empty());
}

pub async fn append_duplicate_action_key_is_duplicate_action_key_error(s: DynStore) {
    commit(&s, "L1", "e1", 0, &["L1/k/send_sms"]).await;
    let err = s
        .append(&load("L1"), vec![entry("e2")], 2, vec![row("L1/k2/send_sms"), row("L1/k/send_sms")], t0())
        .await
        .unwrap_err();
    assert!(matches!(&err, AppendError::DuplicateActionKey(d) if d.key == "L1/k/send_sms"), "{err:?}");
    assert_eq!(log_ids(&s, "L1").await, vec!["e1", "dec:e1"]);
    assert_eq!(s.get("L1/k2/send_sms").await.unwrap(), None);
    assert_eq!(s.read(&load("L1")).await.unwrap().1, 2);
}

pub async fn append_duplicate_action_key_within_one_call_is_duplicate_action_key_error(s: DynStore) {
    let err = s
        .append(&load("L1"), vec![entry("e1")], 0, vec![row("L1/k/send_sms"), row("L1/k/send_sms")], t0())
        .await
        .unwrap_err();
    assert!(matches!(err, AppendError::DuplicateActionKey(_)), "{err:?}");
    assert!(log_ids(&s, "L1").await.is_empty());
    assert_eq!(s.get("L1/k/send_sms").await.unwrap(), None);
}

pub async fn append_checks_version_before_entries_before_keys(s: DynStore) {
    commit(&s, "L1", "e1", 0, &["L1/k/send_sms"]).await;
    // Everything wrong at once: the version wins.
    let err = s.append(&load("L1"), vec![entry("e1")], 0, vec![row("L1/k/send_sms")], t0()).await.unwrap_err();
    assert!(matches!(err, AppendError::ConcurrencyConflict(_)), "{err:?}");
    // Right version, duplicate entry and duplicate key: the entry wins.
    let err = s.append(&load("L1"), vec![entry("e1")], 2, vec![row("L1/k/send_sms")], t0()).await.unwrap_err();
    assert!(matches!(err, AppendError::DuplicateEntry(_)), "{err:?}");
    assert_eq!(log_ids(&s, "L1").await, vec!["e1", "dec:e1"]);
}

pub async fn append_keeps_loads_apart(s: DynStore) {
    commit(&s, "L1", "e1", 0, &[]).await;
    // The same entry id on another load is another entry.
    assert_eq!(commit(&s, "L2", "e1", 0, &[]).await, 2);
    assert_eq!(log_ids(&s, "L2").await, vec!["e1", "dec:e1"]);
    let mut ids = s.load_ids(None, 10).await.unwrap();
    ids.sort();
    assert_eq!(ids, vec![load("L1"), load("L2")]);
    assert_eq!(s.load_ids(Some(&load("L1")), 10).await.unwrap(), vec![load("L2")]);
}

pub async fn racing_writers_on_one_version_exactly_one_wins(s: DynStore) {
    commit(&s, "L1", "e0", 0, &[]).await;
    let writers = 8;
    let barrier = Arc::new(tokio::sync::Barrier::new(writers));
    let mut tasks = Vec::new();
    for w in 0..writers {
        let (s, barrier) = (s.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let event = format!("w{w}");
            let key = format!("L1/{event}/send_sms");
            s.append(&load("L1"), vec![entry(&event), entry(&format!("dec:{event}"))], 2, vec![row(&key)], t0()).await
        }));
    }
    let mut winners = Vec::new();
    for (w, t) in tasks.into_iter().enumerate() {
        match t.await.unwrap() {
            Ok(v) => {
                assert_eq!(v, 4);
                winners.push(w);
            }
            Err(AppendError::ConcurrencyConflict(c)) => assert_eq!(c.expected, 2),
            Err(e) => panic!("writer {w}: unexpected {e:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one writer commits");
    let w = winners[0];
    assert_eq!(log_ids(&s, "L1").await, vec!["e0".to_string(), "dec:e0".into(), format!("w{w}"), format!("dec:w{w}")]);
    let keys: Vec<String> = s.rows_for_load(&load("L1")).await.unwrap().into_iter().map(|r| r.id).collect();
    assert_eq!(keys, vec![format!("L1/w{w}/send_sms")], "the losers wrote no outbox rows");
}

/// Appends to many loads at once, with two racing writers on one load and one
/// duplicate entry among them: exactly one racer wins, the duplicate fails alone, and
/// every other load's append commits (a backend that groups appends into one
/// transaction must not let one unit's failure take its neighbours with it).
pub async fn concurrent_appends_to_many_loads_commit_beside_the_failing_ones(s: DynStore) {
    commit(&s, "HOT", "e0", 0, &[]).await;
    commit(&s, "DUP", "e0", 0, &[]).await;
    let loads = 16;
    // (load, event, expected version)
    let mut writers: Vec<(String, String, u64)> = (0..loads).map(|i| (format!("M{i}"), "e1".into(), 0)).collect();
    writers.push(("HOT".into(), "racer_a".into(), 2));
    writers.push(("HOT".into(), "racer_b".into(), 2));
    writers.push(("DUP".into(), "e0".into(), 2));
    let barrier = Arc::new(tokio::sync::Barrier::new(writers.len()));
    let mut tasks = Vec::new();
    for (l, event, expected) in writers.clone() {
        let (s, barrier) = (s.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let key = format!("{l}/{event}/send_sms");
            let entries = vec![entry(&event), entry(&format!("dec:{event}:{l}"))];
            s.append(&load(&l), entries, expected, vec![row(&key)], t0()).await
        }));
    }
    let mut hot_winners = Vec::new();
    for ((l, event, _), t) in writers.into_iter().zip(tasks) {
        let result = t.await.unwrap();
        match (l.as_str(), result) {
            ("HOT", Ok(v)) => {
                assert_eq!(v, 4);
                hot_winners.push(event);
            }
            ("HOT", Err(AppendError::ConcurrencyConflict(c))) => assert_eq!((c.expected, c.actual), (2, 4)),
            ("DUP", Err(AppendError::DuplicateEntry(d))) => assert_eq!(d.entry_id, "e0"),
            (m, Ok(v)) if m.starts_with('M') => assert_eq!(v, 2, "{m}"),
            (l, other) => panic!("{l}/{event}: unexpected {other:?}"),
        }
    }
    assert_eq!(hot_winners.len(), 1, "exactly one racer on HOT commits");
    let w = &hot_winners[0];
    assert_eq!(log_ids(&s, "HOT").await, vec!["e0".to_string(), "dec:e0".into(), w.clone(), format!("dec:{w}:HOT")]);
    let hot_keys: Vec<String> = s.rows_for_load(&load("HOT")).await.unwrap().into_iter().map(|r| r.id).collect();
    assert_eq!(hot_keys, vec![format!("HOT/{w}/send_sms")], "the loser wrote no outbox row");
    assert_eq!(log_ids(&s, "DUP").await, vec!["e0", "dec:e0"], "the duplicate changed nothing");
    assert_eq!(s.rows_for_load(&load("DUP")).await.unwrap(), vec![]);
    for i in 0..loads {
        let l = format!("M{i}");
        assert_eq!(log_ids(&s, &l).await, vec!["e1".to_string(), format!("dec:e1:{l}")], "{l}");
        assert!(s.get(&format!("{l}/e1/send_sms")).await.unwrap().is_some(), "{l}'s outbox row");
    }
}

// ---------------------------------------------------------------------------------
// Outbox

pub async fn pending_claims_only_due_rows(s: DynStore) {
    commit(&s, "L1", "e1", 0, &["L1/a/send_sms"]).await;
    // Rows are due at commit time: not before.
    let before = haul_core::time::from_ms(haul_core::time::to_ms(t0()) - 1);
    assert!(s.pending(10, before, LEASE).await.unwrap().is_empty());
    let claims = s.pending(10, t0(), LEASE).await.unwrap();
    assert_eq!(claims.len(), 1);
    let c = &claims[0];
    assert_eq!(c.row.claim_token.as_deref(), Some(c.token.as_str()));
    assert_eq!(c.row.lease_until, Some(add(t0(), LEASE)));
    // A row waiting for its retry_at is not due.
    s.mark_failed(&c.row.id, &c.token, "503", Some(at(10)), t0()).await.unwrap();
    assert!(s.pending(10, at(9), LEASE).await.unwrap().is_empty());
    assert_eq!(pending_ids(&s, 10, at(10)).await, vec!["L1/a/send_sms"]);
}

pub async fn pending_honours_limit_and_due_order(s: DynStore) {
    for i in 0..5u64 {
        s.append(&load("L1"), vec![entry(&format!("e{i}"))], i, vec![row(&format!("L1/r{i}/send_sms"))], at(i))
            .await
            .unwrap();
    }
    assert_eq!(pending_ids(&s, 2, at(100)).await, vec!["L1/r0/send_sms", "L1/r1/send_sms"]);
    assert_eq!(pending_ids(&s, 10, at(100)).await, vec!["L1/r2/send_sms", "L1/r3/send_sms", "L1/r4/send_sms"]);
    assert!(pending_ids(&s, 10, at(100)).await.is_empty());
}

/// A claim after a cursor takes the due rows past it in claim order, `(due_at, id)`,
/// and leaves the rows before it (free or not) to a claim from the start.
pub async fn pending_after_a_cursor_skips_the_rows_before_it(s: DynStore) {
    // Two rows per due time: r0 and r1 at 0, r2 and r3 at 1, r4 at 2.
    for i in 0..5u64 {
        s.append(&load("L1"), vec![entry(&format!("e{i}"))], i, vec![row(&format!("L1/r{i}/send_sms"))], at(i / 2))
            .await
            .unwrap();
    }
    let ids = |claims: Vec<Claim>| claims.into_iter().map(|c| c.row.id).collect::<Vec<_>>();
    let first = s.pending(1, at(100), LEASE).await.unwrap();
    let cursor = ClaimCursor::after(&first).unwrap();
    assert_eq!(cursor, ClaimCursor { due_at: at(0), id: "L1/r0/send_sms".into() });
    // After (0, r0): r1 (same due time, later id), then the later times; the limit holds.
    let after = s.pending_after(2, at(100), LEASE, &cursor).await.unwrap();
    assert_eq!(ids(after.clone()), vec!["L1/r1/send_sms", "L1/r2/send_sms"]);
    let cursor = ClaimCursor::after(&after).unwrap();
    assert_eq!(cursor, ClaimCursor { due_at: at(1), id: "L1/r2/send_sms".into() });
    // Only due rows, as `pending`: r4 is due at 2.
    assert_eq!(ids(s.pending_after(10, at(1), LEASE, &cursor).await.unwrap()), vec!["L1/r3/send_sms"]);
    let end = ClaimCursor { due_at: at(2), id: "L1/r4/send_sms".into() };
    assert!(s.pending_after(10, at(100), LEASE, &end).await.unwrap().is_empty());
    // The row the cursor passed while it was held is left to a claim from the start
    // once its lease lapses.
    let lapsed = add(at(100), LEASE);
    assert!(s.pending_after(10, lapsed, LEASE, &end).await.unwrap().is_empty());
    assert_eq!(ids(s.pending(1, lapsed, LEASE).await.unwrap()), vec!["L1/r0/send_sms"]);
}

pub async fn pending_sets_first_attempt_at_on_first_claim_only(s: DynStore) {
    commit(&s, "L1", "e1", 0, &["L1/a/send_sms"]).await;
    let c = s.pending(1, at(10), LEASE).await.unwrap().remove(0);
    assert_eq!(c.row.first_attempt_at, Some(at(10)));
    s.mark_failed(&c.row.id, &c.token, "timeout", Some(at(20)), at(11)).await.unwrap();
    let r = s.get("L1/a/send_sms").await.unwrap().unwrap();
    assert_eq!((r.attempts, r.first_attempt_at, r.due_at), (1, Some(at(10)), at(20)));
    assert_eq!(r.last_failure.as_deref(), Some("timeout"));
    let c2 = s.pending(1, at(30), LEASE).await.unwrap().remove(0);
    assert_eq!(c2.row.first_attempt_at, Some(at(10)), "the budget anchor does not move");
    assert_ne!(c2.token, c.token);
}

pub async fn live_lease_is_not_claimed_again(s: DynStore) {
    commit(&s, "L1", "e1", 0, &["L1/a/send_sms"]).await;
    assert_eq!(pending_ids(&s, 10, at(0)).await.len(), 1);
    assert!(pending_ids(&s, 10, at(89)).await.is_empty(), "the lease runs 90 s");
}

pub async fn concurrent_claimers_get_disjoint_rows(s: DynStore) {
    let rows = 60;
    let keys: Vec<String> = (0..rows).map(|i| format!("L1/r{i}/send_sms")).collect();
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    commit(&s, "L1", "e1", 0, &key_refs).await;
    let claimers = 4;
    let barrier = Arc::new(tokio::sync::Barrier::new(claimers));
    let mut tasks = Vec::new();
    for _ in 0..claimers {
        let (s, barrier) = (s.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut mine = Vec::new();
            loop {
                let got = pending_ids(&s, 7, at(1)).await;
                if got.is_empty() {
                    return mine;
                }
                mine.extend(got);
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let unique: BTreeSet<&String> = all.iter().collect();
    assert_eq!(unique.len(), all.len(), "a row was handed to two claimers");
    assert_eq!(all.len(), rows, "every row claimed once");
}

pub async fn lapsed_lease_is_taken_over_and_old_token_is_stale(s: DynStore) {
    commit(&s, "L1", "e1", 0, &["L1/a/send_sms"]).await;
    let old = s.pending(1, at(0), LEASE).await.unwrap().remove(0);
    let new = s.pending(1, at(90), LEASE).await.unwrap().remove(0);
    assert_ne!(old.token, new.token);
    assert_eq!(new.row.first_attempt_at, Some(at(0)));
    let stale = |r: Result<(), ClaimError>| matches!(r, Err(ClaimError::Stale(_)));
    assert!(stale(s.check_claim("L1/a/send_sms", &old.token, at(91)).await));
    assert!(stale(s.mark_dispatched("L1/a/send_sms", &old.token, "rcpt-old", at(91)).await));
    assert!(stale(s.mark_failed("L1/a/send_sms", &old.token, "x", None, at(91)).await));
    s.check_claim("L1/a/send_sms", &new.token, at(91)).await.unwrap();
    s.mark_dispatched("L1/a/send_sms", &new.token, "rcpt-new", at(92)).await.unwrap();
    let r = s.get("L1/a/send_sms").await.unwrap().unwrap();
    assert_eq!((r.status, r.receipt.as_deref()), (OutboxStatus::Dispatched, Some("rcpt-new")));
}

pub async fn stale_claim_changes_nothing(s: DynStore) {
    commit(&s, "L1", "e1", 0, &["L1/a/send_sms"]).await;
    let c = s.pending(1, at(0), LEASE).await.unwrap().remove(0);
    let before = s.get("L1/a/send_sms").await.unwrap().unwrap();
    for bad in ["", "not-a-token", &format!("{}x", c.token)] {
        assert!(matches!(s.mark_dispatched("L1/a/send_sms", bad, "r", at(1)).await, Err(ClaimError::Stale(_))));
        assert!(matches!(s.mark_failed("L1/a/send_sms", bad, "f", None, at(1)).await, Err(ClaimError::Stale(_))));
    }
    assert!(matches!(s.mark_dispatched("no/such/row", &c.token, "r", at(1)).await, Err(ClaimError::Stale(_))));
    assert_eq!(s.get("L1/a/send_sms").await.unwrap().unwrap(), before);
    // A dispatched row cannot be marked again, even with its token.
    s.mark_dispatched("L1/a/send_sms", &c.token, "r1", at(2)).await.unwrap();
    assert!(matches!(s.mark_failed("L1/a/send_sms", &c.token, "late", None, at(3)).await, Err(ClaimError::Stale(_))));
    assert_eq!(s.get("L1/a/send_sms").await.unwrap().unwrap().status, OutboxStatus::Dispatched);
}

pub async fn check_claim_fails_after_lease_lapses(s: DynStore) {
    commit(&s, "L1", "e1", 0, &["L1/a/send_sms"]).await;
    let c = s.pending(1, at(0), LEASE).await.unwrap().remove(0);
    s.check_claim("L1/a/send_sms", &c.token, at(89)).await.unwrap();
    assert!(matches!(s.check_claim("L1/a/send_sms", &c.token, at(90)).await, Err(ClaimError::Stale(_))));
}

pub async fn mark_dispatched_stores_receipt_and_leaves_pending(s: DynStore) {
    commit(&s, "L1", "e1", 0, &["L1/a/send_sms"]).await;
    let c = s.pending(1, at(0), LEASE).await.unwrap().remove(0);
    s.mark_dispatched(&c.row.id, &c.token, "SM123", at(1)).await.unwrap();
    let r = s.get(&c.row.id).await.unwrap().unwrap();
    assert_eq!((r.status, r.receipt.as_deref(), r.updated_at), (OutboxStatus::Dispatched, Some("SM123"), at(1)));
    assert!(pending_ids(&s, 10, at(1000)).await.is_empty());
    assert_eq!(s.oldest_pending_created_at().await.unwrap(), None);
}

pub async fn publish_and_mark_dispatched_publishes_even_when_the_claim_is_stale(s: DynStore) {
    commit(&s, "L1", "e1", 0, &["L1/a/send_sms", "L1/b/send_sms"]).await;
    let claims = s.pending(2, at(0), LEASE).await.unwrap();
    let (a, b) = (&claims[0], &claims[1]);
    let body = |e: &str| json!({"event_id": e}).to_string();
    // Ours: published and marked together.
    let p = s
        .publish_and_mark_dispatched(&a.row.id, &a.token, "SM1", &load("L1"), "out:a", &body("out:a"), None, at(1))
        .await;
    assert_eq!(p.unwrap(), Published::New);
    let r = s.get(&a.row.id).await.unwrap().unwrap();
    assert_eq!((r.status, r.receipt.as_deref()), (OutboxStatus::Dispatched, Some("SM1")));
    assert_eq!(receive(&s, at(1)).await, vec![pair("L1", "out:a")]);
    // A stale token: the publish stands, the row is left as it was.
    let p = s
        .publish_and_mark_dispatched(
            &b.row.id,
            "not-the-token",
            "SM2",
            &load("L1"),
            "out:b",
            &body("out:b"),
            None,
            at(2),
        )
        .await;
    assert!(matches!(p, Err(ClaimError::Stale(_))), "{p:?}");
    let r = s.get(&b.row.id).await.unwrap().unwrap();
    assert_eq!((r.status, r.receipt, r.claim_token.as_deref()), (OutboxStatus::Pending, None, Some(b.token.as_str())));
    assert_eq!(s.depth().await.unwrap(), 2, "out:a in flight, out:b published");
    // The owner's call after it: the publish is a duplicate, the mark goes through.
    let p = s
        .publish_and_mark_dispatched(&b.row.id, &b.token, "SM2", &load("L1"), "out:b", &body("out:b"), None, at(3))
        .await;
    assert_eq!(p.unwrap(), Published::Duplicate);
    assert_eq!(s.get(&b.row.id).await.unwrap().unwrap().status, OutboxStatus::Dispatched);
    assert_eq!(s.published_body(&load("L1"), "out:b").await.unwrap(), Some(body("out:b")));
}

/// A row keeps the context of the run that decided it, a timer the one it was set
/// with, and an outcome published with its row's mark the one it was given; none
/// given, none kept.
pub async fn a_trace_context_is_kept_with_its_row_its_timer_and_the_outcome(s: DynStore) {
    let ctx = |span: u64| TraceParent::root(0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736, span);
    let traced = NewOutboxRow { trace: Some(ctx(1)), ..row("L1/a/send_sms") };
    s.append(&load("L1"), vec![entry("e1")], 0, vec![traced, row("L1/b/send_sms")], t0()).await.unwrap();
    let claims = s.pending(2, at(0), LEASE).await.unwrap();
    let traces: Vec<_> = claims.iter().map(|c| (c.row.id.as_str(), c.row.trace)).collect();
    assert_eq!(traces, [("L1/a/send_sms", Some(ctx(1))), ("L1/b/send_sms", None)]);
    assert_eq!(s.get("L1/a/send_sms").await.unwrap().unwrap().trace, Some(ctx(1)));

    s.schedule_traced(&timer("L1", 1), at(60), Some(ctx(2)), at(0)).await.unwrap();
    s.schedule(&timer("L1", 2), at(60), at(0)).await.unwrap();
    // A second schedule changes nothing, its context neither.
    s.schedule_traced(&timer("L1", 1), at(60), Some(ctx(3)), at(0)).await.unwrap();
    let due: Vec<_> = s.due(at(60), 10).await.unwrap().into_iter().map(|t| (t.timer_id, t.trace)).collect();
    assert_eq!(due, [(timer("L1", 1), Some(ctx(2))), (timer("L1", 2), None)]);
    assert_eq!(s.get_timer(&timer("L1", 1)).await.unwrap().unwrap().trace, Some(ctx(2)));

    let (a, body) = (&claims[0], json!({"event_id": "out:a"}).to_string());
    s.publish_and_mark_dispatched(&a.row.id, &a.token, "SM1", &load("L1"), "out:a", &body, Some(ctx(4)), at(1))
        .await
        .unwrap();
    assert_eq!(receive_one(&s, at(1)).await.trace, Some(ctx(4)));
}

/// A row a send rate held back is due again later, unclaimed, with no attempt counted:
/// never sent, its first claim is forgotten; sent before, its budget's start moves on
/// by the wait. Only the claim's owner holds it.
pub async fn a_held_row_spends_no_attempt_and_no_budget(s: DynStore) {
    commit(&s, "L1", "e1", 0, &["L1/a/send_sms"]).await;
    let c = s.pending(1, at(10), LEASE).await.unwrap().remove(0);
    let bad = s.hold(&c.row.id, "not-the-token", at(15), None, at(10)).await;
    assert!(matches!(bad, Err(ClaimError::Stale(_))), "{bad:?}");
    s.hold(&c.row.id, &c.token, at(15), None, at(10)).await.unwrap();
    let r = s.get(&c.row.id).await.unwrap().unwrap();
    let fields = (r.status, r.attempts, r.due_at, r.first_attempt_at, r.claim_token.clone(), r.lease_until);
    assert_eq!(fields, (OutboxStatus::Pending, 0, at(15), None, None, None));
    assert!(pending_ids(&s, 10, at(14)).await.is_empty(), "held until 15 s");
    let c = s.pending(1, at(15), LEASE).await.unwrap().remove(0);
    assert_eq!(c.row.first_attempt_at, Some(at(15)), "the budget starts at the first real claim");
    s.mark_failed(&c.row.id, &c.token, "503", Some(at(20)), at(16)).await.unwrap();
    let c = s.pending(1, at(20), LEASE).await.unwrap().remove(0);
    s.hold(&c.row.id, &c.token, at(50), Some("throttled: HTTP 429"), at(20)).await.unwrap();
    let r = s.get(&c.row.id).await.unwrap().unwrap();
    assert_eq!((r.attempts, r.due_at, r.first_attempt_at), (1, at(50), Some(at(45))), "moved on by the 30 s wait");
    assert_eq!(r.last_failure.as_deref(), Some("throttled: HTTP 429"), "a 429's hold says why");
    assert!(matches!(s.hold(&c.row.id, &c.token, at(60), None, at(21)).await, Err(ClaimError::Stale(_))), "given back");
    let c = s.pending(1, at(50), LEASE).await.unwrap().remove(0);
    s.hold(&c.row.id, &c.token, at(60), None, at(50)).await.unwrap();
    let r = s.get(&c.row.id).await.unwrap().unwrap();
    assert_eq!(r.last_failure.as_deref(), Some("throttled: HTTP 429"), "a rate's hold keeps the last failure");
}

/// `hold_all`: each row as `hold` would leave it (its own due time, no attempt, the
/// budget forgotten or moved on), in one write, across loads; a row no longer its
/// token's is left alone; past its bound nothing is held.
pub async fn rows_held_together_are_each_held_as_alone(s: DynStore) {
    commit(&s, "L1", "e1", 0, &["L1/a/send_sms", "L1/b/send_sms"]).await;
    commit(&s, "L2", "e1", 0, &["L2/a/send_sms"]).await;
    let mut claims = s.pending(10, at(10), LEASE).await.unwrap();
    claims.sort_by(|a, b| a.row.id.cmp(&b.row.id));
    // L1/b was tried once: its budget's start moves on by the wait.
    s.mark_failed(&claims[1].row.id, &claims[1].token, "503", Some(at(20)), at(11)).await.unwrap();
    let b = s.pending(10, at(20), LEASE).await.unwrap().remove(0);
    let holds = vec![
        (claims[0].row.id.clone(), claims[0].token.clone(), at(30)),
        (b.row.id.clone(), b.token.clone(), at(40)),
        (claims[2].row.id.clone(), "not-the-token".to_owned(), at(50)),
    ];
    assert_eq!(s.hold_all(&holds, at(20)).await.unwrap(), 2);
    let row = async |id: &str| {
        let r = s.get(id).await.unwrap().unwrap();
        (r.status, r.attempts, r.due_at, r.first_attempt_at, r.claim_token.is_some(), r.last_failure)
    };
    assert_eq!(row("L1/a/send_sms").await, (OutboxStatus::Pending, 0, at(30), None, false, None));
    let moved_on = Some(at(30));
    assert_eq!(row("L1/b/send_sms").await, (OutboxStatus::Pending, 1, at(40), moved_on, false, Some("503".into())));
    assert_eq!(
        row("L2/a/send_sms").await,
        (OutboxStatus::Pending, 0, at(0), Some(at(10)), true, None),
        "not its token"
    );
    assert_eq!(pending_ids(&s, 10, at(39)).await, vec!["L1/a/send_sms".to_owned()], "each due at its own time");
    let many = vec![(claims[2].row.id.clone(), claims[2].token.clone(), at(60)); crate::MAX_HOLDS + 1];
    assert!(s.hold_all(&many, at(20)).await.unwrap_err().to_string().contains("at most 1000"));
    assert_eq!(row("L2/a/send_sms").await.2, at(0), "past its bound nothing is held");
    assert_eq!(s.hold_all(&[], at(20)).await.unwrap(), 0);
}

/// A channel's limit changed (`requeue_held`): its rate starts afresh, its clients'
/// queues are forgotten and its rows that wait for a send are due now; a row of another channel, one in a
/// retry's backoff, one claimed, one already due, and another rate's queues are left.
pub async fn a_changed_limit_makes_its_channels_held_rows_due_again(s: DynStore) {
    let hero = NewOutboxRow {
        id: "L1/h/create_hero_task".into(),
        action_type: ActionType::CreateHeroTask,
        action: json!({}),
        trace: None,
    };
    let mut rows: Vec<NewOutboxRow> =
        ["L1/a/send_sms", "L1/b/send_sms", "L1/c/send_sms", "L1/d/send_sms"].map(row).into();
    rows.push(hero);
    s.append(&load("L1"), vec![entry("e1")], 0, rows, at(0)).await.unwrap();
    let claims = s.pending(10, at(1), LEASE).await.unwrap();
    let claim = |id: &str| claims.iter().find(|c| c.row.id == id).unwrap();
    let holds: Vec<(String, String, Timestamp)> = ["L1/a/send_sms", "L1/h/create_hero_task"]
        .iter()
        .map(|id| (id.to_string(), claim(id).token.clone(), at(100)))
        .collect();
    s.hold_all(&holds, at(1)).await.unwrap();
    // b waits in a retry's backoff instead: tried once.
    s.mark_failed("L1/b/send_sms", &claim("L1/b/send_sms").token, "503", Some(at(200)), at(1)).await.unwrap();
    // c is still claimed (its lease runs to 91 s), d was given back due at once.
    s.hold_all(&[("L1/d/send_sms".into(), claim("L1/d/send_sms").token.clone(), at(1))], at(1)).await.unwrap();
    s.queue_sends("sms|acme", 0, 10, 3).await.unwrap();
    s.queue_sends("smsx|acme", 0, 10, 3).await.unwrap();
    let limit = haul_core::limit::Limit::new(haul_core::limit::Rate::parse("1/min").unwrap(), 1).unwrap();
    assert_eq!(s.take_sends("sms", &limit, 1, at(1)).await.unwrap().granted, 1, "next send 61 s in");
    let held = |id: &str| {
        let s = s.clone();
        let id = id.to_owned();
        async move { s.get(&id).await.unwrap().unwrap().due_at }
    };
    let a_was = held("L1/a/send_sms").await;
    assert_eq!(a_was, at(100));
    assert_eq!(s.requeue_held("sms", &[ActionType::SendSms], at(50)).await.unwrap(), 1);
    assert_eq!(held("L1/a/send_sms").await, at(50), "held: due now");
    assert_eq!(held("L1/h/create_hero_task").await, at(100), "another channel's");
    assert_eq!(held("L1/b/send_sms").await, at(200), "in its retry's backoff");
    assert_eq!(held("L1/d/send_sms").await, at(1), "due already");
    let tails = s.queue_tails(&["sms|acme".to_owned(), "smsx|acme".to_owned()]).await.unwrap();
    assert_eq!(tails, vec![("smsx|acme".to_owned(), 20)], "its queues forgotten, another rate's kept");
    assert_eq!(s.take_sends("sms", &limit, 1, at(50)).await.unwrap().granted, 1, "the rate afresh");
    assert_eq!(s.requeue_held("sms", &[ActionType::SendSms], at(50)).await.unwrap(), 0, "nothing more");
}

/// An ask's SMS that waited is settled unsent once a later step of its ask is on its
/// load (and only then, only by its claim's owner); other loads and asks do not count.
/// The later step, if it waits too (held, never tried), takes its place: due now.
pub async fn a_row_whose_ask_moved_on_is_superseded(s: DynStore) {
    let ask = |id: &str, ask: &str, step: u32| NewOutboxRow {
        id: id.into(),
        action_type: ActionType::SendSms,
        action: json!({"key": id, "type": "send_sms", "ask_id": ask, "step": step, "params": {}}),
        trace: None,
    };
    let step1 = "L1/ask:eta_request:p1/1/send_sms";
    let rows =
        vec![ask(step1, "ask:eta_request:p1", 1), ask("L1/ask:eta_request:p9/2/send_sms", "ask:eta_request:p9", 2)];
    s.append(&load("L1"), vec![entry("e1")], 0, rows, at(0)).await.unwrap();
    let other = vec![ask("L2/ask:eta_request:p1/2/send_sms", "ask:eta_request:p1", 2)];
    s.append(&load("L2"), vec![entry("e1")], 0, other, at(0)).await.unwrap();
    let claim = |s: DynStore| async move {
        s.pending(10, at(1), LEASE).await.unwrap().into_iter().find(|c| c.row.id == step1).unwrap()
    };
    let c = claim(s.clone()).await;
    assert_eq!(s.supersede(&c.row.id, &c.token, "ask:eta_request:p1", 1, at(1)).await.unwrap(), None, "not moved on");
    assert_eq!(s.get(step1).await.unwrap().unwrap().status, OutboxStatus::Pending);
    // Step 2 of its ask, and a timer of step 1 (not later).
    let later = vec![
        ask("L1/ask:eta_request:p1/1/set_timer", "ask:eta_request:p1", 1),
        ask("L1/ask:eta_request:p1/2/send_sms", "ask:eta_request:p1", 2),
    ];
    s.append(&load("L1"), vec![entry("e2")], 1, later, at(2)).await.unwrap();
    // Step 2 is held back by the rate, to at(100).
    let step2 = "L1/ask:eta_request:p1/2/send_sms";
    let c2 = s.pending(10, at(2), LEASE).await.unwrap().into_iter().find(|c| c.row.id == step2).unwrap();
    s.hold(step2, &c2.token, at(100), None, at(2)).await.unwrap();
    assert_eq!(s.supersede(&c.row.id, "not-the-token", "ask:eta_request:p1", 1, at(3)).await.unwrap(), None);
    assert_eq!(s.get(step1).await.unwrap().unwrap().status, OutboxStatus::Pending, "not its claim: nothing changed");
    let by = s.supersede(&c.row.id, &c.token, "ask:eta_request:p1", 1, at(3)).await.unwrap();
    let by_was_due = Some(at(100));
    assert_eq!(by, Some(crate::Superseded { by: step2.into(), by_was_due }), "it waited: when, it says");
    let r = s.get(step1).await.unwrap().unwrap();
    let fields = (r.status, r.attempts, r.claim_token, r.lease_until, r.last_failure.as_deref());
    let note = "not sent: its ask moved on (L1/ask:eta_request:p1/2/send_sms)";
    assert_eq!(fields, (OutboxStatus::Superseded, 0, None, None, Some(note)));
    // The later step takes its place: held and never tried, it is due now.
    assert_eq!(s.get(step2).await.unwrap().unwrap().due_at, at(3), "step 2 due when step 1 would have gone");
    assert!(!pending_ids(&s, 10, at(1000)).await.contains(&step1.to_owned()), "never claimed again");
    assert_eq!(s.count_by_status(OutboxStatus::Superseded).await.unwrap(), 1);
    assert_eq!(s.supersede(&c.row.id, &c.token, "ask:eta_request:p1", 1, at(4)).await.unwrap(), None, "once");
}

/// A 429's pause: no send on its key before it ends, then one at a time; a pause
/// shorter than what the key already waits changes nothing; the key shows saturated.
pub async fn a_paused_key_sends_nothing_until_the_pause_ends(s: DynStore) {
    let limit = haul_core::limit::Limit::new(haul_core::limit::Rate::parse("10/s").unwrap(), 3).unwrap();
    s.pause_sends("sms", &limit, at(110), at(100)).await.unwrap();
    assert_eq!(s.saturated(at(100)).await.unwrap(), vec![("sms".to_owned(), at(100))]);
    let just_before = add(at(109), Duration::from_millis(999));
    assert_eq!(s.take_sends("sms", &limit, 5, just_before).await.unwrap().granted, 0);
    assert_eq!(s.take_sends("sms", &limit, 5, at(110)).await.unwrap().granted, 1, "one, not the burst");
    s.pause_sends("sms", &limit, at(105), at(106)).await.unwrap();
    assert_eq!(s.take_sends("sms", &limit, 5, add(at(110), Duration::from_millis(100))).await.unwrap().granted, 1);
    assert_eq!(s.take_sends("hero", &limit, 5, at(100)).await.unwrap().granted, 3, "its own key");
}

/// Dispatchers taking sends for one key at once never get more between them than the
/// limit allows; another key has its own.
pub async fn send_rates_are_shared_by_racing_dispatchers(s: DynStore) {
    let limit = haul_core::limit::Limit::new(haul_core::limit::Rate::parse("10/s").unwrap(), 3).unwrap();
    let takers = 8;
    let barrier = Arc::new(tokio::sync::Barrier::new(takers));
    let mut tasks = Vec::new();
    for _ in 0..takers {
        let (s, barrier) = (s.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            s.take_sends("sms", &limit, 2, at(100)).await.unwrap().granted
        }));
    }
    let mut granted = 0;
    for t in tasks {
        granted += t.await.unwrap();
    }
    assert_eq!(granted, 3, "the burst, however many asked at once");
    let g = s.take_sends("sms", &limit, 5, at(100)).await.unwrap();
    assert_eq!(g.granted, 0);
    assert_eq!(haul_core::time::from_us(g.next_at_us), add(at(100), Duration::from_millis(100)));
    assert_eq!(s.take_sends("sms", &limit, 5, add(at(100), Duration::from_millis(250))).await.unwrap().granted, 2);
    assert_eq!(s.take_sends("sms:+15555550000", &limit, 5, at(100)).await.unwrap().granted, 3, "its own key");
    // A grant short of what was wanted marks the key saturated, when; a full one does not.
    let since = |t| s.saturated(t);
    assert_eq!(since(at(100)).await.unwrap().len(), 2);
    s.take_sends("hero", &limit, 1, at(100)).await.unwrap();
    let later = add(at(100), Duration::from_millis(250));
    assert_eq!(
        since(at(100)).await.unwrap(),
        vec![("sms".to_owned(), later), ("sms:+15555550000".to_owned(), at(100))]
    );
    s.take_sends("sms", &limit, 9, at(130)).await.unwrap();
    assert_eq!(since(at(101)).await.unwrap(), vec![("sms".to_owned(), at(130))], "only since then");
}

/// A channel's sends in flight are capped across dispatchers (`take_slots`): racing
/// takers get no more slots between them than the cap; a slot is freed by its own
/// send's end (not by another claim's), or when its lease lapses; another key has its
/// own.
pub async fn sends_in_flight_are_capped_across_dispatchers(s: DynStore) {
    let send = |i: usize| (format!("row{i}"), format!("tok{i}"));
    let until = add(at(100), Duration::from_secs(90));
    let takers = 8;
    let barrier = Arc::new(tokio::sync::Barrier::new(takers));
    let mut tasks = Vec::new();
    for i in 0..takers {
        let (s, barrier) = (s.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            s.take_slots("sms", 3, &[send(2 * i), send(2 * i + 1)], until, at(100)).await.unwrap()
        }));
    }
    let mut held = Vec::new();
    for t in tasks {
        held.extend(t.await.unwrap());
    }
    assert_eq!(held.len(), 3, "the cap, however many asked at once: {held:?}");
    let first = held[0].clone();
    let i: usize = first.trim_start_matches("row").parse().unwrap();
    assert_eq!(s.take_slots("sms", 3, &[send(99)], until, at(101)).await.unwrap(), Vec::<String>::new(), "full");
    // Another claim's token frees nothing; the send's own does.
    s.free_slots("sms", &[(first.clone(), "other".into())]).await.unwrap();
    assert!(s.take_slots("sms", 3, &[send(99)], until, at(101)).await.unwrap().is_empty());
    s.free_slots("sms", &[send(i)]).await.unwrap();
    assert_eq!(s.take_slots("sms", 3, &[send(99), send(98)], until, at(101)).await.unwrap(), vec!["row99"]);
    // A send holding a slot keeps it when it takes one again, and counts once.
    let again = s.take_slots("sms", 3, &[("row99".into(), "tok99b".into())], until, at(102)).await.unwrap();
    assert_eq!(again, vec!["row99"]);
    assert_eq!(s.take_slots("hero", 1, &[send(97)], until, at(102)).await.unwrap(), vec!["row97"], "its own key");
    // Past the lease every slot is free again.
    let later = add(until, Duration::from_millis(1));
    let sends: Vec<_> = (50..55).map(send).collect();
    assert_eq!(s.take_slots("sms", 3, &sends, add(later, Duration::from_secs(90)), later).await.unwrap().len(), 3);
}

/// A claim takes its rates' sends in its own transaction (`claim_taking`): for each
/// take, the claimed rows of its types made due at once, as `take_sends` would for
/// them on the state kept; a row that waited (held back) is not counted, a take with
/// no row takes nothing, a short grant marks the key saturated. Past a cursor too; a
/// key given twice is refused before anything is claimed.
pub async fn a_claim_takes_sends_for_the_rows_it_claims_as_made(s: DynStore) {
    use haul_core::limit::{Limit, Rate, take};
    let limit = Limit::new(Rate::parse("10/s").unwrap(), 3).unwrap();
    let takes = [
        ClaimTake { key: "sms".into(), action_types: vec![ActionType::SendSms], limit },
        ClaimTake { key: "hero".into(), action_types: vec![ActionType::CreateHeroTask], limit },
        ClaimTake { key: "slack".into(), action_types: vec![ActionType::PostHeroSlack], limit },
    ];
    // L2's row waited: held back from 0 s to 1 s.
    s.append(&load("L2"), vec![entry("e1")], 0, vec![row("L2/w/send_sms")], at(0)).await.unwrap();
    let c = s.pending(1, at(0), LEASE).await.unwrap().remove(0);
    s.hold_all(&[(c.row.id.clone(), c.token.clone(), at(1))], at(0)).await.unwrap();
    let hero = NewOutboxRow {
        id: "L1/h/create_hero_task".into(),
        action_type: ActionType::CreateHeroTask,
        action: json!({}),
        trace: None,
    };
    let mut rows: Vec<NewOutboxRow> =
        ["L1/a/send_sms", "L1/b/send_sms", "L1/c/send_sms", "L1/d/send_sms"].map(row).into();
    rows.push(hero);
    s.append(&load("L1"), vec![entry("e1")], 0, rows, at(1)).await.unwrap();
    let refused = s.claim_taking(10, at(1), LEASE, None, &[takes[0].clone(), takes[0].clone()]).await;
    assert!(refused.unwrap_err().to_string().contains("given twice"));
    assert_eq!(pending_ids(&s, 10, at(1)).await.len(), 6, "nothing claimed by a refused claim");
    // Those pending_ids claimed them: a claim after their leases.
    let now = add(at(1), LEASE);
    let now_us = haul_core::time::to_us(now);
    let first = s.claim_taking(3, now, LEASE, None, &takes).await.unwrap();
    let ids: Vec<&str> = first.claims.iter().map(|c| c.row.id.as_str()).collect();
    assert_eq!(ids, ["L1/a/send_sms", "L1/b/send_sms", "L1/c/send_sms"]);
    let sms = take(&limit, None, now_us, 3);
    assert_eq!(first.grants, vec![Some((3, sms)), None, None]);
    assert_eq!(sms.granted, 3, "the burst");
    assert!(s.saturated(now).await.unwrap().is_empty(), "not short");
    // Past the cursor: d (one more send, none left), the Hero task, and L2's held row
    // (not counted).
    let after = ClaimCursor::after(&first.claims).unwrap();
    let second = s.claim_taking(10, now, LEASE, Some(&after), &takes).await.unwrap();
    let mut ids: Vec<&str> = second.claims.iter().map(|c| c.row.id.as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["L1/d/send_sms", "L1/h/create_hero_task", "L2/w/send_sms"]);
    let (sms, hero) = (take(&limit, Some(sms.tat_us), now_us, 1), take(&limit, None, now_us, 1));
    assert_eq!(sms.granted, 0, "the burst is spent");
    assert_eq!(second.grants, vec![Some((1, sms)), Some((1, hero)), None]);
    assert_eq!(s.saturated(now).await.unwrap(), vec![("sms".to_owned(), now)], "short: saturated");
    // The state kept: take_sends goes on from it.
    let later = add(now, Duration::from_millis(100));
    let kept = take(&limit, Some(sms.tat_us), haul_core::time::to_us(later), 5);
    assert_eq!(s.take_sends("sms", &limit, 5, later).await.unwrap(), kept);
    assert_eq!(kept.granted, 1);
    let none = s.claim_taking(10, now, LEASE, None, &takes).await.unwrap();
    assert_eq!((none.claims.len(), none.grants), (0, vec![None, None, None]), "nothing due: nothing taken");
}

/// A changed limit starts its rate afresh (`requeue_held`), but not before a pause the
/// service asked for (a 429's) ends: then one send, not the burst. Once the pause is
/// over, afresh is from now. The pause's own key is never shown saturated.
pub async fn a_changed_limit_keeps_a_pause_the_service_asked_for(s: DynStore) {
    use haul_core::limit::{Limit, Rate};
    let limit = Limit::new(Rate::parse("10/s").unwrap(), 3).unwrap();
    s.pause_sends("sms", &limit, at(110), at(100)).await.unwrap();
    assert_eq!(s.requeue_held("sms", &[ActionType::SendSms], at(105)).await.unwrap(), 0);
    assert_eq!(s.take_sends("sms", &limit, 5, at(106)).await.unwrap().granted, 0, "still paused");
    assert_eq!(s.take_sends("sms", &limit, 5, at(110)).await.unwrap().granted, 1, "then one, not the burst");
    // A slow limit's send puts the rate a minute ahead; the pause is long over.
    let slow = Limit::new(Rate::parse("1/min").unwrap(), 1).unwrap();
    assert_eq!(s.take_sends("sms", &slow, 1, at(120)).await.unwrap().granted, 1);
    assert_eq!(s.take_sends("sms", &limit, 1, at(121)).await.unwrap().granted, 0, "a minute ahead");
    s.requeue_held("sms", &[ActionType::SendSms], at(121)).await.unwrap();
    assert_eq!(s.take_sends("sms", &limit, 5, at(121)).await.unwrap().granted, 3, "afresh: the burst");
    let saturated: Vec<String> = s.saturated(at(0)).await.unwrap().into_iter().map(|(k, _)| k).collect();
    assert_eq!(saturated, ["sms"]);
}

/// Held rows join their client's queue (`queue_sends`): dispatchers holding rows of
/// one client at once get slots that never meet, one spacing apart, after the queue's
/// last or from when the channel next sends; each client's queue is its own.
pub async fn racing_holds_queue_each_clients_rows_on_their_own_slots(s: DynStore) {
    let (holders, n, spacing) = (8u32, 3u32, 20_000i64);
    let barrier = Arc::new(tokio::sync::Barrier::new(holders as usize));
    let mut tasks = Vec::new();
    for _ in 0..holders {
        let (s, barrier) = (s.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            s.queue_sends("sms|a", 1_000_000, spacing, n).await.unwrap()
        }));
    }
    let mut firsts = Vec::new();
    for t in tasks {
        firsts.push(t.await.unwrap());
    }
    firsts.sort();
    let want: Vec<i64> = (0..i64::from(holders)).map(|i| 1_000_000 + i * spacing * i64::from(n)).collect();
    assert_eq!(firsts, want, "each holder its own run of slots, back to back");
    let last = want[want.len() - 1] + spacing * i64::from(n - 1);
    assert_eq!(s.queue_sends("sms|a", 0, spacing, 1).await.unwrap(), last + spacing, "behind its own queue");
    assert_eq!(s.queue_sends("sms|b", 1_000_000, spacing, 2).await.unwrap(), 1_000_000, "another client's is its own");
    assert_eq!(s.queue_sends("sms|b", 1_000_000, spacing, 1).await.unwrap(), 1_000_000 + 2 * spacing);
    // A queue that ran dry starts again when the channel next sends.
    assert_eq!(s.queue_sends("sms|b", 9_000_000, spacing, 1).await.unwrap(), 9_000_000);
    // Its last slot given back (its row left before its time): the next row takes it.
    assert!(!s.unqueue_send("sms|b", 8_000_000, spacing).await.unwrap(), "not its last: nothing");
    assert!(s.unqueue_send("sms|b", 9_000_000, spacing).await.unwrap());
    assert!(!s.unqueue_send("sms|b", 9_000_000, spacing).await.unwrap(), "once");
    assert_eq!(s.queue_sends("sms|b", 0, spacing, 1).await.unwrap(), 9_000_000);
    // A slot off the millisecond is named by the millisecond its row keeps.
    assert_eq!(s.queue_sends("sms|c", 1_000_400, 333_333, 1).await.unwrap(), 1_000_400);
    assert!(!s.unqueue_send("sms|c", 1_001_000, 333_333).await.unwrap(), "the next millisecond is not it");
    assert!(s.unqueue_send("sms|c", 1_000_000, 333_333).await.unwrap());
    assert_eq!(s.queue_sends("sms|c", 0, 333_333, 1).await.unwrap(), 1_000_400);
    let tails = |keys: &[&str]| {
        let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        let s = s.clone();
        async move {
            let mut got = s.queue_tails(&keys).await.unwrap();
            got.sort();
            got
        }
    };
    let want = vec![("sms|a".to_owned(), last + spacing), ("sms|c".to_owned(), 1_000_400)];
    assert_eq!(tails(&["sms|a", "sms|c", "sms|z"]).await, want, "a queue never used has none");
    assert!(tails(&[]).await.is_empty());
    // A queue is not a rate: it never shows as a saturated channel.
    assert!(s.saturated(at(0)).await.unwrap().is_empty());
}

/// An operator's rate changes: one per request id (a retry answers the first), each
/// channel's latest is its current one, a change back to the settings (no limit) is
/// kept as such, and the history reads newest first.
pub async fn rate_changes_are_kept_once_per_request_and_the_latest_wins(s: DynStore) {
    use haul_core::limit::{Limit, Rate};
    let limit = |r: &str, b: u32| Some(Limit::new(Rate::parse(r).unwrap(), b).unwrap());
    let change = |id: &str, channel: &str, l: Option<Limit>, t: u64| crate::RateChange {
        request_id: id.into(),
        channel: channel.into(),
        limit: l,
        actor: "dana@ops".into(),
        reason: format!("{id}: carrier asked"),
        changed_at: at(t),
    };
    assert!(s.current_rates().await.unwrap().is_empty());
    let first = change("r1", "sms", limit("10/s", 5), 1);
    assert_eq!(s.change_rate(&first).await.unwrap(), (first.clone(), true));
    // A retry, or one with other fields, answers the change as first made.
    assert_eq!(s.change_rate(&first).await.unwrap(), (first.clone(), false));
    assert_eq!(s.change_rate(&change("r1", "sms", limit("1/s", 1), 2)).await.unwrap(), (first, false));
    s.change_rate(&change("r2", "hero", limit("12/min", 1), 3)).await.unwrap();
    s.change_rate(&change("r3", "sms", None, 4)).await.unwrap();
    let current = s.current_rates().await.unwrap();
    assert_eq!(current, vec![change("r2", "hero", limit("12/min", 1), 3), change("r3", "sms", None, 4)]);
    let ids: Vec<String> = s.rate_changes(10).await.unwrap().into_iter().map(|c| c.request_id).collect();
    assert_eq!(ids, vec!["r3", "r2", "r1"]);
    assert_eq!(s.rate_changes(1).await.unwrap().len(), 1);
}

pub async fn mark_failed_with_retry_at_reschedules(s: DynStore) {
    commit(&s, "L1", "e1", 0, &["L1/a/send_sms"]).await;
    let c = s.pending(1, at(0), LEASE).await.unwrap().remove(0);
    s.mark_failed(&c.row.id, &c.token, "503 Service Unavailable", Some(at(2)), at(1)).await.unwrap();
    let r = s.get(&c.row.id).await.unwrap().unwrap();
    assert_eq!((r.status, r.attempts, r.due_at, r.claim_token), (OutboxStatus::Pending, 1, at(2), None));
    // The lease is given up, so the retry does not wait for it.
    assert_eq!(pending_ids(&s, 10, at(2)).await, vec![c.row.id]);
}

pub async fn mark_failed_without_retry_at_buries_the_row(s: DynStore) {
    commit(&s, "L1", "e1", 0, &["L1/a/send_sms", "L1/b/send_sms"]).await;
    let c = s.pending(1, at(0), LEASE).await.unwrap().remove(0);
    s.mark_failed(&c.row.id, &c.token, "400 bad number", None, at(5)).await.unwrap();
    let r = s.get(&c.row.id).await.unwrap().unwrap();
    assert_eq!((r.status, r.attempts), (OutboxStatus::Dead, 1));
    let dead: Vec<String> = s.dead(at(0), 10).await.unwrap().into_iter().map(|r| r.id).collect();
    assert_eq!(dead, vec![c.row.id.clone()]);
    assert!(s.dead(at(6), 10).await.unwrap().is_empty(), "`since` filters by death time");
    assert_eq!(s.count_by_status(OutboxStatus::Dead).await.unwrap(), 1);
    assert!(!pending_ids(&s, 10, at(1000)).await.contains(&c.row.id), "a dead row is never claimed");
}

pub async fn oldest_pending_row_is_reported(s: DynStore) {
    assert_eq!(s.oldest_pending_created_at().await.unwrap(), None);
    s.append(&load("L1"), vec![entry("e1")], 0, vec![row("L1/a/send_sms")], at(3)).await.unwrap();
    s.append(&load("L2"), vec![entry("e1")], 0, vec![row("L2/a/send_sms")], at(7)).await.unwrap();
    assert_eq!(s.oldest_pending_created_at().await.unwrap(), Some(at(3)));
    let c = s.pending(1, at(10), LEASE).await.unwrap().remove(0);
    assert_eq!(c.row.id, "L1/a/send_sms");
    s.mark_dispatched(&c.row.id, &c.token, "r", at(11)).await.unwrap();
    assert_eq!(s.oldest_pending_created_at().await.unwrap(), Some(at(7)));
}

pub async fn dead_rows_without_a_published_outcome_are_found(s: DynStore) {
    commit(&s, "L1", "e1", 0, &["L1/a/send_sms", "L1/b/send_sms", "L1/c/send_sms"]).await;
    let claims = s.pending(3, at(0), LEASE).await.unwrap();
    for c in &claims {
        s.mark_failed(&c.row.id, &c.token, "400", None, at(1)).await.unwrap();
    }
    s.mark_outcome_published("L1/b/send_sms", at(2)).await.unwrap();
    let ids: Vec<String> = s.dead_without_outcome(10).await.unwrap().into_iter().map(|r| r.id).collect();
    assert_eq!(ids, vec!["L1/a/send_sms", "L1/c/send_sms"]);
    assert_eq!(s.dead_without_outcome(1).await.unwrap().len(), 1);
    s.mark_outcome_published("L1/a/send_sms", at(3)).await.unwrap();
    s.mark_outcome_published("L1/a/send_sms", at(4)).await.unwrap();
    assert_eq!(s.dead_without_outcome(10).await.unwrap().len(), 1);
}

pub async fn dead_rows_of_one_type_are_found_since_a_time_in_bounds(s: DynStore) {
    let typed = |id: &str, t: ActionType| NewOutboxRow {
        id: id.into(),
        action_type: t,
        action: json!({"key": id}),
        trace: None,
    };
    let rows = vec![
        typed("L1/a/create_hero_task", ActionType::CreateHeroTask),
        typed("L1/b/send_sms", ActionType::SendSms),
        typed("L1/c/create_hero_task", ActionType::CreateHeroTask),
        typed("L1/d/create_hero_task", ActionType::CreateHeroTask),
        typed("L1/e/create_hero_task", ActionType::CreateHeroTask),
    ];
    s.append(&load("L1"), vec![entry("e1")], 0, rows, at(0)).await.unwrap();
    let claims = s.pending(10, at(0), LEASE).await.unwrap();
    // Buried one by one, a second apart (a before c before b before d); e stays pending.
    for (n, id) in ["L1/a/create_hero_task", "L1/c/create_hero_task", "L1/b/send_sms", "L1/d/create_hero_task"]
        .into_iter()
        .enumerate()
    {
        let c = claims.iter().find(|c| c.row.id == id).unwrap();
        s.mark_failed(id, &c.token, "400", None, at(10 + n as u64)).await.unwrap();
    }
    let e = claims.iter().find(|c| c.row.id == "L1/e/create_hero_task").unwrap();
    s.mark_failed(&e.row.id, &e.token, "503", Some(at(100)), at(20)).await.unwrap();
    let check = |t: ActionType, since: u64, limit: usize, want: &'static [&'static str]| {
        let s = s.clone();
        async move {
            let got: Vec<String> =
                s.dead_of_type(t, at(since), limit).await.unwrap().into_iter().map(|r| r.id).collect();
            assert_eq!(got, want, "{t} since +{since}s, limit {limit}");
        }
    };
    check(
        ActionType::CreateHeroTask,
        0,
        10,
        &["L1/a/create_hero_task", "L1/c/create_hero_task", "L1/d/create_hero_task"],
    )
    .await;
    check(ActionType::CreateHeroTask, 11, 10, &["L1/c/create_hero_task", "L1/d/create_hero_task"]).await;
    check(ActionType::CreateHeroTask, 0, 2, &["L1/a/create_hero_task", "L1/c/create_hero_task"]).await;
    check(ActionType::CreateHeroTask, 14, 10, &[]).await;
    check(ActionType::SendSms, 0, 10, &["L1/b/send_sms"]).await;
    check(ActionType::SetTimer, 0, 10, &[]).await;
    let row = s.dead_of_type(ActionType::SendSms, at(0), 1).await.unwrap().remove(0);
    assert_eq!(
        (row.status, row.last_failure.as_deref(), row.action),
        (OutboxStatus::Dead, Some("400"), json!({"key": "L1/b/send_sms"}))
    );
}

pub async fn a_deferred_dead_row_waits_and_never_holds_up_the_others(s: DynStore) {
    commit(&s, "L1", "e1", 0, &["L1/a/send_sms", "L1/b/send_sms", "L1/c/send_sms"]).await;
    for c in s.pending(3, at(0), LEASE).await.unwrap() {
        s.mark_failed(&c.row.id, &c.token, "400", None, at(1)).await.unwrap();
    }
    let due = |now| {
        let s = s.clone();
        async move {
            let rows = s.unsettled_due(now, 10).await.unwrap();
            rows.into_iter().map(|u| (u.row.id, u.settle_attempts)).collect::<Vec<_>>()
        }
    };
    let ids = |v: &[(&str, u32)]| v.iter().map(|(i, n)| (i.to_string(), *n)).collect::<Vec<_>>();
    // Just buried: due at once, oldest first.
    assert_eq!(due(at(1)).await, ids(&[("L1/a/send_sms", 0), ("L1/b/send_sms", 0), ("L1/c/send_sms", 0)]));
    // The oldest cannot be settled: put off, it leaves the way to the others.
    s.defer_settle("L1/a/send_sms", "queue down", at(10)).await.unwrap();
    assert_eq!(due(at(9)).await, ids(&[("L1/b/send_sms", 0), ("L1/c/send_sms", 0)]));
    assert_eq!(s.unsettled_due(at(9), 1).await.unwrap()[0].row.id, "L1/b/send_sms", "the limit counts due rows");
    let u = s.unsettled_due(at(10), 1).await.unwrap().remove(0);
    assert_eq!(
        (u.row.id.as_str(), u.settle_attempts, u.settle_due_at, u.settle_failure.as_deref()),
        ("L1/a/send_sms", 1, Some(at(10)), Some("queue down"))
    );
    assert_eq!(u.row.last_failure.as_deref(), Some("400"), "why it died stays");
    s.defer_settle("L1/a/send_sms", "queue still down", at(30)).await.unwrap();
    assert_eq!(due(at(29)).await, ids(&[("L1/b/send_sms", 0), ("L1/c/send_sms", 0)]));
    assert_eq!(due(at(30)).await[0], ("L1/a/send_sms".to_string(), 2));
    // Settled rows leave the sweep; deferring one changes nothing.
    s.mark_outcome_published("L1/a/send_sms", at(31)).await.unwrap();
    s.defer_settle("L1/a/send_sms", "late", at(40)).await.unwrap();
    assert_eq!(due(at(100)).await, ids(&[("L1/b/send_sms", 0), ("L1/c/send_sms", 0)]));
    // Only dead rows are deferred.
    commit(&s, "L2", "e1", 0, &["L2/a/send_sms"]).await;
    s.defer_settle("L2/a/send_sms", "x", at(40)).await.unwrap();
    let c = s.pending(1, at(41), LEASE).await.unwrap().remove(0);
    assert_eq!(c.row.id, "L2/a/send_sms", "a pending row is untouched");
}

fn alert(outbox_id: &str) -> Alert {
    Alert {
        kind: AlertKind::HeroChannelFailure,
        outbox_id: outbox_id.into(),
        load_id: load(crate::outbox_key_load(outbox_id)),
        action_type: ActionType::CreateHeroTask,
        failure: "HTTP 400".into(),
    }
}

pub async fn ops_alerts_are_kept_with_their_state_and_read_in_pages(s: DynStore) {
    use AlertState::*;
    let (a, b, c) = ("L1/e1/create_hero_task", "L2/e1/create_hero_task", "L3/e1/create_hero_task");
    // a: down twice, then delivered.
    assert!(s.record_ops_alert(&alert(a), Pending, Some("HTTP 503"), at(1)).await.unwrap());
    assert!(s.record_ops_alert(&alert(a), Pending, Some("timed out"), at(2)).await.unwrap());
    assert!(s.record_ops_alert(&alert(a), Delivered, None, at(3)).await.unwrap());
    // b: refused; c: delivered at once.
    assert!(s.record_ops_alert(&alert(b), Refused, Some("HTTP 422 bad kind"), at(1)).await.unwrap());
    assert!(s.record_ops_alert(&alert(c), Delivered, None, at(2)).await.unwrap());
    // Final states stay: a later send (a repeated sweep) is not recorded.
    assert!(!s.record_ops_alert(&alert(a), Refused, Some("HTTP 409"), at(4)).await.unwrap());
    assert!(!s.record_ops_alert(&alert(b), Delivered, None, at(4)).await.unwrap());
    assert!(!s.record_ops_alert(&alert(b), Pending, Some("HTTP 503"), at(4)).await.unwrap());

    let all = s.ops_alerts(&RowCursor::start(), 10).await.unwrap();
    let got: Vec<_> = all
        .iter()
        .map(|r| (r.outbox_id.as_str(), r.state, r.sends, r.last_error.as_deref(), r.raised_at, r.updated_at))
        .collect();
    assert_eq!(
        got,
        vec![
            (a, Delivered, 3, Some("timed out"), at(1), at(3)),
            (b, Refused, 1, Some("HTTP 422 bad kind"), at(1), at(1)),
            (c, Delivered, 1, None, at(2), at(2)),
        ]
    );
    let first = &all[0];
    assert_eq!(
        (first.load_id.as_str(), first.kind, first.action_type, first.failure.as_str()),
        ("L1", AlertKind::HeroChannelFailure, ActionType::CreateHeroTask, "HTTP 400")
    );
    // Pages of one: the same alerts, in the same order.
    let mut paged = Vec::new();
    let mut after = RowCursor::start();
    loop {
        let page = s.ops_alerts(&after, 1).await.unwrap();
        let Some(last) = page.last() else { break };
        after = last.cursor();
        paged.extend(page);
        assert!(paged.len() <= 3);
    }
    assert_eq!(paged, all);
    assert!(s.ops_alerts(&RowCursor::start(), 0).await.unwrap().is_empty());

    // The operators' page: newest first, in pages of two, the same alerts reversed.
    let newest = s.ops_alerts_page(None, None, 2).await.unwrap();
    let ids: Vec<&str> = newest.iter().map(|r| r.alert.outbox_id.as_str()).collect();
    assert_eq!(ids, [c, b]);
    let rest = s.ops_alerts_page(None, Some(&newest[1].alert.cursor()), 2).await.unwrap();
    // These alerts' rows are not in the outbox (as after `haul prune`): out of the inbox.
    let gone = InboxMark { state: haul_core::InboxState::Dismissed, by: Some("haul prune".into()), at: None };
    assert_eq!(rest, [InboxAlert { alert: all[0].clone(), inbox: gone }]);
    assert!(s.ops_alerts_page(Some(haul_core::InboxState::Open), None, 10).await.unwrap().is_empty());
    assert!(s.ops_alerts_page(None, Some(&rest[0].alert.cursor()), 2).await.unwrap().is_empty());
}

// ---------------------------------------------------------------------------------
// TimerStore

fn timer(l: &str, n: u32) -> TimerId {
    TimerId::parse(&format!("tmr:{l}:ask:eta_request:p{n}:1")).unwrap()
}

pub async fn schedule_twice_gives_one_timer(s: DynStore) {
    let t = timer("L1", 1);
    assert!(s.schedule(&t, at(1800), at(0)).await.unwrap());
    assert!(!s.schedule(&t, at(9999), at(5)).await.unwrap());
    let timers = s.timers_for_load(&load("L1")).await.unwrap();
    assert_eq!(timers.len(), 1);
    assert_eq!((timers[0].fire_at, timers[0].created_at, timers[0].status), (at(1800), at(0), TimerStatus::Scheduled));
    assert_eq!(s.due(at(10_000), 10).await.unwrap().len(), 1);
}

pub async fn due_honours_time_and_limit(s: DynStore) {
    for n in 0..5u32 {
        s.schedule(&timer("L1", n), at(100 + u64::from(n)), at(0)).await.unwrap();
    }
    assert!(s.due(at(99), 10).await.unwrap().is_empty());
    let ids = |v: Vec<crate::Timer>| v.into_iter().map(|t| t.timer_id).collect::<Vec<_>>();
    assert_eq!(ids(s.due(at(100), 10).await.unwrap()), vec![timer("L1", 0)]);
    assert_eq!(ids(s.due(at(103), 2).await.unwrap()), vec![timer("L1", 0), timer("L1", 1)]);
    assert_eq!(s.due(at(1000), 10).await.unwrap().len(), 5);
    assert!(s.mark_fired(&timer("L1", 0), at(1000)).await.unwrap());
    assert_eq!(ids(s.due(at(1000), 1).await.unwrap()), vec![timer("L1", 1)], "fired timers are not due");
}

pub async fn canceled_timer_is_not_due(s: DynStore) {
    let t = timer("L1", 1);
    s.schedule(&t, at(10), at(0)).await.unwrap();
    assert!(s.cancel(&t, at(5)).await.unwrap());
    assert!(!s.cancel(&t, at(6)).await.unwrap(), "cancel is idempotent");
    assert!(s.due(at(100), 10).await.unwrap().is_empty());
    let got = s.get_timer(&t).await.unwrap().unwrap();
    assert_eq!((got.status, got.canceled_at), (TimerStatus::Canceled, Some(at(5))));
    assert!(!s.mark_fired(&t, at(100)).await.unwrap(), "a canceled timer does not become fired");
}

pub async fn cancel_before_schedule_stays_canceled(s: DynStore) {
    // The dispatcher may apply a cancel_timer row before its set_timer row.
    let t = timer("L1", 1);
    s.cancel(&t, at(1)).await.unwrap();
    assert!(!s.schedule(&t, at(10), at(2)).await.unwrap());
    assert!(s.due(at(100), 10).await.unwrap().is_empty());
    assert_eq!(s.get_timer(&t).await.unwrap().unwrap().status, TimerStatus::Canceled);
}

/// A decision's timers committed with it (`TimerRoute::WithDecision`): written as
/// `schedule` and `cancel` write them, in the append's transaction, or not at all.
pub async fn an_append_commits_its_timer_writes_or_none(s: DynStore) {
    use haul_core::derived::TimerWrite::{Cancel, Schedule};
    let decision = |id: &str, writes: Vec<haul_core::derived::TimerWrite>| {
        let mut e = entry(id);
        e.derived.timers = writes;
        e
    };
    let state = async |n: u32| s.get_timer(&timer("L1", n)).await.unwrap().map(|t| (t.status, t.fire_at));
    let first = || {
        vec![
            entry("e1"),
            decision(
                "dec:e1",
                vec![
                    Schedule { timer_id: timer("L1", 1), fire_at: at(100) },
                    Schedule { timer_id: timer("L1", 2), fire_at: at(200) },
                    Cancel { timer_id: timer("L1", 3) },
                ],
            ),
        ]
    };
    // Refused appends write no timer.
    let err = s.append(&load("L1"), first(), 5, vec![], at(1)).await.unwrap_err();
    assert!(matches!(err, AppendError::ConcurrencyConflict(_)), "{err:?}");
    let mut twice = first();
    twice.push(entry("e1"));
    let err = s.append(&load("L1"), twice, 0, vec![], at(1)).await.unwrap_err();
    assert!(matches!(err, AppendError::DuplicateEntry(_)), "{err:?}");
    assert_eq!((state(1).await, state(2).await, state(3).await), (None, None, None));
    s.append(&load("L1"), first(), 0, vec![], at(1)).await.unwrap();
    assert_eq!(state(1).await, Some((TimerStatus::Scheduled, at(100))));
    assert_eq!(state(2).await, Some((TimerStatus::Scheduled, at(200))));
    assert_eq!(
        state(3).await.map(|(status, _)| status),
        Some(TimerStatus::Canceled),
        "a cancel with nothing scheduled"
    );
    assert_eq!(s.get_timer(&timer("L1", 1)).await.unwrap().unwrap().created_at, at(1));
    // The pump fires timer 2; the next decision cancels 1 and 2 and schedules 3.
    assert!(s.mark_fired(&timer("L1", 2), at(200)).await.unwrap());
    let writes = vec![
        Cancel { timer_id: timer("L1", 1) },
        Cancel { timer_id: timer("L1", 2) },
        Cancel { timer_id: timer("L1", 1) },
        Schedule { timer_id: timer("L1", 3), fire_at: at(300) },
    ];
    s.append(&load("L1"), vec![entry("e2"), decision("dec:e2", writes)], 2, vec![], at(201)).await.unwrap();
    let one = s.get_timer(&timer("L1", 1)).await.unwrap().unwrap();
    assert_eq!((one.status, one.canceled_at), (TimerStatus::Canceled, Some(at(201))));
    assert_eq!(state(2).await.map(|(status, _)| status), Some(TimerStatus::Fired), "a fired timer stays fired");
    assert_eq!(state(3).await.map(|(status, _)| status), Some(TimerStatus::Canceled), "a late schedule stays a noop");
    assert!(s.due(at(1000), 10).await.unwrap().is_empty());
    // Through the acking append too.
    publish(&s, "L1", "e3").await;
    let m = receive_one(&s, at(201)).await;
    let writes = vec![Schedule { timer_id: timer("L1", 4), fire_at: at(400) }];
    let (_, acked) = s
        .append_acking(&load("L1"), vec![entry("e3"), decision("dec:e3", writes)], 4, vec![], &m.receipt, at(202))
        .await
        .unwrap();
    assert!(acked);
    assert_eq!(state(4).await, Some((TimerStatus::Scheduled, at(400))));
}

pub async fn mark_fired_is_idempotent(s: DynStore) {
    let t = timer("L1", 1);
    s.schedule(&t, at(10), at(0)).await.unwrap();
    assert!(s.mark_fired(&t, at(11)).await.unwrap());
    assert!(!s.mark_fired(&t, at(12)).await.unwrap());
    let got = s.get_timer(&t).await.unwrap().unwrap();
    assert_eq!((got.status, got.fired_at), (TimerStatus::Fired, Some(at(11))));
    assert!(!s.cancel(&t, at(13)).await.unwrap(), "a fired timer stays fired");
}

// ---------------------------------------------------------------------------------
// LoadLock

pub async fn load_lock_excludes_a_second_holder(s: DynStore) {
    let ttl = Duration::from_secs(300);
    let first = s.try_lock(&load("L1"), ttl, at(0)).await.unwrap().expect("free lock is taken");
    assert!(s.try_lock(&load("L1"), ttl, at(1)).await.unwrap().is_none(), "held by the first");
    let other = s.try_lock(&load("L2"), ttl, at(1)).await.unwrap().expect("other loads are free");
    first.release().await.unwrap();
    let again = s.try_lock(&load("L1"), ttl, at(2)).await.unwrap().expect("released lock is free");
    again.release().await.unwrap();
    other.release().await.unwrap();
}

// ---------------------------------------------------------------------------------
// DeliveryLog (record mode)

pub async fn recorded_delivery_is_deduplicated_by_channel_and_key(s: DynStore) {
    let body = json!({"to": "+15555550100", "body": "ETA?"});
    let (r1, new1) = s.record_delivery("sms", "L1/a/send_sms", &load("L1"), &body, at(1)).await.unwrap();
    let (r2, new2) = s.record_delivery("sms", "L1/a/send_sms", &load("L1"), &json!({"other": 1}), at(2)).await.unwrap();
    assert!(new1 && !new2);
    assert_eq!(r1, r2, "a repeated key returns the first receipt");
    let (r3, new3) = s.record_delivery("hero", "L1/a/send_sms", &load("L1"), &body, at(3)).await.unwrap();
    assert!(new3 && r3 != r1, "keys are per channel");
    s.record_delivery("sms", "L2/b/send_sms", &load("L2"), &body, at(4)).await.unwrap();
    let mine = s.deliveries(Some(&load("L1")), 10).await.unwrap();
    assert_eq!(mine.len(), 2);
    assert_eq!((mine[0].channel.as_str(), &mine[0].payload, mine[0].created_at), ("sms", &body, at(1)));
    assert_eq!(s.deliveries(None, 10).await.unwrap().len(), 3);
    assert_eq!(s.deliveries(None, 1).await.unwrap().len(), 1);
}

// ---------------------------------------------------------------------------------
// LoadIndex

pub async fn loads_are_found_by_active_driver_phone(s: DynStore) {
    let phone = "+15555550100";
    // Each append writes what its load_updates change, in its transaction.
    let versions = std::sync::Mutex::new(std::collections::HashMap::<String, u64>::new());
    let update = async |l: &str, id: &str, payload: serde_json::Value| {
        let v = versions.lock().unwrap().get(l).copied().unwrap_or(0);
        let entries = vec![NewEntry::stored(id, "load_update", payload), entry(&format!("dec:{id}"))];
        let v = s.append(&load(l), entries, v, vec![], at(v)).await.unwrap();
        versions.lock().unwrap().insert(l.to_owned(), v);
    };
    update("L1", "u1", json!({"driver_phone": phone, "stage": "in_transit"})).await;
    update("L2", "u1", json!({"driver_phone": phone})).await;
    update("L3", "u1", json!({"driver_phone": "+15555550111"})).await;
    // An append that changes no fact (an SMS) leaves them.
    s.append(&load("L1"), vec![entry("sms_1"), entry("dec:sms_1")], 2, vec![], at(1)).await.unwrap();
    versions.lock().unwrap().insert("L1".into(), 4);
    let mut got = s.loads_by_phone(phone).await.unwrap();
    got.sort();
    assert_eq!(got, vec![load("L1"), load("L2")]);
    // Delivered: no longer active; the phone a stage-only update leaves is kept.
    update("L2", "u2", json!({"stage": "delivered"})).await;
    assert_eq!(s.loads_by_phone(phone).await.unwrap(), vec![load("L1")]);
    update("L3", "u2", json!({"stage": "at_pickup"})).await;
    assert_eq!(s.loads_by_phone("+15555550111").await.unwrap(), vec![load("L3")]);
    // A new phone replaces the old.
    update("L1", "u2", json!({"driver_phone": "+15555550122"})).await;
    assert!(s.loads_by_phone(phone).await.unwrap().is_empty());
    assert_eq!(s.loads_by_phone("+15555550122").await.unwrap(), vec![load("L1")]);
    assert!(s.loads_by_phone("' OR 1=1 --").await.unwrap().is_empty());
}

/// A load's client is kept with its facts by the append of the load_update naming it
/// (a later one that names another replaces it, one naming none leaves it), and read
/// back for a batch of loads, those with none left out.
pub async fn a_loads_client_is_kept_with_its_facts(s: DynStore) {
    let update = async |l: &str, v: u64, payload: serde_json::Value| {
        let id = format!("u{v}");
        let entries = vec![NewEntry::stored(&id, "load_update", payload), entry(&format!("dec:{id}"))];
        s.append(&load(l), entries, v, vec![], at(v)).await.unwrap();
    };
    update("L1", 0, json!({"client": "acme", "stage": "in_transit"})).await;
    update("L2", 0, json!({"client": "bolt"})).await;
    update("L3", 0, json!({"stage": "in_transit"})).await;
    let loads = [load("L1"), load("L2"), load("L3"), load("L9")];
    let clients = async || {
        let mut got = s.clients_of(&loads).await.unwrap();
        got.sort();
        got.into_iter().map(|(l, c)| format!("{l}={c}")).collect::<Vec<_>>()
    };
    assert_eq!(clients().await, ["L1=acme", "L2=bolt"]);
    update("L1", 2, json!({"stage": "at_pickup"})).await;
    update("L2", 2, json!({"client": "acme"})).await;
    update("L3", 2, json!({"client": "bolt", "driver_phone": "+15555550100"})).await;
    assert_eq!(clients().await, ["L1=acme", "L2=acme", "L3=bolt"]);
    assert!(s.clients_of(&[]).await.unwrap().is_empty());
    assert_eq!(s.loads_by_phone("+15555550100").await.unwrap(), vec![load("L3")], "the phone kept beside it");
}

pub async fn unmatched_sms_is_kept_once(s: DynStore) {
    let sms = |sid: &str, t: u64| UnmatchedSms {
        message_sid: sid.into(),
        from: "+15555550199".into(),
        to: "+15555550000".into(),
        body: "hello'); DROP TABLE unmatched_sms; --".into(),
        received_at: at(t),
        reason: format!("no active load ({t})"),
    };
    assert!(s.record_unmatched_sms(&sms("SM1", 1)).await.unwrap());
    assert!(!s.record_unmatched_sms(&sms("SM1", 2)).await.unwrap());
    assert!(s.record_unmatched_sms(&sms("SM2", 3)).await.unwrap());
    let got = s.unmatched_sms(10).await.unwrap();
    assert_eq!(got.iter().map(|u| u.message_sid.as_str()).collect::<Vec<_>>(), vec!["SM2", "SM1"]);
    assert_eq!(got[1], sms("SM1", 1));
}

/// The consent ledger: an append's inbound STOP opts its sender's phone out, whichever
/// load it reached, in the append's transaction; a second STOP keeps the first; START
/// clears it; an opt-in of a phone that never opted out is not kept. The webhook's
/// record of a STOP that reached no load does the same. Read back for a batch of
/// phones, and in pages, the latest opt-out first.
pub async fn the_consent_ledger_keeps_each_phones_last_stop_or_start(s: DynStore) {
    let (a, b, c) = ("+15555550101", "+15555550102", "+15555550103");
    let sms =
        |id: &str, from: &str, body: &str| NewEntry::stored(id, "inbound_sms", json!({"from": from, "body": body}));
    let append = async |l: &str, v: u64, e: NewEntry, t: u64| {
        let dec = entry(&format!("dec:{}", e.entry_id));
        s.append(&load(l), vec![e, dec], v, vec![], at(t)).await.unwrap()
    };
    let opted = async |phones: &[&str]| {
        let phones: Vec<String> = phones.iter().map(|p| p.to_string()).collect();
        let mut got = s.opted_out_among(&phones).await.unwrap();
        got.sort_by(|x, y| x.phone.cmp(&y.phone));
        got.into_iter()
            .map(|c| (c.phone, c.event_id, c.load_id.map(|l| l.to_string()), c.changed_at))
            .collect::<Vec<_>>()
    };
    let kept = |phone: &str, event: &str, l: Option<&str>, t: u64| {
        (phone.to_owned(), event.to_owned(), l.map(str::to_owned), at(t))
    };
    append("L1", 0, sms("e1", a, " STOP "), 1).await;
    append("L2", 0, sms("e1", a, "stop!"), 2).await;
    append("L2", 2, sms("e2", b, "YES"), 3).await;
    append("L2", 4, sms("e3", c, "running late, eta 5"), 4).await;
    assert_eq!(opted(&[a, b, c]).await, vec![kept(a, "e1", Some("L1"), 1)], "the first STOP is kept");
    assert!(s.opted_out_among(&[]).await.unwrap().is_empty());

    let no_load =
        SmsConsent { phone: b.into(), opted_out: true, event_id: "sms:SM2".into(), load_id: None, changed_at: at(5) };
    s.record_consent(&no_load).await.unwrap();
    s.record_consent(&SmsConsent { event_id: "sms:SM3".into(), changed_at: at(6), ..no_load.clone() }).await.unwrap();
    assert_eq!(opted(&[a, b]).await, vec![kept(a, "e1", Some("L1"), 1), kept(b, "sms:SM2", None, 5)]);

    let first = s.opted_out_page(None, 1).await.unwrap();
    assert_eq!(first, vec![no_load.clone()], "the latest opt-out first");
    let cursor = RowCursor { created_at: first[0].changed_at, id: first[0].phone.clone() };
    let rest = s.opted_out_page(Some(&cursor), 10).await.unwrap();
    assert_eq!(rest.iter().map(|c| c.phone.as_str()).collect::<Vec<_>>(), [a]);

    // START on any load of the phone's clears it; the webhook's does too.
    append("L1", 2, sms("e2", a, "Start"), 7).await;
    assert_eq!(opted(&[a, b]).await, vec![kept(b, "sms:SM2", None, 5)]);
    s.record_consent(&SmsConsent { opted_out: false, event_id: "sms:SM4".into(), changed_at: at(8), ..no_load })
        .await
        .unwrap();
    assert!(opted(&[a, b, c]).await.is_empty());
    assert!(s.opted_out_page(None, 10).await.unwrap().is_empty());
    // Opted out again: the new STOP is the one kept.
    append("L2", 6, sms("e4", a, "UNSUBSCRIBE"), 9).await;
    assert_eq!(opted(&[a]).await, vec![kept(a, "e4", Some("L2"), 9)]);
}

/// An LLM decision's append adds its tokens and cost to its client's UTC day and keeps
/// its prompts once by hash, in its transaction (a refused append adds nothing); a
/// decision that found the day's budget spent marks the day capped, the first time
/// kept. Days read back one by one and in pages, the latest day first.
pub async fn model_spend_is_added_to_its_clients_day_with_its_prompts(s: DynStore) {
    let decision = |id: &str, llm: Value, budget: Value, prompts: &[(&str, &str)]| {
        let mut payload = json!({"decision_id": format!("dec:{id}"), "event_id": id, "decided_at": "2026-03-02T07:00:00Z",
            "decider": "llm:m", "filtered": false, "needs_hero_task": false, "rationale": "r", "actions": []});
        if !llm.is_null() {
            payload["llm"] = llm;
        }
        if !budget.is_null() {
            payload["budget"] = budget;
        }
        let mut e = NewEntry::stored(format!("dec:{id}"), "decision_recorded", payload);
        e.derived.prompts = prompts.iter().map(|(h, t)| (h.to_string(), t.to_string())).collect();
        e
    };
    let usage = |client: Option<&str>, input: u64, output: u64, cost: u64| {
        let mut u = json!({"model": "m", "input_tokens": input, "output_tokens": output, "cost_micro_usd": cost,
            "prompt_hash": "h-sys", "input_hash": "h-in"});
        if let Some(c) = client {
            u["client"] = json!(c);
        }
        u
    };
    let append = async |l: &str, v: u64, id: &str, d: NewEntry, t: u64| {
        let mut d = d;
        if t >= 86_400 {
            // decided the next day
            d.payload["decided_at"] = json!("2026-03-03T07:00:00Z");
            d = NewEntry::stored(d.entry_id.clone(), d.kind.clone(), d.payload.clone());
        }
        s.append(&load(l), vec![entry(id), d], v, vec![], at(t)).await
    };
    let day = async |client: &str, day: &str| {
        let d = s.client_day_spend(client, day).await.unwrap();
        (d.spend.input_tokens, d.spend.output_tokens, d.spend.cost_micro_usd, d.spend.calls, d.capped_at)
    };
    assert_eq!(day("acme", "2026-03-02").await, (0, 0, 0, 0, None), "no spend yet");

    append(
        "L1",
        0,
        "e1",
        decision("e1", usage(Some("acme"), 100, 20, 500), Value::Null, &[("h-sys", "system"), ("h-in1", "input 1")]),
        1,
    )
    .await
    .unwrap();
    append(
        "L2",
        0,
        "e1",
        decision("e1", usage(Some("acme"), 10, 2, 50), Value::Null, &[("h-sys", "other text"), ("h-in2", "input 2")]),
        2,
    )
    .await
    .unwrap();
    append("L3", 0, "e1", decision("e1", usage(None, 7, 1, 3), Value::Null, &[]), 3).await.unwrap();
    // A refused append (a stale version) adds nothing and keeps no prompt.
    let refused =
        append("L1", 0, "e9", decision("e9", usage(Some("acme"), 1000, 0, 9999), Value::Null, &[("h-in9", "x")]), 4)
            .await;
    assert!(matches!(refused, Err(AppendError::ConcurrencyConflict(_))), "{refused:?}");
    assert_eq!(day("acme", "2026-03-02").await, (110, 22, 550, 2, None));
    assert_eq!(day("", "2026-03-02").await, (7, 1, 3, 1, None), "a load without a client: ''");
    assert_eq!(s.prompt("h-sys").await.unwrap().as_deref(), Some("system"), "the first text of a hash is kept");
    assert_eq!(s.prompt("h-in2").await.unwrap().as_deref(), Some("input 2"));
    assert_eq!(s.prompt("h-in9").await.unwrap(), None);

    // The budget found spent: the day is capped, at the first decision that said so.
    let capped =
        json!({"scope": "client_day", "client": "acme", "unit": "tokens", "limit": 100, "spent": 132, "first": true});
    append("L1", 2, "e2", decision("e2", Value::Null, capped.clone(), &[]), 5).await.unwrap();
    append("L2", 2, "e2", decision("e2", Value::Null, capped, &[]), 6).await.unwrap();
    assert_eq!(day("acme", "2026-03-02").await, (110, 22, 550, 2, Some(at(5))));
    // The next day starts at zero.
    append("L1", 4, "e3", decision("e3", usage(Some("acme"), 1, 1, 1), Value::Null, &[]), 86_400).await.unwrap();
    assert_eq!(day("acme", "2026-03-03").await, (1, 1, 1, 1, None));

    let page = async |client: Option<&str>, after: Option<(&str, &str)>, limit: usize| {
        let got = s.spend_page("2026-03-01", "2026-03-03", client, after, limit).await.unwrap();
        got.into_iter().map(|d| (d.day, d.client)).collect::<Vec<_>>()
    };
    let kept = |d: &str, c: &str| (d.to_owned(), c.to_owned());
    let all = vec![kept("2026-03-03", "acme"), kept("2026-03-02", ""), kept("2026-03-02", "acme")];
    assert_eq!(page(None, None, 10).await, all);
    assert_eq!(page(None, None, 2).await, all[..2].to_vec());
    assert_eq!(page(None, Some(("2026-03-02", "")), 10).await, all[2..].to_vec());
    assert_eq!(page(Some("acme"), None, 10).await, vec![all[0].clone(), all[2].clone()]);
    assert!(s.spend_page("2026-03-04", "2026-03-09", None, None, 10).await.unwrap().is_empty());
}

/// Delivery reports: kept once per message and status (Twilio repeats them), read back
/// per load and, for those that matched no row, apart, the latest first.
pub async fn delivery_reports_are_kept_once_per_message_and_status(s: DynStore) {
    let report = |sid: &str, status: &str, l: Option<&str>, t: u64| SmsReport {
        message_sid: sid.into(),
        status: status.into(),
        error_code: (status != "delivered").then(|| "30006".to_owned()),
        outbox_id: l.map(|l| format!("{l}/e1/send_sms")),
        load_id: l.map(load),
        reason: l.is_none().then(|| "no outbox row has its key".to_owned()),
        reported_at: at(t),
    };
    assert!(s.record_sms_report(&report("SM1", "delivered", Some("L1"), 1)).await.unwrap());
    assert!(!s.record_sms_report(&report("SM1", "delivered", Some("L1"), 2)).await.unwrap(), "a repeat");
    assert!(s.record_sms_report(&report("SM2", "undelivered", Some("L1"), 3)).await.unwrap());
    assert!(s.record_sms_report(&report("SM3", "delivered", Some("L2"), 4)).await.unwrap());
    assert!(s.record_sms_report(&report("SM9", "failed", None, 5)).await.unwrap());
    assert!(s.record_sms_report(&report("SM8", "delivered", None, 6)).await.unwrap());
    // One message reported on a URL that named no row, then on its own row: both kept.
    assert!(s.record_sms_report(&report("SM3", "delivered", None, 7)).await.unwrap());
    assert!(!s.record_sms_report(&report("SM3", "delivered", None, 8)).await.unwrap());
    let l1 = s.sms_reports_for_load(&load("L1"), 10).await.unwrap();
    assert_eq!(l1, vec![report("SM2", "undelivered", Some("L1"), 3), report("SM1", "delivered", Some("L1"), 1)]);
    assert_eq!(s.sms_reports_for_load(&load("L1"), 1).await.unwrap().len(), 1);
    assert!(s.sms_reports_for_load(&load("L3"), 10).await.unwrap().is_empty());
    let apart = s.unmatched_sms_reports(10).await.unwrap();
    let want =
        [report("SM3", "delivered", None, 7), report("SM8", "delivered", None, 6), report("SM9", "failed", None, 5)];
    assert_eq!(apart, want);
    assert_eq!(s.sms_reports_for_load(&load("L2"), 10).await.unwrap(), [report("SM3", "delivered", Some("L2"), 4)]);
    assert_eq!(s.unmatched_sms_reports(1).await.unwrap().len(), 1);
    // Pruned by age, as the rows they report on: the oldest first, a batch at a time.
    let pruned = |reports| PruneReport { reports, ..PruneReport::default() };
    assert_eq!(s.prune(at(4), 1).await.unwrap(), pruned(1));
    assert_eq!(s.prune(at(4), 10).await.unwrap(), pruned(1));
    assert_eq!(s.sms_reports_for_load(&load("L1"), 10).await.unwrap(), []);
    assert_eq!(s.prune(at(6), 10).await.unwrap(), pruned(2));
    assert_eq!(s.unmatched_sms_reports(10).await.unwrap(), want[..2]);
}

pub async fn message_sids_are_taken_once_across_loads(s: DynStore) {
    let (l1, l2) = (SmsRoute::Load(load("L1")), SmsRoute::Load(load("L2")));
    assert_eq!(s.claim_message_sid("SM1", &l1, at(1)).await.unwrap(), SidClaim::New);
    // Later claims, for any route, find the first one's.
    assert_eq!(s.claim_message_sid("SM1", &l1, at(2)).await.unwrap(), SidClaim::Taken(l1.clone()));
    assert_eq!(s.claim_message_sid("SM1", &l2, at(3)).await.unwrap(), SidClaim::Taken(l1.clone()));
    assert_eq!(s.claim_message_sid("SM1", &SmsRoute::Unmatched, at(4)).await.unwrap(), SidClaim::Taken(l1.clone()));
    assert_eq!(s.claim_message_sid("SM2", &SmsRoute::Unmatched, at(5)).await.unwrap(), SidClaim::New);
    assert_eq!(s.claim_message_sid("SM2", &l2, at(6)).await.unwrap(), SidClaim::Taken(SmsRoute::Unmatched));
    // Sids are compared whole and exactly.
    assert_eq!(s.claim_message_sid("sm1", &l2, at(7)).await.unwrap(), SidClaim::New);
    assert_eq!(s.claim_message_sid("SM1' OR '1'='1", &l2, at(8)).await.unwrap(), SidClaim::New);
}

fn unmatched(sid: &str, t: u64) -> UnmatchedSms {
    UnmatchedSms {
        message_sid: sid.into(),
        from: "+15555550100".into(),
        to: "+15555550000".into(),
        body: "ETA 9:15".into(),
        received_at: at(t),
        reason: "no single active load has this driver phone".into(),
    }
}

pub async fn an_unmatched_sms_is_assigned_to_one_load_by_one_event(s: DynStore) {
    assert_eq!(s.assign_unmatched_sms("SM1", &load("L1"), "op:r1", at(1)).await.unwrap(), SmsAssignment::NotFound);
    s.record_unmatched_sms(&unmatched("SM1", 1)).await.unwrap();
    s.record_unmatched_sms(&unmatched("SM2", 2)).await.unwrap();
    let first = s.assign_unmatched_sms("SM1", &load("L1"), "op:r1", at(3)).await.unwrap();
    assert_eq!(first, SmsAssignment::Assigned(unmatched("SM1", 1)));
    // The same request again (a retry) goes on; anyone else finds it taken.
    assert_eq!(s.assign_unmatched_sms("SM1", &load("L1"), "op:r1", at(4)).await.unwrap(), first);
    let taken = SmsAssignment::Taken { load_id: load("L1"), event_id: "op:r1".into() };
    assert_eq!(s.assign_unmatched_sms("SM1", &load("L1"), "op:r2", at(5)).await.unwrap(), taken);
    assert_eq!(s.assign_unmatched_sms("SM1", &load("L2"), "op:r1", at(6)).await.unwrap(), taken);
    // Sids are compared whole; the other SMS is still free; the list still shows both.
    assert_eq!(s.assign_unmatched_sms("sm1", &load("L2"), "op:r3", at(7)).await.unwrap(), SmsAssignment::NotFound);
    let second = s.assign_unmatched_sms("SM2", &load("L2"), "op:r3", at(8)).await.unwrap();
    assert_eq!(second, SmsAssignment::Assigned(unmatched("SM2", 2)));
    assert_eq!(s.unmatched_sms(10).await.unwrap().len(), 2);
}

pub async fn an_assigned_sms_moves_once_per_event(s: DynStore) {
    let mv = |to: &str, event: &str, t: u64| {
        let (s, to, event) = (s.clone(), load(to), event.to_owned());
        async move { s.move_assigned_sms("SM1", &to, &event, at(t)).await.unwrap() }
    };
    assert_eq!(mv("L2", "op:m1", 1).await, SmsMove::NotFound);
    s.record_unmatched_sms(&unmatched("SM1", 1)).await.unwrap();
    assert_eq!(mv("L2", "op:m1", 2).await, SmsMove::Unassigned);
    s.assign_unmatched_sms("SM1", &load("L1"), "op:r1", at(3)).await.unwrap();
    assert_eq!(mv("L1", "op:m1", 4).await, SmsMove::Held { event_id: "op:r1".into() });
    let moved = SmsMove::Moved { from: load("L1"), sms: unmatched("SM1", 1) };
    assert_eq!(mv("L2", "op:m1", 5).await, moved);
    // A retry finds its own move, and where from; the SMS is the new load's.
    assert_eq!(mv("L2", "op:m1", 6).await, moved);
    let taken = SmsAssignment::Taken { load_id: load("L2"), event_id: "op:m1".into() };
    assert_eq!(s.assign_unmatched_sms("SM1", &load("L1"), "op:r1", at(7)).await.unwrap(), taken);
    // Moved on by another request: a late retry of the first moves nothing.
    assert_eq!(mv("L3", "op:m2", 8).await, SmsMove::Moved { from: load("L2"), sms: unmatched("SM1", 1) });
    assert_eq!(mv("L2", "op:m1", 9).await, SmsMove::Taken { load_id: load("L3"), event_id: "op:m2".into() });
    assert_eq!(mv("L3", "op:m3", 10).await, SmsMove::Held { event_id: "op:m2".into() });
    // A dismissed SMS goes to no load.
    s.record_unmatched_sms(&unmatched("SM2", 2)).await.unwrap();
    s.dismiss_unmatched_sms("SM2", "ops1", "spam", at(3)).await.unwrap();
    let dismissed = s.move_assigned_sms("SM2", &load("L2"), "op:m4", at(11)).await.unwrap();
    assert_eq!(dismissed, SmsMove::Dismissed { by: "ops1".into() });
}

/// Moves of one SMS to different loads at once: each is taken in turn, and each one's
/// `from` is the load the one before left it on, so every load it passed through is
/// told once.
pub async fn racing_moves_of_one_sms_take_turns(s: DynStore) {
    s.record_unmatched_sms(&unmatched("SMmv", 1)).await.unwrap();
    s.assign_unmatched_sms("SMmv", &load("L0"), "op:r0", at(1)).await.unwrap();
    let movers = 6;
    let barrier = Arc::new(tokio::sync::Barrier::new(movers));
    let mut tasks = Vec::new();
    for c in 1..=movers {
        let (s, barrier) = (s.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let to = load(&format!("L{c}"));
            (to.clone(), s.move_assigned_sms("SMmv", &to, &format!("op:m{c}"), at(2)).await.unwrap())
        }));
    }
    let mut froms = Vec::new();
    let mut tos = std::collections::BTreeSet::new();
    for t in tasks {
        let (to, got) = t.await.unwrap();
        let SmsMove::Moved { from, .. } = got else { panic!("{to}: {got:?}") };
        froms.push(from);
        tos.insert(to);
    }
    // A chain from L0: every from is L0 or a load moved to, each once.
    let mut seen = std::collections::BTreeSet::new();
    for f in &froms {
        assert!(f.as_str() == "L0" || tos.contains(f), "{froms:?}");
        assert!(seen.insert(f.clone()), "{f} left twice: {froms:?}");
    }
    assert!(seen.contains(&load("L0")), "{froms:?}");
}

pub async fn racing_assignments_of_one_sms_have_one_winner(s: DynStore) {
    s.record_unmatched_sms(&unmatched("SMrace", 1)).await.unwrap();
    let assigners = 8;
    let barrier = Arc::new(tokio::sync::Barrier::new(assigners));
    let mut tasks = Vec::new();
    for c in 0..assigners {
        let (s, barrier) = (s.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let l = load(&format!("L{c}"));
            barrier.wait().await;
            (l.clone(), s.assign_unmatched_sms("SMrace", &l, &format!("op:r{c}"), at(2)).await.unwrap())
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    let winners: Vec<&LoadId> =
        results.iter().filter(|(_, a)| matches!(a, SmsAssignment::Assigned(_))).map(|(l, _)| l).collect();
    assert_eq!(winners.len(), 1, "exactly one assignment wins: {results:?}");
    let n = winners[0].as_str().trim_start_matches('L');
    let taken = SmsAssignment::Taken { load_id: winners[0].clone(), event_id: format!("op:r{n}") };
    for (l, a) in &results {
        if l != winners[0] {
            assert_eq!(*a, taken, "the others see the winner");
        }
    }
}

pub async fn racing_claims_of_one_message_sid_have_one_winner(s: DynStore) {
    let claimers = 8;
    let barrier = Arc::new(tokio::sync::Barrier::new(claimers));
    let mut tasks = Vec::new();
    for c in 0..claimers {
        let (s, barrier) = (s.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let route = SmsRoute::Load(load(&format!("L{c}")));
            barrier.wait().await;
            (route.clone(), s.claim_message_sid("SMrace", &route, at(1)).await.unwrap())
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    let winners: Vec<&SmsRoute> = results.iter().filter(|(_, c)| *c == SidClaim::New).map(|(r, _)| r).collect();
    assert_eq!(winners.len(), 1, "exactly one claim is new: {results:?}");
    for (_, claim) in &results {
        if *claim != SidClaim::New {
            assert_eq!(*claim, SidClaim::Taken(winners[0].clone()), "the others see the winner's route");
        }
    }
}

pub async fn append_acking_acks_if_and_only_if_the_append_commits(s: DynStore) {
    publish(&s, "L1", "e1").await;
    publish(&s, "L1", "e2").await;
    let m = receive_one(&s, t0()).await;
    assert_eq!(m.event_id, "e1");
    let entries = || vec![entry("e1"), entry("dec:e1")];
    // A failed append acks nothing: the message is still in flight, its receipt good.
    let err = s.append_acking(&load("L1"), entries(), 7, vec![row("L1/k1")], &m.receipt, t0()).await.unwrap_err();
    assert!(matches!(err, AppendError::ConcurrencyConflict(_)), "{err:?}");
    assert!(receive(&s, t0()).await.is_empty(), "e1 still holds the load's head");
    assert_eq!(s.depth().await.unwrap(), 2);
    // The append commits, and the ack with it: the head moves to e2.
    let (v, acked) = s.append_acking(&load("L1"), entries(), 0, vec![row("L1/k1")], &m.receipt, t0()).await.unwrap();
    assert_eq!((v, acked), (2, true));
    assert_eq!(log_ids(&s, "L1").await, vec!["e1", "dec:e1"]);
    assert_eq!(s.depth().await.unwrap(), 1);
    let m2 = receive_one(&s, t0()).await;
    assert_eq!(m2.event_id, "e2");
    assert!(matches!(s.ack(&m.receipt, t0()).await, Err(crate::QueueError::StaleReceipt(_))), "already acked");
    // A stale receipt (the message was redelivered) acks nothing but does not stop the
    // append; the new holder's receipt still acks.
    let later = add(t0(), VIS * 2);
    let m3 = receive_one(&s, later).await;
    assert_eq!((m3.event_id.as_str(), m3.receive_count), ("e2", 2));
    let (v, acked) =
        s.append_acking(&load("L1"), vec![entry("e2"), entry("dec:e2")], 2, vec![], &m2.receipt, later).await.unwrap();
    assert_eq!((v, acked), (4, false));
    assert_eq!(s.depth().await.unwrap(), 1);
    // A receipt of another load's message acks nothing.
    publish(&s, "L2", "f1").await;
    let f = receive_one(&s, later).await;
    assert_eq!(f.event_id, "f1");
    let (_, acked) = s.append_acking(&load("L3"), vec![entry("g1")], 0, vec![], &f.receipt, later).await.unwrap();
    assert!(!acked, "a receipt of load L2 must not be acked by an append to L3");
    s.ack(&f.receipt, later).await.unwrap();
    s.ack(&m3.receipt, later).await.unwrap();
    assert_eq!(s.depth().await.unwrap(), 0);
}

/// `append_with` a claim: the rows are written claimed, as `pending` at the append's
/// `now` would have claimed them, so no claim takes them while the lease lives, the
/// claim's token marks them, and once the lease lapses a claim takes them over (a
/// process that died before sending them). The row handed over (`ClaimWith::claim_of`)
/// is the row the store holds.
pub async fn an_append_claims_its_rows_for_its_processs_dispatcher(s: DynStore) {
    publish(&s, "L1", "e1").await;
    let m = receive_one(&s, t0()).await;
    let claim = crate::ClaimWith { token: "handed".into(), lease_until: at(90) };
    let rows = vec![row("L1/e1/create_hero_task"), row("L1/e1/send_sms")];
    let entries = vec![entry("e1"), entry("dec:e1")];
    let with = crate::AppendWith { receipt: Some(&m.receipt), claim: Some(&claim) };
    let (version, acked) = s.append_with(&load("L1"), entries, 0, rows.clone(), with, at(1)).await.unwrap();
    assert_eq!((version, acked), (2, true));
    assert!(receive(&s, at(1)).await.is_empty(), "the message was acked with the append");
    let handed: Vec<crate::OutboxRow> = rows.into_iter().map(|r| claim.claim_of(&load("L1"), r, at(1)).row).collect();
    let mut stored = s.rows_for_load(&load("L1")).await.unwrap();
    stored.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(stored, handed, "the rows handed over are the rows stored");
    assert!(pending_ids(&s, 10, at(2)).await.is_empty(), "a live lease: no claim takes them");
    s.mark_dispatched("L1/e1/create_hero_task", "handed", "r1", at(2)).await.unwrap();
    // Past the lease, a claim takes the other over and the handed token is stale.
    assert_eq!(pending_ids(&s, 10, at(91)).await, vec!["L1/e1/send_sms".to_string()]);
    let stale = s.mark_dispatched("L1/e1/send_sms", "handed", "r2", at(92)).await.unwrap_err();
    assert!(matches!(stale, ClaimError::Stale(_)), "{stale:?}");
    // Without a receipt (a queue of its own, as SQS), nothing is acked; the rows are claimed.
    let with = crate::AppendWith { receipt: None, claim: Some(&claim) };
    let (version, acked) =
        s.append_with(&load("L3"), vec![entry("g1")], 0, vec![row("L3/g1/send_sms")], with, at(1)).await.unwrap();
    assert_eq!((version, acked), (1, false));
    assert!(!pending_ids(&s, 10, at(2)).await.contains(&"L3/g1/send_sms".to_string()), "claimed with its append");
    // Without a claim the rows are written unclaimed, as by `append_acking`.
    commit(&s, "L2", "f1", 0, &["L2/f1/send_sms"]).await;
    let ids = pending_ids(&s, 10, at(91)).await;
    assert!(ids.contains(&"L2/f1/send_sms".to_string()), "{ids:?}");
}

/// The store's queue hands out each message with its load's log version as of the
/// receive: none before the load's first append, and the version the acking append
/// made once it committed (the worker decides on a snapshot at that version unread).
pub async fn a_received_message_carries_its_loads_log_version(s: DynStore) {
    publish(&s, "L1", "e1").await;
    publish(&s, "L1", "e2").await;
    let m = receive_one(&s, t0()).await;
    assert_eq!((m.event_id.as_str(), m.log_version), ("e1", None), "no log yet");
    let entries = vec![entry("e1"), entry("dec:e1")];
    let (v, acked) = s.append_acking(&load("L1"), entries, 0, vec![], &m.receipt, t0()).await.unwrap();
    assert_eq!((v, acked), (2, true));
    let m = receive_one(&s, t0()).await;
    assert_eq!((m.event_id.as_str(), m.log_version), ("e2", Some(2)));
    // A load's version is its own.
    commit(&s, "L2", "f0", 0, &[]).await;
    commit(&s, "L2", "f1", 2, &[]).await;
    publish(&s, "L2", "f2").await;
    let f = receive_one(&s, t0()).await;
    assert_eq!((f.event_id.as_str(), f.log_version), ("f2", Some(4)));
}

async fn publish_receiving(s: &DynStore, l: &str, event: &str, now: Timestamp) -> (Published, Option<(String, u32)>) {
    let body = json!({"event_id": event}).to_string();
    let (published, m) = s.publish_receiving(&load(l), event, &body, None, VIS, now).await.unwrap();
    (published, m.map(|m| (m.event_id, m.receive_count)))
}

/// `publish_receiving` receives the message it publishes when its load's head takes it
/// at once, for the publisher's own worker. Everything else of the queue holds: one
/// message in flight per load, FIFO, the receipt acks it, the lease lapses into a
/// redelivery, and the message carries its load's log version as a receive's does.
pub async fn a_publish_receives_its_message_when_its_load_is_idle(s: DynStore) {
    use Published::{Duplicate, New};
    let m = s
        .publish_receiving(&load("L1"), "e1", &json!({"event_id": "e1"}).to_string(), None, VIS, t0())
        .await
        .unwrap()
        .1
        .expect("an idle load's head takes the message, received at once");
    assert_eq!((m.event_id.as_str(), m.receive_count, m.log_version), ("e1", 1, None));
    assert!(receive(&s, t0()).await.is_empty(), "in flight: no receive takes it");
    // Behind a message in flight, a publish waits; a duplicate of it is not received again.
    assert_eq!(publish_receiving(&s, "L1", "e2", t0()).await, (New, None));
    assert_eq!(publish_receiving(&s, "L1", "e1", t0()).await, (Duplicate, None));
    // Its receipt acks it, and the load's next message comes by a receive.
    let entries = vec![entry("e1"), entry("dec:e1")];
    assert_eq!(s.append_acking(&load("L1"), entries, 0, vec![], &m.receipt, t0()).await.unwrap(), (2, true));
    let e2 = receive_one(&s, t0()).await;
    assert_eq!((e2.event_id.as_str(), e2.receive_count, e2.log_version), ("e2", 1, Some(2)));
    s.ack(&e2.receipt, t0()).await.unwrap();
    // With the load idle again, its next publish is received, with the log's version.
    let m = s.publish_receiving(&load("L1"), "e3", "{}", None, VIS, t0()).await.unwrap();
    assert_eq!((m.0, m.1.map(|m| (m.event_id, m.log_version))), (New, Some(("e3".into(), Some(2)))));
    // A duplicate of a message waiting at its head, never received, is received.
    publish(&s, "L2", "f1").await;
    assert_eq!(publish_receiving(&s, "L2", "f1", t0()).await, (Duplicate, Some(("f1".into(), 1))));
    // A message received before and given back is left for a receive (its head delayed).
    publish(&s, "L3", "g1").await;
    let g1 = receive_one(&s, t0()).await;
    s.nack(&g1.receipt, Duration::from_secs(60), t0()).await.unwrap();
    assert_eq!(publish_receiving(&s, "L3", "g1", t0()).await, (Duplicate, None));
    // Its lease lapses as a receive's: redelivered, and its receipt is stale.
    let m = s.publish_receiving(&load("L4"), "h1", "{}", None, VIS, t0()).await.unwrap().1.unwrap();
    let later = add(t0(), VIS + Duration::from_secs(1));
    let lapsed = s.receive(10, VIS, later).await.unwrap();
    let again = lapsed.iter().find(|m| m.load_id == load("L4")).expect("h1 redelivered");
    assert_eq!((again.event_id.as_str(), again.receive_count), ("h1", 2));
    assert!(s.ack(&m.receipt, later).await.is_err(), "the lapsed lease's receipt is stale");
    s.ack(&again.receipt, later).await.unwrap();
}

/// Publishes racing on a load with no head row yet: one head takes one message, so at
/// most one publisher receives (exactly one, when no receive ran in between), and the
/// others wait behind it in the order they were published.
pub async fn racing_publishes_on_a_new_load_receive_one_message(s: DynStore) {
    let racers: Vec<_> = (0..8)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                let event = format!("r{i}");
                s.publish_receiving(&load("R"), &event, "{}", None, VIS, t0()).await.unwrap().1
            })
        })
        .collect();
    let mut received = Vec::new();
    for r in racers {
        received.extend(r.await.unwrap());
    }
    assert_eq!(received.len(), 1, "one head, one message received: {received:?}");
    assert!(receive(&s, t0()).await.is_empty(), "the rest wait behind the one in flight");
    let mut next = received.remove(0);
    let mut seen = vec![next.event_id.clone()];
    while let Ok(()) = s.ack(&next.receipt, t0()).await {
        let Some(m) = s.receive(1, VIS, t0()).await.unwrap().pop() else { break };
        assert_eq!(m.receive_count, 1, "{} was received before", m.event_id);
        seen.push(m.event_id.clone());
        next = m;
    }
    seen.sort();
    assert_eq!(seen, (0..8).map(|i| format!("r{i}")).collect::<Vec<_>>(), "every message once");
}

/// A store's own queue says a short receive drained it (`short_receive_drains`), and it
/// holds: the loop that trusts it waits for a wake-up instead of asking again. A
/// receive that answers fewer than it was asked for took every visible message: the
/// next receive finds none, until a message is published or a head comes due.
pub async fn a_short_receive_took_every_visible_message(s: DynStore) {
    assert!(s.short_receive_drains(), "a store's own queue: a short receive drains it");
    for (l, e) in [("L1", "a1"), ("L1", "a2"), ("L2", "b1"), ("L3", "c1")] {
        publish(&s, l, e).await;
    }
    // L1's second message waits behind its first: three heads are visible, not four.
    let got = s.receive(10, VIS, t0()).await.unwrap();
    let mut events: Vec<&str> = got.iter().map(|m| m.event_id.as_str()).collect();
    events.sort_unstable();
    assert_eq!(events, ["a1", "b1", "c1"]);
    assert!(receive(&s, t0()).await.is_empty(), "a short receive left nothing visible behind");
    // A full receive may leave some: asked for one of two, the other is still there.
    publish(&s, "L4", "d1").await;
    publish(&s, "L5", "e1").await;
    assert_eq!(s.receive(1, VIS, t0()).await.unwrap().len(), 1);
    assert_eq!(s.receive(1, VIS, t0()).await.unwrap().len(), 1);
    // An ack makes the load's next message visible again.
    let a1 = got.iter().find(|m| m.event_id == "a1").unwrap();
    s.ack(&a1.receipt, t0()).await.unwrap();
    assert_eq!(receive(&s, t0()).await, vec![pair("L1", "a2")]);
}

/// The next message of a load published while the append that acks its head commits:
/// whichever goes first, the head moves to it, so it is received. (An ack that reads
/// the load's next message before it holds the head could miss one published just
/// then, and strand it forever.)
pub async fn a_publish_racing_the_acking_append_is_never_stranded(s: DynStore) {
    const ROUNDS: u64 = 60;
    publish(&s, "L1", "m0").await;
    for i in 0..ROUNDS {
        let m = receive_one(&s, t0()).await;
        assert_eq!(m.event_id, format!("m{i}"), "round {i}");
        let (appender, publisher) = (s.clone(), s.clone());
        let next = format!("m{}", i + 1);
        let appending = tokio::spawn(async move {
            appender.append_acking(&load("L1"), vec![entry(&format!("e{i}"))], i, vec![], &m.receipt, t0()).await
        });
        let publishing = tokio::spawn(async move { publisher.publish(&load("L1"), &next, "{}", t0()).await });
        assert_eq!(appending.await.unwrap().unwrap(), (i + 1, true), "round {i}");
        assert_eq!(publishing.await.unwrap().unwrap(), Published::New, "round {i}");
    }
    assert_eq!(receive_one(&s, t0()).await.event_id, format!("m{ROUNDS}"));
}

pub async fn append_refuses_an_outbox_key_of_another_load(s: DynStore) {
    // Action keys are `{load}/...`: a key naming another load is refused, nothing is written.
    for bad in ["L2/e1/send_sms", "L1", "L10/e1/send_sms", "e1/send_sms"] {
        let err = s.append(&load("L1"), vec![entry("e1")], 0, vec![row(bad)], t0()).await.unwrap_err();
        assert!(matches!(err, AppendError::Store(_)), "{bad}: {err:?}");
    }
    assert!(log_ids(&s, "L1").await.is_empty());
    assert!(s.rows_for_load(&load("L1")).await.unwrap().is_empty());
    assert_eq!(commit(&s, "L1", "e1", 0, &["L1/e1/send_sms"]).await, 2);
}

// ---------------------------------------------------------------------------------
// Prune (retention)

/// Outbox rows in every state, timers in every state, messages acked and not, old
/// (finished at 10 s) and new (finished at 200 s), on loads L1 and L2.
async fn retention_fixture(s: &DynStore) {
    let keys = ["L1/disp/send_sms", "L1/dead_pub/send_sms", "L1/dead_unpub/send_sms", "L1/claimed/send_sms"];
    commit(s, "L1", "e1", 0, &keys).await;
    commit(s, "L1", "e2", 2, &["L1/retry/send_sms", "L1/pub_pending/send_sms", "L1/disp_new/send_sms"]).await;
    commit(s, "L2", "e1", 0, &["L2/never/send_sms"]).await;
    let claims = s.pending(10, t0(), LEASE).await.unwrap();
    let token = |id: &str| claims.iter().find(|c| c.row.id == id).unwrap().token.clone();
    s.mark_dispatched("L1/disp/send_sms", &token("L1/disp/send_sms"), "r1", at(10)).await.unwrap();
    s.mark_failed("L1/dead_pub/send_sms", &token("L1/dead_pub/send_sms"), "400", None, at(5)).await.unwrap();
    s.mark_outcome_published("L1/dead_pub/send_sms", at(10)).await.unwrap();
    s.mark_failed("L1/dead_unpub/send_sms", &token("L1/dead_unpub/send_sms"), "400", None, at(5)).await.unwrap();
    s.mark_failed("L1/retry/send_sms", &token("L1/retry/send_sms"), "503", Some(at(10_000)), at(5)).await.unwrap();
    // An outcome recorded for a row still pending (a crash between publish and mark).
    s.mark_outcome_published("L1/pub_pending/send_sms", at(5)).await.unwrap();
    s.mark_dispatched("L1/disp_new/send_sms", &token("L1/disp_new/send_sms"), "r2", at(200)).await.unwrap();
    // L1/claimed keeps its live claim; L2/never was released by nobody: pending too.
    s.mark_failed("L2/never/send_sms", &token("L2/never/send_sms"), "503", Some(at(1)), at(1)).await.unwrap();

    s.schedule(&timer("L1", 1), at(5), at(0)).await.unwrap();
    s.mark_fired(&timer("L1", 1), at(10)).await.unwrap();
    s.schedule(&timer("L1", 2), at(50), at(0)).await.unwrap();
    s.cancel(&timer("L1", 2), at(10)).await.unwrap();
    s.cancel(&timer("L1", 3), at(10)).await.unwrap(); // canceled before it was scheduled
    s.schedule(&timer("L1", 4), at(5), at(0)).await.unwrap(); // due long ago, never fired
    s.schedule(&timer("L1", 5), at(5), at(0)).await.unwrap();
    s.mark_fired(&timer("L1", 5), at(200)).await.unwrap();

    for e in ["q1", "q2", "q3", "q4"] {
        publish(s, "L1", e).await;
    }
    let m = receive_one(s, at(1)).await;
    assert_eq!(m.event_id, "q1");
    s.ack(&m.receipt, at(10)).await.unwrap();
    let m = receive_one(s, at(11)).await;
    assert_eq!(m.event_id, "q2");
    s.ack(&m.receipt, at(200)).await.unwrap();
    publish(s, "L2", "q1").await;
    let m = s.receive(10, VIS, at(201)).await.unwrap(); // L1/q3 and L2/q1 in flight
    assert_eq!(m.len(), 2);
}

pub async fn prune_deletes_only_finished_rows_older_than_the_cutoff(s: DynStore) {
    retention_fixture(&s).await;
    let log_before = (s.read(&load("L1")).await.unwrap(), s.read(&load("L2")).await.unwrap());
    let report = s.prune(at(100), 1000).await.unwrap();
    assert_eq!(report, PruneReport { outbox: 2, timers: 3, queue: 1, shadow: 0, reports: 0 });
    for gone in ["L1/disp/send_sms", "L1/dead_pub/send_sms"] {
        assert_eq!(s.get(gone).await.unwrap(), None, "{gone} was finished before the cutoff");
    }
    for kept in [
        "L1/dead_unpub/send_sms",
        "L1/claimed/send_sms",
        "L1/retry/send_sms",
        "L1/pub_pending/send_sms",
        "L1/disp_new/send_sms",
        "L2/never/send_sms",
    ] {
        assert!(s.get(kept).await.unwrap().is_some(), "{kept} must stay");
    }
    assert_eq!(s.dead_without_outcome(10).await.unwrap().len(), 1, "the sweep still finds its row");
    for n in [1, 2, 3] {
        assert_eq!(s.get_timer(&timer("L1", n)).await.unwrap(), None, "timer {n} finished before the cutoff");
    }
    assert_eq!(s.get_timer(&timer("L1", 4)).await.unwrap().unwrap().status, TimerStatus::Scheduled);
    assert_eq!(s.get_timer(&timer("L1", 5)).await.unwrap().unwrap().status, TimerStatus::Fired);
    assert_eq!(s.due(at(300), 10).await.unwrap().len(), 1, "a scheduled timer is never pruned");
    assert_eq!(s.published_body(&load("L1"), "q1").await.unwrap(), None, "acked before the cutoff");
    for (l, e) in [("L1", "q2"), ("L1", "q3"), ("L1", "q4"), ("L2", "q1")] {
        assert!(s.published_body(&load(l), e).await.unwrap().is_some(), "{l}/{e} must stay");
    }
    assert_eq!(s.depth().await.unwrap(), 3);
    assert_eq!((s.read(&load("L1")).await.unwrap(), s.read(&load("L2")).await.unwrap()), log_before, "never the log");
    // Nothing is left to prune at that cutoff; a later cutoff takes the newer rows.
    assert_eq!(s.prune(at(100), 1000).await.unwrap(), PruneReport::default());
    assert_eq!(
        s.prune(at(300), 1000).await.unwrap(),
        PruneReport { outbox: 1, timers: 1, queue: 1, shadow: 0, reports: 0 }
    );
    assert_eq!(s.count_by_status(OutboxStatus::Pending).await.unwrap(), 4);
}

pub async fn prune_honours_the_batch_bound(s: DynStore) {
    let keys: Vec<String> = (0..5).map(|i| format!("L1/k{i}/send_sms")).collect();
    commit(&s, "L1", "e1", 0, &keys.iter().map(String::as_str).collect::<Vec<_>>()).await;
    for c in s.pending(10, t0(), LEASE).await.unwrap() {
        s.mark_dispatched(&c.row.id, &c.token, "r", at(1)).await.unwrap();
    }
    for n in 0..5 {
        s.schedule(&timer("L1", n), at(1), at(0)).await.unwrap();
        s.mark_fired(&timer("L1", n), at(1)).await.unwrap();
    }
    for i in 0..5 {
        publish(&s, "L1", &format!("q{i}")).await;
        let m = receive_one(&s, at(1)).await;
        s.ack(&m.receipt, at(1)).await.unwrap();
    }
    let two = PruneReport { outbox: 2, timers: 2, queue: 2, shadow: 0, reports: 0 };
    assert_eq!(s.prune(at(10), 2).await.unwrap(), two);
    assert!(two.full(2));
    assert_eq!(s.prune(at(10), 2).await.unwrap(), two);
    assert_eq!(
        s.prune(at(10), 2).await.unwrap(),
        PruneReport { outbox: 1, timers: 1, queue: 1, shadow: 0, reports: 0 }
    );
    assert_eq!(s.prune(at(10), 2).await.unwrap(), PruneReport::default());
    assert_eq!(s.prune(at(10), 0).await.unwrap(), PruneReport::default(), "a zero batch deletes nothing");

    // prune_all loops until a batch comes back short, and stops at max_batches.
    commit(&s, "L1", "e2", 2, &["L1/a/send_sms", "L1/b/send_sms", "L1/c/send_sms"]).await;
    for c in s.pending(10, t0(), LEASE).await.unwrap() {
        s.mark_dispatched(&c.row.id, &c.token, "r", at(1)).await.unwrap();
    }
    let mut batches = 0;
    let sum = crate::prune_all(s.as_ref(), at(10), 1, 2, |_| batches += 1).await.unwrap();
    assert_eq!((sum.outbox, batches), (2, 2), "at most max_batches batches");
    let sum = crate::prune_all(s.as_ref(), at(10), 2, 100, |_| {}).await.unwrap();
    assert_eq!(sum.total(), 1);
    assert!(s.rows_for_load(&load("L1")).await.unwrap().is_empty());
}

pub async fn store_keeps_working_after_prune(s: DynStore) {
    retention_fixture(&s).await;
    s.prune(at(300), 1000).await.unwrap();
    // The log: the version survived, an append at the right version succeeds, a stale one conflicts.
    let (_, v) = s.read(&load("L1")).await.unwrap();
    assert_eq!(v, 4);
    let err = s.append(&load("L1"), vec![entry("e3")], 2, vec![], at(300)).await.unwrap_err();
    assert!(matches!(err, AppendError::ConcurrencyConflict(_)), "{err:?}");
    assert_eq!(commit(&s, "L1", "e3", 4, &["L1/e3/send_sms"]).await, 6);
    // The log still dedups an event whose queue record was pruned.
    let err = s.append(&load("L1"), vec![entry("e1")], 6, vec![], at(300)).await.unwrap_err();
    assert!(matches!(err, AppendError::DuplicateEntry(_)), "{err:?}");
    // Claims go on as before.
    let ids = pending_ids(&s, 10, at(20_000)).await;
    assert!(ids.contains(&"L1/e3/send_sms".to_string()) && ids.contains(&"L1/retry/send_sms".to_string()), "{ids:?}");
    // The queue: the messages in flight at the prune come back after their visibility, FIFO goes on.
    let got = s.receive(10, VIS, at(301)).await.unwrap();
    assert_eq!(got.iter().map(|m| m.event_id.as_str()).collect::<Vec<_>>(), vec!["q3", "q1"]);
    for m in &got {
        s.ack(&m.receipt, at(302)).await.unwrap();
    }
    assert_eq!(receive(&s, at(303)).await, vec![pair("L1", "q4")]);
    // The dedup window ended at the cutoff: a pruned event id is accepted again (the
    // log's DuplicateEntryError above is what keeps it from being processed twice).
    assert_eq!(publish(&s, "L1", "q1").await, Published::New);
    // Timers: a pruned timer id can be scheduled again (the timer_fired event id is
    // deduplicated by the log the same way).
    assert!(s.schedule(&timer("L1", 1), at(400), at(300)).await.unwrap());
    assert_eq!(s.due(at(400), 10).await.unwrap().len(), 2);
}

// ---------------------------------------------------------------------------------
// Queries across loads (OpsQueries)

pub async fn oldest_due_timer_is_the_earliest_scheduled_one_due(s: DynStore) {
    assert_eq!(s.oldest_due_timer(at(1000)).await.unwrap(), None);
    s.schedule(&timer("L1", 1), at(100), at(0)).await.unwrap();
    s.schedule(&timer("L2", 1), at(50), at(0)).await.unwrap();
    s.schedule(&timer("L3", 1), at(500), at(0)).await.unwrap();
    s.schedule(&timer("L4", 1), at(10), at(0)).await.unwrap();
    s.cancel(&timer("L4", 1), at(1)).await.unwrap();
    let check = |now: u64, expected: Option<u64>| {
        let s = s.clone();
        async move { assert_eq!(s.oldest_due_timer(at(now)).await.unwrap(), expected.map(at), "now {now}") }
    };
    check(40, None).await; // nothing due yet (the canceled one never counts)
    check(50, Some(50)).await;
    check(200, Some(50)).await;
    s.mark_fired(&timer("L2", 1), at(201)).await.unwrap();
    check(200, Some(100)).await;
    check(600, Some(100)).await;
}

fn update(stage: &str) -> NewEntry {
    NewEntry::stored(format!("u-{stage}"), "load_update", json!({"stage": stage}))
}

/// A `decision_recorded` on `event` that moves `asks` (`[{ask_id, step, status}]`),
/// whole as a worker writes one (what this and other crates' tests append).
pub fn decision(event: &str, asks: serde_json::Value) -> NewEntry {
    let payload = json!({"decision_id": format!("dec:{event}"), "event_id": event, "decided_at": "2026-03-02T07:00:00Z",
        "decider": "sop", "filtered": false, "needs_hero_task": false, "rationale": "r", "actions": [], "asks": asks});
    NewEntry::stored(format!("dec:{event}"), "decision_recorded", payload)
}

/// The load ids of one page of `filter`, from the start.
async fn loads_matching(s: &DynStore, filter: &crate::LoadFilter) -> Vec<String> {
    let page = s.loads_page(filter, None, 100).await.unwrap();
    assert_eq!(page.next_after, None, "one page holds them all");
    page.loads.into_iter().map(|l| l.load_id.to_string()).collect()
}

pub async fn loads_summary_follows_the_log_and_filters_loads(s: DynStore) {
    use crate::LoadFilter;
    // L1: in transit, one open ask. L2: an escalated ask and a dead row. L3: delivered,
    // its ask answered, a pending row, an overdue timer. L4: nothing but an SMS.
    let l = |id: &str| load(id);
    let open = json!([{"ask_id": "ask:eta_request:p1", "step": 1, "status": "open"}]);
    s.append(&l("L1"), vec![update("in_transit"), decision("u-in_transit", open.clone())], 0, vec![], at(10))
        .await
        .unwrap();
    s.append(
        &l("L2"),
        vec![update("at_pickup"), decision("u-at_pickup", open.clone())],
        0,
        vec![row("L2/a/send_sms")],
        at(20),
    )
    .await
    .unwrap();
    let escalated = json!([{"ask_id": "ask:eta_request:p1", "step": 2, "status": "escalated"}]);
    s.append(&l("L2"), vec![entry("e2"), decision("e2", escalated)], 2, vec![], at(30)).await.unwrap();
    s.append(&l("L3"), vec![update("in_transit"), decision("u-in_transit", open)], 0, vec![], at(40)).await.unwrap();
    let answered = json!([{"ask_id": "ask:eta_request:p1", "step": 1, "status": "answered"}]);
    s.append(
        &l("L3"),
        vec![update("delivered"), decision("u-delivered", answered)],
        2,
        vec![row("L3/b/send_sms")],
        at(50),
    )
    .await
    .unwrap();
    s.append(&l("L4"), vec![entry("e1")], 0, vec![], at(60)).await.unwrap();
    let c = s.pending(10, at(21), LEASE).await.unwrap();
    let l2_row = c.iter().find(|c| c.row.id == "L2/a/send_sms").unwrap();
    s.mark_failed(&l2_row.row.id, &l2_row.token, "400", None, at(22)).await.unwrap();
    let l3_row = c.iter().find(|c| c.row.id == "L3/b/send_sms");
    assert!(l3_row.is_none(), "L3's row is not due at 21");
    s.schedule(&timer("L3", 1), at(70), at(50)).await.unwrap();
    s.schedule(&timer("L1", 1), at(900), at(10)).await.unwrap();

    let all = s.loads_page(&LoadFilter::default(), None, 10).await.unwrap();
    /// Load, version, stage, open asks, escalated asks, created, last activity.
    type Summary = (String, u64, Option<String>, u32, u32, Timestamp, Timestamp);
    let summary: Vec<Summary> = all
        .loads
        .iter()
        .map(|l| {
            (
                l.load_id.to_string(),
                l.version,
                l.stage.clone(),
                l.open_asks,
                l.escalated_asks,
                l.created_at,
                l.last_activity_at,
            )
        })
        .collect();
    let st = |s: &str| Some(s.to_string());
    assert_eq!(
        summary,
        vec![
            ("L1".into(), 2, st("in_transit"), 1, 0, at(10), at(10)),
            ("L2".into(), 4, st("at_pickup"), 0, 1, at(20), at(30)),
            ("L3".into(), 4, st("delivered"), 0, 0, at(40), at(50)),
            ("L4".into(), 1, None, 0, 0, at(60), at(60)),
        ]
    );
    let check = |filter: LoadFilter, expected: &[&str]| {
        let s = s.clone();
        let expected: Vec<String> = expected.iter().map(|e| e.to_string()).collect();
        async move { assert_eq!(loads_matching(&s, &filter).await, expected, "{filter:?}") }
    };
    check(LoadFilter { stage: st("in_transit"), ..Default::default() }, &["L1"]).await;
    check(LoadFilter { stage: st("nope' OR 1=1 --"), ..Default::default() }, &[]).await;
    check(LoadFilter { open_asks: true, ..Default::default() }, &["L1"]).await;
    check(LoadFilter { escalated: true, ..Default::default() }, &["L2"]).await;
    check(LoadFilter { has_dead: true, ..Default::default() }, &["L2"]).await;
    check(LoadFilter { pending_created_by: Some(at(50)), ..Default::default() }, &["L3"]).await;
    check(LoadFilter { pending_created_by: Some(at(49)), ..Default::default() }, &[]).await;
    check(LoadFilter { timer_due_by: Some(at(100)), ..Default::default() }, &["L3"]).await;
    check(LoadFilter { timer_due_by: Some(at(900)), ..Default::default() }, &["L1", "L3"]).await;
    check(LoadFilter { active_before: Some(at(30)), ..Default::default() }, &["L1"]).await;
    check(LoadFilter { active_since: Some(at(30)), ..Default::default() }, &["L2", "L3", "L4"]).await;
    check(LoadFilter { active_since: Some(at(30)), has_dead: true, escalated: true, ..Default::default() }, &["L2"])
        .await;
    check(LoadFilter { stage: st("in_transit"), timer_due_by: Some(at(100)), ..Default::default() }, &[]).await;
    // A failed append changes no summary.
    let stale = s.append(&l("L1"), vec![update("delivered")], 1, vec![], at(99)).await;
    assert!(matches!(stale, Err(AppendError::ConcurrencyConflict(_))));
    check(LoadFilter { stage: st("delivered"), ..Default::default() }, &["L3"]).await;
}

pub async fn loads_pages_walk_every_load_once(s: DynStore) {
    use crate::LoadFilter;
    for i in 0..7 {
        let stage = if i % 2 == 0 { "in_transit" } else { "at_pickup" };
        s.append(&load(&format!("L{i}")), vec![update(stage)], 0, vec![], at(i)).await.unwrap();
    }
    let walk = |filter: LoadFilter, limit: usize| {
        let s = s.clone();
        async move {
            let (mut seen, mut after, mut pages) = (Vec::new(), None::<LoadId>, 0);
            loop {
                let page = s.loads_page(&filter, after.as_ref(), limit).await.unwrap();
                assert!(page.loads.len() <= limit);
                seen.extend(page.loads.iter().map(|l| l.load_id.to_string()));
                pages += 1;
                match page.next_after {
                    Some(next) => after = Some(next),
                    None => break,
                }
                assert!(pages < 20, "the pages end");
            }
            seen
        }
    };
    let all: Vec<String> = (0..7).map(|i| format!("L{i}")).collect();
    assert_eq!(walk(LoadFilter::default(), 2).await, all);
    assert_eq!(walk(LoadFilter::default(), 7).await, all);
    let in_transit = LoadFilter { stage: Some("in_transit".into()), ..Default::default() };
    assert_eq!(walk(in_transit, 3).await, vec!["L0", "L2", "L4", "L6"]);
    let last = s.loads_page(&LoadFilter::default(), Some(&load("L6")), 5).await.unwrap();
    assert_eq!((last.loads.len(), last.next_after), (0, None));
}

pub async fn dead_rows_page_newest_first_by_type(s: DynStore) {
    let hero = |id: &str| NewOutboxRow {
        id: id.into(),
        action_type: ActionType::CreateHeroTask,
        action: json!({"key": id}),
        trace: None,
    };
    s.append(&load("L1"), vec![entry("e1")], 0, vec![row("L1/a/send_sms"), hero("L1/b/create_hero_task")], at(0))
        .await
        .unwrap();
    s.append(&load("L2"), vec![entry("e1")], 0, vec![row("L2/a/send_sms"), row("L2/c/send_sms")], at(0)).await.unwrap();
    let claims = s.pending(10, at(1), LEASE).await.unwrap();
    let died = [("L1/a/send_sms", 5), ("L1/b/create_hero_task", 7), ("L2/a/send_sms", 7)];
    for (id, t) in died {
        let c = claims.iter().find(|c| c.row.id == id).unwrap();
        s.mark_failed(id, &c.token, &format!("400 {id}"), None, at(t)).await.unwrap();
    }
    let page = |types: Vec<ActionType>, before: Option<RowCursor>, limit: usize| {
        let s = s.clone();
        async move {
            let rows = s.dead_rows_page(&types, None, before.as_ref(), limit).await.unwrap();
            rows.iter().map(|d| (d.row.id.clone(), d.dead_at)).collect::<Vec<_>>()
        }
    };
    let all = vec![
        ("L2/a/send_sms".to_string(), at(7)),
        ("L1/b/create_hero_task".to_string(), at(7)),
        ("L1/a/send_sms".to_string(), at(5)),
    ];
    assert_eq!(page(vec![], None, 10).await, all);
    // Page by page, from each page's last row.
    let first = s.dead_rows_page(&[], None, None, 1).await.unwrap();
    assert_eq!(first[0].row.last_failure.as_deref(), Some("400 L2/a/send_sms"));
    assert_eq!(first[0].outcome_published_at, None);
    s.mark_outcome_published("L2/a/send_sms", at(8)).await.unwrap();
    let first = s.dead_rows_page(&[], None, None, 1).await.unwrap();
    assert_eq!(first[0].outcome_published_at, Some(at(8)));
    assert_eq!(page(vec![], Some(first[0].cursor()), 1).await, all[1..2].to_vec());
    assert_eq!(
        page(vec![], Some(RowCursor { created_at: at(7), id: "L1/b/create_hero_task".into() }), 5).await,
        all[2..].to_vec()
    );
    assert_eq!(page(vec![ActionType::SendSms], None, 10).await, vec![all[0].clone(), all[2].clone()]);
    assert_eq!(page(vec![ActionType::CreateHeroTask, ActionType::PostHeroSlack], None, 10).await, all[1..2].to_vec());
    assert_eq!(page(vec![ActionType::UpdateStage], None, 10).await, vec![]);
}

pub async fn overdue_timers_page_most_overdue_first(s: DynStore) {
    for (l, fire) in [("L1", 30), ("L2", 10), ("L3", 10), ("L4", 500)] {
        s.schedule(&timer(l, 1), at(fire), at(0)).await.unwrap();
    }
    s.schedule(&timer("L5", 1), at(5), at(0)).await.unwrap();
    s.mark_fired(&timer("L5", 1), at(6)).await.unwrap();
    let page = |due_by: u64, after: Option<RowCursor>, limit: usize| {
        let s = s.clone();
        async move {
            let timers = s.overdue_timers_page(at(due_by), after.as_ref(), limit).await.unwrap();
            timers.iter().map(|t| t.load_id.to_string()).collect::<Vec<_>>()
        }
    };
    assert_eq!(page(100, None, 10).await, vec!["L2", "L3", "L1"]);
    assert_eq!(page(10, None, 10).await, vec!["L2", "L3"]);
    let first = s.overdue_timers_page(at(100), None, 1).await.unwrap().remove(0);
    let after = RowCursor { created_at: first.fire_at, id: first.timer_id.to_string() };
    assert_eq!(page(100, Some(after), 10).await, vec!["L3", "L1"]);
    assert_eq!(page(1, None, 10).await, Vec::<String>::new());
}

pub async fn unmatched_sms_page_newest_first(s: DynStore) {
    for (sid, t) in [("SM1", 1), ("SM2", 3), ("SM3", 3), ("SM4", 9)] {
        let sms = UnmatchedSms {
            message_sid: sid.into(),
            from: "+15555550199".into(),
            to: "+15555550000".into(),
            body: "where do I go".into(),
            received_at: at(t),
            reason: "no single active load has this driver phone".into(),
        };
        s.record_unmatched_sms(&sms).await.unwrap();
    }
    let page = |before: Option<RowCursor>, limit: usize| {
        let s = s.clone();
        async move {
            let got = s.unmatched_sms_page(None, before.as_ref(), limit).await.unwrap();
            got.iter().map(|u| u.sms.message_sid.clone()).collect::<Vec<_>>()
        }
    };
    assert_eq!(page(None, 10).await, vec!["SM4", "SM3", "SM2", "SM1"]);
    assert_eq!(page(None, 2).await, vec!["SM4", "SM3"]);
    assert_eq!(page(Some(RowCursor { created_at: at(3), id: "SM3".into() }), 10).await, vec!["SM2", "SM1"]);
}

/// A decision's entry that takes dead rows out of the inbox, `(outbox_id, state)`.
fn inbox_entry(id: &str, changes: &[(&str, &str)]) -> NewEntry {
    let mut e = entry(id);
    e.derived.inbox = changes.iter().map(|(k, st)| (k.to_string(), st.to_string(), format!("evt:{id}"))).collect();
    e
}

pub async fn the_inbox_follows_the_log_and_dismissals(s: DynStore) {
    use haul_core::InboxState::{Dismissed, Handled, Open};
    let (sms, hero) = ("L1/a/send_sms", "L1/b/create_hero_task");
    let hero_row = NewOutboxRow {
        id: hero.into(),
        action_type: ActionType::CreateHeroTask,
        action: json!({"key": hero}),
        trace: None,
    };
    s.append(&load("L1"), vec![entry("e1")], 0, vec![row(sms), hero_row, row("L1/c/send_sms")], at(0)).await.unwrap();
    for c in s.pending(10, at(1), LEASE).await.unwrap() {
        if c.row.id != "L1/c/send_sms" {
            s.mark_failed(&c.row.id, &c.token, "HTTP 400", None, at(5)).await.unwrap();
        }
    }
    s.record_ops_alert(&alert(hero), AlertState::Delivered, None, at(6)).await.unwrap();
    let dead = |state| {
        let s = s.clone();
        async move {
            let rows = s.dead_rows_page(&[], state, None, 10).await.unwrap();
            rows.iter().map(|d| (d.row.id.clone(), d.inbox.state, d.inbox.by.clone(), d.inbox.at)).collect::<Vec<_>>()
        }
    };
    let alerts = |state| {
        let s = s.clone();
        async move {
            let rows = s.ops_alerts_page(state, None, 10).await.unwrap();
            rows.iter().map(|a| (a.alert.outbox_id.clone(), a.inbox.state)).collect::<Vec<_>>()
        }
    };
    let open = |id: &str| (id.to_string(), Open, None, None);
    // Newest first; at the same time of death, the greater id first.
    assert_eq!(dead(None).await, [open(hero), open(sms)]);
    assert_eq!(dead(Some(Open)).await, [open(hero), open(sms)]);
    assert_eq!(dead(Some(Handled)).await, []);
    assert_eq!(alerts(Some(Open)).await, [(hero.to_string(), Open)]);
    let counts =
        InboxCounts { dead: vec![(ActionType::CreateHeroTask, 1), (ActionType::SendSms, 1)], alerts: 1, unmatched: 0 };
    assert_eq!(s.inbox_counts(100).await.unwrap(), counts);

    // A decision marks the Hero task handled, another dismisses the SMS: each with its
    // event and the append's time, in the append's transaction.
    s.append(&load("L1"), vec![inbox_entry("e2", &[(hero, "handled")])], 1, vec![], at(9)).await.unwrap();
    let handled = (hero.to_string(), Handled, Some("evt:e2".to_string()), Some(at(9)));
    assert_eq!(dead(None).await, [handled.clone(), open(sms)]);
    assert_eq!(dead(Some(Handled)).await, [handled]);
    assert_eq!(alerts(Some(Open)).await, []);
    assert_eq!(alerts(Some(Handled)).await, [(hero.to_string(), Handled)]);
    s.append(&load("L1"), vec![inbox_entry("e3", &[(sms, "dismissed")])], 2, vec![], at(10)).await.unwrap();
    assert_eq!(dead(Some(Open)).await, []);
    assert_eq!(dead(Some(Dismissed)).await, [(sms.to_string(), Dismissed, Some("evt:e3".to_string()), Some(at(10)))]);
    // A refused append changes nothing.
    let stale = s.append(&load("L1"), vec![inbox_entry("e4", &[(sms, "handled")])], 1, vec![], at(11)).await;
    assert!(stale.is_err());
    assert_eq!(dead(Some(Dismissed)).await.len(), 1);
    assert_eq!(s.inbox_counts(100).await.unwrap(), InboxCounts::default());

    // Unmatched SMS: open; handled once assigned; dismissed once, with who and why.
    for (sid, t) in [("SM1", 1), ("SM2", 2), ("SM3", 3)] {
        s.record_unmatched_sms(&unmatched(sid, t)).await.unwrap();
    }
    s.assign_unmatched_sms("SM2", &load("L1"), "op:r1", at(4)).await.unwrap();
    assert_eq!(s.dismiss_unmatched_sms("SM3", "ana", "a wrong number", at(5)).await.unwrap(), SmsDismissal::Dismissed);
    assert_eq!(
        s.dismiss_unmatched_sms("SM3", "bo", "spam", at(6)).await.unwrap(),
        SmsDismissal::Already { by: "ana".into(), at: at(5) }
    );
    assert_eq!(
        s.dismiss_unmatched_sms("SM2", "ana", "x", at(6)).await.unwrap(),
        SmsDismissal::Assigned { load_id: load("L1"), event_id: "op:r1".into() }
    );
    assert_eq!(s.dismiss_unmatched_sms("SM9", "ana", "x", at(6)).await.unwrap(), SmsDismissal::NotFound);
    // A dismissed one is assigned to no load after.
    assert_eq!(
        s.assign_unmatched_sms("SM3", &load("L1"), "op:r2", at(7)).await.unwrap(),
        SmsAssignment::Dismissed { by: "ana".into() }
    );
    let sms_page = |state| {
        let s = s.clone();
        async move {
            let rows = s.unmatched_sms_page(state, None, 10).await.unwrap();
            rows.iter()
                .map(|u| {
                    (u.sms.message_sid.clone(), u.inbox.clone(), u.assigned_load.clone(), u.dismissed_reason.clone())
                })
                .collect::<Vec<_>>()
        }
    };
    let sm3 = (
        "SM3".to_string(),
        InboxMark { state: Dismissed, by: Some("ana".into()), at: Some(at(5)) },
        None,
        Some("a wrong number".to_string()),
    );
    let sm2 = (
        "SM2".to_string(),
        InboxMark { state: Handled, by: Some("op:r1".into()), at: Some(at(4)) },
        Some(load("L1")),
        None,
    );
    let sm1 = ("SM1".to_string(), InboxMark::OPEN, None, None);
    assert_eq!(sms_page(None).await, [sm3.clone(), sm2.clone(), sm1.clone()]);
    assert_eq!(sms_page(Some(Open)).await, [sm1]);
    assert_eq!(sms_page(Some(Handled)).await, [sm2]);
    assert_eq!(sms_page(Some(Dismissed)).await, std::slice::from_ref(&sm3));
    let one = s.unmatched_sms_one("SM3").await.unwrap().unwrap();
    assert_eq!((one.sms.message_sid, one.inbox, one.dismissed_reason), (sm3.0, sm3.1, sm3.3));
    assert_eq!(s.unmatched_sms_one("SM9").await.unwrap(), None);
    assert_eq!(s.inbox_counts(100).await.unwrap().unmatched, 1);

    // Counts stop at the bound.
    for (sid, t) in [("SM4", 4), ("SM5", 5)] {
        s.record_unmatched_sms(&unmatched(sid, t)).await.unwrap();
    }
    assert_eq!(s.inbox_counts(100).await.unwrap().unmatched, 3);
    assert_eq!(s.inbox_counts(2).await.unwrap().unmatched, 2);
}

/// A shadow decision of `shadow` for event `seq` of load `l`, stored at `recorded`.
pub fn shadow_decision(l: &str, seq: u64, shadow: &str, recorded: Timestamp) -> ShadowDecision {
    use haul_core::replay::Agreement;
    let event_id = format!("e{seq}");
    let agreement = [Agreement::Same, Agreement::Different, Agreement::Error][seq as usize % 3];
    ShadowDecision {
        load_id: load(l),
        event_id: event_id.clone(),
        shadow: shadow.into(),
        event_seq: seq,
        event: json!({"event_id": event_id, "kind": "location_ping", "risk": "high"}),
        rule: "rule1".into(),
        primary: json!({"decision_id": format!("dec:{event_id}"), "actions": []}),
        decision: (agreement != Agreement::Error).then(|| json!({"decider": shadow, "seq": seq})),
        agreement,
        error: (agreement == Agreement::Error).then(|| "the sop shadow failed: it's \"quoted\"\nand long".into()),
        decided_at: add(t0(), Duration::from_millis(seq * 1000 + 123)),
        recorded_at: recorded,
    }
}

pub async fn shadow_decisions_are_kept_once_read_in_pages_and_pruned(s: DynStore) {
    let mut all = Vec::new();
    for seq in [1, 3, 5] {
        for shadow in ["llm:m", "sop"] {
            let d = shadow_decision("L1", seq, shadow, at(seq));
            assert!(s.record_shadow(&d).await.unwrap(), "new");
            all.push(d);
        }
    }
    let other = shadow_decision("L2", 1, "sop", at(1));
    assert!(s.record_shadow(&other).await.unwrap());
    // A redelivered event's shadow is not stored again: the first stays.
    let mut again = shadow_decision("L1", 3, "sop", at(50));
    again.error = Some("second".into());
    assert!(!s.record_shadow(&again).await.unwrap(), "a second decision for one key is ignored");
    let page = |after: ShadowCursor, limit: usize| {
        let s = s.clone();
        async move { s.shadow_page(&load("L1"), &after, limit).await.unwrap() }
    };
    assert_eq!(page(ShadowCursor::default(), 100).await, all, "every field round-trips, in (seq, shadow) order");
    let first = page(ShadowCursor::default(), 4).await;
    assert_eq!(first, all[..4]);
    assert_eq!(page(ShadowCursor::after(&first[3]), 4).await, all[4..]);
    assert_eq!(page(ShadowCursor::after(&all[5]), 4).await, vec![]);
    assert_eq!(s.shadow_page(&load("L2"), &ShadowCursor::default(), 10).await.unwrap(), vec![other]);
    assert!(s.shadow_page(&load("none"), &ShadowCursor::default(), 10).await.unwrap().is_empty());
    // Retention: stored before the cutoff, in batches; the log is never touched.
    let log_before = s.read(&load("L1")).await.unwrap();
    let report = s.prune(at(4), 2).await.unwrap();
    assert_eq!(report, PruneReport { shadow: 2, ..PruneReport::default() });
    let report = s.prune(at(4), 1000).await.unwrap();
    assert_eq!(report, PruneReport { shadow: 3, ..PruneReport::default() }, "L1's seq 1 and 3, L2's seq 1");
    assert_eq!(page(ShadowCursor::default(), 100).await, all[4..]);
    assert_eq!(s.read(&load("L1")).await.unwrap(), log_before);
}

/// The [`LogReader`](crate::LogReader) contract: `reader` reads the database `store`
/// writes to. Each backend runs it with its read-only reader.
pub async fn log_reader_reads_what_was_appended(store: &dyn Store, reader: &dyn crate::LogReader) {
    use crate::LoadSelection;
    let t0 = haul_core::time::from_ms(1_772_434_800_000);
    let later = haul_core::time::add(t0, std::time::Duration::from_secs(3600));
    let update = |client: &str| {
        crate::NewEntry::stored(format!("u_{client}"), "load_update", serde_json::json!({"client": client}))
    };
    let ping = |i: usize| {
        crate::NewEntry::stored(
            format!("p{i}"),
            "location_ping",
            serde_json::json!({"lat": 1.0, "lon": 1.0, "risk": "low"}),
        )
    };
    let (a, b, c) = (load("RA"), load("RB"), load("RC"));
    store.append(&a, vec![update("acme"), ping(1), ping(2)], 0, vec![], t0).await.unwrap();
    store.append(&b, vec![update("other")], 0, vec![], t0).await.unwrap();
    store.append(&b, vec![update("acme")], 1, vec![], later).await.unwrap();
    store.append(&c, vec![ping(1)], 0, vec![], later).await.unwrap();
    let ids = |v: Vec<LoadId>| v.into_iter().map(|l| l.to_string()).collect::<Vec<_>>();
    let select = |f: LoadSelection, after: Option<LoadId>, limit: usize| async move {
        ids(reader.select_loads(&f, after.as_ref(), limit).await.unwrap())
    };
    let all = LoadSelection::default();
    assert_eq!(select(all.clone(), None, 10).await, ["RA", "RB", "RC"]);
    assert_eq!(select(all.clone(), None, 2).await, ["RA", "RB"]);
    assert_eq!(select(all.clone(), Some(b.clone()), 10).await, ["RC"]);
    let since = LoadSelection { since: Some(later), ..LoadSelection::default() };
    assert_eq!(select(since, None, 10).await, ["RB", "RC"]);
    let acme = LoadSelection { client: Some("acme".into()), ..LoadSelection::default() };
    assert_eq!(select(acme.clone(), None, 10).await, ["RA", "RB"]);
    let both = LoadSelection { client: Some("acme".into()), since: Some(later) };
    assert_eq!(select(both, None, 10).await, ["RB"]);
    let nobody = LoadSelection { client: Some("nobody".into()), ..LoadSelection::default() };
    assert!(select(nobody, None, 10).await.is_empty());
    // Pages in seq order, bounded, the same records a full read gives.
    let (full, _) = store.read(&a).await.unwrap();
    let first = reader.read_log_page(&a, 0, 2).await.unwrap();
    let rest = reader.read_log_page(&a, 2, 2).await.unwrap();
    assert_eq!([first, rest].concat(), full);
    assert!(reader.read_log_page(&load("none"), 0, 10).await.unwrap().is_empty());
    // Shadow decisions, read-only, in the same pages as the store's.
    let shadows: Vec<ShadowDecision> = [2, 4, 6].iter().map(|seq| shadow_decision("RA", *seq, "sop", t0)).collect();
    for d in &shadows {
        store.record_shadow(d).await.unwrap();
    }
    let first = reader.read_shadow_page(&a, &ShadowCursor::default(), 2).await.unwrap();
    let rest = reader.read_shadow_page(&a, &ShadowCursor::after(&first[1]), 2).await.unwrap();
    assert_eq!([first, rest].concat(), shadows);
    assert!(reader.read_shadow_page(&b, &ShadowCursor::default(), 10).await.unwrap().is_empty());
}

pub async fn conflicts_are_counted_per_load_most_first(s: DynStore) {
    for l in ["L1", "L2", "L3"] {
        s.append(&load(l), vec![entry("e1")], 0, vec![], at(1)).await.unwrap();
    }
    assert!(s.conflict_loads(10).await.unwrap().is_empty(), "no load has a conflict yet");
    for (l, t) in [("L2", 5), ("L3", 6), ("L2", 7), ("L9", 8)] {
        // A load the store does not have (its first append lost a race) counts nothing.
        s.record_conflict(&load(l), at(t)).await.unwrap();
    }
    let got: Vec<_> = s
        .conflict_loads(10)
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.load_id.to_string(), c.conflicts, c.last_conflict_at))
        .collect();
    assert_eq!(got, [("L2".to_string(), 2, at(7)), ("L3".to_string(), 1, at(6))]);
    assert_eq!(s.conflict_loads(1).await.unwrap().len(), 1);
    // The count is beside the log, not in it: the version is unchanged.
    assert_eq!(s.read(&load("L2")).await.unwrap().1, 1);
}

pub async fn the_console_secret_is_made_once_and_shared(s: DynStore) {
    let first = s.console_secret(&[7; 32], at(1)).await.unwrap();
    assert_eq!(first, [7; 32], "the first call keeps its candidate");
    // Every later call, with any candidate (another process's), answers the kept one.
    assert_eq!(s.console_secret(&[9; 32], at(2)).await.unwrap(), [7; 32]);
    assert_eq!(s.console_secret(&[0; 32], at(3)).await.unwrap(), [7; 32]);
}

pub async fn racing_first_console_secrets_agree(s: DynStore) {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..8u8 {
        let s = s.clone();
        tasks.spawn(async move { s.console_secret(&[i + 1; 32], at(1)).await.unwrap() });
    }
    let mut seen = std::collections::BTreeSet::new();
    while let Some(secret) = tasks.join_next().await {
        seen.insert(secret.unwrap());
    }
    assert_eq!(seen.len(), 1, "eight processes starting at once share one secret: {seen:?}");
}

pub async fn ended_sessions_are_kept_until_they_expire(s: DynStore) {
    assert!(!s.session_revoked("n1").await.unwrap());
    s.revoke_session("n1", at(100), at(1)).await.unwrap();
    s.revoke_session("n1", at(100), at(2)).await.unwrap();
    s.revoke_session("n2", at(50), at(2)).await.unwrap();
    assert!(s.session_revoked("n1").await.unwrap());
    assert!(s.session_revoked("n2").await.unwrap());
    assert!(!s.session_revoked("n3").await.unwrap());
    // A later sign-out drops the nonces whose cookies have expired anyway.
    s.revoke_session("n3", at(200), at(60)).await.unwrap();
    assert!(!s.session_revoked("n2").await.unwrap(), "expired at 50, dropped at 60");
    assert!(s.session_revoked("n1").await.unwrap());
    assert!(s.session_revoked("n3").await.unwrap());
}

pub async fn operator_requests_are_taken_once_per_load_and_event(s: DynStore) {
    use crate::RequestClaim::{New, Other, Same};
    let claim = |l: &str, e: &str, body: &str, t: u64| {
        let (s, l, e, body) = (s.clone(), load(l), e.to_owned(), body.to_owned());
        async move { s.claim_operator_request(&l, &e, &body, at(t)).await.unwrap() }
    };
    assert_eq!(claim("L1", "op:r1", "{\"a\":1}", 1).await, New);
    assert_eq!(claim("L1", "op:r1", "{\"a\":1}", 2).await, Same, "a retry");
    assert_eq!(claim("L1", "op:r1", "{\"a\":2}", 3).await, Other, "the id reused for another action");
    assert_eq!(claim("L2", "op:r1", "{\"a\":2}", 4).await, New, "on another load the id is its own");
    assert_eq!(claim("L1", "op:r2", "{\"a\":2}", 5).await, New);
    // Pruned with the acked queue messages, counted with them.
    let report = s.prune(at(3), 1000).await.unwrap();
    assert_eq!(report, PruneReport { queue: 1, ..PruneReport::default() });
    assert_eq!(claim("L1", "op:r1", "{\"a\":2}", 6).await, New, "forgotten past retention");
    assert_eq!(claim("L2", "op:r1", "{\"a\":3}", 7).await, Other);
}
