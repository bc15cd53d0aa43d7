//! What haul exports reaches an OTLP receiver as it was recorded: the ids the store
//! keeps, the parent, the links, the kind, the attributes, the status; an unsampled
//! context is not exported; a full queue drops and counts, never waits.

use std::time::Duration;

use haul_core::Timestamp;
use haul_core::trace::TraceParent;
use haul_harness::testkit_otlp::OtlpReceiver;
use haul_otel::{Exporting, Protocol, Settings};
use haul_runtime::spans::{Kind, Span};
use opentelemetry_otlp::WithExportConfig;

fn settings(max_queue: usize) -> Settings {
    Settings {
        protocol: Protocol::HttpProtobuf,
        max_queue,
        max_batch: 2,
        delay: Duration::from_millis(20),
        export_timeout: Duration::from_secs(5),
        service_name: "haul-test".into(),
    }
}

fn exporter(endpoint: String) -> opentelemetry_otlp::SpanExporter {
    opentelemetry_otlp::SpanExporter::builder().with_http().with_endpoint(endpoint).build().unwrap()
}

#[tokio::test]
async fn spans_reach_the_receiver_with_the_ids_haul_keeps() {
    let receiver = OtlpReceiver::start().await.unwrap();
    let exporting = Exporting::with(exporter(format!("{}/v1/traces", receiver.base_url)), &settings(64));
    let caller = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
    let request = caller.child(0x1111);
    let run = request.child(0x2222);
    let (t0, t1) = (Timestamp::from_second(1_700_000_000).unwrap(), Timestamp::from_second(1_700_000_001).unwrap());
    let spans = exporting.spans();
    spans.record(|| {
        Span::new("POST /v1/loads/{load_id}/events", Kind::Server, request, Some(&caller), t0, t1)
            .remote_parent()
            .attr("http.response.status_code", 202i64)
    });
    spans.record(|| {
        Span::new("process loads", Kind::Consumer, run, Some(&request), t0, t1)
            .link(request)
            .attr("messaging.message.id", "ping_0700")
            .attr("gen_ai.response.finish_reasons", vec!["stop".to_string()])
            .attr("haul.filtered", false)
            .failed("left_for_redelivery", "the store did not answer")
    });
    // A caller that did not sample: continued, not exported.
    let unsampled = TraceParent { flags: 0, ..caller.child(0x3333) };
    spans.record(|| Span::new("POST /v1/webhooks/twilio/sms", Kind::Server, unsampled, None, t0, t1));
    exporting.stop().await;

    let got = receiver.spans();
    assert_eq!(got.len(), 2, "{got:#?}");
    let server = got.iter().find(|s| s.kind == "SERVER").unwrap();
    assert_eq!(
        (server.trace_id.as_str(), server.span_id.as_str(), server.parent_span_id.as_str()),
        ("4bf92f3577b34da6a3ce929d0e0e4736", "0000000000001111", "00f067aa0ba902b7")
    );
    assert_eq!(server.name, "POST /v1/loads/{load_id}/events");
    assert_eq!(server.attr("http.response.status_code"), Some("202"));
    assert_eq!((server.start_unix_nano, server.end_unix_nano), (1_700_000_000_000_000_000, 1_700_000_001_000_000_000));
    assert!(!server.error);
    let consumer = got.iter().find(|s| s.kind == "CONSUMER").unwrap();
    assert_eq!(consumer.parent_span_id, "0000000000001111");
    assert_eq!(consumer.links, vec![("4bf92f3577b34da6a3ce929d0e0e4736".to_string(), "0000000000001111".to_string())]);
    assert_eq!(consumer.attr("messaging.message.id"), Some("ping_0700"));
    assert_eq!(consumer.attr("gen_ai.response.finish_reasons"), Some("stop"));
    assert_eq!(consumer.attr("haul.filtered"), Some("false"));
    assert_eq!(consumer.attr("error.type"), Some("left_for_redelivery"));
    assert!(consumer.error);
    assert_eq!((server.service.as_str(), server.role.as_str()), ("", ""), "set by `start`, not `with`");
}

#[tokio::test]
async fn a_full_queue_drops_and_counts_and_a_dead_receiver_loses_only_its_batch() {
    // Nothing listens on the endpoint: each export fails (and is counted), none waits.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let exporting = Exporting::with(exporter(format!("http://127.0.0.1:{port}/v1/traces")), &settings(4));
    let t = Timestamp::UNIX_EPOCH;
    let spans = exporting.spans();
    for n in 1..=200u64 {
        spans.record(|| Span::new("send sms", Kind::Client, TraceParent::root(u128::from(n), n), None, t, t));
    }
    assert!(exporting.dropped() >= 190, "dropped {}", exporting.dropped());
    tokio::time::timeout(Duration::from_secs(30), exporting.stop()).await.expect("stops");
}

#[tokio::test]
async fn a_full_batch_goes_out_without_waiting_for_the_delay_and_the_rest_waits_for_it() {
    let receiver = OtlpReceiver::start().await.unwrap();
    let slow = Settings { delay: Duration::from_secs(3600), ..settings(64) };
    let exporting = Exporting::with(exporter(format!("{}/v1/traces", receiver.base_url)), &slow);
    let t = Timestamp::UNIX_EPOCH;
    let spans = exporting.spans();
    let send = |n: u64| Span::new("send sms", Kind::Client, TraceParent::root(u128::from(n), n), None, t, t);
    spans.record(|| send(1));
    spans.record(|| send(2));
    // Two make a batch (`max_batch`): exported at once, not an hour later.
    let got = receiver.wait_for(20, |s| s.len() >= 2).await.unwrap();
    assert_eq!(got.len(), 2, "{got:#?}");
    spans.record(|| send(3));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(receiver.spans().len(), 2, "the third waits for the delay, or the stop");
    exporting.stop().await;
    assert_eq!(receiver.spans().len(), 3, "the stop exports what waits");
}

/// The collector's gRPC TraceService (the official definitions' server, on tonic),
/// keeping what it is sent.
#[derive(Clone, Default)]
struct GrpcReceiver(std::sync::Arc<std::sync::Mutex<Vec<haul_harness::testkit_otlp::ReceivedSpan>>>);

#[tonic::async_trait]
impl TraceService for GrpcReceiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans = haul_harness::testkit_otlp::decoded(request.into_inner());
        self.0.lock().unwrap().extend(spans);
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};

#[tokio::test]
async fn spans_reach_a_grpc_receiver_too() {
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let receiver = GrpcReceiver::default();
    let server = tonic::transport::Server::builder().add_service(TraceServiceServer::new(receiver.clone())).serve(addr);
    let serving = tokio::spawn(server);
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(format!("http://{addr}"))
        .build()
        .unwrap();
    let exporting = Exporting::with(exporter, &Settings { protocol: Protocol::Grpc, ..settings(64) });
    let run = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap().child(0x2222);
    let t = Timestamp::from_second(1_700_000_000).unwrap();
    exporting.spans().record(|| Span::new("send sms", Kind::Client, run, None, t, t).attr("haul.attempt", 2u32));
    exporting.stop().await;
    let got = receiver.0.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((got[0].kind.as_str(), got[0].span_id.as_str()), ("CLIENT", "0000000000002222"));
    assert_eq!(got[0].attr("haul.attempt"), Some("2"));
    serving.abort();
}
