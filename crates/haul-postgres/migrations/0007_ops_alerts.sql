-- Settling a dead row (publishing its failed outcome late, raising its OpsAlert) backs
-- off per row, as the outbox's own retries do: a row the queue or the ops service keeps
-- failing is put off until settle_due_at (NULL: due at once) and never holds up the
-- rows behind it. settle_failure is why its last pass failed; last_failure stays why
-- the row died.
ALTER TABLE outbox ADD COLUMN settle_attempts integer NOT NULL DEFAULT 0;
ALTER TABLE outbox ADD COLUMN settle_due_at bigint;
ALTER TABLE outbox ADD COLUMN settle_failure text;

-- Every OpsAlert raised, one per dead row, and where it is: pending (no send reached
-- the ops service yet; the sweep tries again), delivered, or refused (the ops service
-- answered 4xx; not sent again). Alerts raised before this migration are not here.
CREATE TABLE ops_alerts (
    outbox_id   text PRIMARY KEY,
    load_id     text NOT NULL,
    kind        text NOT NULL,
    action_type text NOT NULL,
    failure     text NOT NULL,
    state       text NOT NULL,
    sends       integer NOT NULL,
    last_error  text,
    raised_at   bigint NOT NULL,
    updated_at  bigint NOT NULL
);
-- The list, in the order raised, in pages.
CREATE INDEX ops_alerts_raised ON ops_alerts (raised_at, outbox_id);
