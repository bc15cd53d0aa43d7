-- Settling a dead row (publishing its failed outcome late, raising its OpsAlert) backs
-- off per row, as the outbox's own retries do: a row the queue or the ops service keeps
-- failing is put off until settle_due_at (NULL: due at once) and never holds up the
-- rows behind it. settle_failure is why its last pass failed; last_failure stays why
-- the row died.
ALTER TABLE outbox ADD COLUMN settle_attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox ADD COLUMN settle_due_at INTEGER;
ALTER TABLE outbox ADD COLUMN settle_failure TEXT;

-- Every OpsAlert raised, one per dead row, and where it is: pending (no send reached
-- the ops service yet; the sweep tries again), delivered, or refused (the ops service
-- answered 4xx; not sent again). Alerts raised before this migration are not here.
CREATE TABLE ops_alerts (
    outbox_id   TEXT PRIMARY KEY,
    load_id     TEXT NOT NULL,
    kind        TEXT NOT NULL,
    action_type TEXT NOT NULL,
    failure     TEXT NOT NULL,
    state       TEXT NOT NULL,
    sends       INTEGER NOT NULL,
    last_error  TEXT,
    raised_at   INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL
) WITHOUT ROWID;
-- The list, in the order raised, in pages.
CREATE INDEX ops_alerts_raised ON ops_alerts (raised_at, outbox_id);
