//! `haul eval --keep`, `haul replay` and `haul export-scenario` as a person runs them
//! (the real binary, a SQLite file): exit codes, the summary, the HTML file, the
//! exported scenario passing `haul eval`, and a missing store not created.
//! (Both backends, and the figures' exactness: haul-harness/tests/replay.rs.)

use std::path::{Path, PathBuf};
use std::process::Command;

fn haul(args: &[&str]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_haul"));
    cmd.args(args).current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("HAUL_") || k == "DATABASE_URL") {
        cmd.env_remove(k);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("haul-replay-cli-{}-{}", std::process::id(), fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn keep_replay_and_export_from_the_command_line() {
    let dir = temp_dir();
    let db = format!("sqlite://{}", dir.join("kept.db").display());
    let kept = dir.join("kept.toml");
    let (code, out, err) = haul(&["eval", "evals/", "--keep", &db, "--keep-config", kept.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(err.contains("kept ") && err.contains("renamed"), "{err}");

    // The same SOP: nothing differs, exit 0.
    let (code, out, err) = haul(&["replay", "--config", kept.to_str().unwrap(), "--db", &db, "--all"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("one-step what-if"), "{out}");
    assert!(out.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["different", "0"]), "{out}");

    // client_a with two attempts: differences, exit 2, and the HTML report.
    let candidate = std::fs::read_to_string(&kept).unwrap().replacen(
        "[clients.client_a.eta_request]\nretry_after = \"30m\"\nmax_attempts = 3",
        "[clients.client_a.eta_request]\nretry_after = \"30m\"\nmax_attempts = 2",
        1,
    );
    let cand = dir.join("candidate.toml");
    std::fs::write(&cand, candidate).unwrap();
    let html = dir.join("replay.html");
    let (code, out, err) =
        haul(&["replay", "--config", cand.to_str().unwrap(), "--db", &db, "--all", "--html", html.to_str().unwrap()]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(out.contains("create_hero_task") && out.contains("attempt 2 of 2"), "{out}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>") && page.contains("one-step what-if"), "{page}");
    let (code, out, _) =
        haul(&["replay", "--config", cand.to_str().unwrap(), "--db", &db, "--client", "client_a", "--json"]);
    assert_eq!(code, 2);
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(report["summary"]["different"].as_u64().unwrap() > 0);

    // No selection is an error that says what to give.
    let (code, _, err) = haul(&["replay", "--db", &db]);
    assert_eq!(code, 1);
    assert!(err.contains("--load ID") && err.contains("--all"), "{err}");

    // Export a load, run it, edit it.
    let scenario = dir.join("481207.toml");
    let (code, out, err) = haul(&[
        "export-scenario",
        "481207",
        "--config",
        kept.to_str().unwrap(),
        "--db",
        &db,
        "-o",
        scenario.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = haul(&["eval", scenario.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let text = std::fs::read_to_string(&scenario).unwrap();
    assert!(!text.contains("+15555550100"), "the driver's phone is faked:\n{text}");
    let edited = text.replacen("decider = \"sop\"", "decider = \"filter\"", 1);
    assert_ne!(edited, text);
    std::fs::write(&scenario, edited).unwrap();
    let (code, out, _) = haul(&["eval", scenario.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("decisions"), "{out}");

    // A store that does not exist is an error and is not created.
    let missing = dir.join("missing.db");
    let (code, _, err) = haul(&["replay", "--db", &format!("sqlite://{}", missing.display()), "--all"]);
    assert_eq!(code, 1, "{err}");
    assert!(!missing.exists(), "replay created the store");
    let (code, _, _) = haul(&["export-scenario", "481207", "--db", &format!("sqlite://{}", missing.display())]);
    assert_eq!(code, 1);
    assert!(!missing.exists());
}

/// `--live --max-calls N`: the model of `decider.llm.*` (here a recorded server standing
/// in for it, over real HTTP) answers what the answers file lacks, N times at most; its
/// answers go into the file, and the same replay then runs without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_answers_are_recorded_within_the_budget_and_replay_again_for_free() {
    use haul_harness::testkit_llm::{Answers, RecordedLlm};
    let model = Answers::parse(
        "model = \"m-live\"\n[[answer]]\nevent = \"*\"\ncontent = \"nothing to do\"\n\
         [[answer.tool_call]]\nname = \"no_action\"\narguments = { reason = \"stand-in\" }\n",
    )
    .unwrap();
    let upstream = RecordedLlm::start(model, "upstream-key").await.unwrap();
    let dir = temp_dir();
    let db = format!("sqlite://{}", dir.join("kept.db").display());
    let cfg = dir.join("llm.toml");
    std::fs::write(
        &cfg,
        format!(
            "[decider]\nkind = \"llm\"\nllm.base_url = \"{}\"\nllm.model = \"m-live\"\nllm.api_key_env = \"HAUL_TEST_UPSTREAM_KEY\"\n",
            upstream.base_url()
        ),
    )
    .unwrap();
    let answers = dir.join("answers.toml");
    let run = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_haul"));
            cmd.args(&args).current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."));
            for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("HAUL_") || k == "DATABASE_URL") {
                cmd.env_remove(k);
            }
            cmd.env("HAUL_TEST_UPSTREAM_KEY", "upstream-key");
            let out = cmd.output().unwrap();
            (
                out.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        })
    };
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let (code, out, err) =
        run(s(&["eval", "evals/sop_eta_request_answered_after_second_attempt.toml", "--keep", &db])).await.unwrap();
    assert_eq!(code, 0, "{out}{err}");
    let replay = |live: bool| {
        let mut a = s(&["replay", "--config", cfg.to_str().unwrap(), "--db", &db, "--all", "--json"]);
        a.extend(s(&["--llm-answers", answers.to_str().unwrap()]));
        if live {
            a.extend(s(&["--live", "--max-calls", "2"]));
        }
        run(a)
    };
    // Without --live and without the file: an error, no model called.
    let (code, _, err) = replay(false).await.unwrap();
    assert_eq!(code, 1, "{err}");
    assert_eq!(upstream.requests().len(), 0);
    let (code, out, err) = replay(true).await.unwrap();
    assert!(err.contains("2 live answers added"), "{err}");
    assert_eq!(upstream.requests().len(), 2, "the budget bounds the calls");
    let first: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    // Exit 2 says some decision differs, 0 that none does: the summary's count decides.
    let differs = first["summary"]["different"].as_u64().unwrap_or_else(|| panic!("{first}")) > 0;
    assert_eq!(code, if differs { 2 } else { 0 }, "{out}{err}");
    let budget_spent =
        first["summary"]["not_compared"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum::<u64>();
    assert!(budget_spent > 0, "{first}");
    let recorded = Answers::from_file(&answers).unwrap();
    assert_eq!(recorded.answers.len(), 2);
    // Again without --live: the two recorded answers, no call.
    let (again_code, out, err) = replay(false).await.unwrap();
    let again: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    assert_eq!(again_code, code, "the rerun ends as the first run did: {err}");
    assert_eq!(again["summary"]["compared"], first["summary"]["compared"]);
    assert_eq!(again["summary"]["different"], first["summary"]["different"]);
    assert_eq!(upstream.requests().len(), 2, "the rerun called no model");
}

/// Shadow mode's stored decisions, reported by `haul replay --shadow`: a worker ran a
/// load's life with a shadow SOP that asks client_a's drivers twice, on a SQLite file;
/// the real binary then reads the file read-only and reports the two disagreements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_shadow_reports_the_stored_disagreements() {
    use std::sync::Arc;
    use std::time::Duration;

    use haul_core::{Clock, FakeClock, QueueMode};
    use haul_runtime::channels::Channels;
    use haul_runtime::pipeline::{Parts, Pipeline};
    use haul_runtime::shadow::{Shadow, ShadowSettings};

    let dir = temp_dir();
    let file = dir.join("shadowed.db");
    let db = format!("sqlite://{}", file.display());
    {
        let config = haul_config::Config::default();
        let store = haul_backends::open(&db, Some(3)).await.unwrap();
        let clock = Arc::new(FakeClock::new("2026-03-02T07:00:00Z".parse().unwrap()));
        let parts = Parts {
            store: store.clone(),
            queue: store.clone(),
            queue_mode: QueueMode::StoreQueue,
            channels: Channels::from_config(&config, store.clone(), &Default::default()).unwrap(),
            clock: clock.clone(),
            faults: Default::default(),
            seed: Some(3),
        };
        let pipeline = Pipeline::new(&config, parts, None);
        let mut policies = haul_core::sop::Policies::default();
        let two = haul_core::sop::EtaPolicy { max_attempts: 2, ..Default::default() };
        policies.clients.insert("client_a".into(), two);
        let decider = Arc::new(haul_runtime::decider::SopDecider { policies: policies.clone() });
        let settings = ShadowSettings { capacity: 256, timeout: Duration::from_secs(5) };
        let shadow =
            Arc::new(Shadow::start(decider, policies, store.clone(), clock.clone() as Arc<dyn Clock>, settings));
        pipeline.worker.shadow_with(shadow.clone());
        let load = haul_core::ids::LoadId::parse("481207").unwrap();
        let events = [
            r#"{"event_id":"load:init","kind":"load_update","client":"client_a","driver_phone":"+15555550100"}"#,
            r#"{"event_id":"ping_0700","kind":"location_ping","lat":41.88,"lon":-87.63,"risk":"high"}"#,
        ];
        for e in events {
            let id = serde_json::from_str::<serde_json::Value>(e).unwrap()["event_id"].as_str().unwrap().to_owned();
            store.publish(&load, &id, e, clock.now()).await.unwrap();
        }
        pipeline.run_until_quiet().await.unwrap();
        for _ in 0..3 {
            clock.advance(Duration::from_secs(30 * 60));
            pipeline.run_until_quiet().await.unwrap();
        }
        shadow.settled().await;
    }

    let html = dir.join("shadow.html");
    let (code, out, err) = haul(&["replay", "--shadow", "--db", &db, "--all", "--html", html.to_str().unwrap()]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(out.contains("against candidate shadow sop") && out.contains("Shadow decisions were made live"), "{out}");
    let counts = |out: &str, name: &str| {
        out.lines().find_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() == 2 && w[0] == name).then(|| w[1].to_owned())
        })
    };
    assert_eq!(counts(&out, "same").as_deref(), Some("3"), "{out}");
    assert_eq!(counts(&out, "different").as_deref(), Some("2"), "{out}");
    assert!(out.contains("attempt 2 of 3") && out.contains("attempt 2 of 2"), "{out}");
    assert!(out.contains("+ create_hero_task"), "{out}");
    assert!(std::fs::read_to_string(&html).unwrap().contains("Shadow decisions were made live"));
    let (code, out, _) = haul(&["replay", "--shadow", "--db", &db, "--load", "481207", "--json"]);
    assert_eq!(code, 2);
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["summary"]["compared"], 5, "{report}");
    assert_eq!(report["summary"]["different"], 2);
    // Counted under the rule the event falls under for the shadow's policies.
    assert_eq!(report["summary"]["by_rule"]["rule 2: no answer, ask again"]["different"], 1, "{report}");
    assert_eq!(report["summary"]["by_rule"]["rule 3: no answer, escalate"]["different"], 1, "{report}");
    let diffs: Vec<&str> =
        report["differences"].as_array().unwrap().iter().map(|d| d["event_id"].as_str().unwrap()).collect();
    assert_eq!(diffs, ["evt:tmr:481207:ask:eta_request:ping_0700:1", "evt:tmr:481207:ask:eta_request:ping_0700:2"]);
    // A load with no shadow decisions: nothing differs.
    let (code, out, err) = haul(&["replay", "--shadow", "--db", &db, "--load", "other"]);
    assert_eq!(code, 0, "{out}{err}");
    // The shadow is not a candidate to run.
    let (code, _, err) = haul(&["replay", "--shadow", "--decider", "llm", "--db", &db, "--all"]);
    assert_ne!(code, 0);
    assert!(err.contains("cannot be used with"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
