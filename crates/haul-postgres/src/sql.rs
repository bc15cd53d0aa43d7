//! The statements of the hot paths (log, outbox, timers, queue, retention), as named
//! constants.
//!
//! The store runs these for those paths, and `tests/explain.rs` runs `EXPLAIN` on the
//! same constants with `enable_seqscan = off`: a hot query that no index can serve
//! fails that test instead of turning into a scan of a 100M-row table in production.
//! A new query belongs here, and in the list of that test.
//!
//! Outbox rows are looked up by `(load_id, id)`: the outbox is partitioned by
//! `load_id` (migration 5) and every id is an action key `{load_id}/...`, so the store
//! derives the load from the id and the lookup touches one partition.
//!
//! A statement whose rows go to one of `haul_store::backend`'s decoders selects the
//! decoder's `columns!` list, which keeps the column order in one place.

use haul_store::{alert_inbox, columns, sms_inbox_state};

// ---------------------------------------------------------------------------------
// The log.

/// `$1` load, `$2` after seq.
pub const READ_AFTER: &str =
    concat!("SELECT ", columns!(record), " FROM events WHERE load_id = $1 AND seq > $2 ORDER BY seq");
/// One page of the log: `$1` load, `$2` after seq, `$3` limit.
pub const READ_PAGE: &str =
    concat!("SELECT ", columns!(record), " FROM events WHERE load_id = $1 AND seq > $2 ORDER BY seq LIMIT $3");
// The version checks' writes, once each: as checks that answer a count, and as checks
// that fail their transaction (`version_or_fail!`).
macro_rules! load_create {
    () => {
        "INSERT INTO loads (load_id, version, created_at, updated_at) VALUES ($1, $2, $3, $3)
     ON CONFLICT (load_id) DO NOTHING"
    };
}
macro_rules! load_advance {
    () => {
        "UPDATE loads SET version = $2, updated_at = $4 WHERE load_id = $1 AND version = $3"
    };
}
/// The version check of a load's first append: `$1` load, `$2` new version, `$3` now.
pub const LOAD_CREATE: &str = load_create!();
/// The version check of later appends: `$1` load, `$2` new version, `$3` expected, `$4` now.
pub const LOAD_ADVANCE: &str = load_advance!();
/// `LOAD_CREATE` and `LOAD_ADVANCE` as a committer's one-trip append sends them: one
/// row, `1`, when the version was taken, and otherwise an ERROR (the text cast of the
/// ELSE arm, never taken when the check passes), which fails the transaction. So a
/// batch can send its `COMMIT` behind its appends without reading their checks first:
/// a check that failed turns that `COMMIT` into a rollback. The arm reads the count so
/// that no plan folds it into an error before it runs.
macro_rules! version_or_fail {
    ($($write:tt)*) => {
        concat!(
            "WITH taken AS (",
            $($write)*,
            " RETURNING 1) SELECT CASE count(*) WHEN 1 THEN 1 ELSE ",
            "('haul: the load''s version check failed, rows taken: ' || count(*))::int END FROM taken"
        )
    };
}
pub const LOAD_CREATE_OR_FAIL: &str = version_or_fail!(load_create!());
pub const LOAD_ADVANCE_OR_FAIL: &str = version_or_fail!(load_advance!());
/// `$1` load.
pub const LOAD_VERSION: &str = "SELECT version FROM loads WHERE load_id = $1";
/// `$1` load, `$2` entry ids.
pub const ENTRY_IDS_TAKEN: &str = "SELECT entry_id FROM events WHERE load_id = $1 AND entry_id = ANY($2) LIMIT 1";
/// `$1` load, `$2` outbox ids (all of that load).
pub const OUTBOX_KEYS_TAKEN: &str = "SELECT id FROM outbox WHERE load_id = $1 AND id = ANY($2) LIMIT 1";
/// `$1` load, `$2..$5` seqs, entry ids, kinds, payloads, `$6` now, `$7` trace contexts
/// (NULL elements for none).
pub const EVENTS_INSERT: &str = "INSERT INTO events (load_id, seq, entry_id, kind, payload, recorded_at, trace)
     SELECT $1, s, e, k, p, $6, c FROM unnest($2::bigint[], $3::text[], $4::text[], $5::text[], $7::text[])
       AS t(s, e, k, p, c)";
/// `$1` load, `$2..$4` ids, action types, actions, `$5` now, `$6` trace contexts; `$7`
/// claim token and `$8` lease until, NULL both unless the rows are claimed with the
/// append (first attempt now, as a claim at `$5` would).
pub const OUTBOX_INSERT: &str = "INSERT INTO outbox (id, load_id, action_type, action, status, due_at, created_at,
       updated_at, trace, claim_token, lease_until, first_attempt_at)
     SELECT i, $1, t, a, 'pending', $5, $5, $5, c, $7::text, $8::bigint, CASE WHEN $7::text IS NULL THEN NULL ELSE $5::bigint END
     FROM unnest($2::text[], $3::text[], $4::text[], $6::text[]) AS u(i, t, a, c)";
/// `$1` after (load id), `$2` limit.
pub const LOAD_IDS: &str = "SELECT load_id FROM loads WHERE load_id > $1 ORDER BY load_id LIMIT $2";

// ---------------------------------------------------------------------------------
// The outbox.

/// The dispatcher's claim of due rows across loads, `$past` narrowing the rows it
/// takes: `$1` token, `$2` lease until, `$3` now, `$4` limit. The claimed keys are
/// renamed (`c_load_id`, `c_id`) so the outbox's own column names are unambiguous in
/// `RETURNING`.
macro_rules! outbox_claim {
    ($past:literal) => {
        concat!(
            "UPDATE outbox o SET claim_token = $1, lease_until = $2, first_attempt_at = COALESCE(o.first_attempt_at, $3)
             FROM (SELECT load_id, id FROM outbox WHERE status = 'pending' AND due_at <= $3
                   AND (lease_until IS NULL OR lease_until <= $3)",
            $past,
            "
                   ORDER BY due_at, id LIMIT $4 FOR UPDATE SKIP LOCKED) AS c (c_load_id, c_id)
             WHERE o.load_id = c.c_load_id AND o.id = c.c_id
             RETURNING ",
            columns!(outbox)
        )
    };
}
/// The claim from the start of the due rows (`pending`).
pub const OUTBOX_CLAIM: &str = outbox_claim!("");
/// The claim past a cursor (`pending_after`): `$5` due_at, `$6` id of the last row a
/// claim before took.
pub const OUTBOX_CLAIM_AFTER: &str = outbox_claim!(" AND (due_at, id) > ($5, $6)");
/// `haul_core::limit::take` for each rate of a CTE `wants (rate_key, interval_us,
/// tolerance_us, wanted)` at `$now_us` (µs), in one upsert of `send_rates` that locks
/// each rate's row (a new key starts at now): its grant kept in `last_granted`, `now`
/// kept as when it held rows back when it fell short. Returns `rate_key`,
/// `last_granted` (the grant) and `tat_us` (the state after).
macro_rules! send_rate_upsert {
    ($now_us:literal) => {
        concat!(
            "INSERT INTO send_rates AS r (rate_key, tat_us, held_at_us, last_granted)
               SELECT rate_key, ",
            $now_us,
            "::bigint + interval_us * least(tolerance_us / interval_us + 1, wanted),
                 CASE WHEN tolerance_us / interval_us + 1 < wanted THEN ",
            $now_us,
            "::bigint END, least(tolerance_us / interval_us + 1, wanted) FROM wants
               ON CONFLICT (rate_key) DO UPDATE SET (last_granted, tat_us, held_at_us) = (
                 SELECT g, greatest(r.tat_us, ",
            $now_us,
            "::bigint) + w.interval_us * g,
                   CASE WHEN g < w.wanted THEN ",
            $now_us,
            "::bigint ELSE r.held_at_us END
                 FROM wants w, LATERAL (SELECT CASE WHEN ",
            $now_us,
            "::bigint + w.tolerance_us < greatest(r.tat_us, ",
            $now_us,
            "::bigint) THEN 0
                   ELSE least((",
            $now_us,
            "::bigint + w.tolerance_us - greatest(r.tat_us, ",
            $now_us,
            "::bigint)) / w.interval_us + 1, w.wanted) END AS g) AS x
                 WHERE w.rate_key = excluded.rate_key)
               RETURNING r.rate_key, r.last_granted, r.tat_us"
        )
    };
}

// A channel's sends in flight (`SendRates::take_slots`), in one transaction under the
// key's advisory lock, so racing dispatchers count each other's slots.

/// `$1` key.
pub const SEND_SLOTS_LOCK: &str = "SELECT pg_advisory_xact_lock(hashtextextended('send_slots:' || $1, 0))";
/// `$1` key, `$2` now (µs): slots whose leases lapsed.
pub const SEND_SLOTS_EXPIRE: &str = "DELETE FROM send_slots WHERE rate_key = $1 AND until_us <= $2";
/// `$1` key, `$2` outbox ids, `$3` tokens, `$4` until (µs): sends that hold a slot
/// already keep it, under their new claim.
pub const SEND_SLOTS_RETAKE: &str = "UPDATE send_slots s SET token = w.token, until_us = $4
     FROM unnest($2::text[], $3::text[]) AS w(id, token)
     WHERE s.rate_key = $1 AND s.outbox_id = w.id RETURNING s.outbox_id";
/// `$1` key, `$2` outbox ids, `$3` tokens, `$4` until (µs), `$5` cap: the other sends
/// in order, while slots are free.
pub const SEND_SLOTS_TAKE: &str = "INSERT INTO send_slots (rate_key, outbox_id, token, until_us)
     SELECT $1, f.id, f.token, $4 FROM (
       SELECT w.id, w.token, row_number() OVER (ORDER BY w.n) AS r
       FROM unnest($2::text[], $3::text[]) WITH ORDINALITY AS w(id, token, n)
       WHERE NOT EXISTS (SELECT 1 FROM send_slots s WHERE s.rate_key = $1 AND s.outbox_id = w.id)) f
     WHERE f.r <= $5::bigint - (SELECT count(*) FROM send_slots s WHERE s.rate_key = $1)
     ON CONFLICT (rate_key, outbox_id) DO NOTHING RETURNING outbox_id";
/// `$1` key, `$2` outbox ids, `$3` tokens: ended sends' slots, each under its own claim.
pub const SEND_SLOTS_FREE: &str = "DELETE FROM send_slots s USING unnest($2::text[], $3::text[]) AS w(id, token)
     WHERE s.rate_key = $1 AND s.outbox_id = w.id AND s.token = w.token";

/// [`OUTBOX_CLAIM`] (or `_AFTER`) and, in the same statement, `send_rate_upsert!` for
/// each rate's rows claimed as made (`due_at <= created_at`): `$types`, `$keys`,
/// `$intervals`, `$tolerances` one element an action type (its rate's key, interval
/// and tolerance, µs), `$now_us` now. The claimed rows come first, their last three
/// columns NULL; then one row of NULL outbox columns carrying the grants, as arrays of
/// keys, sends granted and the new `tat_us` (NULL when no row was counted).
///
/// The grants' row is a second branch of a `UNION ALL`, so the upsert runs (and locks
/// the rate's row) only after every claimed row has been sent back: another
/// dispatcher's claim waits on that row lock for the upsert and the commit only, not
/// for this claim's rows on the wire. Its NULLs are typed as `columns!(outbox)`'s
/// columns (a join to `outbox` would say so too, at a plan's cost over its partitions).
macro_rules! outbox_claim_taking {
    ($past:literal, $types:literal, $keys:literal, $intervals:literal, $tolerances:literal, $now_us:literal) => {
        concat!(
            "WITH claimed AS (",
            outbox_claim!($past),
            "), wants AS (
               SELECT t.rate_key, t.interval_us, t.tolerance_us, count(*) AS wanted FROM claimed c
               JOIN unnest(",
            $types,
            "::text[], ",
            $keys,
            "::text[], ",
            $intervals,
            "::bigint[], ",
            $tolerances,
            "::bigint[]) AS t(action_type, rate_key, interval_us, tolerance_us) ON c.action_type = t.action_type
               WHERE c.due_at <= c.created_at GROUP BY t.rate_key, t.interval_us, t.tolerance_us
             ), took AS (",
            send_rate_upsert!($now_us),
            ")
             SELECT ",
            columns!(outbox),
            ", NULL::text[], NULL::bigint[], NULL::bigint[] FROM claimed
             UNION ALL
             SELECT NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::integer, NULL::bigint,
               NULL::bigint, NULL::text, NULL::bigint, NULL::text, NULL::text, NULL::bigint, NULL::bigint, NULL::text,
               array_agg(rate_key), array_agg(last_granted), array_agg(tat_us) FROM took"
        )
    };
}
/// The claim from the start taking sends: `$5..$9` the takes.
pub const OUTBOX_CLAIM_TAKING: &str = outbox_claim_taking!("", "$5", "$6", "$7", "$8", "$9");
/// The claim past a cursor taking sends: `$5`, `$6` the cursor, `$7..$11` the takes.
pub const OUTBOX_CLAIM_AFTER_TAKING: &str =
    outbox_claim_taking!(" AND (due_at, id) > ($5, $6)", "$7", "$8", "$9", "$10", "$11");
/// `check_claim` and the stale-claim test: `$1` load, `$2` id, `$3` token.
pub const OUTBOX_OWNS: &str =
    "SELECT lease_until FROM outbox WHERE load_id = $1 AND id = $2 AND claim_token = $3 AND status = 'pending'";
/// `$1` load, `$2` id, `$3` token, `$4` receipt, `$5` now.
pub const OUTBOX_MARK_DISPATCHED: &str =
    "UPDATE outbox SET status = 'dispatched', receipt = $4, updated_at = $5, lease_until = NULL, outcome_published_at = $5
     WHERE load_id = $1 AND id = $2 AND claim_token = $3 AND status = 'pending'";
/// `$1` load, `$2` id, `$3` token, `$4` failure, `$5` retry at, `$6` now.
pub const OUTBOX_MARK_RETRY: &str =
    "UPDATE outbox SET attempts = attempts + 1, last_failure = $4, due_at = $5, claim_token = NULL, lease_until = NULL,
     updated_at = $6 WHERE load_id = $1 AND id = $2 AND claim_token = $3 AND status = 'pending'";
/// A send rate held the row back: `$1` load, `$2` id, `$3` token, `$4` due again at,
/// `$5` now. No attempt counted; the budget's start forgotten (never sent) or moved on
/// by the wait.
pub const OUTBOX_HOLD: &str = "UPDATE outbox SET due_at = $4, claim_token = NULL, lease_until = NULL, updated_at = $5,
     first_attempt_at = CASE WHEN attempts = 0 THEN NULL ELSE first_attempt_at + ($4::bigint - $5::bigint) END,
     last_failure = coalesce($6, last_failure)
     WHERE load_id = $1 AND id = $2 AND claim_token = $3 AND status = 'pending'";
/// [`OUTBOX_HOLD`] for many rows, no note: `$1` loads, `$2` ids, `$3` tokens, `$4` due
/// again at (ms), one element a row; `$5` now.
pub const OUTBOX_HOLD_ALL: &str = "UPDATE outbox o SET due_at = h.until, claim_token = NULL, lease_until = NULL,
       updated_at = $5,
       first_attempt_at = CASE WHEN o.attempts = 0 THEN NULL ELSE o.first_attempt_at + (h.until - $5::bigint) END
     FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[]) AS h(load_id, id, token, until)
     WHERE o.load_id = h.load_id AND o.id = h.id AND o.claim_token = h.token AND o.status = 'pending'";
/// A claimed row settled unsent because a later step of its ask was decided: `$1` load,
/// `$2` id, `$3` token, `$4` ask id, `$5` step, `$6` now. Returns the later row's id
/// and, if it waited (never tried, unclaimed, due after now) and is now due, when it
/// was due.
pub const OUTBOX_SUPERSEDE: &str = "WITH later AS (
       SELECT id, due_at, status = 'pending' AND attempts = 0 AND due_at > $6
           AND (lease_until IS NULL OR lease_until <= $6) AS waits
         FROM outbox WHERE load_id = $1 AND action::jsonb ->> 'ask_id' = $4
         AND (action::jsonb ->> 'step')::bigint > $5 ORDER BY created_at, id LIMIT 1),
     done AS (
       UPDATE outbox o SET status = 'superseded', claim_token = NULL, lease_until = NULL, updated_at = $6,
         outcome_published_at = $6, last_failure = 'not sent: its ask moved on (' || later.id || ')'
       FROM later WHERE o.load_id = $1 AND o.id = $2 AND o.claim_token = $3 AND o.status = 'pending'
       RETURNING later.id, later.due_at, later.waits),
     moved AS (
       UPDATE outbox l SET due_at = $6, updated_at = $6 FROM done
       WHERE l.load_id = $1 AND l.id = done.id AND done.waits)
     SELECT id, CASE WHEN waits THEN due_at END FROM done";
/// An operator's change of a channel's limit, once per request id.
pub const RATE_CHANGE_INSERT: &str =
    "INSERT INTO rate_changes (request_id, channel, rate, burst, actor, reason, changed_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (request_id) DO NOTHING";
/// The change made with request id `$1`.
pub const RATE_CHANGE_GET: &str = concat!("SELECT ", columns!(rate_change), " FROM rate_changes WHERE request_id = $1");
/// Each channel's latest change.
pub const RATE_CHANGES_CURRENT: &str =
    concat!("SELECT DISTINCT ON (channel) ", columns!(rate_change), " FROM rate_changes ORDER BY channel, seq DESC");
/// The latest `$1` changes, newest first.
pub const RATE_CHANGES_LATEST: &str =
    concat!("SELECT ", columns!(rate_change), " FROM rate_changes ORDER BY seq DESC LIMIT $1");
/// The service behind `$1` asked to wait: `$2` the paused state (µs), `$3` now (µs),
/// `$4` the key its pause is kept under (`haul_core::limit::pause_key`, never held).
pub const SEND_RATE_PAUSE: &str =
    "INSERT INTO send_rates (rate_key, tat_us, held_at_us) VALUES ($1, $2, $3), ($4, $2, NULL)
     ON CONFLICT (rate_key) DO UPDATE SET tat_us = greatest(send_rates.tat_us, excluded.tat_us),
     held_at_us = excluded.held_at_us";
/// Takes up to `$5` sends from the rate `$1` at `$2` (µs), `$3` its interval (µs), `$4`
/// its tolerance (µs): `send_rate_upsert!` for one rate. Answers how many were
/// granted and the state after.
pub const SEND_RATE_TAKE: &str = concat!(
    "WITH wants AS (SELECT $1::text AS rate_key, $3::bigint AS interval_us, $4::bigint AS tolerance_us,
       $5::bigint AS wanted), took AS (",
    send_rate_upsert!("$2"),
    ") SELECT last_granted, tat_us FROM took"
);
/// Joins `$4` (at least 1) held rows to the queue `$1` (`haul_core::limit::queued` in
/// one statement, the row locked by the upsert): the first slot one spacing `$3` after
/// the queue's last, or `$2` if later; answers the first slot (µs).
pub const SEND_QUEUE_JOIN: &str =
    "INSERT INTO send_rates (rate_key, tat_us) VALUES ($1, $2::bigint + $3::bigint * ($4::bigint - 1))
     ON CONFLICT (rate_key) DO UPDATE
       SET tat_us = greatest(send_rates.tat_us + $3::bigint, $2::bigint) + $3::bigint * ($4::bigint - 1)
     RETURNING tat_us - $3::bigint * ($4::bigint - 1)";
/// Forgets every client's queue on a rate: `$1` the rate's key and `|`.
pub const SEND_QUEUES_FORGET: &str = "DELETE FROM send_rates WHERE left(rate_key, length($1)) = $1";
/// A rate starts afresh (its limit changed): `$1` key, `$2` now (µs), `$3` the key its
/// last pause is kept under: not before that pause ends.
pub const SEND_RATE_AFRESH: &str = "UPDATE send_rates SET tat_us = least(tat_us,
       greatest($2::bigint, coalesce((SELECT p.tat_us FROM send_rates p WHERE p.rate_key = $3), $2::bigint)))
     WHERE rate_key = $1";
/// A channel's held rows due again now (its limit changed): `$1` now (ms), `$2` its
/// action types. Through the pending rows' due index, from now on.
pub const OUTBOX_REQUEUE_HELD: &str = "UPDATE outbox SET due_at = $1, updated_at = $1
     WHERE status = 'pending' AND due_at > $1 AND attempts = 0 AND (lease_until IS NULL OR lease_until <= $1)
       AND action_type = ANY($2)";
/// The last slot of each queue in `$1`.
pub const SEND_QUEUE_TAILS: &str = "SELECT rate_key, tat_us FROM send_rates WHERE rate_key = ANY($1)";
/// Gives back the queue `$1`'s last slot `$2` (µs, kept by the row to the ms), `$3`
/// the spacing.
pub const SEND_QUEUE_GIVE_BACK: &str = "UPDATE send_rates SET tat_us = tat_us - $3::bigint
     WHERE rate_key = $1 AND tat_us >= $2::bigint AND tat_us < $2::bigint + 1000";
/// The client of each load in `$1` that has one.
pub const LOAD_CLIENTS: &str = "SELECT load_id, client FROM load_facts WHERE load_id = ANY($1) AND client IS NOT NULL";
/// The keys that held rows back since `$1` (µs), most recent first.
pub const SEND_RATES_SATURATED: &str =
    "SELECT rate_key, held_at_us FROM send_rates WHERE held_at_us >= $1 ORDER BY held_at_us DESC, rate_key";
/// `$1` load, `$2` id, `$3` token, `$4` failure, `$5` now.
pub const OUTBOX_MARK_DEAD: &str =
    "UPDATE outbox SET attempts = attempts + 1, last_failure = $4, status = 'dead', dead_at = $5, lease_until = NULL,
     updated_at = $5 WHERE load_id = $1 AND id = $2 AND claim_token = $3 AND status = 'pending'";
/// `$1` load, `$2` id.
pub const OUTBOX_GET: &str = concat!("SELECT ", columns!(outbox), " FROM outbox WHERE load_id = $1 AND id = $2");
/// `$1` load.
pub const OUTBOX_FOR_LOAD: &str =
    concat!("SELECT ", columns!(outbox), " FROM outbox WHERE load_id = $1 ORDER BY created_at, id");
/// One page of a load's rows: `$1` load, `$2` after created_at, `$3` after id, `$4`
/// limit. The load's rows come through its key (`(load_id, id)`, one partition) and are
/// sorted: a load has a few hundred rows, and an index in this order would be another
/// index to build and keep on the whole outbox for one page of one view.
pub const OUTBOX_PAGE: &str = concat!(
    "SELECT ",
    columns!(outbox),
    " FROM outbox WHERE load_id = $1 AND (created_at, id) > ($2, $3) ORDER BY created_at, id LIMIT $4"
);
pub const OUTBOX_OLDEST_PENDING: &str = "SELECT min(created_at) FROM outbox WHERE status = 'pending'";
/// `$1` since, `$2` limit.
pub const OUTBOX_DEAD: &str = concat!(
    "SELECT ",
    columns!(outbox),
    " FROM outbox WHERE status = 'dead' AND dead_at >= $1 ORDER BY dead_at, id LIMIT $2"
);
/// A bulk requeue's pick, through outbox_dead_type (migration 8): `$1` action type,
/// `$2` since, `$3` limit.
pub const OUTBOX_DEAD_OF_TYPE: &str = concat!(
    "SELECT ",
    columns!(outbox),
    " FROM outbox WHERE status = 'dead' AND action_type = $1 AND dead_at >= $2 ORDER BY dead_at, id LIMIT $3"
);
/// `$1` load, `$2` id, `$3` now.
pub const OUTBOX_MARK_OUTCOME_PUBLISHED: &str =
    "UPDATE outbox SET outcome_published_at = $3 WHERE load_id = $1 AND id = $2 AND outcome_published_at IS NULL";
/// The dispatcher's sweep: `$1` limit.
pub const OUTBOX_DEAD_WITHOUT_OUTCOME: &str = concat!(
    "SELECT ",
    columns!(outbox),
    " FROM outbox WHERE status = 'dead' AND outcome_published_at IS NULL ORDER BY dead_at, id LIMIT $1"
);
/// The sweep's due rows: `$1` now, `$2` limit. Through the index of unsettled dead rows
/// (a handful), skipping those put off.
pub const OUTBOX_UNSETTLED_DUE: &str = concat!(
    "SELECT ",
    columns!(unsettled),
    " FROM outbox WHERE status = 'dead' AND outcome_published_at IS NULL
     AND (settle_due_at IS NULL OR settle_due_at <= $1) ORDER BY dead_at, id LIMIT $2"
);
/// `$1` load, `$2` id, `$3` retry at, `$4` failure.
pub const OUTBOX_DEFER_SETTLE: &str =
    "UPDATE outbox SET settle_attempts = settle_attempts + 1, settle_due_at = $3, settle_failure = $4
     WHERE load_id = $1 AND id = $2 AND status = 'dead' AND outcome_published_at IS NULL";
/// Records a send of an OpsAlert: `$1` outbox id, `$2` load, `$3` kind, `$4` action
/// type, `$5` failure, `$6` state, `$7` error, `$8` now. A delivered or refused alert
/// is not updated, and returns no row.
pub const OPS_ALERT_RECORD: &str =
    "INSERT INTO ops_alerts (outbox_id, load_id, kind, action_type, failure, state, sends, last_error, raised_at,
                             updated_at)
     VALUES ($1, $2, $3, $4, $5, $6, 1, $7, $8, $8)
     ON CONFLICT (outbox_id) DO UPDATE SET state = excluded.state, sends = ops_alerts.sends + 1,
         last_error = COALESCE(excluded.last_error, ops_alerts.last_error), updated_at = excluded.updated_at
     WHERE ops_alerts.state = 'pending'
     RETURNING outbox_id";
/// The alerts in the order raised: `$1` after raised_at, `$2` after outbox id, `$3` limit.
pub const OPS_ALERT_PAGE: &str = concat!(
    "SELECT ",
    columns!(ops_alert),
    " FROM ops_alerts WHERE (raised_at, outbox_id) > ($1, $2) ORDER BY raised_at, outbox_id LIMIT $3"
);
/// The counts by status, the status written into each statement so that the partial
/// indexes serve `pending` and `dead` (the figures `/metrics` and the crash test read)
/// under the generic plans the store's sessions use; a count of `dispatched` reads the
/// table (bench only).
pub const OUTBOX_COUNT_PENDING: &str = "SELECT count(*) FROM outbox WHERE status = 'pending'";
pub const OUTBOX_COUNT_DISPATCHED: &str = "SELECT count(*) FROM outbox WHERE status = 'dispatched'";
pub const OUTBOX_COUNT_DEAD: &str = "SELECT count(*) FROM outbox WHERE status = 'dead'";
pub const OUTBOX_COUNT_SUPERSEDED: &str = "SELECT count(*) FROM outbox WHERE status = 'superseded'";

// ---------------------------------------------------------------------------------
// Timers.

/// Timers scheduled: `TimerStore::schedule` (one) and an append's schedules
/// (`TimerRoute::WithDecision`). Idempotent on the timer id. `$1` timers, `$2` their
/// loads, `$3` their fire_at, `$4` now, `$5` their trace contexts.
pub const TIMERS_SCHEDULE_ALL: &str = "INSERT INTO timers (timer_id, load_id, fire_at, status, created_at, trace)
     SELECT t, l, f, 'scheduled', $4, c FROM unnest($1::text[], $2::text[], $3::bigint[], $5::text[]) AS s(t, l, f, c)
     ON CONFLICT (timer_id) DO NOTHING";
/// Timers canceled: `TimerStore::cancel` (one) and an append's cancels (the timers
/// distinct). A cancel that arrives before its schedule leaves a canceled row behind,
/// so the late schedule is a noop; the upsert's WHERE changes only a scheduled timer
/// (a fired or canceled one stays as it is), so a row counts when this canceled it.
/// `$1` timers, `$2` their loads, `$3` now.
pub const TIMERS_CANCEL_ALL: &str = "INSERT INTO timers (timer_id, load_id, fire_at, status, created_at, canceled_at)
     SELECT t, l, 0, 'canceled', $3, $3 FROM unnest($1::text[], $2::text[]) AS s(t, l)
     ON CONFLICT (timer_id) DO UPDATE SET status = 'canceled', canceled_at = $3 WHERE timers.status = 'scheduled'";
/// `$1` timer, `$2` now.
pub const TIMER_MARK_FIRED: &str =
    "UPDATE timers SET status = 'fired', fired_at = $2 WHERE timer_id = $1 AND status = 'scheduled'";
/// The pump: `$1` now, `$2` limit.
pub const TIMERS_DUE: &str = concat!(
    "SELECT ",
    columns!(timer),
    " FROM timers WHERE status = 'scheduled' AND fire_at <= $1 ORDER BY fire_at, timer_id LIMIT $2"
);
/// `$1` load.
pub const TIMERS_FOR_LOAD: &str =
    concat!("SELECT ", columns!(timer), " FROM timers WHERE load_id = $1 ORDER BY created_at, timer_id");
/// One page of a load's timers (through `timers_load`, sorted as `OUTBOX_PAGE`): `$1`
/// load, `$2` after created_at, `$3` after timer id, `$4` limit.
pub const TIMERS_PAGE: &str = concat!(
    "SELECT ",
    columns!(timer),
    " FROM timers WHERE load_id = $1 AND (created_at, timer_id) > ($2, $3) ORDER BY created_at, timer_id LIMIT $4"
);
/// `$1` timer.
pub const TIMER_GET: &str = concat!("SELECT ", columns!(timer), " FROM timers WHERE timer_id = $1");

// ---------------------------------------------------------------------------------
// The load queue.

/// A publish in one statement: the message (none when the load has this event id
/// already) and, when its load's head is empty, the head takes it; a busy head keeps
/// its own. A row back means published, none a duplicate. `$1` load, `$2` event id,
/// `$3` body, `$4` trace context (`''` for none: a wave sent as text writes no NULL),
/// `$5` now.
pub const QUEUE_PUBLISH: &str = "WITH m AS (
       INSERT INTO queue (load_id, event_id, body, enqueued_at, trace) VALUES ($1, $2, $3, $5, NULLIF($4, ''))
       ON CONFLICT (load_id, event_id) DO NOTHING RETURNING id)
     INSERT INTO queue_heads (load_id, message_id, visible_at) SELECT $1, id, $5 FROM m
     ON CONFLICT (load_id) DO UPDATE SET
       visible_at = CASE WHEN queue_heads.message_id IS NULL THEN excluded.visible_at ELSE queue_heads.visible_at END,
       message_id = COALESCE(queue_heads.message_id, excluded.message_id)
     RETURNING load_id";
/// `QUEUE_PUBLISH` for many loads in one statement (a committer's wave of publishes,
/// `group::set_wave`): `$1` loads, `$2` event ids, `$3` bodies, `$4` trace contexts
/// (`''` for none), `$5` nows, one element per message, no load twice (a head takes the first message its load is sent). A row
/// back (its load) per message published; a duplicate returns none.
pub const QUEUE_PUBLISH_SET: &str = "WITH m AS (
       INSERT INTO queue (load_id, event_id, body, enqueued_at, trace)
       SELECT l, e, b, n, NULLIF(c, '') FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[])
         AS v (l, e, b, c, n)
       ON CONFLICT (load_id, event_id) DO NOTHING RETURNING id, load_id, enqueued_at)
     INSERT INTO queue_heads (load_id, message_id, visible_at) SELECT load_id, id, enqueued_at FROM m
     ON CONFLICT (load_id) DO UPDATE SET
       visible_at = CASE WHEN queue_heads.message_id IS NULL THEN excluded.visible_at ELSE queue_heads.visible_at END,
       message_id = COALESCE(queue_heads.message_id, excluded.message_id)
     RETURNING load_id";
/// The receive of the heads a CTE `u (message_id)` leased: each message under a receipt
/// of `$token`, with its load's log version (`QueueMessage::log_version`).
macro_rules! receive_leased {
    ($token:literal) => {
        concat!(
            "UPDATE queue q SET receipt = q.id::text || '.' || ",
            $token,
            ", receive_count = q.receive_count + 1
             FROM u WHERE q.id = u.message_id
             RETURNING ",
            columns!(queue_message),
            ", (SELECT l.version FROM loads l WHERE l.load_id = q.load_id)"
        )
    };
}
/// The workers' receive of visible heads: `$1` now, `$2` max, `$3` invisible until, `$4` token.
/// Each message comes with its load's log version (`QueueMessage::log_version`).
pub const QUEUE_RECEIVE: &str = concat!(
    "WITH h AS (
       SELECT load_id FROM queue_heads WHERE message_id IS NOT NULL AND visible_at <= $1
       ORDER BY visible_at, message_id LIMIT $2 FOR UPDATE SKIP LOCKED),
     u AS (
       UPDATE queue_heads qh SET visible_at = $3 FROM h WHERE qh.load_id = h.load_id
       RETURNING qh.message_id) ",
    receive_leased!("$4")
);
/// `LoadQueue::publish_receiving`'s receive, sent after `QUEUE_PUBLISH` in its
/// transaction: the load's head when it is a message of this event id never received
/// and visible, received as `QUEUE_RECEIVE` does. The head row is the publish's lock
/// (its upsert); after a duplicate the update takes it, and waits for a receive that
/// holds it, whose change of `visible_at` the update's recheck then sees. `$1` load,
/// `$2` event id, `$3` now, `$4` invisible until, `$5` token.
pub const QUEUE_RECEIVE_PUBLISHED: &str = concat!(
    "WITH u AS (
       UPDATE queue_heads qh SET visible_at = $4 FROM queue m
       WHERE qh.load_id = $1 AND qh.visible_at <= $3 AND m.id = qh.message_id AND m.load_id = $1 AND m.event_id = $2
         AND m.receive_count = 0
       RETURNING qh.message_id) ",
    receive_leased!("$5")
);
/// Locks the head row of a message's load: `$1` message.
pub const QUEUE_LOCK_HEAD: &str =
    "SELECT h.load_id FROM queue_heads h JOIN queue q ON q.load_id = h.load_id WHERE q.id = $1 FOR UPDATE OF h";
/// The ack in one statement, once an earlier statement holds the head row: the
/// message is acked when `$2` is its current receipt and it is of load `$4`, and then
/// the head moves to the load's next unacked message (the statement's snapshot still
/// shows `$1` unacked, hence `id <> $1`). One head row updated means acked. `$1`
/// message, `$2` receipt, `$3` now, `$4` load.
///
/// The lock must be taken by a statement of its own before this one: this statement's
/// snapshot is then taken after the wait for the lock, so it sees a message another
/// transaction published (and committed) meanwhile. Taken inside this statement, the
/// lock would come after the snapshot, and such a message would be left behind the
/// head for good.
pub const QUEUE_ACK: &str = "WITH a AS (
       UPDATE queue SET acked_at = $3 WHERE id = $1 AND receipt = $2 AND acked_at IS NULL AND load_id = $4
       RETURNING id)
     UPDATE queue_heads SET visible_at = $3,
       message_id = (SELECT id FROM queue WHERE load_id = $4 AND acked_at IS NULL AND id <> $1 ORDER BY id LIMIT 1)
     FROM a WHERE queue_heads.load_id = $4";
/// Locks the head row of load `$2` when message `$1` is of that load: an append's
/// ack (its load known), sent in the same round trip just before `QUEUE_ACK`.
pub const QUEUE_LOCK_HEAD_OF_LOAD: &str = "SELECT h.load_id FROM queue_heads h JOIN queue q ON q.load_id = h.load_id
     WHERE q.id = $1 AND h.load_id = $2 FOR UPDATE OF h";
/// `$1` message, `$2` receipt.
pub const QUEUE_NACK: &str = "UPDATE queue SET receipt = NULL WHERE id = $1 AND receipt = $2 AND acked_at IS NULL";
/// `$1` load, `$2` visible at.
pub const QUEUE_HEAD_DELAY: &str = "UPDATE queue_heads SET visible_at = $2 WHERE load_id = $1";
pub const QUEUE_DEPTH: &str = "SELECT count(*) FROM queue WHERE acked_at IS NULL";
/// `$1` load, `$2` event id.
pub const QUEUE_PUBLISHED_BODY: &str = "SELECT body FROM queue WHERE load_id = $1 AND event_id = $2";

// ---------------------------------------------------------------------------------
// Retention: one bounded batch per table and call, oldest finished rows first. `SKIP
// LOCKED` leaves a row some other transaction holds for a later batch.

/// `$1` cutoff, `$2` batch limit.
pub const PRUNE_OUTBOX: &str = "DELETE FROM outbox o USING (
       SELECT load_id, id FROM outbox
       WHERE status <> 'pending' AND outcome_published_at IS NOT NULL AND updated_at < $1 AND outcome_published_at < $1
       ORDER BY updated_at LIMIT $2 FOR UPDATE SKIP LOCKED) d
     WHERE o.load_id = d.load_id AND o.id = d.id";
/// `$1` cutoff, `$2` batch limit.
pub const PRUNE_TIMERS: &str = "DELETE FROM timers t USING (
       SELECT timer_id FROM timers WHERE status <> 'scheduled' AND COALESCE(fired_at, canceled_at) < $1
       ORDER BY COALESCE(fired_at, canceled_at) LIMIT $2 FOR UPDATE SKIP LOCKED) d
     WHERE t.timer_id = d.timer_id";
/// `$1` cutoff, `$2` batch limit.
pub const PRUNE_QUEUE: &str = "DELETE FROM queue q USING (
       SELECT id FROM queue WHERE acked_at IS NOT NULL AND acked_at < $1
       ORDER BY acked_at LIMIT $2 FOR UPDATE SKIP LOCKED) d
     WHERE q.id = d.id";
/// `$1` cutoff, `$2` batch limit.
pub const PRUNE_SHADOW: &str = "DELETE FROM shadow_decisions s USING (
       SELECT load_id, event_id, shadow FROM shadow_decisions WHERE recorded_at < $1
       ORDER BY recorded_at LIMIT $2 FOR UPDATE SKIP LOCKED) d
     WHERE s.load_id = d.load_id AND s.event_id = d.event_id AND s.shadow = d.shadow";

/// `$1` cutoff, `$2` batch limit.
pub const PRUNE_SMS_REPORTS: &str = "DELETE FROM sms_reports r USING (
       SELECT message_sid, status, outbox_id FROM sms_reports WHERE reported_at < $1
       ORDER BY reported_at LIMIT $2 FOR UPDATE SKIP LOCKED) d
     WHERE r.message_sid = d.message_sid AND r.status = d.status AND r.outbox_id = d.outbox_id";

/// `$1` cutoff, `$2` batch limit.
pub const PRUNE_OPERATOR_REQUESTS: &str = "DELETE FROM operator_requests r USING (
       SELECT load_id, event_id FROM operator_requests WHERE requested_at < $1
       ORDER BY requested_at LIMIT $2 FOR UPDATE SKIP LOCKED) d
     WHERE r.load_id = d.load_id AND r.event_id = d.event_id";

// ---------------------------------------------------------------------------------
// The edge's own state.

/// `$1` the candidate secret (hex), `$2` now: the kept secret, made from the candidate
/// by the first call.
pub const CONSOLE_SECRET: &str = "INSERT INTO console_secret (id, secret, created_at) VALUES (1, $1, $2)
     ON CONFLICT (id) DO UPDATE SET id = console_secret.id RETURNING secret";
/// `$1` now: the ended sessions past their expiry.
pub const CONSOLE_REVOKED_EXPIRE: &str = "DELETE FROM console_revoked_sessions WHERE expires_at <= $1";
/// `$1` nonce, `$2` expiry.
pub const CONSOLE_REVOKE: &str = "INSERT INTO console_revoked_sessions (nonce, expires_at) VALUES ($1, $2)
     ON CONFLICT (nonce) DO NOTHING";
/// `$1` nonce.
pub const CONSOLE_REVOKED: &str = "SELECT EXISTS (SELECT 1 FROM console_revoked_sessions WHERE nonce = $1)";
/// `$1` load, `$2` event id, `$3` body, `$4` now: the body the request was first taken
/// with, and whether that was now.
pub const OPERATOR_REQUEST_CLAIM: &str =
    "INSERT INTO operator_requests (load_id, event_id, body, requested_at) VALUES ($1, $2, $3, $4)
     ON CONFLICT (load_id, event_id) DO UPDATE SET load_id = operator_requests.load_id
     RETURNING body, (xmax = 0) AS inserted";

// ---------------------------------------------------------------------------------
// Shadow mode.

/// Stores a shadow decision unless its `(load_id, event_id, shadow)` is taken:
/// `columns!(shadow)` as `$1`..`$12`.
pub const SHADOW_RECORD: &str = concat!(
    "INSERT INTO shadow_decisions (",
    columns!(shadow),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
     ON CONFLICT (load_id, event_id, shadow) DO NOTHING RETURNING load_id"
);
/// One load's shadow decisions after `($2 seq, $3 shadow)`, `$4` at most.
pub const SHADOW_PAGE: &str = concat!(
    "SELECT ",
    columns!(shadow),
    " FROM shadow_decisions WHERE load_id = $1 AND (event_seq, shadow) > ($2, $3)
     ORDER BY event_seq, shadow LIMIT $4"
);

// ---------------------------------------------------------------------------------
// The Twilio webhook.

/// Takes a MessageSid, or finds who took it: `$1` sid, `$2` load (NULL: unmatched),
/// `$3` now. The no-op update on a conflict returns the first claim's row (and waits
/// for a racing insert of the same sid to commit); `xmax = 0` only on a fresh insert.
pub const MESSAGE_SID_CLAIM: &str = "INSERT INTO message_sids (message_sid, load_id, claimed_at) VALUES ($1, $2, $3)
     ON CONFLICT (message_sid) DO UPDATE SET message_sid = message_sids.message_sid
     RETURNING load_id, (xmax = 0) AS inserted";
/// `$1` sid, `$2` from, `$3` to, `$4` body, `$5` received at, `$6` reason.
pub const UNMATCHED_SMS_RECORD: &str =
    "INSERT INTO unmatched_sms (message_sid, from_phone, to_phone, body, received_at, reason)
     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (message_sid) DO NOTHING";
/// An operator hands an unmatched SMS to a load, once: `$1` sid, `$2` load, `$3` the
/// operator event, `$4` now. A racing assignment waits on the row lock and then finds
/// it taken.
pub const UNMATCHED_SMS_ASSIGN: &str =
    "UPDATE unmatched_sms SET assigned_load = $2, assigned_event = $3, assigned_at = $4
     WHERE message_sid = $1 AND assigned_load IS NULL AND dismissed_at IS NULL";
/// The SMS and whose it is: `$1` sid.
pub const UNMATCHED_SMS_ASSIGNED: &str = concat!(
    "SELECT ",
    columns!(unmatched_sms),
    ", assigned_load, assigned_event, dismissed_by FROM unmatched_sms WHERE message_sid = $1"
);
/// The SMS and whose it is, locked for a move: `$1` sid.
pub const UNMATCHED_SMS_LOCK: &str = concat!(
    "SELECT ",
    columns!(unmatched_sms),
    ", assigned_load, assigned_event, dismissed_by FROM unmatched_sms WHERE message_sid = $1 FOR UPDATE"
);
/// The load this operator event moved the SMS from, if it did: `$1` sid, `$2` event.
pub const SMS_MOVED_BEFORE: &str = "SELECT from_load FROM sms_moves WHERE message_sid = $1 AND event_id = $2";
/// Moves the SMS (locked) to another load: `$1` sid, `$2` load, `$3` event, `$4` now.
pub const UNMATCHED_SMS_MOVE: &str =
    "UPDATE unmatched_sms SET assigned_load = $2, assigned_event = $3, assigned_at = $4 WHERE message_sid = $1";
/// Keeps the move by its event: `$1` sid, `$2` event, `$3` from, `$4` to, `$5` now.
pub const SMS_MOVE_RECORD: &str =
    "INSERT INTO sms_moves (message_sid, event_id, from_load, to_load, moved_at) VALUES ($1, $2, $3, $4, $5)";
/// The newest first: `$1` limit.
pub const UNMATCHED_SMS_LIST: &str = concat!(
    "SELECT ",
    columns!(unmatched_sms),
    " FROM unmatched_sms ORDER BY received_at DESC, message_sid DESC LIMIT $1"
);

// ---------------------------------------------------------------------------------
// The per-load summary `append` keeps, and the operators' queries across loads
// (`haul_store::ops`).

/// The summary's asks, under the append's lock on the row: `$1` load.
pub const LOAD_SUMMARY_ASKS: &str = "SELECT asks FROM loads WHERE load_id = $1";
/// `$1` load, `$2` stage, `$3` asks, `$4` open, `$5` escalated (each NULL: unchanged).
pub const LOAD_SUMMARY_SET: &str = "UPDATE loads SET stage = COALESCE($2, stage), asks = COALESCE($3, asks),
       open_asks = COALESCE($4, open_asks), escalated_asks = COALESCE($5, escalated_asks)
     WHERE load_id = $1";
/// What an append's entries change in the load's facts (the webhook's route by phone):
/// `$1` load, `$2` driver phone, `$3` active, `$5` client (each NULL: unchanged), `$4`
/// now (ms).
pub const LOAD_FACTS_SET: &str = "INSERT INTO load_facts (load_id, driver_phone, active, updated_at, client)
       VALUES ($1, $2, COALESCE($3, TRUE), $4, $5)
     ON CONFLICT (load_id) DO UPDATE SET driver_phone = COALESCE($2, load_facts.driver_phone),
       active = COALESCE($3, load_facts.active), updated_at = $4, client = COALESCE($5, load_facts.client)";
/// The summary with the asks folded in SQL, so an append whose decision changes asks
/// needs no read first (one round trip): `$1` load, `$2` stage (NULL: unchanged), `$3`
/// the asks' new statuses (`{ask_id: status}`, JSON). The same fold as
/// `Derived::fold_asks`: the statuses merged over the stored ones (a stored value
/// that is not an object counts as none), then the open and escalated ones counted.
/// Stored text that is not JSON fails the statement, and the append then runs step by
/// step with the fold in Rust, which reads it as no asks.
pub const LOAD_SUMMARY_FOLD: &str = "UPDATE loads l SET (stage, asks, open_asks, escalated_asks) = (
       SELECT COALESCE($2, l.stage), m.a::text,
         (SELECT count(*) FROM jsonb_each_text(m.a) e WHERE e.value = 'open'),
         (SELECT count(*) FROM jsonb_each_text(m.a) e WHERE e.value = 'escalated')
       FROM (SELECT CASE WHEN jsonb_typeof(l.asks::jsonb) = 'object' THEN l.asks::jsonb ELSE '{}' END
                    || $3::text::jsonb AS a) m)
     WHERE l.load_id = $1";
/// The oldest due timer not yet fired (`/metrics`): `$1` now.
pub const TIMERS_OLDEST_DUE: &str = "SELECT min(fire_at) FROM timers WHERE status = 'scheduled' AND fire_at <= $1";
/// Where one page of the loads query stops looking: `$1` after (load id), `$2` loads
/// looked at per page. The last of them and how many there were.
pub const LOADS_SCAN_END: &str =
    "SELECT max(load_id), count(*) FROM (SELECT load_id FROM loads WHERE load_id > $1 ORDER BY load_id LIMIT $2) s";
/// The loads query over `($1, $2]` in load id order: `$3` stage, `$4` an open ask,
/// `$5` an escalated ask, `$6` active before, `$7` active since, `$8` a dead row, `$9`
/// a pending row created by, `$10` a timer due by (each NULL or false: no condition),
/// `$11` limit. Each per-load condition probes one partition's partial index.
pub const LOADS_PAGE: &str = concat!(
    "SELECT ",
    columns!(load_summary),
    " FROM loads l WHERE l.load_id > $1 AND l.load_id <= $2
       AND ($3::text IS NULL OR l.stage = $3)
       AND (NOT $4::boolean OR l.open_asks > 0)
       AND (NOT $5::boolean OR l.escalated_asks > 0)
       AND ($6::bigint IS NULL OR l.updated_at < $6)
       AND ($7::bigint IS NULL OR l.updated_at >= $7)
       AND (NOT $8::boolean OR EXISTS (SELECT 1 FROM outbox o WHERE o.load_id = l.load_id AND o.status = 'dead'))
       AND ($9::bigint IS NULL OR EXISTS (SELECT 1 FROM outbox o
             WHERE o.load_id = l.load_id AND o.status = 'pending' AND o.created_at <= $9))
       AND ($10::bigint IS NULL OR EXISTS (SELECT 1 FROM timers t
             WHERE t.load_id = l.load_id AND t.status = 'scheduled' AND t.fire_at <= $10))
     ORDER BY l.load_id LIMIT $11"
);
/// Dead rows across loads, newest first: `$1` action types (`,a,b,`), `$2` before
/// dead_at, `$3` before id (at the same dead_at), `$4` limit, `$5` inbox state (NULL:
/// any).
pub const OUTBOX_DEAD_PAGE: &str = concat!(
    "SELECT ",
    columns!(dead_row),
    " FROM outbox WHERE status = 'dead' AND strpos($1, ',' || action_type || ',') > 0
       AND dead_at <= $2 AND (dead_at < $2 OR id < $3)
       AND ($5::text IS NULL OR COALESCE(inbox_state, 'open') = $5)
     ORDER BY dead_at DESC, id DESC LIMIT $4"
);
/// The dead rows an append's decisions took out of the inbox: `$1` load, `$2` ids, `$3`
/// states, `$4` the events decided, `$5` now.
pub const OUTBOX_INBOX_SET: &str = "UPDATE outbox o SET inbox_state = c.state, inbox_event = c.event, inbox_at = $5
     FROM unnest($2::text[], $3::text[], $4::text[]) AS c(id, state, event)
     WHERE o.load_id = $1 AND o.id = c.id";
/// Open dead rows by action type, the newest `$1` of them counted.
pub const INBOX_DEAD_COUNTS: &str = "SELECT action_type, count(*) FROM (SELECT action_type FROM outbox
       WHERE status = 'dead' AND inbox_state IS NULL ORDER BY dead_at DESC LIMIT $1) d
     GROUP BY action_type ORDER BY action_type";
/// OpsAlerts whose dead row is open, at most `$1` counted.
pub const INBOX_ALERTS_COUNT: &str = "SELECT count(*) FROM (SELECT 1 FROM outbox o
       WHERE o.status = 'dead' AND o.inbox_state IS NULL
         AND EXISTS (SELECT 1 FROM ops_alerts a WHERE a.outbox_id = o.id) LIMIT $1) x";
/// Unmatched SMS neither assigned nor dismissed, at most `$1` counted.
pub const INBOX_SMS_COUNT: &str = "SELECT count(*) FROM (SELECT 1 FROM unmatched_sms
       WHERE assigned_load IS NULL AND dismissed_at IS NULL LIMIT $1) x";
/// Dismisses an unmatched SMS not assigned or dismissed: `$1` sid, `$2` by, `$3` why,
/// `$4` now.
pub const UNMATCHED_SMS_DISMISS: &str = "UPDATE unmatched_sms SET dismissed_by = $2, dismissed_reason = $3,
       dismissed_at = $4 WHERE message_sid = $1 AND assigned_load IS NULL AND dismissed_at IS NULL";
/// One unmatched SMS with its inbox columns: `$1` sid.
pub const UNMATCHED_SMS_ONE: &str =
    concat!("SELECT ", columns!(inbox_sms), " FROM unmatched_sms WHERE message_sid = $1");
/// Overdue timers, the most overdue first: `$1` due by, `$2` after fire_at, `$3` after
/// timer id, `$4` limit.
pub const TIMERS_OVERDUE_PAGE: &str = concat!(
    "SELECT ",
    columns!(timer),
    " FROM timers WHERE status = 'scheduled' AND fire_at <= $1 AND (fire_at, timer_id) > ($2, $3)
     ORDER BY fire_at, timer_id LIMIT $4"
);
/// Unmatched SMS, newest first: `$1` before received_at, `$2` before sid, `$3` limit,
/// `$4` inbox state (NULL: any).
/// What an SMS changed in its phone's consent (`$1` phone, `$2` 1 opted out or 0, `$3`
/// event, `$4` load or NULL, `$5` now, ms): an opt-out kept until an opt-in clears it,
/// an opt-in kept only over an opt-out.
pub const CONSENT_SET: &str = "INSERT INTO sms_consent (phone, opted_out, event_id, load_id, changed_at)
       SELECT $1::text, $2::integer, $3::text, $4::text, $5::bigint
       WHERE $2::integer = 1 OR EXISTS (SELECT 1 FROM sms_consent WHERE phone = $1::text)
     ON CONFLICT (phone) DO UPDATE SET opted_out = excluded.opted_out, event_id = excluded.event_id,
       load_id = excluded.load_id, changed_at = excluded.changed_at
     WHERE sms_consent.opted_out <> excluded.opted_out";
/// An append's spend added to its clients' days (arrays, one element per (client,
/// day): `$1` clients, `$2` days, `$3`-`$6` input and output tokens, costs, calls, `$7`
/// capped, `$8` now, ms).
pub const SPEND_ADD: &str = "INSERT INTO llm_spend AS s (client, day, input_tokens, output_tokens, cost_micro_usd,
       calls, capped_at, updated_at)
     SELECT c, d, i, o, m, n, CASE WHEN cap THEN $8::bigint END, $8::bigint
       FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bool[])
         AS u(c, d, i, o, m, n, cap)
     ON CONFLICT (client, day) DO UPDATE SET input_tokens = s.input_tokens + excluded.input_tokens,
       output_tokens = s.output_tokens + excluded.output_tokens,
       cost_micro_usd = s.cost_micro_usd + excluded.cost_micro_usd, calls = s.calls + excluded.calls,
       capped_at = COALESCE(s.capped_at, excluded.capped_at), updated_at = excluded.updated_at";
/// An append's prompts, each once by its hash (`$1` hashes, `$2` texts, `$3` now, ms).
pub const PROMPTS_PUT: &str = "INSERT INTO prompts (hash, text, created_at)
     SELECT h, t, $3::bigint FROM unnest($1::text[], $2::text[]) AS u(h, t) ON CONFLICT (hash) DO NOTHING";
/// One client's day (`$1` client, `$2` day).
pub const SPEND_OF_CLIENT_DAY: &str =
    concat!("SELECT ", columns!(llm_spend), " FROM llm_spend WHERE client = $1 AND day = $2");
/// The clients' days from `$1` to `$2`, of client `$3` (NULL: any), after (`$4` day,
/// `$5` client), the latest day first, at most `$6`.
pub const SPEND_PAGE: &str = concat!(
    "SELECT ",
    columns!(llm_spend),
    " FROM llm_spend WHERE day BETWEEN $1 AND $2 AND ($3::text IS NULL OR client = $3::text)
       AND (day < $4 OR (day = $4 AND client > $5))
     ORDER BY day DESC, client LIMIT $6"
);
/// A prompt's text (`$1` hash).
pub const PROMPT_TEXT: &str = "SELECT text FROM prompts WHERE hash = $1";
/// A delivery report, once per message, status and row (`$4`: '' for none).
pub const SMS_REPORT_RECORD: &str =
    "INSERT INTO sms_reports (message_sid, status, error_code, outbox_id, load_id, reason, reported_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (message_sid, status, outbox_id) DO NOTHING";
/// A load's delivery reports, the latest first: `$1` load, `$2` limit.
pub const SMS_REPORTS_OF_LOAD: &str = concat!(
    "SELECT ",
    columns!(sms_report),
    " FROM sms_reports WHERE load_id = $1 ORDER BY reported_at DESC, message_sid DESC, status DESC LIMIT $2"
);
/// The delivery reports that matched no row, the latest first: `$1` limit.
pub const SMS_REPORTS_UNMATCHED: &str = concat!(
    "SELECT ",
    columns!(sms_report),
    " FROM sms_reports WHERE load_id IS NULL ORDER BY reported_at DESC, message_sid DESC, status DESC LIMIT $1"
);
/// The opted-out phones among `$1`.
pub const CONSENT_OPTED_OUT_AMONG: &str =
    concat!("SELECT ", columns!(sms_consent), " FROM sms_consent WHERE phone = ANY($1) AND opted_out = 1");
/// The opted-out phones, the latest first, before `($1, $2)`, at most `$3`.
pub const CONSENT_OPTED_OUT_PAGE: &str = concat!(
    "SELECT ",
    columns!(sms_consent),
    " FROM sms_consent WHERE opted_out = 1 AND (changed_at, phone) < ($1, $2)
     ORDER BY changed_at DESC, phone DESC LIMIT $3"
);
pub const UNMATCHED_SMS_PAGE: &str = concat!(
    "SELECT ",
    columns!(inbox_sms),
    " FROM unmatched_sms WHERE (received_at, message_sid) < ($1, $2)
       AND ($4::text IS NULL OR ",
    sms_inbox_state!(),
    " = $4)
     ORDER BY received_at DESC, message_sid DESC LIMIT $3"
);
/// OpsAlerts, newest first, with their dead rows' inbox columns: `$1` before raised_at,
/// `$2` before outbox id, `$3` limit, `$4` inbox state (NULL: any).
pub const OPS_ALERTS_NEWEST: &str = concat!(
    "SELECT ",
    columns!(ops_alert),
    ", inbox_state, inbox_event, inbox_at FROM (SELECT a.*, ",
    alert_inbox!(),
    " FROM ops_alerts a LEFT JOIN outbox o ON o.load_id = a.load_id AND o.id = a.outbox_id
       WHERE (a.raised_at, a.outbox_id) < ($1, $2)) x
     WHERE ($4::text IS NULL OR COALESCE(inbox_state, 'open') = $4)
     ORDER BY raised_at DESC, outbox_id DESC LIMIT $3"
);
/// Counts a refused append: `$1` load, `$2` now.
pub const LOAD_CONFLICT_COUNT: &str =
    "UPDATE loads SET conflicts = conflicts + 1, last_conflict_at = $2 WHERE load_id = $1";
/// The loads with the most refused appends: `$1` limit.
pub const LOADS_MOST_CONFLICTS: &str = concat!(
    "SELECT ",
    columns!(conflict_load),
    " FROM loads WHERE conflicts > 0 ORDER BY conflicts DESC, load_id LIMIT $1"
);
