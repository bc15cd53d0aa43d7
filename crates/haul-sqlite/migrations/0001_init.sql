-- haul schema v1 (SQLite). Timestamps are epoch milliseconds.

-- One row per load: its version (seq of the last record). The version check of
-- EventStore.append is an UPDATE guarded by it.
CREATE TABLE loads (
    load_id    TEXT PRIMARY KEY,
    version    INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE events (
    load_id     TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    entry_id    TEXT NOT NULL,
    kind        TEXT NOT NULL,
    payload     TEXT NOT NULL,
    recorded_at INTEGER NOT NULL,
    PRIMARY KEY (load_id, seq),
    UNIQUE (load_id, entry_id)
) WITHOUT ROWID;

CREATE TABLE outbox (
    id               TEXT PRIMARY KEY,
    load_id          TEXT NOT NULL,
    action_type      TEXT NOT NULL,
    action           TEXT NOT NULL,
    status           TEXT NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    due_at           INTEGER NOT NULL,
    first_attempt_at INTEGER,
    claim_token      TEXT,
    lease_until      INTEGER,
    last_failure     TEXT,
    receipt          TEXT,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    dead_at          INTEGER
);
CREATE INDEX outbox_pending_due ON outbox (due_at, id) WHERE status = 'pending';
CREATE INDEX outbox_pending_created ON outbox (created_at) WHERE status = 'pending';
CREATE INDEX outbox_dead ON outbox (dead_at) WHERE status = 'dead';
CREATE INDEX outbox_load ON outbox (load_id);

CREATE TABLE timers (
    timer_id    TEXT PRIMARY KEY,
    load_id     TEXT NOT NULL,
    fire_at     INTEGER NOT NULL,
    status      TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    canceled_at INTEGER,
    fired_at    INTEGER
);
CREATE INDEX timers_due ON timers (fire_at, timer_id) WHERE status = 'scheduled';
CREATE INDEX timers_load ON timers (load_id);

-- The store-backed load queue. Acked rows stay as the dedup record until pruned.
CREATE TABLE queue (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    load_id       TEXT NOT NULL,
    event_id      TEXT NOT NULL,
    body          TEXT NOT NULL,
    enqueued_at   INTEGER NOT NULL,
    receipt       TEXT,
    receive_count INTEGER NOT NULL DEFAULT 0,
    acked_at      INTEGER,
    UNIQUE (load_id, event_id)
);
CREATE INDEX queue_unacked ON queue (load_id, id) WHERE acked_at IS NULL;

-- One row per load with unacked messages: its head message and when it may be
-- received. FIFO per load and one message in flight per load follow from handing
-- out heads only; receive reads this small table, not the backlog.
CREATE TABLE queue_heads (
    load_id    TEXT PRIMARY KEY,
    message_id INTEGER NOT NULL,
    visible_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX queue_heads_visible ON queue_heads (visible_at, message_id);

-- LoadLock on SQLite: a lease row per load.
CREATE TABLE load_leases (
    load_id    TEXT PRIMARY KEY,
    token      TEXT NOT NULL,
    expires_at INTEGER NOT NULL
) WITHOUT ROWID;
