//! haul's spans out over OTLP: the one place that knows OpenTelemetry's SDK.
//!
//! The runtime and the server record finished spans (`haul_runtime::spans::Span`) with
//! the ids they drew and stored, so a span exported here is the span the store's rows
//! name. This crate turns them into the SDK's `SpanData` and hands them in batches to
//! the SDK's own OTLP exporter (`opentelemetry_otlp::SpanExporter`, HTTP/protobuf or
//! gRPC), configured by the standard `OTEL_*` variables. The SDK's `Tracer` is not
//! used: it draws its own span ids.
//!
//! Recording never waits (a push under a lock held for the push alone): a span goes
//! into a bounded queue (`OTEL_BSP_MAX_QUEUE_SIZE`) or, full, is dropped and counted
//! (`haul_spans_dropped_total`). One task drains the queue when a batch is full or the
//! delay has passed; an export that fails or is late drops its batch (counted too) and
//! the next goes on. Off by default: without `OTEL_TRACES_EXPORTER=otlp` or an OTLP endpoint
//! variable, `Settings::from_env` gives `None` and nothing here runs.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use haul_core::trace::TraceParent;
use haul_runtime::spans::{Kind, Span, SpanSink, Spans, Value};
use opentelemetry::trace::{Link, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState};
use opentelemetry::{Array, InstrumentationScope, KeyValue, StringValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter as _, SpanLinks};
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;
use tracing::{info, warn};

/// The OTLP transports haul exports over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// `http/protobuf`: POST to `…/v1/traces` (port 4318 by default).
    HttpProtobuf,
    /// `grpc`: the collector's TraceService (port 4317 by default).
    Grpc,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::HttpProtobuf => "http/protobuf",
            Protocol::Grpc => "grpc",
        }
    }
}

/// How spans are exported: the batch processor's settings (`OTEL_BSP_*`), the
/// transport and the service's name. The endpoint, headers and timeout the SDK's
/// exporter reads from `OTEL_EXPORTER_OTLP_*` itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub protocol: Protocol,
    /// Spans waiting for export at most; more are dropped (`OTEL_BSP_MAX_QUEUE_SIZE`).
    pub max_queue: usize,
    /// Spans per export at most (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`; at most `max_queue`).
    pub max_batch: usize,
    /// How long a span waits for its batch to fill (`OTEL_BSP_SCHEDULE_DELAY`, ms).
    pub delay: Duration,
    /// An export still going after this is given up, its batch dropped
    /// (`OTEL_BSP_EXPORT_TIMEOUT`, ms).
    pub export_timeout: Duration,
    /// `service.name` (`OTEL_SERVICE_NAME`; `haul` when unset).
    pub service_name: String,
}

/// A variable that does not read; the message names it and what it takes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{name}={value:?}: {expected}")]
pub struct SettingError {
    pub name: &'static str,
    pub value: String,
    pub expected: &'static str,
}

const ENDPOINTS: [&str; 2] = ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"];

impl Settings {
    /// The export settings from the environment (`env` reads a variable), or `None`
    /// when export is off: `OTEL_SDK_DISABLED=true`, `OTEL_TRACES_EXPORTER=none`, or
    /// neither `OTEL_TRACES_EXPORTER=otlp` nor an OTLP endpoint variable set.
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Result<Option<Settings>, SettingError> {
        let get = |name: &str| env(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        if let Some(v) = get("OTEL_SDK_DISABLED") {
            match v.to_ascii_lowercase().as_str() {
                "true" => return Ok(None),
                "false" => {}
                _ => return Err(bad("OTEL_SDK_DISABLED", v, "true or false")),
            }
        }
        let on = match get("OTEL_TRACES_EXPORTER").as_deref() {
            Some("otlp") => true,
            Some("none") => false,
            Some(other) => {
                return Err(bad("OTEL_TRACES_EXPORTER", other.into(), "otlp or none (haul exports OTLP only)"));
            }
            None => ENDPOINTS.iter().any(|n| get(n).is_some()),
        };
        if !on {
            return Ok(None);
        }
        let protocol = match get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| get("OTEL_EXPORTER_OTLP_PROTOCOL")) {
            None => Protocol::HttpProtobuf,
            Some(p) => match p.as_str() {
                "http/protobuf" => Protocol::HttpProtobuf,
                "grpc" => Protocol::Grpc,
                _ => {
                    let name = if get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").is_some() {
                        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
                    } else {
                        "OTEL_EXPORTER_OTLP_PROTOCOL"
                    };
                    return Err(bad(name, p, "http/protobuf or grpc"));
                }
            },
        };
        let number = |name: &'static str, default: u64| -> Result<u64, SettingError> {
            match get(name) {
                None => Ok(default),
                Some(v) => match v.parse::<u64>() {
                    Ok(n) if n > 0 => Ok(n),
                    _ => Err(bad(name, v, "a whole number above 0")),
                },
            }
        };
        let max_queue = number("OTEL_BSP_MAX_QUEUE_SIZE", 2048)?.min(1 << 20) as usize;
        let max_batch = (number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)? as usize).min(max_queue);
        Ok(Some(Settings {
            protocol,
            max_queue,
            max_batch,
            delay: Duration::from_millis(number("OTEL_BSP_SCHEDULE_DELAY", 5000)?),
            export_timeout: Duration::from_millis(number("OTEL_BSP_EXPORT_TIMEOUT", 30_000)?),
            service_name: get("OTEL_SERVICE_NAME").unwrap_or_else(|| "haul".into()),
        }))
    }
}

fn bad(name: &'static str, value: String, expected: &'static str) -> SettingError {
    SettingError { name, value, expected }
}

/// The exporter could not be built from its settings (a bad endpoint, say).
#[derive(Debug, thiserror::Error)]
#[error("the OTLP span exporter ({protocol}): {why}")]
pub struct StartError {
    pub protocol: &'static str,
    pub why: String,
}

/// Spans being exported: the `Spans` to hand the runtime, and the task draining them.
pub struct Exporting {
    spans: Spans,
    dropped: Arc<AtomicU64>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Exporting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Exporting")
    }
}

impl Exporting {
    /// Builds the SDK's exporter for `settings.protocol` (it reads the endpoint, the
    /// headers and the timeout from `OTEL_EXPORTER_OTLP_*`) and starts the task that
    /// drains the queue. Called inside the tokio runtime.
    pub fn start(settings: &Settings, role: &str) -> Result<Exporting, StartError> {
        let built = match settings.protocol {
            Protocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder().with_http().build(),
            Protocol::Grpc => opentelemetry_otlp::SpanExporter::builder().with_tonic().build(),
        };
        let mut exporter =
            built.map_err(|e| StartError { protocol: settings.protocol.as_str(), why: e.to_string() })?;
        let resource = Resource::builder()
            .with_service_name(settings.service_name.clone())
            .with_attributes([
                KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
                KeyValue::new("haul.role", role.to_owned()),
                KeyValue::new("process.pid", i64::from(std::process::id())),
            ])
            .build();
        exporter.set_resource(&resource);
        Ok(Exporting::with(exporter, settings))
    }

    /// Drains into `exporter` (any `SpanExporter`: the tests' in-memory one too).
    pub fn with<E: opentelemetry_sdk::trace::SpanExporter + 'static>(exporter: E, settings: &Settings) -> Exporting {
        let (stop, stopped) = oneshot::channel();
        let dropped = Arc::new(AtomicU64::new(0));
        let queue = Arc::new(Queue {
            waiting: Mutex::new(Vec::with_capacity(settings.max_batch)),
            full: Notify::new(),
            max_queue: settings.max_queue,
            max_batch: settings.max_batch,
            dropped: dropped.clone(),
        });
        let task = tokio::spawn(drain(queue.clone(), stopped, exporter, settings.clone()));
        info!(
            protocol = settings.protocol.as_str(),
            max_queue = settings.max_queue,
            max_batch = settings.max_batch,
            delay_ms = settings.delay.as_millis() as u64,
            "exporting spans over OTLP"
        );
        Exporting { spans: Spans::to(queue), dropped, stop, task }
    }

    /// What the worker, the dispatcher and the edge record into.
    pub fn spans(&self) -> Spans {
        self.spans.clone()
    }

    /// Spans dropped because the queue was full, so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Exports what is queued (within one export timeout) and stops.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        if let Err(e) = self.task.await {
            warn!(error = %e, "the span exporter's task ended badly");
        }
    }
}

/// The bounded queue: what `Spans` holds. The draining task is woken once a batch is
/// full, not for each span (a wake-up per span cost a thread hand-off each, several per
/// run), and otherwise takes what waits once per delay.
struct Queue {
    waiting: Mutex<Vec<Span>>,
    full: Notify,
    max_queue: usize,
    max_batch: usize,
    dropped: Arc<AtomicU64>,
}

impl Queue {
    fn take(&self) -> Vec<Span> {
        std::mem::take(&mut *self.waiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

impl SpanSink for Queue {
    fn record(&self, span: Span) {
        // A context its caller did not sample is continued, not exported.
        if !span.context.sampled() {
            return;
        }
        let waiting = {
            let mut waiting = self.waiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if waiting.len() >= self.max_queue {
                None
            } else {
                waiting.push(span);
                Some(waiting.len())
            }
        };
        match waiting {
            Some(n) if n == self.max_batch => self.full.notify_one(),
            Some(_) => {}
            None => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("haul_spans_dropped_total", "reason" => "queue_full").increment(1);
            }
        }
    }
}

async fn drain<E: opentelemetry_sdk::trace::SpanExporter>(
    queue: Arc<Queue>,
    mut stopped: oneshot::Receiver<()>,
    exporter: E,
    settings: Settings,
) {
    let scope = InstrumentationScope::builder("haul").with_version(env!("CARGO_PKG_VERSION")).build();
    let mut stopping = false;
    while !stopping {
        // A full batch, the delay, or the stop: then everything waiting, in batches.
        tokio::select! {
            () = queue.full.notified() => {}
            () = tokio::time::sleep(settings.delay) => {}
            _ = &mut stopped => stopping = true,
        }
        let mut batch = queue.take();
        while !batch.is_empty() {
            let part: Vec<Span> = batch.drain(..batch.len().min(settings.max_batch)).collect();
            export(&exporter, &scope, part, settings.export_timeout).await;
        }
    }
    let _ = exporter.shutdown();
}

async fn export<E: opentelemetry_sdk::trace::SpanExporter>(
    exporter: &E,
    scope: &InstrumentationScope,
    spans: Vec<Span>,
    limit: Duration,
) {
    let n = spans.len() as u64;
    let data = spans.into_iter().map(|s| span_data(s, scope)).collect();
    let why = match tokio::time::timeout(limit, exporter.export(data)).await {
        Ok(Ok(())) => {
            metrics::counter!("haul_spans_exported_total").increment(n);
            return;
        }
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no answer within {limit:?}"),
    };
    metrics::counter!("haul_spans_dropped_total", "reason" => "export_failed").increment(n);
    warn!(spans = n, why, "a batch of spans could not be exported; dropped");
}

fn span_context(t: &TraceParent, remote: bool) -> SpanContext {
    SpanContext::new(
        TraceId::from_bytes(t.trace_id),
        SpanId::from_bytes(t.span_id),
        TraceFlags::new(t.flags),
        remote,
        TraceState::default(),
    )
}

/// A haul span as the SDK's exporters take it.
pub fn span_data(s: Span, scope: &InstrumentationScope) -> SpanData {
    let mut links = SpanLinks::default();
    links.links = s.links.iter().map(|l| Link::with_context(span_context(l, true))).collect();
    SpanData {
        span_context: span_context(&s.context, false),
        parent_span_id: s.parent_span_id.map(SpanId::from_bytes).unwrap_or(SpanId::INVALID),
        parent_span_is_remote: s.parent_is_remote,
        span_kind: match s.kind {
            Kind::Server => SpanKind::Server,
            Kind::Client => SpanKind::Client,
            Kind::Producer => SpanKind::Producer,
            Kind::Consumer => SpanKind::Consumer,
            Kind::Internal => SpanKind::Internal,
        },
        name: Cow::Owned(s.name),
        start_time: system_time(s.start),
        end_time: system_time(s.end),
        attributes: s.attributes.into_iter().map(|(k, v)| KeyValue::new(k, value(v))).collect(),
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links,
        status: match s.error {
            Some(why) => Status::error(why),
            None => Status::Unset,
        },
        instrumentation_scope: scope.clone(),
    }
}

fn system_time(t: haul_core::Timestamp) -> SystemTime {
    let ns = u64::try_from(t.as_nanosecond()).unwrap_or(0);
    SystemTime::UNIX_EPOCH + Duration::from_nanos(ns)
}

fn value(v: Value) -> opentelemetry::Value {
    match v {
        Value::Str(s) => opentelemetry::Value::String(s.into()),
        Value::Int(n) => opentelemetry::Value::I64(n),
        Value::Bool(b) => opentelemetry::Value::Bool(b),
        Value::StrList(l) => opentelemetry::Value::Array(Array::String(l.into_iter().map(StringValue::from).collect())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(vars: &[(&str, &str)], expected: Result<Option<Settings>, &str>) {
        let got = Settings::from_env(|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string()));
        match expected {
            Ok(e) => assert_eq!(got, Ok(e), "{vars:?}"),
            Err(message) => assert_eq!(got.map_err(|e| e.to_string()), Err(message.to_string()), "{vars:?}"),
        }
    }

    fn on() -> Settings {
        Settings {
            protocol: Protocol::HttpProtobuf,
            max_queue: 2048,
            max_batch: 512,
            delay: Duration::from_millis(5000),
            export_timeout: Duration::from_millis(30_000),
            service_name: "haul".into(),
        }
    }

    #[test]
    fn export_is_off_unless_asked_for_and_a_bad_variable_is_named() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
        check(&[], Ok(None));
        check(&[("OTEL_TRACES_EXPORTER", "none"), endpoint], Ok(None));
        check(&[("OTEL_SDK_DISABLED", "true"), ("OTEL_TRACES_EXPORTER", "otlp")], Ok(None));
        check(&[("OTEL_SDK_DISABLED", "false"), endpoint], Ok(Some(on())));
        check(&[("OTEL_TRACES_EXPORTER", "otlp")], Ok(Some(on())));
        check(&[endpoint], Ok(Some(on())));
        check(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4318/v1/traces")], Ok(Some(on())));
        check(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")], Ok(None));
        let grpc = Settings { protocol: Protocol::Grpc, ..on() };
        check(&[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")], Ok(Some(grpc.clone())));
        check(
            &[
                endpoint,
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
            ],
            Ok(Some(grpc)),
        );
        let tuned = Settings {
            max_queue: 100,
            max_batch: 100,
            delay: Duration::from_millis(50),
            export_timeout: Duration::from_millis(900),
            service_name: "haul-east".into(),
            ..on()
        };
        check(
            &[
                endpoint,
                ("OTEL_BSP_MAX_QUEUE_SIZE", "100"),
                ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "512"),
                ("OTEL_BSP_SCHEDULE_DELAY", "50"),
                ("OTEL_BSP_EXPORT_TIMEOUT", "900"),
                ("OTEL_SERVICE_NAME", "haul-east"),
            ],
            Ok(Some(tuned)),
        );
        check(
            &[("OTEL_TRACES_EXPORTER", "zipkin")],
            Err(r#"OTEL_TRACES_EXPORTER="zipkin": otlp or none (haul exports OTLP only)"#),
        );
        check(&[("OTEL_SDK_DISABLED", "yes")], Err(r#"OTEL_SDK_DISABLED="yes": true or false"#));
        check(
            &[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")],
            Err(r#"OTEL_EXPORTER_OTLP_PROTOCOL="http/json": http/protobuf or grpc"#),
        );
        check(
            &[endpoint, ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "thrift")],
            Err(r#"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="thrift": http/protobuf or grpc"#),
        );
        check(
            &[endpoint, ("OTEL_BSP_MAX_QUEUE_SIZE", "0")],
            Err(r#"OTEL_BSP_MAX_QUEUE_SIZE="0": a whole number above 0"#),
        );
        check(
            &[endpoint, ("OTEL_BSP_SCHEDULE_DELAY", "5s")],
            Err(r#"OTEL_BSP_SCHEDULE_DELAY="5s": a whole number above 0"#),
        );
    }
}
