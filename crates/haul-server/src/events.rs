//! Events in: `POST /v1/loads/{load_id}/events`, and the one way an event from
//! outside is queued ([`accept`]), which the Twilio webhook shares.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use haul_core::InboundEvent;
use haul_core::event::EventBody;
use haul_core::mask::clip_quotes;
use haul_core::trace::TraceParent;
use haul_store::{Published, RequestClaim};
use serde_json::{Value, json};
use tracing::error;

use haul_runtime::spans::{Kind, Span};

use crate::state::{ApiBody, ApiCaller, ApiState, LoadPath, Trace, error};

pub(crate) async fn post_event(
    caller: ApiCaller,
    State(s): State<Arc<ApiState>>,
    LoadPath(load): LoadPath,
    Trace(trace): Trace,
    ApiBody(body): ApiBody,
) -> Response {
    let Ok(text) = std::str::from_utf8(&body) else {
        return error(StatusCode::BAD_REQUEST, "bad_utf8", "the body is not valid UTF-8");
    };
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_json",
                format!("the body is not JSON: {}", clip_quotes(&e.to_string())),
            );
        }
    };
    let parsed = if caller.operator {
        InboundEvent::from_operator(load.clone(), value)
    } else {
        InboundEvent::from_outside(load.clone(), value)
    };
    let mut event = match parsed {
        Ok(e) => e,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.code, e.message),
    };
    let mut at_defaulted = false;
    if let EventBody::LocationPing(p) = &mut event.body
        && p.at.is_none()
    {
        p.at = Some(s.clock.now());
        at_defaulted = true;
    }
    accept(&s, &event, at_defaulted, trace).await
}

/// Queues an event; a repeat of an id answers `duplicate`, or 422 when its payload differs.
/// An operator's event is taken in the store first, so its reuse is refused on every
/// load queue (`haul_runtime::operator::claim`). The message carries `trace`, which
/// the event's run continues; a duplicate keeps the first publish's.
pub(crate) async fn accept(s: &ApiState, event: &InboundEvent, at_defaulted: bool, trace: TraceParent) -> Response {
    let reused = || {
        error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "event_id_reused",
            format!("event id {} was already used for this load with another payload", event.event_id),
        )
    };
    let mut retried = false;
    if let EventBody::OperatorAction(_) = event.body {
        match haul_runtime::operator::claim(s.store.as_ref(), event, s.clock.now()).await {
            Ok(RequestClaim::New) => {}
            Ok(RequestClaim::Same) => retried = true,
            Ok(RequestClaim::Other) => return reused(),
            Err(e) => {
                error!(error = %e, "taking an operator request failed");
                return error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    "the event was not queued; try again",
                );
            }
        }
    }
    // The publish is a PRODUCER span of its own: the context the message keeps, which
    // the event's run is linked to.
    let (producer, began) = (haul_runtime::trace::child(&trace), s.clock.now());
    let published = s.queue.publish_handing(event, Some(producer), began).await;
    let end = s.clock.now();
    s.spans.record(|| {
        let span = Span::new("send loads", Kind::Producer, producer, Some(&trace), began, end)
            .attr("messaging.system", s.queue.system())
            .attr("messaging.operation.type", "send")
            .attr("messaging.operation.name", "send")
            .attr("messaging.destination.name", "loads")
            .attr("messaging.message.id", event.event_id.as_str())
            .attr("haul.load_id", event.load_id.as_str());
        match &published {
            Ok((Published::New, _)) => span.attr("haul.published", "new"),
            Ok((Published::Duplicate, _)) => span.attr("haul.published", "duplicate"),
            Err(e) => span.failed("store_unavailable", e.to_string()),
        }
    });
    match published {
        // A queue that cannot tell a duplicate (SQS FIFO): the store could.
        Ok((Published::New, _)) if retried => {
            (StatusCode::OK, axum::Json(json!({"event_id": event.event_id, "status": "duplicate"}))).into_response()
        }
        Ok((Published::New, handed)) => {
            metrics::counter!("haul_events_accepted_total", "kind" => event.kind()).increment(1);
            // A message handed over is this process's worker's already: nobody to wake.
            if let Some(w) = s.wake_worker.as_ref().filter(|_| !handed) {
                w.notify_one();
            }
            (StatusCode::ACCEPTED, axum::Json(json!({"event_id": event.event_id, "status": "queued"}))).into_response()
        }
        Ok((Published::Duplicate, _)) => {
            let first = match s.queue.published_event(&event.load_id, &event.event_id).await {
                Ok(first) => first,
                Err(e) => {
                    error!(error = %e, "reading the first copy of a duplicate failed");
                    return error(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", "try again");
                }
            };
            let same = first.is_none_or(|mut first| {
                // A ping sent twice without `at` got the receive time each time.
                if at_defaulted
                    && let (EventBody::LocationPing(f), EventBody::LocationPing(n)) = (&mut first.body, &event.body)
                {
                    f.at = n.at;
                }
                first == *event
            });
            if same {
                (StatusCode::OK, axum::Json(json!({"event_id": event.event_id, "status": "duplicate"}))).into_response()
            } else {
                reused()
            }
        }
        Err(e) => {
            error!(error = %e, "queueing an event failed");
            error(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", "the event was not queued; try again")
        }
    }
}
