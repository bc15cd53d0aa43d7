-- What the API's edge keeps (docs/console.md, "Sessions"; docs/api.md, "Operator actions").
--
-- The console's signing secret: 32 random bytes (hex), made by the first api process
-- that needs it and read by every other, so a session made on one process is good on
-- all, and nobody holding a cookie and the API token can test guesses of the operator
-- token against it offline. One row.
CREATE TABLE console_secret (
    id         integer PRIMARY KEY CHECK (id = 1),
    secret     text NOT NULL,
    created_at bigint NOT NULL
);
-- Sessions ended by signing out, each kept until its cookie would have expired.
CREATE TABLE console_revoked_sessions (
    nonce      text PRIMARY KEY,
    expires_at bigint NOT NULL
);
CREATE INDEX console_revoked_sessions_expiry ON console_revoked_sessions (expires_at);
-- Operator requests taken, by the event id their request id gives on their load, with
-- the event they publish: a request id reused for another action is refused whatever
-- the load queue is (SQS FIFO cannot tell a duplicate from a new message). Pruned with
-- the acked queue messages.
CREATE TABLE operator_requests (
    load_id      text NOT NULL,
    event_id     text NOT NULL,
    body         text NOT NULL,
    requested_at bigint NOT NULL,
    PRIMARY KEY (load_id, event_id)
);
CREATE INDEX operator_requests_age ON operator_requests (requested_at);
