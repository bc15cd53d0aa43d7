-- Send limits changed while haul runs (docs/design.md, "Send rates"): who changed
-- which channel's limit, why and when, one row per operator request (its request id
-- makes a retry a duplicate). A channel's latest row overrides its settings; a row
-- with no rate puts the settings' limit back.
CREATE TABLE rate_changes (
    seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    request_id text NOT NULL UNIQUE,
    channel    text NOT NULL,
    rate       text,
    burst      bigint,
    actor      text NOT NULL,
    reason     text NOT NULL,
    changed_at bigint NOT NULL
);
CREATE INDEX rate_changes_channel ON rate_changes (channel, seq);
