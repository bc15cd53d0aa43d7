//! `/metrics`: the process-wide Prometheus recorder, every family's `# HELP`, and the
//! figures read from the store at scrape time.
//!
//! Counters and histograms count what this process did, so they add up across
//! processes. Figures read from the store (the oldest pending outbox row, the oldest
//! due timer not yet fired, dead rows, queue depth) are the same whichever process
//! reads them, so only processes with the `api` role export them: a deployment of split
//! roles does not report them once per process (docs/operations.md, "Metrics").
//! Several api processes each report the same value: alert on `max`, never `sum`.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Every metric family haul emits, with its type and its `# HELP` text. Tests hold the
/// rendered `/metrics` to it (every family has its HELP line) and docs/operations.md
/// lists each one.
pub const FAMILIES: &[(&str, Kind, &str)] = &[
    ("haul_build_info", Kind::Gauge, "Always 1; the labels name the version, the commit and the features built in."),
    ("haul_events_accepted_total", Kind::Counter, "Events the API or the webhook queued (duplicates not counted)."),
    ("haul_runs_total", Kind::Counter, "Worker runs, by how they ended."),
    ("haul_run_duration_seconds", Kind::Histogram, "Time of one worker run, read to append."),
    ("haul_decisions_total", Kind::Counter, "Decisions appended, by decider and whether the filter decided."),
    ("haul_append_conflicts_total", Kind::Counter, "Appends refused by the version check (a re-decision follows)."),
    (
        "haul_snapshot_reads_skipped_total",
        Kind::Counter,
        "Runs that decided on their cached snapshot unread: the queue gave the log's version.",
    ),
    ("haul_load_lock_busy_total", Kind::Counter, "Runs put back because another process held the load's LoadLock."),
    ("haul_queue_poison_total", Kind::Counter, "Queue messages that were not events (dropped)."),
    ("haul_dispatches_total", Kind::Counter, "Outbox rows handled by the dispatcher, by result."),
    (
        "haul_channel_call_duration_seconds",
        Kind::Histogram,
        "Time of one call to a channel service, by channel and result.",
    ),
    (
        "haul_outbox_dead_rows_total",
        Kind::Counter,
        "Outbox rows this process buried, by action type and channel class.",
    ),
    ("haul_outbox_dead_rows_in_store", Kind::Gauge, "Dead outbox rows in the store now (read at scrape, api role)."),
    (
        "haul_outbox_oldest_pending_age_seconds",
        Kind::Gauge,
        "Age of the oldest pending outbox row, 0 when none (read at scrape, api role).",
    ),
    (
        "haul_timers_oldest_due_age_seconds",
        Kind::Gauge,
        "How long the oldest due timer not yet fired has been due, 0 when none (read at scrape, api role).",
    ),
    ("haul_queue_depth", Kind::Gauge, "Messages waiting in the load queue (read at scrape, api role)."),
    ("haul_ops_alerts_total", Kind::Counter, "OpsAlerts delivered to the ops service, by kind (each alert once)."),
    (
        "haul_ops_alert_failures_total",
        Kind::Counter,
        "OpsAlerts the ops service refused (4xx, recorded, not sent again) or could not take yet, by kind and reason.",
    ),
    ("haul_timer_pump_lag_seconds", Kind::Histogram, "How late each timer fired after its fire_at."),
    ("haul_timer_pump_last_lag_seconds", Kind::Gauge, "The lag of the last timer this process fired."),
    ("haul_llm_requests_total", Kind::Counter, "Model calls of the LLM decider, by outcome."),
    (
        "haul_shadow_decisions_total",
        Kind::Counter,
        "Shadow decisions (decider.shadow) beside the primary's, by action type and agreement.",
    ),
    ("haul_shadow_dropped_total", Kind::Counter, "Committed decisions the shadow did not decide or store, by reason."),
    ("haul_twilio_bad_signatures_total", Kind::Counter, "Webhook calls refused for their signature."),
    (
        "haul_traceparent_malformed_total",
        Kind::Counter,
        "Requests whose traceparent header did not read; each started a trace of its own.",
    ),
    ("haul_spans_exported_total", Kind::Counter, "Spans exported over OTLP (OTEL_* settings)."),
    (
        "haul_spans_dropped_total",
        Kind::Counter,
        "Spans not exported, by reason: the export queue was full, or the collector did not take the batch.",
    ),
    ("haul_unmatched_sms_total", Kind::Counter, "Distinct inbound SMS kept as unmatched."),
    ("haul_twilio_replays_total", Kind::Counter, "Webhook requests for a MessageSid already taken."),
    ("haul_twilio_status_callbacks_total", Kind::Counter, "Twilio's delivery receipts taken, by MessageStatus."),
    (
        "haul_twilio_status_unmatched_total",
        Kind::Counter,
        "Twilio delivery receipts that name no SMS of haul's (an unknown row, another message).",
    ),
    ("haul_http_connections_open", Kind::Gauge, "HTTP connections open now."),
    ("haul_http_connections_refused_total", Kind::Counter, "Connections turned away over server.max_connections."),
    (
        "haul_http_connections_evicted_total",
        Kind::Counter,
        "Connections closed to make room for a new one when every slot was taken (the longest idle first).",
    ),
    (
        "haul_load_view_records_read_total",
        Kind::Counter,
        "Log records read to show loads (their folds caught up, and their pages): what views cost.",
    ),
    (
        "haul_http_write_timeouts_total",
        Kind::Counter,
        "Connections closed because the client read nothing of an answer for server.write_timeout.",
    ),
];

/// The figures read from the store at scrape time (exported by api processes only,
/// and rendered by the scrape itself, never kept in the process-wide recorder).
pub const STORE_FIGURES: [&str; 4] = [
    "haul_outbox_dead_rows_in_store",
    "haul_outbox_oldest_pending_age_seconds",
    "haul_timers_oldest_due_age_seconds",
    "haul_queue_depth",
];

/// What `haul_build_info` says: version, commit, features.
static BUILD_INFO: OnceLock<(String, String, String)> = OnceLock::new();

/// Names the build for `haul_build_info` (the binary knows its commit and features);
/// call before [`zero_series`]. Later calls change nothing.
pub fn set_build_info(version: &str, commit: &str, features: &str) {
    let _ = BUILD_INFO.set((version.to_owned(), commit.to_owned(), features.to_owned()));
}

/// The process-wide Prometheus recorder (installed once), with every family described.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Suffix("_seconds".into()),
                    &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0],
                )
                .expect("static bucket list is not empty");
            let handle = match builder.install_recorder() {
                Ok(h) => h,
                // Another recorder is installed (tests in one process): render an empty one.
                Err(_) => PrometheusBuilder::new().build_recorder().handle(),
            };
            for (name, kind, help) in FAMILIES.iter().filter(|(n, _, _)| !STORE_FIGURES.contains(n)) {
                match kind {
                    Kind::Counter => metrics::describe_counter!(*name, *help),
                    Kind::Gauge => metrics::describe_gauge!(*name, *help),
                    Kind::Histogram => metrics::describe_histogram!(*name, *help),
                }
            }
            handle
        })
        .clone()
}

/// Every family exists from the first scrape: counters at zero for each label value
/// known in advance, histograms empty, gauges at their resting value.
pub fn zero_series() {
    let _ = metrics_handle();
    let (version, commit, features) =
        BUILD_INFO.get_or_init(|| (env!("CARGO_PKG_VERSION").to_owned(), "unknown".to_owned(), String::new())).clone();
    metrics::gauge!("haul_build_info", "version" => version, "commit" => commit, "features" => features).set(1.0);
    for kind in haul_core::event::event_kinds() {
        if kind != "action_outcome" && kind != "timer_fired" {
            metrics::counter!("haul_events_accepted_total", "kind" => kind).absolute(0);
        }
    }
    for outcome in ["committed", "already_processed", "duplicate", "left_for_redelivery", "busy", "poison", "crashed"] {
        metrics::counter!("haul_runs_total", "outcome" => outcome).absolute(0);
    }
    let _ = metrics::histogram!("haul_run_duration_seconds");
    for decider in ["filter", "sop", "fallback"] {
        for filtered in ["true", "false"] {
            metrics::counter!("haul_decisions_total", "decider" => decider, "filtered" => filtered).absolute(0);
        }
    }
    metrics::counter!("haul_append_conflicts_total").absolute(0);
    metrics::counter!("haul_snapshot_reads_skipped_total").absolute(0);
    metrics::counter!("haul_load_lock_busy_total").absolute(0);
    metrics::counter!("haul_queue_poison_total").absolute(0);
    for result in ["delivered", "retrying", "buried", "stale", "unsettled", "crashed"] {
        metrics::counter!("haul_dispatches_total", "result" => result).absolute(0);
    }
    for channel in haul_core::Channel::ALL {
        for result in ["delivered", "retryable", "permanent"] {
            let _ = metrics::histogram!(
                "haul_channel_call_duration_seconds",
                "channel" => channel.config_name(),
                "result" => result
            );
        }
    }
    for t in haul_core::ActionType::ALL {
        let class = haul_store::ops::class_name(t.class());
        metrics::counter!("haul_outbox_dead_rows_total", "action_type" => t.as_str(), "class" => class).absolute(0);
    }
    for kind in ["hero_channel_failure", "internal_failure"] {
        metrics::counter!("haul_ops_alerts_total", "kind" => kind).absolute(0);
        for reason in ["refused", "unavailable"] {
            metrics::counter!("haul_ops_alert_failures_total", "kind" => kind, "reason" => reason).absolute(0);
        }
    }
    let _ = metrics::histogram!("haul_timer_pump_lag_seconds");
    metrics::gauge!("haul_timer_pump_last_lag_seconds").set(0.0);
    for outcome in [
        "decided",
        "transport",
        "timeout",
        "rate_limited",
        "status",
        "too_large",
        "malformed",
        "refusal",
        "no_tool_calls",
        "invalid",
    ] {
        metrics::counter!("haul_llm_requests_total", "outcome" => outcome).absolute(0);
    }
    for t in haul_core::ActionType::ALL.iter().map(|t| t.as_str()).chain(["none"]) {
        for a in haul_core::replay::Agreement::ALL {
            metrics::counter!("haul_shadow_decisions_total", "action_type" => t, "agreement" => a.as_str()).absolute(0);
        }
    }
    for reason in ["queue_full", "stopped", "store_error"] {
        metrics::counter!("haul_shadow_dropped_total", "reason" => reason).absolute(0);
    }
    metrics::counter!("haul_twilio_bad_signatures_total").absolute(0);
    metrics::counter!("haul_traceparent_malformed_total").absolute(0);
    metrics::counter!("haul_spans_exported_total").absolute(0);
    for reason in ["queue_full", "export_failed"] {
        metrics::counter!("haul_spans_dropped_total", "reason" => reason).absolute(0);
    }
    metrics::counter!("haul_unmatched_sms_total").absolute(0);
    metrics::counter!("haul_twilio_replays_total").absolute(0);
    for status in ["delivered", "undelivered", "failed"] {
        metrics::counter!("haul_twilio_status_callbacks_total", "status" => status).absolute(0);
    }
    metrics::counter!("haul_twilio_status_unmatched_total").absolute(0);
    metrics::gauge!("haul_http_connections_open").increment(0.0);
    metrics::counter!("haul_http_connections_refused_total").absolute(0);
    metrics::counter!("haul_http_connections_evicted_total").absolute(0);
    metrics::counter!("haul_http_write_timeouts_total").absolute(0);
    metrics::counter!("haul_load_view_records_read_total").absolute(0);
}
