//! `haul operator …`: the operator actions from a shell, on the store (and load queue)
//! of the settings, through `haul_runtime::operator` as the `/v1/operator` routes go.
//! A refusal prints its code and message (the API's error body with `--json`) and
//! exits 1; nothing was published then.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use haul_backends as store;
use haul_config::QueueKind;
use haul_core::action::ActionType;
use haul_core::ids::{AskId, LoadId};
use haul_core::{Clock, Timestamp};
use haul_runtime::clock::SystemClock;
use haul_runtime::operator::{self, BulkAnswer, DeadFilter, OperatorError, Queued, Requester};
use haul_runtime::queue::EventQueue;
use haul_runtime::rates;
use haul_store::{LoadQueue, Store};
use serde_json::json;

use crate::cli::{ConfigArgs, OperatorCommand, Requester as RequesterArgs};
use crate::shared::{load_config, say};

pub async fn run(cmd: OperatorCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        OperatorCommand::Requeue { outbox_id, who, settings, json } => {
            let (store, queue) = open(&settings).await?;
            let (who, wait) = requester(who);
            let q = operator::requeue(store.as_ref(), &queue, &who, &outbox_id, SystemClock.now()).await;
            queued(store.as_ref(), q, json, &format!("requeue of {outbox_id}"), wait).await
        }
        OperatorCommand::AssignSms { message_sid, load, who, settings, json } => {
            let load = LoadId::parse(&load).map_err(|e| anyhow::anyhow!("--load: {}", e.message))?;
            let (store, queue) = open(&settings).await?;
            let (who, wait) = requester(who);
            let q = operator::assign_sms(store.as_ref(), &queue, &who, &message_sid, &load, SystemClock.now()).await;
            queued(store.as_ref(), q, json, &format!("assignment of SMS {message_sid}"), wait).await
        }
        OperatorCommand::ReassignSms { message_sid, load, who, settings, json } => {
            let load = LoadId::parse(&load).map_err(|e| anyhow::anyhow!("--load: {}", e.message))?;
            let (store, queue) = open(&settings).await?;
            let (who, wait) = requester(who);
            let r = match operator::reassign_sms(store.as_ref(), &queue, &who, &message_sid, &load, SystemClock.now())
                .await
            {
                Ok(r) => r,
                Err(e) => return refused(e, json),
            };
            if json {
                let (mut to, mut from) = (None, None);
                if !wait.is_zero() {
                    to = operator::decided(store.as_ref(), &r.to.load_id, r.to.event_id.as_str(), wait).await;
                    from = operator::decided(store.as_ref(), &r.from.load_id, r.from.event_id.as_str(), wait).await;
                }
                let mut answer = serde_json::to_value(&r)?;
                answer["decision"] = serde_json::to_value(&to)?;
                answer["from"]["decision"] = serde_json::to_value(&from)?;
                say(serde_json::to_string_pretty(&answer)?);
                return Ok(ExitCode::SUCCESS);
            }
            let what = format!("SMS {message_sid} taken back (load {} has it now)", r.to.load_id);
            queued(store.as_ref(), Ok(r.from), false, &what, wait).await?;
            queued(store.as_ref(), Ok(r.to), false, &format!("assignment of SMS {message_sid}"), wait).await
        }
        OperatorCommand::ResolveAsk { load_id, ask_id, who, settings, json } => {
            let load = LoadId::parse(&load_id).map_err(|e| anyhow::anyhow!("LOAD_ID: {}", e.message))?;
            let ask = AskId::parse(&ask_id).map_err(|e| anyhow::anyhow!("ASK_ID: {}", e.message))?;
            let (store, queue) = open(&settings).await?;
            let (who, wait) = requester(who);
            let q = operator::resolve_ask(store.as_ref(), &queue, &who, &load, &ask, SystemClock.now()).await;
            queued(store.as_ref(), q, json, &format!("resolution of {ask}"), wait).await
        }
        OperatorCommand::Dismiss { outbox_id, who, settings, json } => {
            let (store, queue) = open(&settings).await?;
            let (who, wait) = requester(who);
            let q = operator::dismiss(store.as_ref(), &queue, &who, &outbox_id, SystemClock.now()).await;
            queued(store.as_ref(), q, json, &format!("dismissal of {outbox_id}"), wait).await
        }
        OperatorCommand::DismissSms { message_sid, who, settings, json } => {
            let (store, _) = open(&settings).await?;
            let (who, _) = requester(who);
            match operator::dismiss_sms(store.as_ref(), &who, &message_sid, SystemClock.now()).await {
                Ok(d) if json => {
                    say(serde_json::to_string_pretty(&d)?);
                    Ok(ExitCode::SUCCESS)
                }
                Ok(d) if d.status == "dismissed" => {
                    say(format_args!("dismissed SMS {}: it goes to no load", d.message_sid));
                    Ok(ExitCode::SUCCESS)
                }
                Ok(d) => {
                    say(format_args!(
                        "nothing done: SMS {} was dismissed by {} at {} already",
                        d.message_sid, d.by, d.at
                    ));
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => refused(e, json),
            }
        }
        OperatorCommand::SetRate { channel, rate, burst, reset: _, who, settings, json } => {
            let (store, configured) = open_rates(&settings).await?;
            let (who, _) = requester(who);
            let request = rates::RateRequest { channel, rate, burst };
            match rates::change_rate(store.as_ref(), &configured, &who, &request, SystemClock.now()).await {
                Ok(c) if json => {
                    say(serde_json::to_string_pretty(&c)?);
                    Ok(ExitCode::SUCCESS)
                }
                Ok(c) => {
                    let now = c.effective.map_or("no limit".to_owned(), |l| limit_text(&l));
                    let before = c.previous.map_or("no limit".to_owned(), |l| limit_text(&l));
                    if c.status == "changed" {
                        say(format_args!(
                            "{}: {now} (was {before}); in force at every dispatcher within a second; {} held row(s) due again, to be held anew at it",
                            c.change.channel, c.held_requeued
                        ));
                    } else {
                        say(format_args!(
                            "duplicate: request {} was made at {} by {}; nothing new ({}: {now})",
                            c.change.request_id, c.change.changed_at, c.change.actor, c.change.channel
                        ));
                    }
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => refused(e, json),
            }
        }
        OperatorCommand::Rates { settings, json } => {
            let (store, configured) = open_rates(&settings).await?;
            let (channels, changes) = match rates::channel_rates(store.as_ref(), &configured).await {
                Ok(r) => r,
                Err(e) => return refused(e, json),
            };
            if json {
                say(serde_json::to_string_pretty(&json!({"channels": channels, "changes": changes}))?);
                return Ok(ExitCode::SUCCESS);
            }
            for c in &channels {
                let text = |l: &Option<haul_core::limit::Limit>| l.as_ref().map_or("no limit".to_owned(), limit_text);
                let source = match &c.changed {
                    Some(ch) => format!("set by {} at {}: {}", ch.actor, ch.changed_at, ch.reason),
                    None => "the settings'".to_owned(),
                };
                say(format_args!("{:<6} {:<18} {source}", c.channel, text(&c.effective)));
            }
            if !changes.is_empty() {
                say("latest changes:");
            }
            for ch in &changes {
                let l = ch.limit.as_ref().map_or("back to the settings".to_owned(), limit_text);
                say(format_args!(
                    "  {} {} {:<18} by {} ({}): {}",
                    ch.changed_at, ch.channel, l, ch.actor, ch.request_id, ch.reason
                ));
            }
            Ok(ExitCode::SUCCESS)
        }
        OperatorCommand::BulkRequeue { action_type, since, limit, dry_run, who, settings, json } => {
            let action_type = ActionType::parse(&action_type).with_context(|| {
                let all: Vec<&str> = ActionType::ALL.iter().map(|t| t.as_str()).collect();
                format!("--type {action_type:?} is not one of {}", all.join(", "))
            })?;
            let since: Timestamp =
                since.parse().map_err(|_| anyhow::anyhow!("--since {since:?} is not an RFC 3339 time"))?;
            let (store, queue) = open(&settings).await?;
            let (who, _) = requester(who);
            let filter = DeadFilter { action_type, since, limit };
            match operator::bulk_requeue(store.as_ref(), &queue, &who, &filter, dry_run, SystemClock.now()).await {
                Ok(a) => {
                    bulk(&a, json)?;
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => refused(e, json),
            }
        }
    }
}

fn requester(r: RequesterArgs) -> (Requester, Duration) {
    // An action by command starts a trace of its own.
    let trace = Some(haul_runtime::trace::root());
    (Requester { request_id: r.request_id, actor: r.actor, reason: r.reason, trace }, r.wait)
}

fn limit_text(l: &haul_core::limit::Limit) -> String {
    format!("{} (burst {})", l.rate, l.burst)
}

/// The store of the settings and the channels' limits the settings give.
async fn open_rates(
    settings: &ConfigArgs,
) -> anyhow::Result<(Arc<dyn Store>, haul_core::PerChannel<Option<haul_core::limit::Limit>>)> {
    let config = load_config(settings, None)?;
    let store = store::open(&config.store.url, None).await.context("store.url")?;
    let limits = haul_runtime::dispatcher::DispatcherSettings::default().with_limits(&config.channels).limits;
    Ok((store, limits))
}

/// The store of the settings and the load queue serve uses with it.
async fn open(settings: &ConfigArgs) -> anyhow::Result<(Arc<dyn Store>, EventQueue)> {
    let config = load_config(settings, None)?;
    let store = store::open(&config.store.url, None).await.context("store.url")?;
    let queue: Arc<dyn LoadQueue> = match config.queue.kind {
        QueueKind::Store => store.clone(),
        QueueKind::Sqs => store::open_sqs(&config.queue).await?,
    };
    Ok((store, EventQueue::new(queue)))
}

/// Says what became of an operator request: queued or a duplicate, then, within
/// `wait`, what the load decided on it (an action says what happened: a request the
/// load found nothing to do for says so, never "done").
async fn queued(
    store: &dyn Store,
    q: Result<Queued, OperatorError>,
    json: bool,
    what: &str,
    wait: Duration,
) -> anyhow::Result<ExitCode> {
    let q = match q {
        Ok(q) => q,
        Err(e) => return refused(e, json),
    };
    let decided =
        if wait.is_zero() { None } else { operator::decided(store, &q.load_id, q.event_id.as_str(), wait).await };
    if json {
        let mut answer = serde_json::to_value(&q)?;
        answer["decision"] = serde_json::to_value(&decided)?;
        say(serde_json::to_string_pretty(&answer)?);
        return Ok(ExitCode::SUCCESS);
    }
    if q.is_new() {
        say(format_args!("queued {} on load {}: the {what}", q.event_id, q.load_id));
    } else {
        say(format_args!("duplicate: {} was made before on load {}; nothing new", q.event_id, q.load_id));
    }
    match decided {
        Some(d) if d.actions.is_empty() && d.inbox.is_empty() => {
            say(format_args!("decided by {}: {} (nothing done)", d.decider, d.rationale))
        }
        Some(d) if d.actions.is_empty() => {
            say(format_args!("decided by {}: {}", d.decider, d.rationale));
            for c in &d.inbox {
                say(format_args!("  {} {}", c.state.as_str(), c.outbox_id));
            }
        }
        Some(d) => {
            say(format_args!("decided by {}: {}", d.decider, d.rationale));
            for a in &d.actions {
                say(format_args!("  -> {} {}", a.action_type(), a.key));
            }
        }
        None if wait.is_zero() => {}
        None => say(format_args!(
            "no decision within {}s (is a worker running?); `haul inspect {}` shows it when it comes",
            wait.as_secs(),
            q.load_id
        )),
    }
    Ok(ExitCode::SUCCESS)
}

fn bulk(a: &BulkAnswer, json: bool) -> anyhow::Result<()> {
    if json {
        say(serde_json::to_string_pretty(a)?);
        return Ok(());
    }
    for r in &a.rows {
        let failure = r.last_failure.as_deref().unwrap_or("-");
        let (status, outbox_id, dead_at, event_id) = (&r.status, &r.outbox_id, r.dead_at, &r.event_id);
        match &r.requeued_as {
            Some(key) => say(format_args!("{status:<16} {outbox_id}  died {dead_at}  as {key}  ({failure})")),
            None => say(format_args!("{status:<16} {outbox_id}  died {dead_at}  {event_id}  ({failure})")),
        }
    }
    // Only what goes out is counted: rows requeued already or refused are left out.
    let going = a.rows.iter().filter(|r| r.goes_out()).count();
    let left_out = match a.rows.len() - going {
        0 => String::new(),
        k => format!("; {k} left out (requeued already or refused)"),
    };
    let more = if a.truncated { "; more match: run again with --since the last row's time" } else { "" };
    let what = if a.dry_run { "would be requeued (dry run)" } else { "requeued" };
    say(format_args!("{going} dead {} row(s) {what}{left_out}{more}", a.filter.action_type));
    Ok(())
}

fn refused(e: OperatorError, json: bool) -> anyhow::Result<ExitCode> {
    if json {
        say(json!({"error": {"code": e.code(), "message": e.to_string()}}));
    } else {
        eprintln!("refused ({}): {e}", e.code());
    }
    Ok(ExitCode::from(1))
}
