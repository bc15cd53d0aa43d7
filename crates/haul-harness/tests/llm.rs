//! The LLM decider (`decider.kind = "llm"`) through the real worker, dispatcher and
//! pump, against the recorded chat-completions server over real HTTP, on SQLite and
//! PostgreSQL: a good answer is recorded as `llm:{model}` and its actions dispatched;
//! every bad answer (malformed, unknown tool, bad arguments, another recipient, a key
//! out of form, a refusal, slow, 429, 500, too large, unreachable) is the `fallback`
//! decision with one urgent Hero task; the filter runs first, so no call is made for
//! delivered outcomes or stale timers.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use haul_config::Config;
use haul_core::sop::Policies;
use haul_core::tools::PROMPT_VERSION;
use haul_harness::testkit_llm::{Answers, RECORDED_API_KEY, RecordedLlm};
use haul_runtime::budget::Budgeted;
use haul_runtime::decider::SopDecider;
use haul_runtime::faults::Faults;
use haul_runtime::llm::{LlmDecider, LlmSettings};
use haul_store::Store;
use serde_json::json;

on_both_backends!(
    a_good_answer_is_an_llm_decision_and_its_actions_are_dispatched,
    the_filter_runs_first_so_no_call_for_delivered_outcomes_or_stale_timers,
    what_each_call_cost_is_recorded_and_a_spent_load_budget_hands_over_to_the_sop,
    a_spent_client_day_budget_hands_over_to_the_sop_and_alerts_once,
);

/// Each bad answer gets a fresh store of the backend (the cases share load ids).
mod every_bad_answer_is_the_fallback_decision {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn sqlite() {
        super::every_bad_answer_is_the_fallback_decision(false).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn postgres() {
        super::every_bad_answer_is_the_fallback_decision(true).await;
    }
}

async fn fresh(pg: bool) -> Arc<dyn Store> {
    if pg { common::postgres().await } else { common::sqlite().await }
}

const MODEL: &str = "test-model";

/// The answers every test shares: `load:init` is not filtered, so the model sees it.
fn answers(rest: &str) -> String {
    format!(
        r#"model = "{MODEL}"
timeout = "1s"

[[answer]]
event = "load:init"
content = "A new load: nothing to do yet."
tool_call = [{{ name = "no_action", arguments = {{ reason = "load created" }} }}]

{rest}"#
    )
}

const ASK: &str = "ask:eta_request:ping_0700";

/// The good answers of the ETA flow: ask at 07:00, ask again at 07:30, answered.
fn eta_flow() -> String {
    answers(&format!(
        r#"
[[answer]]
event = "ping_0700"
content = "Risk is high and no ask is open: ask the driver for an ETA."
[[answer.tool_call]]
name = "send_sms"
arguments = {{ to = "driver", body = "Hi, what is your ETA for load 481207?", ask_id = "{ASK}", step = 1 }}
[[answer.tool_call]]
name = "set_timer"
arguments = {{ ask_id = "{ASK}", step = 1, fire_at = "2026-03-02T07:30:00Z" }}

[[answer]]
event = "sms_*"
content = "The driver answered."
tool_call = [{{ name = "cancel_timer", arguments = {{ ask_id = "{ASK}", step = 1 }} }}]
"#
    ))
}

async fn llm_harness(store: Arc<dyn Store>, answers_toml: &str) -> (H, RecordedLlm) {
    let answers = Answers::parse(answers_toml).unwrap();
    let timeout = answers.timeout;
    let server = RecordedLlm::start(answers, RECORDED_API_KEY).await.unwrap();
    let decider = LlmDecider::new(
        LlmSettings { base_url: server.base_url(), model: MODEL.into(), api_key: RECORDED_API_KEY.into(), timeout },
        Policies::default(),
    )
    .unwrap();
    let mut config = Config::default();
    config.decider.llm.timeout = timeout;
    let h = harness(store, config, Faults::default(), Some(Arc::new(decider))).await;
    (h, server)
}

async fn a_good_answer_is_an_llm_decision_and_its_actions_are_dispatched(store: Arc<dyn Store>) {
    let (h, llm) = llm_harness(store, &eta_flow()).await;
    h.publish(init()).await;
    h.publish(ping("ping_0700")).await;
    h.settle().await;
    let d = h.decision("ping_0700").await;
    assert_eq!(d["decider"], format!("llm:{MODEL}"), "{d}");
    assert_eq!(d["filtered"], false);
    assert_eq!(d["prompt_version"], PROMPT_VERSION);
    assert_eq!(d["rationale"], "Risk is high and no ask is open: ask the driver for an ETA.");
    assert_eq!(d["asks"], json!([{"ask_id": ASK, "step": 1, "status": "open"}]));
    let types: Vec<&str> = d["actions"].as_array().unwrap().iter().map(|a| a["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["send_sms", "set_timer"]);
    // The SMS to the driver dispatched; the timer scheduled with the decision.
    assert_eq!(h.svc.sends("sms", SMS1), 1);
    let sms = h.svc.effects().into_iter().find(|e| e.key == SMS1).unwrap();
    assert_eq!(sms.payload["to"], DRIVER, "{}", sms.payload);
    let timer = haul_core::TimerId::parse("tmr:481207:ask:eta_request:ping_0700:1").unwrap();
    assert_eq!(h.store.get_timer(&timer).await.unwrap().map(|t| t.status), Some(haul_store::TimerStatus::Scheduled));
    let state = h.state().await;
    assert_eq!(state.asks.values().next().map(|a| (a.step, a.status.as_str())), Some((1, "open")));
    // The init decision: a noop by the model, not the fallback.
    let d = h.decision("load:init").await;
    assert_eq!((d["decider"].as_str(), d["actions"].as_array().map(Vec::len)), (Some("llm:test-model"), Some(0)));
    assert_eq!(llm.problems(), Vec::<String>::new());
    assert_eq!(llm.requests().len(), 2);
}

async fn the_filter_runs_first_so_no_call_for_delivered_outcomes_or_stale_timers(store: Arc<dyn Store>) {
    let (h, llm) = llm_harness(store, &eta_flow()).await;
    h.publish(init()).await;
    h.publish(ping("ping_0700")).await;
    h.settle().await;
    // Two actions delivered: two delivered outcomes, both filtered with no call.
    let delivered = format!("evt:out:{SMS1}:delivered");
    assert_eq!(h.decision(&delivered).await["decider"], "filter");
    // The driver answers exactly when the timer is due: the answer is processed first,
    // so the step-1 timer that fires after it is stale.
    h.set(h.at_min(30));
    h.publish(sms("sms_race", DRIVER, "ETA 8:10")).await;
    h.settle().await;
    assert_eq!(h.decision("sms_race").await["decider"], "llm:test-model");
    let stale = "evt:tmr:481207:ask:eta_request:ping_0700:1";
    let d = h.decision(stale).await;
    assert_eq!((d["decider"].as_str(), d["filtered"].as_bool()), (Some("filter"), Some(true)), "{d}");
    assert_eq!(h.state().await.asks.values().next().unwrap().status.as_str(), "answered");
    // Exactly one call per event the filter let through.
    let events: Vec<String> = llm.requests().into_iter().map(|r| r.event).collect();
    assert_eq!(events, ["load:init", "ping_0700", "sms_race"]);
    assert_eq!(llm.problems(), Vec::<String>::new());
}

/// One bad answer to the ping, and what the fallback's rationale must mention.
struct Bad {
    name: &'static str,
    answer: String,
    why: &'static str,
}

fn bad(name: &'static str, answer: &str, why: &'static str) -> Bad {
    Bad { name, answer: format!("[[answer]]\nevent = \"ping_0700\"\n{answer}\n"), why }
}

fn bad_answers() -> Vec<Bad> {
    let sms = |args: &str| format!("tool_call = [{{ name = \"send_sms\", arguments = {{ {args} }} }}]");
    let too_many: Vec<String> =
        (0..17).map(|i| format!("{{ name = \"no_action\", arguments = {{ reason = \"r{i}\" }} }}")).collect();
    let huge = "x".repeat(1024 * 1024 + 10);
    vec![
        bad("malformed body", "body = '{\"choices\": [{\"message\": '", "not a chat completion"),
        bad("not a completion", "body = '{\"hello\": 1}'", "not a chat completion"),
        bad("unknown tool", "tool_call = [{ name = \"launch_rocket\", arguments = {} }]", "unknown tool"),
        bad("missing argument", &sms("to = \"driver\""), "missing field `body`"),
        bad(
            "arguments not JSON",
            "tool_call = [{ name = \"send_sms\", arguments_raw = \"{to: driver\" }]",
            "bad arguments",
        ),
        bad("another recipient", &sms("to = \"+15555550199\", body = \"hi\""), "other than the driver"),
        bad(
            "two SMS with one key",
            "tool_call = [{ name = \"send_sms\", arguments = { to = \"driver\", body = \"a\" } }, \
             { name = \"send_sms\", arguments = { to = \"driver\", body = \"b\" } }]",
            "appears twice",
        ),
        bad(
            "ask named after another event",
            &sms("to = \"driver\", body = \"ETA?\", ask_id = \"ask:eta_request:ping_0600\", step = 1"),
            "named after this event",
        ),
        bad(
            "ask id out of form",
            &sms("to = \"driver\", body = \"ETA?\", ask_id = \"eta\", step = 1"),
            "not of the form",
        ),
        bad(
            "step 0",
            &sms("to = \"driver\", body = \"ETA?\", ask_id = \"ask:eta_request:ping_0700\", step = 0"),
            "step must be 1",
        ),
        bad("content only", "content = \"I would text the driver.\"\nfinish_reason = \"stop\"", "without a tool call"),
        bad("refusal", "refusal = \"I cannot help with that.\"", "refused"),
        bad(
            "slow",
            "delay = \"3s\"\ncontent = \"late\"\ntool_call = [{ name = \"no_action\", arguments = {} }]",
            "did not answer within",
        ),
        bad("rate limited", "status = 429", "429"),
        bad("server error", "status = 500", "500"),
        bad("too many tool calls", &format!("tool_call = [{}]", too_many.join(", ")), "17 tool calls"),
        bad("too large", &format!("body = \"{huge}\""), "larger than"),
    ]
}

async fn expect_fallback(h: &H, llm: Option<&RecordedLlm>, case: &str, why: &str) {
    h.publish(init()).await;
    h.publish(ping("ping_0700")).await;
    h.settle().await;
    let d = h.decision("ping_0700").await;
    assert_eq!(d["decider"], "fallback", "{case}: {d}");
    assert!(d["rationale"].as_str().unwrap().contains(why), "{case}: {} lacks {why:?}", d["rationale"]);
    assert!(!d["rationale"].as_str().unwrap().contains(RECORDED_API_KEY), "{case}: the key leaked");
    assert_eq!(h.svc.sends("hero", "481207/ping_0700/create_hero_task:fallback"), 1, "{case}");
    let hero: Vec<_> = h.svc.effects().into_iter().filter(|e| e.channel == "hero").collect();
    assert_eq!(hero.len(), 1, "{case}: {hero:?}");
    assert_eq!(hero[0].payload["urgency"], "urgent", "{case}");
    assert_eq!(h.svc.effects().iter().filter(|e| e.channel == "sms").count(), 0, "{case}");
    assert!(h.state().await.asks.is_empty(), "{case}");
    if let Some(llm) = llm {
        assert_eq!(llm.requests_for("ping_0700"), 1, "{case}");
        assert_eq!(llm.problems(), Vec::<String>::new(), "{case}");
    }
}

async fn every_bad_answer_is_the_fallback_decision(pg: bool) {
    for case in bad_answers() {
        let (h, llm) = llm_harness(fresh(pg).await, &answers(&case.answer)).await;
        expect_fallback(&h, Some(&llm), case.name, case.why).await;
    }
    // Nobody listening: a connection error.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let decider = LlmDecider::new(
        LlmSettings {
            base_url: format!("http://{addr}/v1"),
            model: MODEL.into(),
            api_key: RECORDED_API_KEY.into(),
            timeout: Duration::from_secs(2),
        },
        Policies::default(),
    )
    .unwrap();
    let h = harness(fresh(pg).await, Config::default(), Faults::default(), Some(Arc::new(decider))).await;
    // load:init also falls back here; only the ping's decision is checked.
    h.publish(init()).await;
    h.settle().await;
    h.publish(ping("ping_0700")).await;
    h.settle().await;
    let d = h.decision("ping_0700").await;
    assert_eq!(d["decider"], "fallback", "{d}");
    assert!(d["rationale"].as_str().unwrap().contains("could not be reached"), "{d}");
}

fn repo(path: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_llm_eval_library_passes_and_a_missing_answer_fails_its_scenario() {
    use haul_harness::eval::{EvalDecider, EvalOptions, EvalStore, run_paths_with};
    let opts = |decider| EvalOptions { decider, ..EvalOptions::default() };
    let answers = Answers::from_file(&repo("evals-llm/answers.toml")).unwrap();
    let scenarios = [repo("evals-llm/scenarios")];
    let report =
        run_paths_with(&scenarios, &EvalStore::SqliteMemory, &opts(EvalDecider::Llm(answers.clone())), |_| {}).await;
    let lines: Vec<String> = report.scenarios.iter().map(|s| s.line()).collect();
    assert!(report.failed == 0 && report.passed >= 6, "{lines:#?}");
    // Without the answer to the driver's SMS, the request has no answer: the scenario
    // fails naming it, rather than passing on a fallback.
    let mut partial = answers;
    partial.answers.retain(|a| a.event != "sms_race");
    let one = [repo("evals-llm/scenarios/llm_filtered_events_make_no_call.toml")];
    let report = run_paths_with(&one, &EvalStore::SqliteMemory, &opts(EvalDecider::Llm(partial)), |_| {}).await;
    let f = report.scenarios[0].failure.clone().expect("must fail");
    assert_eq!(f.key, "llm", "{f:?}");
    assert!(f.message.contains("no recorded answer for load llm_filtered event sms_race"), "{f:?}");
}

/// A model endpoint that echoes the request's key and a phone number in its error
/// answer: the error (quoted in the fallback rationale and the log) has neither.
#[tokio::test]
async fn model_errors_quote_an_echoing_endpoint_without_the_key_or_phone_numbers() {
    use axum::http::{HeaderMap, StatusCode};
    const KEY: &str = "sk-secret-0123456789";
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(|headers: HeaderMap| async move {
            let auth = headers["authorization"].to_str().unwrap().to_owned();
            (StatusCode::BAD_REQUEST, format!("bad request from {auth} about driver +15555550100"))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let decider = LlmDecider::new(
        LlmSettings {
            base_url: format!("http://{addr}/v1"),
            model: MODEL.into(),
            api_key: KEY.into(),
            timeout: Duration::from_secs(5),
        },
        Policies::default(),
    )
    .unwrap();
    let load = haul_core::ids::LoadId::parse(LOAD).unwrap();
    let event = haul_core::InboundEvent::from_json(load.clone(), init()).unwrap();
    let err = decider.ask(&load, &Default::default(), &event, t0()).await.unwrap_err().to_string();
    assert!(err.contains("400"), "{err}");
    assert!(!err.contains(KEY) && !err.contains(DRIVER), "{err}");
    assert!(err.contains("Bearer ***") && err.contains("***0100"), "{err}");
}

/// Answers with the tokens they took: the init 100 in and 10 out, the ping 200 and 20;
/// the SMS answers would be the model's, if it were asked.
fn metered_answers() -> String {
    format!(
        r#"model = "{MODEL}"
timeout = "1s"

[[answer]]
event = "load:init"
content = "A new load: nothing to do yet."
tool_call = [{{ name = "no_action", arguments = {{ reason = "load created" }} }}]
usage = {{ prompt_tokens = 100, completion_tokens = 10 }}

[[answer]]
event = "ping_0700"
content = "Nothing to do."
tool_call = [{{ name = "no_action", arguments = {{ reason = "low risk" }} }}]
usage = {{ prompt_tokens = 200, completion_tokens = 20 }}

[[answer]]
event = "sms_*"
content = "Nothing to do."
tool_call = [{{ name = "no_action", arguments = {{ reason = "chatter" }} }}]
"#
    )
}

/// The metered answers through a priced model (2 and 8 USD per million tokens) under
/// `budget`, the SOP standing in past it.
async fn budgeted_harness(store: Arc<dyn Store>, budget: &str) -> (H, RecordedLlm) {
    let answers = Answers::parse(&metered_answers()).unwrap();
    let timeout = answers.timeout;
    let server = RecordedLlm::start(answers, RECORDED_API_KEY).await.unwrap();
    let mut config = Config::from_toml(&format!(
        "[decider.llm]\nmodel = \"{MODEL}\"\nbase_url = \"{}\"\n[decider.llm.budget]\n{budget}\n\
         [decider.llm.prices.{MODEL}]\ninput_usd_per_mtok = 2.0\noutput_usd_per_mtok = 8.0\n",
        server.base_url()
    ))
    .unwrap();
    config.decider.llm.timeout = timeout;
    let settings =
        LlmSettings { base_url: server.base_url(), model: MODEL.into(), api_key: RECORDED_API_KEY.into(), timeout };
    let price = config.decider.llm.price(&config.clients).unwrap();
    let model = LlmDecider::new(settings, Policies::default()).unwrap().priced(price);
    let budgets = config.decider.llm.budgets(&config.clients).unwrap();
    let decider = Budgeted::new(Arc::new(model), SopDecider { policies: Policies::default() }, budgets, store.clone());
    let h = harness(store, config, Faults::default(), Some(Arc::new(decider))).await;
    (h, server)
}

async fn what_each_call_cost_is_recorded_and_a_spent_load_budget_hands_over_to_the_sop(store: Arc<dyn Store>) {
    let (h, llm) = budgeted_harness(store, "load_tokens = 300").await;
    h.publish(init()).await;
    h.publish(ping("ping_0700")).await;
    h.settle().await;
    let d = h.decision("load:init").await;
    let usage = &d["llm"];
    assert_eq!(
        (&usage["model"], &usage["input_tokens"], &usage["output_tokens"], &usage["cost_micro_usd"]),
        (&json!(MODEL), &json!(100), &json!(10), &json!(100 * 2 + 10 * 8)),
        "{d}"
    );
    assert_eq!((&usage["client"], &usage["finish_reason"]), (&json!("client_a"), &json!("tool_calls")));
    // The prompts are stored once by hash, and the hash is the text's.
    let system: String =
        serde_json::to_string(haul_core::tools::SYSTEM_PROMPT).unwrap().chars().skip(1).take(40).collect();
    for (key, holds) in [("prompt_hash", system.as_str()), ("input_hash", "load:init")] {
        let hash = usage[key].as_str().unwrap();
        let text = h.store.prompt(hash).await.unwrap().unwrap_or_else(|| panic!("no prompt {key} {hash}"));
        assert_eq!(haul_runtime::llm::sha256_hex(&text), hash, "{key}");
        assert!(text.contains(holds), "{key}: {text:.200}");
    }
    let ping_usage = &h.decision("ping_0700").await["llm"];
    assert_eq!(ping_usage["prompt_hash"], usage["prompt_hash"], "one fixed prompt");
    assert_ne!(ping_usage["input_hash"], usage["input_hash"]);
    // 330 tokens spent of 300: the SOP decides the SMS, and says why.
    h.publish(sms("sms_1", DRIVER, "all good")).await;
    h.publish(sms("sms_2", DRIVER, "still good")).await;
    h.settle().await;
    let d = h.decision("sms_1").await;
    assert_eq!(d["decider"], "sop", "{d}");
    assert_eq!(d["budget"], json!({"scope": "load", "unit": "tokens", "limit": 300, "spent": 330, "first": true}));
    let why = d["rationale"].as_str().unwrap();
    assert!(why.starts_with("the load's lifetime LLM budget is spent: 330 of 300 tokens; the SOP decided"), "{why}");
    assert!(d.get("llm").is_none(), "{d}");
    assert_eq!(h.decision("sms_2").await["budget"]["first"], false, "the alert is raised once per load");
    let events: Vec<String> = llm.requests().into_iter().map(|r| r.event).collect();
    assert_eq!(events, ["load:init", "ping_0700"], "no call past the budget");
    let spend = h.state().await.spend;
    assert_eq!((spend.spend.input_tokens, spend.spend.output_tokens, spend.spend.cost_micro_usd), (300, 30, 840));
    assert_eq!((spend.spend.calls, spend.capped), (2, true));
    let day = h.store.client_day_spend("client_a", "2026-03-02").await.unwrap();
    assert_eq!((day.spend.tokens(), day.spend.cost_micro_usd, day.spend.calls, day.capped_at), (330, 840, 2, None));
    assert_eq!(llm.problems(), Vec::<String>::new());
}

async fn a_spent_client_day_budget_hands_over_to_the_sop_and_alerts_once(store: Arc<dyn Store>) {
    // 840 micro-dollars spent after two calls; the budget is 800.
    let (h, llm) = budgeted_harness(store, "client_usd_per_day = \"0.0008\"").await;
    h.publish(init()).await;
    h.publish(ping("ping_0700")).await;
    h.publish(sms("sms_1", DRIVER, "all good")).await;
    h.publish(sms("sms_2", DRIVER, "still good")).await;
    h.settle().await;
    let d = h.decision("sms_1").await;
    assert_eq!(d["decider"], "sop", "{d}");
    assert_eq!(
        d["budget"],
        json!({"scope": "client_day", "client": "client_a", "unit": "micro_usd", "limit": 800, "spent": 840, "first": true})
    );
    assert!(
        d["rationale"]
            .as_str()
            .unwrap()
            .starts_with("client client_a's LLM budget for the day is spent: $0.000840 of $0.000800")
    );
    assert_eq!(h.decision("sms_2").await["budget"]["first"], false, "one alert per client and day");
    let day = h.store.client_day_spend("client_a", "2026-03-02").await.unwrap();
    assert_eq!((day.spend.cost_micro_usd, day.spend.calls), (840, 2));
    assert!(day.capped_at.is_some());
    assert_eq!(llm.requests().len(), 2);
    assert!(!h.state().await.spend.capped, "the load's own budget is not what stopped it");
}
