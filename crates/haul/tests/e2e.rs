//! End to end: the real `haul serve` binary, driven over HTTP, with the channel
//! services as real HTTP servers on 127.0.0.1. SQLite in one process; PostgreSQL with
//! the api, worker, dispatcher and pump roles as four processes.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{Proc as Serve, channel_env, free_port, temp_dir, wait_healthy};
use haul_harness::testkit::FakeServices;
use haul_harness::testkit_otlp::{OtlpReceiver, ReceivedSpan};
use reqwest::StatusCode;
use serde_json::{Value, json};

const TOKEN: &str = "e2e-token-0123456789";
const SMS1: &str = "481207/ask:eta_request:ping_0700/1/send_sms";
const SMS2: &str = "481207/ask:eta_request:ping_0700/2/send_sms";
/// The trace id a caller gives the ping in.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

impl Serve {
    fn start(dir: &PathBuf, name: &str, args: &[&str], env: &[(String, String)]) -> Serve {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_haul"));
        cmd.arg("serve").args(args);
        Serve::spawn(dir, name, cmd, env)
    }

    /// `haul serve` started with its soft limit of open files lowered to `soft_limit`.
    fn start_with_nofile(dir: &PathBuf, soft_limit: u64, args: &[&str]) -> Serve {
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(format!("ulimit -Sn {soft_limit} && exec \"$0\" serve \"$@\""));
        cmd.arg(env!("CARGO_BIN_EXE_haul")).args(args);
        Serve::spawn(dir, "serve", cmd, &[])
    }

    fn spawn(dir: &PathBuf, name: &str, mut cmd: Command, env: &[(String, String)]) -> Serve {
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = cmd
            .current_dir(dir)
            .env("HAUL_API_TOKEN", TOKEN)
            .env("HAUL_LOG", "info")
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .unwrap();
        Serve { child, log }
    }
}

async fn post(client: &reqwest::Client, base: &str, event: Value) -> StatusCode {
    client.post(format!("{base}/v1/loads/481207/events")).bearer_auth(TOKEN).json(&event).send().await.unwrap().status()
}

/// Polls `GET /v1/loads/481207` until `done` holds for it.
async fn wait_for(
    client: &reqwest::Client,
    base: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
    logs: &dyn Fn() -> String,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = Value::Null;
    while Instant::now() < deadline {
        if let Ok(r) = client.get(format!("{base}/v1/loads/481207")).bearer_auth(TOKEN).send().await
            && r.status() == StatusCode::OK
        {
            last = r.json().await.unwrap();
            if done(&last) {
                return last;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}; last view: {last:#}\nlogs:\n{}", logs());
}

/// A new schema of its own for a test's `haul` processes: a client on the database
/// (to drop it at the end), its name, and the store URL whose `search_path` is it.
async fn pg_schema() -> (tokio_postgres::Client, String, String) {
    let url = haul_postgres::testing::database_url();
    let (schema, db) = haul_postgres::testing::fresh_schema_url(&url).await;
    (haul_postgres::testing::client_in_schema(&url, "public").await, schema, db)
}

fn outbox_status(view: &Value, key: &str) -> Option<String> {
    view["outbox"].as_array()?.iter().find(|r| r["id"] == key).and_then(|r| r["status"].as_str()).map(str::to_owned)
}

fn init() -> Value {
    json!({"event_id": "load:init", "kind": "load_update", "client": "client_a", "driver_phone": "+15555550100", "stage": "in_transit"})
}

fn ping() -> Value {
    json!({"event_id": "ping_0700", "kind": "location_ping", "lat": 41.88, "lon": -87.63, "risk": "high"})
}

const FAST_POLICY: &str =
    "[timers]\npoll = \"1s\"\n[clients.client_a.eta_request]\nretry_after = \"2s\"\nmax_attempts = 2\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_on_sqlite_sends_the_eta_request_and_follows_up() {
    let svc = FakeServices::start(Some("svc-token-123".into())).await.unwrap();
    let dir = temp_dir("e2e", "sqlite");
    std::fs::write(dir.join("haul.toml"), FAST_POLICY).unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let listen = format!("127.0.0.1:{port}");
    let mut serve = Serve::start(
        &dir,
        "serve",
        &["--config", "haul.toml", "--listen", &listen, "--db", "sqlite://haul.db"],
        &channel_env(&svc),
    );
    let client = reqwest::Client::new();
    wait_healthy(&client, &base, &serve).await;
    assert_eq!(post(&client, &base, init()).await, StatusCode::ACCEPTED);
    assert_eq!(post(&client, &base, ping()).await, StatusCode::ACCEPTED);
    assert_eq!(post(&client, &base, ping()).await, StatusCode::OK, "a duplicate");
    let logs = || serve.log();
    // The first ask goes out, then the timer (2 s) fires the follow-up.
    let view =
        wait_for(&client, &base, "step 2", |v| outbox_status(v, SMS2).as_deref() == Some("dispatched"), &logs).await;
    assert_eq!(outbox_status(&view, SMS1).as_deref(), Some("dispatched"));
    let first = svc.effects().into_iter().find(|e| e.key == SMS1).unwrap();
    assert_eq!(first.payload["to"], "+15555550100");
    assert_eq!(first.payload["load_id"], "481207");
    assert_eq!(view["state"]["asks"]["ask:eta_request:ping_0700"]["step"], 2);
    let status = serve.terminate();
    assert!(status.success(), "exit {status:?}\n{}", serve.log());
    // Counted once the server has stopped, so a second send at any time before is seen.
    assert_eq!(svc.sends("sms", SMS1), 1);
    assert_eq!(svc.sends("sms", SMS2), 1);
    let log = serve.log();
    assert!(log.contains("stopped"), "{log}");
    assert_no_secrets(&log);
    std::fs::remove_dir_all(dir).ok();
}

/// No whole phone number and no token in a log.
fn assert_no_secrets(log: &str) {
    let lines = |needle: &str| log.lines().filter(|l| l.contains(needle)).take(5).collect::<Vec<_>>().join("\n");
    assert!(!log.contains("+15555550100"), "a phone number appeared whole in the log:\n{}", lines("+15555550100"));
    for token in [TOKEN, "svc-token-123"] {
        assert!(!log.contains(token), "a token appeared in the log:\n{}", lines(token));
    }
}

/// `HAUL_LOG=debug` on PostgreSQL: the driver and the pool log statements and their
/// parameters at debug, which would put phone numbers in the log; they stay quiet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_at_debug_level_on_postgres_logs_no_phone_number_or_token() {
    let (client, schema, db) = pg_schema().await;
    let svc = FakeServices::start(Some("svc-token-123".into())).await.unwrap();
    let dir = temp_dir("e2e", "pg-debug");
    std::fs::write(dir.join("haul.toml"), FAST_POLICY).unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let listen = format!("127.0.0.1:{port}");
    let mut env = channel_env(&svc);
    env.push(("HAUL_LOG".into(), "debug".into()));
    let mut serve = Serve::start(&dir, "serve", &["--config", "haul.toml", "--listen", &listen, "--db", &db], &env);
    let http = reqwest::Client::new();
    wait_healthy(&http, &base, &serve).await;
    assert_eq!(post(&http, &base, init()).await, StatusCode::ACCEPTED);
    assert_eq!(post(&http, &base, ping()).await, StatusCode::ACCEPTED);
    let logs = || serve.log();
    wait_for(&http, &base, "step 1", |v| outbox_status(v, SMS1).as_deref() == Some("dispatched"), &logs).await;
    let answer = json!({"event_id": "sms_1", "kind": "inbound_sms", "from": "+15555550100", "body": "ETA 9:15"});
    assert_eq!(post(&http, &base, answer).await, StatusCode::ACCEPTED);
    wait_for(
        &http,
        &base,
        "the answer",
        |v| v["state"]["asks"]["ask:eta_request:ping_0700"]["status"] == "answered",
        &logs,
    )
    .await;
    let status = serve.terminate();
    assert!(status.success(), "exit {status:?}\n{}", serve.log());
    let log = serve.log();
    assert!(log.contains("DEBUG"), "the run logged at debug level:\n{log}");
    assert_no_secrets(&log);
    client.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.ok();
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_roles_as_separate_processes_on_postgres() {
    let (client, schema, db) = pg_schema().await;
    let dir = temp_dir("e2e", "pg");
    std::fs::write(dir.join("haul.toml"), FAST_POLICY).unwrap();
    let migrate = Command::new(env!("CARGO_BIN_EXE_haul")).args(["migrate", "--db", &db]).output().unwrap();
    assert!(migrate.status.success(), "{}", String::from_utf8_lossy(&migrate.stderr));

    let svc = FakeServices::start(Some("svc-token-123".into())).await.unwrap();
    // Every process exports its spans to one OTLP receiver.
    let otlp = OtlpReceiver::start().await.unwrap();
    let mut env = channel_env(&svc);
    env.extend(otlp.env());
    let mut procs = Vec::new();
    let mut api_base = String::new();
    for role in ["api", "worker", "worker", "dispatcher", "dispatcher", "pump"] {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        if role == "api" {
            api_base = format!("http://{listen}");
        }
        let name = format!("{role}-{port}");
        procs.push(Serve::start(
            &dir,
            &name,
            &["--config", "haul.toml", "--listen", &listen, "--db", &db, "--roles", role],
            &env,
        ));
    }
    let http = reqwest::Client::new();
    wait_healthy(&http, &api_base, &procs[0]).await;
    assert_eq!(post(&http, &api_base, init()).await, StatusCode::ACCEPTED);
    // The ping comes with the caller's trace context; the load's update without one.
    let posted = http
        .post(format!("{api_base}/v1/loads/481207/events"))
        .bearer_auth(TOKEN)
        .header("traceparent", format!("00-{TRACE_ID}-00f067aa0ba902b7-01"))
        .json(&ping())
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), StatusCode::ACCEPTED);
    let logs = || procs.iter().map(|p| format!("== {}\n{}", p.log.display(), p.log())).collect::<Vec<_>>().join("\n");
    // Step 1, step 2 by the pump process's timer, then the escalation (max_attempts 2).
    let escalation = "481207/ask:eta_request:ping_0700/3/create_hero_task";
    let view = wait_for(
        &http,
        &api_base,
        "escalation",
        |v| outbox_status(v, escalation).as_deref() == Some("dispatched"),
        &logs,
    )
    .await;
    // One effect per key at services that dedupe: two dispatchers may both send a key
    // whose lease lapsed (that is allowed), and the key keeps it to one message.
    for (channel, key) in [("sms", SMS1), ("sms", SMS2), ("hero", escalation)] {
        assert!(svc.sends(channel, key) >= 1, "{key} was sent");
        assert_eq!(svc.deduped_effects(channel, key), 1, "one effect per key across two dispatchers: {key}");
    }
    assert_eq!(view["state"]["asks"]["ask:eta_request:ping_0700"]["status"], "escalated");
    let seqs: Vec<u64> = view["log"].as_array().unwrap().iter().map(|r| r["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "gapless log");
    // The ping's trace went from the API process through a worker, a dispatcher, the
    // pump and back, in the stores: every send its decisions made (the first ask, the
    // follow-up the timer fired, the escalation) carried it, each as a span of its own.
    for (channel, key) in [("sms", SMS1), ("sms", SMS2), ("hero", escalation)] {
        let sent = svc.traceparents(channel, key);
        assert!(!sent.is_empty());
        for t in sent {
            let t = t.unwrap_or_else(|| panic!("{key} was sent without a traceparent"));
            assert!(t.starts_with(&format!("00-{TRACE_ID}-")) && t.ends_with("-01"), "{key}: {t}");
            assert!(!t.contains("00f067aa0ba902b7"), "a span of haul's own, not the caller's: {t}");
        }
    }
    // And the log keeps it: the ping, its decision and what followed from it; the
    // load's update, which came without one, has a trace of its own.
    let rows = client
        .query(&format!("SELECT entry_id, trace FROM {schema}.events WHERE load_id = '481207' ORDER BY seq"), &[])
        .await
        .unwrap();
    let traces: Vec<(String, Option<String>)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let of = |id: &str| traces.iter().find(|(e, _)| e == id).and_then(|(_, t)| t.clone()).unwrap_or_default();
    assert!(of("ping_0700").contains(TRACE_ID), "{traces:?}");
    assert!(!of("load:init").is_empty() && !of("load:init").contains(TRACE_ID), "{traces:?}");
    let in_trace = traces.iter().filter(|(_, t)| t.as_deref().is_some_and(|t| t.contains(TRACE_ID))).count();
    assert!(in_trace >= 6, "the ping, the timers' firings, the outcomes and their decisions: {traces:?}");
    // The load's view shows each record's, row's and timer's.
    let ping = view["log"].as_array().unwrap().iter().find(|r| r["entry_id"] == "ping_0700").unwrap();
    assert!(ping["trace"].as_str().is_some_and(|t| t.contains(TRACE_ID)), "{ping}");
    let sms1 = view["outbox"].as_array().unwrap().iter().find(|r| r["id"] == SMS1).unwrap();
    assert!(sms1["trace"].as_str().is_some_and(|t| t.contains(TRACE_ID)), "{sms1}");
    assert!(
        view["timers"].as_array().unwrap().iter().all(|t| t["trace"].as_str().is_some_and(|t| t.contains(TRACE_ID)))
    );
    for p in &mut procs {
        let status = p.terminate();
        assert!(status.success(), "{status:?}\n{}", p.log());
    }
    // Stopped, each process has exported what it recorded.
    spans_follow_the_ping(&otlp.spans(), &svc, escalation);
    // Retention on the partitioned schema: nothing finished a week ago, so nothing goes.
    let prune = Command::new(env!("CARGO_BIN_EXE_haul")).args(["prune", "--db", &db]).output().unwrap();
    assert!(prune.status.success(), "{}", String::from_utf8_lossy(&prune.stderr));
    let out = String::from_utf8_lossy(&prune.stdout);
    assert!(out.starts_with("pruned 0 outbox rows, 0 timers, 0 queue messages"), "{out}");
    client.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.ok();
    std::fs::remove_dir_all(dir).ok();
}

/// The ping's trace as the OTLP receiver decoded it, across the six processes: the
/// API's request (SERVER, the caller's child) and its publish (PRODUCER); the worker's
/// run (CONSUMER, linked to the publish) and its decision; each send (CLIENT, the span
/// the channel service was given); the outcome's run linked back to the run whose
/// decision made the action, and a timer's firing linked to the run that set it. No
/// span id twice.
fn spans_follow_the_ping(spans: &[ReceivedSpan], svc: &FakeServices, escalation: &str) {
    let mut ids: Vec<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    ids.sort_unstable();
    let n = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), n, "no span exported twice");
    let ours: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.trace_id == TRACE_ID).collect();
    let dump = || ours.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join("\n");
    let find = |what: &str, p: &dyn Fn(&ReceivedSpan) -> bool| -> &ReceivedSpan {
        ours.iter().copied().find(|s| p(s)).unwrap_or_else(|| panic!("no {what} span in the trace:\n{}", dump()))
    };
    let server = find("SERVER", &|s| s.kind == "SERVER" && s.parent_span_id == "00f067aa0ba902b7");
    assert_eq!((server.name.as_str(), server.role.as_str()), ("POST /v1/loads/{load_id}/events", "api"));
    assert_eq!(server.attr("http.response.status_code"), Some("202"));
    let producer = find("PRODUCER", &|s| s.kind == "PRODUCER" && s.parent_span_id == server.span_id);
    assert_eq!(producer.attr("messaging.message.id"), Some("ping_0700"));
    assert_eq!(producer.attr("messaging.operation.type"), Some("send"));
    let run = find("CONSUMER", &|s| {
        s.kind == "CONSUMER"
            && s.attr("messaging.message.id") == Some("ping_0700")
            && s.attr("haul.outcome") == Some("committed")
    });
    assert_eq!(run.links, vec![(TRACE_ID.to_string(), producer.span_id.clone())], "linked to its creation context");
    assert_eq!((run.parent_span_id.as_str(), run.role.as_str()), (producer.span_id.as_str(), "worker"));
    assert_eq!(run.attr("messaging.system"), Some("haul"));
    assert_eq!(run.attr("messaging.destination.name"), Some("loads"));
    let decide = find("decision", &|s| s.kind == "INTERNAL" && s.parent_span_id == run.span_id);
    assert_eq!((decide.name.as_str(), decide.attr("haul.decider")), ("decide", Some("sop")));
    // Each send attempt is the span whose context the service was given.
    for (channel, key) in [("sms", SMS1), ("sms", SMS2), ("hero", escalation)] {
        for t in svc.traceparents(channel, key).into_iter().flatten() {
            let span_id = &t[36..52];
            let send = find("CLIENT", &|s| s.kind == "CLIENT" && s.span_id == span_id);
            assert_eq!((send.attr("haul.outbox_id"), send.role.as_str()), (Some(key), "dispatcher"), "{t}");
            assert_eq!(send.name, format!("send {channel}"));
        }
    }
    let first_send = find("CLIENT", &|s| s.kind == "CLIENT" && s.attr("haul.outbox_id") == Some(SMS1));
    assert_eq!(first_send.parent_span_id, run.span_id, "the send continues the run whose decision made it");
    assert_eq!(first_send.attr("haul.result"), Some("delivered"));
    // The outcome's run links back to the run that decided the send.
    let outcome = find("the outcome's CONSUMER", &|s| {
        s.kind == "CONSUMER" && s.attr("messaging.message.id") == Some(&format!("evt:out:{SMS1}:delivered"))
    });
    assert_eq!(outcome.links, vec![(TRACE_ID.to_string(), run.span_id.clone())]);
    // A timer's firing links to the run that set it.
    let fired = find("the timer's CONSUMER", &|s| {
        s.kind == "CONSUMER" && s.attr("messaging.message.id").is_some_and(|id| id.starts_with("evt:tmr:"))
    });
    let setter = &fired.links[0].1;
    let set_by = find("the timer setter's CONSUMER", &|s| s.kind == "CONSUMER" && &s.span_id == setter);
    assert_eq!(set_by.role, "worker");
}

/// Production's shape: PostgreSQL for the log and SQS FIFO (moto here) for the load
/// queue, configured the way an operator would, through `HAUL_QUEUE_*`.
#[cfg(feature = "sqs")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_on_postgres_with_the_sqs_fifo_queue() {
    let (client, schema, db) = pg_schema().await;
    let queue = haul_sqs::emulator::fresh_queue().await.unwrap_or_else(|e| panic!("SQS emulator: {e}"));
    let endpoint = haul_sqs::emulator::endpoint().await.unwrap();

    let svc = FakeServices::start(Some("svc-token-123".into())).await.unwrap();
    let mut env = channel_env(&svc);
    env.extend(common::sqs_env(queue.queue_url(), &endpoint));
    let dir = temp_dir("e2e", "sqs");
    std::fs::write(dir.join("haul.toml"), FAST_POLICY).unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let listen = format!("127.0.0.1:{port}");
    let mut serve = Serve::start(&dir, "serve", &["--config", "haul.toml", "--listen", &listen, "--db", &db], &env);
    let http = reqwest::Client::new();
    wait_healthy(&http, &base, &serve).await;
    assert_eq!(post(&http, &base, init()).await, StatusCode::ACCEPTED);
    assert_eq!(post(&http, &base, ping()).await, StatusCode::ACCEPTED);
    // SQS cannot say a publish was a duplicate; it drops it, and the log would too.
    assert_eq!(post(&http, &base, ping()).await, StatusCode::ACCEPTED);
    let logs = || serve.log();
    let view =
        wait_for(&http, &base, "step 2", |v| outbox_status(v, SMS2).as_deref() == Some("dispatched"), &logs).await;
    assert_eq!(svc.sends("sms", SMS1), 1);
    assert_eq!(svc.sends("sms", SMS2), 1);
    let inbound: Vec<&str> = view["log"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "location_ping")
        .map(|r| r["entry_id"].as_str().unwrap())
        .collect();
    assert_eq!(inbound, vec!["ping_0700"], "the repeated ping is in the log once");
    // Outcomes and the timer came back through SQS and were acked.
    let deadline = Instant::now() + Duration::from_secs(10);
    while haul_store::LoadQueue::depth(&queue).await.unwrap() > 0 {
        assert!(Instant::now() < deadline, "SQS kept messages:\n{}", serve.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = serve.terminate();
    assert!(status.success(), "exit {status:?}\n{}", serve.log());
    queue.delete_queue().await.ok();
    client.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.ok();
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_command_deletes_old_finished_rows_and_keeps_the_log() {
    use haul_core::ids::{LoadId, TimerId};
    use haul_store::{NewEntry, NewOutboxRow};
    let dir = temp_dir("e2e", "prune");
    let db = format!("sqlite://{}", dir.join("haul.db").display());
    let long_ago = |s: u64| haul_core::time::add("2020-01-01T00:00:00Z".parse().unwrap(), Duration::from_secs(s));
    {
        let store = haul_backends::open(&db, Some(1)).await.unwrap();
        let l = LoadId::parse("481207").unwrap();
        let entry = NewEntry::stored("e1", "inbound_sms", json!({}));
        let row = |k: &str| NewOutboxRow {
            id: format!("481207/e1/{k}"),
            action_type: haul_core::action::ActionType::SendSms,
            action: json!({}),
            trace: None,
        };
        store.append(&l, vec![entry], 0, vec![row("a"), row("b")], long_ago(0)).await.unwrap();
        let claims = store.pending(10, long_ago(1), Duration::from_secs(90)).await.unwrap();
        store.mark_dispatched(&claims[0].row.id, &claims[0].token, "r", long_ago(2)).await.unwrap();
        let t = TimerId::parse("tmr:481207:ask:eta_request:p:1").unwrap();
        store.schedule(&t, long_ago(5), long_ago(0)).await.unwrap();
        store.mark_fired(&t, long_ago(5)).await.unwrap();
        store.publish(&l, "e1", "{}", long_ago(0)).await.unwrap();
        let m = store.receive(1, Duration::from_secs(30), long_ago(1)).await.unwrap().remove(0);
        store.ack(&m.receipt, long_ago(2)).await.unwrap();
    }
    let haul = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_haul")).args(args).output().unwrap();
    let too_short = haul(&["prune", "--db", &db, "--older-than", "1m"]);
    assert!(!too_short.status.success());
    let err = String::from_utf8_lossy(&too_short.stderr);
    assert_eq!(err.lines().count(), 1, "one clear line: {err}");
    let out = haul(&["prune", "--db", &db, "--older-than", "7d", "--batch", "1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("pruned 1 outbox rows, 1 timers, 1 queue messages"), "{text}");
    let store = haul_backends::open(&db, None).await.unwrap();
    let l = LoadId::parse("481207").unwrap();
    assert_eq!(store.read(&l).await.unwrap().1, 1, "the log stays");
    assert_eq!(store.rows_for_load(&l).await.unwrap().len(), 1, "the pending row stays");
    std::fs::remove_dir_all(dir).ok();
}

/// The database password never reaches a log line or an error line, in any of the
/// forms the driver reads it from: the URL's userinfo, `password=` in its query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_password_never_reaches_a_log_or_an_error_line() {
    const SECRET: &str = "hunter2";
    let (client, schema, db) = pg_schema().await;
    // PostgreSQL here trusts local connections, so the password is carried, not checked.
    let db = format!("{}&password={SECRET}", db.replacen("://postgres@", &format!("://postgres:{SECRET}@"), 1));
    let unreachable = format!("postgres://u:{SECRET}@127.0.0.1:1/db?sslpassword={SECRET}&password={SECRET}");
    let dir = temp_dir("e2e", "secret");
    let haul = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_haul")).args(args).current_dir(&dir).env("HAUL_LOG", "debug").output().unwrap()
    };
    // (command, whether it succeeds)
    for (args, ok) in [
        (vec!["migrate", "--db", &db], true),
        (vec!["inspect", "481207", "--db", &db], false),
        (vec!["migrate", "--db", &unreachable], false),
        (vec!["inspect", "481207", "--db", &unreachable], false),
        (vec!["migrate", "--db", "mysql://u:hunter2@127.0.0.1/db"], false),
        (vec!["serve", "--db", "mysql://u:hunter2@127.0.0.1/db", "--listen", "127.0.0.1:0"], false),
    ] {
        let out = haul(&args);
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.success(), ok, "{args:?}: {text}");
        assert!(!text.is_empty(), "{args:?} said nothing");
        assert!(!text.contains(SECRET), "{args:?} printed the password:\n{text}");
    }
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut serve = Serve::start(&dir, "serve", &["--listen", &listen, "--db", &db], &[]);
    wait_healthy(&reqwest::Client::new(), &format!("http://{listen}"), &serve).await;
    let status = serve.terminate();
    assert!(status.success(), "{status:?}\n{}", serve.log());
    let log = serve.log();
    assert!(log.contains("haul is serving"), "{log}");
    assert!(!log.contains(SECRET), "serve logged the password:\n{log}");
    client.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.ok();
    std::fs::remove_dir_all(dir).ok();
}

/// A connection that sends `head` and then nothing: a stranger's stalled request.
async fn stalled(addr: &str, head: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp
}

/// SIGTERM while strangers hold connections (idle, half a request head, a body that
/// stopped coming): serve exits at once instead of waiting out its shutdown grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_does_not_wait_for_idle_or_stalled_connections() {
    let dir = temp_dir("e2e", "stalled");
    let listen = format!("127.0.0.1:{}", free_port());
    let mut serve = Serve::start(&dir, "serve", &["--listen", &listen, "--db", "sqlite://haul.db"], &[]);
    wait_healthy(&reqwest::Client::new(), &format!("http://{listen}"), &serve).await;
    let body_head = format!(
        "POST /v1/loads/481207/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Length: 1000\r\n\r\n{{\"event_id\":"
    );
    let _idle = stalled(&listen, "").await;
    let _half_head = stalled(&listen, "POST /v1/loads/481207/events HTTP/1.1\r\nHost: x\r\n").await;
    let mut half_body = stalled(&listen, &body_head).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let status = serve.terminate();
    let took = started.elapsed();
    assert!(status.success(), "exit {status:?}\n{}", serve.log());
    assert!(took < Duration::from_secs(3), "took {took:?} to stop:\n{}", serve.log());
    // The request whose body stopped coming was told why.
    let mut answer = vec![0u8; 512];
    let n = tokio::io::AsyncReadExt::read(&mut half_body, &mut answer).await.unwrap_or(0);
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 503") && answer.contains("shutting_down"), "{answer}");
    std::fs::remove_dir_all(dir).ok();
}

/// The report: 300 half-sent requests under a 256-descriptor limit made `/healthz`
/// time out. serve raises its soft limit to the hard one at start, so the same flood
/// leaves room for a fresh request.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_raises_its_descriptor_limit_and_answers_beside_300_stalled_requests() {
    let hard = |pid: &str| {
        let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
        let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap().to_owned();
        let mut n = line.split_whitespace().skip(3).map(|v| v.parse::<u64>().unwrap_or(u64::MAX));
        (n.next().unwrap(), n.next().unwrap())
    };
    let (_, hard_limit) = hard("self");
    if hard_limit < 1024 {
        eprintln!("skipped: the hard limit of open files here is {hard_limit}, too low to show the difference");
        return;
    }
    let dir = temp_dir("e2e", "nofile");
    let listen = format!("127.0.0.1:{}", free_port());
    let mut serve = Serve::start_with_nofile(&dir, 256, &["--listen", &listen, "--db", "sqlite://haul.db"]);
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    wait_healthy(&http, &format!("http://{listen}"), &serve).await;
    let mut held = Vec::new();
    for _ in 0..300 {
        held.push(stalled(&listen, "POST /v1/loads/481207/events HTTP/1.1\r\nHost: x\r\n").await);
    }
    // A new connection, as a new caller would open (not the pooled one of wait_healthy).
    let fresh = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    let started = Instant::now();
    let health = fresh.get(format!("http://{listen}/healthz")).send().await;
    assert!(
        health.as_ref().is_ok_and(|r| r.status() == StatusCode::OK),
        "{health:?} after {:?}:\n{}",
        started.elapsed(),
        serve.log()
    );
    let pid = serve.child.id().to_string();
    assert_eq!(hard(&pid).0, hard(&pid).1, "the soft limit was not raised to the hard one");
    drop(held);
    let status = serve.terminate();
    assert!(status.success(), "exit {status:?}\n{}", serve.log());
    std::fs::remove_dir_all(dir).ok();
}

const OPERATOR: &str = "e2e-op-8c2f4a6e0b9d1c3e5f7a2b4c6d8e0f1a";
const ESCALATION: &str = "481207/ask:eta_request:ping_0700/2/create_hero_task";
const REQUEUED: &str = "481207/op:inc-42/create_hero_task";

/// `haul operator …` on the same store as the server, with `--json`: the exit code and
/// the answer.
fn operator_cli(dir: &PathBuf, db: &str, args: &[&str]) -> (i32, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_haul"))
        .current_dir(dir)
        .arg("operator")
        .args(args)
        .args(["--db", db, "--json"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let answer = serde_json::from_str(&text)
        .unwrap_or_else(|_| panic!("not JSON: {text}\n{}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap_or(-1), answer)
}

/// The issue's walk-through, as an operator would: the Hero service refuses the
/// escalation Hero task (400), the row is dead, an OpsAlert fires and the ask stays
/// escalated. Once the service is fixed, the operator requeues the dead row (over
/// HTTP, retried; then a second requeue with `haul operator`, which the log refuses as
/// done already): the task arrives once, and the log says who requeued it and why.
///
/// `roles` lists one process's roles per item: `["all"]` is one `haul serve`; the API
/// is the first.
async fn requeue_after_the_hero_service_recovers(db: &str, dir: &PathBuf, roles: &[&str]) {
    use haul_harness::testkit::{FaultKind, FaultRule};
    let svc = FakeServices::start(Some("svc-token-123".into())).await.unwrap();
    svc.add_fault(FaultRule { channel: "hero".into(), key: "*".into(), kind: FaultKind::Permanent, times: None });
    let policy = "[timers]\npoll = \"1s\"\n[clients.client_a.eta_request]\nretry_after = \"2s\"\nmax_attempts = 1\n";
    std::fs::write(dir.join("haul.toml"), policy).unwrap();
    let mut env = channel_env(&svc);
    env.push(("HAUL_OPERATOR_TOKEN".into(), OPERATOR.into()));
    let mut procs = Vec::new();
    let mut base = String::new();
    for role in roles {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        if base.is_empty() {
            base = format!("http://{listen}");
        }
        let mut args = vec!["--config", "haul.toml", "--listen", &listen, "--db", db];
        if *role != "all" {
            args.extend(["--roles", role]);
        }
        procs.push(Serve::start(dir, &format!("{role}-{port}"), &args, &env));
    }
    let client = reqwest::Client::new();
    wait_healthy(&client, &base, &procs[0]).await;
    assert_eq!(post(&client, &base, init()).await, StatusCode::ACCEPTED);
    assert_eq!(post(&client, &base, ping()).await, StatusCode::ACCEPTED);
    let logs = || procs.iter().map(|p| format!("== {}\n{}", p.log.display(), p.log())).collect::<Vec<_>>().join("\n");
    let dead = |v: &Value| outbox_status(v, ESCALATION).as_deref() == Some("dead");
    let view = wait_for(&client, &base, "the dead escalation", dead, &logs).await;
    assert_eq!(view["state"]["asks"]["ask:eta_request:ping_0700"]["status"], "escalated");
    // The operator finds it as they would: in the dead-rows query across loads.
    let found = client
        .get(format!("{base}/v1/ops/dead?class=hero_channel"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(found["rows"][0]["id"], ESCALATION, "{found}");
    assert_eq!(found["rows"].as_array().map(Vec::len), Some(1), "{found}");
    let alerted = Instant::now() + Duration::from_secs(10);
    while svc.deduped_effects("ops", &format!("alert:{ESCALATION}")) != 1 {
        assert!(Instant::now() < alerted, "no OpsAlert for {ESCALATION}:\n{}", logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(svc.deduped_effects("hero", ESCALATION), 0);

    // The Hero service is fixed; the operator requeues the dead row, and retries.
    svc.clear_faults();
    let body = json!({"request_id": "inc-42", "actor": "ana", "reason": "Hero service fixed (INC-42)", "outbox_id": ESCALATION});
    let requeue =
        |token: &'static str| client.post(format!("{base}/v1/operator/requeue")).bearer_auth(token).json(&body).send();
    assert_eq!(requeue(TOKEN).await.unwrap().status(), StatusCode::FORBIDDEN, "the API token is not an operator's");
    let first = requeue(OPERATOR).await.unwrap();
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    assert_eq!(first.json::<Value>().await.unwrap()["event_id"], "op:inc-42");
    assert_eq!(requeue(OPERATOR).await.unwrap().status(), StatusCode::OK, "a retry is a duplicate");
    let sent = |v: &Value| outbox_status(v, REQUEUED).as_deref() == Some("dispatched");
    wait_for(&client, &base, "the requeued task", sent, &logs).await;

    // Another operator requeues the same row from a shell: the log says it was done.
    let args =
        ["requeue", ESCALATION, "--request-id", "inc-42-again", "--actor", "bo", "--reason", "re-driving INC-42"];
    let (code, answer) = operator_cli(dir, db, &args);
    assert_eq!((code, answer["status"].as_str()), (0, Some("queued")), "{answer}");
    // The command waited for the load's decision and says what it was: nothing done.
    assert_eq!(answer["decision"]["decider"], "operator", "{answer}");
    assert_eq!(answer["decision"]["actions"], json!([]), "{answer}");
    assert!(answer["decision"]["rationale"].as_str().unwrap().contains(REQUEUED), "{answer}");
    let noop =
        |v: &Value| v["log"].as_array().is_some_and(|l| l.iter().any(|r| r["entry_id"] == "dec:op:inc-42-again"));
    let view = wait_for(&client, &base, "the second requeue's decision", noop, &logs).await;
    let (code, answer) = operator_cli(
        dir,
        db,
        &["requeue", "481207/nope/send_sms", "--request-id", "x1", "--actor", "bo", "--reason", "typo"],
    );
    assert_eq!((code, answer["error"]["code"].as_str()), (1, Some("no_such_row")), "{answer}");

    // The task arrived once; the dead row stays dead, linked from its requeue. Once no
    // row of the load is pending, nothing of it can be sent again: the count is final.
    let settled = |v: &Value| {
        v["outbox"].as_array().is_some_and(|rows| {
            !rows.is_empty() && rows.iter().all(|r| r["status"].as_str().is_some_and(|s| s != "pending"))
        })
    };
    wait_for(&client, &base, "every outbox row settled", settled, &logs).await;
    assert_eq!(svc.sends("hero", REQUEUED), 1);
    assert_eq!(svc.effects().iter().filter(|e| e.channel == "hero").count(), 1);
    assert_eq!(outbox_status(&view, ESCALATION).as_deref(), Some("dead"));
    let row = view["outbox"].as_array().unwrap().iter().find(|r| r["id"] == REQUEUED).unwrap().clone();
    assert_eq!(row["action"]["requeue_of"], ESCALATION, "{row}");
    // The log: who requeued it and why, and what each decision did.
    let log = view["log"].as_array().unwrap();
    let entry = |id: &str| log.iter().find(|r| r["entry_id"] == id).unwrap_or_else(|| panic!("{id} not in {log:#?}"));
    let op = entry("op:inc-42");
    assert_eq!((op["kind"].as_str(), op["payload"]["actor"].as_str()), (Some("operator_action"), Some("ana")));
    assert_eq!(op["payload"]["reason"], "Hero service fixed (INC-42)");
    let decision = &entry("dec:op:inc-42")["payload"];
    assert_eq!(decision["decider"], "operator");
    assert_eq!(decision["actions"][0]["key"], REQUEUED);
    assert_eq!(entry("op:inc-42-again")["payload"]["actor"], "bo");
    let again = &entry("dec:op:inc-42-again")["payload"];
    assert_eq!(again["actions"], json!([]));
    assert!(again["rationale"].as_str().unwrap().contains("requeued already, as 481207/op:inc-42"), "{again}");
    let alerts = client.get(format!("{base}/v1/ops/alerts")).bearer_auth(TOKEN).send().await.unwrap();
    let alerts = alerts.json::<Value>().await.unwrap();
    assert_eq!(
        (alerts["alerts"][0]["outbox_id"].as_str(), alerts["alerts"][0]["state"].as_str()),
        (Some(ESCALATION), Some("delivered")),
        "{alerts}"
    );
    for p in &mut procs {
        let status = p.terminate();
        assert!(status.success(), "exit {status:?}\n{}", p.log());
        assert_no_secrets(&p.log());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_requeues_a_dead_escalation_once_the_hero_service_recovers_on_sqlite() {
    let dir = temp_dir("e2e", "operator-sqlite");
    requeue_after_the_hero_service_recovers("sqlite://haul.db", &dir, &["all"]).await;
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_requeues_a_dead_escalation_once_the_hero_service_recovers_on_postgres() {
    let (admin, schema, db) = pg_schema().await;
    let dir = temp_dir("e2e", "operator-postgres");
    requeue_after_the_hero_service_recovers(&db, &dir, &["all"]).await;
    admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.ok();
    std::fs::remove_dir_all(dir).ok();
}

/// The same with each role its own process on one PostgreSQL, as production runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_requeues_a_dead_escalation_with_roles_as_processes_on_postgres() {
    let (admin, schema, db) = pg_schema().await;
    let dir = temp_dir("e2e", "operator-postgres-roles");
    let out = Command::new(env!("CARGO_BIN_EXE_haul")).args(["migrate", "--db", &db]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    requeue_after_the_hero_service_recovers(&db, &dir, &["api", "worker", "dispatcher", "pump"]).await;
    admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.ok();
    std::fs::remove_dir_all(dir).ok();
}

/// `HAUL_LOG_FORMAT=json` at the default level: every line is one JSON object; one
/// line per run (load, event, outcome, duration), per dispatch and per API request
/// (method, route template, status, duration; never the token); a delivery failure
/// says its root cause ("Connection refused"); the server's NOTICEs stay out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_logs_json_lines_per_run_dispatch_and_request_with_root_causes_and_no_notices() {
    let (client, schema, db) = pg_schema().await;
    // Migrated once already: serve's own migration then draws "already exists" NOTICEs.
    let out = Command::new(env!("CARGO_BIN_EXE_haul")).args(["migrate", "--db", &db]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let svc = FakeServices::start(Some("svc-token-123".into())).await.unwrap();
    let dir = temp_dir("e2e", "json-log");
    std::fs::write(dir.join("haul.toml"), FAST_POLICY).unwrap();
    let port = free_port();
    let (base, listen) = (format!("http://127.0.0.1:{port}"), format!("127.0.0.1:{port}"));
    let mut env: Vec<(String, String)> =
        channel_env(&svc).into_iter().filter(|(k, _)| k != "HAUL_CHANNELS_SMS_URL").collect();
    env.push(("HAUL_CHANNELS_SMS_URL".into(), format!("http://127.0.0.1:{}/sms", free_port())));
    env.push(("HAUL_LOG_FORMAT".into(), "json".into()));
    let mut serve = Serve::start(&dir, "serve", &["--config", "haul.toml", "--listen", &listen, "--db", &db], &env);
    let http = reqwest::Client::new();
    wait_healthy(&http, &base, &serve).await;
    assert_eq!(post(&http, &base, init()).await, StatusCode::ACCEPTED);
    assert_eq!(post(&http, &base, ping()).await, StatusCode::ACCEPTED);
    let logs = || serve.log();
    let failed_once = |v: &Value| {
        v["outbox"].as_array().into_iter().flatten().any(|r| r["id"] == SMS1 && r["attempts"].as_u64() >= Some(1))
    };
    wait_for(&http, &base, "a failed SMS attempt", failed_once, &logs).await;
    let status = serve.terminate();
    assert!(status.success(), "exit {status:?}\n{}", serve.log());
    let log = serve.log();
    assert_no_secrets(&log);
    let lines: Vec<Value> =
        log.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}"))).collect();
    let find = |what: &str, f: &dyn Fn(&Value) -> bool| {
        lines.iter().find(|l| f(l)).cloned().unwrap_or_else(|| panic!("no {what} line in:\n{log}"))
    };
    let request = find("request", &|l| l["message"] == "request" && l["method"] == "POST");
    assert_eq!(
        (request["route"].as_str(), request["status"].as_u64()),
        (Some("/v1/loads/{load_id}/events"), Some(202))
    );
    assert!(request["duration_ms"].is_u64(), "{request}");
    let run = find("run", &|l| l["message"] == "run" && l["event_id"] == "ping_0700");
    assert_eq!((run["load_id"].as_str(), run["outcome"].as_str()), (Some("481207"), Some("committed")), "{run}");
    assert!(run["duration_ms"].is_u64() && run["level"] == "INFO", "{run}");
    assert_eq!(run["actions"], 2, "the SMS and its timer: {run}");
    // The SMS's attempt failed (nothing listens); the timer was committed with the
    // decision, so no row of it is dispatched.
    let dispatch = find("dispatch", &|l| l["message"] == "dispatch" && l["outbox_id"] == SMS1);
    assert_eq!((dispatch["outcome"].as_str(), dispatch["attempt"].as_u64()), (Some("retrying"), Some(1)), "{dispatch}");
    // One trace from the request to the send: the request line names it (and its span),
    // the ping's run and the SMS's dispatch carry its id.
    let trace_id = run["trace_id"].as_str().unwrap_or_else(|| panic!("no trace_id: {run}"));
    assert_eq!(trace_id.len(), 32, "{run}");
    let posted = lines.iter().filter(|l| l["message"] == "request" && l["method"] == "POST");
    assert!(posted.clone().any(|l| l["trace_id"] == trace_id && l["span_id"].as_str().is_some_and(|s| s.len() == 16)));
    assert_eq!(dispatch["trace_id"], trace_id, "{dispatch}");

    assert!(!lines.iter().any(|l| l["action_type"] == "set_timer"), "no timer row dispatched:\n{log}");
    find("root cause", &|l| l.to_string().contains("Connection refused"));
    let notices: Vec<&Value> =
        lines.iter().filter(|l| l["target"].as_str().is_some_and(|t| t.starts_with("tokio_postgres"))).collect();
    assert!(notices.is_empty(), "{notices:#?}");
    client.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.ok();
    std::fs::remove_dir_all(dir).ok();
}

/// `haul send-test-sms` posts an inbound SMS the webhook takes as Twilio's: signed with
/// HAUL_TWILIO_AUTH_TOKEN against the URL the server checks, it reaches the driver's
/// load as `sms:{MessageSid}`; with another key it is refused (403) and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_test_sms_reaches_the_drivers_load_through_the_webhook() {
    let dir = temp_dir("e2e", "test-sms");
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let listen = format!("127.0.0.1:{port}");
    let twilio = [("HAUL_TWILIO_AUTH_TOKEN".to_string(), "twilio-auth-token-e2e".to_string())];
    let serve = Serve::start(&dir, "serve", &["--listen", &listen, "--db", "sqlite://haul.db"], &twilio);
    let http = reqwest::Client::new();
    wait_healthy(&http, &base, &serve).await;
    assert_eq!(post(&http, &base, init()).await, StatusCode::ACCEPTED);
    // The webhook routes by the driver's phone, which the load has once its first event is in.
    let logs = || serve.log();
    wait_for(&http, &base, "the load", |v| v["state"]["driver_phone"] == "+15555550100", &logs).await;
    let send = |key: &str| {
        Command::new(env!("CARGO_BIN_EXE_haul"))
            .current_dir(&dir)
            .args(["send-test-sms", "--from", "+15555550100", "--body", "ETA 9:15", "--message-sid", "SMe2e1"])
            .args(["--url", &base])
            .env("HAUL_TWILIO_AUTH_TOKEN", key)
            .output()
            .unwrap()
    };
    let refused = send("another-key-0000");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stdout).starts_with("403"), "{refused:?}");
    let sent = send("twilio-auth-token-e2e");
    assert!(sent.status.success(), "{sent:?}");
    assert!(String::from_utf8_lossy(&sent.stdout).starts_with("200 OK  MessageSid SMe2e1"), "{sent:?}");
    // The SMS's decision opens a Hero task whose outcome follows: wait for the SMS
    // itself, not for a count the outcome may already have passed.
    let has_sms = |v: &Value| v["log"].as_array().is_some_and(|l| l.iter().any(|r| r["entry_id"] == "sms:SMe2e1"));
    let view = wait_for(&http, &base, "the SMS", has_sms, &logs).await;
    let sms = view["log"].as_array().unwrap().iter().find(|r| r["entry_id"] == "sms:SMe2e1");
    assert_eq!(sms.map(|r| &r["payload"]["body"]), Some(&json!("ETA 9:15")), "{view}");
    std::fs::remove_dir_all(dir).ok();
}
