-- Send limits changed while haul runs (docs/design.md, "Send rates"): who changed
-- which channel's limit, why and when, one row per operator request (its request id
-- makes a retry a duplicate). A channel's latest row overrides its settings; a row
-- with no rate puts the settings' limit back.
CREATE TABLE rate_changes (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    request_id TEXT NOT NULL UNIQUE,
    channel    TEXT NOT NULL,
    rate       TEXT,
    burst      INTEGER,
    actor      TEXT NOT NULL,
    reason     TEXT NOT NULL,
    changed_at INTEGER NOT NULL
);
CREATE INDEX rate_changes_channel ON rate_changes (channel, seq);
