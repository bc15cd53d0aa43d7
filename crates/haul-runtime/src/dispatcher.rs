//! The dispatcher: claims due outbox rows and applies them (ADR 0003).
//!
//! It calls the owning service with `Idempotency-Key = outbox id` (or applies
//! `set_timer`/`cancel_timer` to the TimerStore), then carries out what
//! `haul_core::dispatch` plans from the result: publish the `action_outcome`, mark,
//! retry, bury, raise an OpsAlert. It never writes a log: outcomes reach the log
//! through the load worker, the one writer per load. Several dispatchers may run at
//! once; claims and tokens keep them apart.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use haul_core::action::{Action, ActionType, Request};
use haul_core::consent;
use haul_core::dispatch::{self, Alert, Effect, IfFailed, Next, Plan, Row, Sent, Settled};
use haul_core::ids::LoadId;
use haul_core::limit::{self, Grant, Limit};
use haul_core::time::Timestamp;
use haul_core::trace::TraceParent;
use haul_core::{Channel, Clock, PerChannel, QueueMode, RetryPolicy, Urgency, retry};
use haul_store::{
    AlertState, Claim, ClaimCursor, ClaimError, ClaimTake, ClaimedTaking, LoadQueue, OutboxRow, Store, StoreError,
};
use tokio::task::JoinSet;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::channels::{
    Channels, DeliveryError, PermanentDeliveryError, RetryableDeliveryError, ThrottledDeliveryError,
};
use crate::faults::{Crash, FaultPoint, Faults, Observed};
use crate::queue::{EventQueue, body_of};
use crate::spans::{Kind, Span};

#[derive(Clone, Debug)]
pub struct DispatcherSettings {
    /// Rows one claim takes at most.
    pub batch: usize,
    /// Sends `dispatcher_loop` keeps in flight at once (`run_once` sends one claim's rows).
    pub in_flight: usize,
    pub lease: Duration,
    pub retry: RetryPolicy,
    /// Send a batch's rows one after another instead of at once (seeded runs: evals
    /// and the simulator, whose runs must repeat exactly, log order included).
    pub sequential: bool,
    /// Seeds the retry jitter (evals, the simulator); `None` draws a seed from the OS.
    /// Each row's jitter is a function of the seed, its id and its attempt
    /// (`haul_core::retry::jitter`), never of the order its batch's sends ended in.
    pub jitter_seed: Option<u64>,
    /// Each channel's send limit (`channels.*.rate`, `burst`), shared with every other
    /// dispatcher through the store: a claimed row past it is held back, not sent. An
    /// operator's change in the store overrides it (`crate::rates`).
    pub limits: PerChannel<Option<Limit>>,
    /// Each channel's cap on sends at the service at once (`channels.*.in_flight`),
    /// shared with every other dispatcher through the store (`SendRates::take_slots`).
    pub caps: PerChannel<Option<u32>>,
    /// Each client's weight (`clients.*.send_weight`): its share of a saturated
    /// channel against a client of weight 1, the default.
    pub weights: BTreeMap<String, u32>,
    /// Each client's own send limits (`clients.*.rates`), shared with every other
    /// dispatcher through the store, on top of its channels'.
    pub client_limits: BTreeMap<String, PerChannel<Option<Limit>>>,
}

impl DispatcherSettings {
    /// The settings `dispatcher.*` give: sends at once, jitter drawn from the OS.
    pub fn from_config(config: &haul_config::DispatcherConfig) -> Self {
        DispatcherSettings {
            batch: config.batch,
            in_flight: config.in_flight,
            lease: config.lease,
            retry: config.retry.policy(),
            sequential: false,
            jitter_seed: None,
            limits: PerChannel::from_fn(|_| None),
            caps: PerChannel::from_fn(|_| None),
            weights: BTreeMap::new(),
            client_limits: BTreeMap::new(),
        }
    }

    /// These settings with the clients' weights and own send limits of `clients`
    /// (checked at start).
    pub fn with_weights(self, clients: &BTreeMap<String, haul_config::ClientConfig>) -> Self {
        let weight = |c: &haul_config::ClientConfig| u32::try_from(c.send_weight?).ok();
        let weights = clients.iter().filter_map(|(name, c)| Some((name.clone(), weight(c)?))).collect();
        let client_limits = clients
            .iter()
            .map(|(name, c)| (name.clone(), PerChannel::from_fn(|ch| c.limit(name, ch).ok().flatten())))
            .filter(|(_, limits)| Channel::ALL.into_iter().any(|ch| limits.get(ch).is_some()))
            .collect();
        DispatcherSettings { weights, client_limits, ..self }
    }

    /// These settings with the channels' send limits and caps on sends in flight of
    /// `channels` (checked at start).
    pub fn with_limits(self, channels: &haul_config::ChannelsConfig) -> Self {
        let limits = PerChannel::from_fn(|c| channels.get(c).limit(c.config_name()).ok().flatten());
        let caps = PerChannel::from_fn(|c| channels.get(c).in_flight_cap(c.config_name()).ok().flatten());
        DispatcherSettings { limits, caps, ..self }
    }
}

impl Default for DispatcherSettings {
    fn default() -> Self {
        // The settings' defaults (`haul_config::DispatcherConfig`) are the one source.
        DispatcherSettings::from_config(&haul_config::DispatcherConfig::default())
    }
}

/// What a claim takes from the channels' rates in its own transaction: one take per
/// channel with a limit in force, keyed by the channel's name, and the channels in
/// the same order.
fn claim_takes(limits: &PerChannel<Option<Limit>>) -> (Vec<Channel>, Vec<ClaimTake>) {
    Channel::ALL
        .into_iter()
        .filter_map(|channel| {
            let limit = (*limits.get(channel))?;
            let action_types = ActionType::of_channel(channel);
            Some((channel, ClaimTake { key: channel.config_name().to_owned(), action_types, limit }))
        })
        .unzip()
}

/// `claims` of the channels `picked` chooses, by channel; the others go to `rest`.
fn by_channel(claims: Vec<Claim>, rest: &mut Vec<Claim>, picked: impl Fn(Channel) -> bool) -> PerChannel<Vec<Claim>> {
    let mut picked_rows = PerChannel::from_fn(|_| Vec::new());
    for c in claims {
        match c.row.action_type.channel().filter(|ch| picked(*ch)) {
            Some(channel) => picked_rows.get_mut(channel).push(c),
            None => rest.push(c),
        }
    }
    picked_rows
}

/// True for an urgent Hero task: it goes first when its channel's rate binds.
fn is_urgent(row: &OutboxRow) -> bool {
    row.action.pointer("/params/urgency").and_then(|u| u.as_str()) == Some(Urgency::Urgent.as_str())
}

/// What one claim took: the rows to send now, and how many more it took from the
/// store and settled unsent (superseded) or held back instead. A claim that sends
/// nothing may still have moved rows on: it is not an empty one.
#[derive(Debug, Default)]
pub struct Claimed {
    pub claims: Vec<Claim>,
    pub superseded: usize,
    pub held: usize,
    /// SMS buried unsent: their phone opted out (the consent ledger).
    pub refused: usize,
}

impl Claimed {
    /// Every row the claim took from the store, sent or not.
    pub fn took(&self) -> usize {
        self.claims.len() + self.superseded + self.held + self.refused
    }
}

/// The rows a claim let go no further, to be held back by [`Dispatcher::hold`] once
/// the rows it let go are on their way. Rows not held stay claimed until their leases
/// lapse, then are claimed and held again: nothing is lost.
#[derive(Debug, Default)]
#[must_use = "held rows stay claimed until their leases lapse unless given to Dispatcher::hold"]
pub struct Holds {
    rated: Vec<Held>,
    by_client: Vec<ByClient>,
    capped: Vec<Capped>,
}

impl Holds {
    /// How many rows wait to be held.
    fn count(&self) -> usize {
        let rated: usize = self.rated.iter().map(|h| h.rows.len()).sum();
        let by_client: usize = self.by_client.iter().map(|h| h.rows.len()).sum();
        rated + by_client + self.capped.iter().map(|c| c.rows.len()).sum::<usize>()
    }
}

/// One client's rows of one channel past the client's own limit.
#[derive(Debug)]
struct ByClient {
    channel: Channel,
    limit: Limit,
    grant: Grant,
    rows: Vec<Claim>,
}

/// One channel's rows its cap on sends in flight left without a slot.
#[derive(Debug)]
struct Capped {
    channel: Channel,
    cap: u32,
    rows: Vec<Claim>,
}

/// One channel's rows past its grant.
#[derive(Debug)]
struct Held {
    channel: Channel,
    limit: Limit,
    grant: Grant,
    rows: Vec<Claim>,
    /// The rows' loads' clients, when the claim read them.
    clients: HashMap<LoadId, String>,
}

/// How one claimed row ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dispatched {
    Delivered,
    /// A failed attempt; the row is due again at `retry_at`.
    Retrying {
        retry_at: Timestamp,
    },
    /// Dead: permanent failure or attempts spent.
    Buried,
    /// The service answered 429 with `Retry-After`: held back until `until`, no
    /// attempt spent.
    Held {
        until: Timestamp,
    },
    /// Settled unsent when claimed: its ask moved on while it waited.
    Superseded,
    /// Another dispatcher owns the row: nothing changed.
    Stale,
    /// The store failed around the send; the lease lapses and the row is tried again.
    Unsettled(String),
    Crashed(Crash),
}

impl Dispatched {
    fn label(&self) -> &'static str {
        match self {
            Dispatched::Delivered => "delivered",
            Dispatched::Retrying { .. } => "retrying",
            Dispatched::Buried => "buried",
            Dispatched::Held { .. } => "held",
            Dispatched::Superseded => "superseded",
            Dispatched::Stale => "stale",
            Dispatched::Unsettled(_) => "unsettled",
            Dispatched::Crashed(_) => "crashed",
        }
    }
}

pub struct Dispatcher {
    store: Arc<dyn Store>,
    queue: EventQueue,
    channels: Channels,
    clock: Arc<dyn Clock>,
    settings: DispatcherSettings,
    faults: Faults,
    jitter_seed: u64,
    /// Woken after an outcome is published (in-process workers react at once).
    wake_worker: std::sync::OnceLock<Arc<tokio::sync::Notify>>,
    /// On the store's own queue a delivered outcome's publish and the row's mark go in
    /// one transaction (`Outbox::publish_and_mark_dispatched`); any other queue: two steps.
    queue_mode: QueueMode,
    /// The limits in force: the settings' with the operators' changes over them, and
    /// when the changes were last read (`crate::rates::REFRESH`).
    limits: std::sync::Mutex<(PerChannel<Option<Limit>>, Option<Timestamp>)>,
    /// Each capped channel's call time (µs), a moving average of its sends.
    call_times: std::sync::Mutex<PerChannel<Option<i64>>>,
    /// Where each send's CLIENT span goes (off unless set).
    spans: std::sync::OnceLock<crate::spans::Spans>,
    /// The rows this process's worker claimed with their append (`Handoff`), until the
    /// dispatcher's loop takes the receiver.
    handed: std::sync::Mutex<Option<tokio::sync::mpsc::Receiver<Claim>>>,
}

/// Rows handed over at most, waiting for the dispatcher's loop: a worker that finds no
/// room writes its rows unclaimed, for a claim to take.
const HANDED_MAX: usize = 1024;

/// How a worker hands the rows it claims with its append to the dispatcher of its own
/// process (`AppendWith::claim`): room in the dispatcher's channel is
/// reserved before the append, so a row claimed is a row handed over. Between the
/// decision and its send there is then no claim (a statement, a commit and a wake-up
/// on the way to every send). Rows claimed but never handed (the process died) wait
/// for their lease, as a claimed row does.
#[derive(Clone)]
pub struct Handoff {
    pub(crate) to: tokio::sync::mpsc::Sender<Claim>,
    pub(crate) lease: std::time::Duration,
    pub(crate) tokens: haul_store::backend::Tokens,
}

/// What `Dispatcher::spans` gives before `export_spans`.
static SPANS_OFF: crate::spans::Spans = crate::spans::Spans::OFF;

impl Dispatcher {
    pub fn new(
        store: Arc<dyn Store>,
        queue: Arc<dyn LoadQueue>,
        queue_mode: QueueMode,
        channels: Channels,
        clock: Arc<dyn Clock>,
        settings: DispatcherSettings,
        faults: Faults,
    ) -> Self {
        let jitter_seed = settings.jitter_seed.unwrap_or_else(|| fastrand::u64(..));
        for channel in Channel::ALL {
            if let Some(limit) = settings.limits.get(channel) {
                metrics::gauge!("haul_channel_rate_per_second", "channel" => channel.config_name())
                    .set(limit.rate.per_second());
            }
            if let Some(cap) = settings.caps.get(channel) {
                metrics::gauge!("haul_channel_in_flight_cap", "channel" => channel.config_name()).set(f64::from(*cap));
            }
        }
        Dispatcher {
            limits: std::sync::Mutex::new((settings.limits.clone(), None)),
            call_times: std::sync::Mutex::new(PerChannel::from_fn(|_| None)),
            queue_mode,
            store,
            queue: EventQueue::new(queue),
            channels,
            clock,
            settings,
            faults,
            jitter_seed,
            wake_worker: std::sync::OnceLock::new(),
            spans: std::sync::OnceLock::new(),
            handed: std::sync::Mutex::new(None),
        }
    }

    /// A handoff for this process's worker (`Worker::hand_claims_to`); the dispatcher's
    /// loop takes what it hands over. Only where that loop runs: `run_once` never does.
    pub fn handoff(&self) -> Handoff {
        let (to, from) = tokio::sync::mpsc::channel(HANDED_MAX);
        *self.handed.lock().unwrap_or_else(|e| e.into_inner()) = Some(from);
        Handoff { to, lease: self.settings.lease, tokens: haul_store::backend::Tokens::new(None) }
    }

    /// The receiver of the rows handed over, for the dispatcher's loop (once).
    pub fn take_handed(&self) -> Option<tokio::sync::mpsc::Receiver<Claim>> {
        self.handed.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Records each send attempt (a CLIENT span) in `spans`.
    pub fn export_spans(&self, spans: crate::spans::Spans) {
        let _ = self.spans.set(spans);
    }

    /// A send's CLIENT span: a child of the context its row was appended with.
    #[allow(clippy::too_many_arguments)]
    fn record_send(
        &self,
        context: Option<TraceParent>,
        of: Option<TraceParent>,
        channel: Channel,
        load: &LoadId,
        outbox_id: &str,
        attempt: u32,
        began: Timestamp,
        sent: &Result<String, DeliveryError>,
    ) {
        let Some(context) = context else { return };
        let end = self.clock.now();
        let result = match sent {
            Ok(_) => "delivered",
            Err(DeliveryError::Retryable(_)) => "retryable",
            Err(DeliveryError::Permanent(_)) => "permanent",
            Err(DeliveryError::Throttled(_)) => "throttled",
        };
        self.spans.get().unwrap_or(&SPANS_OFF).record(|| {
            let span =
                Span::new(format!("send {}", channel.config_name()), Kind::Client, context, of.as_ref(), began, end)
                    .attr("haul.channel", channel.config_name())
                    .attr("haul.load_id", load.as_str())
                    .attr("haul.outbox_id", outbox_id)
                    .attr("haul.attempt", attempt)
                    .attr("haul.result", result);
            match sent {
                Ok(_) => span,
                Err(e) => span.failed(result, e.to_string()),
            }
        });
    }

    /// Wakes `worker` whenever an outcome is published.
    pub fn wake_on_publish(&self, worker: Arc<tokio::sync::Notify>) {
        let _ = self.wake_worker.set(worker);
    }

    /// Claims one batch of due rows and dispatches them concurrently; first publishes
    /// the failed outcomes that an earlier burial could not.
    pub async fn run_once(self: &Arc<Self>) -> Result<Vec<Dispatched>, StoreError> {
        let mut out = self.sweep_dead().await?;
        let (claimed, holds) = match self.claim_holding_later(self.settings.batch, None).await? {
            Ok(claimed) => claimed,
            Err(crash) => return Ok(vec![Dispatched::Crashed(crash)]),
        };
        let Claimed { claims, superseded, refused, .. } = claimed;
        // Settled too: the row the later step was due in place of may be due now.
        out.extend(std::iter::repeat_n(Dispatched::Superseded, superseded));
        out.extend(std::iter::repeat_n(Dispatched::Buried, refused));
        if self.settings.sequential {
            // Seeded runs: the same store calls in the same order every time.
            self.hold(holds).await;
            for claim in claims {
                out.push(self.dispatch(claim).await);
            }
            return Ok(out);
        }
        let mut sends = JoinSet::new();
        for claim in claims {
            let d = self.clone();
            let span = Self::span(&claim);
            sends.spawn(async move { d.dispatch(claim).await }.instrument(span));
        }
        self.hold(holds).await;
        while let Some(r) = sends.join_next().await {
            match r {
                Ok(d) => out.push(d),
                Err(e) => error!(error = %e, "a dispatch panicked; its lease will lapse and the row be retried"),
            }
        }
        Ok(out)
    }

    pub fn settings(&self) -> &DispatcherSettings {
        &self.settings
    }

    /// Claims up to `max` due rows, only those past `after` when given (the inner
    /// error: a fault point stopped it there): the rows to send, and how many of the
    /// rows it took it settled unsent or held back instead of handing them out.
    pub async fn claim(&self, max: usize, after: Option<&ClaimCursor>) -> Result<Result<Claimed, Crash>, StoreError> {
        Ok(match self.claim_holding_later(max, after).await? {
            Ok((claimed, holds)) => {
                self.hold(holds).await;
                Ok(claimed)
            }
            Err(crash) => Err(crash),
        })
    }

    /// [`Dispatcher::claim`], but the rows a send limit held back are left to the
    /// caller to give to [`Dispatcher::hold`] once it has started the sends: their
    /// writes do not stand between the sends' permits and the service.
    pub async fn claim_holding_later(
        &self,
        max: usize,
        after: Option<&ClaimCursor>,
    ) -> Result<Result<(Claimed, Holds), Crash>, StoreError> {
        let limits = self.limits(self.clock.now()).await;
        // The clock after the limits' read (a store call once a second): the claim
        // takes its sends at this instant, which their sends should follow closely.
        let (now, lease) = (self.clock.now(), self.settings.lease);
        let (channels, takes) = claim_takes(&limits);
        let ClaimedTaking { claims, grants } = self.store.claim_taking(max, now, lease, after, &takes).await?;
        let mut taken = PerChannel::from_fn(|_| None);
        for (channel, grant) in channels.into_iter().zip(grants) {
            *taken.get_mut(channel) = grant;
        }
        if let Some(first) = claims.first()
            && let Err(crash) = self.faults.check(FaultPoint::AfterClaim, &first.row.id)
        {
            return Ok(Err(crash));
        }
        for c in &claims {
            self.faults.observe(Observed::Claimed { outbox_id: &c.row.id, token: &c.token });
        }
        self.claimed(claims, &limits, &taken, now).await
    }

    /// Rows claimed with their append and handed over (`Handoff`), as a claim's rows
    /// go on: overtaken ones dropped, opted-out ones refused, the send limits applied
    /// (their sends taken now: the claim took none). Held back as `claim_holding_later`'s.
    pub async fn take_handed_over(&self, claims: Vec<Claim>) -> Result<Result<(Claimed, Holds), Crash>, StoreError> {
        let now = self.clock.now();
        let limits = self.limits(now).await;
        metrics::counter!("haul_claims_handed_over_total").increment(claims.len() as u64);
        self.claimed(claims, &limits, &PerChannel::from_fn(|_| None), now).await
    }

    /// What becomes of claimed rows before their sends (`claim_holding_later`).
    async fn claimed(
        &self,
        claims: Vec<Claim>,
        limits: &PerChannel<Option<Limit>>,
        taken: &PerChannel<Option<(u32, Grant)>>,
        now: Timestamp,
    ) -> Result<Result<(Claimed, Holds), Crash>, StoreError> {
        let (claims, superseded) = self.drop_superseded(claims, limits, now).await;
        let (claims, refused) = match self.refuse_opted_out(claims).await {
            Ok(kept) => kept,
            Err(crash) => return Ok(Err(crash)),
        };
        let (claims, holds) = self.admit(claims, limits, taken).await?;
        Ok(Ok((Claimed { claims, superseded, held: holds.count(), refused }, holds)))
    }

    /// Readies the store's claim before the first rows go: a claim of no rows (it
    /// takes and changes nothing) opens and plans the claim's session. A cold session
    /// (on PostgreSQL some 20 to 40 ms for the connection and the first plans) made a
    /// burst's first sends reach the service later after their take than the sends
    /// after them, one send over the rate in the burst's first second. A store that
    /// cannot is only logged: the first claim then warms it.
    pub async fn warm_up(&self) {
        let limits = self.limits(self.clock.now()).await;
        let (_, takes) = claim_takes(&limits);
        let (now, lease) = (self.clock.now(), self.settings.lease);
        if let Err(e) = self.store.claim_taking(0, now, lease, None, &takes).await {
            debug!(error = %e, "warming the claim up failed");
        }
    }

    /// The limits in force at `now`: the operators' changes are read again when the
    /// last read is [`crate::rates::REFRESH`] old. A store that cannot say keeps the
    /// limits last read.
    pub async fn limits(&self, now: Timestamp) -> PerChannel<Option<Limit>> {
        let (limits, read_at) = self.limits.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if read_at.is_some_and(|at| now < haul_core::time::add(at, crate::rates::REFRESH)) {
            return limits;
        }
        let fresh = match self.store.current_rates().await {
            Ok(current) => crate::rates::effective(&self.settings.limits, &current),
            Err(e) => {
                warn!(error = %e, "reading the operators' send limits failed; the last ones read stay in force");
                limits.clone()
            }
        };
        for channel in Channel::ALL {
            let (was, is) = (limits.get(channel), fresh.get(channel));
            if was != is {
                let rate = is.map(|l| l.rate.to_string());
                info!(channel = channel.config_name(), rate, burst = is.map(|l| l.burst), "send limit in force");
                metrics::gauge!("haul_channel_rate_per_second", "channel" => channel.config_name())
                    .set(is.map_or(0.0, |l| l.rate.per_second()));
            }
        }
        *self.limits.lock().unwrap_or_else(|e| e.into_inner()) = (fresh.clone(), Some(now));
        fresh
    }

    /// The claims still to send: an ask's SMS that waited (held back or retried) is
    /// settled unsent when a later step of its ask was decided meanwhile
    /// (`Outbox::supersede`), before it takes a send from its channel's rate. One the
    /// store cannot check is left out, unsent: its lease lapses and it is claimed again.
    /// Answers the claims kept and how many were superseded.
    async fn drop_superseded(
        &self,
        claims: Vec<Claim>,
        limits: &PerChannel<Option<Limit>>,
        now: Timestamp,
    ) -> (Vec<Claim>, usize) {
        let (mut kept, mut superseded) = (Vec::with_capacity(claims.len()), 0);
        for c in claims {
            let row = &c.row;
            if !dispatch::may_be_superseded(row.action_type, row.created_at, row.due_at) {
                kept.push(c);
                continue;
            }
            let ask = row.action.get("ask_id").and_then(|a| a.as_str());
            let step = row.action.get("step").and_then(|s| s.as_u64()).and_then(|s| u32::try_from(s).ok());
            let (Some(ask), Some(step)) = (ask, step) else {
                kept.push(c);
                continue;
            };
            match self.store.supersede(&row.id, &c.token, ask, step, now).await {
                Ok(None) => kept.push(c),
                Ok(Some(s)) => {
                    superseded += 1;
                    let channel = row.action_type.channel().map_or("internal", Channel::config_name);
                    metrics::counter!("haul_sends_superseded_total", "channel" => channel).increment(1);
                    metrics::counter!("haul_dispatches_total", "result" => "superseded").increment(1);
                    info!(load_id = %row.load_id, outbox_id = %row.id, by = s.by, "not sent: its ask moved on while it waited");
                    let limit = row.action_type.channel().and_then(|ch| *limits.get(ch));
                    if let (Some(limit), Some(was_due)) = (limit, s.by_was_due) {
                        self.give_back(row, &limit, was_due).await;
                    }
                }
                Err(e) => {
                    warn!(outbox_id = %row.id, error = %e, "checking whether its ask moved on failed; left for its lease to lapse")
                }
            }
        }
        (kept, superseded)
    }

    /// The claims still to send: an SMS to a phone the consent ledger has opted out (a
    /// STOP that reached another load of the driver's, or none) is buried unsent with
    /// `consent::LEDGER_REFUSAL`, so its load learns the opt-out from the failed outcome
    /// as it would from Twilio's 21610. One read of the ledger per claim with SMS in
    /// it; a ledger that cannot be read sends none of them (consent is not guessed):
    /// their leases lapse and they are claimed again. Answers the claims kept and how
    /// many were refused.
    async fn refuse_opted_out(&self, claims: Vec<Claim>) -> Result<(Vec<Claim>, usize), Crash> {
        let mut phones: Vec<String> = claims.iter().filter_map(|c| sms_to(&c.row)).map(str::to_owned).collect();
        if phones.is_empty() {
            return Ok((claims, 0));
        }
        phones.sort_unstable();
        phones.dedup();
        let opted_out = match self.store.opted_out_among(&phones).await {
            Ok(opted_out) => opted_out,
            Err(e) => {
                warn!(error = %e, "reading the consent ledger failed; the claimed SMS are left for their leases to lapse");
                return Ok((claims.into_iter().filter(|c| sms_to(&c.row).is_none()).collect(), 0));
            }
        };
        let (mut kept, mut refused) = (Vec::with_capacity(claims.len()), 0);
        for c in claims {
            let Some(consent) = sms_to(&c.row).and_then(|to| opted_out.iter().find(|o| o.phone == to)) else {
                kept.push(c);
                continue;
            };
            let why = consent::ledger_refusal(&consent.event_id, consent.changed_at);
            info!(load_id = %c.row.load_id, outbox_id = %c.row.id, stop = %consent.event_id, "not sent: the phone opted out of SMS");
            let facts = c.row.facts();
            let next = dispatch::after_send(&facts, Sent::Permanent(why), self.mode(), self.clock.now());
            match self.settle(&facts, &c.token, next).await? {
                Dispatched::Buried => refused += 1,
                other => {
                    debug!(outbox_id = %c.row.id, outcome = other.label(), "refused SMS not settled; its lease lapses")
                }
            }
        }
        Ok((kept, refused))
    }

    /// A send the service refused because the phone opted out (Twilio's 21610) opts
    /// the phone out in the consent ledger too, so the driver's other loads text it no
    /// more. Best effort: the row's own load learns it from the failed outcome anyway.
    async fn keep_opt_out(&self, row: &OutboxRow, why: &str) {
        let Some(phone) = sms_to(row) else { return };
        if !consent::refused_as_opted_out(why) {
            return;
        }
        let opt_out = haul_store::SmsConsent {
            phone: phone.to_owned(),
            opted_out: true,
            event_id: haul_core::ids::action_outcome_event_id(&row.id, haul_core::OutcomeStatus::Failed).to_string(),
            load_id: Some(row.load_id.clone()),
            changed_at: self.clock.now(),
        };
        match self.store.record_consent(&opt_out).await {
            Ok(()) => {
                info!(load_id = %row.load_id, outbox_id = %row.id, "the SMS service says the phone opted out: kept in the consent ledger")
            }
            Err(e) => {
                warn!(outbox_id = %row.id, error = %e, "keeping an opt-out in the consent ledger failed; the load still learns it")
            }
        }
    }

    /// The clients of the claims' loads; a store that cannot say has them all queue as
    /// loads with no client (fair to none, lost by none).
    async fn clients(&self, claims: &[Claim]) -> HashMap<LoadId, String> {
        let loads: Vec<LoadId> = claims.iter().map(|c| c.row.load_id.clone()).collect();
        match self.store.clients_of(&loads).await {
            Ok(clients) => clients.into_iter().collect(),
            Err(e) => {
                warn!(error = %e, "reading the held rows' clients failed; they queue as one");
                HashMap::new()
            }
        }
    }

    /// Orders `rows` (urgent first already) for a grant that cannot cover them: among
    /// routine rows, the client whose queue reaches least far ahead goes first (its
    /// backlog in time, which a weight already shortens), claim order within a client.
    /// So a client with a few asks is not kept waiting behind one with thousands whose
    /// rows come due at every interval: it wins those instants, and the big client's
    /// row it beat joins the end of its own queue. A store that cannot say keeps claim
    /// order.
    async fn fair_order(
        &self,
        channel: Channel,
        rows: &mut [Claim],
        clients: &HashMap<LoadId, String>,
        now: Timestamp,
    ) {
        let client_of = |c: &Claim| clients.get(&c.row.load_id).map(String::as_str);
        let mut keys: Vec<String> =
            rows.iter().map(|c| limit::queue_key(channel.config_name(), client_of(c))).collect();
        keys.sort();
        keys.dedup();
        if keys.len() < 2 {
            return;
        }
        let tails: HashMap<String, i64> = match self.store.queue_tails(&keys).await {
            Ok(tails) => tails.into_iter().collect(),
            Err(e) => return warn!(error = %e, "reading the clients' queues failed; claim order stands"),
        };
        let now_us = haul_core::time::to_us(now);
        rows.sort_by_cached_key(|c| {
            let tail = tails.get(&limit::queue_key(channel.config_name(), client_of(c))).copied();
            (!is_urgent(&c.row), limit::backlog_us(tail, now_us))
        });
    }

    /// The later row that took `row`'s place was queued on its client's queue at
    /// `was_due`: gives that slot back if it is the queue's last, so the client's next
    /// held row does not wait a spacing more for a slot no row uses. A slot further in
    /// (other rows queued behind it) stays: they keep their places.
    async fn give_back(&self, row: &OutboxRow, limit: &Limit, was_due: Timestamp) {
        let Some(channel) = row.action_type.channel() else { return };
        let client = match self.store.clients_of(std::slice::from_ref(&row.load_id)).await {
            Ok(mut clients) => clients.pop().map(|(_, c)| c),
            Err(e) => {
                return warn!(load_id = %row.load_id, error = %e, "reading a load's client failed; its slot stays");
            }
        };
        let key = limit::queue_key(channel.config_name(), client.as_deref());
        let (slot_us, spacing_us) = (haul_core::time::to_us(was_due), self.spacing_us(limit, client.as_deref()));
        if let Err(e) = self.store.unqueue_send(&key, slot_us, spacing_us).await {
            warn!(key, error = %e, "giving a queue's slot back failed; it stays");
        }
    }

    /// The claims the channels' send limits let go now, and the rest, to be held back
    /// ([`Dispatcher::hold`]): due again when their channel's rate allows them, with no
    /// attempt spent. Within a channel urgent Hero tasks go first, then claim order (by
    /// client when the grant is short, `Dispatcher::fair_order`). The take of a row that
    /// waited is this claim's last store call before its rows go, so the service meets
    /// the sends spaced as the rate granted them; the writes that hold the others come
    /// after.
    async fn admit(
        &self,
        claims: Vec<Claim>,
        limits: &PerChannel<Option<Limit>>,
        taken: &PerChannel<Option<(u32, Grant)>>,
    ) -> Result<(Vec<Claim>, Holds), StoreError> {
        let (mut admitted, mut holds) = (Vec::with_capacity(claims.len()), Holds::default());
        let mut limited = by_channel(claims, &mut admitted, |ch| limits.get(ch).is_some());
        for channel in Channel::ALL {
            let Some(limit) = *limits.get(channel) else { continue };
            let mut rows = std::mem::take(limited.get_mut(channel));
            if rows.is_empty() {
                continue;
            }
            rows.sort_by_key(|c| !is_urgent(&c.row));
            // The rows claimed as made took their sends with the claim; the others
            // (they waited, and were not overtaken meanwhile) take theirs now.
            let (counted, pretaken) = taken.get(channel).map_or((0, None), |(n, g)| (n, Some(g)));
            let more = (rows.len() as u32).saturating_sub(counted);
            // Who goes when the grant is short is decided by client, the shortest
            // queue first. Rows that take their sends now are put in that order before
            // the take (they are held back rows: the rate is most likely short), so
            // nothing stands between the take and their sends.
            let mut clients = None;
            if more > 0 && rows.len() > 1 {
                clients = Some(self.fair_clients(channel, &mut rows).await);
            }
            let grant = match (pretaken, more) {
                (Some(g), 0) => g,
                (pretaken, more) => {
                    let g = self.store.take_sends(channel.config_name(), &limit, more, self.clock.now()).await?;
                    limit::after_both(pretaken, g)
                }
            };
            let short = (grant.granted as usize) < rows.len();
            let clients = match clients {
                Some(clients) => clients,
                None if short => self.fair_clients(channel, &mut rows).await,
                None => HashMap::new(),
            };
            let held = rows.split_off((grant.granted as usize).min(rows.len()));
            // How long the rows let go waited for it: since they were made (a row held
            // back is due later, so `due_at` no longer says).
            let now = self.clock.now();
            let waited = metrics::histogram!("haul_send_wait_seconds", "channel" => channel.config_name());
            for c in &rows {
                waited.record(haul_core::time::since(now, c.row.created_at).as_secs_f64());
            }
            debug!(channel = channel.config_name(), held = held.len(), sent = rows.len(), "send rate");
            admitted.extend(rows);
            if held.is_empty() {
                // Nothing waits on the channel: no backlog.
                metrics::gauge!("haul_channel_held_backlog_seconds", "channel" => channel.config_name()).set(0.0);
            } else {
                holds.rated.push(Held { channel, limit, grant, rows: held, clients });
            }
        }
        let admitted = self.clients_allow(admitted, &mut holds).await?;
        let admitted = self.take_slots(admitted, &mut holds).await?;
        Ok((admitted, holds))
    }

    /// The claims their clients' own send limits let go (`clients.*.rates`: a take
    /// from `{channel}@{client}`, urgent Hero tasks first), the rest added to `holds`,
    /// due when the client's limit allows them. Rows of a client without a limit on
    /// their channel take none; a store that cannot say the loads' clients lets their
    /// rows go as loads with none.
    async fn clients_allow(&self, claims: Vec<Claim>, holds: &mut Holds) -> Result<Vec<Claim>, StoreError> {
        let limits = &self.settings.client_limits;
        let limited =
            |c: &Claim| c.row.action_type.channel().is_some_and(|ch| limits.values().any(|l| l.get(ch).is_some()));
        if !claims.iter().any(limited) {
            return Ok(claims);
        }
        let clients = self.clients(&claims).await;
        let mut groups: BTreeMap<(Channel, &str), (Limit, Vec<Claim>)> = BTreeMap::new();
        let mut admitted = Vec::with_capacity(claims.len());
        for c in claims {
            let own = c.row.action_type.channel().and_then(|ch| {
                let client = clients.get(&c.row.load_id)?;
                let limit = (*limits.get(client)?.get(ch))?;
                Some((ch, client.as_str(), limit))
            });
            match own {
                Some((channel, client, limit)) => groups.entry((channel, client)).or_insert((limit, vec![])).1.push(c),
                None => admitted.push(c),
            }
        }
        let now = self.clock.now();
        for ((channel, client), (limit, mut rows)) in groups {
            rows.sort_by_key(|c| !is_urgent(&c.row));
            let key = limit::client_rate_key(channel.config_name(), client);
            let grant = self.store.take_sends(&key, &limit, rows.len() as u32, now).await?;
            let held = rows.split_off((grant.granted as usize).min(rows.len()));
            admitted.extend(rows);
            if !held.is_empty() {
                debug!(channel = channel.config_name(), client, held = held.len(), "the client's own send limit");
                holds.by_client.push(ByClient { channel, limit, grant, rows: held });
            }
        }
        Ok(admitted)
    }

    /// The claims that got a slot of their channel's cap on sends in flight
    /// (`SendRates::take_slots`, urgent Hero tasks first), and the rest added to
    /// `holds`. Rows of a channel without a cap take none.
    async fn take_slots(&self, claims: Vec<Claim>, holds: &mut Holds) -> Result<Vec<Claim>, StoreError> {
        let caps = &self.settings.caps;
        if Channel::ALL.into_iter().all(|c| caps.get(c).is_none()) {
            return Ok(claims);
        }
        let mut admitted = Vec::with_capacity(claims.len());
        let mut capped = by_channel(claims, &mut admitted, |ch| caps.get(ch).is_some());
        let now = self.clock.now();
        let until = haul_core::time::add(now, self.settings.lease);
        for channel in Channel::ALL {
            let (Some(cap), mut rows) = (*caps.get(channel), std::mem::take(capped.get_mut(channel))) else { continue };
            if rows.is_empty() {
                continue;
            }
            rows.sort_by_key(|c| !is_urgent(&c.row));
            let sends: Vec<(String, String)> = rows.iter().map(|c| (c.row.id.clone(), c.token.clone())).collect();
            let granted = self.store.take_slots(channel.config_name(), cap, &sends, until, now).await?;
            let (got, waits): (Vec<Claim>, Vec<Claim>) = rows.into_iter().partition(|c| granted.contains(&c.row.id));
            admitted.extend(got);
            if !waits.is_empty() {
                debug!(channel = channel.config_name(), cap, held = waits.len(), "sends in flight at the cap");
                holds.capped.push(Capped { channel, cap, rows: waits });
            }
        }
        Ok(admitted)
    }

    /// The clients of `rows`' loads, and `rows` in the order a short grant serves them.
    async fn fair_clients(&self, channel: Channel, rows: &mut [Claim]) -> HashMap<LoadId, String> {
        let clients = self.clients(rows).await;
        self.fair_order(channel, rows, &clients, self.clock.now()).await;
        clients
    }

    /// Holds back the rows `admit` did not let go (`Outbox::hold_all`). Past a
    /// channel's rate, an urgent one waits for the channel's very next sends and a
    /// routine one joins its client's queue (`Dispatcher::queue`); past a client's own
    /// limit, it waits for the client's next sends; past a cap on sends in flight, see
    /// `Dispatcher::hold_capped`. A row the store could not hold is left for its lease
    /// to lapse, and is claimed and held again.
    pub async fn hold(&self, holds: Holds) {
        for Capped { channel, cap, rows } in holds.capped {
            self.hold_capped(channel, cap, rows).await;
        }
        for ByClient { channel, limit, grant, rows } in holds.by_client {
            // Due one interval of the client's limit apart, from its next send.
            let untils = limit::held_until_us(&grant, &limit, rows.len());
            let held: Vec<(Claim, i64)> = rows.into_iter().zip(untils).collect();
            self.hold_at(channel, &held).await;
        }
        for Held { channel, limit, grant, rows, clients } in holds.rated {
            let now = self.clock.now();
            let (urgent, routine): (Vec<Claim>, Vec<Claim>) = rows.into_iter().partition(|c| is_urgent(&c.row));
            let urgent_untils = limit::held_until_us(&grant, &limit, urgent.len());
            let mut held: Vec<(Claim, i64)> = urgent.into_iter().zip(urgent_untils).collect();
            held.extend(self.queue(channel, &limit, grant.next_at_us, routine, &clients).await);
            // How far ahead the last held row is due: the channel's backlog, in time.
            let last = held.iter().map(|(_, until)| *until).max();
            let backlog_us = limit::backlog_us(last, haul_core::time::to_us(now));
            metrics::gauge!("haul_channel_held_backlog_seconds", "channel" => channel.config_name())
                .set(Duration::from_micros(backlog_us as u64).as_secs_f64());
            self.hold_at(channel, &held).await;
        }
    }

    /// Holds back rows their channel's cap on sends in flight left without a slot, due
    /// again by the pace sends on the channel end at: `cap` sends end per call time
    /// (`haul_core::limit::call_time_us`), so routine rows are queued one call time / `cap`
    /// apart, behind the rows any dispatcher held before them (the channel's in-flight
    /// queue, kept in the store); an urgent one is due after one call time. A row that
    /// finds the channel still full then is held again, never lost.
    async fn hold_capped(&self, channel: Channel, cap: u32, rows: Vec<Claim>) {
        let now_us = haul_core::time::to_us(self.clock.now());
        let average_us = *self.call_times.lock().unwrap_or_else(|e| e.into_inner()).get(channel);
        let (from_us, spacing_us) = limit::in_flight_slots(now_us, limit::call_time_us(average_us), cap);
        let (urgent, routine): (Vec<Claim>, Vec<Claim>) = rows.into_iter().partition(|c| is_urgent(&c.row));
        let mut held: Vec<(Claim, i64)> = urgent.into_iter().map(|c| (c, from_us)).collect();
        if !routine.is_empty() {
            let key = limit::in_flight_queue_key(channel.config_name());
            let first = self.store.queue_sends(&key, from_us, spacing_us, routine.len() as u32).await;
            let first = first.unwrap_or_else(|e| {
                warn!(key, error = %e, "queueing rows past the cap on sends in flight failed; due after one call");
                from_us
            });
            held.extend(routine.into_iter().zip((0..).map(|i| first + i * spacing_us)));
        }
        self.hold_at(channel, &held).await;
    }

    /// Frees `claim`'s slot of its channel's cap on sends in flight, now its send ended
    /// (at the store's clock, so seeded runs repeat), and counts the time it took into
    /// the channel's call time.
    async fn free_slot(&self, claim: &Claim, started: Timestamp) {
        let Some(channel) = claim.row.action_type.channel().filter(|c| self.settings.caps.get(*c).is_some()) else {
            return;
        };
        let took_us = haul_core::time::to_us(self.clock.now()) - haul_core::time::to_us(started);
        {
            let mut times = self.call_times.lock().unwrap_or_else(|e| e.into_inner());
            let time = times.get_mut(channel);
            *time = Some(limit::call_time_after(*time, took_us));
        }
        let send = [(claim.row.id.clone(), claim.token.clone())];
        if let Err(e) = self.store.free_slots(channel.config_name(), &send).await {
            warn!(outbox_id = %claim.row.id, error = %e, "freeing a send's slot failed; it is freed when its lease lapses");
        }
    }

    /// Holds `held` (claims of `channel`, each with when it is due again, µs) back in
    /// the store: no attempt spent. One it could not hold stays claimed until its lease
    /// lapses, and is claimed and held again; the counter says what the store held.
    async fn hold_at(&self, channel: Channel, held: &[(Claim, i64)]) {
        let holds: Vec<(String, String, Timestamp)> = held
            .iter()
            .map(|(c, until)| (c.row.id.clone(), c.token.clone(), haul_core::time::from_us(*until)))
            .collect();
        let n = self.store.hold_all(&holds, self.clock.now()).await.unwrap_or_else(|e| {
            warn!(channel = channel.config_name(), rows = holds.len(), error = %e, "holding rows back failed");
            0
        });
        metrics::counter!("haul_sends_held_total", "channel" => channel.config_name()).increment(n as u64);
    }

    /// How far apart `client`'s held rows are queued under `limit`, by its weight (1
    /// for a client without one, and for loads with no client).
    fn spacing_us(&self, limit: &Limit, client: Option<&str>) -> i64 {
        let weight = client.and_then(|c| self.settings.weights.get(c)).copied().unwrap_or(1);
        limit::spacing_us(limit, weight)
    }

    /// When each held routine row of `channel` is due again: behind the rows of its own
    /// client held before it (`haul_core::limit::queued`, kept in the store so every
    /// dispatcher shares each queue), one spacing apart, from `from_us` (when the
    /// channel next sends) at the earliest. One client's burst so queues behind itself,
    /// not in front of another client's rows. A store that cannot say a load's client,
    /// or keep a queue, has its rows wait for the channel's next sends instead: late
    /// rows are held again, never lost.
    async fn queue(
        &self,
        channel: Channel,
        limit: &Limit,
        from_us: i64,
        rows: Vec<Claim>,
        clients: &HashMap<LoadId, String>,
    ) -> Vec<(Claim, i64)> {
        let mut queues: BTreeMap<Option<&str>, Vec<Claim>> = BTreeMap::new();
        for c in rows {
            queues.entry(clients.get(&c.row.load_id).map(String::as_str)).or_default().push(c);
        }
        let mut out = Vec::new();
        for (client, rows) in queues {
            let spacing = self.spacing_us(limit, client);
            let key = limit::queue_key(channel.config_name(), client);
            let first = match self.store.queue_sends(&key, from_us, spacing, rows.len() as u32).await {
                Ok(first) => first,
                Err(e) => {
                    warn!(key, error = %e, "queueing held rows failed; they wait for the channel's next sends");
                    from_us
                }
            };
            out.extend(rows.into_iter().zip((0..).map(|i| first + i * spacing)));
        }
        out
    }

    /// Dead rows whose failed outcome never reached the queue (it was down when they
    /// were buried), or whose OpsAlert did not reach the ops service: publish the
    /// outcome now, then raise the alert their class calls for. Each row on its own: one
    /// that still cannot be settled is put off in the store with its own backoff
    /// (`haul_core::dispatch::settle_retry_at`) and the next row is tried, so a row the
    /// queue or the ops service keeps failing never holds up the others.
    pub async fn sweep_dead(&self) -> Result<Vec<Dispatched>, StoreError> {
        let now = self.clock.now();
        let mut out = Vec::new();
        for u in self.store.unsettled_due(now, self.settings.batch).await? {
            let facts = u.row.facts();
            let mut failed = None;
            for step in dispatch::sweep(&facts, u.row.last_failure.as_deref()).steps {
                if let Err(e) = self.effect(&facts, NO_CLAIM, &step.effect).await {
                    failed = Some(e.why(&step.effect));
                    break;
                }
            }
            let Some(why) = failed else {
                out.push(Dispatched::Buried);
                continue;
            };
            let passes = u.settle_attempts.saturating_add(1);
            let jitter = retry::jitter(self.jitter_seed, &format!("settle:{}", u.row.id), passes);
            let retry_at = dispatch::settle_retry_at(passes, now, jitter);
            warn!(outbox_id = %u.row.id, passes, %retry_at, why, "a dead row could not be settled; tried again later");
            self.store.defer_settle(&u.row.id, &why, retry_at).await?;
            out.push(Dispatched::Retrying { retry_at });
        }
        Ok(out)
    }

    /// The span a claimed row's dispatch runs in, wherever it is spawned.
    pub fn span(claim: &Claim) -> tracing::Span {
        info_span!("dispatch", outbox_id = %claim.row.id, load_id = %claim.row.load_id, attempts = claim.row.attempts)
    }

    /// Sends one claimed row and settles it.
    pub async fn dispatch(&self, claim: Claim) -> Dispatched {
        let (started, began) = (std::time::Instant::now(), self.clock.now());
        let result = self.dispatch_inner(&claim).await.unwrap_or_else(Dispatched::Crashed);
        // A crash (a fault point) keeps its slot, as a dead dispatcher would, until
        // its lease lapses.
        if !matches!(result, Dispatched::Crashed(_)) {
            self.free_slot(&claim, began).await;
        }
        // One line per dispatch, its fields at the top level (what a log shipper indexes).
        let row = &claim.row;
        let (load_id, outbox_id, action_type) = (row.load_id.as_str(), row.id.as_str(), row.action_type.as_str());
        let (outcome, attempt, duration_ms) = (result.label(), row.attempts + 1, started.elapsed().as_millis() as u64);
        let trace_id = row.trace.map(|t| t.trace_id_hex());
        let trace_id = trace_id.as_deref();
        match &result {
            Dispatched::Stale => {
                info!(
                    load_id,
                    outbox_id,
                    action_type,
                    outcome,
                    attempt,
                    duration_ms,
                    trace_id,
                    "dispatch: another dispatcher owns the row; changed nothing"
                )
            }
            Dispatched::Unsettled(why) => {
                warn!(
                    load_id,
                    outbox_id,
                    action_type,
                    outcome,
                    attempt,
                    why,
                    duration_ms,
                    trace_id,
                    "dispatch left for the lease to lapse"
                )
            }
            Dispatched::Crashed(c) => {
                info!(load_id, outbox_id, action_type, outcome, attempt, %c, duration_ms, trace_id, "dispatch crashed at a fault point")
            }
            Dispatched::Held { until } => {
                info!(load_id, outbox_id, action_type, outcome, attempt, %until, duration_ms, trace_id, "dispatch: the service is over its rate (429); held back, no attempt spent")
            }

            _ => info!(load_id, outbox_id, action_type, outcome, attempt, duration_ms, trace_id, "dispatch"),
        }
        metrics::counter!("haul_dispatches_total", "result" => result.label()).increment(1);
        result
    }

    /// Checks the claim and sends; then runs the plan `haul_core::dispatch` makes of
    /// the result, and of any failed attempt on the way.
    async fn dispatch_inner(&self, claim: &Claim) -> Result<Dispatched, Crash> {
        let (row, token) = (&claim.row, claim.token.as_str());
        if self.faults.bugs.never_reclaim && row.attempts > 0 {
            return Ok(Dispatched::Unsettled("the planted never_reclaim bug gave the row up".into()));
        }
        let facts = row.facts();
        let mode = self.mode();
        // Read from the row's JSON in place: a copy of it per send (allocated, then
        // dropped) showed in a busy dispatcher's profile.
        let next = match <Action as serde::Deserialize>::deserialize(&row.action) {
            Err(e) => Next::Plan(dispatch::bury(&facts, format!("unreadable action: {e}"))),
            Ok(action) => {
                if dispatch::claim_needs_check(row.lease_until, self.clock.now(), self.settings.lease) {
                    match self.store.check_claim(&row.id, token, self.clock.now()).await {
                        Ok(()) => {}
                        Err(ClaimError::Stale(_)) => return Ok(Dispatched::Stale),
                        Err(ClaimError::Store(e)) => {
                            return Ok(Dispatched::Unsettled(format!("claim check failed: {e}")));
                        }
                    }
                }
                let sent = self.apply(row, &action).await;
                self.faults.check(FaultPoint::AfterSend, &row.id)?;
                if let Sent::Permanent(why) = &sent {
                    self.keep_opt_out(row, why).await;
                }
                dispatch::after_send(&facts, sent, mode, self.clock.now())
            }
        };
        self.settle(&facts, token, next).await
    }

    /// How an outcome's publish goes with its row's mark.
    fn mode(&self) -> QueueMode {
        // The planted bug publishes with the mark in two steps, in the wrong order.
        if self.faults.bugs.mark_before_publish { QueueMode::Separate } else { self.queue_mode }
    }

    /// Runs the plan `next` is, then the plans of any step that failed on the way,
    /// until the row is settled.
    async fn settle(&self, facts: &Row, token: &str, mut next: Next) -> Result<Dispatched, Crash> {
        // This attempt's draw, whatever the order the batch's sends ended in.
        let jitter = retry::jitter(self.jitter_seed, &facts.outbox_id, facts.attempts.saturating_add(1));
        let policy = &self.settings.retry;
        loop {
            let mut plan = match next {
                Next::Plan(plan) => plan,
                Next::AttemptFailed(why) => dispatch::after_failure(facts, &why, self.clock.now(), policy, jitter),
                Next::MarkFailed(why) => dispatch::after_mark_failure(facts, &why, self.clock.now(), policy, jitter),
            };
            if self.faults.bugs.mark_before_publish {
                mark_before_publish(&mut plan);
            }
            match self.execute(facts, token, plan).await? {
                Ran::Done(d) => return Ok(d),
                Ran::Again(n) => next = n,
            }
        }
    }

    /// Runs a plan's steps in order. A fault point is checked after each effect the
    /// plan goes on from: this is the one place the dispatcher can "die" between
    /// effects.
    async fn execute(&self, row: &Row, token: &str, plan: Plan) -> Result<Ran, Crash> {
        let mut left_to_sweep = false;
        for step in plan.steps {
            if left_to_sweep && step.if_failed == IfFailed::LeaveToSweep {
                continue;
            }
            match self.effect(row, token, &step.effect).await {
                Ok(()) => {}
                Err(EffectError::Stale) => return Ok(Ran::Done(Dispatched::Stale)),
                Err(e) => match step.if_failed {
                    IfFailed::FailAttempt => return Ok(Ran::Again(Next::AttemptFailed(e.why(&step.effect)))),
                    IfFailed::FailMark => return Ok(Ran::Again(Next::MarkFailed(e.why(&step.effect)))),
                    IfFailed::Stop => return Ok(Ran::Done(Dispatched::Unsettled(e.why(&step.effect)))),
                    IfFailed::LeaveToSweep => {
                        left_to_sweep = true;
                        match &step.effect {
                            Effect::Publish(_) => {
                                warn!(error = %e, "publishing the failed outcome failed; the sweep will retry it")
                            }
                            Effect::MarkOutcomePublished => {
                                warn!(error = %e, "recording the settled burial failed; the sweep repeats it (deduped)")
                            }
                            // Logged where it failed.
                            _ => {}
                        }
                    }
                },
            }
            if let Some(point) = fault_point_after(&step.effect) {
                self.faults.check(point, &row.outbox_id)?;
            }
        }
        Ok(Ran::Done(match plan.settled {
            Settled::Delivered => Dispatched::Delivered,
            Settled::Retrying { retry_at } => Dispatched::Retrying { retry_at },
            Settled::Held { until } => Dispatched::Held { until },
            Settled::Buried => Dispatched::Buried,
        }))
    }

    /// One effect. Marks need the claim's `token`.
    async fn effect(&self, row: &Row, token: &str, effect: &Effect) -> Result<(), EffectError> {
        let id = row.outbox_id.as_str();
        let now = self.clock.now();
        let marked = |r: Result<(), ClaimError>| {
            r.map_err(EffectError::from)?;
            self.faults.observe(Observed::Marked { outbox_id: id, token });
            Ok(())
        };
        match effect {
            Effect::Publish(event) => {
                self.queue.publish_traced(event, row.trace, now).await?;
                self.wake_worker();
                Ok(())
            }
            Effect::MarkDispatched { receipt } => marked(self.store.mark_dispatched(id, token, receipt, now).await),
            Effect::PublishAndMark { event, receipt } => {
                let (event_id, body) = (event.event_id.as_str(), body_of(event));
                let r = self
                    .store
                    .publish_and_mark_dispatched(id, token, receipt, &row.load_id, event_id, &body, row.trace, now)
                    .await;
                if matches!(r, Ok(_) | Err(ClaimError::Stale(_))) {
                    // Published, whatever the mark found.
                    self.wake_worker();
                }
                marked(r.map(|_| ()))
            }
            Effect::MarkRetry { retry_at, attempts, failure } => {
                info!(attempts, %retry_at, failure, "attempt failed; retrying");
                marked(self.store.mark_failed(id, token, failure, Some(*retry_at), now).await)
            }
            Effect::MarkDead { failure } => {
                marked(self.store.mark_failed(id, token, failure, None, now).await)?;
                let class = haul_store::ops::class_name(row.action_type.class());
                metrics::counter!("haul_outbox_dead_rows_total", "action_type" => row.action_type.as_str(), "class" => class)
                    .increment(1);
                warn!(why = failure, action_type = %row.action_type, "row buried");
                Ok(())
            }
            Effect::Hold { until, note } => {
                let channel = row.action_type.channel().map_or("internal", Channel::config_name);
                metrics::counter!("haul_sends_throttled_total", "channel" => channel).increment(1);
                marked(self.store.hold(id, token, *until, Some(note), now).await)
            }
            Effect::PauseChannel { until } => {
                let Some(channel) = row.action_type.channel() else { return Ok(()) };
                let Some(limit) = *self.limits(now).await.get(channel) else { return Ok(()) };
                // Best effort: the row is held already; another dispatcher meets the 429 itself.
                if let Err(e) = self.store.pause_sends(channel.config_name(), &limit, *until, now).await {
                    warn!(error = %e, channel = channel.config_name(), "holding the channel back after a 429 failed");
                }
                Ok(())
            }
            Effect::RaiseAlert(alert) => self.alert(alert, row.trace).await,
            Effect::MarkOutcomePublished => Ok(self.store.mark_outcome_published(id, now).await?),
        }
    }

    fn wake_worker(&self) {
        if let Some(w) = self.wake_worker.get() {
            w.notify_one();
        }
    }

    /// Applies an action: timers to the TimerStore, the rest to its channel service.
    async fn apply(&self, row: &OutboxRow, action: &Action) -> Sent {
        let now = self.clock.now();
        let sent = match action.kind.request(&row.load_id) {
            // The timer keeps the decision's context: its firing continues that trace.
            Request::ScheduleTimer { timer_id, fire_at } => self
                .store
                .schedule_traced(&timer_id, fire_at, row.trace, now)
                .await
                .map(|new| if new { "scheduled" } else { "already scheduled" })
                .map(str::to_owned)
                .map_err(|e| DeliveryError::from(RetryableDeliveryError(e.to_string()))),
            Request::CancelTimer { timer_id } => self
                .store
                .cancel(&timer_id, now)
                .await
                .map(|canceled| if canceled { "canceled" } else { "not scheduled" }.to_owned())
                .map_err(|e| DeliveryError::from(RetryableDeliveryError(e.to_string()))),
            Request::Send(call) => {
                let channel = self.channels.get(call.channel);
                let lease = self.settings.lease;
                // Each attempt is a span of its own in the decision's trace.
                let trace = row.trace.map(|t| crate::trace::child(&t));
                let (key, load, path, body) = (&row.id, &row.load_id, &call.path, &call.body);
                let sent = match dispatch::tried_since(row.attempts, row.first_attempt_at, row.lease_until, lease) {
                    None => channel.send(key, load, path, body, trace, now).await,
                    Some(since) => channel.resend(key, load, path, body, trace, now, since).await,
                };
                self.record_send(trace, row.trace, call.channel, load, key, row.attempts + 1, now, &sent);
                sent
            }
        };
        match sent {
            Ok(receipt) => Sent::Delivered { receipt },
            Err(DeliveryError::Retryable(RetryableDeliveryError(why))) => Sent::Retryable(why),
            Err(DeliveryError::Permanent(PermanentDeliveryError(why))) => Sent::Permanent(why),
            Err(DeliveryError::Throttled(ThrottledDeliveryError { why, retry_after })) => {
                Sent::Throttled { retry_after, why }
            }
        }
    }

    /// An OpsAlert: to the ops service (HTTP or record mode), the log, the store and
    /// the counters. Independent of the Hero tooling, so a Hero outage cannot loop.
    /// The store keeps each send's result: a delivered or refused alert is settled (a
    /// refusal, a 4xx, is not sent again: it would be refused again), and one that
    /// failed otherwise is an error, so the sweep tries it again after a backoff.
    async fn alert(&self, alert: &Alert, trace: Option<TraceParent>) -> Result<(), EffectError> {
        let kind = alert.kind.as_str();
        error!(
            alert = kind,
            outbox_id = %alert.outbox_id,
            load_id = %alert.load_id,
            action_type = %alert.action_type,
            failure = alert.failure,
            "OpsAlert"
        );
        let (call, key, now) = (alert.call(), alert.key(), self.clock.now());
        let context = trace.map(|t| crate::trace::child(&t));
        let sent =
            self.channels.get(call.channel).send(&key, &alert.load_id, &call.path, &call.body, context, now).await;
        self.record_send(context, trace, call.channel, &alert.load_id, &key, 1, now, &sent);
        let (state, error) = match &sent {
            Ok(_) => (AlertState::Delivered, None),
            Err(e @ DeliveryError::Permanent(_)) => (AlertState::Refused, Some(clip(&e.to_string()))),
            // A throttled alert waits for the sweep's backoff like any other not delivered.
            Err(e @ (DeliveryError::Retryable(_) | DeliveryError::Throttled(_))) => {
                (AlertState::Pending, Some(clip(&e.to_string())))
            }
        };
        let recorded = self.store.record_ops_alert(alert, state, error.as_deref(), now).await?;
        let failed = |reason: &'static str| {
            metrics::counter!("haul_ops_alert_failures_total", "kind" => kind, "reason" => reason).increment(1);
        };
        match sent {
            Ok(_) => {
                if recorded {
                    metrics::counter!("haul_ops_alerts_total", "kind" => kind).increment(1);
                }
                Ok(())
            }
            Err(e @ DeliveryError::Permanent(_)) => {
                if recorded {
                    failed("refused");
                    error!(error = %e, outbox_id = %alert.outbox_id, "the ops service refused the OpsAlert; recorded as refused, not sent again");
                }
                Ok(())
            }
            Err(e) => {
                failed("unavailable");
                error!(error = %e, outbox_id = %alert.outbox_id, "the OpsAlert could not be delivered; the sweep retries it");
                Err(EffectError::Delivery(e))
            }
        }
    }
}

/// Marks need the claim's token; the sweep's effects take none.
const NO_CLAIM: &str = "";

/// How a plan run ended.
enum Ran {
    Done(Dispatched),
    /// A failed attempt: plan again.
    Again(Next),
}

/// What the store keeps of an ops service's answer.
fn clip(s: &str) -> String {
    s.chars().take(1000).collect()
}

/// Why an effect did not happen.
#[derive(Debug, thiserror::Error)]
enum EffectError {
    #[error("stale claim")]
    Stale,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Delivery(DeliveryError),
}

impl From<ClaimError> for EffectError {
    fn from(e: ClaimError) -> Self {
        match e {
            ClaimError::Stale(_) => EffectError::Stale,
            ClaimError::Store(e) => EffectError::Store(e),
        }
    }
}

impl EffectError {
    /// The failure as the row's failure text or the dispatch's report.
    fn why(&self, effect: &Effect) -> String {
        match effect {
            Effect::Publish(_) | Effect::PublishAndMark { .. } => format!("publishing the outcome failed: {self}"),
            Effect::MarkDispatched { .. } => format!("mark_dispatched failed: {self}"),
            Effect::MarkRetry { .. } => format!("mark_failed failed: {self}"),
            Effect::MarkDead { .. } => format!("burying failed: {self}"),
            Effect::Hold { .. } => format!("holding it back failed: {self}"),
            Effect::PauseChannel { .. } => format!("holding the channel back failed: {self}"),
            Effect::RaiseAlert(_) | Effect::MarkOutcomePublished => self.to_string(),
        }
    }
}

/// Where a test or the simulator may stop the dispatcher after an effect.
fn fault_point_after(effect: &Effect) -> Option<FaultPoint> {
    match effect {
        Effect::Publish(_) => Some(FaultPoint::AfterPublish),
        Effect::MarkDispatched { .. } | Effect::MarkDead { .. } => Some(FaultPoint::AfterMark),
        Effect::PublishAndMark { .. }
        | Effect::MarkRetry { .. }
        | Effect::Hold { .. }
        | Effect::PauseChannel { .. }
        | Effect::RaiseAlert(_)
        | Effect::MarkOutcomePublished => None,
    }
}

/// The planted bug `mark_before_publish`: a delivery's mark goes before its outcome's
/// publish, so a crash or a queue outage between them loses the outcome.
fn mark_before_publish(plan: &mut Plan) {
    let at = |want: fn(&Effect) -> bool| plan.steps.iter().position(|s| want(&s.effect));
    if let (Some(publish), Some(mark)) =
        (at(|e| matches!(e, Effect::Publish(_))), at(|e| matches!(e, Effect::MarkDispatched { .. })))
    {
        plan.steps.swap(publish, mark);
    }
}

/// The phone an SMS row texts; `None` for any other row.
fn sms_to(row: &OutboxRow) -> Option<&str> {
    (row.action_type == ActionType::SendSms).then(|| row.action.pointer("/params/to")?.as_str()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `result` label of `haul_dispatches_total` (docs/operations.md).
    #[test]
    fn each_result_has_its_metric_label() {
        let crash = Crash { point: FaultPoint::AfterSend, context: String::new() };
        let labels = [
            (Dispatched::Delivered, "delivered"),
            (Dispatched::Retrying { retry_at: haul_core::time::from_ms(0) }, "retrying"),
            (Dispatched::Buried, "buried"),
            (Dispatched::Held { until: haul_core::time::from_ms(0) }, "held"),
            (Dispatched::Stale, "stale"),
            (Dispatched::Unsettled(String::new()), "unsettled"),
            (Dispatched::Crashed(crash), "crashed"),
        ];
        for (result, label) in labels {
            assert_eq!(result.label(), label, "{result:?}");
        }
    }

    /// What a failed effect's text starts with, so a row's `last_failure` says which
    /// step failed.
    #[test]
    fn a_failed_effect_says_which_step_failed() {
        let e = || EffectError::Store(StoreError::new("down"));
        let publish = Effect::Publish(
            haul_core::InboundEvent::from_json(
                haul_core::ids::LoadId::parse("L1").unwrap(),
                serde_json::json!({"event_id": "e1", "kind": "inbound_sms", "from": "+1", "body": "x"}),
            )
            .unwrap(),
        );
        assert_eq!(e().why(&publish), "publishing the outcome failed: store error: down");
        assert_eq!(
            e().why(&Effect::MarkDispatched { receipt: String::new() }),
            "mark_dispatched failed: store error: down"
        );
        let retry = Effect::MarkRetry { retry_at: haul_core::time::from_ms(0), attempts: 1, failure: String::new() };
        assert_eq!(e().why(&retry), "mark_failed failed: store error: down");
        assert_eq!(e().why(&Effect::MarkDead { failure: String::new() }), "burying failed: store error: down");
        assert_eq!(e().why(&Effect::MarkOutcomePublished), "store error: down");
        assert_eq!(
            EffectError::from(ClaimError::Stale(haul_store::StaleClaimError { outbox_id: "x".into() })).to_string(),
            "stale claim"
        );
    }

    #[test]
    fn the_simulator_may_stop_after_a_publish_or_a_mark() {
        assert_eq!(fault_point_after(&Effect::MarkDispatched { receipt: String::new() }), Some(FaultPoint::AfterMark));
        assert_eq!(fault_point_after(&Effect::MarkDead { failure: String::new() }), Some(FaultPoint::AfterMark));
        assert_eq!(fault_point_after(&Effect::MarkOutcomePublished), None);
    }
}
