-- Derived facts the API looks loads up by (the Twilio webhook matches an SMS to the
-- active load whose driver phone sent it). The log stays the source of truth: the
-- worker rewrites a load's row after each load_update it commits.
CREATE TABLE load_facts (
    load_id      TEXT PRIMARY KEY,
    driver_phone TEXT,
    active       INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL
);
CREATE INDEX load_facts_phone ON load_facts (driver_phone) WHERE active = 1;

-- Inbound SMS that matched no active load (docs/api.md: kept, counted, listed).
CREATE TABLE unmatched_sms (
    message_sid TEXT PRIMARY KEY,
    from_phone  TEXT NOT NULL,
    to_phone    TEXT NOT NULL,
    body        TEXT NOT NULL,
    received_at INTEGER NOT NULL
);
