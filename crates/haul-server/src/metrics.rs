//! `/metrics`: the process-wide Prometheus recorder, and the figures read from the
//! store at scrape time (so whichever role's process is scraped reports them).

use std::sync::{Arc, OnceLock};

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use haul_store::OutboxStatus;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::api::ApiState;

/// The process-wide Prometheus recorder (installed once).
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
            match builder.install_recorder() {
                Ok(h) => h,
                // Another recorder is installed (tests in one process): render an empty one.
                Err(_) => PrometheusBuilder::new().build_recorder().handle(),
            }
        })
        .clone()
}

/// Series that dashboards divide by exist from the first scrape, at zero.
pub fn zero_series() {
    let _ = metrics_handle();
    metrics::counter!("haul_append_conflicts_total").absolute(0);
    metrics::counter!("haul_http_connections_refused_total").absolute(0);
    for kind in ["hero_channel_failure", "internal_failure"] {
        metrics::counter!("haul_ops_alerts_total", "kind" => kind).absolute(0);
        for reason in ["refused", "unavailable"] {
            metrics::counter!("haul_ops_alert_failures_total", "kind" => kind, "reason" => reason).absolute(0);
        }
    }
    for t in haul_core::ActionType::ALL {
        metrics::counter!("haul_outbox_dead_rows_total", "action_type" => t.as_str()).absolute(0);
    }
}

pub(crate) async fn metrics(State(s): State<Arc<ApiState>>) -> Response {
    // Figures that live in the store are read at scrape time, so any role's process
    // reports them.
    let now = s.clock.now();
    if let Ok(oldest) = s.store.oldest_pending_created_at().await {
        let age = oldest.map(|t| haul_core::time::since(now, t).as_secs_f64()).unwrap_or(0.0);
        metrics::gauge!("haul_outbox_oldest_pending_age_seconds").set(age);
    }
    if let Ok(n) = s.store.count_by_status(OutboxStatus::Dead).await {
        metrics::gauge!("haul_outbox_dead_rows").set(n as f64);
    }
    if let Ok(n) = s.queue.depth().await {
        metrics::gauge!("haul_queue_depth").set(n as f64);
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], s.metrics.render()).into_response()
}
