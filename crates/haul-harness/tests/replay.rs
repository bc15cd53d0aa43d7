//! `haul replay` and `haul export-scenario` on a store filled by running the eval
//! library (`haul eval --keep`), on SQLite (a file) and PostgreSQL (a fresh schema):
//!
//! - the same SOP differs nowhere;
//! - `max_attempts = 2` for one client reports exactly the decisions that change: its
//!   third asks become escalations, its second asks say "of 2";
//! - every kept load, exported, passes `haul eval`; edited, it fails.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use haul_config::ClientConfig;
use haul_core::action::ActionType;
use haul_core::event::EventBody;
use haul_core::ids::LoadId;
use haul_core::projection::Record;
use haul_core::replay::ActionChange;
use haul_harness::eval::keep::Keep;
use haul_harness::eval::{EvalOptions, EvalStore, run_paths_with, run_scenario};
use haul_harness::replay::{Candidate, ReplayOptions, ReplayReport, replay};
use haul_runtime::faults::Faults;
use haul_store::{LogReader, Store};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A store filled by the eval library, with the clients' policies its loads ran under.
struct Kept {
    url: String,
    store: Arc<dyn Store>,
    clients: BTreeMap<String, ClientConfig>,
}

#[derive(serde::Deserialize)]
struct ClientsFile {
    clients: BTreeMap<String, ClientConfig>,
}

async fn fill(url: String) -> Kept {
    let keep = Arc::new(Keep::open(&url).await.unwrap());
    let opts = EvalOptions { keep: Some(keep.clone()), ..EvalOptions::default() };
    let report = run_paths_with(&[repo().join("evals")], &EvalStore::SqliteMemory, &opts, |_| {}).await;
    assert_eq!(
        report.failed,
        0,
        "{:?}",
        report.scenarios.iter().filter(|s| !s.passed).map(|s| s.line()).collect::<Vec<_>>()
    );
    let (loads, renamed) = keep.counts().await;
    assert!(loads >= 40 && !renamed.is_empty(), "{loads} loads, {renamed:?}");
    let clients = toml::from_str::<ClientsFile>(&keep.clients_toml().await).unwrap().clients;
    Kept { url, store: keep.store().clone(), clients }
}

async fn sqlite() -> Kept {
    let dir = std::env::temp_dir().join(format!("haul-replay-{}-{}", std::process::id(), fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    fill(format!("sqlite://{}", dir.join("kept.db").display())).await
}

async fn postgres() -> Kept {
    let (_, url) = haul_harness::fresh_schema_url(&haul_harness::database_url()).await.unwrap();
    fill(url).await
}

async fn run_replay(k: &Kept, clients: &BTreeMap<String, ClientConfig>) -> ReplayReport {
    let reader: Arc<dyn LogReader> = haul_backends::open_log_reader(&k.url).await.unwrap();
    let opts = ReplayOptions { show: usize::MAX, page: 7, ..ReplayOptions::default() };
    let candidate = Candidate::Sop(haul_config::policies(clients));
    replay(reader, "kept", &candidate, &opts, |_| {}).await.unwrap()
}

async fn same_sop_differs_nowhere(k: Kept) {
    let r = run_replay(&k, &k.clients).await;
    let s = &r.summary;
    assert!(s.loads >= 40 && s.compared >= 300, "{s:?}");
    assert_eq!((s.different, s.same), (0, s.compared), "{:#?}", r.differences.first());
    assert!(s.not_compared.is_empty(), "{:?}", s.not_compared);
    assert_eq!(s.by_rule.values().map(|c| c.compared).sum::<u64>(), s.compared);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_the_same_sop_differs_nowhere() {
    same_sop_differs_nowhere(sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_the_same_sop_differs_nowhere() {
    same_sop_differs_nowhere(postgres().await).await;
}

/// Every recorded decision of a load of `client` that asked again (rule 2), by the step it
/// asked: (load, event id) per step.
async fn asks_again(k: &Kept, client: &str) -> BTreeMap<u32, BTreeSet<(String, String)>> {
    let mut out: BTreeMap<u32, BTreeSet<(String, String)>> = BTreeMap::new();
    let mut after: Option<LoadId> = None;
    loop {
        let loads = k.store.load_ids(after.as_ref(), 100).await.unwrap();
        let Some(last) = loads.last().cloned() else { break };
        for l in loads {
            let (records, _) = k.store.read(&l).await.unwrap();
            let of_client = records.iter().any(
                |r| matches!(r.event(), Some((_, EventBody::LoadUpdate(u))) if u.client.as_deref() == Some(client)),
            );
            if !of_client {
                continue;
            }
            for d in records.iter().filter_map(Record::decision) {
                let Some(step) = d.actions.iter().find(|a| a.action_type() == ActionType::SendSms).and_then(|a| a.step)
                else {
                    continue;
                };
                if d.event_id.as_str().starts_with("evt:tmr:") {
                    out.entry(step).or_default().insert((l.to_string(), d.event_id.to_string()));
                }
            }
        }
        after = Some(last);
    }
    out
}

async fn two_attempts_escalate_exactly_where_the_third_ask_was(k: Kept) {
    let mut candidate = k.clients.clone();
    candidate.get_mut("client_a").expect("the library has client_a").eta_request.max_attempts = Some(2);
    let asked = asks_again(&k, "client_a").await;
    let third: BTreeSet<(String, String)> = asked.get(&3).cloned().unwrap_or_default();
    let second: BTreeSet<(String, String)> = asked.get(&2).cloned().unwrap_or_default();
    assert!(!third.is_empty() && !second.is_empty(), "{asked:?}");
    let r = run_replay(&k, &candidate).await;
    let mut escalations = BTreeSet::new();
    let mut reworded = BTreeSet::new();
    for d in &r.differences {
        let id = (d.load_id.clone(), d.event_id.clone());
        let kinds: Vec<String> = d
            .difference
            .actions
            .iter()
            .map(|a| match a {
                ActionChange::Added { action_type, .. } => format!("+{action_type}"),
                ActionChange::Removed { action_type, .. } => format!("-{action_type}"),
                ActionChange::Changed { action_type, fields, .. } => {
                    format!("{action_type}:{}", fields.iter().map(|f| f.field.as_str()).collect::<Vec<_>>().join(","))
                }
            })
            .collect();
        match kinds.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["-send_sms", "-set_timer", "+create_hero_task"] => {
                let urgent = d.candidate.actions.iter().any(|a| a.get("urgency").is_some_and(|u| u == "urgent"));
                assert!(urgent, "{d:?}");
                escalations.insert(id);
            }
            ["send_sms:body"] => {
                assert!(
                    d.candidate.actions.iter().any(|a| a.get("body").is_some_and(|b| b.contains("attempt 2 of 2")))
                );
                reworded.insert(id);
            }
            _ => panic!("an unexpected difference: {kinds:?} in {d:#?}"),
        }
    }
    assert_eq!(escalations, third, "the escalations are exactly the recorded third asks");
    assert_eq!(reworded, second, "the second asks say 'attempt 2 of 2'");
    let s = &r.summary;
    assert_eq!(s.different as usize, third.len() + second.len());
    assert_eq!(s.by_action_type["create_hero_task"].added as usize, third.len());
    assert_eq!(s.loads_affected as usize, r.affected_loads.len());
    // Only client_a's loads changed.
    let affected: BTreeSet<&String> = r.differences.iter().map(|d| &d.load_id).collect();
    let expected: BTreeSet<&String> = third.iter().chain(&second).map(|(l, _)| l).collect();
    assert_eq!(affected, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_two_attempts_escalate_exactly_where_the_third_ask_was() {
    two_attempts_escalate_exactly_where_the_third_ask_was(sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_two_attempts_escalate_exactly_where_the_third_ask_was() {
    two_attempts_escalate_exactly_where_the_third_ask_was(postgres().await).await;
}

async fn exported_loads_pass_and_fail_when_edited(k: Kept) {
    let reader = haul_backends::open_log_reader(&k.url).await.unwrap();
    let loads = reader.select_loads(&Default::default(), None, 1000).await.unwrap();
    assert!(loads.len() >= 40);
    let mut edited_one = false;
    for l in &loads {
        let records = reader.read_log_page(l, 0, 100_000).await.unwrap();
        let text = haul_harness::export::scenario(l, &records, &k.clients, Default::default()).unwrap();
        let scenario = haul_harness::eval::scenario::parse(&text).unwrap_or_else(|e| panic!("{l}: {e}\n{text}"));
        let r = run_scenario(&scenario, &format!("{l}.toml"), &EvalStore::SqliteMemory, Faults::default()).await;
        assert!(r.passed, "{}\n{text}", r.line());
        assert!(!text.contains("+15555550"), "phone numbers are faked:\n{text}");
        // An expectation edited: the ask's actions without its timer.
        let edit = text.replacen("actions = [\"send_sms\", \"set_timer\"]", "actions = [\"send_sms\"]", 1);
        if edit != text {
            let r = run_scenario(
                &haul_harness::eval::scenario::parse(&edit).unwrap(),
                "edited.toml",
                &EvalStore::SqliteMemory,
                Faults::default(),
            )
            .await;
            let f = r.failure.clone().expect("an edited expectation fails");
            assert_eq!(f.key, "decisions", "{}", r.line());
            edited_one = true;
        }
    }
    assert!(edited_one);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_exported_loads_pass_and_fail_when_edited() {
    exported_loads_pass_and_fail_when_edited(sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_exported_loads_pass_and_fail_when_edited() {
    exported_loads_pass_and_fail_when_edited(postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_writes_nothing_to_a_sqlite_file() {
    let k = sqlite().await;
    let path = PathBuf::from(k.url.trim_start_matches("sqlite://"));
    drop(k.store);
    let dir = path.parent().unwrap().to_owned();
    let files = || -> BTreeMap<String, Vec<u8>> {
        std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter_map(|p| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                // `-shm` is SQLite's shared memory, not data: a reader of a database
                // that another connection still has open marks it. Its presence counts.
                if name.ends_with("-shm") {
                    return Some((name, vec![]));
                }
                // A file listed may be gone by the time it is read (the last connection
                // to close deletes the `-wal`): then it is not there.
                match std::fs::read(&p) {
                    Ok(bytes) => Some((name, bytes)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                    Err(e) => panic!("{}: {e}", p.display()),
                }
            })
            .collect()
    };
    // The store's connections close after the drop (its writer thread last), and a
    // closing connection may checkpoint: wait until the folder has been at rest for
    // half a second, so that anything changing after is the replay's doing.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let (mut last, mut still) = (files(), 0);
    while still < 5 {
        assert!(std::time::Instant::now() < deadline, "the store's files did not come to rest");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let now = files();
        still = if now == last { still + 1 } else { 0 };
        last = now;
    }
    let before = last;
    let k2 = Kept {
        url: k.url.clone(),
        store: haul_backends::open("sqlite::memory:", None).await.unwrap(),
        clients: k.clients.clone(),
    };
    let r = run_replay(&k2, &k.clients).await;
    assert!(r.summary.compared > 0);
    let after = files();
    assert_eq!(before.keys().collect::<Vec<_>>(), after.keys().collect::<Vec<_>>(), "no file made or removed");
    assert!(before == after, "no byte written");
}

#[test]
fn the_html_report_escapes_what_strangers_wrote() {
    use haul_core::replay::{DecisionView, Difference, Divergence, Summary};
    let evil = "<script>alert('x')</script> & \"+15555550100\"";
    let view = DecisionView {
        decider: "sop".into(),
        filtered: false,
        rationale: evil.into(),
        actions: vec![BTreeMap::from([
            ("key".to_string(), "L1/e/send_sms".to_string()),
            ("body".to_string(), evil.to_string()),
        ])],
    };
    let report = ReplayReport {
        note: haul_core::replay::ONE_STEP_NOTE,
        store: "sqlite://x.db".into(),
        candidate: "sop".into(),
        summary: Summary::default(),
        differences: vec![Divergence {
            load_id: "L1".into(),
            event_id: "e".into(),
            event_kind: "inbound_sms".into(),
            event_seq: 3,
            decided_at: "2026-03-02T07:00:00Z".parse().unwrap(),
            rule: haul_core::sop::Rule::Rule5,
            event: serde_json::json!({"body": evil}),
            recorded: view.clone(),
            candidate: view,
            difference: Difference::default(),
        }],
        affected_loads: vec!["L1".into()],
        seconds: 0.1,
    };
    let html = haul_harness::replay::html(&report);
    assert!(!html.contains("<script>"), "{html}");
    assert!(html.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp;"), "{html}");
    assert!(!html.contains("15555550100"), "phone numbers are masked");
    assert!(!html.contains("src=") && !html.contains("href="), "self-contained");
}
