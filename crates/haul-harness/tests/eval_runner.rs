//! Self-checks of `haul eval`: a runner that cannot fail is worthless.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use haul_harness::eval::scenario::parse;
use haul_harness::eval::{EvalOptions, EvalStore, run_paths, run_paths_with, run_scenario, run_scenario_with};
use haul_runtime::faults::{FaultPoint, Faults, Observed};

const GOOD: &str = r#"
name = "ask once"
start = "2026-03-02T07:00:00Z"
[load]
id = "481207"
client = "client_a"
driver_phone = "+15555550100"
stage = "in_transit"
[[step]]
at = "07:00"
inbound = [{ kind = "location_ping", event_id = "ping_0700", risk = "high", lat = 41.88, lon = -87.63 }]
[[step]]
at = "07:01"
expect.sent = [{ channel = "sms", key = "481207/ask:eta_request:ping_0700/1/send_sms", to = "+15555550100" }]
expect.open_asks = ["ask:eta_request:ping_0700"]
"#;

async fn run(text: &str, faults: Faults) -> haul_harness::eval::ScenarioReport {
    run_scenario(&parse(text).unwrap(), "inline.toml", &EvalStore::SqliteMemory, faults).await
}

#[tokio::test]
async fn a_true_scenario_passes() {
    let r = run(GOOD, Faults::default()).await;
    assert!(r.passed, "{}", r.line());
    assert_eq!(r.line(), "PASS ask once");
}

#[tokio::test]
async fn a_wrong_sent_expectation_fails_naming_step_key_missing_and_unexpected() {
    let wrong = GOOD.replace("ping_0700/1/send_sms\", to", "ping_0700/2/send_sms\", to");
    let r = run(&wrong, Faults::default()).await;
    assert!(!r.passed);
    let f = r.failure.clone().unwrap();
    assert_eq!((f.step, f.at.as_deref(), f.key.as_str()), (Some(2), Some("07:01"), "sent"), "steps count from 1");
    assert!(
        f.message.contains("missing [\"sms 481207/ask:eta_request:ping_0700/2/send_sms to=\\\"+15555550100\\\"\"]"),
        "{}",
        f.message
    );
    assert!(f.message.contains("unexpected [\"sms 481207/ask:eta_request:ping_0700/1/send_sms"), "{}", f.message);
    assert!(r.line().starts_with("FAIL ask once (inline.toml): step 2 (07:01): sent: missing"), "{}", r.line());
}

#[tokio::test]
async fn a_wrong_state_expectation_fails_with_expected_and_actual() {
    let wrong = GOOD.replace(
        "expect.open_asks = [\"ask:eta_request:ping_0700\"]",
        "expect.asks = [{ id = \"ask:eta_request:ping_0700\", status = \"answered\" }]",
    );
    let f = run(&wrong, Faults::default()).await.failure.unwrap();
    assert_eq!(f.key, "asks");
    assert_eq!(f.message, "ask ask:eta_request:ping_0700: expected status answered, got status open step 1");
}

#[tokio::test]
async fn an_event_dropped_by_a_fault_point_breaks_invariant_1() {
    // The run for ping_0700 dies after reading, every time: the event never reaches the log.
    let faults = Faults::new(|p, ctx| p == FaultPoint::AfterRead && ctx == "ping_0700");
    let f = run(GOOD, faults).await.failure.unwrap();
    assert_eq!((f.step, f.key.as_str()), (Some(1), "invariant 1"));
    assert!(f.message.contains("event ping_0700 of load 481207 is in the log 0 times"), "{}", f.message);
}

#[tokio::test]
async fn a_broken_file_fails_alone_and_the_others_still_run() {
    let dir = std::env::temp_dir().join(format!("haul-eval-selfcheck-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a_good.toml"), GOOD).unwrap();
    std::fs::write(dir.join("b_unknown_key.toml"), GOOD.replace("expect.open_asks", "expect.open_askz")).unwrap();
    std::fs::write(dir.join("c_backwards.toml"), GOOD.replace("at = \"07:01\"", "at = \"06:59\"")).unwrap();
    std::fs::write(dir.join("d_bad_duration.toml"), GOOD.replace("at = \"07:01\"", "at = \"+5 parsecs\"")).unwrap();
    std::fs::write(dir.join("e_not_toml.toml"), "name = [").unwrap();
    std::fs::write(dir.join("f_not_utf8.toml"), b"name = \"\xff\"").unwrap();
    let report = run_paths(&[dir.clone(), PathBuf::from("/no/such/file.toml")], &EvalStore::SqliteMemory, |_| {}).await;
    let lines: Vec<String> = report.scenarios.iter().map(|s| s.line()).collect();
    assert_eq!((report.passed, report.failed), (1, 6), "{lines:#?}");
    let msg = |i: usize| {
        report.scenarios[i].failure.as_ref().map(|f| format!("{}: {}", f.key, f.message)).unwrap_or_default()
    };
    assert!(msg(1).contains("line 15") && msg(1).contains("open_askz"), "{}", msg(1));
    assert!(msg(2).starts_with("step 2.at: line 13:") && msg(2).contains("goes back in time"), "{}", msg(2));
    assert!(msg(3).starts_with("step 2.at: line 13:"), "{}", msg(3));
    assert!(msg(4).contains("line 1"), "{}", msg(4));
    assert!(msg(5).contains("not UTF-8"), "{}", msg(5));
    assert!(msg(6).contains("no such file"), "{}", msg(6));
    std::fs::remove_dir_all(dir).ok();
}

/// Two loads in one file: `asks`, `open_asks` and `stage` check each, by its `load`.
const TWO_LOADS: &str = r#"
name = "two loads"
start = "2026-03-02T07:00:00Z"
[load]
id = "L1"
client = "client_a"
driver_phone = "+15555550100"
stage = "in_transit"
[[step]]
at = "07:00"
inbound = [
  { kind = "load_update", event_id = "init", load = "L2", client = "client_a", driver_phone = "+15555550101", stage = "in_transit" },
  { kind = "location_ping", event_id = "ping_a", load = "L2", risk = "high", lat = 41.88, lon = -87.63 },
]
[[step]]
at = "07:01"
inbound = [{ kind = "load_update", event_id = "tms_1", stage = "delivered" }]
expect.stage = [{ stage = "delivered" }, { load = "L2", stage = "in_transit" }]
expect.open_asks = [{ ids = [] }, { load = "L2", ids = ["ask:eta_request:ping_a"] }]
expect.asks = [{ id = "ask:eta_request:ping_a", status = "open", step = 1, load = "L2" }]
"#;

#[tokio::test]
async fn asks_open_asks_and_stage_check_each_load_by_its_load_key() {
    let r = run(TWO_LOADS, Faults::default()).await;
    assert!(r.passed, "{}", r.line());
    for (from, to, key, says) in [
        (
            "{ load = \"L2\", stage = \"in_transit\" }",
            "{ load = \"L2\", stage = \"delivered\" }",
            "stage",
            "load L2: expected \"delivered\", got \"in_transit\"",
        ),
        (
            "load = \"L2\", ids = [\"ask:eta_request:ping_a\"]",
            "load = \"L2\", ids = []",
            "open_asks",
            "load L2: missing [], unexpected [\"ask:eta_request:ping_a\"]",
        ),
        (
            "status = \"open\", step = 1, load = \"L2\"",
            "status = \"answered\", load = \"L2\"",
            "asks",
            "load L2: ask ask:eta_request:ping_a: expected status answered, got status open step 1",
        ),
    ] {
        let f = run(&TWO_LOADS.replace(from, to), Faults::default()).await.failure.expect(key);
        assert_eq!((f.step, f.key.as_str(), f.message.as_str()), (Some(2), key, says));
    }
}

#[tokio::test]
async fn with_timelines_a_failing_scenario_reports_its_loads_timelines() {
    let wrong = TWO_LOADS.replace("stage = \"delivered\" }, { load", "stage = \"at_dock\" }, { load");
    let opts = EvalOptions { timelines: true, ..EvalOptions::default() };
    let r =
        run_scenario_with(&parse(&wrong).unwrap(), "inline.toml", &EvalStore::SqliteMemory, Faults::default(), &opts)
            .await;
    assert!(!r.passed);
    let t = r.timeline.expect("a timeline");
    assert!(t.contains("load L1 ") && t.contains("load L2 "), "{t}");
    assert!(t.contains("ask:eta_request:ping_a"), "{t}");
    // Without the option (and for a passing scenario) there is none.
    assert!(run(&wrong, Faults::default()).await.timeline.is_none());
    let good = parse(TWO_LOADS).unwrap();
    let ok = run_scenario_with(&good, "x", &EvalStore::SqliteMemory, Faults::default(), &opts).await;
    assert!(ok.timeline.is_none());
}

#[tokio::test]
async fn the_junit_report_has_a_test_case_per_scenario_and_escapes_text() {
    let wrong = GOOD
        .replace("name = \"ask once\"", "name = \"ask <once> & \\\"again\\\"\"")
        .replace("/1/send_sms\", to", "/2/send_sms\", to");
    let passed = run(GOOD, Faults::default()).await;
    let failed = run(&wrong, Faults::default()).await;
    let report = haul_harness::eval::Report { scenarios: vec![passed, failed], passed: 1, failed: 1 };
    let xml = haul_harness::eval::junit(&report);
    assert!(
        xml.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites tests=\"2\" failures=\"1\""),
        "{xml}"
    );
    assert!(xml.contains("<testcase classname=\"inline.toml\" name=\"ask once\" time=\""), "{xml}");
    assert!(xml.contains("name=\"ask &lt;once&gt; &amp; &quot;again&quot;\""), "{xml}");
    assert!(xml.contains("<failure message=\"missing [&quot;sms 481207/ask:eta_request:ping_0700/2/send_sms"), "{xml}");
    assert!(xml.contains("type=\"sent\""), "{xml}");
    assert_eq!(xml.matches("<testcase ").count(), 2);
    assert_eq!(xml.matches("<failure ").count(), 1);
    assert!(xml.trim_end().ends_with("</testsuite>\n</testsuites>"), "{xml}");
}

/// Four loads' SMS fail at one instant, in one concurrent batch: each row's retry wait
/// must come from the seed, its id and its attempt, not from which send failed first,
/// so the scenario gives one answer (its result, and the order the SMS were claimed
/// in) however the tasks were scheduled.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sms_failing_at_one_instant_retry_in_one_order_over_20_runs() {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../evals/outbox_simultaneous_sms_failures_retry_in_one_order.toml");
    let scenario = parse(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let mut answers = std::collections::BTreeMap::<(String, Vec<String>), usize>::new();
    for _ in 0..20 {
        let claims = Arc::new(Mutex::new(Vec::new()));
        let seen = claims.clone();
        let faults = Faults::default().with_observer(move |o| {
            if let Observed::Claimed { outbox_id, .. } = o
                && outbox_id.ends_with("/send_sms")
            {
                seen.lock().unwrap().push(outbox_id.split('/').next().unwrap_or("").to_owned());
            }
        });
        let r = run_scenario(&scenario, "retry_order.toml", &EvalStore::SqliteMemory, faults).await;
        let order = claims.lock().unwrap().clone();
        *answers.entry((r.line(), order)).or_default() += 1;
    }
    let pass = "PASS outbox: SMS that fail at one instant retry in one order, every run".to_string();
    let order = ["R1", "R2", "R3", "R4", "R2", "R3", "R1", "R4"];
    let claimed_first: Vec<String> = order.iter().map(|s| s.to_string()).collect();
    let got: Vec<_> = answers.into_iter().collect();
    assert_eq!(got.len(), 1, "{} answers: {got:#?}", got.len());
    let ((line, claims), n) = &got[0];
    assert_eq!((line, n), (&pass, &20));
    // The first sends in one batch (any order), then the retries in the order of their waits.
    let (first, retries) = claims.split_at(4);
    let mut first = first.to_vec();
    first.sort();
    assert_eq!((first.as_slice(), retries), (&claimed_first[..4], &claimed_first[4..]));
}

/// Every log a run of the whole library keeps, load by load, record by record.
async fn library_logs(store: &EvalStore, files: &[PathBuf]) -> Vec<(String, Vec<haul_core::projection::Record>)> {
    let dir = std::env::temp_dir().join(format!("haul-repeat-{}-{}", std::process::id(), fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let keep =
        haul_harness::eval::keep::Keep::open(&format!("sqlite://{}", dir.join("kept.db").display())).await.unwrap();
    let keep = Arc::new(keep);
    let opts = EvalOptions { keep: Some(keep.clone()), ..EvalOptions::default() };
    let report = run_paths_with(files, store, &opts, |_| {}).await;
    assert_eq!(report.failed, 0, "{:#?}", report.scenarios.iter().filter(|s| !s.passed).collect::<Vec<_>>());
    let kept = keep.store();
    let mut logs = Vec::new();
    let mut after = None;
    loop {
        let ids = kept.load_ids(after.as_ref(), 100).await.unwrap();
        let Some(last) = ids.last().cloned() else { break };
        for id in ids {
            let (records, _) = kept.read(&id).await.unwrap();
            logs.push((id.to_string(), records));
        }
        after = Some(last);
    }
    let _ = std::fs::remove_dir_all(&dir);
    logs
}

/// A seeded run repeats record for record, the log's order included: the library run
/// twice keeps the same logs. One decision's outcomes (`send_sms`, `set_timer`) once
/// reached the log in the order their concurrent sends happened to end in.
async fn the_library_run_twice_keeps_the_same_logs_record_for_record(store: EvalStore, files: &[&str], loads: usize) {
    let evals = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../evals");
    let files: Vec<PathBuf> = files.iter().map(|f| evals.join(f)).collect();
    let first = library_logs(&store, &files).await;
    assert!(first.len() >= loads, "{} loads kept", first.len());
    let second = library_logs(&store, &files).await;
    assert_eq!(first.len(), second.len());
    for ((load, a), (_, b)) in first.iter().zip(&second) {
        let ids = |r: &[haul_core::projection::Record]| r.iter().map(|r| r.entry_id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(a), ids(b), "load {load}: the log's order moved between two runs");
        assert_eq!(a, b, "load {load}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_library_run_twice_keeps_the_same_logs_record_for_record_on_sqlite() {
    the_library_run_twice_keeps_the_same_logs_record_for_record(EvalStore::SqliteMemory, &[""], 40).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_library_run_twice_keeps_the_same_logs_record_for_record_on_postgres() {
    // A few scenarios whose decisions send an SMS and set a timer at once (the whole
    // library on PostgreSQL runs in `scripts/test`).
    let files = [
        "sop_eta_request_answered_after_second_attempt.toml",
        "two_clients_two_loads_follow_their_own_policies.toml",
        "multi_day_load_escalates_overnight.toml",
    ];
    let url = haul_postgres::testing::database_url();
    the_library_run_twice_keeps_the_same_logs_record_for_record(EvalStore::Postgres(url), &files, 3).await;
}
