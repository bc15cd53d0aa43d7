-- haul schema v1 (PostgreSQL). Timestamps are epoch milliseconds (bigint).

-- One row per load with its version; EventStore.append guards on it, so appends to
-- one load serialize on this row and the version is always checked first.
CREATE TABLE loads (
    load_id    text PRIMARY KEY,
    version    bigint NOT NULL,
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL
);

CREATE TABLE events (
    load_id     text NOT NULL,
    seq         bigint NOT NULL,
    entry_id    text NOT NULL,
    kind        text NOT NULL,
    payload     text NOT NULL,
    recorded_at bigint NOT NULL,
    CONSTRAINT events_pkey PRIMARY KEY (load_id, seq),
    CONSTRAINT events_entry_id_key UNIQUE (load_id, entry_id)
);

CREATE TABLE outbox (
    id               text CONSTRAINT outbox_pkey PRIMARY KEY,
    load_id          text NOT NULL,
    action_type      text NOT NULL,
    action           text NOT NULL,
    status           text NOT NULL,
    attempts         integer NOT NULL DEFAULT 0,
    due_at           bigint NOT NULL,
    first_attempt_at bigint,
    claim_token      text,
    lease_until      bigint,
    last_failure     text,
    receipt          text,
    created_at       bigint NOT NULL,
    updated_at       bigint NOT NULL,
    dead_at          bigint
);
CREATE INDEX outbox_pending_due ON outbox (due_at, id) WHERE status = 'pending';
CREATE INDEX outbox_pending_created ON outbox (created_at) WHERE status = 'pending';
CREATE INDEX outbox_dead ON outbox (dead_at) WHERE status = 'dead';
CREATE INDEX outbox_load ON outbox (load_id);

CREATE TABLE timers (
    timer_id    text PRIMARY KEY,
    load_id     text NOT NULL,
    fire_at     bigint NOT NULL,
    status      text NOT NULL,
    created_at  bigint NOT NULL,
    canceled_at bigint,
    fired_at    bigint
);
CREATE INDEX timers_due ON timers (fire_at, timer_id) WHERE status = 'scheduled';
CREATE INDEX timers_load ON timers (load_id);

-- The store-backed load queue. Acked rows stay as the dedup record until pruned.
CREATE TABLE queue (
    id            bigserial PRIMARY KEY,
    load_id       text NOT NULL,
    event_id      text NOT NULL,
    body          text NOT NULL,
    enqueued_at   bigint NOT NULL,
    receipt       text,
    receive_count integer NOT NULL DEFAULT 0,
    acked_at      bigint,
    CONSTRAINT queue_dedup UNIQUE (load_id, event_id)
);
CREATE INDEX queue_unacked ON queue (load_id, id) WHERE acked_at IS NULL;

-- One row per load that ever had a message: its head (NULL when empty) and when the
-- head may be received. Receivers lock heads (SKIP LOCKED), so FIFO per load and one
-- message in flight per load hold across processes; the row is never deleted, so
-- publish and ack always have a row to serialize on.
CREATE TABLE queue_heads (
    load_id    text PRIMARY KEY,
    message_id bigint,
    visible_at bigint NOT NULL
);
CREATE INDEX queue_heads_visible ON queue_heads (visible_at, message_id) WHERE message_id IS NOT NULL;
