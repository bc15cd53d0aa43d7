//! `haul serve`: the ingestion API, the load workers, the dispatcher and the timer
//! pump, in one process or split by `--roles` across several against one database.
//!
//! Every role process serves `/metrics` and `/healthz` on its listen address; the
//! `api` role adds the `/v1` routes. On SIGTERM or SIGINT the loops stop taking work,
//! runs that have not appended give their message back, and the process exits within
//! ten seconds: nothing lost or half-done.

pub mod answers;
pub mod api;
pub mod console;
mod events;
pub mod http;
pub mod metrics;
mod operator;
pub mod state;
mod tokens;
pub mod twilio;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use haul_config::{Config, DeciderKind};
use haul_core::{Clock, QueueMode};
use haul_runtime::channels::Channels;
use haul_runtime::clock::SystemClock;
use haul_runtime::loops::{dispatcher_loop, pump_loop, worker_loop};
use haul_runtime::pipeline::{Parts, Pipeline};
use haul_store::{LoadQueue, Store};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{info, warn};

pub use crate::api::{OPENAPI_JSON, ROUTES, Route, router};
pub use crate::http::{ConnectionLimits, serve_http};
pub use crate::metrics::metrics_handle;
pub use crate::state::{ApiState, LOAD_VIEWS_AT_ONCE, MAX_BODY_BYTES, SMS_PER_MINUTE};

/// How long shutdown waits for in-flight work.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(8);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Roles {
    pub api: bool,
    pub worker: bool,
    pub dispatcher: bool,
    pub pump: bool,
}

impl Roles {
    pub const ALL: Roles = Roles { api: true, worker: true, dispatcher: true, pump: true };

    /// `api,worker,dispatcher,pump` (any subset, at least one).
    pub fn parse(s: &str) -> anyhow::Result<Roles> {
        let mut r = Roles { api: false, worker: false, dispatcher: false, pump: false };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "api" => r.api = true,
                "worker" => r.worker = true,
                "dispatcher" => r.dispatcher = true,
                "pump" => r.pump = true,
                other => bail!("--roles: unknown role {other:?} (api, worker, dispatcher, pump)"),
            }
        }
        if r == (Roles { api: false, worker: false, dispatcher: false, pump: false }) {
            bail!("--roles names no role");
        }
        Ok(r)
    }

    fn names(&self) -> String {
        [(self.api, "api"), (self.worker, "worker"), (self.dispatcher, "dispatcher"), (self.pump, "pump")]
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, n)| *n)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// What `serve` opens, when it needs it: the backends the settings name. The binary
/// opens them (`haul-backends`); `serve` knows none.
#[async_trait::async_trait]
pub trait Backends: Send + Sync {
    /// The store of `store.url`, its schema brought up to date.
    async fn store(&self) -> anyhow::Result<Arc<dyn Store>>;
    /// The load queue of `queue.*`: the store itself, or another (SQS FIFO).
    async fn queue(&self, store: &Arc<dyn Store>) -> anyhow::Result<(Arc<dyn LoadQueue>, QueueMode)>;
    /// Wake-ups across processes for a process that runs the worker and dispatcher
    /// roles as said (PostgreSQL's `LISTEN`/`NOTIFY`); `None` where processes poll.
    fn wake_bridge(
        &self,
        runs_worker: bool,
        runs_dispatcher: bool,
        wake_worker: Arc<tokio::sync::Notify>,
        wake_dispatcher: Arc<tokio::sync::Notify>,
    ) -> Option<tokio::task::JoinHandle<()>>;
    /// The store's address for logs, without credentials.
    fn describe(&self) -> String;
}

/// Runs the roles until `shutdown` resolves, then stops within ten seconds.
pub async fn serve(
    config: Config,
    roles: Roles,
    backends: &dyn Backends,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    // Checked with the settings; a token file is only made once the port is bound.
    let env_tokens = if roles.api { tokens::tokens_from_env()? } else { Some(vec![]) };
    let operator_tokens = if roles.api { tokens::operator_tokens_from_env()? } else { vec![] };
    // Span export (`OTEL_*`): a variable that does not read stops the start, naming it.
    let span_export = haul_otel::Settings::from_env(|name| std::env::var(name).ok())?;
    let store = backends.store().await.context("store.url")?;
    crate::metrics::zero_series();
    // Every secret this process was given, masked by its value in what a service echoes.
    let secrets = haul_runtime::secrets::configured(&config, tokens::file_token());
    let decider: Option<Arc<dyn haul_runtime::decider::Decider>> = match config.decider.kind {
        DeciderKind::Sop => None,
        DeciderKind::Llm => {
            let d = haul_runtime::llm::LlmDecider::from_config(&config.decider.llm, &config.clients)?.masking(&secrets);
            info!(base_url = %d.settings().base_url, model = %d.settings().model, "decider: llm");
            let budgets = config.decider.llm.budgets(&config.clients)?;
            let sop = haul_runtime::decider::SopDecider { policies: haul_config::policies(&config.clients) };
            let ledger: Arc<dyn haul_store::SpendLedger> = store.clone();
            Some(Arc::new(haul_runtime::budget::Budgeted::new(Arc::new(d), sop, budgets, ledger)))
        }
    };
    let (queue, queue_mode) = backends.queue(&store).await?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let channels = Channels::from_config(&config, store.clone(), &secrets)?;
    let modes: Vec<String> = channels.iter().map(|(n, c)| format!("{n}={}", c.mode())).collect();
    let pipeline = Pipeline::new(
        &config,
        Parts {
            store: store.clone(),
            queue: queue.clone(),
            queue_mode,
            channels,
            clock: clock.clone(),
            faults: Default::default(),
            seed: None,
        },
        decider,
    );
    // Shadow mode: a file that does not read stops the start, naming it.
    if let Some(shadow) = haul_runtime::shadow::from_config(&config, store.clone(), clock.clone())? {
        pipeline.worker.shadow_with(shadow);
    }
    let exporting = match &span_export {
        Some(settings) => Some(haul_otel::Exporting::start(settings, &roles.names())?),
        None => None,
    };
    let spans = exporting.as_ref().map(haul_otel::Exporting::spans).unwrap_or_default();
    pipeline.worker.export_spans(spans.clone());
    pipeline.dispatcher.export_spans(spans.clone());
    let open_files_limit = crate::http::raise_open_files_limit();
    let limits = ConnectionLimits::new(&config.server, open_files_limit);
    if limits.max_connections < config.server.max_connections {
        warn!(
            open_files_limit,
            max_connections = limits.max_connections,
            "server.max_connections is {}, more than the limit of open files leaves room for",
            config.server.max_connections
        );
    }
    let listener = tokio::net::TcpListener::bind(&config.server.listen).await.with_context(|| {
        format!(
            "cannot listen on {} (server.listen; --listen or HAUL_SERVER_LISTEN sets another address)",
            config.server.listen
        )
    })?;
    let tokens = match env_tokens {
        Some(tokens) => tokens,
        None => tokens::token_from_file()?,
    };
    let public_url = config.server.public_url.clone().unwrap_or_else(|| format!("http://{}", config.server.listen));
    let (wake_worker, wake_dispatcher) = pipeline.wakeups();
    let wake_bridge =
        backends.wake_bridge(roles.worker, roles.dispatcher, wake_worker.clone(), wake_dispatcher.clone());
    let mut state = ApiState::new(
        store.clone(),
        queue.clone(),
        clock.clone(),
        tokens,
        std::env::var("HAUL_TWILIO_AUTH_TOKEN").ok().filter(|t| !t.is_empty()),
        public_url,
    );
    state.wake_worker = Some(wake_worker.clone());
    if roles.worker {
        // What the API publishes to an idle load goes to this process's worker received.
        state.queue = state.queue.clone().handing_to(pipeline.worker.event_handoff());
    }
    state.operator_tokens = operator_tokens;
    let (stop_tx, stop_rx) = watch::channel(false);
    state.body_read_timeout = config.server.body_read_timeout;
    state.trusted_proxies = config.server.trusted_proxy_ranges();
    state.stopping = Some(stop_rx.clone());
    state.store_figures = roles.api;
    state.configured_limits = pipeline.dispatcher.settings().limits.clone();
    state.spans = spans;
    let state = Arc::new(state);
    let mut tasks = JoinSet::new();
    if roles.worker && roles.dispatcher {
        pipeline.hand_claims_over();
    }
    if roles.worker {
        tasks.spawn(worker_loop(
            pipeline.worker.clone(),
            config.worker.concurrency,
            wake_worker.clone(),
            stop_rx.clone(),
        ));
    }
    if roles.dispatcher {
        tasks.spawn(dispatcher_loop(pipeline.dispatcher.clone(), wake_dispatcher.clone(), stop_rx.clone()));
    }
    if roles.pump {
        tasks.spawn(pump_loop(pipeline.pump.clone(), config.timers.poll, 256, stop_rx.clone()));
    }
    let mut http_stop = stop_rx.clone();
    let app = router(state, roles.api);
    tasks.spawn(async move {
        let stopped = async move {
            let _ = http_stop.wait_for(|s| *s).await;
        };
        serve_http(listener, app, limits, stopped).await;
    });
    info!(
        listen = %config.server.listen,
        roles = %roles.names(),
        max_connections = limits.max_connections,
        store = %backends.describe(),
        channels = %modes.join(" "),
        "haul is serving"
    );
    shutdown.await;
    info!("shutting down: no new work; runs not yet appended give their message back");
    pipeline.worker.stop();
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        warn!(
            "in-flight work did not finish within {}s; it was not appended and will be redelivered",
            SHUTDOWN_GRACE.as_secs()
        );
    }
    if let Some(b) = wake_bridge {
        b.abort();
    }
    if let Some(e) = exporting {
        // The spans still queued go out (within the exporter's own timeout).
        e.stop().await;
    }
    info!("stopped");
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
