//! Golden logs: logs written by earlier builds read the same forever.
//!
//! `tests/golden/{set}/log.jsonl` holds logs a build wrote (one record a line, with its
//! load), `clients.toml` the policies they were decided under, and `expected/` what that
//! build derived from them: each load's projected state, the filter's verdict on each of
//! its events, `haul inspect`'s text, `haul replay`'s answer under the SOP and
//! `haul export-scenario`'s file. Every backend takes the records in, with their `seq`,
//! ids, payloads and times, and the build under test must derive the same.
//!
//! The logs are never rewritten. A change that must alter a derived answer says so:
//! `HAUL_GOLDEN_ACCEPT="why" cargo test -p haul-harness --test golden` rewrites the
//! expected files and adds an entry to `tests/golden/HISTORY.md` naming the reason and
//! each changed file's digest; the test refuses an expected file whose digest no entry
//! of the history names, so nothing is regenerated silently.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use haul_config::ClientConfig;
use haul_core::Clock;
use haul_core::filter::filter;
use haul_core::ids::LoadId;
use haul_core::projection::{Record, project};
use haul_core::replay::Walker;
use haul_harness::export::{ExportOptions, scenario};
use haul_harness::replay::{Candidate, ReplayOptions, replay};
use haul_runtime::inspect::{Page, load_view, timeline};
use haul_store::{LogReader, NewEntry, Store};
use serde::Deserialize;
use sha2::Digest;

/// The sets of golden logs, each a folder of `tests/golden`.
const SETS: [&str; 4] = ["sop", "llm", "unreadable", "timers"];

/// What is derived from each set, one file each.
const DERIVED: [&str; 5] = ["state.json", "filter.txt", "inspect.txt", "replay.json", "export.toml"];

fn golden() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// One line of a `log.jsonl`: a record as its build stored it, and its load.
#[derive(Deserialize)]
struct Line {
    load_id: String,
    seq: u64,
    entry_id: String,
    kind: String,
    payload: serde_json::Value,
    recorded_at: haul_core::Timestamp,
}

struct Set {
    name: &'static str,
    /// Each load's records, decoded by this build, with the stored entry each came from.
    loads: BTreeMap<LoadId, Vec<(Record, NewEntry)>>,
    clients: BTreeMap<String, ClientConfig>,
}

impl Set {
    fn records(&self, load: &LoadId) -> Vec<Record> {
        self.loads[load].iter().map(|(r, _)| r.clone()).collect()
    }
}

fn read_set(name: &'static str) -> Set {
    let dir = golden().join(name);
    let text = std::fs::read_to_string(dir.join("log.jsonl")).unwrap();
    let mut loads: BTreeMap<LoadId, Vec<(Record, NewEntry)>> = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let l: Line = serde_json::from_str(line).unwrap_or_else(|e| panic!("{name}/log.jsonl line {}: {e}", i + 1));
        let stored = NewEntry::stored(l.entry_id.clone(), l.kind.clone(), l.payload.clone());
        let record = Record::decode(l.seq, l.entry_id, &l.kind, l.payload, l.recorded_at);
        loads.entry(LoadId::parse(&l.load_id).unwrap()).or_default().push((record, stored));
    }
    let (config, _) = haul_config::Config::load(Some(&dir.join("clients.toml")), std::iter::empty()).unwrap();
    Set { name, loads, clients: config.clients }
}

/// Writes every record of `set` into `store` as its build wrote it: one append per
/// record, at its recording time, so each takes its `seq`.
async fn write_set(store: &dyn Store, set: &Set) {
    for (load, records) in &set.loads {
        for (i, (r, stored)) in records.iter().enumerate() {
            assert_eq!(r.seq, i as u64 + 1, "{}: {load}'s records run 1, 2, … without a gap", set.name);
            store.append(load, vec![stored.clone()], i as u64, vec![], r.recorded_at).await.unwrap_or_else(|e| {
                panic!("{}: {load} record {}: {e}", set.name, r.seq);
            });
        }
    }
}

/// What the build under test derives from `set`, written into the store at `url`.
async fn derive(url: &str, set: &Set) -> BTreeMap<&'static str, String> {
    let store = haul_backends::open(url, Some(1)).await.unwrap();
    write_set(store.as_ref(), set).await;
    let mut state = BTreeMap::new();
    let (mut verdicts, mut inspect, mut export) = (String::new(), String::new(), String::new());
    for load in set.loads.keys() {
        // The store gives back every field as written.
        let written = set.records(load);
        let (read, version) = store.read(load).await.unwrap();
        assert_eq!(read, written, "{}: {load} reads back otherwise than it was written", set.name);
        assert_eq!(version, written.len() as u64);
        state.insert(load.to_string(), project(&read));
        verdicts.push_str(&format!("## {load}\n"));
        let mut w = Walker::new(load.clone());
        for r in read.iter().cloned() {
            let Some(step) = w.feed(r) else { continue };
            let (event, now) = (&step.event, step.recorded.decided_at);
            let verdict = match filter(load, w.state(), event, now) {
                Some(d) => format!("filtered: {} [{}]", d.rationale, types(&d)),
                None => "to the decider".to_string(),
            };
            verdicts.push_str(&format!("{} {}: {verdict}\n", event.event_id, event.kind()));
            w.finish(step);
        }
        let (_, unpaired) = w.close();
        verdicts.push_str(&format!("unpaired: {unpaired}\n\n"));
        let page = Page { limit: haul_runtime::inspect::PAGE_MAX, ..Page::default() };
        let view = load_view(store.as_ref(), load, &page).await.unwrap().expect("a load with records");
        inspect.push_str(&timeline(&view));
        inspect.push('\n');
        export.push_str(&format!("# ---- {load}\n"));
        match scenario(load, &read, &set.clients, ExportOptions::default()) {
            Ok(text) => export.push_str(&text),
            Err(e) => export.push_str(&format!("# not exported: {e:#}\n")),
        }
        export.push('\n');
    }
    let reader: Arc<dyn LogReader> = haul_backends::open_log_reader(url).await.unwrap();
    let policies = haul_config::policies(&set.clients);
    let opts = ReplayOptions { show: usize::MAX, page: 64, ..ReplayOptions::default() };
    let report = replay(reader, "golden", &Candidate::Sop(policies), &opts, |_| {}).await.unwrap();
    let mut report = serde_json::to_value(&report).unwrap();
    report["seconds"] = serde_json::json!(0);
    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap() + "\n";
    BTreeMap::from([
        ("state.json", pretty(&serde_json::to_value(&state).unwrap())),
        ("filter.txt", verdicts),
        ("inspect.txt", inspect),
        ("replay.json", pretty(&report)),
        ("export.toml", export),
    ])
}

fn types(d: &haul_core::Decision) -> String {
    d.actions.iter().map(|a| a.action_type().as_str()).collect::<Vec<_>>().join(", ")
}

fn sha256(text: &str) -> String {
    sha2::Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

fn expected_path(set: &str, file: &str) -> PathBuf {
    golden().join(set).join("expected").join(file)
}

/// The first line where `got` and `want` part, with a few lines of each around it.
fn first_difference(got: &str, want: &str) -> String {
    let (g, w): (Vec<&str>, Vec<&str>) = (got.lines().collect(), want.lines().collect());
    let at = g.iter().zip(&w).position(|(a, b)| a != b).unwrap_or(g.len().min(w.len()));
    let around = |v: &[&str]| v[at.saturating_sub(2)..(at + 3).min(v.len())].join("\n");
    format!("line {}:\n--- expected\n{}\n+++ derived now\n{}", at + 1, around(&w), around(&g))
}

/// Every set on the store `url` makes for it: the derived files must be the expected
/// ones, or (accepting, with a reason) become them.
async fn check(url_for: impl AsyncFn(&str) -> String, accept: Option<&str>) {
    let mut failures = Vec::new();
    let mut changed = Vec::new();
    for name in SETS {
        let set = read_set(name);
        let url = url_for(name).await;
        for (file, got) in derive(&url, &set).await {
            let path = expected_path(name, file);
            let want = std::fs::read_to_string(&path).unwrap_or_default();
            if got == want {
                continue;
            }
            match accept {
                Some(_) => {
                    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                    std::fs::write(&path, &got).unwrap();
                    changed.push(format!("{name}/expected/{file}"));
                }
                None => failures.push(format!("{name}/expected/{file}: {}", first_difference(&got, &want))),
            }
        }
    }
    if let Some(reason) = accept
        && !changed.is_empty()
    {
        record_history(reason, &changed);
    }
    assert!(
        failures.is_empty(),
        "the build under test reads the golden logs otherwise than the build that wrote them did.\n\
         If the change is meant, run `HAUL_GOLDEN_ACCEPT=\"why\" cargo test -p haul-harness --test golden` \
         and commit the files it rewrites with tests/golden/HISTORY.md.\n\n{}",
        failures.join("\n\n")
    );
}

/// Adds an entry to the history: when, why, and each changed file with its digest.
fn record_history(reason: &str, changed: &[String]) {
    let path = golden().join("HISTORY.md");
    let mut history = std::fs::read_to_string(&path).unwrap_or_default();
    let today = haul_runtime::clock::SystemClock.now().strftime("%Y-%m-%d");
    history.push_str(&format!("\n## {today}: {}\n\n", reason.trim()));
    for file in changed {
        let text = std::fs::read_to_string(golden().join(file)).unwrap();
        history.push_str(&format!("- `{file}` sha256 `{}`\n", sha256(&text)));
    }
    std::fs::write(path, history).unwrap();
}

/// Each expected file's digest as it is now is named by the history: a change to one
/// came with a reason.
#[test]
fn every_expected_file_is_accounted_for_in_the_history() {
    let history = std::fs::read_to_string(golden().join("HISTORY.md")).unwrap();
    for name in SETS {
        for file in DERIVED {
            let path = expected_path(name, file);
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let entry = format!("`{name}/expected/{file}` sha256 `{}`", sha256(&text));
            assert!(
                history.contains(&entry),
                "{name}/expected/{file} changed without an entry in tests/golden/HISTORY.md saying why \
                 (HAUL_GOLDEN_ACCEPT=\"why\" writes one)"
            );
        }
    }
}

/// A record is decoded once, where the store hands it up, and made JSON again only
/// where it is shown as JSON (the API's view of a load, `--keep`): what comes back is
/// what was stored, for every record of every golden log, those no build can read too.
#[test]
fn every_stored_record_decodes_and_gives_back_what_was_stored() {
    for name in SETS {
        for records in read_set(name).loads.values() {
            for (r, stored) in records {
                assert_eq!(NewEntry::of(r), *stored, "{name}: record {} ({})", r.seq, r.entry_id);
            }
        }
    }
}

/// The SOP's golden logs (the eval library's, decided by this build) keep the
/// simulator's second reading of the rules: every SOP and filter decision in them is
/// what the rule table says, so the table is checked against the library too.
#[test]
fn the_sop_logs_keep_the_rule_table() {
    for name in ["sop", "timers"] {
        let set = read_set(name);
        let policies = haul_config::policies(&set.clients);
        for load in set.loads.keys() {
            let policy = |client: Option<&str>| {
                let p = policies.for_client(client);
                haul_harness::oracle::Policy { max_attempts: p.max_attempts, trigger_risk: p.trigger_risk }
            };
            haul_harness::oracle::check(load, &set.records(load), policy).unwrap_or_else(|why| panic!("{name}: {why}"));
        }
    }
}

/// The golden logs cover every record kind and every decider, action type, outcome
/// class and operator command a log holds today, loads of many days, and records no
/// build can read: a set that lost one would test less without saying so.
#[test]
fn the_golden_logs_cover_every_kind_of_record() {
    let mut seen = std::collections::BTreeSet::new();
    for name in SETS {
        for records in read_set(name).loads.values() {
            let span = haul_core::time::since(records.last().unwrap().0.recorded_at, records[0].0.recorded_at);
            if span.as_secs() >= 2 * 24 * 3600 {
                seen.insert("a load of many days".to_string());
            }
            for (r, _) in records {
                seen.insert(format!("kind {}", r.kind()));
                let p = &r.payload();
                if let Some(d) = p["decider"].as_str() {
                    seen.insert(format!("decider {}", d.split(':').next().unwrap()));
                }
                for a in p["actions"].as_array().into_iter().flatten() {
                    seen.insert(format!("action {}", a["type"].as_str().unwrap_or("?")));
                }
                if r.kind() == "action_outcome" {
                    let class = if p["hero_channel"] == true {
                        "hero_channel"
                    } else if p["internal"] == true {
                        "internal"
                    } else {
                        "external"
                    };
                    seen.insert(format!("outcome {} {class}", p["status"].as_str().unwrap_or("?")));
                    if p["receipt"] == haul_core::timers::RECEIPT {
                        seen.insert("a timer committed with its decision".to_string());
                    }
                }
                if let Some(c) = p["command"]["type"].as_str() {
                    seen.insert(format!("operator {c}"));
                }
            }
        }
        let mut state = haul_core::projection::LoadState::default();
        for records in read_set(name).loads.values() {
            for (r, _) in records {
                state.apply(r);
            }
        }
        if state.unreadable > 0 {
            seen.insert("an unreadable record".to_string());
        }
    }
    let want = [
        "kind load_update",
        "kind location_ping",
        "kind inbound_sms",
        "kind timer_fired",
        "kind action_outcome",
        "kind operator_action",
        "kind decision_recorded",
        "decider sop",
        "decider filter",
        "decider llm",
        "decider fallback",
        "decider operator",
        "action send_sms",
        "action set_timer",
        "action cancel_timer",
        "action create_hero_task",
        "action post_hero_slack",
        "action update_stage",
        "outcome delivered external",
        "outcome delivered hero_channel",
        "outcome delivered internal",
        "outcome failed external",
        "outcome failed hero_channel",
        "outcome failed internal",
        "operator requeue",
        "operator assign_sms",
        "operator resolve_ask",
        "a load of many days",
        "an unreadable record",
        "a timer committed with its decision",
    ];
    let missing: Vec<&str> = want.iter().copied().filter(|w| !seen.contains(*w)).collect();
    assert!(missing.is_empty(), "the golden logs hold no {missing:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn golden_logs_read_the_same_on_sqlite() {
    let dir = std::env::temp_dir().join(format!("haul-golden-{}-{}", std::process::id(), fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let accept = std::env::var("HAUL_GOLDEN_ACCEPT").ok();
    if let Some(reason) = &accept {
        assert!(reason.trim().len() >= 10, "HAUL_GOLDEN_ACCEPT must say why the derived answers change");
    }
    let dir_for = dir.clone();
    check(
        async move |set: &str| format!("sqlite://{}", dir_for.join(format!("{set}.db")).display()),
        accept.as_deref(),
    )
    .await;
    std::fs::remove_dir_all(dir).ok();
}

/// The scenarios `haul export-scenario` made of the SOP's golden logs still pass: the
/// files a user exported from an earlier build run unchanged on this one (timers sent
/// through the outbox, and timers committed with their decision).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenarios_exported_from_the_golden_logs_still_pass() {
    use haul_harness::eval::{EvalStore, run_scenario};
    for set in ["sop", "timers"] {
        let exported = std::fs::read_to_string(expected_path(set, "export.toml")).unwrap();
        let mut failed = Vec::new();
        let mut ran = 0;
        for piece in exported.split("# ---- ").skip(1) {
            let (load, text) = piece.split_once('\n').unwrap();
            let scenario = haul_harness::eval::scenario::parse(text).unwrap_or_else(|e| panic!("{load}: {e}"));
            let report = run_scenario(&scenario, load, &EvalStore::SqliteMemory, Default::default()).await;
            ran += 1;
            if !report.passed {
                failed.push(report.line());
            }
        }
        assert_eq!(ran, read_set(set).loads.len(), "{set}: one scenario per load");
        assert!(failed.is_empty(), "{set}: {}", failed.join("\n"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn golden_logs_read_the_same_on_postgres() {
    let url = haul_postgres::testing::database_url();
    let schemas = Arc::new(std::sync::Mutex::new(Vec::new()));
    let made = schemas.clone();
    check(
        async move |_: &str| {
            let (schema, schema_url) = haul_postgres::testing::fresh_schema_url(&url).await;
            made.lock().unwrap().push(schema);
            schema_url
        },
        None,
    )
    .await;
    let schemas = schemas.lock().unwrap().clone();
    haul_postgres::testing::drop_schemas(&haul_postgres::testing::database_url(), &schemas).await;
}
