-- haul schema v5: ten times today's volume (100M messages a month).
--
-- 1. The log (events) and the outbox become HASH partitioned by load_id, 16 partitions.
--    Every per-load query (read, read_after, the version and entry-id checks, rows of a
--    load, every outbox lookup by id: ids are `{load_id}/...` and the store derives the
--    load) prunes to one partition with its own small indexes; the cross-load scans
--    (outbox claims, the dead sweep) merge 16 small ordered index scans. A unique index
--    on a partitioned table must include the partition key: events keep (load_id, seq)
--    and (load_id, entry_id) as they were; the outbox key becomes (load_id, id), which is
--    as strong as a unique id because a CHECK makes every id start with `{load_id}/`.
--    docs/internals.md says why hash by load and not range by time.
-- 2. Indexes for retention (haul prune) on outbox, timers and queue.
-- 3. Autovacuum and fillfactor for the tables that are updated and deleted like a queue.
--
-- The tables are converted in place: the old table is renamed, the partitioned one
-- created, every row copied, the old one dropped, then keys and indexes are built on the
-- copy (faster than maintaining them row by row). migrate() runs this in the same
-- transaction as its bookkeeping under an advisory lock, so it either happens whole or
-- not at all, and other processes wait. It holds ACCESS EXCLUSIVE locks on events and
-- outbox while it copies: plan a short maintenance window on a big database.

-- The log ------------------------------------------------------------------------------
ALTER TABLE events RENAME TO events_v4;
CREATE TABLE events (
    load_id     text NOT NULL,
    seq         bigint NOT NULL,
    entry_id    text NOT NULL,
    kind        text NOT NULL,
    payload     text NOT NULL,
    recorded_at bigint NOT NULL
) PARTITION BY HASH (load_id);

-- The outbox ---------------------------------------------------------------------------
ALTER TABLE outbox RENAME TO outbox_v4;
CREATE TABLE outbox (
    id                   text NOT NULL,
    load_id              text NOT NULL,
    action_type          text NOT NULL,
    action               text NOT NULL,
    status               text NOT NULL,
    attempts             integer NOT NULL DEFAULT 0,
    due_at               bigint NOT NULL,
    first_attempt_at     bigint,
    claim_token          text,
    lease_until          bigint,
    last_failure         text,
    receipt              text,
    created_at           bigint NOT NULL,
    updated_at           bigint NOT NULL,
    dead_at              bigint,
    outcome_published_at bigint,
    -- (load_id, id) unique + this = id unique across loads (DuplicateActionKeyError).
    CONSTRAINT outbox_id_in_load CHECK (starts_with(id, load_id || '/'))
) PARTITION BY HASH (load_id);

-- 16 partitions each. Storage parameters live on the partitions (PostgreSQL 15 takes
-- none on a partitioned parent). The log is insert-only: defaults suit it. Outbox rows
-- are updated 2-4 times (claim, mark, outcome) and then deleted by retention:
--   fillfactor 80        leaves room on the page so the claim update (claim_token,
--                        lease_until: no indexed column) can be a HOT update;
--   vacuum scale 0.02    vacuum after 2% of a partition is dead, not the default 20%,
--   + threshold 1000     so claims keep scanning a dense partial index of live rows;
--   analyze scale 0.02   due_at/status statistics follow the moving window of due rows.
DO $$
BEGIN
    FOR i IN 0..15 LOOP
        EXECUTE format(
            'CREATE TABLE events_p%s PARTITION OF events FOR VALUES WITH (MODULUS 16, REMAINDER %s)',
            lpad(i::text, 2, '0'), i);
        EXECUTE format(
            'CREATE TABLE outbox_p%s PARTITION OF outbox FOR VALUES WITH (MODULUS 16, REMAINDER %s)
             WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000,
                   autovacuum_analyze_scale_factor = 0.02)',
            lpad(i::text, 2, '0'), i);
    END LOOP;
END
$$;

INSERT INTO events (load_id, seq, entry_id, kind, payload, recorded_at)
SELECT load_id, seq, entry_id, kind, payload, recorded_at FROM events_v4;
DROP TABLE events_v4;
ALTER TABLE events
    ADD CONSTRAINT events_pkey PRIMARY KEY (load_id, seq),
    ADD CONSTRAINT events_entry_id_key UNIQUE (load_id, entry_id);

INSERT INTO outbox (id, load_id, action_type, action, status, attempts, due_at, first_attempt_at, claim_token,
                    lease_until, last_failure, receipt, created_at, updated_at, dead_at, outcome_published_at)
SELECT id, load_id, action_type, action, status, attempts, due_at, first_attempt_at, claim_token,
       lease_until, last_failure, receipt, created_at, updated_at, dead_at, outcome_published_at
FROM outbox_v4;
DROP TABLE outbox_v4;
ALTER TABLE outbox ADD CONSTRAINT outbox_pkey PRIMARY KEY (load_id, id);
-- The primary key (load_id, id) also serves rows_for_load: the old outbox_load index is gone.
CREATE INDEX outbox_pending_due ON outbox (due_at, id) WHERE status = 'pending';
CREATE INDEX outbox_pending_created ON outbox (created_at) WHERE status = 'pending';
CREATE INDEX outbox_dead ON outbox (dead_at) WHERE status = 'dead';
CREATE INDEX outbox_dead_unpublished ON outbox (dead_at) WHERE status = 'dead' AND outcome_published_at IS NULL;
CREATE INDEX outbox_prunable ON outbox (updated_at) WHERE status <> 'pending' AND outcome_published_at IS NOT NULL;

-- Retention on the tables that stay whole ----------------------------------------------
CREATE INDEX timers_finished ON timers ((COALESCE(fired_at, canceled_at))) WHERE status <> 'scheduled';
CREATE INDEX queue_acked ON queue (acked_at) WHERE acked_at IS NOT NULL;

-- Autovacuum for the queue-like tables -------------------------------------------------
-- queue: every message is inserted, updated on receive (receipt, receive_count: HOT with
-- room on the page), updated on ack, and deleted by retention. queue_heads: one row per
-- load, updated on every publish, receive, ack and nack, so nearly all of its versions
-- are dead ones. timers: scheduled, fired or canceled, deleted by retention. loads: the
-- version row, updated on every append (version is not indexed: HOT with room).
-- The default (vacuum at 20% dead) lets these bloat to many times their live size and
-- the partial indexes that claims and receives walk fill with dead entries.
ALTER TABLE queue SET (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000,
                       autovacuum_analyze_scale_factor = 0.02);
ALTER TABLE queue_heads SET (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 500,
                             autovacuum_analyze_scale_factor = 0.02);
ALTER TABLE timers SET (fillfactor = 90, autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000,
                        autovacuum_analyze_scale_factor = 0.02);
ALTER TABLE loads SET (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000,
                       autovacuum_analyze_scale_factor = 0.05);
-- Autovacuum never ANALYZEs a partitioned parent (only its partitions); queries that
-- prune to one partition plan from the partition's statistics, which is every hot query
-- but the cross-load outbox scans. Those read partial indexes whose size autovacuum
-- keeps small, so the parent's missing statistics do not change their plan.
