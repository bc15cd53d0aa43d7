//! An OTLP trace receiver over real HTTP, for the tests and `haul bench`: what an
//! OpenTelemetry collector's `otlp` receiver takes on `POST /v1/traces`
//! (`application/x-protobuf`), decoded with the official protobuf definitions
//! (`opentelemetry-proto`'s generated types), never a parser of ours.
//!
//! It keeps every span it is sent, with its resource's `service.name` and `haul.role`,
//! so a test can follow one event's trace across processes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;

/// One span as received, its ids in lowercase hex.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReceivedSpan {
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root.
    pub parent_span_id: String,
    pub name: String,
    /// `SERVER`, `CLIENT`, `PRODUCER`, `CONSUMER`, `INTERNAL`.
    pub kind: String,
    /// Each link's `(trace_id, span_id)`.
    pub links: Vec<(String, String)>,
    /// Every attribute as text (a list joined by commas).
    pub attributes: BTreeMap<String, String>,
    /// The status said error.
    pub error: bool,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
    /// The resource's `service.name`, `haul.role` and `process.pid`.
    pub service: String,
    pub role: String,
    pub pid: String,
}

impl ReceivedSpan {
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

#[derive(Default)]
struct Kept {
    spans: Vec<ReceivedSpan>,
    /// Spans received: kept, or (`counting`) only counted.
    received: usize,
    counting: bool,
}

/// The receiver, serving until dropped.
pub struct OtlpReceiver {
    /// `http://127.0.0.1:port`: what `OTEL_EXPORTER_OTLP_ENDPOINT` takes.
    pub base_url: String,
    kept: Arc<Mutex<Kept>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl OtlpReceiver {
    pub async fn start() -> std::io::Result<OtlpReceiver> {
        OtlpReceiver::start_on("127.0.0.1:0").await
    }

    /// One that decodes each request, as a collector does, and counts its spans
    /// without keeping them (`received`): for `haul bench`, which sends hundreds of
    /// thousands.
    pub async fn start_counting() -> std::io::Result<OtlpReceiver> {
        OtlpReceiver::serve("127.0.0.1:0", true).await
    }

    /// On `listen`; `GET /spans` answers what it received, as JSON (`ReceivedSpan`s).
    pub async fn start_on(listen: &str) -> std::io::Result<OtlpReceiver> {
        OtlpReceiver::serve(listen, false).await
    }

    async fn serve(listen: &str, counting: bool) -> std::io::Result<OtlpReceiver> {
        let kept = Arc::new(Mutex::new(Kept { counting, ..Kept::default() }));
        let app = axum::Router::new()
            .route("/v1/traces", post(receive))
            .route("/spans", axum::routing::get(received))
            .with_state(kept.clone());
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let base_url = format!("http://{}", listener.local_addr()?);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(OtlpReceiver { base_url, kept, task })
    }

    /// The variables that point a haul process's span export here.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), self.base_url.clone()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL".into(), "http/protobuf".into()),
            ("OTEL_BSP_SCHEDULE_DELAY".into(), "50".into()),
        ]
    }

    /// Spans received, kept or counted.
    pub fn received(&self) -> usize {
        self.kept.lock().unwrap_or_else(|p| p.into_inner()).received
    }

    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner()).spans.clone()
    }

    /// Waits (up to `secs`) until `ready` holds of the spans received; the spans then.
    pub async fn wait_for(
        &self,
        secs: u64,
        ready: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Result<Vec<ReceivedSpan>, String> {
        for _ in 0..secs * 20 {
            let spans = self.spans();
            if ready(&spans) {
                return Ok(spans);
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        Err(format!("not within {secs} s; {} spans received", self.spans().len()))
    }
}

async fn received(State(kept): State<Arc<Mutex<Kept>>>) -> axum::Json<Vec<ReceivedSpan>> {
    axum::Json(kept.lock().unwrap_or_else(|p| p.into_inner()).spans.clone())
}

async fn receive(State(kept): State<Arc<Mutex<Kept>>>, body: Bytes) -> Response {
    let request = match ExportTraceServiceRequest::decode(body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("not an ExportTraceServiceRequest: {e}")).into_response(),
    };
    let counting = kept.lock().unwrap_or_else(|p| p.into_inner()).counting;
    let (count, spans) = if counting {
        let n = request.resource_spans.iter().flat_map(|r| &r.scope_spans).map(|s| s.spans.len()).sum();
        (n, vec![])
    } else {
        let spans = decoded(request);
        (spans.len(), spans)
    };
    {
        let mut k = kept.lock().unwrap_or_else(|p| p.into_inner());
        k.received += count;
        k.spans.extend(spans);
    }
    let answer = ExportTraceServiceResponse { partial_success: None }.encode_to_vec();
    ([(header::CONTENT_TYPE, "application/x-protobuf")], answer).into_response()
}

/// The spans of a request, each with its resource's names.
pub fn decoded(request: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    let mut out = Vec::new();
    for rs in request.resource_spans {
        let resource = rs.resource.map(|r| attributes(&r.attributes)).unwrap_or_default();
        let service = resource.get("service.name").cloned().unwrap_or_default();
        let role = resource.get("haul.role").cloned().unwrap_or_default();
        let pid = resource.get("process.pid").cloned().unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                out.push(ReceivedSpan {
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent_span_id: hex(&s.parent_span_id),
                    kind: kind_name(s.kind).to_owned(),
                    links: s.links.iter().map(|l| (hex(&l.trace_id), hex(&l.span_id))).collect(),
                    attributes: attributes(&s.attributes),
                    error: s.status.is_some_and(|st| st.code == 2),
                    start_unix_nano: s.start_time_unix_nano,
                    end_unix_nano: s.end_time_unix_nano,
                    name: s.name,
                    service: service.clone(),
                    role: role.clone(),
                    pid: pid.clone(),
                });
            }
        }
    }
    out
}

fn kind_name(kind: i32) -> &'static str {
    match SpanKind::try_from(kind) {
        Ok(SpanKind::Server) => "SERVER",
        Ok(SpanKind::Client) => "CLIENT",
        Ok(SpanKind::Producer) => "PRODUCER",
        Ok(SpanKind::Consumer) => "CONSUMER",
        Ok(SpanKind::Internal) => "INTERNAL",
        _ => "UNSPECIFIED",
    }
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter().map(|kv| (kv.key.clone(), kv.value.as_ref().map(text).unwrap_or_default())).collect()
}

fn text(v: &AnyValue) -> String {
    match &v.value {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(n)) => n.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::ArrayValue(a)) => a.values.iter().map(text).collect::<Vec<_>>().join(","),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
