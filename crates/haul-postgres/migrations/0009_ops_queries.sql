-- The operators' queries across loads (docs/api.md, "Queries across loads").
--
-- 1. A summary on each load's `loads` row: its stage, its asks (`{ask_id: status}`) and
--    the counts of open and escalated ones. `append` keeps it in the append's own
--    transaction; `updated_at` (the last append) is the load's last activity. Derived
--    from the log, which stays the source of truth; filled here from the logs written
--    before, reading the log once (no lock that stops appends). Records that are not
--    JSON, or not of the shape, change nothing (as in the projection). Adding columns
--    with a constant default rewrites nothing.
-- 2. Per-load partial indexes over the small sets of pending and dead outbox rows and
--    scheduled timers, which the loads query probes for each load it looks at.
ALTER TABLE loads
    ADD COLUMN stage text,
    ADD COLUMN asks text NOT NULL DEFAULT '{}',
    ADD COLUMN open_asks integer NOT NULL DEFAULT 0,
    ADD COLUMN escalated_asks integer NOT NULL DEFAULT 0;

-- A record's payload as jsonb, NULL when it is not JSON (only for this migration).
CREATE FUNCTION pg_temp.haul_json(t text) RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN t::jsonb;
EXCEPTION WHEN others THEN
    RETURN NULL;
END
$$;

WITH s AS (
    SELECT DISTINCT ON (load_id) load_id, pg_temp.haul_json(payload) ->> 'stage' AS stage
    FROM events
    WHERE kind = 'load_update' AND jsonb_typeof(pg_temp.haul_json(payload) -> 'stage') = 'string'
    ORDER BY load_id, seq DESC)
UPDATE loads l SET stage = s.stage FROM s WHERE l.load_id = s.load_id;

WITH d AS (
    SELECT load_id, seq, pg_temp.haul_json(payload) -> 'asks' AS asks FROM events WHERE kind = 'decision_recorded'),
c AS (
    SELECT DISTINCT ON (d.load_id, a.value ->> 'ask_id') d.load_id, a.value ->> 'ask_id' AS ask_id,
           a.value ->> 'status' AS status
    FROM d, jsonb_array_elements(CASE WHEN jsonb_typeof(d.asks) = 'array' THEN d.asks ELSE '[]'::jsonb END)
            WITH ORDINALITY AS a(value, n)
    WHERE jsonb_typeof(a.value -> 'ask_id') = 'string' AND jsonb_typeof(a.value -> 'status') = 'string'
    ORDER BY d.load_id, a.value ->> 'ask_id', d.seq DESC, a.n DESC),
g AS (
    SELECT load_id, jsonb_object_agg(ask_id, status) AS asks,
           count(*) FILTER (WHERE status = 'open') AS open_asks,
           count(*) FILTER (WHERE status = 'escalated') AS escalated_asks
    FROM c GROUP BY load_id)
UPDATE loads l SET asks = g.asks::text, open_asks = g.open_asks, escalated_asks = g.escalated_asks
FROM g WHERE l.load_id = g.load_id;

DROP FUNCTION pg_temp.haul_json(text);

CREATE INDEX outbox_dead_load ON outbox (load_id) WHERE status = 'dead';
CREATE INDEX outbox_pending_load ON outbox (load_id, created_at) WHERE status = 'pending';
CREATE INDEX timers_scheduled_load ON timers (load_id, fire_at) WHERE status = 'scheduled';
