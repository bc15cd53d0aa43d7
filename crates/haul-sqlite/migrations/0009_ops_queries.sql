-- The operators' queries across loads (docs/api.md, "Queries across loads").
--
-- 1. A summary on each load's `loads` row: its stage, its asks (`{ask_id: status}`) and
--    the counts of open and escalated ones. `append` keeps it in the append's own
--    transaction; `updated_at` (the last append) is the load's last activity. Derived
--    from the log, which stays the source of truth; filled here from the logs written
--    before. Records that are not JSON, or not of the shape, change nothing (as in the
--    projection).
-- 2. Per-load partial indexes over the small sets of pending and dead outbox rows and
--    scheduled timers, which the loads query probes for each load it looks at.
ALTER TABLE loads ADD COLUMN stage TEXT;
ALTER TABLE loads ADD COLUMN asks TEXT NOT NULL DEFAULT '{}';
ALTER TABLE loads ADD COLUMN open_asks INTEGER NOT NULL DEFAULT 0;
ALTER TABLE loads ADD COLUMN escalated_asks INTEGER NOT NULL DEFAULT 0;

UPDATE loads SET stage = (
    SELECT CASE WHEN json_valid(e.payload) AND json_type(e.payload, '$.stage') = 'text'
                THEN json_extract(e.payload, '$.stage') END AS stage
    FROM events e
    WHERE e.load_id = loads.load_id AND e.kind = 'load_update'
      AND (CASE WHEN json_valid(e.payload) THEN json_type(e.payload, '$.stage') END) = 'text'
    ORDER BY e.seq DESC LIMIT 1);

UPDATE loads SET asks = COALESCE((
    SELECT json_group_object(ask_id, status) FROM (
        SELECT json_extract(a.value, '$.ask_id') AS ask_id, json_extract(a.value, '$.status') AS status,
               row_number() OVER (PARTITION BY json_extract(a.value, '$.ask_id') ORDER BY e.seq DESC, a.key DESC) AS rn
        FROM events e,
             json_each(CASE WHEN json_valid(e.payload) AND json_type(e.payload, '$.asks') = 'array'
                            THEN e.payload ELSE '{"asks":[]}' END, '$.asks') a
        WHERE e.load_id = loads.load_id AND e.kind = 'decision_recorded'
          AND json_type(a.value, '$.ask_id') = 'text' AND json_type(a.value, '$.status') = 'text')
    WHERE rn = 1), '{}');

UPDATE loads SET
    open_asks = (SELECT count(*) FROM json_each(loads.asks) WHERE value = 'open'),
    escalated_asks = (SELECT count(*) FROM json_each(loads.asks) WHERE value = 'escalated');

CREATE INDEX outbox_dead_load ON outbox (load_id) WHERE status = 'dead';
CREATE INDEX outbox_pending_load ON outbox (load_id, created_at) WHERE status = 'pending';
CREATE INDEX timers_scheduled_load ON timers (load_id, fire_at) WHERE status = 'scheduled';
